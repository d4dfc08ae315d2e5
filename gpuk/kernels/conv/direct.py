"""Launchers of the direct convolution kernels: depthwise (conv_depthwise.cu) and locally
connected (conv_local.cu). Re-exported by gpuk/kernels/conv/__init__.py; same signatures as the
twins in gpuk/cpu_fallback/conv.py plus a keyword-only `runtime`.
"""
import math
from pathlib import Path

import numpy as np

from gpuk.contracts import conv_checks
from gpuk.contracts.dtypes import ELEMENT_TYPES, FLOAT_DTYPES, accumulation_dtype
from . import tiles as conv_tiles
from ..runtime import register_build, resolve

DEPTHWISE_SOURCE = Path(__file__).with_name('conv_depthwise.cu')
LOCAL_SOURCE = Path(__file__).with_name('conv_local.cu')
# Tile constants: #defines of the .cu files and the grid below (one place).
DW_CHANNELS, DW_ROWS, DW_PIX = 32, 8, 4
DW_MAX_FILTER_SHARED = 48 * 1024      # above this the filter is read from global memory
DW_TARGET_BLOCKS = 528                # wgrad splits pixels until about four waves of 132 SMs
DW_MIN_PIXELS_PER_SPLIT = 1024
DW_MAX_SPLITS = 4096
LOCAL_THREADS = 256
LOCAL_MAX_BLOCKS = 65535


def depthwise_defines(dtype):
    dtype = np.dtype(dtype)
    return {'ELEMENT_T': ELEMENT_TYPES[dtype], 'ACC_T': ELEMENT_TYPES[accumulation_dtype(dtype)], 'DW_CHANNELS': DW_CHANNELS,
            'DW_ROWS': DW_ROWS, 'DW_PIX': DW_PIX}


def local_defines(dtype):
    dtype = np.dtype(dtype)
    return {'ELEMENT_T': ELEMENT_TYPES[dtype], 'ACC_T': ELEMENT_TYPES[accumulation_dtype(dtype)], 'LOCAL_THREADS': LOCAL_THREADS}


for _dtype in FLOAT_DTYPES:
    register_build(DEPTHWISE_SOURCE, depthwise_defines(_dtype),
                   ['depthwise_fwd', 'depthwise_dgrad', 'depthwise_wgrad', 'depthwise_reduce_splits'])
    register_build(LOCAL_SOURCE, local_defines(_dtype), ['local_fwd', 'local_dgrad', 'local_wgrad'])


INDEX_LIMIT = 2**31 - 1   # the kernels decode indices in 32 bits (64-bit division is slow on GPUs)


def check_index_limit(fn, what, value):
    """A size the kernels index in 32 bits must stay below 2^31 (offsets are 64-bit anyway)."""
    if value > INDEX_LIMIT:
        raise ValueError('%s: %s is %d, above the kernel limit of 2^31 - 1; split the batch'
                         % (fn, what, value))


def lift3(values, fill):
    """A per-spatial-dim tuple of 1 to 3 values as 3 values, `fill` in front."""
    values = tuple(int(v) for v in values)
    return (fill,) * (3 - len(values)) + values


def _spatial_args(*groups):
    return tuple(np.int32(v) for group in groups for v in group)


# ---------------------------------------------------------------- depthwise

def _depthwise_args(x_spatial, out_spatial, kernel_spatial, strides, dilation, pads):
    return _spatial_args(lift3(x_spatial, 1), lift3(out_spatial, 1), lift3(kernel_spatial, 1), lift3(strides, 1),
                         lift3(dilation, 1), lift3([b for b, _ in pads], 0))


def _filter_shared_bytes(dtype, entries):
    acc_bytes = 8 if np.dtype(dtype) == np.float64 else 4
    nbytes = entries * DW_CHANNELS * acc_bytes
    return nbytes if nbytes <= DW_MAX_FILTER_SHARED else 0


def _checked_pair(fn, runtime, first, second):
    """(rt, a, b): the runtime and the two named inputs (name, array) as float arrays of its
    xp with one dtype; the checks of every launcher here, in the twins' order."""
    rt = resolve(runtime)
    a = conv_checks.float_array(fn, first[0], first[1], xp=rt.xp)
    b = conv_checks.float_array(fn, second[0], second[1], xp=rt.xp)
    conv_checks.same_dtype(fn, [(first[0], a), (second[0], b)])
    return rt, a, b


def _depthwise_direct(rt, kernel_name, a, w, out, n, c_in, mult, geometry, channels_first, pixels, channels,
                      filter_entries):
    """Launches depthwise_fwd / depthwise_dgrad (same argument list): blocks of DW_CHANNELS x
    DW_ROWS threads over DW_ROWS * DW_PIX pixels x DW_CHANNELS channels, the filter in
    shared memory when its `filter_entries` per channel fit. geometry: the (in_spatial,
    out_spatial, kernel_spatial, strides, dilation, pads) of _depthwise_args."""
    xp = rt.xp
    shared = _filter_shared_bytes(a.dtype, filter_entries)
    grid = (math.ceil(pixels / (DW_ROWS * DW_PIX)), math.ceil(channels / DW_CHANNELS))
    rt.load(DEPTHWISE_SOURCE, depthwise_defines(a.dtype)).kernel(kernel_name).launch(
        grid, (DW_CHANNELS, DW_ROWS),
        (xp.ascontiguousarray(a), xp.ascontiguousarray(w), out, np.int32(n), np.int32(c_in), np.int32(mult),
         *_depthwise_args(*geometry), np.int32(not channels_first), np.int32(shared > 0)), shared_mem=shared)
    return out


def depthwise_conv_fwd(x, w, strides, dilation, pads, data_format, *, runtime=None):
    """Depthwise convolution; w is (*k, C_in, M), output channel c*M + m like TensorFlow."""
    fn = 'depthwise_conv_fwd'
    rt, x, w = _checked_pair(fn, runtime, ('x', x), ('w', w))
    (channels_first, rank, strides, dilation, pads, c_in, mult, in_spatial,
     out_spatial) = conv_checks.depthwise_fwd_setup(fn, x, w, strides, dilation, pads, data_format)
    kernel_spatial = w.shape[:rank]
    c_out, n = c_in * mult, x.shape[0]
    check_index_limit(fn, 'N * output pixels', n * math.prod(out_spatial))
    check_index_limit(fn, 'N * input pixels', n * math.prod(in_spatial))
    y = rt.xp.empty((n, c_out, *out_spatial) if channels_first else (n, *out_spatial, c_out), x.dtype)
    return _depthwise_direct(rt, 'depthwise_fwd', x, w, y, n, c_in, mult,
                             (in_spatial, out_spatial, kernel_spatial, strides, dilation, pads), channels_first,
                             pixels=n * math.prod(out_spatial), channels=c_out,
                             filter_entries=math.prod(kernel_spatial))


def depthwise_conv_dgrad(dy, w, x_shape, strides, dilation, pads, data_format, *, runtime=None):
    """Gradient of depthwise_conv_fwd with respect to x."""
    fn = 'depthwise_conv_dgrad'
    rt, dy, w = _checked_pair(fn, runtime, ('dy', dy), ('w', w))
    channels_first, rank, strides, dilation, pads = conv_checks.conv_setup(
        fn, 'dy', dy, data_format, w, 'w', strides, dilation, pads)
    x_shape = conv_checks.shape_tuple(fn, 'x_shape', x_shape, rank + 2)
    conv_checks.check_batch(fn, 'dy', dy.shape, 'x_shape', x_shape)
    c_in = conv_checks.channel_count(x_shape, channels_first)
    conv_checks.check_channels(fn, 'the channel count', 'x_shape', x_shape, c_in, 'w', w.shape, w.shape[-2])
    in_spatial = conv_checks.spatial_dims(x_shape, channels_first)
    kernel_spatial, mult = w.shape[:rank], w.shape[-1]
    out_spatial = conv_checks.output_spatial(fn, in_spatial, kernel_spatial, strides, dilation, pads)
    conv_checks.check_dy_spatial(fn, dy, channels_first, out_spatial, 'x_shape %s' % (x_shape,))
    conv_checks.check_channels(fn, 'the channel count', 'dy', dy.shape, conv_checks.channel_count(dy.shape, channels_first),
                         'w', w.shape, c_in * mult)
    n = x_shape[0]
    check_index_limit(fn, 'N * input pixels', n * math.prod(in_spatial))
    check_index_limit(fn, 'N * output pixels', n * math.prod(out_spatial))
    dx = rt.xp.empty(x_shape, dy.dtype)
    return _depthwise_direct(rt, 'depthwise_dgrad', dy, w, dx, n, c_in, mult,
                             (in_spatial, out_spatial, kernel_spatial, strides, dilation, pads), channels_first,
                             pixels=n * math.prod(in_spatial), channels=c_in,
                             filter_entries=math.prod(kernel_spatial) * mult)


def depthwise_wgrad_splits(pixels, taps, channel_tiles):
    """Pixel-range splits of depthwise wgrad: enough blocks to fill the GPU, >= 1024 pixels each."""
    wanted = math.ceil(DW_TARGET_BLOCKS / (taps * channel_tiles))
    return int(max(1, min(wanted, pixels // DW_MIN_PIXELS_PER_SPLIT, DW_MAX_SPLITS)))


def depthwise_conv_wgrad(x, dy, w_shape, strides, dilation, pads, data_format, *, runtime=None):
    """Gradient of depthwise_conv_fwd with respect to w."""
    fn = 'depthwise_conv_wgrad'
    rt, x, dy = _checked_pair(fn, runtime, ('x', x), ('dy', dy))
    xp = rt.xp
    channels_first = conv_checks.is_channels_first(fn, data_format)
    rank = conv_checks.spatial_rank(fn, 'x', x)
    conv_checks.check_rank(fn, 'dy', dy, rank + 2, 'like x')
    w_shape = conv_checks.shape_tuple(fn, 'w_shape', w_shape, rank + 2)
    strides, dilation, pads = conv_checks.window_params(fn, rank, strides, dilation, pads)
    conv_checks.check_batch(fn, 'x', x.shape, 'dy', dy.shape)
    c_in = conv_checks.channel_count(x.shape, channels_first)
    conv_checks.check_channels(fn, 'the channel count', 'x', x.shape, c_in, 'w_shape', w_shape, w_shape[-2])
    kernel_spatial, mult = w_shape[:rank], w_shape[-1]
    in_spatial = conv_checks.spatial_dims(x.shape, channels_first)
    out_spatial = conv_checks.output_spatial(fn, in_spatial, kernel_spatial, strides, dilation, pads)
    conv_checks.check_dy_spatial(fn, dy, channels_first, out_spatial, 'x shape %s' % (x.shape,))
    conv_checks.check_channels(fn, 'the channel count', 'dy', dy.shape, conv_checks.channel_count(dy.shape, channels_first),
                         'w_shape', w_shape, c_in * mult)
    n, c_out, taps = x.shape[0], c_in * mult, math.prod(kernel_spatial)
    pixels, channel_tiles = n * math.prod(out_spatial), math.ceil(c_out / DW_CHANNELS)
    check_index_limit(fn, 'N * output pixels', pixels)
    splits = conv_tiles.forced_splits() or depthwise_wgrad_splits(pixels, taps, channel_tiles)
    per_split = math.ceil(pixels / splits)
    splits = math.ceil(pixels / per_split)
    dw = xp.empty(w_shape, x.dtype)
    acc_dtype = np.float64 if x.dtype == np.float64 else np.float32
    partial = xp.empty((splits, taps * c_out) if splits > 1 else (1,), acc_dtype)
    module = rt.load(DEPTHWISE_SOURCE, depthwise_defines(x.dtype))
    module.kernel('depthwise_wgrad').launch(
        (taps, channel_tiles, splits), (DW_CHANNELS, DW_ROWS),
        (xp.ascontiguousarray(x), xp.ascontiguousarray(dy), dw, partial, np.int32(n), np.int32(c_in),
         np.int32(mult), *_depthwise_args(in_spatial, out_spatial, kernel_spatial, strides, dilation, pads),
         np.int32(not channels_first), np.int64(per_split)))
    if splits > 1:
        count = taps * c_out
        module.kernel('depthwise_reduce_splits').launch(
            max(1, min(math.ceil(count / (DW_CHANNELS * DW_ROWS)), 4096)), DW_CHANNELS * DW_ROWS,
            (partial, dw.reshape(-1), np.int64(count), np.int32(splits)))
    return dw


# ---------------------------------------------------------------- locally connected

def _local_launch(rt, kernel_name, dtype, out, work, args, n, c_in, c_out, in_spatial, output_spatial, kernel_size,
                  strides, channels_first):
    args = tuple(rt.xp.ascontiguousarray(a) for a in args)
    for name, array in zip(('x or dy', 'w or dy'), args):
        check_index_limit(kernel_name, 'the element count of %s' % name, array.size)
    check_index_limit(kernel_name, 'the element count of the result', out.size)
    blocks = max(1, min(math.ceil(work / LOCAL_THREADS), LOCAL_MAX_BLOCKS))
    rt.load(LOCAL_SOURCE, local_defines(dtype)).kernel(kernel_name).launch(
        blocks, LOCAL_THREADS,
        (*args, out, np.int32(n), np.int32(c_in), np.int32(c_out),
         *_spatial_args(lift3(in_spatial, 1), lift3(output_spatial, 1), lift3(kernel_size, 1), lift3(strides, 1)),
         np.int32(not channels_first)))
    return out


def _local_window(fn, data_format, rank_name, rank_array, x_shape, kernel_size, strides, output_spatial):
    """(channels_first, rank, x_shape, in_spatial, kernel_size, strides, output_spatial): the
    window checks shared by the three local launchers, in the twins' order. The spatial rank
    comes from `rank_array`; x_shape None means rank_array's own shape."""
    channels_first = conv_checks.is_channels_first(fn, data_format)
    rank = conv_checks.spatial_rank(fn, rank_name, rank_array)
    x_shape = rank_array.shape if x_shape is None else conv_checks.shape_tuple(fn, 'x_shape', x_shape, rank + 2)
    in_spatial = conv_checks.spatial_dims(x_shape, channels_first)
    kernel_size, strides, output_spatial = conv_checks.local_setup(fn, rank, kernel_size, strides, output_spatial,
                                                             in_spatial)
    return channels_first, rank, x_shape, in_spatial, kernel_size, strides, output_spatial


def local_conv_fwd(x, w, kernel_size, strides, output_spatial, data_format, *, runtime=None):
    """Convolution with unshared weights w (P, prod(k) * C_in, C_out), P = prod(output_spatial)."""
    fn = 'local_conv_fwd'
    rt, x, w = _checked_pair(fn, runtime, ('x', x), ('w', w))
    channels_first, _, _, in_spatial, kernel_size, strides, output_spatial = _local_window(
        fn, data_format, 'x', x, None, kernel_size, strides, output_spatial)
    c_in = conv_checks.channel_count(x.shape, channels_first)
    conv_checks.check_local_kernel(fn, 'w', w.shape, output_spatial, kernel_size, c_in)
    n, c_out = x.shape[0], w.shape[-1]
    y = rt.xp.empty((n, c_out, *output_spatial) if channels_first else (n, *output_spatial, c_out), x.dtype)
    return _local_launch(rt, 'local_fwd', x.dtype, y, y.size, (x, w), n, c_in, c_out, in_spatial, output_spatial,
                         kernel_size, strides, channels_first)


def local_conv_dgrad(dy, w, x_shape, kernel_size, strides, output_spatial, data_format, *, runtime=None):
    """Gradient of local_conv_fwd with respect to x."""
    fn = 'local_conv_dgrad'
    rt, dy, w = _checked_pair(fn, runtime, ('dy', dy), ('w', w))
    channels_first, _, x_shape, in_spatial, kernel_size, strides, output_spatial = _local_window(
        fn, data_format, 'dy', dy, x_shape, kernel_size, strides, output_spatial)
    conv_checks.check_batch(fn, 'dy', dy.shape, 'x_shape', x_shape)
    c_in = conv_checks.channel_count(x_shape, channels_first)
    conv_checks.check_local_kernel(fn, 'w', w.shape, output_spatial, kernel_size, c_in)
    conv_checks.check_channels(fn, 'the channel count', 'dy', dy.shape, conv_checks.channel_count(dy.shape, channels_first),
                         'w', w.shape, w.shape[-1])
    conv_checks.check_dy_spatial(fn, dy, channels_first, output_spatial, 'output_spatial')
    dx = rt.xp.empty(x_shape, dy.dtype)
    return _local_launch(rt, 'local_dgrad', dy.dtype, dx, dx.size, (dy, w), x_shape[0], c_in, w.shape[-1],
                         in_spatial, output_spatial, kernel_size, strides, channels_first)


def local_conv_wgrad(x, dy, w_shape, kernel_size, strides, output_spatial, data_format, *, runtime=None):
    """Gradient of local_conv_fwd with respect to w."""
    fn = 'local_conv_wgrad'
    rt, x, dy = _checked_pair(fn, runtime, ('x', x), ('dy', dy))
    channels_first, rank, _, in_spatial, kernel_size, strides, output_spatial = _local_window(
        fn, data_format, 'x', x, None, kernel_size, strides, output_spatial)
    conv_checks.check_rank(fn, 'dy', dy, rank + 2, 'like x')
    w_shape = conv_checks.shape_tuple(fn, 'w_shape', w_shape, 3)
    conv_checks.check_batch(fn, 'x', x.shape, 'dy', dy.shape)
    c_in = conv_checks.channel_count(x.shape, channels_first)
    conv_checks.check_local_kernel(fn, 'w_shape', w_shape, output_spatial, kernel_size, c_in)
    c_out = conv_checks.channel_count(dy.shape, channels_first)
    conv_checks.check_channels(fn, 'the channel count', 'dy', dy.shape, c_out, 'w_shape', w_shape, w_shape[-1])
    conv_checks.check_dy_spatial(fn, dy, channels_first, output_spatial, 'output_spatial')
    dw = rt.xp.empty(w_shape, x.dtype)
    return _local_launch(rt, 'local_wgrad', x.dtype, dw, dw.size, (x, dy), x.shape[0], c_in, c_out, in_spatial,
                         output_spatial, kernel_size, strides, channels_first)
