"""Reductions (sum, mean, max, min, prod, any, all), arg-reductions and cumulative sums/products."""
import numpy as np

from gpuk import config
from gpuk.graph import Meta, apply, as_tensor
from gpuk.ops import elementwise as ew
from gpuk.ops.base import Op, normalize_axes

_REDUCERS = {
    'sum': lambda xp, x, axes, keep: xp.sum(x, axis=axes, keepdims=keep),
    'mean': lambda xp, x, axes, keep: xp.mean(x, axis=axes, keepdims=keep),
    'max': lambda xp, x, axes, keep: xp.max(x, axis=axes, keepdims=keep),
    'min': lambda xp, x, axes, keep: xp.min(x, axis=axes, keepdims=keep),
    'prod': lambda xp, x, axes, keep: xp.prod(x, axis=axes, keepdims=keep),
    'any': lambda xp, x, axes, keep: xp.any(x, axis=axes, keepdims=keep),
    'all': lambda xp, x, axes, keep: xp.all(x, axis=axes, keepdims=keep),
}


def _reduced_shape(shape, axes, keepdims):
    if keepdims:
        return tuple(1 if i in axes else d for i, d in enumerate(shape))
    return tuple(d for i, d in enumerate(shape) if i not in axes)


class Reduce(Op):
    def __init__(self, kind, axes, keepdims):
        self.kind, self.axes, self.keepdims = kind, tuple(axes), bool(keepdims)
        self.differentiable = kind not in ('any', 'all')

    def infer(self, x):
        dtype = 'bool' if self.kind in ('any', 'all') else x.dtype
        if self.kind == 'mean' and np.dtype(x.dtype).kind != 'f':
            dtype = x.dtype  # TensorFlow's integer mean stays integer (truncated)
        return Meta(_reduced_shape(x.shape, self.axes, self.keepdims), dtype)

    def forward(self, impl, x):
        xp = impl.xp
        if self.kind in ('max', 'min') and 0 in [x.shape[a] for a in self.axes]:
            raise ValueError('%s: cannot reduce over an empty axis of shape %s' % (self.kind, x.shape))
        out = _REDUCERS[self.kind](xp, x, self.axes, self.keepdims)
        return xp.asarray(out).astype(x.dtype if self.kind not in ('any', 'all') else bool, copy=False)

    def grad(self, inputs, outputs, output_grads):
        x, y, g = inputs[0], outputs[0], output_grads[0]
        if self.kind in ('sum', 'mean'):
            return [apply(ReduceGrad(self.kind, self.axes, self.keepdims), g, x)]
        g_b = apply(ReduceGrad('sum', self.axes, self.keepdims), g, x)
        y_b = apply(ReduceGrad('sum', self.axes, self.keepdims), y, x)
        if self.kind in ('max', 'min'):
            # Ties share the gradient equally, like TensorFlow.
            hit = ew.cast(ew.binary("equal", x, y_b), x.dtype)
            count = reduce('sum', hit, self.axes, keepdims=True)
            return [g_b * hit / count]
        # prod: the product of the other entries, exact also where x has zeros.
        is_zero = ew.binary('equal', x, 0)
        zeros = reduce('sum', ew.cast(is_zero, x.dtype), self.axes, keepdims=True)
        others_nonzero = reduce('prod', ew.where(is_zero, ew.ones_like(x), x), self.axes, keepdims=True)
        at_zero = ew.where(ew.binary('equal', zeros, 1), others_nonzero, ew.zeros_like(others_nonzero))
        safe_x = ew.where(is_zero, ew.ones_like(x), x)
        return [g_b * ew.where(is_zero, ew.broadcast_like(at_zero, x), y_b / safe_x)]


class ReduceGrad(Op):
    """Spreads ``g`` (the gradient of a sum or mean over ``axes``) back to ``like``'s shape."""

    def __init__(self, kind, axes, keepdims):
        self.kind, self.axes, self.keepdims = kind, axes, keepdims

    def infer(self, g, like):
        return Meta(like.shape, g.dtype)

    def forward(self, impl, g, like):
        xp = impl.xp
        if not self.keepdims:
            g = xp.expand_dims(g, self.axes) if self.axes else g
        out = xp.broadcast_to(g, like.shape)
        if self.kind == 'mean':
            count = int(np.prod([like.shape[a] for a in self.axes], dtype=np.int64))
            out = out / max(count, 1)
            out = out.astype(g.dtype, copy=False)
        return out

    def grad(self, inputs, outputs, output_grads):
        return [apply(Reduce(self.kind, self.axes, self.keepdims), output_grads[0]), None]


def reduce(kind, x, axis=None, keepdims=False):
    x = as_tensor(x)
    if x.ndim is None:
        raise ValueError('%s: tensors of unknown rank cannot be reduced' % kind)
    axes = normalize_axes(axis, x.ndim, kind)
    if kind in ('any', 'all'):
        x = ew.cast(x, 'bool')
    elif x.dtype == 'bool':
        x = ew.cast(x, 'int64' if kind != 'mean' else config.floatx())
    return apply(Reduce(kind, axes, keepdims), x)
