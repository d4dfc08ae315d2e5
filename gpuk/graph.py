"""The symbolic graph: tensors, leaves (placeholders, variables, constants) and op nodes.

Every tensor knows its static shape (a tuple with None for unknown dims) and dtype (a numpy
dtype name). Op nodes are made by ``apply(op, *inputs)``; ops live in gpuk/ops and follow the
contract in ops/base.py. Python operators on tensors build nodes through gpuk.ops.
"""
import collections
import contextlib
import itertools

import numpy as np

from gpuk import calls, config

Meta = collections.namedtuple('Meta', 'shape dtype')

_uid_counters = collections.defaultdict(int)
_used_names = set()
_next_suffix = {}  # scoped name -> the first suffix not yet known to be taken
_scope_stack = []


# --- names ---------------------------------------------------------------------------

def get_uid(prefix=''):
    """A per-prefix counter starting at 1, like Keras's K.get_uid."""
    _uid_counters[prefix] += 1
    return _uid_counters[prefix]


def reset_uids():
    """Resets the counters behind get_uid."""
    _uid_counters.clear()


def forget_names():
    """Forgets every name handed out (clear_session)."""
    _used_names.clear()
    _next_suffix.clear()


@contextlib.contextmanager
def name_scope(name):
    """Context manager prefixing the names of variables made inside it with ``name/``."""
    if not isinstance(name, str):
        raise TypeError('name_scope: name must be a string, got %r' % (name,))
    _scope_stack.append(name.rstrip('/'))
    try:
        yield '/'.join(_scope_stack) + '/'
    finally:
        _scope_stack.pop()


def unique_name(base):
    """``scope/base``, with ``_1``, ``_2``... appended when that name was already used."""
    scoped = '/'.join(_scope_stack + [base]) if _scope_stack else base
    name = scoped
    # the search for a free suffix resumes where it last stopped for this name (graphs make
    # thousands of 'Const' tensors: counting from 1 each time was quadratic)
    start = _next_suffix.get(scoped, 1)
    for n in itertools.count(start):
        if name not in _used_names:
            break
        name = '%s_%d' % (scoped, n)
        _next_suffix[scoped] = n + 1
    _used_names.add(name)
    return name


# --- dtypes and shapes ---------------------------------------------------------------

# bool, ints and floats: what tensors hold. Complex numbers have no order (relu, max, clip...
# would return meaningless numbers), strings and objects no arithmetic.
_TENSOR_KINDS = 'biuf'


def dtype_name(dtype, where='dtype'):
    """Normalizes a dtype-like (None -> floatx) to a numpy dtype name."""
    if dtype is None:
        return config.floatx()
    if isinstance(dtype, str) and dtype.startswith('float') and dtype not in ('float16', 'float32', 'float64'):
        raise TypeError('%s: unsupported float type %r' % (where, dtype))
    try:
        dt = np.dtype(dtype)
    except TypeError:
        raise TypeError('%s: expected a numpy dtype or dtype name, got %r' % (where, dtype)) from None
    if dt.kind not in _TENSOR_KINDS:
        raise TypeError('%s: dtype must be bool, an int or a float type, got %s' % (where, dt.name))
    return dt.name


def checked_array(value, dtype, where, argument='value'):
    """A host NumPy array of ``value`` for a tensor, cast to ``dtype`` (None: value's own
    dtype). Refuses None, strings, objects and complex numbers, floats an int or bool dtype
    cannot hold exactly (TensorFlow refuses K.variable(1.5, dtype='int32')) and numbers outside
    an int dtype's range (K.variable(300, dtype='uint8'))."""
    where = where + ': ' if where else ''  # None: the K function calling us prefixes its name
    if value is None:
        raise TypeError('%s%s must be a number, a list or an array, got None' % (where, argument))
    if isinstance(value, Tensor):
        raise TypeError('%s%s must be a number, a list or an array, got tensor %r: evaluate it first '
                        '(K.eval), or assign it where a K.function runs (K.update)' % (where, argument, value.name))
    from gpuk import device
    try:
        array = np.asarray(device.to_host(value))
    except (ValueError, TypeError) as error:  # e.g. ragged nested lists
        raise ValueError('%s%s cannot be read as an array (%s)' % (where, argument, error)) from None
    if array.dtype == object and all(_is_real_number(v) for v in array.flat):
        # numbers in an object array (pandas' .values), as TensorFlow takes them: as NumPy infers
        array = np.array(array.tolist()) if array.size else np.zeros(array.shape)
    if array.dtype.kind not in _TENSOR_KINDS:
        raise TypeError('%s%s must hold numbers (bool, int or float), got dtype %s%s'
                        % (where, argument, array.dtype, _example(array)))
    if dtype is None:
        return array
    target = np.dtype(dtype)
    if target.kind in 'biu' and array.dtype.kind == 'f' and array.size:
        finite = np.isfinite(array)
        if not finite.all() or (array != np.round(array)).any():
            bad = array[~finite | (array != np.round(array))].flat[0]
            raise TypeError('%s%s holds %r, which dtype %s cannot hold; round or cast it first'
                            % (where, argument, float(bad), target.name))
    if target.kind in 'iu' and array.dtype.kind in 'iuf' and array.size and \
            not np.can_cast(array.dtype, target, 'safe'):
        # astype would wrap (2**40 -> 0 in int32, -1 -> 255 in uint8): refuse, as TensorFlow does
        # as Python numbers, compared exactly: float64(2**63) > int64's max (2**63 - 1, which
        # rounds to 2.0**63 in float64) is False in NumPy
        info = np.iinfo(target)
        low, high = array.min().item(), array.max().item()
        if low < info.min or high > info.max:
            bad = low if low < info.min else high
            raise TypeError('%s%s holds %r, outside the range of dtype %s [%d, %d]'
                            % (where, argument, bad, target.name, info.min, info.max))
    return array.astype(target, copy=False)


def _is_real_number(value):
    return isinstance(value, (bool, int, float, np.bool_, np.integer, np.floating))


def _example(array):
    """' (e.g. <an element>)': of an object array, its first element that is not a number."""
    if array.dtype == object:
        return next((' (e.g. %r)' % (v,) for v in array.flat if not _is_real_number(v)), '')
    return ' (e.g. %r)' % (array.flat[0],) if array.size else ''


def owned_array(value, dtype, where, argument='value'):
    """``checked_array`` on the current device, never sharing memory with ``value``: later
    changes to the caller's array do not reach gpuk."""
    from gpuk import device
    array = checked_array(value, dtype, where, argument)
    if device.xp() is np:
        shared = isinstance(value, np.ndarray) and np.may_share_memory(array, value)
        return array.copy() if shared else array
    result = device.to_device(array)
    return result.copy() if result is value else result


def normalize_shape(shape, where):
    """A tuple of ints/None; raises ValueError naming ``where`` otherwise."""
    if shape is None:
        return None
    if isinstance(shape, (int, np.integer)):
        shape = (shape,)
    try:
        dims = tuple(shape)
    except TypeError:
        raise TypeError('%s: shape must be a tuple of ints or None, got %r' % (where, shape)) from None
    out = []
    for d in dims:
        if d is None:
            out.append(None)
        elif isinstance(d, (int, np.integer)) and not isinstance(d, bool) and d >= 0:
            out.append(int(d))
        else:
            raise ValueError('%s: shape entries must be non-negative ints or None, got %r' % (where, shape))
    return tuple(out)


# --- tensors -------------------------------------------------------------------------

def _ops():
    # Late import: ops build on this module, operators on Tensor build ops.
    from gpuk.ops import operators
    return operators


class Tensor:
    """A symbolic value: output ``index`` of ``node`` (None for leaves)."""

    # Attributes Keras reads on tensors; instances may override them (Keras assigns them).
    # No class-level ``_uses_learning_phase``: like a tf.Tensor, a tensor has it only once
    # Keras (or K.in_train_phase) sets it. Keras 2.3.1's TimeDistributed step
    # (wrappers.py:221-225) reads an undefined global when an output has the attribute.
    _is_placeholder = False
    is_sparse = False
    __array_ufunc__ = None  # numpy defers to our reflected operators

    def __init__(self, node, index, shape, dtype, name=None):
        self.node = node
        self.index = index
        self._shape = shape
        self.dtype = dtype
        self.name = name or unique_name(type(node.op).__name__ if node is not None else 'tensor')

    @property
    def meta(self):
        return Meta(self._shape, self.dtype)

    @property
    def shape(self):
        """The static shape (None for unknown dims)."""
        return self._shape

    @property
    def ndim(self):
        return None if self._shape is None else len(self._shape)

    def __repr__(self):
        return '<gpuk.Tensor %r shape=%s dtype=%s>' % (self.name, self._shape, self.dtype)

    # Identity semantics: tensors are dict keys (Keras relies on that).
    __hash__ = object.__hash__

    def __eq__(self, other):
        return self is other

    def __ne__(self, other):
        return self is not other

    def __bool__(self):
        raise TypeError('Tensor %r has no truth value while building a graph; use K.switch' % self.name)

    def __iter__(self):
        raise TypeError('Tensor %r is not iterable; index it or use K.map_fn' % self.name)

    def __len__(self):
        raise TypeError('len() of Tensor %r is undefined; use K.shape or K.int_shape' % self.name)

    def __getitem__(self, key):
        return _ops().getitem(self, key)

    def __neg__(self):
        return _ops().unary('negative', self)

    def __pos__(self):
        return self

    def __abs__(self):
        return _ops().unary('abs', self)

    def __invert__(self):
        return _ops().unary('logical_not', self)


def _binary_method(name, reflected=False):
    if reflected:
        def method(self, other):
            return _ops().binary(name, other, self)
    else:
        def method(self, other):
            return _ops().binary(name, self, other)
    return method


for _py, _op in [('add', 'add'), ('sub', 'subtract'), ('mul', 'multiply'),
                 ('truediv', 'divide'), ('floordiv', 'floor_divide'), ('mod', 'mod'),
                 ('pow', 'power'), ('and', 'logical_and'), ('or', 'logical_or'),
                 ('xor', 'logical_xor'), ('matmul', 'matmul')]:
    setattr(Tensor, '__%s__' % _py, _binary_method(_op))
    setattr(Tensor, '__r%s__' % _py, _binary_method(_op, reflected=True))
for _py, _op in [('lt', 'less'), ('le', 'less_equal'), ('gt', 'greater'), ('ge', 'greater_equal')]:
    setattr(Tensor, '__%s__' % _py, _binary_method(_op))


class Placeholder(Tensor):
    """An input fed when a function runs."""
    _is_placeholder = True

    def __init__(self, shape, dtype, name=None, sparse=False):
        super().__init__(None, 0, shape, dtype, unique_name(name or 'placeholder'))
        self.is_sparse = bool(sparse)


class Constant(Tensor):
    """A fixed host value (a NumPy array); copied to the device once, when first used."""

    def __init__(self, value, dtype=None, name=None, where=None):
        array = checked_array(value, dtype, where)
        if isinstance(value, np.ndarray) and np.may_share_memory(array, value):
            array = array.copy()  # the caller's array may change later
        array.flags.writeable = False
        value = array
        super().__init__(None, 0, value.shape, value.dtype.name, unique_name(name or 'Const'))
        self.value = value
        self._device_value = None


class Variable(Tensor):
    """A stateful leaf; its value is an array of the current device."""

    def __init__(self, value, dtype, name=None, constraint=None, where='variable'):
        value = owned_array(value, dtype, where)
        super().__init__(None, 0, tuple(value.shape), value.dtype.name, unique_name(name or 'Variable'))
        self.value = value
        self.constraint = constraint
        # Trainable like a tf.Variable: Keras 2.3.1's Layer.__setattr__ (base_layer.py:1232)
        # tracks a variable set as an attribute as trainable only when it says so.
        self.trainable = True
        self._keras_shape = tuple(value.shape)
        self._uses_learning_phase = False

    def checked_value(self, new_value, where='set_value'):
        """``new_value`` as this variable's next value (a copy, of its dtype and shape);
        raises, changing nothing, when it does not fit."""
        array = owned_array(new_value, self.dtype, where)
        if tuple(array.shape) != self._shape:
            raise ValueError('%s: value of shape %s does not fit variable %r of shape %s'
                             % (where, tuple(array.shape), self.name, self._shape))
        return array

    def assign(self, new_value, where='set_value'):
        """Replaces the value; shape must match, dtype is cast to the variable's."""
        self.value = self.checked_value(new_value, where)


def is_leaf(tensor):
    return tensor.node is None


class Node:
    """One application of an op to input tensors, with its output tensors."""
    __slots__ = ('op', 'inputs', 'outputs', 'k_call', 'control_updates')

    def __init__(self, op, inputs):
        self.op = op
        self.inputs = inputs
        self.outputs = ()
        self.k_call = calls.current()  # the K call that built it, named by run-time errors
        # (variable, new value) of the updates whose new values it reads in place of the
        # variable (K.control_dependencies): a function computing it applies them too
        self.control_updates = ()


def as_tensor(value, dtype=None):
    """``value`` if it is a Tensor, else a Constant of it (dtype None keeps NumPy's inference,
    except that Python floats become floatx)."""
    if isinstance(value, Tensor):
        return value
    if isinstance(value, (list, tuple)) and _holds_tensor(value):
        return _pack(value, dtype)
    if dtype is None:
        array = np.asarray(value)
        if array.dtype == np.float64 and not isinstance(value, np.ndarray) and not isinstance(value, np.generic):
            array = array.astype(config.floatx())
        return Constant(array)
    return Constant(value, dtype_name(dtype))


def _holds_tensor(values):
    return any(isinstance(v, Tensor) or (isinstance(v, (list, tuple)) and _holds_tensor(v))
               for v in values)


def _pack(values, dtype):
    """A list mixing tensors and numbers stacked along a new axis 0, as TensorFlow's
    convert_to_tensor does (Keras 2.3.1's BatchNormalization calls
    ``K.prod([K.shape(x)[axis] ...])``). Numbers take the dtype of the tensors."""
    from gpuk.ops import elementwise, shape as shape_ops
    if not values:
        raise ValueError('as_tensor: cannot stack an empty list')
    if dtype is None:
        first = next(v for v in values if isinstance(v, Tensor) or isinstance(v, (list, tuple)))
        dtype = as_tensor(first).dtype
    items = [as_tensor(v, dtype) for v in values]
    items = [t if t.dtype == dtype_name(dtype) else elementwise.cast(t, dtype) for t in items]
    shapes = {t.shape for t in items}
    if len(shapes) > 1 and any(None not in s for s in shapes) and len({len(s) for s in shapes}) > 1:
        raise ValueError('as_tensor: cannot stack tensors of shapes %s' % sorted(map(str, shapes)))
    expanded = [shape_ops.expand_dims(t, 0) for t in items]
    return expanded[0] if len(expanded) == 1 else shape_ops.concatenate(expanded, 0)


_updated_reads = []


@contextlib.contextmanager
def reading_updated(updated):
    """While active, nodes made by ``apply`` read ``updated[v]`` in place of variable ``v``
    (K.control_dependencies on updates), and record that update (Node.control_updates)."""
    merged = dict(_updated_reads[-1]) if _updated_reads else {}
    merged.update(updated)
    _updated_reads.append(merged)
    try:
        yield
    finally:
        _updated_reads.pop()


def apply(op, *inputs):
    """Adds a node applying ``op`` to ``inputs``; returns its output (a tuple if several)."""
    inputs = tuple(as_tensor(x) for x in inputs)
    control_updates = ()
    if _updated_reads and _updated_reads[-1]:
        updated = _updated_reads[-1]
        control_updates = tuple((t, updated[t]) for t in inputs if t in updated)
        inputs = tuple(updated.get(t, t) for t in inputs)
    metas = op.infer(*[t.meta for t in inputs])
    if isinstance(metas, Meta):
        metas = (metas,)
    node = Node(op, inputs)
    node.control_updates = control_updates
    node.outputs = tuple(Tensor(node, i, shape, dtype) for i, (shape, dtype) in enumerate(metas))
    return node.outputs[0] if len(node.outputs) == 1 else node.outputs


# --- traversal and static evaluation -----------------------------------------------------

def topological_nodes(outputs, stop_at=()):
    """The nodes needed to compute ``outputs``, inputs before users. Traversal does not go
    past tensors in ``stop_at`` (a set)."""
    order, visited = [], set()
    stack = [(t.node, False) for t in outputs if t.node is not None and t not in stop_at]
    while stack:
        node, expanded = stack.pop()
        if expanded:
            order.append(node)
            continue
        if id(node) in visited:
            continue
        visited.add(id(node))
        stack.append((node, True))
        for t in node.inputs:
            if t.node is not None and id(t.node) not in visited and t not in stop_at:
                stack.append((t.node, False))
    return order


def leaves(outputs, stop_at=()):
    """The leaf tensors (placeholders, variables, constants) ``outputs`` depend on, plus any
    tensor of ``stop_at`` that is reached."""
    found, seen = [], set()

    def visit(t):
        if id(t) not in seen:
            seen.add(id(t))
            found.append(t)
    for t in outputs:
        if t.node is None or t in stop_at:
            visit(t)
    for node in topological_nodes(outputs, stop_at):
        for t in node.inputs:
            if t.node is None or t in stop_at:
                visit(t)
    return found


_NOT_STATIC = object()
_MAX_STATIC_SIZE = 64


def static_value(tensor):
    """The value of ``tensor`` when the graph alone determines it (small constants, shapes
    with known dims and cheap math on them), else None. Lets reshape/tile/zeros accept
    ``K.shape(x)`` entries and still infer static shapes."""
    if isinstance(tensor, Constant):
        return tensor.value if tensor.value.size <= _MAX_STATIC_SIZE else None
    if not isinstance(tensor, Tensor) or tensor.node is None:
        return None
    cached = getattr(tensor, '_static_value', _NOT_STATIC)
    if cached is _NOT_STATIC:
        values = tensor.node.op.static_values(tensor.node.inputs)
        for out, value in zip(tensor.node.outputs, values or [None] * len(tensor.node.outputs)):
            out._static_value = value
        cached = tensor._static_value
    return cached


def clone(outputs, replacements):
    """Rebuilds the graph computing ``outputs`` with some tensors replaced.

    ``replacements`` maps tensors to their stand-ins; every node between them and
    ``outputs`` is applied again (ops are immutable, so they are shared). Returns the new
    outputs in order.
    """
    mapping = dict(replacements)
    for node in topological_nodes(outputs, stop_at=set(replacements)):
        new_inputs = [mapping.get(t, t) for t in node.inputs]
        if all(a is b for a, b in zip(new_inputs, node.inputs)):
            continue
        new_outputs = apply(node.op, *new_inputs)
        new_outputs = new_outputs if isinstance(new_outputs, tuple) else (new_outputs,)
        mapping.update(zip(node.outputs, new_outputs))
    return [mapping.get(t, t) for t in outputs]
