"""Fused batch normalization as graph ops.

Training: one node computes (y, mean, var, inv_std) over any tuple of reduction axes on
``impl.batchnorm``; inv_std is the by-product the backward node reads. The gradient of
every output (mean and var included, as Keras's moving averages read them) flows
through one fused backward node. Inference: (x - mean) / sqrt(var + eps) * gamma + beta
with parameters already broadcastable against x. Backward nodes differentiate again
through the same math written with primitive ops.

Only the plan's fusion pass (gpuk/fusion.py) builds the fused forms: ``activation='relu'``
(BN -> relu in one kernel), BnGrad with ``activation='relu'`` (the relu's gradient and the
batch norm's backward in one, dy masked by the fused output; plans get it where the relu's
gradient has the BnGrad as its one reader, i.e. without a learning-phase switch between
them) and BnTrain with ``moving`` set, which also computes Keras's two moving-average
updates in the statistics' finalize launch.
"""
import functools
import operator

import numpy as np

from gpuk.contracts.batchnorm_checks import check_activation, kept_shape, moving_average_updates
from gpuk.contracts.dtypes import accumulation_dtype
from gpuk.graph import Constant, Meta, apply
from gpuk.kernels.runtime import prepared
from gpuk.ops import elementwise as ew
from gpuk.ops import shape as shape_ops
from gpuk.ops.activation import relu
from gpuk.ops.base import Op, broadcast_shapes
from gpuk.ops.reduction import reduce
from gpuk.ops.fused import accumulate_dtype, composite_partial_grads, is_zero, require_float


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


class MovingAverages:
    """What BnTrain(moving=...) computes besides the batch statistics, exactly as Keras's
    two K.moving_average_update calls build it (the fusion pass matched these steps):
    batchnorm_checks.moving_average_updates, the one formula (kernels, twin, graph).

    Inputs after BnTrain's own: moving_mean, moving_var, decay, var_decay[, var_factor].
    """

    def __init__(self, has_factor):
        self.has_factor = has_factor

    @property
    def n_inputs(self):
        return 5 if self.has_factor else 4

    @staticmethod
    def on_tensors(*stats_and_moving):
        """The formula on graph tensors (the ops the unfused graph has), for the gradient."""
        return moving_average_updates(operator.sub, operator.mul, *stats_and_moving)

    @staticmethod
    def on_arrays(impl, *stats_and_moving):
        """The formula on arrays through the graph's own elementwise ops (the steps the
        fusion replaced, rounding and promoting as they would)."""
        subtract, multiply = (functools.partial(ew.Binary(name).compute, impl.xp) for name in ('subtract', 'multiply'))
        return moving_average_updates(subtract, multiply, *stats_and_moving)

    def fits_kernel(self, acc, kept, moving_mean, moving_var, *scalars):
        """Whether the unfused steps, on these arrays, compute what the kernel does: everything
        in the statistics' dtype, scalars 0-d, the moving statistics of the kept shape (so no
        broadcast or promotion changes a shape or a rounding). Checked per call, on attributes
        only (no device read)."""
        return (all(a.dtype == acc for a in (moving_mean, moving_var) + scalars)
                and tuple(moving_mean.shape) == tuple(moving_var.shape) == tuple(kept)
                and all(a.ndim == 0 for a in scalars))


class BnTrain(Op):
    """(y, mean, var, inv_std): batch statistics over ``axes``, then normalize/scale/shift
    [then relu]; with ``moving`` (a MovingAverages) also (next_moving_mean, next_moving_var)."""

    def __init__(self, axes, epsilon, has_gamma, has_beta, where='normalize_batch_in_training',
                 activation='linear', moving=None):
        self.axes, self.epsilon = tuple(axes), float(epsilon)
        self.has_gamma, self.has_beta, self.where = has_gamma, has_beta, where
        self.activation, self.moving = check_activation(where, activation), moving
        self.kept = prepared.Kept()

    def _parts(self, rest):
        """(gamma, beta, moving inputs) from the inputs after x."""
        n_params = int(self.has_gamma) + int(self.has_beta)
        gamma, beta = _split((self.has_gamma, self.has_beta), rest[:n_params])
        return gamma, beta, list(rest[n_params:])

    def infer(self, x, *rest):
        require_float(self.where, 'x', x)
        gamma, beta, moving = self._parts(rest)
        kept = kept_shape(x.shape, self.axes)
        _check_param(self.where, 'gamma', gamma, kept)
        _check_param(self.where, 'beta', beta, kept)
        stat = Meta(kept, accumulate_dtype(x.dtype))
        outs = (Meta(x.shape, x.dtype), stat, stat, stat)
        if self.moving is None:
            return outs
        next_mean, next_var = (Meta(m.shape, m.dtype) for m in moving[:2])
        return outs + (next_mean, next_var)

    def forward(self, impl, x, *rest):
        # the step keeps the runner of its last problem (checked and set up once: prepared.Kept)
        return self.kept.run(impl, (x,) + rest, self._runner)

    def _runner(self, impl, x, *rest):
        """``run(x, *rest)`` for inputs of the types, shapes and dtypes of these: the kernel's
        runner, with the moving averages fused when they fit it (fits_kernel reads attributes
        only: the same answer for the same signature), else computed after it by the graph's
        own ops."""
        gamma, beta, moving = self._parts(rest)
        fused = False
        if self.moving is not None:
            acc = accumulation_dtype(x.dtype)
            fused = x.dtype == acc and self.moving.fits_kernel(acc, kept_shape(x.shape, self.axes), *moving)
        moving_args = (moving[:4] + [moving[4] if self.moving.has_factor else None]) if fused else []
        kernel = impl.batchnorm.bn_train_fwd_runner(x, gamma, beta, self.axes, self.epsilon, self.activation,
                                                    *moving_args)
        if self.moving is None or fused:
            if self.has_gamma and self.has_beta:   # Keras's layer: the inputs in the runner's order
                return kernel

            def order(x, *rest):
                gamma, beta, moving = self._parts(rest)
                return (x, gamma, beta, *moving)
            return prepared.reordered(kernel, order)

        def unfused(x, *rest):
            gamma, beta, moving = self._parts(rest)
            outs = kernel(x, gamma, beta)
            return tuple(outs) + MovingAverages.on_arrays(impl, outs[1], outs[2], *moving)
        return unfused

    def grad(self, inputs, outputs, output_grads):
        x = inputs[0]
        gamma, beta, moving = self._parts(inputs[1:])
        mean, inv_std = outputs[1], outputs[3]
        g_y, g_mean, g_var, g_inv_std = output_grads[:4]
        moving_grads = []
        if self.moving is not None:
            # the update formula's partials, in primitive ops; mean / var gather theirs below
            partials = composite_partial_grads(MovingAverages.on_tensors, [mean, outputs[2]] + moving,
                                               output_grads[4:], range(2 + len(moving)))
            g_mean, g_var = (g if p is None else p if is_zero(g) else g + p
                             for g, p in zip((g_mean, g_var), partials[:2]))
            moving_grads = partials[2:]
        d_var = None if is_zero(g_var) else g_var
        if not is_zero(g_inv_std):
            # inv_std = (var + eps) ** -0.5
            through_inv_std = g_inv_std * (inv_std * inv_std * inv_std) * -0.5
            d_var = through_inv_std if d_var is None else d_var + through_inv_std
        d_mean = None if is_zero(g_mean) else g_mean
        backward = BnGrad(self.axes, gamma is not None, d_mean is not None, d_var is not None, self.activation)
        extra = [t for t in (gamma, d_mean, d_var) if t is not None]
        if self.activation == 'relu':
            extra.append(outputs[0])   # the mask: the fused output
        d_x, d_gamma, d_beta = apply(backward, g_y, x, mean, inv_std, *extra)
        grads = [d_x]
        if gamma is not None:
            grads.append(ew.cast(shape_ops.reshape_like(d_gamma, gamma), gamma.dtype))
        if beta is not None:
            grads.append(ew.cast(shape_ops.reshape_like(d_beta, beta), beta.dtype))
        return grads + moving_grads


class BnGrad(Op):
    """(dx, dgamma, dbeta) of BnTrain; dmean / dvar are the gradients reaching the mean and
    var outputs (optional inputs, like gamma). With activation='relu' the last input is the
    fused BnTrain's output y, and dy counts only where y > 0 (the relu's gradient reads the
    output too, so the masks agree exactly)."""

    def __init__(self, axes, has_gamma, has_dmean, has_dvar, activation='linear'):
        self.axes = axes
        self.has_gamma, self.has_dmean, self.has_dvar = has_gamma, has_dmean, has_dvar
        self.activation = check_activation('BnGrad', activation)
        self.kept = prepared.Kept()

    def _optional(self, rest):
        """(gamma, d_mean, d_var, y) from the inputs after inv_std."""
        relu_y = rest[-1] if self.activation == 'relu' else None
        rest = rest[:-1] if self.activation == 'relu' else rest
        return _split((self.has_gamma, self.has_dmean, self.has_dvar), rest) + [relu_y]

    def infer(self, dy, x, mean, inv_std, *rest):
        stat = Meta(mean.shape, mean.dtype)
        return Meta(x.shape, x.dtype), stat, stat

    def forward(self, impl, dy, x, mean, inv_std, *rest):   # the step keeps its runner, as BnTrain's
        return self.kept.run(impl, (dy, x, mean, inv_std) + rest, self._runner)

    def _runner(self, impl, dy, x, mean, inv_std, *rest):
        gamma, d_mean, d_var, relu_y = self._optional(rest)
        kernel = impl.batchnorm.bn_bwd_runner(dy, x, gamma, mean, inv_std, self.axes, d_mean, d_var,
                                              self.activation, relu_y)
        if self.has_gamma and not self.has_dmean and not self.has_dvar:   # Keras's layer: no _optional per call
            if self.activation == 'relu':
                return prepared.reordered(kernel, lambda dy, x, mean, inv_std, gamma, y:
                                          (dy, x, gamma, mean, inv_std, None, None, y))
            return prepared.reordered(kernel, lambda dy, x, mean, inv_std, gamma: (dy, x, gamma, mean, inv_std))

        def order(dy, x, mean, inv_std, *rest):
            gamma, d_mean, d_var, relu_y = self._optional(rest)
            return dy, x, gamma, mean, inv_std, d_mean, d_var, relu_y
        return prepared.reordered(kernel, order)

    def grad(self, inputs, outputs, output_grads):
        axes = self.axes

        def formula(dy, x, mean, inv_std, *rest):
            gamma, d_mean, d_var, relu_y = self._optional(rest)
            acc = mean.dtype
            if relu_y is not None:
                dy = ew.where(relu_y > 0, dy, Constant(np.zeros((), dtype=dy.dtype)))
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
    """(x - mean) / sqrt(var + epsilon) * gamma + beta [then relu]; the parameters broadcast
    against x."""

    def __init__(self, epsilon, has_gamma, has_beta, axis=-1, where='batch_normalization', activation='linear'):
        self.epsilon, self.has_gamma, self.has_beta = float(epsilon), has_gamma, has_beta
        self.axis, self.where = axis, where
        self.activation = check_activation(where, activation)
        self.kept = prepared.Kept()

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

    def forward(self, impl, x, mean, var, *params):   # the step keeps its runner, as BnTrain's
        return self.kept.run(impl, (x, mean, var) + params, self._runner)

    def _runner(self, impl, x, mean, var, *params):
        gamma, beta = _split((self.has_gamma, self.has_beta), params)
        kernel = impl.batchnorm.bn_infer_fwd_runner(x, mean, var, gamma, beta, self.epsilon, self.axis,
                                                    self.activation)
        if self.has_gamma and self.has_beta:
            return kernel
        return prepared.reordered(kernel, lambda x, mean, var, *params:
                                  (x, mean, var, *_split((self.has_gamma, self.has_beta), params)))

    def grad(self, inputs, outputs, output_grads):
        def formula(x, mean, var, *params):
            gamma, beta = _split((self.has_gamma, self.has_beta), params)
            acc = accumulate_dtype(x.dtype)
            y = (ew.cast(x, acc) - ew.cast(mean, acc)) / ew.unary('sqrt', ew.cast(var, acc) + self.epsilon)
            if gamma is not None:
                y = y * ew.cast(gamma, acc)
            if beta is not None:
                y = y + ew.cast(beta, acc)
            y = ew.cast(y, x.dtype)
            return relu(y) if self.activation == 'relu' else y
        return composite_partial_grads(formula, inputs, output_grads, range(len(inputs)))


__all__ = ['BnTrain', 'BnGrad', 'BnInfer', 'MovingAverages', 'kept_shape', 'to_kept', 'on_reduced_axes']
