"""Pooling: gpuk's kernels vs cuDNN's legacy pooling API vs the NumPy twin.

Cases: 3x3/2 max pooling (padding 1, ResNet's stem) on 112x112x64 at N=256, forward and
backward; global average pooling on 7x7x2048 at N=256; 2x2x2/2 3-d max pooling on
64^3 x 32 at N=8; float32 and float16; NHWC and NCHW. NumPy rows run the same
geometry at N=2 (the host has neither the memory nor the time for N=256).

Bytes are the fewest each implementation must move: forward reads x and writes y (gpuk's
max forward also writes the int64 argmax, cuDNN's does not); gpuk's max backward reads dy
and the argmax and writes dx, cuDNN's reads dy, y and x and writes dx.
"""
import math

import numpy as np
import pytest

from bench import harness as h
from gpuk.contracts import pooling_checks

GPU_N = {'max3x3s2': 256, 'global_avg': 256, 'max3d': 8}
GEOMETRY = {   # spatial, channels, window, strides, pads, pooling mode
    'max3x3s2': ((112, 112), 64, (3, 3), (2, 2), ((1, 1), (1, 1)), 'max'),
    'global_avg': ((7, 7), 2048, (7, 7), (1, 1), ((0, 0), (0, 0)), 'avg'),
    'max3d': ((64, 64, 64), 32, (2, 2, 2), (2, 2, 2), ((0, 0),) * 3, 'max'),
}
CPU_N = 2
DTYPES = ['float32', 'float16']
FORMATS = ['channels_last', 'channels_first']
ROWS = [(g, d, 'fwd', f, impl) for g in GEOMETRY for d in DTYPES for f in FORMATS for impl in ('gpuk', 'cudnn', 'numpy')]
ROWS += [(g, d, 'bwd', f, impl) for g in ('max3x3s2', 'max3d') for d in DTYPES for f in FORMATS
         for impl in ('gpuk', 'cudnn', 'numpy')]


def _shape(n, spatial, c, data_format):
    return (n, c) + spatial if data_format == 'channels_first' else (n,) + spatial + (c,)


def _out_spatial(spatial, window, strides, pads):
    return tuple((s + b + a - k) // st + 1 for s, k, st, (b, a) in zip(spatial, window, strides, pads))


def pool_row(geometry, dtype, direction, data_format, impl, n=None):
    """(fn, make_inputs, set_bytes, bytes_moved, case label) of one row; ``n``: the batch, by
    default the suite's (GPU_N, or CPU_N for NumPy)."""
    spatial, c, window, strides, pads, mode = GEOMETRY[geometry]
    n = n or (CPU_N if impl == 'numpy' else GPU_N[geometry])
    x_shape = _shape(n, spatial, c, data_format)
    y_shape = _shape(n, _out_spatial(spatial, window, strides, pads), c, data_format)
    item = np.dtype(dtype).itemsize
    tap_bytes = pooling_checks.tap_dtype(window).itemsize   # the argmax: one window tap per output
    x_bytes, y_bytes = math.prod(x_shape) * item, math.prod(y_shape) * item
    arg_bytes = math.prod(y_shape) * tap_bytes
    label = '%s %s %s %s N=%d %s' % (mode, geometry, direction, 'NHWC' if data_format == 'channels_last' else 'NCHW',
                                     n, dtype)
    geometry_args = (window, strides, pads, data_format)
    if impl == 'numpy':
        from gpuk.cpu_fallback import pooling as twin

        def make_inputs(i):
            x = np.random.default_rng(i).standard_normal(x_shape).astype(dtype)
            if direction == 'fwd':
                return (x,)
            _, argmax = twin.max_pool_fwd(x, *geometry_args)
            return np.random.default_rng(i + 1).standard_normal(y_shape).astype(dtype), argmax
        if direction == 'fwd':
            fwd = twin.max_pool_fwd if mode == 'max' else twin.avg_pool_fwd
            fn = lambda x: fwd(x, *geometry_args)   # noqa: E731
            moved = x_bytes + y_bytes + (arg_bytes if mode == 'max' else 0)
        else:
            fn = lambda dy, argmax: twin.max_pool_bwd(dy, argmax, x_shape, *geometry_args)   # noqa: E731
            moved = y_bytes + arg_bytes + x_bytes
        return fn, make_inputs, x_bytes + y_bytes + arg_bytes, moved, label
    import cupy
    from gpuk.kernels import pooling
    from gpuk.kernels.cudnn import pooling as cudnn_pooling

    def make_inputs(i):
        x = cupy.random.RandomState(i).standard_normal(x_shape, dtype=cupy.float32).astype(dtype)
        if direction == 'fwd':
            return (x,)
        dy = cupy.random.RandomState(i + 1).standard_normal(y_shape, dtype=cupy.float32).astype(dtype)
        if impl == 'gpuk':
            return dy, pooling.max_pool_fwd(x, *geometry_args, runtime='cuda')[1]
        return dy, cudnn_pooling.pool_fwd(x, *geometry_args, mode), x
    if impl == 'gpuk':
        if direction == 'fwd':
            fwd = pooling.max_pool_fwd if mode == 'max' else pooling.avg_pool_fwd
            fn = lambda x: fwd(x, *geometry_args, runtime='cuda')   # noqa: E731
            moved = x_bytes + y_bytes + (arg_bytes if mode == 'max' else 0)
        else:
            fn = lambda dy, argmax: pooling.max_pool_bwd(dy, argmax, x_shape, *geometry_args, runtime='cuda')  # noqa
            moved = y_bytes + arg_bytes + x_bytes
    else:
        if direction == 'fwd':
            fn = lambda x: cudnn_pooling.pool_fwd(x, *geometry_args, mode)   # noqa: E731
            moved = x_bytes + y_bytes
        else:
            fn = lambda dy, y, x: cudnn_pooling.pool_bwd(dy, y, x, *geometry_args, mode)   # noqa: E731
            moved = 2 * y_bytes + 2 * x_bytes
    return fn, make_inputs, x_bytes + 2 * y_bytes + arg_bytes, moved, label


@pytest.mark.parametrize('geometry, dtype, direction, data_format, impl', ROWS,
                         ids=['-'.join(r) for r in ROWS])
def test_pooling(benchmark, harness, geometry, dtype, direction, data_format, impl):
    h.require(impl)
    fn, make_inputs, set_bytes, moved, label = pool_row(geometry, dtype, direction, data_format, impl)
    info = harness.run(benchmark, family='pool', case=label, impl=impl, fn=fn, make_inputs=make_inputs,
                       set_bytes=set_bytes, bytes_moved=moved, dtype=dtype)
    assert info['gbps'] > 0
