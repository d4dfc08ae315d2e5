"""Elementwise math, comparisons, reductions, linear algebra and activations."""
import numbers

import numpy as np

from gpuk.graph import Tensor, as_tensor
from gpuk.ops import activation
from gpuk.ops import elementwise as ew
from gpuk.ops import linalg
from gpuk.ops import reduction

__all__ = [
    'abs', 'sign', 'square', 'sqrt', 'exp', 'log', 'sin', 'cos', 'tanh', 'sigmoid', 'softplus',
    'softsign', 'round', 'pow', 'maximum', 'minimum', 'equal', 'not_equal', 'greater',
    'greater_equal', 'less', 'less_equal', 'clip', 'sum', 'mean', 'max', 'min', 'prod', 'any', 'all',
    'var', 'std', 'logsumexp', 'cumsum', 'cumprod', 'argmax', 'argmin', 'dot', 'batch_dot',
    'relu', 'elu', 'hard_sigmoid', 'l2_normalize', 'in_top_k',
]


def _unary(name, doc):
    def op(x):
        return ew.unary(name, x)
    op.__name__ = name
    op.__doc__ = doc
    return op


abs = _unary('abs', 'Elementwise absolute value.')
sign = _unary('sign', 'Elementwise sign (-1, 0 or 1).')
square = _unary('square', 'Elementwise square.')
exp = _unary('exp', 'Elementwise exponential.')
log = _unary('log', 'Elementwise natural logarithm.')
sin = _unary('sin', 'Elementwise sine.')
cos = _unary('cos', 'Elementwise cosine.')
tanh = _unary('tanh', 'Elementwise hyperbolic tangent.')
sigmoid = _unary('sigmoid', 'Elementwise logistic sigmoid.')
softplus = _unary('softplus', 'Elementwise softplus, log(1 + exp(x)).')
softsign = _unary('softsign', 'Elementwise softsign, x / (1 + |x|).')
round = _unary('round', 'Elementwise rounding to the nearest integer, half to even.')


def _scalar(where, name, value):
    """A Python float from a number or a one-element array (Keras passes K.cast_to_floatx
    results); TypeError for tensors and anything else."""
    if isinstance(value, numbers.Real) and not isinstance(value, bool):
        return float(value)
    if isinstance(value, np.ndarray) and value.size == 1 and value.dtype.kind in 'iuf':
        return float(value.reshape(()))
    raise TypeError('%s: %s must be a number, got %r' % (where, name, value))


def sqrt(x):
    """Elementwise square root; negative inputs give 0 (and gradient 0) like Keras's
    tensorflow backend, which clips x to [0, inf) first."""
    x = as_tensor(x)
    return ew.unary('sqrt', ew.where(x < 0, 0, x))


def pow(x, a):
    """Elementwise power ``x ** a``."""
    return ew.binary('power', x, a)


def _binary(name, doc):
    def op(x, y):
        return ew.binary(name, x, y)
    op.__name__ = name
    op.__doc__ = doc
    return op


maximum = _binary('maximum', 'Elementwise maximum of two tensors.')
minimum = _binary('minimum', 'Elementwise minimum of two tensors.')
equal = _binary('equal', 'Elementwise equality (bool tensor).')
not_equal = _binary('not_equal', 'Elementwise inequality (bool tensor).')
greater = _binary('greater', 'Elementwise x > y (bool tensor).')
greater_equal = _binary('greater_equal', 'Elementwise x >= y (bool tensor).')
less = _binary('less', 'Elementwise x < y (bool tensor).')
less_equal = _binary('less_equal', 'Elementwise x <= y (bool tensor).')


def _clip_bound(value, default):
    if value is None:
        return default
    if isinstance(value, Tensor):
        return value
    array = np.asarray(value)
    if array.dtype.kind not in 'iuf':
        raise TypeError('clip: min_value and max_value must be numbers, tensors or None, got %r' % (value,))
    return float(array.reshape(())) if array.size == 1 else array


def clip(x, min_value, max_value):
    """Elementwise clipping to [min_value, max_value].

    # Arguments
        x: a tensor.
        min_value, max_value: numbers, tensors or None (unbounded). Numbers with
            max_value < min_value clip everything to min_value (like Keras).
    """
    low, high = _clip_bound(min_value, -np.inf), _clip_bound(max_value, np.inf)
    if isinstance(low, float) and isinstance(high, float):
        return ew.clip(x, low, high if high >= low else low)
    # Tensor (or array) bounds: TensorFlow's clip_by_value is min(max(x, low), high).
    x = as_tensor(x)
    return ew.binary('minimum', ew.binary('maximum', x, low), high)


def _reduction(kind, doc):
    def op(x, axis=None, keepdims=False):
        return reduction.reduce(kind, x, axis, keepdims)
    op.__name__ = kind
    op.__doc__ = doc + _REDUCTION_ARGS
    return op


_REDUCTION_ARGS = """

    # Arguments
        x: a tensor.
        axis: int, list of ints in [-rank(x), rank(x)), or None (all axes).
        keepdims: keep reduced axes with size 1.
    """

sum = _reduction('sum', 'Sum of the values along ``axis`` (bool inputs count as int64).')
mean = _reduction('mean', 'Mean along ``axis`` (bool inputs as floatx; integer means truncate like TF).')
max = _reduction('max', 'Maximum along ``axis``.')
min = _reduction('min', 'Minimum along ``axis``.')
prod = _reduction('prod', 'Product of the values along ``axis``.')
any = _reduction('any', 'Logical OR along ``axis`` (bool tensor).')
all = _reduction('all', 'Logical AND along ``axis`` (bool tensor).')


def var(x, axis=None, keepdims=False):
    return reduction.var(x, axis, keepdims)


var.__doc__ = 'Variance along ``axis`` (two-pass; bool/int inputs computed in floatx).' + _REDUCTION_ARGS


def std(x, axis=None, keepdims=False):
    return reduction.std(x, axis, keepdims)


std.__doc__ = 'Standard deviation along ``axis``, sqrt(var).' + _REDUCTION_ARGS


def logsumexp(x, axis=None, keepdims=False):
    return reduction.logsumexp(x, axis, keepdims)


logsumexp.__doc__ = 'log(sum(exp(x))) along ``axis``, computed stably (shifted by the max).' + _REDUCTION_ARGS


def cumsum(x, axis=0):
    """Cumulative sum of the values of ``x`` along ``axis`` (an int)."""
    return reduction.cumulative('sum', x, axis)


def cumprod(x, axis=0):
    """Cumulative product of the values of ``x`` along ``axis`` (an int); its gradient is
    exact also where x has zeros."""
    return reduction.cumulative('prod', x, axis)


def argmax(x, axis=-1):
    """Index (int64) of the largest value along ``axis``; ties give the first index."""
    return reduction.arg_reduce('argmax', x, axis)


def argmin(x, axis=-1):
    """Index (int64) of the smallest value along ``axis``; ties give the first index."""
    return reduction.arg_reduce('argmin', x, axis)


# --- linear algebra -------------------------------------------------------------------------

def dot(x, y):
    """Multiplies 2 tensors: nD with nD contracts the last axis of ``x`` with the
    second-to-last of ``y`` as Theano (and np.dot) do: ``(2, 3) . (4, 3, 5) -> (2, 4, 5)``.

    # Arguments
        x, y: tensors (sparse placeholders are dense in gpuk) of the same dtype.
    """
    return linalg.dot(x, y)


def batch_dot(x, y, axes=None):
    """Batchwise dot product (Keras 2.3.1 semantics).

    # Arguments
        x, y: tensors with ndim >= 2 and the same batch size.
        axes: None, int or (int, int): the axes of x and y contracted (never 0).
            None means (x.ndim - 1, y.ndim - 2), or (x.ndim - 1, 1) for a 2-D y.

    # Returns
        x's shape less the contracted axis followed by y's less batch and contracted
        axes; a rank-1 result is returned with shape (batch_size, 1).
    """
    return linalg.batch_dot(x, y, axes)


# --- activations ----------------------------------------------------------------------------

def relu(x, alpha=0., max_value=None, threshold=0.):
    """Rectified linear unit.

    ``max_value`` for x >= max_value, ``x`` for threshold <= x < max_value,
    ``alpha * (x - threshold)`` otherwise (Keras 2.3.1's tensorflow_backend formula).

    # Arguments
        x: a tensor.
        alpha: slope of the negative section.
        max_value: saturation value (None: no cap).
        threshold: threshold of the activation.
    """
    alpha = _scalar('relu', 'alpha', alpha)
    threshold = _scalar('relu', 'threshold', threshold)
    if max_value is not None:
        max_value = _scalar('relu', 'max_value', max_value)
    return activation.relu(x, alpha, max_value, threshold)


def elu(x, alpha=1.):
    """Exponential linear unit: x for x > 0, alpha * (exp(x) - 1) otherwise."""
    return activation.elu(x, _scalar('elu', 'alpha', alpha))


def hard_sigmoid(x):
    """Segment-wise linear approximation of sigmoid: clip(0.2 * x + 0.5, 0, 1)."""
    return activation.hard_sigmoid(x)


def l2_normalize(x, axis=None):
    """``x / sqrt(max(sum(x ** 2, axis), 1e-12))``.

    # Arguments
        x: a float tensor.
        axis: int, list of ints or None (all axes).
    """
    return activation.l2_normalize(x, axis)


def in_top_k(predictions, targets, k):
    """Whether ``targets[i]`` is among the top ``k`` classes of ``predictions[i]``.

    # Arguments
        predictions: tensor of shape (batch_size, classes).
        targets: 1-D int tensor of length batch_size.
        k: int (or scalar int tensor). Classes tied with the k-th largest value count.

    # Returns
        A 1-D bool tensor of length batch_size.
    """
    predictions, targets = as_tensor(predictions), as_tensor(targets)
    if np.dtype(targets.dtype).kind not in 'iu':
        raise TypeError('in_top_k: targets must be an int tensor, got dtype %s' % targets.dtype)
    if np.dtype(predictions.dtype).kind not in 'iuf':
        raise TypeError('in_top_k: predictions must be a numeric tensor, got dtype %s' % predictions.dtype)
    if isinstance(k, Tensor):
        if np.dtype(k.dtype).kind not in 'iu':
            raise TypeError('in_top_k: k must be an int or int tensor, got dtype %s' % k.dtype)
    elif isinstance(k, (int, np.integer)) and not isinstance(k, bool):
        if k < 0:   # (0: no class is in the top 0)
            raise ValueError('in_top_k: k must be >= 0, got %d' % k)
        k = np.int64(k)
    else:
        raise TypeError('in_top_k: k must be an int, got %r' % (k,))
    return activation.in_top_k(predictions, targets, k)
