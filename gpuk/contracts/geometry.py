"""Convolution and pooling geometry: output lengths, padding, argument checks.

Pure Python (no NumPy, no CuPy) so the op layer, the CUDA launchers and the
NumPy fallback all compute shapes and pads the same way. Every checker takes
the name of the calling function so its error says who complained.
"""
import operator

PADDINGS = ('same', 'valid', 'causal', 'full')
DATA_FORMATS = ('channels_first', 'channels_last')


def _as_int(value):
    """operator.index, but refusing bool (True is an int to Python, not to us)."""
    if isinstance(value, bool):
        raise TypeError('bool is not an integer size')
    return operator.index(value)


def normalize_tuple(value, rank, fn_name, arg_name):
    """An int, or a sequence of `rank` ints, as a tuple of `rank` Python ints."""
    try:
        if isinstance(value, (list, tuple)):
            values = tuple(_as_int(v) for v in value)
        else:
            values = (_as_int(value),) * rank
    except TypeError:
        raise ValueError('%s: %s must be an int or a tuple of %d ints, got %r'
                         % (fn_name, arg_name, rank, value)) from None
    if len(values) != rank:
        raise ValueError('%s: %s must be an int or a tuple of %d ints, got %r'
                         % (fn_name, arg_name, rank, value))
    return values


def normalize_positive_tuple(value, rank, fn_name, arg_name):
    """normalize_tuple, also requiring every entry >= 1 (strides, dilation, sizes)."""
    values = normalize_tuple(value, rank, fn_name, arg_name)
    if any(v < 1 for v in values):
        raise ValueError('%s: %s must be >= 1 in every dimension, got %r'
                         % (fn_name, arg_name, value))
    return values


def normalize_pads(pads, rank, fn_name, arg_name='pads'):
    """`rank` pairs (before, after) of non-negative ints, as a tuple of tuples."""
    message = ('%s: %s must be a tuple of %d (before, after) pairs of ints >= 0, got %r'
               % (fn_name, arg_name, rank, pads))
    if not isinstance(pads, (list, tuple)) or len(pads) != rank:
        raise ValueError(message)
    result = []
    for pair in pads:
        if not isinstance(pair, (list, tuple)) or len(pair) != 2:
            raise ValueError(message)
        try:
            before, after = _as_int(pair[0]), _as_int(pair[1])
        except TypeError:
            raise ValueError(message) from None
        if before < 0 or after < 0:
            raise ValueError(message)
        result.append((before, after))
    return tuple(result)


def normalize_padding(padding, fn_name, allowed=PADDINGS):
    """Lower-cased padding mode, checked against `allowed`."""
    mode = padding.lower() if isinstance(padding, str) else padding
    if mode not in allowed:
        raise ValueError('%s: padding must be one of %s, got %r'
                         % (fn_name, ', '.join(repr(a) for a in allowed), padding))
    return mode


def normalize_data_format(data_format, fn_name):
    """'channels_first' or 'channels_last' (case-insensitive); anything else is an error."""
    value = data_format.lower() if isinstance(data_format, str) else data_format
    if value not in DATA_FORMATS:
        raise ValueError("%s: data_format must be 'channels_first' or 'channels_last', got %r"
                         % (fn_name, data_format))
    return value


def dilated_size(filter_size, dilation):
    """Extent of a dilated filter: (k - 1) * d + 1."""
    return (filter_size - 1) * dilation + 1


def conv_output_length(input_length, filter_size, padding, stride, dilation=1):
    """Output length of a convolution (Keras 2.3.1 conv_utils.conv_output_length)."""
    if input_length is None:
        return None
    padding = normalize_padding(padding, 'conv_output_length')
    extent = dilated_size(filter_size, dilation)
    if padding in ('same', 'causal'):
        length = input_length
    elif padding == 'valid':
        length = input_length - extent + 1
    else:  # full
        length = input_length + extent - 1
    return (length + stride - 1) // stride


def conv_pads(input_spatial, kernel_spatial, strides, dilation, padding):
    """(before, after) zero padding per spatial dim, as TensorFlow applies it.

    'same' puts the odd pixel after (TensorFlow, not Theano); 'causal' is for
    one spatial dim and pads dilation*(k-1) before; 'full' pads extent-1 on
    both sides.
    """
    fn = 'conv_pads'
    rank = len(kernel_spatial)
    input_spatial = normalize_positive_tuple(input_spatial, rank, fn, 'input_spatial')
    kernel_spatial = normalize_positive_tuple(kernel_spatial, rank, fn, 'kernel_spatial')
    strides = normalize_positive_tuple(strides, rank, fn, 'strides')
    dilation = normalize_positive_tuple(dilation, rank, fn, 'dilation')
    padding = normalize_padding(padding, fn)
    if padding == 'causal' and rank != 1:
        raise ValueError("%s: padding 'causal' needs 1 spatial dim, got %d"
                         % (fn, rank))
    pads = []
    for size, k, s, d in zip(input_spatial, kernel_spatial, strides, dilation):
        extent = dilated_size(k, d)
        if padding == 'valid':
            pads.append((0, 0))
        elif padding == 'causal':
            pads.append((extent - 1, 0))
        elif padding == 'full':
            pads.append((extent - 1, extent - 1))
        else:
            out = (size + s - 1) // s
            total = max((out - 1) * s + extent - size, 0)
            pads.append((total // 2, total - total // 2))
    return tuple(pads)


def deconv_output_length(dim_size, stride_size, kernel_size, padding,
                         output_padding=None, dilation=1):
    """Output length of a transposed convolution (Keras 2.3.1 conv_utils.deconv_length)."""
    padding = normalize_padding(padding, 'deconv_output_length',
                                allowed=('same', 'valid', 'full'))
    if dim_size is None:
        return None
    extent = dilated_size(kernel_size, dilation)
    if output_padding is None:
        if padding == 'valid':
            return dim_size * stride_size + max(extent - stride_size, 0)
        if padding == 'full':
            return dim_size * stride_size - (stride_size + extent - 2)
        return dim_size * stride_size
    pad = {'same': extent // 2, 'valid': 0, 'full': extent - 1}[padding]
    return (dim_size - 1) * stride_size + extent - 2 * pad + output_padding


INDEX_LIMIT = 2**31 - 1   # the kernels decode indices in 32 bits (64-bit division is slow on GPUs)
# CUDA's grid limits (every device since compute capability 3.0): runtime.launch_dims refuses a
# launch beyond them; a launcher that puts a problem size on grid y or z checks it against
# MAX_GRID_YZ first, with an error that names the argument.
MAX_GRID_X = 2**31 - 1
MAX_GRID_YZ = 65535


def check_index_limit(fn, what, value, remedy='split the batch'):
    """A size the kernels index in 32 bits must stay below 2^31 (offsets are 64-bit anyway)."""
    if value > INDEX_LIMIT:
        raise ValueError('%s: %s is %d, above the kernel limit of 2^31 - 1; %s'
                         % (fn, what, value, remedy))
