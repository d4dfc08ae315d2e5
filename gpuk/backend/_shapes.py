"""Shape manipulation: shape, reshape, transpose, indexing helpers, concatenation."""
from gpuk.graph import as_tensor
from gpuk.ops import shape as shape_ops

__all__ = ['shape', 'reshape', 'permute_dimensions', 'transpose', 'expand_dims', 'squeeze',
           'concatenate']


def shape(x):
    """The symbolic shape of ``x``: an int32 vector tensor whose entries mix with ints."""
    return shape_ops.shape(x)


def reshape(x, shape):
    """Reshapes ``x``; ``shape`` may mix ints, -1 and symbolic scalars, or be a shape tensor."""
    return shape_ops.reshape(x, shape)


def permute_dimensions(x, pattern):
    """Permutes the axes of ``x`` (``pattern`` a tuple of axis indices)."""
    if not isinstance(pattern, (tuple, list)):
        raise TypeError('permute_dimensions: pattern must be a tuple of ints, got %r' % (pattern,))
    x = as_tensor(x)
    if len(pattern) != x.ndim:
        raise ValueError('permute_dimensions: pattern %s does not match the %d axes of shape %s'
                         % (tuple(pattern), x.ndim, x.shape))
    return shape_ops.transpose(x, pattern)


def transpose(x):
    """Reverses the axes of ``x``."""
    x = as_tensor(x)
    return shape_ops.transpose(x, tuple(reversed(range(x.ndim))))


def expand_dims(x, axis=-1):
    """Adds an axis of size 1 at ``axis``."""
    return shape_ops.expand_dims(x, axis)


def squeeze(x, axis):
    """Removes axis ``axis`` (of size 1)."""
    return shape_ops.squeeze(x, axis)


def concatenate(tensors, axis=-1):
    """Concatenates tensors along ``axis``."""
    return shape_ops.concatenate(tensors, axis)
