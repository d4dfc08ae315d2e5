"""Fused batch normalization as graph ops.

Training: one node computes (y, mean, var, inv_std) over any tuple of reduction axes on
``impl.batchnorm``; inv_std is the by-product the backward node reads. The gradient of
every output (mean and var included, as Keras's moving averages read them) flows
through one fused backward node. Inference: (x - mean) / sqrt(var + eps) * gamma + beta
with parameters already broadcastable against x. Backward nodes differentiate again
through the same math written with primitive ops.
"""
import numpy as np

from gpuk.graph import Meta, apply
from gpuk.ops import elementwise as ew
from gpuk.ops import shape as shape_ops
from gpuk.ops.base import Op, broadcast_shapes
from gpuk.ops.reduction import reduce
from gpuk.ops.fused import accumulate_dtype, composite_partial_grads, is_zero, require_float


def kept_shape(shape, axes):
    return None if shape is None else tuple(d for i, d in enumerate(shape) if i not in axes)


def _check_param(where, name, meta, kept):
    """gamma / beta / dmean / dvar: any shape holding the kept size (Keras reshapes alike)."""
    if meta is None:
        return
    require_float(where, name, meta)
    if kept is None or meta.shape is None or None in kept or None in meta.shape:
        return
    if int(np.prod(meta.shape, dtype=np.int64)) != int(np.prod(kept, dtype=np.int64)):
        raise ValueError('%s: %s must have shape %s (x without the reduction axes), got %s'
                         % (where, name, kept, meta.shape))


def _split(flags, values):
    """Optional inputs: the values of the flags that are set, None for the others."""
    values, out = list(values), []
    for flag in flags:
        out.append(values.pop(0) if flag else None)
    return out


def to_kept(param, x, axes):
    """``param`` reshaped to x's shape without ``axes`` (symbolic dims where unknown)."""
    kept_axes = [i for i in range(x.ndim) if i not in axes]
    static = tuple(x.shape[i] for i in kept_axes)
    if param.shape == static and None not in static:
        return param
    spec = [x.shape[i] if x.shape[i] is not None else shape_ops.shape(x)[i] for i in kept_axes]
    return shape_ops.reshape(param, spec)


def on_reduced_axes(stat, axes):
    """A kept-shaped statistic with size-1 axes put back at ``axes`` (broadcasts against x)."""
    for axis in sorted(axes):
        stat = shape_ops.expand_dims(stat, axis)
    return stat


class BnTrain(Op):
    """(y, mean, var, inv_std): batch statistics over ``axes``, then normalize/scale/shift."""

    def __init__(self, axes, epsilon, has_gamma, has_beta, where='normalize_batch_in_training'):
        self.axes, self.epsilon = tuple(axes), float(epsilon)
        self.has_gamma, self.has_beta, self.where = has_gamma, has_beta, where

    def infer(self, x, *params):
        require_float(self.where, 'x', x)
        gamma, beta = _split((self.has_gamma, self.has_beta), params)
        kept = kept_shape(x.shape, self.axes)
        _check_param(self.where, 'gamma', gamma, kept)
        _check_param(self.where, 'beta', beta, kept)
        stat = Meta(kept, accumulate_dtype(x.dtype))
        return Meta(x.shape, x.dtype), stat, stat, stat

    def forward(self, impl, x, *params):
        gamma, beta = _split((self.has_gamma, self.has_beta), params)
        return impl.batchnorm.bn_train_fwd(x, gamma, beta, self.axes, self.epsilon)

    def grad(self, inputs, outputs, output_grads):
        x = inputs[0]
        gamma, beta = _split((self.has_gamma, self.has_beta), inputs[1:])
        _, mean, _, inv_std = outputs
        g_y, g_mean, g_var, g_inv_std = output_grads
        d_var = None if is_zero(g_var) else g_var
        if not is_zero(g_inv_std):
            # inv_std = (var + eps) ** -0.5
            through_inv_std = g_inv_std * (inv_std * inv_std * inv_std) * -0.5
            d_var = through_inv_std if d_var is None else d_var + through_inv_std
        d_mean = None if is_zero(g_mean) else g_mean
        backward = BnGrad(self.axes, gamma is not None, d_mean is not None, d_var is not None)
        extra = [t for t in (gamma, d_mean, d_var) if t is not None]
        d_x, d_gamma, d_beta = apply(backward, g_y, x, mean, inv_std, *extra)
        grads = [d_x]
        if gamma is not None:
            grads.append(ew.cast(shape_ops.reshape_like(d_gamma, gamma), gamma.dtype))
        if beta is not None:
            grads.append(ew.cast(shape_ops.reshape_like(d_beta, beta), beta.dtype))
        return grads


class BnGrad(Op):
    """(dx, dgamma, dbeta) of BnTrain; dmean / dvar are the gradients reaching the mean and
    var outputs (optional inputs, like gamma)."""

    def __init__(self, axes, has_gamma, has_dmean, has_dvar):
        self.axes = axes
        self.has_gamma, self.has_dmean, self.has_dvar = has_gamma, has_dmean, has_dvar

    def _optional(self, rest):
        return _split((self.has_gamma, self.has_dmean, self.has_dvar), rest)

    def infer(self, dy, x, mean, inv_std, *rest):
        stat = Meta(mean.shape, mean.dtype)
        return Meta(x.shape, x.dtype), stat, stat

    def forward(self, impl, dy, x, mean, inv_std, *rest):
        gamma, d_mean, d_var = self._optional(rest)
        return impl.batchnorm.bn_bwd(dy, x, gamma, mean, inv_std, self.axes, dmean=d_mean, dvar=d_var)

    def grad(self, inputs, outputs, output_grads):
        axes = self.axes

        def formula(dy, x, mean, inv_std, *rest):
            gamma, d_mean, d_var = self._optional(rest)
            acc = mean.dtype
            dy_a, x_a = ew.cast(dy, acc), ew.cast(x, acc)
            mean_b, inv_b = on_reduced_axes(mean, axes), on_reduced_axes(inv_std, axes)
            xhat = (x_a - mean_b) * inv_b
            d_beta = reduce('sum', dy_a, axes)
            d_gamma = reduce('sum', dy_a * xhat, axes)
            scale = inv_b if gamma is None else inv_b * on_reduced_axes(to_kept(ew.cast(gamma, acc), x, axes), axes)
            d_x = scale * (dy_a - reduce('mean', dy_a, axes, keepdims=True)
                           - xhat * reduce('mean', dy_a * xhat, axes, keepdims=True))
            if d_mean is not None or d_var is not None:
                count = reduce('sum', ew.ones_like(x_a), axes, keepdims=True)
                if d_mean is not None:
                    d_x = d_x + on_reduced_axes(d_mean, axes) / count
                if d_var is not None:
                    d_x = d_x + on_reduced_axes(d_var, axes) * 2 * (x_a - mean_b) / count
            return ew.cast(d_x, x.dtype), d_gamma, d_beta
        return composite_partial_grads(formula, inputs, output_grads, range(len(inputs)))


class BnInfer(Op):
    """(x - mean) / sqrt(var + epsilon) * gamma + beta; the parameters broadcast against x."""

    def __init__(self, epsilon, has_gamma, has_beta, axis=-1, where='batch_normalization'):
        self.epsilon, self.has_gamma, self.has_beta = float(epsilon), has_gamma, has_beta
        self.axis, self.where = axis, where

    def infer(self, x, mean, var, *params):
        require_float(self.where, 'x', x)
        names = ['mean', 'var'] + [n for n, f in (('gamma', self.has_gamma), ('beta', self.has_beta)) if f]
        for name, meta in zip(names, (mean, var) + params):
            require_float(self.where, name, meta)
            if x.shape is None or meta.shape is None:
                continue
            try:
                joint = broadcast_shapes(x.shape, meta.shape, self.where)
            except ValueError:
                joint = None
            if joint is None or len(joint) != len(x.shape) or any(
                    a is not None and b is not None and a != b for a, b in zip(joint, x.shape)):
                raise ValueError('%s: %s of shape %s must have x.shape[axis] values or broadcast '
                                 'against x of shape %s' % (self.where, name, meta.shape, x.shape))
        return Meta(x.shape, x.dtype)

    def forward(self, impl, x, mean, var, *params):
        gamma, beta = _split((self.has_gamma, self.has_beta), params)
        return impl.batchnorm.bn_infer_fwd(x, mean, var, gamma, beta, self.epsilon, self.axis)

    def grad(self, inputs, outputs, output_grads):
        def formula(x, mean, var, *params):
            gamma, beta = _split((self.has_gamma, self.has_beta), params)
            acc = accumulate_dtype(x.dtype)
            y = (ew.cast(x, acc) - ew.cast(mean, acc)) / ew.unary('sqrt', ew.cast(var, acc) + self.epsilon)
            if gamma is not None:
                y = y * ew.cast(gamma, acc)
            if beta is not None:
                y = y + ew.cast(beta, acc)
            return ew.cast(y, x.dtype)
        return composite_partial_grads(formula, inputs, output_grads, range(len(inputs)))


__all__ = ['BnTrain', 'BnGrad', 'BnInfer', 'kept_shape', 'to_kept', 'on_reduced_axes']
