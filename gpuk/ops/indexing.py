"""Ops that pick elements by index: gather (rows of a tensor by an int tensor) and its
scatter-add gradient, one-hot encoding, slicing with runtime begin/size vectors, and
arange with runtime bounds."""
import math

import numpy as np

from gpuk.graph import Meta, apply
from gpuk.ops import shape as shape_ops
from gpuk.ops.base import Op
from gpuk.contracts.dtypes import accumulation_dtype


def _is_float(dtype):
    return np.dtype(dtype).kind == 'f'


# --- gather ---------------------------------------------------------------------------------

def _check_row_indices(indices, rows, where):
    """TensorFlow refuses out-of-range rows (NumPy would wrap negatives): so do we."""
    if indices.size == 0:
        return
    low, high = int(indices.min()), int(indices.max())
    if low < 0 or high >= rows:
        raise ValueError('%s: indices must lie in [0, %d), got values from %d to %d' % (where, rows, low, high))


class Gather(Op):
    """Rows ``reference[indices]``: shape indices.shape + reference.shape[1:]."""

    def infer(self, reference, indices):
        if reference.shape is None or indices.shape is None:
            return Meta(None, reference.dtype)
        if not reference.shape:
            raise ValueError('gather: reference must have at least one axis, got a scalar')
        return Meta(tuple(indices.shape) + tuple(reference.shape[1:]), reference.dtype)

    def forward(self, impl, reference, indices):
        _check_row_indices(indices, reference.shape[0], 'gather')
        return impl.xp.take(reference, indices, axis=0)

    def grad(self, inputs, outputs, output_grads):
        reference, indices = inputs
        if not _is_float(reference.dtype):
            return [None, None]
        return [apply(GatherAdjoint(), output_grads[0], reference, indices), None]


class GatherAdjoint(Op):
    """Zeros shaped like ``like`` with each row of ``g`` added at its index (repeats add up)."""

    def infer(self, g, like, indices):
        return Meta(like.shape, g.dtype)

    def forward(self, impl, g, like, indices):
        xp = impl.xp
        work = accumulation_dtype(g.dtype)
        out = xp.zeros(like.shape, dtype=work)
        rows = g.astype(work, copy=False).reshape((-1,) + tuple(like.shape[1:]))
        xp.add.at(out, indices.reshape(-1), rows)
        return out.astype(g.dtype, copy=False)

    def grad(self, inputs, outputs, output_grads):
        return [apply(Gather(), output_grads[0], inputs[2]), None, None]


def gather(reference, indices):
    return apply(Gather(), reference, indices)


# --- one-hot ---------------------------------------------------------------------------------

class OneHot(Op):
    """float32 one-hot vectors on a new last axis; indices outside [0, n) give zero rows,
    like tf.one_hot. ``num_classes`` is an int, or None when given as a scalar input."""
    shape_from_values = slice(1, None)   # depth
    differentiable = False

    def __init__(self, num_classes):
        self.num_classes = num_classes

    def infer(self, indices, depth=None):
        if indices.shape is None:
            return Meta(None, 'float32')
        return Meta(tuple(indices.shape) + (self.num_classes,), 'float32')

    def forward(self, impl, indices, depth=None):
        xp = impl.xp
        n = self.num_classes if depth is None else int(depth)
        if n < 0:
            raise ValueError('one_hot: num_classes must be >= 0, got %d' % n)
        return (xp.expand_dims(indices, -1) == xp.arange(n, dtype=indices.dtype)).astype(np.float32)


def one_hot(indices, num_classes, depth=None):
    if depth is None:
        return apply(OneHot(num_classes), indices)
    return apply(OneHot(None), indices, depth)


# --- slice -----------------------------------------------------------------------------------

def _slice_key(shape, begin, size, where='slice'):
    """Index tuple of tf.slice(begin, size) (size -1: to the end), checked against ``shape``."""
    key = []
    for axis, (dim, b, s) in enumerate(zip(shape, begin, size)):
        stop = dim if s == -1 else b + s
        if b < 0 or s < -1 or stop > dim:
            raise ValueError('%s: begin %d with size %d is out of range for axis %d of shape %s'
                             % (where, b, s, axis, tuple(shape)))
        key.append(slice(b, stop))
    return tuple(key)


class Slice(Op):
    """``x[begin[i] : begin[i] + size[i]]`` per axis, begin and size being int vectors."""
    shape_from_values = slice(1, None)   # begin and size

    def __init__(self, static_shape):
        self.static_shape = static_shape  # computed by the caller, which sees static values

    def infer(self, x, begin, size):
        return Meta(self.static_shape, x.dtype)

    def forward(self, impl, x, begin, size):
        begin, size = [int(b) for b in begin.tolist()], [int(s) for s in size.tolist()]
        if not len(begin) == len(size) == x.ndim:
            raise ValueError('slice: begin and size need %d entries for shape %s, got %d and %d'
                             % (x.ndim, tuple(x.shape), len(begin), len(size)))
        return x[_slice_key(x.shape, begin, size)]

    def grad(self, inputs, outputs, output_grads):
        x, begin, _ = inputs
        if not _is_float(x.dtype):
            return [None, None, None]
        return [apply(SliceAdjoint(), output_grads[0], x, begin), None, None]


class SliceAdjoint(Op):
    """Zeros shaped like ``like`` with ``g`` written from ``begin`` on (Slice's adjoint)."""
    shape_from_values = slice(2, None)   # begin

    def infer(self, g, like, begin):
        return Meta(like.shape, g.dtype)

    def forward(self, impl, g, like, begin):
        out = impl.xp.zeros(like.shape, dtype=g.dtype)
        out[_slice_key(like.shape, [int(b) for b in begin.tolist()], g.shape)] = g
        return out

    def grad(self, inputs, outputs, output_grads):
        g, _, begin = inputs
        return [apply(Slice(g.shape), output_grads[0], begin, shape_ops.shape(g)), None, None]


def slice_op(x, static_shape, begin_vector, size_vector):
    return apply(Slice(static_shape), x, begin_vector, size_vector)


# --- arange ----------------------------------------------------------------------------------

def arange_length(start, stop, step):
    """len(np.arange(start, stop, step)) without building it."""
    if step == 0:
        raise ValueError('arange: step must not be zero')
    if all(isinstance(v, (int, np.integer)) for v in (start, stop, step)):
        return max(0, -(-(int(stop) - int(start)) // int(step)))
    return max(0, int(math.ceil((stop - start) / step)))


class Arange(Op):
    """The 1-D sequence start, start + step, ... below ``stop``, cast to ``dtype``."""
    shape_from_values = slice(0, None)   # start, stop, step
    differentiable = False

    def __init__(self, dtype, length):
        self.dtype, self.length = dtype, length

    def infer(self, start, stop, step):
        return Meta((self.length,), self.dtype)

    def forward(self, impl, start, stop, step):
        start, stop, step = (v.item() for v in (start, stop, step))
        arange_length(start, stop, step)  # checks step
        return impl.xp.arange(start, stop, step).astype(self.dtype, copy=False)


def arange(start, stop, step, dtype, length):
    return apply(Arange(dtype, length), start, stop, step)
