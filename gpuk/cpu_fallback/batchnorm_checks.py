"""Argument checks of the batch-normalization family, shared by the NumPy twins
(gpuk/cpu_fallback/batchnorm.py) and the CUDA launchers (gpuk/kernels/batchnorm.py),
so both raise the same errors, with the same messages, before any work; plus the
split of x's axes into reduced and kept ones that both build from the checked axes."""
import numpy as np


def accumulate_dtype(dtype):
    """float16 is computed in float32; other float types in themselves."""
    return np.dtype(np.float32) if dtype == np.float16 else np.dtype(dtype)


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


class Layout:
    """How x's axes (`axes`: the output of normalize_axes) split into reduced and kept ones."""

    def __init__(self, shape, axes):
        ndim = len(shape)
        self.shape = tuple(shape)
        self.axes = axes
        self.kept_axes = tuple(i for i in range(ndim) if i not in axes)
        self.kept_shape = tuple(shape[i] for i in self.kept_axes)
        self.bcast_shape = tuple(1 if i in axes else shape[i] for i in range(ndim))
        self.count = int(np.prod([shape[i] for i in axes], dtype=np.int64))
