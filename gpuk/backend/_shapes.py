"""Shape manipulation: shape and size, reshape and flatten, axes, joining, tiling and
repeating, reversing and slicing, gathering, one-hot, arange, padding and resizing."""
import builtins

import numpy as np

from gpuk import config
from gpuk.graph import Tensor, as_tensor, dtype_name, static_value
from gpuk.ops import elementwise as ew
from gpuk.ops import indexing, layout
from gpuk.ops import shape as shape_ops
from gpuk.ops.base import normalize_axis
from gpuk.contracts.geometry import normalize_data_format, normalize_pads
from gpuk.ops.reduction import reduce

__all__ = ['shape', 'size', 'reshape', 'flatten', 'batch_flatten', 'permute_dimensions', 'transpose',
           'expand_dims', 'squeeze', 'concatenate', 'stack', 'repeat', 'repeat_elements', 'tile',
           'reverse', 'slice', 'gather', 'one_hot', 'arange', 'temporal_padding', 'spatial_2d_padding',
           'spatial_3d_padding', 'resize_images', 'resize_volumes', 'pattern_broadcast']



# --- argument checks ---------------------------------------------------------------------

def _is_int(value):
    return isinstance(value, (int, np.integer)) and not isinstance(value, (bool, np.bool_))


def _int_arg(value, where, name, minimum=None):
    if not _is_int(value):
        raise TypeError('%s: %s must be an int, got %r' % (where, name, value))
    if minimum is not None and value < minimum:
        raise ValueError('%s: %s must be >= %d, got %r' % (where, name, minimum, value))
    return int(value)


def _tensor_arg(x, where, name='x'):
    if isinstance(x, Tensor):
        return x
    if isinstance(x, (np.ndarray, np.generic, int, float, bool, list, tuple)):
        return as_tensor(x)
    raise TypeError('%s: %s must be a tensor or an array, got %r' % (where, name, x))


def _rank(x, where, allowed=None):
    """The rank of ``x``; ValueError when unknown or not in ``allowed``."""
    if x.ndim is None:
        raise ValueError('%s: tensors of unknown rank are not supported, got %r' % (where, x))
    if allowed is not None and x.ndim not in allowed:
        raise ValueError('%s: expected a tensor of rank %s, got shape %s'
                         % (where, ' or '.join(str(r) for r in allowed), x.shape))
    return x.ndim


def _int_scalar_or_int(value, where, name, minimum=0):
    """An int (checked >= minimum) or a scalar int tensor."""
    if isinstance(value, Tensor):
        if value.shape != () or np.dtype(value.dtype).kind not in 'iu':
            raise TypeError('%s: %s must be an int or a scalar int tensor, got %r' % (where, name, value))
        return value
    return _int_arg(value, where, name, minimum)


def _int_entries(spec, where, name):
    """Checks a list/tuple of ints and scalar int tensors, or a 1-D int tensor."""
    if isinstance(spec, Tensor):
        if spec.ndim != 1 or np.dtype(spec.dtype).kind not in 'iu':
            raise TypeError('%s: %s must be a 1-D int tensor, got %r' % (where, name, spec))
        return spec
    if isinstance(spec, np.ndarray):
        spec = spec.tolist()
    if not isinstance(spec, (list, tuple)):
        raise TypeError('%s: %s must be a list or tuple of ints or an int tensor, got %r' % (where, name, spec))
    for entry in spec:
        if isinstance(entry, Tensor):
            _int_scalar_or_int(entry, where, name)
        elif not _is_int(entry):
            raise TypeError('%s: %s entries must be ints or scalar int tensors, got %r' % (where, name, spec))
    return list(spec)


def _entry_len(spec):
    return spec.shape[0] if isinstance(spec, Tensor) else len(spec)


def _static_entries(spec):
    """Per-entry static values (None where known only at run time)."""
    if isinstance(spec, Tensor):
        value = static_value(spec)
        if value is not None:
            return [int(v) for v in value]
        return None if spec.shape[0] is None else [None] * spec.shape[0]
    out = []
    for entry in spec:
        value = static_value(entry) if isinstance(entry, Tensor) else entry
        out.append(None if value is None else int(np.asarray(value).reshape(())))
    return out


def _int_vector(spec, where):
    """``spec`` (entries or an int tensor) as an int vector tensor."""
    static, vector = shape_ops.resolve_shape(spec, where)
    if vector is None:
        vector = as_tensor(np.asarray(static, dtype=np.int64))
    return vector


# --- shape, size, reshape, flatten -----------------------------------------------------------

def shape(x):
    """The symbolic shape of ``x``: an int32 vector tensor whose entries mix with ints."""
    return shape_ops.shape(_tensor_arg(x, 'shape'))


def size(x, name=None):
    """The number of elements of ``x``, as a scalar int32 tensor."""
    return shape_ops.size(_tensor_arg(x, 'size'))


def reshape(x, shape):
    """Reshapes ``x``; ``shape`` may mix ints, -1 and symbolic scalars, or be a shape tensor."""
    return shape_ops.reshape(_tensor_arg(x, 'reshape'), shape)


def flatten(x):
    """``x`` reshaped to 1-D."""
    return shape_ops.reshape(_tensor_arg(x, 'flatten'), (-1,))


def batch_flatten(x):
    """``x`` reshaped to 2-D, keeping the first axis: (batch, product of the other dims)."""
    x = _tensor_arg(x, 'batch_flatten')
    if _rank(x, 'batch_flatten') == 0:
        raise ValueError('batch_flatten: x needs at least one axis, got a scalar')
    inner = x.shape[1:]
    if None not in inner:
        return shape_ops.reshape(x, (-1, int(np.prod(inner, dtype=np.int64))))
    return shape_ops.reshape(x, [-1, reduce('prod', shape_ops.shape(x)[1:])])


# --- axes --------------------------------------------------------------------------------

def permute_dimensions(x, pattern):
    """Permutes the axes of ``x`` (``pattern`` a tuple of axis indices, e.g. (0, 2, 1))."""
    if not isinstance(pattern, (tuple, list)) or not builtins.all(_is_int(p) for p in pattern):
        raise TypeError('permute_dimensions: pattern must be a tuple of ints, got %r' % (pattern,))
    x = _tensor_arg(x, 'permute_dimensions')
    _rank(x, 'permute_dimensions')
    return shape_ops.transpose(x, pattern)


def transpose(x):
    """Reverses the axes of ``x``."""
    x = _tensor_arg(x, 'transpose')
    return shape_ops.transpose(x, tuple(reversed(range(_rank(x, 'transpose')))))


def expand_dims(x, axis=-1):
    """Adds an axis of size 1 at ``axis`` (negative: counted from the end of the result)."""
    return shape_ops.expand_dims(_tensor_arg(x, 'expand_dims'), axis)


def squeeze(x, axis):
    """Removes axis ``axis``, which must have size 1."""
    return shape_ops.squeeze(_tensor_arg(x, 'squeeze'), axis)


def pattern_broadcast(x, broadcastable):
    """Theano's patternbroadcast: checks that axes marked True have size 1 (or unknown
    size) and returns ``x``; broadcasting is implicit in gpuk."""
    x = _tensor_arg(x, 'pattern_broadcast')
    if not isinstance(broadcastable, (list, tuple)):
        raise TypeError('pattern_broadcast: broadcastable must be a list of bools, got %r' % (broadcastable,))
    if len(broadcastable) != _rank(x, 'pattern_broadcast'):
        raise ValueError('pattern_broadcast: broadcastable has %d entries for a tensor of shape %s'
                         % (len(broadcastable), x.shape))
    for axis, (flag, dim) in enumerate(zip(broadcastable, x.shape)):
        if flag and dim not in (1, None):
            raise ValueError('pattern_broadcast: axis %d is marked broadcastable but has size %d (shape %s)'
                             % (axis, dim, x.shape))
    return x


# --- joining -------------------------------------------------------------------------------

def concatenate(tensors, axis=-1):
    """Concatenates tensors along ``axis``."""
    if not isinstance(tensors, (list, tuple)):
        raise TypeError('concatenate: tensors must be a list of tensors, got %r' % (tensors,))
    tensors = [_tensor_arg(t, 'concatenate', 'tensors') for t in tensors]
    dtypes = sorted({t.dtype for t in tensors})
    if len(dtypes) > 1:  # tf.concat refuses too; NumPy would silently promote (to float64)
        raise TypeError('concatenate: all tensors need one dtype, got %s (cast them with K.cast first)'
                        % ', '.join(dtypes))
    result = shape_ops.concatenate(tensors, axis)
    if tensors and builtins.all(getattr(t, 'is_sparse', False) for t in tensors):
        result.is_sparse = True  # tensorflow_backend: sparse in, tf.sparse_concat, sparse out
    return result


def stack(x, axis=0):
    """Stacks a list of rank-R tensors of one shape into a rank R + 1 tensor."""
    if not isinstance(x, (list, tuple)) or not x:
        raise ValueError('stack: x must be a non-empty list of tensors, got %r' % (x,))
    tensors = [_tensor_arg(t, 'stack') for t in x]
    rank = _rank(tensors[0], 'stack')
    for t in tensors[1:]:
        if _rank(t, 'stack') != rank or builtins.any(
                a is not None and b is not None and a != b for a, b in zip(t.shape, tensors[0].shape)):
            raise ValueError('stack: all tensors need the same shape, got %s' % [u.shape for u in tensors])
    axis = normalize_axis(axis, rank + 1, 'stack')
    expanded = [shape_ops.expand_dims(t, axis) for t in tensors]
    return expanded[0] if len(expanded) == 1 else shape_ops.concatenate(expanded, axis)


# --- tile and repeat ---------------------------------------------------------------------------

def tile(x, n):
    """``x`` tiled ``n[i]`` times along axis i; ``n`` is an int, a list mixing ints and
    scalar int tensors (padded with 1s in front to the rank of ``x``) or an int tensor."""
    x = _tensor_arg(x, 'tile')
    rank = _rank(x, 'tile')
    if _is_int(n) or isinstance(n, Tensor) and n.shape == ():
        n = [n]
    n = _int_entries(n, 'tile', 'n')
    length = _entry_len(n)
    if not isinstance(n, Tensor) and length < rank:
        n = [1] * (rank - length) + n
    elif length is not None and length != rank:
        raise ValueError('tile: n has %d entries for a tensor of rank %d (shape %s)' % (length, rank, x.shape))
    reps = _static_entries(n)
    if reps is not None and builtins.any(r is not None and r < 0 for r in reps):
        raise ValueError('tile: n must be non-negative, got %r' % (reps,))
    if reps is not None and None not in reps:
        return layout.tile(x, tuple(reps))
    return layout.tile(x, None if reps is None else tuple(reps), _int_vector(n, 'tile'))


def repeat(x, n):
    """Repeats a 2-D tensor (samples, dim) ``n`` times: (samples, n, dim)."""
    x = _tensor_arg(x, 'repeat')
    _rank(x, 'repeat', (2,))
    n = _int_scalar_or_int(n, 'repeat', 'n')
    return tile(shape_ops.expand_dims(x, 1), [1, n, 1])


def repeat_elements(x, rep, axis):
    """Repeats each entry of ``x`` ``rep`` times along ``axis``, like np.repeat."""
    x = _tensor_arg(x, 'repeat_elements')
    rep = _int_arg(rep, 'repeat_elements', 'rep', 0)
    axis = normalize_axis(axis, _rank(x, 'repeat_elements'), 'repeat_elements')
    repeated = layout.repeat_elements(x, rep, axis)
    if repeated is not x:
        repeated._keras_shape = repeated.shape  # as tensorflow_backend.repeat_elements sets it
    return repeated


# --- reverse, slice, gather, one_hot, arange ---------------------------------------------------

def reverse(x, axes):
    """``x`` reversed along ``axes`` (an int or a list of ints)."""
    x = _tensor_arg(x, 'reverse')
    rank = _rank(x, 'reverse')
    axes = [axes] if _is_int(axes) else axes
    if not isinstance(axes, (list, tuple)) or not builtins.all(_is_int(a) for a in axes):
        raise TypeError('reverse: axes must be an int or a list of ints, got %r' % (axes,))
    normalized = [normalize_axis(a, rank, 'reverse') for a in axes]
    if len(set(normalized)) != len(normalized):
        raise ValueError('reverse: axes %r name an axis twice' % (axes,))
    return layout.reverse(x, tuple(normalized))


def slice(x, start, size):
    """``x[start[i] : start[i] + size[i]]`` along every axis (size -1: up to the end).

    ``start`` and ``size`` are lists of ints / scalar int tensors, or int vector tensors.
    """
    x = _tensor_arg(x, 'slice')
    rank = _rank(x, 'slice')
    start, size = _int_entries(start, 'slice', 'start'), _int_entries(size, 'slice', 'size')
    if _entry_len(start) not in (rank, None) or _entry_len(size) not in (rank, None):
        raise ValueError('slice: start and size need one entry per axis of shape %s, got %d and %s entries'
                         % (x.shape, _entry_len(start), _entry_len(size)))
    begins = _static_entries(start) or [None] * rank
    sizes = _static_entries(size) or [None] * rank
    out_shape = []
    for axis, (dim, b, s) in enumerate(zip(x.shape, begins, sizes)):
        if (b is not None and b < 0) or (s is not None and s < -1) or (
                None not in (dim, b, s) and (b + s > dim if s >= 0 else b > dim)):
            raise ValueError('slice: start %s with size %s is out of range for axis %d of shape %s'
                             % (b, s, axis, x.shape))
        if s is not None and s >= 0:
            out_shape.append(s)
        else:
            out_shape.append(dim - b if s == -1 and None not in (dim, b) else None)
    return indexing.slice_op(x, tuple(out_shape), _int_vector(start, 'slice'), _int_vector(size, 'slice'))


def gather(reference, indices):
    """Rows of ``reference`` picked by the int tensor ``indices``: shape
    indices.shape + reference.shape[1:]. The gradient adds up rows picked several times."""
    reference = _tensor_arg(reference, 'gather', 'reference')
    indices = _tensor_arg(indices, 'gather', 'indices')
    if np.dtype(indices.dtype).kind not in 'iu':
        raise TypeError('gather: indices must have an int dtype, got %s' % indices.dtype)
    if _rank(reference, 'gather') == 0:
        raise ValueError('gather: reference must have at least one axis, got a scalar')
    return indexing.gather(reference, indices)


def one_hot(indices, num_classes):
    """float32 one-hot encoding of the int tensor ``indices`` on a new last axis."""
    indices = _tensor_arg(indices, 'one_hot', 'indices')
    if np.dtype(indices.dtype).kind not in 'iu':
        raise TypeError('one_hot: indices must have an int dtype, got %s' % indices.dtype)
    num_classes = _int_scalar_or_int(num_classes, 'one_hot', 'num_classes', 1)
    if isinstance(num_classes, Tensor):
        known = static_value(num_classes)
        if known is None:
            return indexing.one_hot(indices, None, depth=num_classes)
        num_classes = int(known)
    return indexing.one_hot(indices, num_classes)


def _arange_bound(value, name):
    if isinstance(value, Tensor):
        if value.shape != () or np.dtype(value.dtype).kind not in 'iuf':
            raise TypeError('arange: %s must be a number or a scalar tensor, got %r' % (name, value))
        return value
    if _is_int(value):
        return as_tensor(np.int64(value))
    if isinstance(value, (float, np.floating)):
        return as_tensor(np.float64(value))
    raise TypeError('arange: %s must be a number or a scalar tensor, got %r' % (name, value))


def arange(start, stop=None, step=1, dtype='int32'):
    """The 1-D tensor start, start + step, ... below ``stop``; with ``stop`` None the
    sequence 0 ... start - 1 (empty for negative start, like Keras)."""
    dtype = dtype_name(dtype)
    start, step = _arange_bound(start, 'start'), _arange_bound(step, 'step')
    if stop is None:
        start, stop = as_tensor(np.int64(0)), ew.binary('maximum', start, 0)
    else:
        stop = _arange_bound(stop, 'stop')
    values = [static_value(t) for t in (start, stop, step)]
    if values[2] is not None and values[2] == 0:
        raise ValueError('arange: step must not be zero')
    length = None
    if None not in values:
        length = indexing.arange_length(*(np.asarray(v).reshape(()).item() for v in values))
    return indexing.arange(start, stop, step, dtype, length)


# --- padding -------------------------------------------------------------------------------

def _spatial_axes(data_format, n, where):
    data_format = normalize_data_format(config.image_data_format() if data_format is None else data_format,
                                        where)
    return tuple(range(2, 2 + n)) if data_format == 'channels_first' else tuple(range(1, 1 + n))


def _pad_axes(x, pairs, axes):
    pads = [(0, 0)] * x.ndim
    for axis, pair in zip(axes, pairs):
        pads[axis] = pair
    return layout.pad(x, pads)


def temporal_padding(x, padding=(1, 1)):
    """Zero-pads axis 1 of a 3-D tensor with ``padding`` = (before, after)."""
    x = _tensor_arg(x, 'temporal_padding')
    _rank(x, 'temporal_padding', (3,))
    try:
        pairs = normalize_pads((padding,) if isinstance(padding, (list, tuple)) else padding, 1,
                               'temporal_padding', 'padding')
    except (ValueError, TypeError) as error:   # its message shows the pair wrapped: ((1.5, 1),)
        raise type(error)('temporal_padding: padding must be a (before, after) pair of ints '
                          '>= 0, got %r' % (padding,)) from None
    return _pad_axes(x, pairs, (1,))


def spatial_2d_padding(x, padding=((1, 1), (1, 1)), data_format=None):
    """Zero-pads the two spatial axes of a 4-D tensor; ``padding`` = ((top, bottom), (left, right))."""
    x = _tensor_arg(x, 'spatial_2d_padding')
    axes = _spatial_axes(data_format, 2, 'spatial_2d_padding')
    _rank(x, 'spatial_2d_padding', (4,))
    return _pad_axes(x, normalize_pads(padding, 2, 'spatial_2d_padding', 'padding'), axes)


def spatial_3d_padding(x, padding=((1, 1), (1, 1), (1, 1)), data_format=None):
    """Zero-pads the three spatial axes of a 5-D tensor; ``padding`` holds 3 (before, after) pairs."""
    x = _tensor_arg(x, 'spatial_3d_padding')
    axes = _spatial_axes(data_format, 3, 'spatial_3d_padding')
    _rank(x, 'spatial_3d_padding', (5,))
    return _pad_axes(x, normalize_pads(padding, 3, 'spatial_3d_padding', 'padding'), axes)


# --- resizing -------------------------------------------------------------------------------

def resize_images(x, height_factor, width_factor, data_format, interpolation='nearest'):
    """Upsamples the images of a 4-D tensor by integer factors.

    'nearest' repeats pixels; 'bilinear' interpolates like TensorFlow's resize_bilinear
    without half-pixel centers (what Keras 2.3.1 calls): output o samples input o / factor.
    Integer images come back float32 from 'bilinear', as in TensorFlow.
    """
    x = _tensor_arg(x, 'resize_images')
    factors = (_int_arg(height_factor, 'resize_images', 'height_factor', 1),
               _int_arg(width_factor, 'resize_images', 'width_factor', 1))
    axes = _spatial_axes(data_format, 2, 'resize_images')
    if interpolation not in ('nearest', 'bilinear'):
        raise ValueError("resize_images: interpolation must be 'nearest' or 'bilinear', got %r" % (interpolation,))
    _rank(x, 'resize_images', (4,))
    if interpolation == 'nearest':
        for axis, factor in zip(axes, factors):
            x = layout.repeat_elements(x, factor, axis)
        return x
    if np.dtype(x.dtype).kind != 'f':
        x = ew.cast(x, 'float32')
    for axis, factor in zip(axes, factors):
        x = layout.linear_upsample(x, axis, factor)
    return x


def resize_volumes(x, depth_factor, height_factor, width_factor, data_format):
    """Upsamples the volumes of a 5-D tensor by repeating voxels integer times per axis."""
    x = _tensor_arg(x, 'resize_volumes')
    factors = (_int_arg(depth_factor, 'resize_volumes', 'depth_factor', 1),
               _int_arg(height_factor, 'resize_volumes', 'height_factor', 1),
               _int_arg(width_factor, 'resize_volumes', 'width_factor', 1))
    axes = _spatial_axes(data_format, 3, 'resize_volumes')
    _rank(x, 'resize_volumes', (5,))
    for axis, factor in zip(axes, factors):
        x = layout.repeat_elements(x, factor, axis)
    return x
