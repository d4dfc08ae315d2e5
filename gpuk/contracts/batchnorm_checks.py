"""Argument checks of the batch-normalization family, shared by the NumPy twins
(gpuk/cpu_fallback/batchnorm.py) and the CUDA launchers (gpuk/kernels/batchnorm.py),
so both raise the same errors, with the same messages, before any work; plus the
split of x's axes into reduced and kept ones that both build from the checked axes, and
the moving-average formula (also used by the graph ops, gpuk/ops/batchnorm.py)."""
import numpy as np


def check_channel_axis(fn, axis, ndim):
    """bn_infer_fwd's axis (where 1-D parameters go), as an int in [0, ndim)."""
    if isinstance(axis, bool) or not isinstance(axis, (int, np.integer)) \
            or not -max(ndim, 1) <= axis < max(ndim, 1):
        raise ValueError('%s: axis must be an int in [-%d, %d) for x of rank %d, got %r'
                         % (fn, ndim, ndim, ndim, axis))
    return int(axis) % max(ndim, 1)


def check_epsilon(fn, epsilon):
    if isinstance(epsilon, bool) or not isinstance(epsilon, (int, float, np.number)) \
            or not epsilon >= 0:
        raise ValueError('%s: epsilon must be a number >= 0, got %r' % (fn, epsilon))
    return float(epsilon)


def normalize_axes(fn, axes, ndim):
    """An int or a tuple / list of ints in [-ndim, ndim) -> sorted non-negative tuple."""
    if isinstance(axes, (int, np.integer)) and not isinstance(axes, bool):
        axes = (axes,)
    if not isinstance(axes, (tuple, list)) or \
            not all(isinstance(a, (int, np.integer)) and not isinstance(a, bool) for a in axes):
        raise TypeError('%s: axes must be a tuple of ints, got %r' % (fn, axes))
    normalized = []
    for a in axes:
        if not -ndim <= a < ndim:
            raise ValueError('%s: axes must lie in [-%d, %d) for x of rank %d, got %r'
                             % (fn, ndim, ndim, ndim, tuple(axes)))
        normalized.append(int(a) % ndim)
    if len(set(normalized)) != len(normalized):
        raise ValueError('%s: axes must not repeat an axis, got %r' % (fn, tuple(axes)))
    return tuple(sorted(normalized))


def kept_shape(shape, axes):
    """``shape`` without the reduced ``axes`` (None for an unknown shape)."""
    return None if shape is None else tuple(d for i, d in enumerate(shape) if i not in axes)


class Layout:
    """How x's axes (`axes`: the output of normalize_axes) split into reduced and kept ones."""

    def __init__(self, shape, axes):
        ndim = len(shape)
        self.shape = tuple(shape)
        self.axes = axes
        self.kept_axes = tuple(i for i in range(ndim) if i not in axes)
        self.kept_shape = kept_shape(self.shape, axes)
        self.bcast_shape = tuple(1 if i in axes else shape[i] for i in range(ndim))
        self.count = int(np.prod([shape[i] for i in axes], dtype=np.int64))

    def require_elements(self, fn):
        """self, after checking that the reduced axes hold at least one element."""
        if self.count == 0:
            raise ValueError('%s: x must have elements along the reduced axes %s, got shape %s'
                             % (fn, self.axes, self.shape))
        return self


ACTIVATIONS = ('linear', 'relu')


def check_activation(fn, activation):
    """The fused epilogue: 'linear' (none) or 'relu' (y = max(y, 0))."""
    if activation not in ACTIVATIONS:
        raise ValueError("%s: activation must be 'linear' or 'relu', got %r" % (fn, activation))
    return activation


def moving_average_updates(subtract, multiply, mean, var, moving_mean, moving_var, decay, var_decay,
                           var_factor=None):
    """Keras's two K.moving_average_update steps, as the BatchNormalization layer builds them:

        next_mean = moving_mean - (moving_mean - mean) * decay
        next_var = moving_var - (moving_var - var [* var_factor]) * var_decay

    with the caller's ``subtract`` / ``multiply`` (NumPy's or the graph's operators, or the
    graph's elementwise ops on arrays), so every step rounds where the caller's ops round."""
    corrected = var if var_factor is None else multiply(var, var_factor)
    next_mean = subtract(moving_mean, multiply(subtract(moving_mean, mean), decay))
    next_var = subtract(moving_var, multiply(subtract(moving_var, corrected), var_decay))
    return next_mean, next_var


def _check_scalar(fn, name, value):
    """A Python number or a one-element float array (a graph scalar may live on the device,
    so its value is not range-checked here)."""
    if isinstance(value, (int, float, np.floating)) and not isinstance(value, bool):
        return
    dtype, size = getattr(value, 'dtype', None), getattr(value, 'size', None)
    if dtype is None or np.dtype(dtype).kind != 'f' or size != 1:
        raise TypeError('%s: %s must be a float or a one-element float array, got %r' % (fn, name, value))


def check_moving_args(fn, moving_mean, moving_var, decay, var_decay, var_factor):
    """The moving-average update's arguments go together: moving_mean and moving_var with
    decay (1 - momentum, Keras's moving_average_update weight of the batch statistic), an
    optional var_decay (the variance's, decay when None: a graph may hold two constants)
    and an optional var_factor (the variance correction, 1 when None); without them, none."""
    given = [name for name, value in (('moving_mean', moving_mean), ('moving_var', moving_var))
             if value is not None]
    if len(given) == 1:
        raise ValueError('%s: moving_mean and moving_var go together, got only %s' % (fn, given[0]))
    if not given:
        if decay is not None or var_decay is not None or var_factor is not None:
            raise ValueError('%s: decay, var_decay and var_factor are only used with moving_mean and moving_var'
                             % fn)
        return False
    if decay is None:
        raise ValueError('%s: decay (1 - momentum) is required with moving_mean and moving_var' % fn)
    _check_scalar(fn, 'decay', decay)
    for name, value in (('var_decay', var_decay), ('var_factor', var_factor)):
        if value is not None:
            _check_scalar(fn, name, value)
    return True


def check_relu_output(fn, activation, y, x):
    """bn_bwd's y: the fused forward's output (x's shape and dtype: its sign is the mask),
    required with activation='relu' only."""
    check_activation(fn, activation)
    if activation == 'linear':
        if y is not None:
            raise ValueError("%s: y is only used with activation='relu'" % fn)
        return
    if y is None:
        raise ValueError("%s: y (the fused forward's output) is required with activation='relu'" % fn)
    if tuple(y.shape) != tuple(x.shape):
        raise ValueError('%s: y must have the shape of x, got y %s and x %s' % (fn, tuple(y.shape), tuple(x.shape)))
    if y.dtype != x.dtype:
        raise TypeError('%s: y must have the dtype of x (%s), got %s' % (fn, x.dtype, y.dtype))
