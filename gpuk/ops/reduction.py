"""Reductions (sum, mean, max, min, prod, any, all, var, logsumexp), arg-reductions and
cumulative sums/products.

float16 inputs are accumulated in float32 and the result is cast back to float16.
"""
import numpy as np

from gpuk.contracts.dtypes import accumulation_dtype
from gpuk import config
from gpuk.graph import Meta, apply, as_tensor
from gpuk.ops import elementwise as ew
from gpuk.ops.base import Op, XpOp, normalize_axes, normalize_axis

_REDUCERS = {
    'sum': lambda xp, x, axes, keep, out=None: xp.sum(x, axis=axes, keepdims=keep, out=out),
    'mean': lambda xp, x, axes, keep, out=None: xp.mean(x, axis=axes, keepdims=keep, out=out),
    'max': lambda xp, x, axes, keep, out=None: xp.max(x, axis=axes, keepdims=keep, out=out),
    'min': lambda xp, x, axes, keep, out=None: xp.min(x, axis=axes, keepdims=keep, out=out),
    'prod': lambda xp, x, axes, keep, out=None: xp.prod(x, axis=axes, keepdims=keep, out=out),
    'any': lambda xp, x, axes, keep, out=None: xp.any(x, axis=axes, keepdims=keep, out=out),
    'all': lambda xp, x, axes, keep, out=None: xp.all(x, axis=axes, keepdims=keep, out=out),
    'var': lambda xp, x, axes, keep, out=None: xp.var(x, axis=axes, keepdims=keep, out=out),  # two-pass: stable
}
_ACCUMULATING = ('sum', 'mean', 'prod', 'var')
# the kinds whose ``out=`` (of the result's dtype) gives the plain result whatever the dtype: an
# integer sum or product wraps the same in the result's width as in NumPy's wider one; mean and
# var of integers compute in float64 before the cast, so only float ones write into ``out``
_EXACT_INTO_ANY_DTYPE = ('sum', 'prod', 'max', 'min', 'any', 'all')


def _accumulation_input(x):
    """x in its accumulation dtype (gpuk.contracts.dtypes): float16 in float32; others as they are."""
    acc = accumulation_dtype(x.dtype)
    return x if acc == x.dtype else x.astype(acc)


def _reduced_shape(shape, axes, keepdims):
    if keepdims:
        return tuple(1 if i in axes else d for i, d in enumerate(shape))
    return tuple(d for i, d in enumerate(shape) if i not in axes)


def _check_nonempty(kind, x, axes):
    if 0 in [x.shape[a] for a in axes]:
        raise ValueError('%s: cannot reduce over an empty axis of shape %s' % (kind, x.shape))


def _spread(g, axes, keepdims, like):
    """``g`` (reduced over ``axes``) broadcast back to ``like``'s shape."""
    return apply(ReduceGrad('sum', axes, keepdims), g, like)


class Reduce(XpOp):
    def __init__(self, kind, axes, keepdims):
        self.kind, self.axes, self.keepdims = kind, tuple(axes), bool(keepdims)
        self.differentiable = kind not in ('any', 'all')

    def infer(self, x):
        dtype = 'bool' if self.kind in ('any', 'all') else x.dtype
        if self.kind == 'mean' and np.dtype(x.dtype).kind != 'f':
            dtype = x.dtype  # TensorFlow's integer mean stays integer (truncated)
        return Meta(_reduced_shape(x.shape, self.axes, self.keepdims), dtype)

    def compute(self, xp, x, out=None):
        if self.kind in ('max', 'min'):
            _check_nonempty(self.kind, x, self.axes)
        source = _accumulation_input(x) if self.kind in _ACCUMULATING else x
        dtype = np.dtype(bool) if self.kind in ('any', 'all') else x.dtype
        if out is not None and source.dtype == dtype and (self.kind in _EXACT_INTO_ANY_DTYPE or dtype.kind == 'f'):
            return _REDUCERS[self.kind](xp, source, self.axes, self.keepdims, out)
        result = _REDUCERS[self.kind](xp, source, self.axes, self.keepdims)
        return xp.asarray(result).astype(dtype, copy=False)

    def grad(self, inputs, outputs, output_grads):
        x, y, g = inputs[0], outputs[0], output_grads[0]
        if self.kind in ('sum', 'mean'):
            return [apply(ReduceGrad(self.kind, self.axes, self.keepdims), g, x)]
        if self.kind == 'var':
            centered = x - reduce('mean', x, self.axes, keepdims=True)
            return [apply(ReduceGrad('mean', self.axes, self.keepdims), g, x) * centered * 2]
        g_b = _spread(g, self.axes, self.keepdims, x)
        y_b = _spread(y, self.axes, self.keepdims, x)
        if self.kind in ('max', 'min'):
            # Ties share the gradient equally, like TensorFlow.
            hit = ew.cast(ew.binary("equal", x, y_b), x.dtype)
            count = reduce('sum', hit, self.axes, keepdims=True)
            return [g_b * hit / count]
        # prod: the product of the other entries, exact also where x has zeros.
        is_zero = ew.binary('equal', x, 0)
        zeros = reduce('sum', ew.cast(is_zero, x.dtype), self.axes, keepdims=True)
        safe_x = ew.where(is_zero, 1, x)
        others_nonzero = reduce('prod', safe_x, self.axes, keepdims=True)
        at_zero = ew.where(ew.binary('equal', zeros, 1), others_nonzero, 0)
        return [g_b * ew.where(is_zero, ew.broadcast_like(at_zero, x), y_b / safe_x)]


class ReduceGrad(XpOp):
    """Spreads ``g`` (the gradient of a sum or mean over ``axes``) back to ``like``'s shape."""

    def __init__(self, kind, axes, keepdims):
        self.kind, self.axes, self.keepdims = kind, axes, keepdims

    def infer(self, g, like):
        return Meta(like.shape, g.dtype)

    def compute(self, xp, g, like, out=None):
        if not self.keepdims:
            g = xp.expand_dims(g, self.axes) if self.axes else g
        spread = xp.broadcast_to(g, like.shape)
        if self.kind != 'mean':
            return spread   # a view of g (a sum's gradient): nothing to write
        count = int(np.prod([like.shape[a] for a in self.axes], dtype=np.int64))
        if out is not None and g.dtype.kind == 'f':   # the division of the plain path, into out
            return xp.divide(spread, max(count, 1), out=out)
        return (spread / max(count, 1)).astype(g.dtype, copy=False)

    def grad(self, inputs, outputs, output_grads):
        return [apply(Reduce(self.kind, self.axes, self.keepdims), output_grads[0]), None]


def _checked_axes(kind, x, axis):
    if x.ndim is None:
        raise ValueError('%s: tensors of unknown rank cannot be reduced' % kind)
    return normalize_axes(axis, x.ndim, kind)


def _require_float(kind, x):
    if np.dtype(x.dtype).kind != 'f':
        raise TypeError('%s: x must be a float tensor, got dtype %s' % (kind, x.dtype))


def reduce(kind, x, axis=None, keepdims=False):
    """``kind`` (sum, mean, max, min, prod, any, all) over ``axis`` (int, list or None)."""
    x = as_tensor(x)
    axes = _checked_axes(kind, x, axis)
    if kind in ('any', 'all'):
        x = ew.cast(x, 'bool')
    elif x.dtype == 'bool':
        x = ew.cast(x, 'int64' if kind != 'mean' else config.floatx())
    return apply(Reduce(kind, axes, keepdims), x)


def var(x, axis=None, keepdims=False):
    """Population variance (two-pass, so stable for large means). Bool and integer inputs
    are computed in floatx (TensorFlow would truncate integer means)."""
    x = as_tensor(x)
    axes = _checked_axes('var', x, axis)
    if np.dtype(x.dtype).kind != 'f':
        x = ew.cast(x, config.floatx())
    return apply(Reduce('var', axes, keepdims), x)


def std(x, axis=None, keepdims=False):
    """sqrt(var(x)); like TensorFlow its gradient is infinite where the variance is 0."""
    return ew.unary('sqrt', var(x, axis, keepdims))


# --- log-sum-exp -----------------------------------------------------------------------------

class LogSumExp(Op):
    """log(sum(exp(x))) shifted by the (finite) max, so it neither overflows nor underflows."""

    def __init__(self, axes, keepdims):
        self.axes, self.keepdims = tuple(axes), bool(keepdims)

    def infer(self, x):
        return Meta(_reduced_shape(x.shape, self.axes, self.keepdims), x.dtype)

    def forward(self, impl, x):
        xp = impl.xp
        source = _accumulation_input(x)
        if 0 in [x.shape[a] for a in self.axes]:  # an empty sum: log(0)
            shape = _reduced_shape(x.shape, self.axes, self.keepdims)
            return xp.full(shape, -np.inf, dtype=x.dtype)
        shift = xp.max(source, axis=self.axes, keepdims=True)
        # All -inf (or an inf) along the axes: shifting by it would give nan; TF shifts by 0.
        shift = xp.where(xp.isfinite(shift), shift, 0)
        out = xp.log(xp.sum(xp.exp(source - shift), axis=self.axes, keepdims=True)) + shift
        if not self.keepdims:
            out = out.reshape(_reduced_shape(x.shape, self.axes, False))
        return out.astype(x.dtype, copy=False)

    def grad(self, inputs, outputs, output_grads):
        x, y, g = inputs[0], outputs[0], output_grads[0]
        softmax = ew.unary('exp', x - _spread(y, self.axes, self.keepdims, x))
        return [_spread(g, self.axes, self.keepdims, x) * softmax]


def logsumexp(x, axis=None, keepdims=False):
    x = as_tensor(x)
    axes = _checked_axes('logsumexp', x, axis)
    _require_float('logsumexp', x)
    return apply(LogSumExp(axes, keepdims), x)


# --- argmax / argmin -------------------------------------------------------------------------

class ArgReduce(Op):
    """argmax/argmin along one axis as int64 (TensorFlow's default); ties pick the first."""
    differentiable = False

    def __init__(self, kind, axis):
        self.kind, self.axis = kind, axis

    def infer(self, x):
        return Meta(_reduced_shape(x.shape, (self.axis,), False), 'int64')

    def forward(self, impl, x):
        _check_nonempty(self.kind, x, (self.axis,))
        find = impl.xp.argmax if self.kind == 'argmax' else impl.xp.argmin
        return impl.xp.asarray(find(x, axis=self.axis)).astype(np.int64, copy=False)


def arg_reduce(kind, x, axis=-1):
    x = as_tensor(x)
    if not x.ndim:
        raise ValueError('%s: x must have rank >= 1, got shape %s' % (kind, x.shape))
    return apply(ArgReduce(kind, normalize_axis(axis, x.ndim, kind)), x)


# --- cumulative sum / product ----------------------------------------------------------------

class Cumulative(Op):
    """Inclusive cumulative sum or product along ``axis``; ``reverse`` runs from the end."""

    def __init__(self, kind, axis, reverse=False):
        self.kind, self.axis, self.reverse = kind, axis, bool(reverse)

    def infer(self, x):
        return Meta(x.shape, x.dtype)

    def forward(self, impl, x):
        xp = impl.xp
        source = _accumulation_input(x)
        if self.reverse:
            source = xp.flip(source, self.axis)
        scan = xp.cumsum if self.kind == 'sum' else xp.cumprod
        out = scan(source, axis=self.axis, dtype=source.dtype)
        if self.reverse:
            out = xp.flip(out, self.axis)
        return out.astype(x.dtype, copy=False)

    def grad(self, inputs, outputs, output_grads):
        x, y, g = inputs[0], outputs[0], output_grads[0]
        if np.dtype(x.dtype).kind != 'f':
            return [None]
        if self.kind == 'sum':
            return [apply(Cumulative('sum', self.axis, not self.reverse), g)]
        return [_cumprod_grad(x, y, g, self.axis, self.reverse)]


def _cumprod_grad(x, y, g, axis, reverse):
    """Exact gradient of y = cumprod(x), zeros in x included.

    dy_i/dx_k (i at or after k) is the product of x_j, j <= i, j != k. For x_k != 0 that is
    y_i / x_k. For x_k == 0 it is nonzero only when x_k is the first zero and x has no
    other zero up to i; it is then the cumulative product with that zero replaced by 1.
    Differentiating this again is exact where a line holds at most one zero (the zero
    masks count as constants, which misses terms when a line has several zeros).
    """
    def scan(kind, t, backwards):
        return apply(Cumulative(kind, axis, backwards), t)
    is_zero = ew.binary('equal', x, 0)
    zeros_so_far = scan('sum', ew.cast(is_zero, x.dtype), reverse)
    safe_x = ew.where(is_zero, 1, x)
    at_nonzero = scan('sum', g * y, not reverse) / safe_x
    in_first_zero_run = ew.binary('equal', zeros_so_far, 1)
    without_zero = scan('prod', safe_x, reverse)
    # Only a first zero sums anything: after a second zero the run has ended.
    at_zero = scan('sum', ew.where(in_first_zero_run, g * without_zero, 0), not reverse)
    return ew.where(is_zero, at_zero, at_nonzero)


def cumulative(kind, x, axis=0):
    """Cumulative ``kind`` ('sum' or 'prod') along ``axis``; bool inputs count as int64."""
    where = 'cum' + kind
    x = as_tensor(x)
    if not x.ndim:
        raise ValueError('%s: x must have rank >= 1, got shape %s' % (where, x.shape))
    axis = normalize_axis(axis, x.ndim, where)
    if x.dtype == 'bool':
        x = ew.cast(x, 'int64')
    return apply(Cumulative(kind, axis), x)
