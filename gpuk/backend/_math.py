"""Elementwise math, comparisons and reductions."""
from gpuk.graph import as_tensor
from gpuk.ops import elementwise as ew
from gpuk.ops.reduction import reduce

__all__ = [
    'abs', 'sign', 'square', 'sqrt', 'exp', 'log', 'sin', 'cos', 'tanh', 'sigmoid', 'softplus',
    'softsign', 'round', 'pow', 'maximum', 'minimum', 'equal', 'not_equal', 'greater',
    'greater_equal', 'less', 'less_equal', 'clip', 'sum', 'mean', 'max', 'min', 'prod', 'any', 'all',
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


def sqrt(x):
    """Elementwise square root; negative inputs give 0 like Keras's tensorflow backend."""
    x = as_tensor(x)
    return ew.unary('sqrt', ew.binary('maximum', x, 0))


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


def clip(x, min_value, max_value):
    """Elementwise clipping to [min_value, max_value] (max below min is raised to min)."""
    if max_value is not None and min_value is not None and max_value < min_value:
        max_value = min_value
    if max_value is None:
        max_value = float('inf')
    if min_value is None:
        min_value = -float('inf')
    return ew.clip(x, min_value, max_value)


def _reduction(kind, doc):
    def op(x, axis=None, keepdims=False):
        return reduce(kind, x, axis, keepdims)
    op.__name__ = kind
    op.__doc__ = doc + '\n\n    # Arguments\n        x: a tensor.\n        axis: int, list of ints or None (all axes).\n        keepdims: keep reduced axes with size 1.\n    '
    return op


sum = _reduction('sum', 'Sum of the values along ``axis``.')
mean = _reduction('mean', 'Mean of the values along ``axis``.')
max = _reduction('max', 'Maximum along ``axis``.')
min = _reduction('min', 'Minimum along ``axis``.')
prod = _reduction('prod', 'Product of the values along ``axis``.')
any = _reduction('any', 'Logical OR along ``axis`` (bool tensor).')
all = _reduction('all', 'Logical AND along ``axis`` (bool tensor).')
