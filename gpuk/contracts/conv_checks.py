"""Argument checks of the convolution family, shared by the NumPy twins
(gpuk/cpu_fallback/conv.py) and the CUDA launchers (gpuk/kernels/conv/), so both
raise the same errors, with the same messages, before any work."""
import math
from collections import namedtuple

import numpy as np

from gpuk.contracts import geometry
from gpuk.contracts.dtypes import FLOAT_DTYPES, FLOAT_DTYPES_NO_BFLOAT16


FLOAT_DTYPE_NAMES = 'float16, bfloat16, float32 or float64'


def typed_float_array(fn, name, value, bfloat16=True, xp=None):
    """A float array of any size. Without ``xp`` (the NumPy twins) array-likes are converted;
    a launcher passes its runtime's ``xp`` and takes that namespace's arrays only, so a host
    array never costs a hidden copy. ``bfloat16=False`` for the families whose kernels take
    float16, float32 and float64 only (pooling, batch norm, CTC)."""
    if xp is None:
        array = np.asarray(value)
    elif isinstance(value, xp.ndarray):
        array = value
    else:
        raise TypeError('%s: %s must be a %s.ndarray, got %s' % (fn, name, xp.__name__, type(value).__name__))
    if array.dtype not in (FLOAT_DTYPES if bfloat16 else FLOAT_DTYPES_NO_BFLOAT16):
        raise TypeError('%s: %s must be a %s array, got dtype %s'
                        % (fn, name, FLOAT_DTYPE_NAMES if bfloat16 else 'float16, float32 or float64',
                           array.dtype))
    return array


def float_array(fn, name, value, bfloat16=True, xp=None):
    """typed_float_array with no zero-size dimension."""
    array = typed_float_array(fn, name, value, bfloat16, xp)
    if array.size == 0:
        raise ValueError('%s: %s must not have a zero-size dimension, got shape %s'
                         % (fn, name, array.shape))
    return array


def same_dtype(fn, arrays):
    dtypes = {a.dtype for _, a in arrays}
    if len(dtypes) > 1:
        raise TypeError('%s: %s must have the same dtype, got %s'
                        % (fn, ' and '.join(n for n, _ in arrays),
                           ' and '.join(str(a.dtype) for _, a in arrays)))


def spatial_rank(fn, name, array):
    if array.ndim not in (3, 4, 5):
        raise ValueError('%s: %s must have rank 3, 4 or 5 (batch, 1 to 3 spatial dims, '
                         'channels), got shape %s' % (fn, name, array.shape))
    return array.ndim - 2


def check_rank(fn, name, array, rank, layout):
    if array.ndim != rank:
        raise ValueError('%s: %s must have rank %d %s, got shape %s'
                         % (fn, name, rank, layout, array.shape))


def shape_tuple(fn, name, shape, rank):
    """A full array shape: a sequence of `rank` ints >= 1 (a bare int is refused)."""
    if not isinstance(shape, (list, tuple)):
        raise ValueError('%s: %s must be a tuple of %d ints, got %r' % (fn, name, rank, shape))
    return geometry.normalize_positive_tuple(shape, rank, fn, name)


def is_channels_first(fn, data_format):
    return geometry.normalize_data_format(data_format, fn) == 'channels_first'


def channel_count(shape, channels_first):
    return shape[1] if channels_first else shape[-1]


def spatial_dims(shape, channels_first):
    return tuple(shape[2:]) if channels_first else tuple(shape[1:-1])


def window_params(fn, rank, strides, dilation, pads):
    return (geometry.normalize_positive_tuple(strides, rank, fn, 'strides'),
            geometry.normalize_positive_tuple(dilation, rank, fn, 'dilation'),
            geometry.normalize_pads(pads, rank, fn))


def output_spatial(fn, in_spatial, kernel_spatial, strides, dilation, pads,
                    kernel_name='kernel'):
    """Output sizes; an input smaller than the (dilated) kernel or window is an error."""
    out = []
    for size, k, s, d, (before, after) in zip(in_spatial, kernel_spatial, strides,
                                              dilation, pads):
        padded, extent = size + before + after, geometry.dilated_size(k, d)
        if padded < extent:
            raise ValueError('%s: padded input spatial size %d (input %s, pads %s) is '
                             'smaller than the %s extent %d (%s %s, dilation %s)'
                             % (fn, padded, in_spatial, pads, kernel_name, extent,
                                kernel_name, kernel_spatial, dilation))
        out.append((padded - extent) // s + 1)
    return tuple(out)


def check_dy_spatial(fn, dy, channels_first, expected, context):
    got = spatial_dims(dy.shape, channels_first)
    if got != tuple(expected):
        raise ValueError('%s: dy spatial shape %s does not match the output spatial '
                         'shape %s of %s' % (fn, got, tuple(expected), context))


def check_batch(fn, a_name, a_shape, b_name, b_shape):
    if a_shape[0] != b_shape[0]:
        raise ValueError('%s: batch sizes of %s (shape %s) and %s (shape %s) differ'
                         % (fn, a_name, tuple(a_shape), b_name, tuple(b_shape)))


def check_channels(fn, what, a_name, a_shape, a_channels, b_name, b_shape, b_channels):
    if a_channels != b_channels:
        raise ValueError('%s: %s of %s (shape %s) is %d but %s (shape %s) has %d'
                         % (fn, what, a_name, tuple(a_shape), a_channels, b_name,
                            tuple(b_shape), b_channels))


def conv_setup(fn, x_or_dy_name, array, data_format, kernel, kernel_name, strides,
                dilation, pads):
    channels_first = is_channels_first(fn, data_format)
    rank = spatial_rank(fn, x_or_dy_name, array)
    check_rank(fn, kernel_name, kernel, rank + 2, '(*kernel_spatial, C_in, C_out)')
    strides, dilation, pads = window_params(fn, rank, strides, dilation, pads)
    return channels_first, rank, strides, dilation, pads


def local_setup(fn, rank, kernel_size, strides, output_spatial, in_spatial):
    """Check the arguments shared by the local_conv functions.

    Like Keras 2.3.1 K.local_conv1d/2d: no padding, no dilation; output
    position p reads the window starting at p * stride.
    """
    kernel_size = geometry.normalize_positive_tuple(kernel_size, rank, fn, 'kernel_size')
    strides = geometry.normalize_positive_tuple(strides, rank, fn, 'strides')
    output_spatial = geometry.normalize_positive_tuple(output_spatial, rank, fn,
                                                       'output_spatial')
    for size, k, s, o in zip(in_spatial, kernel_size, strides, output_spatial):
        if (o - 1) * s + k > size:
            raise ValueError('%s: output_spatial %s with kernel_size %s and strides %s '
                             'reads past the input spatial shape %s'
                             % (fn, output_spatial, kernel_size, strides, in_spatial))
    return kernel_size, strides, output_spatial


def check_local_kernel(fn, w_name, w_shape, output_spatial, kernel_size, c_in):
    expected = (math.prod(output_spatial), math.prod(kernel_size) * c_in)
    if len(w_shape) != 3 or tuple(w_shape[:2]) != expected:
        raise ValueError('%s: %s must have shape (%d, %d, C_out) = (prod(output_spatial), '
                         'prod(kernel_size) * C_in, C_out), got %s'
                         % (fn, w_name, expected[0], expected[1], tuple(w_shape)))


def check_local_dgrad_operands(fn, dy, w, x_shape, channels_first, output_spatial, kernel_size):
    """local_conv_dgrad's checks of dy and w against x_shape (every implementation); returns C_in."""
    check_batch(fn, 'dy', dy.shape, 'x_shape', x_shape)
    c_in = channel_count(x_shape, channels_first)
    check_local_kernel(fn, 'w', w.shape, output_spatial, kernel_size, c_in)
    check_channels(fn, 'the channel count', 'dy', dy.shape, channel_count(dy.shape, channels_first),
                   'w', w.shape, w.shape[-1])
    check_dy_spatial(fn, dy, channels_first, output_spatial, 'output_spatial')
    return c_in


def depthwise_fwd_setup(fn, x, w, strides, dilation, pads, data_format):
    """Checks of a depthwise forward pass (x, w already float arrays of one dtype); returns
    (channels_first, rank, strides, dilation, pads, c_in, multiplier, in_spatial, out_spatial)."""
    channels_first, rank, strides, dilation, pads = conv_setup(
        fn, 'x', x, data_format, w, 'w', strides, dilation, pads)
    c_in = channel_count(x.shape, channels_first)
    check_channels(fn, 'the channel count', 'x', x.shape, c_in, 'w', w.shape, w.shape[-2])
    in_spatial = spatial_dims(x.shape, channels_first)
    out_spatial = output_spatial(fn, in_spatial, w.shape[:rank], strides, dilation, pads)
    return channels_first, rank, strides, dilation, pads, c_in, w.shape[-1], in_spatial, out_spatial


# ---------------------------------------------------------------- whole prologues (twin and launcher)

# The shapes a convolution's checks establish; the spatial tuples have `rank` entries.
ConvShapes = namedtuple('ConvShapes', ['channels_first', 'rank', 'batch', 'c_in', 'c_out', 'in_spatial',
                                       'out_spatial', 'kernel_spatial', 'strides', 'dilation', 'pads'])


def fwd_problem(fn, x, w, strides, dilation, pads, data_format, xp=None):
    """(x, w, ConvShapes): every check of a forward convolution, in the order the twin and the
    launcher raise them (``xp`` as in ``float_array``)."""
    x, w = float_array(fn, 'x', x, xp=xp), float_array(fn, 'w', w, xp=xp)
    same_dtype(fn, [('x', x), ('w', w)])
    channels_first, rank, strides, dilation, pads = conv_setup(
        fn, 'x', x, data_format, w, 'w', strides, dilation, pads)
    c_in = channel_count(x.shape, channels_first)
    check_channels(fn, 'the channel count', 'x', x.shape, c_in, 'w', w.shape, w.shape[-2])
    in_spatial = spatial_dims(x.shape, channels_first)
    kernel_spatial = tuple(w.shape[:rank])
    out_spatial = output_spatial(fn, in_spatial, kernel_spatial, strides, dilation, pads)
    return x, w, ConvShapes(channels_first, rank, x.shape[0], c_in, w.shape[-1], in_spatial, out_spatial,
                            kernel_spatial, strides, dilation, pads)


def dgrad_setup(fn, dy, w, x_shape, strides, dilation, pads, data_format, xp=None):
    """The checks every data gradient (dense and depthwise) starts with."""
    dy, w = float_array(fn, 'dy', dy, xp=xp), float_array(fn, 'w', w, xp=xp)
    same_dtype(fn, [('dy', dy), ('w', w)])
    channels_first, rank, strides, dilation, pads = conv_setup(
        fn, 'dy', dy, data_format, w, 'w', strides, dilation, pads)
    x_shape = shape_tuple(fn, 'x_shape', x_shape, rank + 2)
    check_batch(fn, 'dy', dy.shape, 'x_shape', x_shape)
    return dy, w, x_shape, channels_first, rank, strides, dilation, pads


def dgrad_problem(fn, dy, w, x_shape, strides, dilation, pads, data_format, xp=None):
    """(dy, w, x_shape, ConvShapes): every check of a dense data gradient."""
    dy, w, x_shape, channels_first, rank, strides, dilation, pads = dgrad_setup(
        fn, dy, w, x_shape, strides, dilation, pads, data_format, xp)
    check_channels(fn, 'the channel count', 'dy', dy.shape, channel_count(dy.shape, channels_first),
                   'w', w.shape, w.shape[-1])
    c_in = channel_count(x_shape, channels_first)
    check_channels(fn, 'the channel count', 'x_shape', x_shape, c_in, 'w', w.shape, w.shape[-2])
    in_spatial = spatial_dims(x_shape, channels_first)
    kernel_spatial = tuple(w.shape[:rank])
    out_spatial = output_spatial(fn, in_spatial, kernel_spatial, strides, dilation, pads)
    check_dy_spatial(fn, dy, channels_first, out_spatial, 'x_shape %s' % (x_shape,))
    return dy, w, x_shape, ConvShapes(channels_first, rank, x_shape[0], c_in, w.shape[-1], in_spatial,
                                      out_spatial, kernel_spatial, strides, dilation, pads)


def wgrad_setup(fn, x, dy, w_shape, strides, dilation, pads, data_format, xp=None):
    """The checks every filter gradient (dense and depthwise) starts with."""
    x, dy = float_array(fn, 'x', x, xp=xp), float_array(fn, 'dy', dy, xp=xp)
    same_dtype(fn, [('x', x), ('dy', dy)])
    channels_first = is_channels_first(fn, data_format)
    rank = spatial_rank(fn, 'x', x)
    check_rank(fn, 'dy', dy, rank + 2, 'like x')
    w_shape = shape_tuple(fn, 'w_shape', w_shape, rank + 2)
    strides, dilation, pads = window_params(fn, rank, strides, dilation, pads)
    check_batch(fn, 'x', x.shape, 'dy', dy.shape)
    return x, dy, channels_first, rank, w_shape, strides, dilation, pads


def wgrad_problem(fn, x, dy, w_shape, strides, dilation, pads, data_format, xp=None):
    """(x, dy, w_shape, ConvShapes): every check of a dense filter gradient."""
    x, dy, channels_first, rank, w_shape, strides, dilation, pads = wgrad_setup(
        fn, x, dy, w_shape, strides, dilation, pads, data_format, xp)
    c_in, c_out = channel_count(x.shape, channels_first), channel_count(dy.shape, channels_first)
    check_channels(fn, 'the channel count', 'x', x.shape, c_in, 'w_shape', w_shape, w_shape[-2])
    check_channels(fn, 'the channel count', 'dy', dy.shape, c_out, 'w_shape', w_shape, w_shape[-1])
    in_spatial = spatial_dims(x.shape, channels_first)
    kernel_spatial = tuple(w_shape[:rank])
    out_spatial = output_spatial(fn, in_spatial, kernel_spatial, strides, dilation, pads)
    check_dy_spatial(fn, dy, channels_first, out_spatial, 'x shape %s' % (x.shape,))
    return x, dy, w_shape, ConvShapes(channels_first, rank, x.shape[0], c_in, c_out, in_spatial, out_spatial,
                                      kernel_spatial, strides, dilation, pads)
