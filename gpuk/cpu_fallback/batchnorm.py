"""NumPy twins of the fused batch-normalization kernels (gpuk/kernels/batchnorm.py).

Training forward reduces over any tuple of `axes` (Keras
`normalize_batch_in_training`): mean and biased variance come back with the
reduced axes removed, plus the inverse standard deviation the backward pass
needs. Statistics are two-pass (mean first, then the centred sum of squares),
so large offsets do not cancel. float16 inputs are computed in float32: y and
dx come back as float16, statistics and dgamma/dbeta stay float32 (as cuDNN
keeps them for half inputs).

Fusions the graph uses (gpuk/fusion.py): ``activation='relu'`` applies max(y, 0) to
the normalized output of the training and inference forwards, and bn_bwd then masks
dy where that output is not > 0 (it reads the output, see bn_bwd); the training
forward can also compute Keras's moving-average updates of the statistics
(``moving_mean`` / ``moving_var`` / ``decay`` / ``var_factor``) into new arrays.
"""
import operator

import numpy as np

from gpuk.contracts.dtypes import accumulation_dtype
from gpuk.contracts import batchnorm_checks as checks, conv_checks

__all__ = ['bn_train_fwd', 'bn_infer_fwd', 'bn_bwd', 'bn_train_fwd_runner', 'bn_infer_fwd_runner', 'bn_bwd_runner']


# ---------------------------------------------------------------- checks

def _float_array(fn, name, value):
    return conv_checks.typed_float_array(fn, name, value, bfloat16=False)


class _Layout(checks.Layout):
    """checks.Layout plus the twin's reductions.

    The fast paths (all axes but the first or the last one reduced, the
    BatchNormalization layer's channels_first/last cases) view x as a 2-D
    matrix so every reduction is a contiguous one; any other split reduces
    with keepdims over the tuple of axes.
    """

    def __init__(self, shape, axes):
        super().__init__(shape, axes)
        ndim = len(shape)
        channels = int(np.prod(self.kept_shape, dtype=np.int64))
        if ndim >= 2 and self.kept_axes == (ndim - 1,):
            self.matrix_shape, self.reduce_axis = (self.count, channels), 0
        elif ndim >= 2 and self.kept_axes == (0,):
            self.matrix_shape, self.reduce_axis = (channels, self.count), 1
        else:
            self.matrix_shape, self.reduce_axis = None, None

    def view(self, array):
        """x-shaped array -> the array the reductions run on."""
        return array if self.matrix_shape is None else array.reshape(self.matrix_shape)

    def stat_view(self, stat):
        """kept-shaped statistic -> broadcastable against view(x)."""
        if self.matrix_shape is None:
            return stat.reshape(self.bcast_shape)
        return stat.reshape((1, -1) if self.reduce_axis == 0 else (-1, 1))

    def reduce_sum(self, array):
        if self.matrix_shape is None:
            return np.sum(array, axis=self.axes).reshape(self.kept_shape)
        # einsum's column sum of a tall (count, C) matrix measured ~3x faster than
        # np.sum(axis=0), which adds it row by row (C-long inner loops)
        subscripts = 'ij->j' if self.reduce_axis == 0 else 'ij->i'
        return np.einsum(subscripts, array).reshape(self.kept_shape)

    def reduce_sum_product(self, a, b):
        """reduce_sum(a * b); on the 2-D views einsum fuses the product into the sum
        (no x-sized temporary: one pass instead of three)."""
        if self.matrix_shape is None:
            return self.reduce_sum(a * b)
        subscripts = 'ij,ij->j' if self.reduce_axis == 0 else 'ij,ij->i'
        return np.einsum(subscripts, a, b).reshape(self.kept_shape)


def _kept_param(fn, name, value, layout, dtype):
    """gamma / beta / mean / inv_std: None or any array with the kept size
    (Keras reshapes them to the broadcast shape the same way)."""
    if value is None:
        return None
    array = _float_array(fn, name, value)
    if array.shape != layout.kept_shape and array.size != int(np.prod(layout.kept_shape)):
        raise ValueError('%s: %s must have shape %s (x shape %s without the reduced axes %s), '
                         'got shape %s' % (fn, name, layout.kept_shape, layout.shape,
                                           layout.axes, array.shape))
    return array.astype(dtype, copy=False).reshape(layout.kept_shape)


# ---------------------------------------------------------------- training forward

def bn_train_fwd(x, gamma, beta, axes, epsilon=1e-3, activation='linear', moving_mean=None,
                 moving_var=None, decay=None, var_decay=None, var_factor=None):
    """Batch statistics over `axes`, then normalize, scale and shift [and relu].

    With moving_mean / moving_var (the kept shape) it also returns Keras's
    moving_average_update of both, as new arrays (the inputs are not touched):
        next_moving_mean = moving_mean - (moving_mean - mean) * decay
        next_moving_var = moving_var - (moving_var - var * var_factor) * var_decay
    decay is 1 - momentum; var_decay the variance's (decay when None); var_factor
    the variance correction the BatchNormalization layer applies
    (n / (n - (1 + epsilon))), 1 when None.
    Each step rounds in the statistics' dtype, in this order, as the unfused
    graph does.

    # Returns
        (y, mean, var, inv_std[, next_moving_mean, next_moving_var]): y like x;
        mean, biased var and inv_std = 1/sqrt(var + epsilon) with the reduced
        axes removed; the moving averages in the statistics' dtype.
    """
    fn = 'bn_train_fwd'
    x = _float_array(fn, 'x', x)
    epsilon = checks.check_epsilon(fn, epsilon)
    checks.check_activation(fn, activation)
    moving = checks.check_moving_args(fn, moving_mean, moving_var, decay, var_decay, var_factor)
    axes = checks.normalize_axes(fn, axes, x.ndim)
    layout = _Layout(x.shape, axes).require_elements(fn)
    acc = accumulation_dtype(x.dtype)
    gamma = _kept_param(fn, 'gamma', gamma, layout, acc)
    beta = _kept_param(fn, 'beta', beta, layout, acc)
    if moving:
        moving_mean = _kept_param(fn, 'moving_mean', moving_mean, layout, acc)
        moving_var = _kept_param(fn, 'moving_var', moving_var, layout, acc)

    xv = layout.view(x).astype(acc, copy=False)
    mean = layout.reduce_sum(xv) / acc.type(layout.count)
    centred = xv - layout.stat_view(mean)
    var = layout.reduce_sum_product(centred, centred) / acc.type(layout.count)
    inv_std = (1.0 / np.sqrt(var + acc.type(epsilon))).astype(acc, copy=False)

    scale = inv_std if gamma is None else inv_std * gamma
    y = centred    # centred is ours (xv - mean made it): normalize it in place
    y *= layout.stat_view(scale)
    if beta is not None:
        y += layout.stat_view(beta)
    if activation == 'relu':
        np.maximum(y, 0, out=y)
    y = y.reshape(x.shape).astype(x.dtype, copy=False)
    if not moving:
        return y, mean, var, inv_std
    decay, var_decay, factor = (np.asarray(v, dtype=acc).reshape(()) for v in (
        decay, decay if var_decay is None else var_decay, 1 if var_factor is None else var_factor))
    next_mean, next_var = checks.moving_average_updates(operator.sub, operator.mul, mean, var, moving_mean,
                                                        moving_var, decay, var_decay, factor)
    return y, mean, var, inv_std, next_mean, next_var


# ---------------------------------------------------------------- inference forward

def _channel_param(fn, name, value, x, axis, acc):
    """A 1-D parameter of x.shape[axis] values goes on `axis`; anything else
    must already broadcast against x (Keras's broadcast_moving_mean case)."""
    array = _float_array(fn, name, value)
    if array.ndim == 1 and array.shape[0] == x.shape[axis] and x.ndim > 1:
        shape = [1] * x.ndim
        shape[axis] = array.shape[0]
        return array.astype(acc, copy=False).reshape(shape)
    try:
        np.broadcast_shapes(array.shape, x.shape)
    except ValueError:
        raise ValueError('%s: %s must have shape (%d,) (x.shape[axis] with axis=%d) or broadcast '
                         'to x shape %s, got shape %s'
                         % (fn, name, x.shape[axis], axis, x.shape, array.shape)) from None
    if np.broadcast_shapes(array.shape, x.shape) != x.shape:
        raise ValueError('%s: %s of shape %s would broadcast x shape %s to a larger shape'
                         % (fn, name, array.shape, x.shape))
    return array.astype(acc, copy=False)


def bn_infer_fwd(x, mean, var, gamma, beta, epsilon=1e-3, axis=-1, activation='linear'):
    """Keras `batch_normalization`: (x - mean) / sqrt(var + epsilon) * gamma + beta
    [then max(., 0) with activation='relu'].

    mean / var / gamma / beta are 1-D arrays of x.shape[axis] values (put on
    `axis`) or arrays that already broadcast against x; gamma / beta may be None.
    """
    fn = 'bn_infer_fwd'
    x = _float_array(fn, 'x', x)
    epsilon = checks.check_epsilon(fn, epsilon)
    checks.check_activation(fn, activation)
    axis = checks.check_channel_axis(fn, axis, x.ndim)
    acc = accumulation_dtype(x.dtype)
    mean = _channel_param(fn, 'mean', mean, x, axis, acc)
    var = _channel_param(fn, 'var', var, x, axis, acc)
    scale = 1.0 / np.sqrt(var + acc.type(epsilon))
    if gamma is not None:
        scale = scale * _channel_param(fn, 'gamma', gamma, x, axis, acc)
    y = (x.astype(acc, copy=False) - mean) * scale
    if beta is not None:
        y += _channel_param(fn, 'beta', beta, x, axis, acc)
    if activation == 'relu':
        np.maximum(y, 0, out=y)
    return y.astype(x.dtype, copy=False)


# ---------------------------------------------------------------- backward

def bn_bwd(dy, x, gamma, mean, inv_std, axes, dmean=None, dvar=None, activation='linear', y=None):
    """Gradients of bn_train_fwd, in two passes over x and dy.

    activation='relu' differentiates the fused bn_train_fwd(..., activation='relu'):
    dy is replaced by 0 where y (that call's output) is not > 0, before both passes.
    The mask reads y rather than recomputing the normalized value: it is then exactly
    the mask the unfused relu's gradient uses (output > 0 after rounding to x's dtype,
    NaN masked), and beta is not needed. Masking selects (dy where y > 0, else 0), as
    the fused bias + relu gradient does.

    Pass 1 reduces dbeta = sum(dy) and dgamma = sum(dy * xhat); pass 2 writes
    dx = inv_std * gamma * (dy - dbeta/n - xhat * dgamma/n)
         + dmean/n + dvar * 2 (x - mean)/n,
    the last two terms being the gradients that flow into the mean and var
    outputs (var is the biased variance, and sum(x - mean) = 0).

    # Returns
        (dx, dgamma, dbeta): dx like x; dgamma, dbeta with the kept shape
        (also when gamma is None: the gradient for an implicit scale of 1).
    """
    fn = 'bn_bwd'
    x = _float_array(fn, 'x', x)
    dy = _float_array(fn, 'dy', dy)
    if dy.shape != x.shape:
        raise ValueError('%s: dy must have the shape of x, got dy %s and x %s'
                         % (fn, dy.shape, x.shape))
    y = None if y is None else _float_array(fn, 'y', y)
    checks.check_relu_output(fn, activation, y, x)
    axes = checks.normalize_axes(fn, axes, x.ndim)
    layout = _Layout(x.shape, axes).require_elements(fn)
    acc = accumulation_dtype(x.dtype)
    if mean is None or inv_std is None:
        raise ValueError('%s: mean and inv_std (outputs of bn_train_fwd) are required' % fn)
    mean = _kept_param(fn, 'mean', mean, layout, acc)
    inv_std = _kept_param(fn, 'inv_std', inv_std, layout, acc)
    gamma = _kept_param(fn, 'gamma', gamma, layout, acc)
    dmean = _kept_param(fn, 'dmean', dmean, layout, acc)
    dvar = _kept_param(fn, 'dvar', dvar, layout, acc)
    n = acc.type(layout.count)

    # pass 1: the two reductions
    xv = layout.view(x).astype(acc, copy=False)
    dyv = layout.view(dy).astype(acc, copy=False)
    if y is not None:
        dyv = np.where(layout.view(y) > 0, dyv, acc.type(0))
    # xhat = centred * inv_std is never formed: inv_std scales the per-channel sums
    centred = xv - layout.stat_view(mean)
    dbeta = layout.reduce_sum(dyv)
    dgamma = layout.reduce_sum_product(dyv, centred) * inv_std

    # pass 2: dx, in place in two x-sized buffers (centred is ours and used last here)
    # dx = dy * scale - dbeta/n * scale + xhat * (-dgamma/n * scale [+ 2 dvar/(inv_std n)])
    # with per-channel factors, since 2 (x - mean) / n = 2 xhat / (inv_std n)
    scale = inv_std if gamma is None else inv_std * gamma
    xhat_factor = -dgamma / n * scale
    if dvar is not None:
        xhat_factor = xhat_factor + 2.0 * dvar / (inv_std * n)
    dx = dyv * layout.stat_view(scale)
    dx -= layout.stat_view(dbeta / n * scale)
    centred *= layout.stat_view(xhat_factor * inv_std)
    dx += centred
    if dmean is not None:
        dx += layout.stat_view(dmean / n)
    return dx.reshape(x.shape).astype(x.dtype, copy=False), dgamma, dbeta


# ---------------------------------------------------------------- runners (what a plan step keeps)

def bn_train_fwd_runner(x, gamma, beta, axes, epsilon=1e-3, activation='linear', moving_mean=None,
                        moving_var=None, decay=None, var_decay=None, var_factor=None):
    """``run(x, gamma, beta, moving_mean=None, moving_var=None, decay=None, var_decay=None,
    var_factor=None)``: bn_train_fwd with these axes, epsilon and activation (what a BnTrain plan
    step keeps between calls; the checks run per call here, as in bn_train_fwd)."""
    def run(x, gamma, beta, moving_mean=None, moving_var=None, decay=None, var_decay=None, var_factor=None):
        return bn_train_fwd(x, gamma, beta, axes, epsilon, activation, moving_mean, moving_var, decay, var_decay,
                            var_factor)
    return run


def bn_infer_fwd_runner(x, mean, var, gamma, beta, epsilon=1e-3, axis=-1, activation='linear'):
    """``run(x, mean, var, gamma, beta)``: bn_infer_fwd with this epsilon, axis and activation
    (what a BnInfer plan step keeps; checked per call here, as in bn_infer_fwd)."""
    return lambda x, mean, var, gamma, beta: bn_infer_fwd(x, mean, var, gamma, beta, epsilon, axis, activation)


def bn_bwd_runner(dy, x, gamma, mean, inv_std, axes, dmean=None, dvar=None, activation='linear', y=None):
    """``run(dy, x, gamma, mean, inv_std, dmean=None, dvar=None, y=None)``: bn_bwd with these axes
    and activation (what a BnGrad plan step keeps; checked per call here, as in bn_bwd)."""
    def run(dy, x, gamma, mean, inv_std, dmean=None, dvar=None, y=None):
        return bn_bwd(dy, x, gamma, mean, inv_std, axes, dmean, dvar, activation, y)
    return run
