"""Layout ops that move or copy elements: zero padding, tile, repeat along an axis,
reverse, and linear (bilinear by composition) upsampling by an integer factor.

Every op here is linear in its float input, so each gradient is the adjoint op, and the
adjoint's gradient is the op again: second derivatives come for free. Sums in adjoints
of float16 tensors accumulate in float32.
"""
import numpy as np

from gpuk.contracts.dtypes import accumulation_dtype
from gpuk.graph import Meta, apply, as_tensor
from gpuk.ops import elementwise as ew
from gpuk.ops import shape as shape_ops
from gpuk.ops.base import Op, XpOp


def _is_float(dtype):
    return np.dtype(dtype).kind == 'f'


def _axis_key(axis, key):
    """An index tuple applying ``key`` at ``axis`` and taking everything before it."""
    return (slice(None),) * axis + (key,)


def _require_rank(x, rank, where):
    if x.shape is None or len(x.shape) != rank:
        raise ValueError('%s: expected a tensor of rank %d, got shape %s' % (where, rank, x.shape))


# --- zero padding ------------------------------------------------------------------------

class Pad(Op):
    """Zero padding; ``pads`` holds one (before, after) pair of ints >= 0 per axis."""

    def __init__(self, pads):
        self.pads = tuple((int(b), int(a)) for b, a in pads)

    def infer(self, x):
        _require_rank(x, len(self.pads), 'pad')
        return Meta(tuple(None if d is None else d + b + a for d, (b, a) in zip(x.shape, self.pads)), x.dtype)

    def forward(self, impl, x):
        return impl.xp.pad(x, self.pads, mode='constant')

    def grad(self, inputs, outputs, output_grads):
        return [crop(output_grads[0], self.pads)]


def pad(x, pads):
    x = as_tensor(x)
    if all(b == 0 and a == 0 for b, a in pads):
        return x
    return apply(Pad(pads), x)


def crop(x, pads):
    """The inverse of ``pad``: drops ``before`` and ``after`` entries on each axis."""
    return shape_ops.getitem(x, tuple(slice(b, -a if a else None) for b, a in pads))


# --- tile ----------------------------------------------------------------------------------

def _tiled_dim(dim, rep):
    if rep == 1:
        return dim
    if rep == 0 or dim == 0:
        return 0
    if dim is None or rep is None:
        return None
    return dim * rep


class Tile(XpOp):
    """``x`` repeated ``reps[i]`` times along each axis i (NumPy's tile, one rep per axis).

    ``reps`` is a static tuple (None entries: known at run time only, from the int vector
    given as second input) or None when even its entries are unknown. With static reps the
    step writes into its reused buffer (XpOp); with a repetitions vector, whose values give the
    result's shape, it allocates its result per call.
    """
    shape_from_values = slice(1, None)   # the repetitions vector, when there is one

    def __init__(self, reps):
        self.reps = None if reps is None else tuple(reps)

    def infer(self, x, reps_vector=None):
        if x.shape is None:
            return Meta(None, x.dtype)
        if self.reps is None:
            return Meta((None,) * len(x.shape), x.dtype)
        if len(self.reps) != len(x.shape):
            raise ValueError('tile: n has %d entries for a tensor of shape %s' % (len(self.reps), x.shape))
        return Meta(tuple(_tiled_dim(d, r) for d, r in zip(x.shape, self.reps)), x.dtype)

    def forward(self, impl, x, reps_vector=None):
        if reps_vector is not None:   # the result's shape from values: no kept buffer of one shape
            return self.compute(impl.xp, x, reps_vector)
        return self.kept.run(impl, (x,), self._runner)

    def compute(self, xp, x, reps_vector=None, out=None):
        reps = self.reps if reps_vector is None else tuple(int(r) for r in reps_vector.tolist())
        if len(reps) != x.ndim or any(r < 0 for r in reps):
            raise ValueError('tile: n must hold %d non-negative entries for a tensor of shape %s, got %s'
                             % (x.ndim, tuple(x.shape), reps))
        if out is None:
            return xp.tile(x, reps)
        # out (C-contiguous, the tiled shape) seen as (reps[0], d0, reps[1], d1, ...) takes x
        # broadcast along the reps axes: a reshape of a contiguous array (a view) and a
        # broadcasting assignment from a view of x, both alike in NumPy and CuPy
        split = tuple(v for r, d in zip(reps, x.shape) for v in (r, d))
        out.reshape(split)[...] = x[(None, slice(None)) * x.ndim]
        return out

    def grad(self, inputs, outputs, output_grads):
        x = inputs[0]
        extra = [None] * (len(inputs) - 1)
        if not _is_float(x.dtype):
            return [None] + extra
        return [apply(TileSum(), output_grads[0], x)] + extra


class TileSum(Op):
    """Sums the tiles of ``g`` back onto ``like``'s shape (the adjoint of tiling)."""

    def infer(self, g, like):
        return Meta(like.shape, g.dtype)

    def forward(self, impl, g, like):
        xp = impl.xp
        if like.size == 0 or g.size == 0:
            return xp.zeros(like.shape, dtype=g.dtype)
        reps = [gd // ld for gd, ld in zip(g.shape, like.shape)]
        split = tuple(v for r, d in zip(reps, like.shape) for v in (r, d))
        acc = g.astype(accumulation_dtype(g.dtype), copy=False).reshape(split)
        return acc.sum(axis=tuple(range(0, 2 * len(reps), 2))).astype(g.dtype, copy=False)

    def grad(self, inputs, outputs, output_grads):
        return [apply(TileTo(), output_grads[0], inputs[0]), None]


class TileTo(Op):
    """``x`` tiled until it has ``like``'s shape (TileSum's adjoint)."""

    def infer(self, x, like):
        return Meta(like.shape, x.dtype)

    def forward(self, impl, x, like):
        reps = tuple(ld // xd if xd else 1 for xd, ld in zip(x.shape, like.shape))
        return impl.xp.tile(x, reps)

    def grad(self, inputs, outputs, output_grads):
        return [apply(TileSum(), output_grads[0], inputs[0]), None]


def tile(x, reps_static, reps_vector=None):
    """Tiles ``x``; see Tile for the meaning of the arguments."""
    x = as_tensor(x)
    if reps_vector is None:
        if reps_static == (1,) * len(reps_static) and len(reps_static) == x.ndim:
            return x
        return apply(Tile(reps_static), x)
    return apply(Tile(reps_static), x, reps_vector)


# --- repeat along one axis ------------------------------------------------------------------

def _with_axis_length(meta, axis, length):
    """``meta``'s shape (with ``length`` along ``axis``) and dtype: what a repeat or upsample
    along one axis, and its adjoint, infer."""
    shape = list(meta.shape)
    shape[axis] = length
    return Meta(tuple(shape), meta.dtype)


def _divided_dim(dim, factor):
    """The length whose ``factor``-fold repeat is ``dim`` (None stays unknown)."""
    return None if dim is None else dim // factor


class RepeatElements(Op):
    """Each entry along ``axis`` repeated ``rep`` times in place (NumPy's repeat)."""

    def __init__(self, rep, axis):
        self.rep, self.axis = int(rep), int(axis)

    def infer(self, x):
        return _with_axis_length(x, self.axis, _tiled_dim(x.shape[self.axis], self.rep))

    def forward(self, impl, x):
        return impl.xp.repeat(x, self.rep, axis=self.axis)

    def grad(self, inputs, outputs, output_grads):
        x = inputs[0]
        if not _is_float(x.dtype):
            return [None]
        if self.rep == 0:
            return [ew.zeros_like(x)]
        return [apply(RepeatSum(self.rep, self.axis), output_grads[0])]


class RepeatSum(Op):
    """Sums each run of ``rep`` consecutive entries along ``axis`` (RepeatElements' adjoint)."""

    def __init__(self, rep, axis):
        self.rep, self.axis = int(rep), int(axis)

    def infer(self, g):
        return _with_axis_length(g, self.axis, _divided_dim(g.shape[self.axis], self.rep))

    def forward(self, impl, g):
        n = g.shape[self.axis] // self.rep
        split = g.shape[:self.axis] + (n, self.rep) + g.shape[self.axis + 1:]
        acc = g.astype(accumulation_dtype(g.dtype), copy=False).reshape(split)
        return acc.sum(axis=self.axis + 1).astype(g.dtype, copy=False)

    def grad(self, inputs, outputs, output_grads):
        return [apply(RepeatElements(self.rep, self.axis), output_grads[0])]


def repeat_elements(x, rep, axis):
    """``rep`` (an int >= 0) copies of each entry along ``axis`` (a non-negative axis)."""
    x = as_tensor(x)
    if rep == 1:
        return x
    return apply(RepeatElements(rep, axis), x)


# --- reverse --------------------------------------------------------------------------------

class Reverse(Op):
    """``x`` reversed along ``axes`` (a tuple of non-negative axes)."""

    def __init__(self, axes):
        self.axes = tuple(sorted(set(int(a) for a in axes)))

    def infer(self, x):
        return Meta(x.shape, x.dtype)

    def forward(self, impl, x):
        return x[tuple(slice(None, None, -1) if i in self.axes else slice(None) for i in range(x.ndim))]

    def grad(self, inputs, outputs, output_grads):
        if not _is_float(inputs[0].dtype):
            return [None]
        return [apply(Reverse(self.axes), output_grads[0])]


def reverse(x, axes):
    x = as_tensor(x)
    if not axes:
        return x
    return apply(Reverse(axes), x)


# --- linear upsampling ---------------------------------------------------------------------

def _upsample_weights(xp, factor, dtype, ndim, axis):
    """Interpolation weights k / factor for the k-th output of each input step, shaped to
    broadcast over the axis after ``axis``.

    TensorFlow's legacy resize_bilinear (align_corners=False, half_pixel_centers=False),
    which Keras 2.3.1 calls, samples input position o / factor for output o: so output
    i * factor + k mixes inputs i and min(i + 1, n - 1) with weight k / factor.
    """
    weights = np.arange(factor, dtype=np.float64) / factor
    return xp.asarray(weights.astype(dtype).reshape((factor,) + (1,) * (ndim - axis - 1)))


class LinearUpsample(Op):
    """Linear interpolation along ``axis`` to ``factor`` times its length (float input)."""

    def __init__(self, axis, factor):
        self.axis, self.factor = int(axis), int(factor)

    def infer(self, x):
        return _with_axis_length(x, self.axis, _tiled_dim(x.shape[self.axis], self.factor))

    def forward(self, impl, x):
        xp, axis, n = impl.xp, self.axis, x.shape[self.axis]
        out_shape = x.shape[:axis] + (n * self.factor,) + x.shape[axis + 1:]
        if n == 0:
            return xp.zeros(out_shape, dtype=x.dtype)
        work = accumulation_dtype(x.dtype)
        here = x.astype(work, copy=False)
        following = xp.concatenate([here[_axis_key(axis, slice(1, None))],
                                    here[_axis_key(axis, slice(n - 1, n))]], axis=axis)
        w = _upsample_weights(xp, self.factor, work, x.ndim + 1, axis + 1)
        here, following = xp.expand_dims(here, axis + 1), xp.expand_dims(following, axis + 1)
        out = here + (following - here) * w  # TensorFlow's lerp form: exact at w == 0
        return out.reshape(out_shape).astype(x.dtype, copy=False)

    def grad(self, inputs, outputs, output_grads):
        return [apply(LinearUpsampleAdjoint(self.axis, self.factor), output_grads[0])]


class LinearUpsampleAdjoint(Op):
    """The transpose of LinearUpsample: each output's gradient goes back to its two inputs."""

    def __init__(self, axis, factor):
        self.axis, self.factor = int(axis), int(factor)

    def infer(self, g):
        return _with_axis_length(g, self.axis, _divided_dim(g.shape[self.axis], self.factor))

    def forward(self, impl, g):
        xp, axis = impl.xp, self.axis
        n = g.shape[axis] // self.factor
        if n == 0:
            return xp.zeros(g.shape[:axis] + (0,) + g.shape[axis + 1:], dtype=g.dtype)
        work = accumulation_dtype(g.dtype)
        split = g.astype(work, copy=False).reshape(g.shape[:axis] + (n, self.factor) + g.shape[axis + 1:])
        w = _upsample_weights(xp, self.factor, work, g.ndim + 1, axis + 1)
        out = (split * (1 - w)).sum(axis=axis + 1)
        to_following = (split * w).sum(axis=axis + 1)
        # Input i + 1 received weight w from output i * factor + k; the last input is its own
        # following neighbour.
        out[_axis_key(axis, slice(1, None))] += to_following[_axis_key(axis, slice(None, n - 1))]
        out[_axis_key(axis, slice(n - 1, n))] += to_following[_axis_key(axis, slice(n - 1, n))]
        return out.astype(g.dtype, copy=False)

    def grad(self, inputs, outputs, output_grads):
        return [apply(LinearUpsample(self.axis, self.factor), output_grads[0])]


def linear_upsample(x, axis, factor):
    x = as_tensor(x)
    if factor == 1:
        return x
    return apply(LinearUpsample(axis, factor), x)
