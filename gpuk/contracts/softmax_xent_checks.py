"""Argument checks of the softmax / cross-entropy family, shared by the NumPy twins
(gpuk/cpu_fallback/softmax_xent.py, gpuk/cpu_fallback/ctc.py) and the CUDA launchers
(gpuk/kernels/softmax_xent.py, gpuk/kernels/ctc.py), so both raise the same errors, with
the same messages, before any work."""
import numpy as np

# float_array: the dtype check only (a zero-size input is allowed here); bfloat16=False
# for the CTC family, whose kernels take float16, float32 and float64 only.
from gpuk.contracts.conv_checks import (  # noqa: F401 (re-exported)
    FLOAT_DTYPE_NAMES, typed_float_array as float_array)


def check_axis(fn, axis, ndim):
    if isinstance(axis, bool) or not isinstance(axis, (int, np.integer)):
        raise TypeError('%s: axis must be an int, got %r' % (fn, axis))
    if not -ndim <= axis < ndim:
        raise ValueError('%s: axis must lie in [-%d, %d) for an input of rank %d, got %d'
                         % (fn, ndim, ndim, ndim, axis))
    return int(axis) % ndim


def check_epsilon(fn, epsilon):
    if isinstance(epsilon, bool) or not isinstance(epsilon, (int, float, np.number)) \
            or not 0 <= epsilon < 0.5:
        raise ValueError('%s: epsilon must be a number in [0, 0.5), got %r' % (fn, epsilon))
    return float(epsilon)


def same_shape(fn, name_a, a, name_b, b):
    if a.shape != b.shape:
        raise ValueError('%s: %s and %s must have the same shape, got %s and %s'
                         % (fn, name_a, name_b, a.shape, b.shape))


def reduced_shape_check(fn, name, array, full_shape, axis):
    expected = full_shape[:axis] + full_shape[axis + 1:]
    if array.shape != expected:
        raise ValueError('%s: %s must have shape %s (the input shape %s without axis %d), got %s'
                         % (fn, name, expected, full_shape, axis, array.shape))


def label_range_check(fn, labels, classes, axis):
    """Sparse cross-entropy labels (NumPy) in [0, classes)."""
    if labels.size:
        low, high = int(labels.min()), int(labels.max())
        if low < 0 or high >= classes:
            raise ValueError('%s: labels must lie in [0, %d) (the size of logits axis %d), '
                             'got values in [%d, %d]' % (fn, classes, axis, low, high))
