"""cuDNN path for pooling: the cuDNN 9 library's legacy pooling API through ctypes.

The cuDNN Frontend has no pooling node, so this calls libcudnn.so.9 directly
(cudnnSetPoolingNdDescriptor / cudnnPoolingForward / cudnnPoolingBackward) with the
prototypes, handle and descriptors of ``gpuk.kernels.cudnn.library``; ``library.available()``
says whether it can run.

How our contract maps onto cuDNN's:
- average pooling is CUDNN_POOLING_AVERAGE_COUNT_EXCLUDE_PADDING (padding excluded, as in
  the twin). cuDNN pads symmetrically, so uneven ``pads`` raise ``library.Unsupported``.
  Its backward reads no values of x and y in average mode, but takes their descriptors:
  dy and an uninitialised x-shaped buffer stand in.
- max pooling forward: cuDNN returns y only, not the argmax our backward contract needs,
  so ``max_pool_fwd`` raises Unsupported (``pool_fwd`` serves the benchmarks).
- max pooling backward needs x and y; our contract gives dy, the argmax (window taps) and
  the geometry. When the windows tile the input without overlap or padding (window ==
  strides, no pads: the common 2x2/2 case), a one-hot x (1 at every winner) with y = 1
  routes each dy to exactly its winner, so that maps; anything else raises Unsupported.
  (Taps outside their window, which gpuk's kernels and the twin ignore, are not defined
  here: checking them would cost a host sync.)
- one spatial dim runs as two with a height of 1 (cuDNN pools 4-d and 5-d tensors).
- a failed cuDNN call names the function called (``avg_pool_fwd``, ``pool_bwd`` ...) and cuDNN's
  problem (``_described``: x and y shapes, window, strides, pads, layout, mode, dtype).
The translation (``pool_problem``, ``pooling_descriptor_args``, ``tensor_descriptor_args``)
is pure Python and tested on the CPU.
"""
import ctypes
import math
from collections import namedtuple

from gpuk.contracts import geometry, pooling_checks
from . import library
from .conv import cudnn_dims, layout_strides
from .library import Unsupported, CUDNN_POOLING_AVERAGE_COUNT_EXCLUDE_PADDING, CUDNN_POOLING_MAX_DETERMINISTIC

__all__ = ['pool_problem', 'pooling_descriptor_args', 'tensor_descriptor_args', 'pool_fwd', 'pool_bwd',
           'max_pool_fwd', 'max_pool_bwd', 'avg_pool_fwd', 'avg_pool_bwd']

CUDNN_DATA_TYPES = library.DATA_TYPES
POOLING_MODES = {'max': CUDNN_POOLING_MAX_DETERMINISTIC, 'avg': CUDNN_POOLING_AVERAGE_COUNT_EXCLUDE_PADDING}

PoolProblem = namedtuple('PoolProblem', [
    'channels_last', 'lifted',          # lifted: a 1-d problem run as 2-d
    'x_shape', 'y_shape',               # in the caller's layout (lifted when 1-d)
    'window', 'strides', 'pads'])       # per spatial dim (lifted), pads symmetric


def pool_problem(fn, x_shape, window, strides, pads, data_format):
    """Describes a pooling problem in cuDNN's terms; uneven pads raise Unsupported."""
    channels_last = geometry.normalize_data_format(data_format, fn) == 'channels_last'
    x_shape = tuple(int(s) for s in x_shape)
    if len(x_shape) not in (3, 4, 5):
        raise ValueError('%s: x must have rank 3, 4 or 5, got shape %s' % (fn, x_shape))
    rank = len(x_shape) - 2
    window = geometry.normalize_positive_tuple(window, rank, fn, 'window')
    strides = geometry.normalize_positive_tuple(strides, rank, fn, 'strides')
    pads = geometry.normalize_pads(pads, rank, fn)
    if any(b != a for b, a in pads):
        raise Unsupported('cuDNN pools with symmetric padding only, got pads %s' % (pads,))
    spatial = x_shape[1:-1] if channels_last else x_shape[2:]
    out = []
    for size, k, s, (p, _) in zip(spatial, window, strides, pads):
        if size + 2 * p < k:
            raise ValueError('%s: padded input spatial size %d is smaller than the window %d'
                             % (fn, size + 2 * p, k))
        out.append((size + 2 * p - k) // s + 1)
    symmetric = tuple(p for p, _ in pads)
    lifted = rank == 1
    if lifted:
        spatial, out = (1,) + tuple(spatial), [1] + out
        window, strides, symmetric = (1,) + window, (1,) + strides, (0,) + symmetric
    n, c = x_shape[0], (x_shape[-1] if channels_last else x_shape[1])

    def shaped(sp):
        return (n,) + tuple(sp) + (c,) if channels_last else (n, c) + tuple(sp)
    return PoolProblem(channels_last, lifted, shaped(spatial), shaped(out), window, strides, symmetric)


def pooling_descriptor_args(problem, mode):
    """(mode, nan propagation, nbDims, windowDimA, paddingA, strideA) for cudnnSetPoolingNdDescriptor."""
    if mode not in POOLING_MODES:
        raise ValueError("pooling_descriptor_args: mode must be 'max' or 'avg', got %r" % (mode,))
    return (POOLING_MODES[mode], library.CUDNN_PROPAGATE_NAN, len(problem.window), list(problem.window),
            list(problem.pads), list(problem.strides))


def tensor_descriptor_args(shape, channels_last, dtype_name):
    """(dataType, nbDims, dimA, strideA) for cudnnSetTensorNdDescriptor of a packed array."""
    if dtype_name not in CUDNN_DATA_TYPES:
        raise TypeError('cudnn_pooling: arrays must be float16, float32 or float64, got %s' % dtype_name)
    dims = cudnn_dims(shape, channels_last)
    return CUDNN_DATA_TYPES[dtype_name], len(dims), list(dims), list(layout_strides(dims, channels_last))


# ---------------------------------------------------------------- library calls

def _device_float(fn, name, array):
    import cupy
    if not isinstance(array, cupy.ndarray) or array.dtype.name not in CUDNN_DATA_TYPES:
        raise TypeError('%s: %s must be a float16/32/64 CuPy array, got %r' % (fn, name, getattr(array, 'dtype', array)))
    return cupy.ascontiguousarray(array)


def _described(fn, problem, mode, dtype_name):
    """The call for its errors (library.describe): cuDNN's problem, 1-d lifted to 2-d."""
    return library.describe(fn, x=problem.x_shape, y=problem.y_shape, window=problem.window, strides=problem.strides,
                            pads=problem.pads, layout='channels_last' if problem.channels_last else 'channels_first',
                            mode=mode, dtype=dtype_name)


def _pooling_descriptors(d, problem, mode, dtype_name):
    """(pooling, x, y) descriptors of ``problem`` in the Descriptors ``d``."""
    code, nan, _, window, pads, strides = pooling_descriptor_args(problem, mode)
    pool = d.pooling(code, nan, window, pads, strides)
    xd = d.tensor(*_tensor_args(problem.x_shape, problem.channels_last, dtype_name))
    yd = d.tensor(*_tensor_args(problem.y_shape, problem.channels_last, dtype_name))
    return pool, xd, yd


def _tensor_args(shape, channels_last, dtype_name):
    data_type, _, dims, strides = tensor_descriptor_args(shape, channels_last, dtype_name)
    return data_type, dims, strides


def pool_fwd(x, window, strides, pads, data_format, mode):
    """y of max ('max') or padding-excluding average ('avg') pooling, through cuDNN."""
    return _pool_fwd('pool_fwd', x, window, strides, pads, data_format, mode)


def pool_bwd(dy, y, x, window, strides, pads, data_format, mode):
    """dx of ``pool_fwd`` from dy, y and x (cuDNN's own backward contract)."""
    return _pool_bwd('pool_bwd', dy, y, x, window, strides, pads, data_format, mode)


def _pool_fwd(fn, x, window, strides, pads, data_format, mode):
    import cupy
    x = _device_float(fn, 'x', x)
    problem = pool_problem(fn, x.shape, window, strides, pads, data_format)
    y = cupy.empty(problem.y_shape, x.dtype)
    described = _described(fn, problem, mode, x.dtype.name)
    lib = library.library()
    handle = library.handle(lib, described)
    alpha, beta = library.scalars(x.dtype.name)
    pointer = library.device_pointer
    with library.Descriptors(lib, described) as d:
        pool, xd, yd = _pooling_descriptors(d, problem, mode, x.dtype.name)
        d.check(lib.cudnnPoolingForward(handle, pool, ctypes.byref(alpha), xd, pointer(x), ctypes.byref(beta), yd,
                                        pointer(y)), 'cudnnPoolingForward')
    return y.reshape(_unlifted(problem, problem.y_shape))


def _pool_bwd(fn, dy, y, x, window, strides, pads, data_format, mode):
    import cupy
    dy, y, x = (_device_float(fn, n, a) for n, a in (('dy', dy), ('y', y), ('x', x)))
    problem = pool_problem(fn, x.shape, window, strides, pads, data_format)
    dx = cupy.empty(problem.x_shape, dy.dtype)
    described = _described(fn, problem, mode, dy.dtype.name)
    lib = library.library()
    handle = library.handle(lib, described)
    alpha, beta = library.scalars(dy.dtype.name)
    pointer = library.device_pointer
    with library.Descriptors(lib, described) as d:
        pool, xd, yd = _pooling_descriptors(d, problem, mode, dy.dtype.name)
        # (y, dy) share y's descriptor and (x, dx) x's: packed arrays of one layout
        d.check(lib.cudnnPoolingBackward(handle, pool, ctypes.byref(alpha), yd, pointer(y), yd, pointer(dy), xd,
                                         pointer(x), ctypes.byref(beta), xd, pointer(dx)), 'cudnnPoolingBackward')
    return dx.reshape(x.shape)


def _unlifted(problem, shape):
    if not problem.lifted:
        return tuple(shape)
    return (shape[0],) + tuple(shape[2:]) if problem.channels_last else tuple(shape[:2]) + tuple(shape[3:])


# ---------------------------------------------------------------- the twin's contract

def avg_pool_fwd(x, window, strides, pads, data_format):
    return _pool_fwd('avg_pool_fwd', x, window, strides, pads, data_format, 'avg')


def avg_pool_bwd(dy, x_shape, window, strides, pads, data_format):
    import cupy
    pool_problem('avg_pool_bwd', x_shape, window, strides, pads, data_format)   # Unsupported first
    stand_in_x = cupy.empty(tuple(x_shape), dy.dtype)   # average mode reads no x or y values
    return _pool_bwd('avg_pool_bwd', dy, dy, stand_in_x, window, strides, pads, data_format, 'avg')


def max_pool_fwd(x, window, strides, pads, data_format):
    raise Unsupported('cuDNN max pooling returns no argmax, which the gradient needs')


def max_pool_bwd(dy, argmax, x_shape, window, strides, pads, data_format):
    """Maps the argmax contract onto cuDNN's (dy, y, x) backward where it can (module doc):
    non-overlapping, unpadded windows, where a one-hot x (1 at each winner) with y = 1 makes
    each window's unique maximum its winner, so cuDNN routes dy exactly there."""
    channels_first = geometry.normalize_data_format(data_format, 'max_pool_bwd') == 'channels_first'
    window, strides = tuple(window), tuple(strides)
    if window != strides or any(b or a for b, a in pads):
        raise Unsupported('cuDNN max-pool backward needs x and y; the argmax maps onto it only '
                          'for windows that tile the input (window == strides, no padding)')
    import cupy
    x_shape = tuple(int(s) for s in x_shape)
    in_spatial = x_shape[2:] if channels_first else x_shape[1:-1]
    out_spatial = dy.shape[2:] if channels_first else dy.shape[1:-1]
    setup = pooling_checks.PoolSetup(channels_first, x_shape, window, strides, tuple(pads), tuple(in_spatial),
                                     tuple(out_spatial))
    positions, _ = pooling_checks.window_positions(cupy, argmax, setup)
    n = x_shape[0]
    c = x_shape[1] if channels_first else x_shape[-1]
    volume = math.prod(in_spatial)
    if channels_first:
        flat = cupy.arange(n * c).reshape(n * c, 1) * volume + positions.reshape(n * c, -1)
    else:
        flat = (cupy.arange(n).reshape(n, 1, 1) * volume + positions.reshape(n, -1, c)) * c + cupy.arange(c)
    one_hot = cupy.zeros(x_shape, dy.dtype)
    one_hot.reshape(-1)[flat.reshape(-1)] = 1
    ones = cupy.ones(dy.shape, dy.dtype)
    return _pool_bwd('max_pool_bwd', dy, ones, one_hot, window, window, ((0, 0),) * len(window), data_format, 'max')
