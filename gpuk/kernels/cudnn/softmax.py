"""cuDNN path for softmax and log-softmax: cudnnSoftmaxForward / cudnnSoftmaxBackward
(cuDNN 9 legacy API, through ``gpuk.kernels.cudnn.library``), the cuDNN implementation of
the softmax functions of the 'softmax_xent' family (``GPUK_KERNELS=softmax_xent=cudnn|auto``).

``softmax_fwd``, ``softmax_bwd``, ``log_softmax_fwd`` and ``log_softmax_bwd`` have the
signatures of their NumPy twins in ``gpuk.cpu_fallback.softmax_xent`` and return CuPy
arrays. cuDNN has no fused softmax cross-entropy, so the cross-entropy functions of the
family always run gpuk's kernels.

How our contract maps onto cuDNN's (``tensor_args``, pure Python):
- the class axis of a packed array of shape (*outer, C, *inner) is the channel axis of the
  packed NCHW tensor (prod(outer), C, prod(inner), 1), and CUDNN_SOFTMAX_MODE_CHANNEL
  normalizes over C at every (n, h, w): any axis, no transposes.
- softmax is CUDNN_SOFTMAX_ACCURATE (max-subtracted, as the twin), log-softmax
  CUDNN_SOFTMAX_LOG. The backward passes take the saved forward output and dy, as the twin
  does: dx = y (dy - sum(dy y)), resp. dx = dy - exp(log_y) sum(dy).
- cuDNN's dims and strides are C ints: arrays of 2^31 elements or more raise
  ``library.Unsupported`` (the dispatcher then runs gpuk's kernels).
- float16/32/64 in and out; alpha and beta are double for float64, float otherwise.
- bfloat16 raises ``library.Unsupported`` (gpuk's kernels run it): cudnn_graph.h has
  CUDNN_DATA_BFLOAT16 = 9, but the legacy softmax has not been run with it on a GPU here.
- a failed cuDNN call names the function called, the array's shape, the axis, cuDNN's NCHW
  dims and the dtype (``_described``).
"""
import ctypes
import math

import ml_dtypes

from gpuk.contracts import softmax_xent_checks as checks
from . import library
from .library import Unsupported

__all__ = ['tensor_args', 'softmax_fwd', 'softmax_bwd', 'log_softmax_fwd', 'log_softmax_bwd',
           'fused_cross_entropy_unsupported']

_INT_LIMIT = 2 ** 31 - 1
NO_FUSED_CROSS_ENTROPY = 'cuDNN has no fused softmax cross-entropy'
NO_BFLOAT16 = 'bfloat16 softmax is not tried with cuDNN'


def tensor_args(shape, axis, dtype_name):
    """(dataType, dimA, strideA) of the packed NCHW tensor whose C is ``axis`` of ``shape``."""
    if dtype_name not in library.DATA_TYPES:
        raise TypeError('cudnn_softmax: arrays must be float16, float32 or float64, got %s' % dtype_name)
    if math.prod(shape) > _INT_LIMIT:
        raise Unsupported('cuDNN tensors hold fewer than 2^31 elements, got shape %s' % (tuple(shape),))
    outer, classes, inner = math.prod(shape[:axis]), shape[axis], math.prod(shape[axis + 1:])
    return (library.DATA_TYPES[dtype_name], (outer, classes, inner, 1),
            (classes * inner, inner, 1, 1))


def _device_float(fn, name, value):
    import cupy
    array = cupy.asarray(value)
    if array.dtype == ml_dtypes.bfloat16:
        raise Unsupported(NO_BFLOAT16)
    if array.dtype.name not in library.DATA_TYPES:
        raise TypeError('%s: %s must be a %s array, got dtype %s' % (fn, name, checks.FLOAT_DTYPE_NAMES, array.dtype))
    return cupy.ascontiguousarray(array)


def _checked_axis(fn, name, array, axis):
    axis = checks.check_axis(fn, axis, array.ndim)
    if array.shape[axis] == 0:
        raise ValueError('%s: %s must have at least one class along axis %d, got shape %s'
                         % (fn, name, axis, array.shape))
    return axis


def _described(fn, name, shape, axis, dims, dtype_name):
    """The call for its errors (library.describe)."""
    return library.describe(fn, **{name: tuple(shape)}, axis=axis, nchw=tuple(dims), dtype=dtype_name)


def _softmax(fn, algo, x, axis):
    import cupy
    x = _device_float(fn, 'x', x)
    axis = _checked_axis(fn, 'x', x, axis)
    data_type, dims, strides = tensor_args(x.shape, axis, x.dtype.name)
    y = cupy.empty_like(x)
    if x.size:
        described = _described(fn, 'x', x.shape, axis, dims, x.dtype.name)
        lib = library.library()
        handle = library.handle(lib, described)
        alpha, beta = library.scalars(x.dtype.name)
        pointer = library.device_pointer
        with library.Descriptors(lib, described) as d:
            desc = d.tensor(data_type, dims, strides)   # x and y: one packed layout
            d.check(lib.cudnnSoftmaxForward(handle, algo, library.CUDNN_SOFTMAX_MODE_CHANNEL, ctypes.byref(alpha),
                                            desc, pointer(x), ctypes.byref(beta), desc, pointer(y)),
                    'cudnnSoftmaxForward')
    return y


def _softmax_backward(fn, algo, saved_name, saved, dy, axis):
    import cupy
    saved = _device_float(fn, saved_name, saved)
    dy = _device_float(fn, 'dy', dy)
    checks.same_shape(fn, saved_name, saved, 'dy', dy)
    axis = _checked_axis(fn, saved_name, saved, axis)
    dy = cupy.ascontiguousarray(dy.astype(saved.dtype, copy=False))
    data_type, dims, strides = tensor_args(saved.shape, axis, saved.dtype.name)
    dx = cupy.empty_like(saved)
    if saved.size:
        described = _described(fn, saved_name, saved.shape, axis, dims, saved.dtype.name)
        lib = library.library()
        handle = library.handle(lib, described)
        alpha, beta = library.scalars(saved.dtype.name)
        pointer = library.device_pointer
        with library.Descriptors(lib, described) as d:
            desc = d.tensor(data_type, dims, strides)   # y, dy and dx: one packed layout
            d.check(lib.cudnnSoftmaxBackward(handle, algo, library.CUDNN_SOFTMAX_MODE_CHANNEL, ctypes.byref(alpha),
                                             desc, pointer(saved), desc, pointer(dy), ctypes.byref(beta), desc,
                                             pointer(dx)), 'cudnnSoftmaxBackward')
    return dx


def softmax_fwd(x, axis=-1):
    """exp(x - max) / sum(exp(x - max)) along axis, by cuDNN (CUDNN_SOFTMAX_ACCURATE)."""
    return _softmax('softmax_fwd', library.CUDNN_SOFTMAX_ACCURATE, x, axis)


def softmax_bwd(y, dy, axis=-1):
    """dx = y * (dy - sum(dy * y)) with y the saved softmax output, by cuDNN."""
    return _softmax_backward('softmax_bwd', library.CUDNN_SOFTMAX_ACCURATE, 'y', y, dy, axis)


def log_softmax_fwd(x, axis=-1):
    """x - log(sum(exp(x))) along axis, by cuDNN (CUDNN_SOFTMAX_LOG)."""
    return _softmax('log_softmax_fwd', library.CUDNN_SOFTMAX_LOG, x, axis)


def log_softmax_bwd(log_y, dy, axis=-1):
    """dx = dy - exp(log_y) * sum(dy) with log_y the saved log_softmax output, by cuDNN."""
    return _softmax_backward('log_softmax_bwd', library.CUDNN_SOFTMAX_LOG, 'log_y', log_y, dy, axis)


def fused_cross_entropy_unsupported(*_args, **_kwargs):
    """The cuDNN side of every cross-entropy function of the family: there is none."""
    raise Unsupported(NO_FUSED_CROSS_ENTROPY)
