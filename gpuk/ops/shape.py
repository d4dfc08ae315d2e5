"""Shape ops: the symbolic shape, reshape, indexing, transpose, concatenation, fills.

Shapes given to K functions may mix ints with symbolic scalars (``K.shape(x)[0]``).
``resolve_shape`` turns such a spec into a static tuple (None where unknown) plus, when
some entry is only known at run time, an int vector tensor computed in the graph.
"""
import functools

import numpy as np

from gpuk.graph import Meta, Tensor, apply, as_tensor, static_value
from gpuk.kernels.runtime import prepared
from gpuk.ops.base import Op, XpOp, normalize_axis


class Shape(Op):
    """The runtime shape of ``x`` as an int32 vector (host-side values, like TF's int32 shapes)."""
    differentiable = False

    def infer(self, x):
        return Meta((None if x.shape is None else len(x.shape),), 'int32')

    kept = functools.cached_property(lambda self: prepared.Kept())   # (as XpOp's)

    def forward(self, impl, x):   # the value follows from x's layout: computed once per kept layout
        return self.kept.run(impl, (x,), _shape_runner)

    def static_values(self, inputs):
        shape = inputs[0].shape
        if shape is None or None in shape:
            return None
        return [np.asarray(shape, dtype=np.int32)]


def _shape_runner(impl, x):
    xp = impl.xp
    return prepared.layout_constant_runner(lambda x: xp.asarray(x.shape, dtype=np.int32))


def _size_runner(impl, x):
    xp = impl.xp
    return prepared.layout_constant_runner(lambda x: xp.asarray(x.size, dtype=np.int32))


def shape(x):
    return apply(Shape(), as_tensor(x))


class Size(Op):
    """The number of elements of ``x`` as an int32 scalar."""
    differentiable = False

    def infer(self, x):
        return Meta((), 'int32')

    kept = functools.cached_property(lambda self: prepared.Kept())

    def forward(self, impl, x):   # as Shape's
        return self.kept.run(impl, (x,), _size_runner)

    def static_values(self, inputs):
        shape = inputs[0].shape
        if shape is None or None in shape:
            return None
        return [np.asarray(np.prod(shape, dtype=np.int64), dtype=np.int32)]


def size(x):
    return apply(Size(), as_tensor(x))


class Pack(XpOp):
    """Stacks int scalars into an int64 vector (a shape built from mixed entries)."""
    differentiable = False

    def infer(self, *scalars):
        for s in scalars:
            if s.shape not in ((), None):
                raise ValueError('shape: symbolic entries must be scalars, got shape %s' % (s.shape,))
        return Meta((len(scalars),), 'int64')

    def compute(self, xp, *scalars, out=None):
        return xp.stack([xp.asarray(s, dtype=np.int64).reshape(()) for s in scalars], out=out)


def _entry_value(entry, where):
    if isinstance(entry, Tensor):
        if entry.shape not in ((), None) or np.dtype(entry.dtype).kind not in 'iu':
            raise TypeError('%s: symbolic shape entries must be int scalars, got %r' % (where, entry))
        value = static_value(entry)
        return None if value is None else int(np.asarray(value).reshape(()))
    if isinstance(entry, (int, np.integer)) and not isinstance(entry, bool):
        return int(entry)
    if entry is None:
        return None
    raise TypeError('%s: shape entries must be ints or scalar int tensors, got %r' % (where, entry))


def resolve_shape(spec, where):
    """(static tuple with None for unknown entries, int vector tensor or None).

    ``spec``: a tuple/list of ints and scalar tensors, or a 1-D int tensor.
    The tensor is None when every entry is statically known.
    """
    if isinstance(spec, Tensor):
        if spec.ndim != 1:
            raise ValueError('%s: a shape tensor must be 1-D, got shape %s' % (where, spec.shape))
        if np.dtype(spec.dtype).kind not in 'iu':
            raise TypeError('%s: a shape tensor must have an int dtype, got %s' % (where, spec.dtype))
        value = static_value(spec)
        if value is not None:
            return tuple(int(v) for v in value), None
        if spec.node is not None and isinstance(spec.node.op, Shape):
            return spec.node.inputs[0].shape, spec  # K.shape(x): x's known dims stay known
        return (None,) * (spec.shape[0] or 0) if spec.shape[0] is not None else None, spec
    if isinstance(spec, (int, np.integer)) and not isinstance(spec, bool):
        spec = (spec,)
    if isinstance(spec, np.ndarray) and spec.ndim == 1 and spec.dtype.kind in 'iu':
        spec = spec.tolist()
    if not isinstance(spec, (tuple, list)):
        raise TypeError('%s: shape must be a tuple/list or an int vector tensor, got %r' % (where, spec))
    static = tuple(_entry_value(e, where) for e in spec)
    if None not in static:
        return static, None
    if any(e is None for e in spec):
        raise ValueError('%s: shape %r has None entries; use K.shape(x)[i] for unknown dims' % (where, spec))
    entries = [e if isinstance(e, Tensor) else as_tensor(np.int64(e)) for e in spec]
    return static, apply(Pack(), *entries)


def static_shape_tuple(spec, where):
    """The fully static shape of ``spec``, or None when some entry is known only at run time."""
    static, tensor = resolve_shape(spec, where)
    return static if tensor is None else None


class Fill(Op):
    """An array of a runtime shape filled with one value."""
    shape_from_values = slice(0, None)   # the shape vector
    differentiable = False

    def __init__(self, value, dtype, static):
        self.value, self.dtype, self.static = value, dtype, static

    def infer(self, shape_vector):
        return Meta(self.static, self.dtype)

    def forward(self, impl, shape_vector):
        return impl.xp.full(tuple(int(d) for d in shape_vector.tolist()), self.value, dtype=self.dtype)


def fill_shape(spec, value, dtype):
    static, tensor = resolve_shape(spec, 'fill')
    if tensor is None:
        tensor = as_tensor(np.asarray(static, dtype=np.int64))
    return apply(Fill(value, dtype, static), tensor)


# --- reshape -----------------------------------------------------------------------------

def _reshape_static(in_shape, target):
    """Static output shape for reshaping ``in_shape`` to ``target`` (entries may be None/-1)."""
    if target is None:
        return None
    if list(target).count(-1) > 1:
        raise ValueError('reshape: at most one -1 allowed in shape %s' % (target,))
    if -1 not in target:
        if in_shape is not None and None not in target:
            # The known input dims must divide the target size (equal it when all are known).
            known = int(np.prod([d for d in in_shape if d is not None]))
            total = int(np.prod(target))
            if (known != total) if None not in in_shape else (known and total % known):
                raise ValueError('reshape: cannot reshape a tensor of shape %s into shape %s' % (in_shape, target))
        return tuple(target)
    known = [d for d in target if d != -1]
    if in_shape is None or None in in_shape or None in known:
        return tuple(None if d == -1 else d for d in target)
    total, rest = int(np.prod(in_shape)), int(np.prod(known))
    if rest == 0 or total % rest:
        raise ValueError('reshape: cannot reshape a tensor of shape %s into shape %s' % (in_shape, target))
    return tuple(total // rest if d == -1 else d for d in target)


class Reshape(Op):
    """Reshape to a static target, or to the runtime shape vector given as a second input."""
    shape_from_values = slice(1, None)   # the shape vector, when there is one

    def __init__(self, target):
        self.target = target  # static tuple (None = known at run time only)

    @functools.cached_property
    def kept(self):   # (in the instance's dict: __repr__ leaves it out)
        return prepared.Kept()

    def infer(self, x, shape_vector=None):
        return Meta(_reshape_static(x.shape, self.target), x.dtype)

    def forward(self, impl, x, shape_vector=None):
        return self.kept.run(impl, (x,) if shape_vector is None else (x, shape_vector), self._runner)

    def _target(self, vector):
        return self.target if not vector else tuple(int(d) for d in vector[0].tolist())

    def _runner(self, impl, *arrays):
        """``run(x, [shape_vector])``: x.reshape(target). Its ``specialized`` variant, for layouts
        whose reshape copies (a strided value: probed once per kept layouts, as a view's
        possibility follows from the shape and strides), copies x into the step's reused buffer
        instead of a new one (prepared.StepBuffers: C order, as reshape's copy), while the target
        gives the probed shape (a shape vector's values may change with its layout: then a plain
        reshape)."""
        def run(x, *vector):
            return x.reshape(self._target(vector))

        def specialized(arrays):
            x = arrays[0]
            probe = run(*arrays)
            if not hasattr(probe, 'dtype') or _memory_owner(probe) is _memory_owner(x):   # a view: nothing to keep
                return run
            shape = probe.shape
            take = prepared.StepBuffers(impl.xp.empty, shape, (probe.dtype,)).take

            def run_into(x, *vector):
                target = self._target(vector)
                if vector and _resolved_shape(target, x.size) != shape:
                    return x.reshape(target)
                out = take(0)
                out.reshape(x.shape)[...] = x   # a view of the contiguous buffer takes x (NumPy and CuPy alike)
                return out
            return run_into
        run.specialized = specialized
        return run

    def grad(self, inputs, outputs, output_grads):
        return [reshape_like(output_grads[0], inputs[0])] + [None] * (len(inputs) - 1)


def _memory_owner(value):
    """The array owning ``value``'s memory (itself, or the base of a view)."""
    while getattr(value, 'base', None) is not None:
        value = value.base
    return value


def _resolved_shape(target, size):
    """``target`` with its -1 (if any) resolved for ``size`` elements, as reshape resolves it."""
    if -1 not in target:
        return tuple(target)
    known = int(np.prod([d for d in target if d != -1], dtype=np.int64))
    return tuple((size // known if known else 0) if d == -1 else d for d in target)


class ReshapeLike(Op):
    def infer(self, x, like):
        return Meta(like.shape, x.dtype)

    def forward(self, impl, x, like):
        return x.reshape(like.shape)

    def grad(self, inputs, outputs, output_grads):
        return [reshape_like(output_grads[0], inputs[0]), None]


def reshape_like(x, like):
    if x.shape is not None and x.shape == like.shape and None not in x.shape:
        return x
    return apply(ReshapeLike(), x, like)


def _dim_of(entry, x):
    """``i`` when ``entry`` is ``K.shape(x)[i]`` (x's own dim i), else None."""
    node = entry.node if isinstance(entry, Tensor) else None
    if node is None or not isinstance(node.op, Getitem) or len(node.inputs) != 1:
        return None
    source = node.inputs[0].node
    template = node.op.template
    if source is None or not isinstance(source.op, Shape) or source.inputs[0] is not x:
        return None
    if len(template) != 1 or not isinstance(template[0], int):
        return None
    return template[0] % len(x.shape)


def _infer_minus_one(x, spec, static):
    """``static`` with its -1 resolved when the unknown dims of the target are exactly
    ``K.shape(x)[i]`` for the unknown dims i of x: TensorFlow infers (None, 12) for
    ``reshape(x, (K.shape(x)[0], -1))`` on a (None, 3, 4) x (Flatten-like code reads it)."""
    if not isinstance(spec, (tuple, list)) or static.count(-1) != 1 or x.shape is None:
        return static
    unknown_in = sorted(i for i, d in enumerate(x.shape) if d is None)
    unknown_out = [i for i, d in enumerate(static) if d is None]
    dims = [_dim_of(spec[i], x) for i in unknown_out]
    if None in dims or sorted(dims) != unknown_in:
        return static
    known_in = int(np.prod([d for d in x.shape if d is not None]))
    known_out = int(np.prod([d for d in static if d not in (None, -1)]))
    if known_out == 0 or known_in % known_out:
        return static
    return tuple(known_in // known_out if d == -1 else d for d in static)


def reshape(x, spec):
    x = as_tensor(x)
    static, tensor = resolve_shape(spec, 'reshape')
    if tensor is not None and static is not None:
        static = _infer_minus_one(x, spec, static)
    if tensor is None:
        if static == x.shape:
            return x
        return apply(Reshape(static), x)
    return apply(Reshape(static), x, tensor)


# --- transpose, expand, squeeze, concatenate ---------------------------------------------

class Transpose(Op):
    def __init__(self, perm):
        self.perm = tuple(perm)

    def infer(self, x):
        if x.shape is not None and sorted(self.perm) != list(range(len(x.shape))):
            raise ValueError('permute_dimensions: pattern %s is not a permutation of the %d axes of shape %s'
                             % (self.perm, len(x.shape), x.shape))
        return Meta(None if x.shape is None else tuple(x.shape[p] for p in self.perm), x.dtype)

    def forward(self, impl, x):
        return impl.xp.transpose(x, self.perm)

    def grad(self, inputs, outputs, output_grads):
        return [transpose(output_grads[0], tuple(np.argsort(self.perm)))]


def transpose(x, perm):
    x = as_tensor(x)
    if x.ndim is not None and len(perm) != x.ndim:
        raise ValueError('permute_dimensions: pattern %s does not match the %d axes of shape %s'
                         % (tuple(perm), x.ndim, x.shape))
    perm = tuple(normalize_axis(p, x.ndim, 'permute_dimensions') for p in perm)
    if perm == tuple(range(len(perm))) and x.ndim == len(perm):
        return x
    return apply(Transpose(perm), x)


def _require_rank(x, where):
    if x.ndim is None:
        raise ValueError('%s: tensors of unknown rank are not supported, got %r' % (where, x))


class ExpandDims(Op):
    def __init__(self, axis):
        self.axis = axis

    def infer(self, x):
        if x.shape is None:
            return Meta(None, x.dtype)
        return Meta(x.shape[:self.axis] + (1,) + x.shape[self.axis:], x.dtype)

    def forward(self, impl, x):
        return impl.xp.expand_dims(x, self.axis)

    def grad(self, inputs, outputs, output_grads):
        return [reshape_like(output_grads[0], inputs[0])]


def expand_dims(x, axis=-1):
    x = as_tensor(x)
    _require_rank(x, 'expand_dims')
    axis = normalize_axis(axis, x.ndim + 1, 'expand_dims')
    return apply(ExpandDims(axis), x)


def _squeeze_error(axis, shape):
    return 'squeeze: axis %d of shape %s has size %d, not 1' % (axis, shape, shape[axis])


class Squeeze(Op):
    def __init__(self, axis):
        self.axis = axis

    def infer(self, x):
        if x.shape[self.axis] not in (1, None):
            raise ValueError(_squeeze_error(self.axis, x.shape))
        return Meta(x.shape[:self.axis] + x.shape[self.axis + 1:], x.dtype)

    def forward(self, impl, x):
        if x.shape[self.axis] != 1:
            raise ValueError(_squeeze_error(self.axis, tuple(x.shape)))
        return impl.xp.squeeze(x, self.axis)

    def grad(self, inputs, outputs, output_grads):
        return [reshape_like(output_grads[0], inputs[0])]


def squeeze(x, axis):
    x = as_tensor(x)
    _require_rank(x, 'squeeze')
    return apply(Squeeze(normalize_axis(axis, x.ndim, 'squeeze')), x)


class Concatenate(XpOp):
    def __init__(self, axis):
        self.axis = axis

    def infer(self, *xs):
        first = xs[0].shape
        for other in xs[1:]:
            if len(other.shape) != len(first) or any(
                    i != self.axis and a is not None and b is not None and a != b
                    for i, (a, b) in enumerate(zip(first, other.shape))):
                raise ValueError('concatenate: shapes %s and %s differ outside axis %d'
                                 % (first, other.shape, self.axis))
        sizes = [x.shape[self.axis] for x in xs]
        total = None if None in sizes else sum(sizes)
        shape = tuple(total if i == self.axis else next((x.shape[i] for x in xs if x.shape[i] is not None), None)
                      for i in range(len(first)))
        return Meta(shape, np.result_type(*[x.dtype for x in xs]).name)

    def compute(self, xp, *xs, out=None):
        return xp.concatenate(xs, axis=self.axis, out=out)

    def grad(self, inputs, outputs, output_grads):
        g = output_grads[0]
        return [apply(SliceLike(self.axis, i), g, *inputs) for i in range(len(inputs))]


class SliceLike(Op):
    """Piece ``index`` of ``g`` split along ``axis`` at the runtime sizes of ``parts``."""

    def __init__(self, axis, index):
        self.axis, self.index = axis, index

    def infer(self, g, *parts):
        return Meta(parts[self.index].shape, g.dtype)

    def forward(self, impl, g, *parts):
        start = sum(p.shape[self.axis] for p in parts[:self.index])
        key = [slice(None)] * g.ndim
        key[self.axis] = slice(start, start + parts[self.index].shape[self.axis])
        return g[tuple(key)]

    def grad(self, inputs, outputs, output_grads):
        gg = output_grads[0]
        pieces = [gg if i == self.index else apply(_ZerosLike(), p) for i, p in enumerate(inputs[1:])]
        return [concatenate(pieces, self.axis)] + [None] * (len(inputs) - 1)


class _ZerosLike(Op):
    differentiable = False

    def infer(self, x):
        return Meta(x.shape, x.dtype)

    def forward(self, impl, x):
        return impl.xp.zeros_like(x)


def concatenate(tensors, axis=-1):
    if not isinstance(tensors, (list, tuple)):
        raise TypeError('concatenate: tensors must be a list of tensors, got %r' % (tensors,))
    tensors = [as_tensor(t) for t in tensors]
    if not tensors:
        raise ValueError('concatenate: needs at least one tensor')
    for t in tensors:
        _require_rank(t, 'concatenate')
    rank = tensors[0].ndim
    if rank == 0:
        raise ValueError('concatenate: scalars cannot be concatenated; use stack')
    for t in tensors:
        if t.ndim != rank:
            raise ValueError('concatenate: all tensors need the same rank, got shapes %s'
                             % [t.shape for t in tensors])
    axis = normalize_axis(axis, rank, 'concatenate')
    if len(tensors) == 1:
        return tensors[0]
    return apply(Concatenate(axis), *tensors)


# --- indexing --------------------------------------------------------------------------

_DYNAMIC = object()  # marks a key position filled from a tensor input at run time


def _template(key):
    """(key with tensors replaced by _DYNAMIC, the tensors in order)."""
    tensors = []

    def part(v):
        if isinstance(v, Tensor):
            if v.shape != () or np.dtype(v.dtype).kind not in 'iu':
                raise TypeError('getitem: tensor indices must be int scalars, got %r (use K.gather to '
                                'pick rows by an index vector)' % (v,))
            known = static_value(v)
            if known is not None:
                return int(np.asarray(known).reshape(()))
            tensors.append(v)
            return _DYNAMIC
        if v is None or (isinstance(v, (int, np.integer)) and not isinstance(v, bool)):
            return None if v is None else int(v)
        raise TypeError('getitem: index entries must be ints, slices, None, Ellipsis or scalar int tensors, '
                        'got %r' % (v,))
    items = []
    for k in (key if isinstance(key, tuple) else (key,)):
        if isinstance(k, slice):
            items.append(slice(part(k.start), part(k.stop), part(k.step)))
            if items[-1].step == 0:
                raise ValueError('getitem: slice step cannot be zero, got %r' % (k,))
        elif k is Ellipsis or k is None:
            items.append(k)
        else:
            if isinstance(k, (bool, np.bool_)):
                raise TypeError('getitem: boolean indices are not supported, got %r' % (k,))
            items.append(part(k) if isinstance(k, Tensor) else _int_index(k))
    return tuple(items), tensors


def _int_index(k):
    if isinstance(k, (int, np.integer)):
        return int(k)
    raise TypeError('getitem: index entries must be ints, slices, None, Ellipsis or scalar int tensors, '
                    'got %r' % (k,))


def _fill(template, values):
    values = iter(int(v) for v in values)

    def sub(v):
        return next(values) if v is _DYNAMIC else v
    return tuple(slice(sub(k.start), sub(k.stop), sub(k.step)) if isinstance(k, slice)
                 else sub(k) if k is _DYNAMIC else k for k in template)


def _expand_ellipsis(template, ndim):
    consumed = sum(1 for k in template if k is not None and k is not Ellipsis)
    if consumed > ndim:
        raise ValueError('getitem: too many indices (%d) for a tensor of rank %d' % (consumed, ndim))
    if sum(1 for k in template if k is Ellipsis) > 1:
        raise ValueError('getitem: at most one Ellipsis allowed')
    out = []
    for k in template:
        if k is Ellipsis:
            out.extend([slice(None)] * (ndim - consumed))
        else:
            out.append(k)
    consumed_now = sum(1 for k in out if k is not None)
    return tuple(out) + (slice(None),) * (ndim - consumed_now)


def _getitem_shape(template, shape):
    out, i = [], 0
    for k in template:
        if k is None:
            out.append(1)
            continue
        dim = shape[i]
        i += 1
        if isinstance(k, slice):
            if any(v is _DYNAMIC for v in (k.start, k.stop, k.step)) or dim is None:
                full = k.start in (None, 0) and k.stop is None and k.step in (None, 1)
                out.append(dim if full else None)
            else:
                out.append(len(range(*k.indices(dim))))
        elif k is not _DYNAMIC and dim is not None and not -dim <= k < dim:
            raise ValueError('getitem: index %d is out of range for axis %d of size %d' % (k, i - 1, dim))
    return tuple(out)


class Getitem(Op):
    shape_from_values = slice(1, None)   # dynamic slice bounds
    def __init__(self, template):
        self.template = template

    def cheap_to_recompute(self):
        return True   # a slice: a view of its input

    def infer(self, x, *dynamic):
        return Meta(_getitem_shape(self.template, x.shape), x.dtype)

    def forward(self, impl, x, *dynamic):
        key = _fill(self.template, dynamic) if dynamic else self.template
        element = x[key]
        if isinstance(element, np.generic):
            # NumPy's integer indexing of every axis copies the element out; CuPy's (and
            # NumPy's, with an Ellipsis) gives a 0-d view, not memory of its own
            return x[(key if isinstance(key, tuple) else (key,)) + (Ellipsis,)]
        return element

    def grad(self, inputs, outputs, output_grads):
        x, dynamic = inputs[0], inputs[1:]
        return [apply(ScatterSlice(self.template), output_grads[0], x, *dynamic)] + [None] * len(dynamic)


class ScatterSlice(XpOp):
    """Zeros shaped like ``like`` with ``g`` written at ``like[key]`` (Getitem's gradient)."""
    shape_only_inputs = (1,)

    def __init__(self, template):
        self.template = template

    def infer(self, g, like, *dynamic):
        return Meta(like.shape, g.dtype)

    def compute(self, xp, g, like, *dynamic, out=None):
        if out is None:
            out = xp.zeros(like.shape, dtype=g.dtype)
        else:
            out.fill(0)
        out[_fill(self.template, dynamic) if dynamic else self.template] = g
        return out

    def grad(self, inputs, outputs, output_grads):
        dynamic = inputs[2:]
        return [apply(Getitem(self.template), output_grads[0], *dynamic), None] + [None] * len(dynamic)


class ScatterSlices(XpOp):
    """Zeros shaped like ``like`` (the last input) with each ``g`` written at its static key
    of ``templates``: the sum of ScatterSlice's over disjoint slices, as one step (the
    gradient of a tensor split into slices, like an LSTM's gates; gpuk/fusion_slices.py).
    A plan-only op: it never appears in a graph, so it has no gradient."""
    foldable = False
    differentiable = False

    def __init__(self, templates):
        self.templates = tuple(templates)

    def infer(self, *metas):
        return Meta(metas[-1].shape, np.result_type(*[m.dtype for m in metas[:-1]]).name)

    def compute(self, xp, *arrays, out=None):
        gs, like = arrays[:-1], arrays[-1]
        # no zero fill where the slices cover the whole tensor (an LSTM's four gates)
        covers = self._covers(tuple(like.shape))
        if out is None:
            out = (xp.empty if covers else xp.zeros)(like.shape, dtype=xp.result_type(*gs))
        elif not covers:
            out.fill(0)
        for key, g in zip(self.templates, gs):
            out[key] = g
        return out

    def _covers(self, shape):
        """Whether the keys together select every element of a tensor of ``shape``: their
        element counts add up to its size (they are disjoint: the fusion pass merges only
        disjoint static slices, gpuk/fusion_gradients.py). Memoized per shape."""
        covers = self.__dict__.setdefault('_coverage', {})
        if shape not in covers:
            covers[shape] = sum(_selected_count(key, shape) for key in self.templates) == int(np.prod(shape))
        return covers[shape]


def _selected_count(key, shape):
    """How many elements the static key (ints and slices, one per leading axis) selects
    from a tensor of ``shape``; 0 for any other key (it never counts as covering)."""
    if len(key) > len(shape):
        return 0
    count = 1
    for k, n in zip(key, shape):
        if isinstance(k, slice):
            count *= len(range(*k.indices(n)))
        elif not isinstance(k, (int, np.integer)) or isinstance(k, bool):
            return 0
    return count * int(np.prod(shape[len(key):]))


def getitem(x, key):
    x = as_tensor(x)
    template, dynamic = _template(key)
    if x.shape is None:
        raise ValueError('getitem: tensors of unknown rank cannot be indexed')
    template = _expand_ellipsis(template, len(x.shape))
    return apply(Getitem(template), x, *dynamic)
