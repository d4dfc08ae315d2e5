"""The op contract.

An op is a small object holding static attributes (axes, strides, ...). It never stores
anything between forward and grad: by-products the backward pass needs are extra outputs.

- ``infer(*metas)``: output Meta(shape, dtype) (or a tuple of them) from the input metas;
  raises ValueError at graph-build time when static shapes already prove a mismatch.
- ``forward(impl, *arrays)``: the output array (or a tuple). ``impl.xp`` is numpy or cupy;
  ``impl.conv`` etc. are the kernel families. Ops never branch on the device.
- ``grad(inputs, outputs, output_grads)``: one graph tensor (or None) per input.
  ``output_grads`` has a tensor for every output (zeros stand in for unused ones).
"""
import functools

import numpy as np

from gpuk import device
from gpuk.graph import static_value
from gpuk.kernels.runtime import prepared

_HOST = device.Implementation('cpu', np)


class Op:
    """Base of every op. Subclasses set ``differentiable = False`` or override ``grad``."""
    # A pure function of its inputs: may be constant-folded and evaluated statically.
    foldable = True
    differentiable = True
    # positions of the inputs read for their shape alone (a Scan's gradient keeps no values for them)
    shape_only_inputs = ()
    # the inputs (a slice of their positions) whose values, not only their shapes, decide an
    # output's shape: a plan where such an input is not a constant cannot count on a step's
    # layouts repeating from run to run (prepared.LayoutToken)
    shape_from_values = slice(0, 0)
    # the op's prepared.Kept, where its forward(impl, *arrays) is kept.run(impl, arrays, make):
    # all its arrays, in order, the runner's result returned as it is (or, as MatMul's, some
    # other call where the arrays' layouts and impl alone say so). A plan then calls the
    # runner its step called in one run in place of forward in the runs after it with the same
    # input layouts (Kept.runner_of_run, Plan.run). An op whose forward never calls its Kept
    # has none (LocalConvFwd)
    kept = None

    def infer(self, *metas):
        raise TypeError('%s does not define infer()' % type(self).__name__)

    def forward(self, impl, *arrays):
        raise TypeError('%s does not define forward()' % type(self).__name__)

    def grad(self, inputs, outputs, output_grads):
        """Non-differentiable ops: no gradient flows to any input."""
        return [None] * len(inputs)

    def cheap_to_recompute(self):
        """Whether computing the output again costs less than keeping it: elementwise
        arithmetic (ops with an element expression) and views. A Scan's gradient recomputes
        these in its backward step (where they fuse with the gradient's own arithmetic) and
        keeps, stacked over time, only the values of the other ops (GEMMs, ...)."""
        expression = getattr(self, 'c_expression', None)
        return expression is not None and expression() is not None

    def static_values(self, inputs):
        """Output values when every input has a small static value (see graph.static_value)."""
        if not self.foldable:
            return None
        values = [static_value(t) for t in inputs]
        if any(v is None for v in values):
            return None
        outs = self.forward(_HOST, *values)
        outs = outs if isinstance(outs, tuple) else (outs,)
        return [np.asarray(o) if np.size(o) <= 64 else None for o in outs]

    def __repr__(self):
        # private attributes and ``kept`` are run-time state (a step's kept runner), not what the
        # op computes
        attrs = ', '.join('%s=%r' % kv for kv in sorted(vars(self).items())
                          if not kv[0].startswith('_') and kv[0] != 'kept')
        return '%s(%s)' % (type(self).__name__, attrs)


class XpOp(Op):
    """An op computed with xp whose plan step writes its result into the step's reused buffer
    (prepared.xp_step_runner, kept by the op's ``Kept``): subclasses define
    ``compute(xp, *arrays, out=None)``, returning ``out`` where they wrote the result there and
    their usual result otherwise."""

    @functools.cached_property
    def kept(self):   # (in the instance's dict: __repr__ leaves it out, as the kernels' ops' own)
        return prepared.Kept()

    def forward(self, impl, *arrays):
        return self.kept.run(impl, arrays, self._runner)

    def _runner(self, impl, *arrays):
        return prepared.xp_step_runner(impl.xp.empty, functools.partial(self.compute, impl.xp))

    def bound_forward(self, impl):
        """The plain computation with ``impl`` bound: what a fused group calls for its member (its
        values are the group's own, not a plan step's: no Kept, no step buffer)."""
        return functools.partial(self.compute, impl.xp)

    def compute(self, xp, *arrays, out=None):
        raise TypeError('%s does not define compute()' % type(self).__name__)


def broadcast_shapes(a, b, where):
    """Static broadcast of two shapes (None = unknown); ValueError when they cannot broadcast."""
    if a is None or b is None:
        return None
    ndim = max(len(a), len(b))
    a = (1,) * (ndim - len(a)) + tuple(a)
    b = (1,) * (ndim - len(b)) + tuple(b)
    out = []
    for da, db in zip(a, b):
        if da == 1:
            out.append(db)
        elif db == 1:
            out.append(da)
        elif da is None or db is None:
            out.append(da if db is None else db)
        elif da == db:
            out.append(da)
        else:
            raise ValueError('%s: shapes %s and %s cannot be broadcast together' % (where, a, b))
    return tuple(out)


def normalize_axis(axis, ndim, where):
    """A non-negative axis; ValueError naming ``where`` when out of range."""
    if isinstance(axis, bool) or not isinstance(axis, (int, np.integer)):
        raise TypeError('%s: axis must be an int, got %r' % (where, axis))
    if ndim is not None:
        if not -ndim <= axis < ndim:
            raise ValueError('%s: axis %d is out of range for a tensor of rank %d' % (where, axis, ndim))
        return int(axis) % ndim
    return int(axis)


def normalize_axes(axis, ndim, where):
    """None -> all axes; int or list -> sorted tuple of non-negative axes."""
    if axis is None:
        return tuple(range(ndim))
    if isinstance(axis, (list, tuple)):
        axes = tuple(sorted(set(normalize_axis(a, ndim, where) for a in axis)))
    else:
        axes = (normalize_axis(axis, ndim, where),)
    return axes
