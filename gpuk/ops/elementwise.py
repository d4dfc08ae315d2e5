"""Elementwise ops: unary math, binary math with broadcasting, comparisons, casts, where,
and the broadcasting helpers gradients use (sum_to_shape_of / broadcast_like)."""
import functools
import operator

import numpy as np

from gpuk import calls, config
from gpuk.graph import Constant, Meta, Tensor, apply, as_tensor, dtype_name
from gpuk.ops.base import Op, XpOp, broadcast_shapes


def _is_float(dtype):
    return np.dtype(dtype).kind == 'f'


# --- unary ---------------------------------------------------------------------------

def _sigmoid(xp, x):
    # 1 / (1 + exp(-x)): each step is accurate to an ulp in both tails (exp(-x) large gives a
    # small quotient with a small relative error), and where exp(-x) overflows the true value
    # is below the dtype's smallest normal number, so the 0 it gives is the rounded result.
    # float16 computes in float32 (its exp overflows from x < -11, where the result is still
    # representable). Four ufuncs: the logaddexp form cost 4x more, the bulk of an LSTM step.
    wide = x.astype(np.float32) if x.dtype == np.float16 else x
    e = xp.negative(wide)
    with np.errstate(over='ignore'):
        xp.exp(e, out=e)   # in place: one buffer for the whole sigmoid
    e += 1
    return xp.reciprocal(e, out=e).astype(x.dtype, copy=False)


def _softplus(xp, x):
    return xp.logaddexp(0, x).astype(x.dtype, copy=False)


def _softsign(xp, x):
    return x / (1 + xp.abs(x))


def _square(x):
    return x * x


# An op's forward, as the tables keep it: a binder that takes the array module and returns
# the function of the operands (what a fused step's NumPy twin calls per op and step, few
# Python calls deep: the array module's own function or a Python operator where there is one).
def _everywhere(function):
    """The forward of an op that is ``function`` on any array module (a Python operator)."""
    return lambda xp: function


def _xp_function(name):
    """The forward of an op that is the array module's function ``name``."""
    return lambda xp: getattr(xp, name)


def _with_xp(function):
    """The forward of an op written as ``function(xp, *operands)``."""
    return lambda xp: functools.partial(function, xp)


# name -> (forward binder (above), gradient(x, y, g) as graph tensors or None when not differentiable)
UNARY = {
    'negative': (_everywhere(operator.neg), lambda x, y, g: -g),
    'abs': (_xp_function('abs'), lambda x, y, g: g * unary('sign', x)),
    'sign': (_xp_function('sign'), None),
    'square': (_everywhere(_square), lambda x, y, g: g * x * 2),
    'sqrt': (_xp_function('sqrt'), lambda x, y, g: g * 0.5 / y),
    'exp': (_xp_function('exp'), lambda x, y, g: g * y),
    'log': (_xp_function('log'), lambda x, y, g: g / x),
    'log1p': (_xp_function('log1p'), lambda x, y, g: g / (x + 1)),
    'expm1': (_xp_function('expm1'), lambda x, y, g: g * (y + 1)),
    'sin': (_xp_function('sin'), lambda x, y, g: g * unary('cos', x)),
    'cos': (_xp_function('cos'), lambda x, y, g: -g * unary('sin', x)),
    'tanh': (_xp_function('tanh'), lambda x, y, g: g * (1 - y * y)),
    'sigmoid': (_with_xp(_sigmoid), lambda x, y, g: g * y * (1 - y)),
    'softplus': (_with_xp(_softplus), lambda x, y, g: g * unary('sigmoid', x)),
    'softsign': (_with_xp(_softsign), lambda x, y, g: g / unary('square', 1 + unary('abs', x))),
    'round': (_xp_function('round'), None),  # half to even, like TensorFlow
    'floor': (_xp_function('floor'), None),
    'ceil': (_xp_function('ceil'), None),
    'logical_not': (_xp_function('logical_not'), None),
    'isnan': (_xp_function('isnan'), None),
    'isinf': (_xp_function('isinf'), None),
}
_BOOL_RESULT = ('logical_not', 'isnan', 'isinf')

# The element expression of each unary op that fused elementwise kernels can compute
# (gpuk/fusion_elementwise.py, gpuk/kernels/fused_elementwise.cu): a C expression of the
# operand {0} in the compute type {T} (float for float16/32, double for float64), with
# NumPy's results, NaN and infinities included (to within the last bits of exp/log/tanh).
UNARY_C = {
    'negative': '-{0}',
    'abs': 'fabs({0})',
    'sign': '({0} > 0 ? ({T})1 : ({0} < 0 ? ({T})-1 : {0}))',
    'square': '{0} * {0}',
    'sqrt': 'sqrt({0})',
    'exp': 'exp({0})',
    'log': 'log({0})',
    'log1p': 'log1p({0})',
    'expm1': 'expm1({0})',
    'sin': 'sin({0})',
    'cos': 'cos({0})',
    'tanh': 'tanh({0})',
    'sigmoid': '({0} >= 0 ? 1 / (1 + exp(-{0})) : exp({0}) / (1 + exp({0})))',
    'softplus': '(({0} > 0 ? {0} : ({T})0) + log1p(exp(-fabs({0}))))',
    'softsign': '{0} / (1 + fabs({0}))',
    'floor': 'floor({0})',
    'ceil': 'ceil({0})',
    'logical_not': '!{0}',
}
_FLOAT_ONLY = ('sqrt', 'exp', 'log', 'log1p', 'expm1', 'sin', 'cos', 'tanh', 'sigmoid',
               'softplus', 'softsign')


class Unary(Op):
    def __init__(self, name):
        self.name = name
        self.differentiable = UNARY[name][1] is not None

    def infer(self, x):
        if self.name == 'logical_not' and x.dtype != 'bool':   # ~x: TensorFlow's logical not
            raise TypeError('logical_not: ~x needs a bool tensor, got dtype %s (compare it first, '
                            'e.g. K.equal(x, 0))' % x.dtype)
        if self.name == 'negative' and x.dtype == 'bool':
            raise TypeError('negative: -x of a bool tensor is undefined; use ~x, or K.cast it first')
        if self.name in _BOOL_RESULT:
            return Meta(x.shape, 'bool')
        if self.name in _FLOAT_ONLY and not _is_float(x.dtype):
            raise TypeError('%s: expected a float tensor, got dtype %s' % (self.name, x.dtype))
        return Meta(x.shape, x.dtype)

    def forward(self, impl, x):
        return UNARY[self.name][0](impl.xp)(x)

    def bound_forward(self, impl):
        """``forward`` with ``impl`` bound, as few Python calls deep as possible (a fused
        step's NumPy twin calls it per op and step): the same function, so the same results."""
        return UNARY[self.name][0](impl.xp)

    def c_expression(self):
        """The element expression for fused kernels, or None (gpuk/fusion_elementwise.py)."""
        return UNARY_C.get(self.name)

    def grad(self, inputs, outputs, output_grads):
        rule = UNARY[self.name][1]
        if rule is None:
            return [None]
        return [rule(inputs[0], outputs[0], output_grads[0])]


def unary(name, x):
    if name not in UNARY:
        raise ValueError('unary: unknown op %r' % (name,))
    return apply(Unary(name), as_tensor(x))


# --- binary --------------------------------------------------------------------------

# name -> forward binder (see UNARY)
BINARY = {
    'add': _everywhere(operator.add),
    'subtract': _everywhere(operator.sub),
    'multiply': _everywhere(operator.mul),
    'divide': _everywhere(operator.truediv),   # Binary.forward casts int / int to floatx
    'floor_divide': _everywhere(operator.floordiv),
    'mod': _everywhere(operator.mod),
    'power': _xp_function('power'),
    'maximum': _xp_function('maximum'),
    'minimum': _xp_function('minimum'),
    'less': _everywhere(operator.lt),
    'less_equal': _everywhere(operator.le),
    'greater': _everywhere(operator.gt),
    'greater_equal': _everywhere(operator.ge),
    'equal': _everywhere(operator.eq),
    'not_equal': _everywhere(operator.ne),
    'logical_and': _xp_function('logical_and'),
    'logical_or': _xp_function('logical_or'),
    'logical_xor': _xp_function('logical_xor'),
}
# Element expressions of the binary ops fused kernels compute (see UNARY_C); maximum and
# minimum propagate NaN from either side, like NumPy.
BINARY_C = {
    'add': '{0} + {1}',
    'subtract': '{0} - {1}',
    'multiply': '{0} * {1}',
    'divide': '{0} / {1}',
    'power': 'pow({0}, {1})',
    'maximum': '(({0} > {1} || {0} != {0}) ? {0} : {1})',
    'minimum': '(({0} < {1} || {0} != {0}) ? {0} : {1})',
    'less': '{0} < {1}',
    'less_equal': '{0} <= {1}',
    'greater': '{0} > {1}',
    'greater_equal': '{0} >= {1}',
    'equal': '{0} == {1}',
    'not_equal': '{0} != {1}',
    'logical_and': '({0} && {1})',
    'logical_or': '({0} || {1})',
    'logical_xor': '(!{0} != !{1})',
}
_COMPARISONS = ('less', 'less_equal', 'greater', 'greater_equal', 'equal', 'not_equal',
                'logical_and', 'logical_or', 'logical_xor')


def _binary_grads(name, a, b, y, g):
    """Gradients of ``y = name(a, b)`` for the incoming gradient ``g``, before unbroadcasting."""
    if name == 'add':
        return g, g
    if name == 'subtract':
        return g, -g
    if name == 'multiply':
        return g * b, g * a
    if name == 'divide':
        return g / b, -g * y / b
    if name == 'power':
        safe_a = where(a > 0, a, ones_like(a))
        return g * b * binary('power', a, b - 1), g * y * unary('log', safe_a) * cast(a > 0, y.dtype)
    if name == 'maximum':  # ties send the gradient to the first input, like TensorFlow
        return g * cast(a >= b, g.dtype), g * cast(a < b, g.dtype)
    if name == 'minimum':
        return g * cast(a <= b, g.dtype), g * cast(a > b, g.dtype)
    if name == 'mod':
        return g, -g * unary('floor', a / b)
    return None, None


class Binary(XpOp):
    def __init__(self, name):
        self.name = name
        self.differentiable = name not in _COMPARISONS and name != 'floor_divide'

    def infer(self, a, b):
        shape = broadcast_shapes(a.shape, b.shape, self.name)
        if self.name.startswith('logical_') and (a.dtype != 'bool' or b.dtype != 'bool'):
            raise TypeError('%s: &, | and ^ need bool tensors (TensorFlow\'s logical ops), got dtypes '
                            '%s and %s' % (self.name, a.dtype, b.dtype))
        if self.name in _COMPARISONS:
            return Meta(shape, 'bool')
        dtype = np.result_type(a.dtype, b.dtype).name
        if self.name == 'divide' and not _is_float(dtype):
            dtype = config.floatx()
        return Meta(shape, dtype)

    def compute(self, xp, a, b, out=None):
        if self.name == 'divide' and a.dtype.kind != 'f' and b.dtype.kind != 'f':   # int / int: floatx
            result = xp.divide(a, b)
            return result.astype(config.floatx()) if result.dtype.kind == 'f' else result
        if out is None:
            return BINARY[self.name](xp)(a, b)
        return getattr(xp, self.name)(a, b, out=out)   # (every BINARY name is also a ufunc's)

    def c_expression(self):
        return BINARY_C.get(self.name)

    def bound_forward(self, impl):
        """``forward`` with ``impl`` bound (see Unary.bound_forward)."""
        if self.name == 'divide':   # int / int becomes floatx: the full computation
            return functools.partial(self.compute, impl.xp)
        return BINARY[self.name](impl.xp)

    def grad(self, inputs, outputs, output_grads):
        a, b = inputs
        if not (_is_float(a.dtype) or _is_float(b.dtype)):
            return [None, None]
        ga, gb = _binary_grads(self.name, a, b, outputs[0], output_grads[0])
        return [None if ga is None else sum_to_shape_of(ga, a),
                None if gb is None else sum_to_shape_of(gb, b)]


def _operand_dtype(value, partner):
    """The dtype a non-tensor operand takes next to tensor ``partner`` (TensorFlow converts
    Python numbers and arrays to the tensor's dtype)."""
    kind = np.asarray(value).dtype.kind
    if kind == 'f' and not _is_float(partner.dtype) and partner.dtype != 'bool':
        return config.floatx()
    if kind == 'b' and partner.dtype != 'bool':
        return partner.dtype
    return partner.dtype


def _operand(name, value, partner):
    """A non-tensor operand as a tensor; its errors name the op when no K function does
    (``x + 'a'`` is add's error, as a shape clash is)."""
    try:
        return as_tensor(value, _operand_dtype(value, partner))
    except (TypeError, ValueError) as error:
        if calls.current() is not None:   # the K function called prefixes its own name
            raise
        raise calls.named(error, name) from None


def binary(name, a, b):
    """``name(a, b)`` with NumPy broadcasting; non-tensor operands take the tensor's dtype."""
    if name not in BINARY:
        raise ValueError('binary: unknown op %r' % (name,))
    if not isinstance(a, Tensor) and isinstance(b, Tensor):
        a = _operand(name, a, b)
    elif not isinstance(b, Tensor) and isinstance(a, Tensor):
        b = _operand(name, b, a)
    a, b = as_tensor(a), as_tensor(b)
    # An integer tensor meeting a float operand computes in that float type (not float64).
    if _is_float(a.dtype) != _is_float(b.dtype):
        float_dtype = a.dtype if _is_float(a.dtype) else b.dtype
        a, b = cast(a, float_dtype), cast(b, float_dtype)
    return apply(Binary(name), a, b)


# --- casts, where, clip ------------------------------------------------------------------

class Cast(XpOp):
    def __init__(self, dtype):
        self.dtype = dtype

    def infer(self, x):
        return Meta(x.shape, self.dtype)

    def compute(self, xp, x, out=None):
        if out is None or x.dtype == out.dtype:   # (the same dtype: x itself, no copy)
            return x.astype(self.dtype, copy=False)
        xp.copyto(out, x, casting='unsafe')       # what astype does, into the step's buffer
        return out

    def c_expression(self):
        return '{0}'   # the operand is converted to the target's compute type, then rounded

    def grad(self, inputs, outputs, output_grads):
        if not (_is_float(inputs[0].dtype) and _is_float(self.dtype)):
            return [None]
        return [cast(output_grads[0], inputs[0].dtype)]


def cast(x, dtype):
    x = as_tensor(x)
    dtype = dtype_name(dtype)
    if x.dtype == dtype:
        return x
    return apply(Cast(dtype), x)


class Where(XpOp):
    def infer(self, condition, a, b):
        shape = broadcast_shapes(broadcast_shapes(condition.shape, a.shape, 'switch'), b.shape, 'switch')
        return Meta(shape, np.result_type(a.dtype, b.dtype).name)

    def compute(self, xp, condition, a, b, out=None):
        if out is None or condition.dtype != np.bool_:   # (copyto's where= takes bools only)
            return xp.where(condition, a, b)
        # xp.where has no out=: b everywhere, then a where the condition holds (two copies
        # into the step's buffer, which has where's result shape and dtype)
        xp.copyto(out, b)
        xp.copyto(out, a, where=condition)
        return out

    def c_expression(self):
        return '({0} ? {1} : {2})'   # the condition arrives as a number of the branches' type

    def grad(self, inputs, outputs, output_grads):
        condition, a, b = inputs
        g = output_grads[0]
        zeros = Constant(np.zeros((), dtype=g.dtype))
        return [None, sum_to_shape_of(where(condition, g, zeros), a),
                sum_to_shape_of(where(condition, zeros, g), b)]


def where(condition, a, b):
    """Elementwise ``a`` where ``condition`` else ``b`` (all broadcast together)."""
    a_t = a if isinstance(a, Tensor) else as_tensor(a, b.dtype if isinstance(b, Tensor) else None)
    b_t = b if isinstance(b, Tensor) else as_tensor(b, a_t.dtype)
    return apply(Where(), cast(condition, 'bool'), a_t, b_t)


def clip(x, low, high):
    x = as_tensor(x)
    return apply(Clip(low, high), x)


class Clip(Op):
    def __init__(self, low, high):
        self.low, self.high = low, high

    def infer(self, x):
        return Meta(x.shape, x.dtype)

    def forward(self, impl, x):
        return impl.xp.clip(x, self.low, self.high).astype(x.dtype, copy=False)

    def c_expression(self):
        """clip with NaN kept; the bounds are Python numbers, written in the compute type."""
        if not all(isinstance(v, (int, float)) and np.isfinite(v) for v in (self.low, self.high)):
            return None
        return '({0} < ({T})%r ? ({T})%r : ({0} > ({T})%r ? ({T})%r : {0}))' % (
            float(self.low), float(self.low), float(self.high), float(self.high))

    def grad(self, inputs, outputs, output_grads):
        x = inputs[0]
        inside = binary('logical_and', x >= self.low, x <= self.high)
        return [output_grads[0] * cast(inside, output_grads[0].dtype)]


# --- broadcasting helpers for gradients ------------------------------------------------

class SumToShapeOf(XpOp):
    """Sums ``g`` over the axes along which ``like`` was broadcast to reach g's shape."""
    shape_only_inputs = (1,)

    def infer(self, g, like):
        return Meta(like.shape, g.dtype)

    def compute(self, xp, g, like, out=None):
        target = like.shape
        if g.shape == target:   # nothing was broadcast (the common case)
            return g
        extra = g.ndim - len(target)
        axes = tuple(range(extra)) + tuple(
            extra + i for i, d in enumerate(target) if d == 1 and g.shape[extra + i] != 1)
        if not axes:
            return g.reshape(target)
        if out is not None:   # the sum written through a view of the buffer with g's rank
            xp.sum(g, axis=axes, keepdims=True, out=out.reshape((1,) * extra + target))
            return out
        return g.sum(axis=axes, keepdims=True).reshape(target)

    def grad(self, inputs, outputs, output_grads):
        return [broadcast_like(output_grads[0], inputs[0]), None]


class BroadcastLike(Op):
    """Broadcasts ``x`` to the (runtime) shape of ``like``."""
    shape_only_inputs = (1,)

    def infer(self, x, like):
        return Meta(broadcast_shapes(x.shape, like.shape, 'broadcast_like'), x.dtype)

    def forward(self, impl, x, like):
        return impl.xp.broadcast_to(x, like.shape)

    def grad(self, inputs, outputs, output_grads):
        return [sum_to_shape_of(output_grads[0], inputs[0]), None]


def _same_static_shape(a, b):
    return a.shape is not None and a.shape == b.shape and None not in a.shape


def sum_to_shape_of(g, like):
    """``g`` reduced to ``like``'s shape (the gradient of a broadcast)."""
    if _same_static_shape(g, like):
        return g
    return apply(SumToShapeOf(), g, like)


def broadcast_like(x, like):
    if _same_static_shape(x, like):
        return x
    return apply(BroadcastLike(), x, like)


class FillLike(XpOp):
    """An array of ``like``'s runtime shape filled with ``value``."""

    def __init__(self, value, dtype):
        self.value, self.dtype = value, dtype

    def infer(self, like):
        return Meta(like.shape, self.dtype)

    def compute(self, xp, like, out=None):
        if out is None:
            return xp.full(like.shape, self.value, dtype=self.dtype)
        out.fill(self.value)
        return out

    differentiable = False


_MAX_FILLED_CONSTANT = 4096


def _filled_like(value, x, dtype):
    """A tensor like ``x`` filled with ``value``. Small static shapes give a constant, so the
    result does not make x's inputs necessary (a scalar loss's gradient seed relies on this);
    larger ones are filled at run time rather than stored."""
    x = as_tensor(x)
    dtype = dtype_name(dtype) if dtype else x.dtype
    if x.shape is not None and None not in x.shape and np.prod(x.shape) <= _MAX_FILLED_CONSTANT:
        return Constant(np.full(x.shape, value, dtype=dtype))
    return apply(FillLike(value, dtype), x)


def zeros_like(x, dtype=None):
    return _filled_like(0, x, dtype)


def ones_like(x, dtype=None):
    return _filled_like(1, x, dtype)
