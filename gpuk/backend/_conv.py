"""Convolution, pooling and bias K functions (Keras 2.3.1 tensorflow_backend signatures).

Kernels use the Keras layout (*kernel_spatial, in_channels, out_channels); transposed
convolutions take (*kernel_spatial, out_channels, in_channels), as TensorFlow does.
'same' padding is TensorFlow's: the odd pixel goes after.
"""
import numpy as np

from gpuk import config
from gpuk.graph import Constant, Tensor, as_tensor
from gpuk.ops import bias as bias_ops
from gpuk.ops import conv as conv_ops
from gpuk.contracts import geometry
from gpuk.ops import pooling as pool_ops
from gpuk.ops import shape as shape_ops
from gpuk.ops.elementwise import cast

__all__ = [
    'conv1d', 'conv2d', 'conv3d', 'conv2d_transpose', 'conv3d_transpose',
    'separable_conv1d', 'separable_conv2d', 'depthwise_conv2d',
    'local_conv1d', 'local_conv2d', 'pool2d', 'pool3d', 'bias_add',
]

_SAME_VALID = ('same', 'valid')


# ---------------------------------------------------------------- argument checks

def _data_format(data_format, fn):
    if data_format is None:
        data_format = config.image_data_format()
    return geometry.normalize_data_format(data_format, fn)


def _float_tensor(value, fn, name):
    tensor = as_tensor(value)
    if np.dtype(tensor.dtype).kind != 'f':
        raise TypeError('%s: %s must be a float tensor, got dtype %s' % (fn, name, tensor.dtype))
    if tensor.shape is None:
        raise ValueError('%s: %s must have a known rank' % (fn, name))
    return tensor


def _common_dtype(tensors):
    """Casts float tensors to their common type (the twins need equal dtypes)."""
    dtype = np.result_type(*[t.dtype for t in tensors]).name
    return [cast(t, dtype) for t in tensors]


def _check_rank(fn, name, tensor, rank, layout):
    if tensor.ndim != rank:
        raise ValueError('%s: %s must have rank %d %s, got shape %s'
                         % (fn, name, rank, layout, tensor.shape))


def _check_kernel(fn, name, kernel, rank, last_dims):
    _check_rank(fn, name, kernel, rank + 2, '(*kernel_spatial, %s)' % last_dims)
    if None in kernel.shape:
        raise ValueError('%s: %s must have a fully known shape, got %s'
                         % (fn, name, kernel.shape))


def _check_same(fn, a_desc, a, b_desc, b, shapes):
    if a is not None and b is not None and a != b:
        raise ValueError('%s: %s (%d) does not match %s (%d); shapes %s and %s'
                         % (fn, a_desc, a, b_desc, b, shapes[0], shapes[1]))


def _channels(shape, data_format):
    return conv_ops.channel_dim(shape, data_format == 'channels_first')


# ---------------------------------------------------------------- convolutions

def _conv(fn, rank, x, kernel, strides, padding, data_format, dilation_rate,
          family='conv', paddings=_SAME_VALID):
    data_format = _data_format(data_format, fn)
    padding = geometry.normalize_padding(padding, fn, paddings)
    if padding == 'causal' and data_format != 'channels_last':
        raise ValueError("%s: padding 'causal' needs data_format 'channels_last' (temporal "
                         "data), got %r" % (fn, data_format))
    x = _float_tensor(x, fn, 'x')
    kernel = _float_tensor(kernel, fn, 'kernel')
    _check_rank(fn, 'x', x, rank + 2, '(batch, %d spatial dims and channels)' % rank)
    _check_kernel(fn, 'kernel', kernel, rank,
                  'in_channels, ' + ('depth_multiplier' if family == 'depthwise'
                                     else 'out_channels'))
    _check_same(fn, 'the channels of x', _channels(x.shape, data_format),
                'the input channels of kernel', kernel.shape[-2], (x.shape, kernel.shape))
    window = conv_ops.Window(
        fn, family, geometry.normalize_positive_tuple(strides, rank, fn, 'strides'),
        geometry.normalize_positive_tuple(dilation_rate, rank, fn, 'dilation_rate'),
        padding, data_format)
    x, kernel = _common_dtype([x, kernel])
    return conv_ops.conv(x, kernel, window)


def conv1d(x, kernel, strides=1, padding='valid', data_format=None, dilation_rate=1):
    """1D convolution.

    # Arguments
        x: tensor (batch, steps, channels) or (batch, channels, steps).
        kernel: (kernel_size, in_channels, filters).
        strides: int. padding: 'valid', 'same' or 'causal' (channels_last only).
        data_format: 'channels_last' or 'channels_first' (None: image_data_format()).
        dilation_rate: int.
    # Returns
        A tensor, the 1D convolution.
    """
    return _conv('conv1d', 1, x, kernel, strides, padding, data_format, dilation_rate,
                 paddings=('same', 'valid', 'causal'))


def conv2d(x, kernel, strides=(1, 1), padding='valid', data_format=None,
           dilation_rate=(1, 1)):
    """2D convolution; kernel (kernel_h, kernel_w, in_channels, filters)."""
    return _conv('conv2d', 2, x, kernel, strides, padding, data_format, dilation_rate)


def conv3d(x, kernel, strides=(1, 1, 1), padding='valid', data_format=None,
           dilation_rate=(1, 1, 1)):
    """3D convolution; kernel (kernel_d, kernel_h, kernel_w, in_channels, filters)."""
    return _conv('conv3d', 3, x, kernel, strides, padding, data_format, dilation_rate)


def _output_shape(fn, rank, x, output_shape):
    """(static shape with None entries, int vector tensor) of a transposed conv's output;
    a None batch entry means the batch size of x (as in TensorFlow's backend)."""
    if isinstance(output_shape, (tuple, list)):
        if len(output_shape) != rank + 2:
            raise ValueError('%s: output_shape must have %d entries, got %r'
                             % (fn, rank + 2, output_shape))
        output_shape = list(output_shape)
        if output_shape[0] is None:
            output_shape[0] = shape_ops.shape(x)[0]
    elif not isinstance(output_shape, Tensor):
        raise TypeError('%s: output_shape must be a tuple/list of ints and scalar tensors or '
                        'a 1-D int tensor, got %r' % (fn, output_shape))
    static, vector = shape_ops.resolve_shape(output_shape, fn)
    if static is None or len(static) != rank + 2:
        raise ValueError('%s: output_shape must have %d entries, got %r'
                         % (fn, rank + 2, output_shape))
    if any(d is not None and d < 1 for d in static):
        raise ValueError('%s: output_shape entries must be >= 1, got %s' % (fn, static))
    if vector is None:
        vector = Constant(np.asarray(static, dtype=np.int64))
    return static, vector


def _conv_transpose(fn, rank, x, kernel, output_shape, strides, padding, data_format,
                    dilation_rate):
    data_format = _data_format(data_format, fn)
    padding = geometry.normalize_padding(padding, fn, _SAME_VALID)
    x = _float_tensor(x, fn, 'x')
    kernel = _float_tensor(kernel, fn, 'kernel')
    _check_rank(fn, 'x', x, rank + 2, '(batch, %d spatial dims and channels)' % rank)
    _check_kernel(fn, 'kernel', kernel, rank, 'out_channels, in_channels')
    _check_same(fn, 'the channels of x', _channels(x.shape, data_format),
                'the input channels of kernel (its last dim)', kernel.shape[-1],
                (x.shape, kernel.shape))
    static, vector = _output_shape(fn, rank, x, output_shape)
    _check_same(fn, 'the channels of output_shape', _channels(static, data_format),
                'the output channels of kernel (its dim -2)', kernel.shape[-2],
                (static, kernel.shape))
    window = conv_ops.Window(
        fn, 'conv', geometry.normalize_positive_tuple(strides, rank, fn, 'strides'),
        geometry.normalize_positive_tuple(dilation_rate, rank, fn, 'dilation_rate'),
        padding, data_format)
    x, kernel = _common_dtype([x, kernel])
    return conv_ops.conv_transpose(x, kernel, static, vector, window)


def conv2d_transpose(x, kernel, output_shape, strides=(1, 1), padding='valid',
                     data_format=None, dilation_rate=(1, 1)):
    """2D transposed convolution (the data gradient of conv2d).

    # Arguments
        x: input tensor. kernel: (kernel_h, kernel_w, filters, in_channels).
        output_shape: the output shape in data_format order; entries may be ints or
            scalar tensors (e.g. K.shape(x)[0]), a None batch entry means x's batch.
        strides, padding ('same'/'valid'), data_format, dilation_rate.
    """
    return _conv_transpose('conv2d_transpose', 2, x, kernel, output_shape, strides, padding,
                           data_format, dilation_rate)


def conv3d_transpose(x, kernel, output_shape, strides=(1, 1, 1), padding='valid',
                     data_format=None):
    """3D transposed convolution; kernel (kernel_d, kernel_h, kernel_w, filters, in_channels)."""
    return _conv_transpose('conv3d_transpose', 3, x, kernel, output_shape, strides, padding,
                           data_format, 1)


def _separable(fn, rank, x, depthwise_kernel, pointwise_kernel, strides, padding,
               data_format, dilation_rate):
    data_format = _data_format(data_format, fn)
    pointwise_kernel = _float_tensor(pointwise_kernel, fn, 'pointwise_kernel')
    _check_kernel(fn, 'pointwise_kernel', pointwise_kernel, rank,
                  'in_channels * depth_multiplier, filters')
    if any(k != 1 for k in pointwise_kernel.shape[:rank]):
        raise ValueError('%s: pointwise_kernel must have spatial dims of size 1, got shape %s'
                         % (fn, pointwise_kernel.shape))
    depthwise_kernel = _float_tensor(depthwise_kernel, fn, 'depthwise_kernel')
    _check_kernel(fn, 'depthwise_kernel', depthwise_kernel, rank,
                  'in_channels, depth_multiplier')
    _check_same(fn, 'in_channels * depth_multiplier of depthwise_kernel',
                depthwise_kernel.shape[-2] * depthwise_kernel.shape[-1],
                'the input channels of pointwise_kernel', pointwise_kernel.shape[-2],
                (depthwise_kernel.shape, pointwise_kernel.shape))
    depthwise = _conv(fn, rank, x, depthwise_kernel, strides, padding, data_format,
                      dilation_rate, family='depthwise')
    pointwise = conv_ops.Window(fn, 'conv', (1,) * rank, (1,) * rank, 'valid', data_format)
    depthwise, pointwise_kernel = _common_dtype([depthwise, pointwise_kernel])
    return conv_ops.conv(depthwise, pointwise_kernel, pointwise)


def separable_conv1d(x, depthwise_kernel, pointwise_kernel, strides=1, padding='valid',
                     data_format=None, dilation_rate=1):
    """1D separable convolution: depthwise (kernel_size, in_channels, depth_multiplier), then
    pointwise (1, in_channels * depth_multiplier, filters)."""
    return _separable('separable_conv1d', 1, x, depthwise_kernel, pointwise_kernel, strides,
                      padding, data_format, dilation_rate)


def separable_conv2d(x, depthwise_kernel, pointwise_kernel, strides=(1, 1), padding='valid',
                     data_format=None, dilation_rate=(1, 1)):
    """2D separable convolution: depthwise (kh, kw, in_channels, depth_multiplier), then
    pointwise (1, 1, in_channels * depth_multiplier, filters)."""
    return _separable('separable_conv2d', 2, x, depthwise_kernel, pointwise_kernel, strides,
                      padding, data_format, dilation_rate)


def depthwise_conv2d(x, depthwise_kernel, strides=(1, 1), padding='valid', data_format=None,
                     dilation_rate=(1, 1)):
    """2D depthwise convolution; depthwise_kernel (kh, kw, in_channels, depth_multiplier).
    Output channel c * depth_multiplier + m, like TensorFlow."""
    return _conv('depthwise_conv2d', 2, x, depthwise_kernel, strides, padding, data_format,
                 dilation_rate, family='depthwise')


# ---------------------------------------------------------------- locally connected

def _local(fn, inputs, kernel, kernel_size, strides, output_spatial, data_format):
    rank = len(output_spatial)
    inputs = _float_tensor(inputs, fn, 'inputs')
    kernel = _float_tensor(kernel, fn, 'kernel')
    _check_rank(fn, 'inputs', inputs, rank + 2, '(batch, %d spatial dims and channels)' % rank)
    _check_rank(fn, 'kernel', kernel, 3, '(output positions, feature_dim, filters)')
    window = conv_ops.LocalWindow(fn, kernel_size, strides, output_spatial, data_format)
    inputs, kernel = _common_dtype([inputs, kernel])
    return conv_ops.local_conv(inputs, kernel, window)


def local_conv1d(inputs, kernel, kernel_size, strides, data_format=None):
    """1D convolution with unshared weights.

    # Arguments
        inputs: (batch, steps, input_dim).
        kernel: (output_length, kernel_size * input_dim, filters).
        kernel_size, strides: tuples of one int.
        data_format: checked only: like TensorFlow's and Theano's backends, inputs are
            always (batch, steps, input_dim) (LocallyConnected1D passes none).
    # Returns
        (batch, output_length, filters).
    """
    fn = 'local_conv1d'
    _data_format(data_format, fn)
    kernel_tensor = as_tensor(kernel)
    if kernel_tensor.ndim != 3 or kernel_tensor.shape[0] is None:
        raise ValueError('%s: kernel must have rank 3 (output_length, feature_dim, filters) '
                         'with a known output_length, got shape %s' % (fn, kernel_tensor.shape))
    return _local(fn, inputs, kernel_tensor, kernel_size, strides, (kernel_tensor.shape[0],),
                  'channels_last')


def local_conv2d(inputs, kernel, kernel_size, strides, output_shape, data_format=None):
    """2D convolution with unshared weights.

    # Arguments
        inputs: (batch, rows, cols, channels) or (batch, channels, rows, cols).
        kernel: (output_row * output_col, kh * kw * channels, filters).
        kernel_size, strides: tuples of 2 ints. output_shape: (output_row, output_col).
    # Returns
        (batch, output_row, output_col, filters) or (batch, filters, output_row, output_col).
    """
    fn = 'local_conv2d'
    data_format = _data_format(data_format, fn)
    output_shape = geometry.normalize_positive_tuple(output_shape, 2, fn, 'output_shape')
    return _local(fn, inputs, kernel, kernel_size, strides, output_shape, data_format)


# ---------------------------------------------------------------- pooling

def _pool(fn, rank, x, pool_size, strides, padding, data_format, pool_mode):
    data_format = _data_format(data_format, fn)
    if pool_mode not in ('max', 'avg'):
        raise ValueError("%s: pool_mode must be 'max' or 'avg', got %r" % (fn, pool_mode))
    x = _float_tensor(x, fn, 'x')
    _check_rank(fn, 'x', x, rank + 2, '(batch, %d spatial dims and channels)' % rank)
    window = pool_ops.PoolWindow(
        fn, geometry.normalize_positive_tuple(pool_size, rank, fn, 'pool_size'),
        geometry.normalize_positive_tuple(strides, rank, fn, 'strides'),
        geometry.normalize_padding(padding, fn, _SAME_VALID), data_format)
    if pool_mode == 'max':
        return pool_ops.max_pool(x, window)
    return pool_ops.avg_pool(x, window)


def pool2d(x, pool_size, strides=(1, 1), padding='valid', data_format=None, pool_mode='max'):
    """2D pooling.

    # Arguments
        x: 4D tensor. pool_size, strides: tuples of 2 ints.
        padding: 'same' or 'valid' (padding never takes part: avg excludes it).
        data_format: 'channels_last' or 'channels_first'. pool_mode: 'max' or 'avg'.
    """
    return _pool('pool2d', 2, x, pool_size, strides, padding, data_format, pool_mode)


def pool3d(x, pool_size, strides=(1, 1, 1), padding='valid', data_format=None, pool_mode='max'):
    """3D pooling; see pool2d."""
    return _pool('pool3d', 3, x, pool_size, strides, padding, data_format, pool_mode)


# ---------------------------------------------------------------- bias

def _bias_shape(x_ndim, bias_shape, data_format):
    """The shape bias is reshaped to before it is added (Keras 2.3.1's rules: a vector goes
    on the channel axis; a bias of rank ndim(x) - 1 is (*spatial, channels) reshaped, not
    transposed, to channels_first order)."""
    if x_ndim in (3, 4, 5):
        if len(bias_shape) == 1:
            full = (1,) * (x_ndim - 2) + tuple(bias_shape)
        else:
            full = tuple(bias_shape)
        if data_format == 'channels_first':
            full = (full[-1],) + full[:-1]
        return (1,) + full
    return (1,) * (x_ndim - 1) + tuple(bias_shape)


def bias_add(x, bias, data_format=None):
    """Adds a bias to x: a vector along the channel axis, or a tensor of rank ndim(x) - 1.

    # Raises
        ValueError: bad data_format, or a bias shape that does not fit x.
    """
    fn = 'bias_add'
    data_format = _data_format(data_format, fn)
    x, bias = as_tensor(x), as_tensor(bias)
    if x.ndim is None or x.ndim < 2:
        raise ValueError('%s: x must have rank >= 2, got shape %s' % (fn, x.shape))
    if bias.ndim is None or bias.ndim not in (1, x.ndim - 1) or \
            (bias.ndim != 1 and x.ndim not in (3, 4, 5)):
        allowed = '1' if x.ndim not in (3, 4, 5) else '1 or %d' % (x.ndim - 1)
        raise ValueError('%s: bias must have rank %s for x of shape %s, got shape %s'
                         % (fn, allowed, x.shape, bias.shape))
    if None in bias.shape:
        raise ValueError('%s: bias must have a fully known shape, got %s' % (fn, bias.shape))
    target = _bias_shape(x.ndim, bias.shape, data_format)
    if any(t != 1 and d is not None and d != t for t, d in zip(target, x.shape)):
        raise ValueError('%s: bias of shape %s does not fit x of shape %s with data_format %r'
                         % (fn, bias.shape, x.shape, data_format))
    if bias.ndim == 1 and np.dtype(x.dtype).kind == 'f':
        channel_axis = 1 if data_format == 'channels_first' and x.ndim in (3, 4, 5) else x.ndim - 1
        return bias_ops.bias_act(x, bias, channel_axis)
    return x + shape_ops.reshape(bias, target)
