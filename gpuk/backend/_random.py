"""Random tensors, randomly initialized variables and dropout.

Seeds follow Keras's TensorFlow backend: a given seed makes a freshly built graph draw the
same values; each run of a compiled function draws new ones; without a seed, one is taken
from NumPy's global generator (so ``np.random.seed`` makes a model reproducible).
"""
import numpy as np

from gpuk import graph
from gpuk.backend._core import variable
from gpuk.graph import Tensor, apply, as_tensor
from gpuk.ops import elementwise as ew
from gpuk.ops import random as rnd
from gpuk.ops.shape import shape as _shape_of

__all__ = ['random_normal', 'random_uniform', 'random_binomial', 'random_bernoulli',
           'truncated_normal', 'random_normal_variable', 'random_uniform_variable', 'dropout']


# --- argument checks ----------------------------------------------------------------------

def _dtype(dtype, kinds, where, allowed):
    """The dtype name (floatx for None), which must be of one of the numpy ``kinds``."""
    try:
        name = graph.dtype_name(dtype)
    except TypeError:
        raise TypeError('%s: dtype must be %s, got %r' % (where, allowed, dtype)) from None
    if np.dtype(name).kind not in kinds:
        raise TypeError('%s: dtype must be %s, got %s' % (where, allowed, name))
    return name


def _float_dtype(dtype, where):
    return _dtype(dtype, 'f', where, 'a float type (float16, float32, float64)')


def _number(value, arg, where):
    """``value`` as a finite Python float; TypeError naming ``arg`` for anything else."""
    if isinstance(value, (bool, np.bool_)) or not (
            isinstance(value, (int, float, np.integer, np.floating))
            or (isinstance(value, np.ndarray) and value.ndim == 0 and value.dtype.kind in 'iuf')):
        raise TypeError('%s: %s must be a number, got %r' % (where, arg, value))
    value = float(value)
    if not np.isfinite(value):
        raise ValueError('%s: %s must be finite, got %r' % (where, arg, value))
    return value


def _param(value, arg, where):
    """A Python float, or a scalar tensor (a symbolic parameter, applied in the graph)."""
    if isinstance(value, Tensor):
        if value.shape is not None and value.shape != ():
            raise ValueError('%s: %s must be a scalar, got a tensor of shape %s' % (where, arg, value.shape))
        return value
    return _number(value, arg, where)


def _non_negative(value, arg, where):
    if not isinstance(value, Tensor) and value < 0:
        raise ValueError('%s: %s must be >= 0, got %r' % (where, arg, value))


def _affine(z, scale, shift):
    """``z * scale + shift`` built in the graph, for parameters given as tensors."""
    if isinstance(scale, Tensor) or scale != 1.0:
        z = z * ew.cast(as_tensor(scale, z.dtype), z.dtype)
    if isinstance(shift, Tensor) or shift != 0.0:
        z = z + ew.cast(as_tensor(shift, z.dtype), z.dtype)
    return z


# --- random tensors -------------------------------------------------------------------------

def _normal(shape, mean, stddev, dtype, seed, truncate, where):
    dtype = _float_dtype(dtype, where)
    mean, stddev = _param(mean, 'mean', where), _param(stddev, 'stddev', where)
    _non_negative(stddev, 'stddev', where)
    if isinstance(mean, Tensor) or isinstance(stddev, Tensor):
        z = rnd.random_tensor(rnd.Normal, shape, dtype, seed, where, truncate=truncate)
        return _affine(z, stddev, mean)
    return rnd.random_tensor(rnd.Normal, shape, dtype, seed, where, mean=mean, stddev=stddev,
                             truncate=truncate)


def random_normal(shape, mean=0.0, stddev=1.0, dtype=None, seed=None):
    """A tensor of normally distributed values.

    # Arguments
        shape: tuple of ints and/or scalar int tensors (``K.shape(x)[0]``), or an int
            vector tensor (``K.shape(x)``).
        mean: mean of the distribution (a number or a scalar tensor).
        stddev: standard deviation (a number >= 0 or a scalar tensor).
        dtype: a float type (default floatx).
        seed: int; the same seed draws the same values in a freshly built graph.
    # Returns
        A tensor, drawn anew each time a function runs it.
    """
    return _normal(shape, mean, stddev, dtype, seed, False, 'random_normal')


def truncated_normal(shape, mean=0.0, stddev=1.0, dtype=None, seed=None):
    """Like ``random_normal``, but values more than 2 ``stddev`` from the mean are re-drawn.

    # Returns
        A tensor with every value within [mean - 2 stddev, mean + 2 stddev].
    """
    return _normal(shape, mean, stddev, dtype, seed, True, 'truncated_normal')


def random_uniform(shape, minval=0.0, maxval=1.0, dtype=None, seed=None):
    """A tensor of values drawn uniformly from [minval, maxval).

    # Arguments
        shape: as for ``random_normal``.
        minval, maxval: bounds (numbers, or scalar tensors for float dtypes).
        dtype: a float type (default floatx) or an integer type (integers in
            [minval, maxval), which must then be integral numbers with minval < maxval).
        seed: int.
    """
    where = 'random_uniform'
    dtype = _dtype(dtype, 'fiu', where, 'a float or integer type')
    minval, maxval = _param(minval, 'minval', where), _param(maxval, 'maxval', where)
    if np.dtype(dtype).kind in 'iu':
        for arg, value in (('minval', minval), ('maxval', maxval)):
            if isinstance(value, Tensor) or value != int(value):
                raise TypeError('%s: %s must be an integral number for dtype %s, got %r'
                                % (where, arg, dtype, value))
            info = np.iinfo(dtype)
            if not info.min <= value <= info.max + 1:
                raise ValueError('%s: %s=%r does not fit dtype %s' % (where, arg, value, dtype))
        if minval >= maxval:
            raise ValueError('%s: minval must be < maxval for integer dtypes, got minval=%r, maxval=%r'
                             % (where, minval, maxval))
        return rnd.random_tensor(rnd.Uniform, shape, dtype, seed, where, minval=int(minval),
                                 maxval=int(maxval))
    if isinstance(minval, Tensor) or isinstance(maxval, Tensor):
        u = rnd.random_tensor(rnd.Uniform, shape, dtype, seed, where)
        span = ew.binary('subtract', as_tensor(maxval, dtype), as_tensor(minval, dtype))
        return _affine(u, span, minval)
    if minval > maxval:
        raise ValueError('%s: minval must be <= maxval, got minval=%r, maxval=%r' % (where, minval, maxval))
    return rnd.random_tensor(rnd.Uniform, shape, dtype, seed, where, minval=minval, maxval=maxval)


def _bernoulli(shape, p, dtype, seed, where):
    dtype = _dtype(dtype, 'fiub', where, 'a float, integer or bool type')
    p = _param(p, 'p', where)
    if isinstance(p, Tensor):
        u = rnd.random_tensor(rnd.Uniform, shape, 'float32', seed, where)
        return ew.cast(u < ew.cast(p, 'float32'), dtype)
    if not 0.0 <= p <= 1.0:
        raise ValueError('%s: p must be in [0, 1], got %r' % (where, p))
    return rnd.random_tensor(rnd.Bernoulli, shape, dtype, seed, where, p=p)


def random_binomial(shape, p=0.0, dtype=None, seed=None):
    """A tensor of ones (with probability ``p``) and zeros.

    # Arguments
        shape: as for ``random_normal``.
        p: probability of a one, in [0, 1] (a number or a scalar tensor).
        dtype: output type (default floatx).
        seed: int.
    """
    return _bernoulli(shape, p, dtype, seed, 'random_binomial')


def random_bernoulli(shape, p=0.0, dtype=None, seed=None):
    """Same as ``random_binomial``: ones with probability ``p``, else zeros."""
    return _bernoulli(shape, p, dtype, seed, 'random_bernoulli')


# --- variables ------------------------------------------------------------------------------

def _variable_shape(shape, where):
    static, vector = rnd.sample_shape(shape, where)
    if vector is not None or static is None:
        raise ValueError('%s: shape must be fully known (ints), got %r' % (where, shape))
    return static


def _host_generator(seed, where):
    # Drawn on the host with NumPy, so a seed gives the same initial values on every device.
    return np.random.default_rng(rnd.normalize_seed(seed, where))


def random_normal_variable(shape, mean, scale, dtype=None, name=None, seed=None):
    """A variable of values drawn from a normal distribution.

    # Arguments
        shape: tuple of ints.
        mean: mean of the distribution.
        scale: standard deviation (>= 0).
        dtype: a float type (default floatx).
        name: optional variable name.
        seed: int; the same seed gives the same values.
    # Returns
        A variable.
    """
    where = 'random_normal_variable'
    dtype = _float_dtype(dtype, where)
    shape = _variable_shape(shape, where)
    mean, scale = _number(mean, 'mean', where), _number(scale, 'scale', where)
    _non_negative(scale, 'scale', where)
    value = _host_generator(seed, where).normal(mean, scale, size=shape)
    return variable(value, dtype=dtype, name=name)


def random_uniform_variable(shape, low, high, dtype=None, name=None, seed=None):
    """A variable of values drawn uniformly from [low, high).

    # Arguments
        shape: tuple of ints.
        low, high: bounds of the interval (low <= high).
        dtype: a float type (default floatx).
        name: optional variable name.
        seed: int; the same seed gives the same values.
    # Returns
        A variable.
    """
    where = 'random_uniform_variable'
    dtype = _float_dtype(dtype, where)
    shape = _variable_shape(shape, where)
    low, high = _number(low, 'low', where), _number(high, 'high', where)
    if low > high:
        raise ValueError('%s: low must be <= high, got low=%r, high=%r' % (where, low, high))
    value = _host_generator(seed, where).uniform(low, high, size=shape)
    return variable(value, dtype=dtype, name=name)


# --- dropout ----------------------------------------------------------------------------------

def _noise_shape_spec(x, noise_shape):
    """The shape of the keep/drop mask: x's own shape, or ``noise_shape`` with None entries
    taken from x."""
    if noise_shape is None:
        if x.shape is not None and None not in x.shape:
            return x.shape
        return _shape_of(x)
    if isinstance(noise_shape, Tensor):
        return noise_shape
    if isinstance(noise_shape, np.ndarray):
        noise_shape = tuple(noise_shape.tolist())
    if not isinstance(noise_shape, (tuple, list)):
        raise TypeError('dropout: noise_shape must be a tuple, a list, an int vector tensor or None, got %r'
                        % (noise_shape,))
    entries = list(noise_shape)
    if any(e is None for e in entries):
        if x.ndim is None or len(entries) != x.ndim:
            raise ValueError('dropout: noise_shape %r has None entries, so it needs one entry per axis of x '
                             '(shape %s)' % (tuple(noise_shape), x.shape))
        for i, e in enumerate(entries):
            if e is None:
                entries[i] = x.shape[i] if x.shape[i] is not None else _shape_of(x)[i]
    return entries


def _check_broadcasts(noise, x_shape, noise_shape):
    if noise is None or x_shape is None:
        return
    fits = len(noise) <= len(x_shape) and all(
        n is None or d is None or n in (1, d) for n, d in zip(reversed(noise), reversed(x_shape)))
    if not fits:
        raise ValueError('dropout: noise_shape %r (%s) does not broadcast to the shape %s of x'
                         % (noise_shape, noise, x_shape))


def dropout(x, level, noise_shape=None, seed=None):
    """Zeroes entries of ``x`` at random and scales the others by ``1 / (1 - level)``.

    # Arguments
        x: a float tensor.
        level: fraction of the entries dropped, in [0, 1).
        noise_shape: shape of the keep/drop mask, broadcast to x's shape; entries may be
            None (take x's dim) or scalar tensors (``K.shape(x)[0]``).
        seed: int.
    # Returns
        A tensor; the gradient flows through the kept entries, scaled the same way.
    """
    x = as_tensor(x)
    if np.dtype(x.dtype).kind != 'f':
        raise TypeError('dropout: x must be a float tensor, got dtype %s' % x.dtype)
    if isinstance(level, Tensor):
        raise TypeError('dropout: level must be a number in [0, 1), got a tensor')
    level = _number(level, 'level', 'dropout')
    if not 0.0 <= level < 1.0:
        raise ValueError('dropout: level must be in [0, 1), got %r' % (level,))
    static, vector = rnd.sample_shape(_noise_shape_spec(x, noise_shape), 'dropout')
    _check_broadcasts(static, x.shape, noise_shape)
    op = rnd.DropoutMask(static, x.dtype, rnd.normalize_seed(seed, 'dropout'), level)
    mask = apply(op) if vector is None else apply(op, vector)
    # The mask is an input of the multiply: its gradient reuses the mask drawn in the run.
    return x * mask
