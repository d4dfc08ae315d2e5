"""Tensors, variables, placeholders, functions, gradients, updates, learning phase and
session-level K functions."""
import contextlib

import numpy as np

from gpuk import config, device, graph, loss_scaling
from gpuk.autodiff import gradients as _gradients
from gpuk.function import Function, Update, check_update_value
from gpuk.graph import Constant, Placeholder, Tensor, Variable
from gpuk.ops import elementwise as ew
from gpuk.ops.control import Identity, PrintTensor, StopGradient

__all__ = [
    'backend', 'epsilon', 'set_epsilon', 'floatx', 'set_floatx', 'cast_to_floatx',
    'image_data_format', 'set_image_data_format', 'image_dim_ordering', 'set_image_dim_ordering',
    'normalize_data_format', 'get_uid', 'reset_uids', 'clear_session', 'manual_variable_initialization',
    'learning_phase', 'set_learning_phase', 'learning_phase_scope', 'get_session', 'set_session',
    'name_scope', 'control_dependencies', 'symbolic', 'eager', 'is_sparse', 'to_dense', 'variable',
    'constant', 'is_variable', 'is_tensor', 'is_keras_tensor', 'is_placeholder', 'placeholder',
    'int_shape', 'ndim', 'dtype', 'eval', 'get_value', 'batch_get_value',
    'set_value', 'batch_set_value', 'get_variable_shape', 'count_params', 'cast', 'update',
    'update_add', 'update_sub', 'moving_average_update', 'function', 'gradients', 'stop_gradient',
    'identity', 'print_tensor', 'zeros', 'ones', 'eye', 'zeros_like', 'ones_like',
]

epsilon = config.epsilon
set_epsilon = config.set_epsilon
floatx = config.floatx
set_floatx = config.set_floatx
image_data_format = config.image_data_format
set_image_data_format = config.set_image_data_format
image_dim_ordering = config.image_dim_ordering
set_image_dim_ordering = config.set_image_dim_ordering
normalize_data_format = config.normalize_data_format
get_uid = graph.get_uid
reset_uids = graph.reset_uids
name_scope = graph.name_scope


def backend():
    """The name of this backend, as Keras's ``K.backend()`` reports it."""
    return 'gpuk.backend'


def cast_to_floatx(x):
    """Casts a NumPy array (or Python value) to floatx; returns a NumPy array."""
    return np.asarray(x, dtype=floatx())


def symbolic(func):
    """Decorator kept for API compatibility: gpuk is always symbolic."""
    return func


def eager(func):
    """Decorator kept for API compatibility: gpuk is always symbolic."""
    return func


# --- session and learning phase ---------------------------------------------------------

_session = {'learning_phase': None, 'fixed_phase': None, 'manual_init': False}


def learning_phase():
    """The learning phase flag: a scalar placeholder (0 = test, 1 = train, default 0), or
    the Python int given to set_learning_phase."""
    if _session['fixed_phase'] is not None:
        return _session['fixed_phase']
    if _session['learning_phase'] is None:
        phase = Placeholder((), 'uint8', name='keras_learning_phase')
        phase.default_value = 0
        _session['learning_phase'] = phase
    return _session['learning_phase']


def set_learning_phase(value):
    """Fixes the learning phase to 0 (test) or 1 (train)."""
    if value not in (0, 1) or isinstance(value, float):
        raise ValueError('set_learning_phase: value must be 0 or 1, got %r' % (value,))
    _session['fixed_phase'] = int(value)


@contextlib.contextmanager
def learning_phase_scope(value):
    """Context manager fixing the learning phase to ``value`` inside it."""
    if value not in (0, 1) or isinstance(value, float):
        raise ValueError('learning_phase_scope: value must be 0 or 1, got %r' % (value,))
    previous = _session['fixed_phase']
    _session['fixed_phase'] = int(value)
    try:
        yield value
    finally:
        _session['fixed_phase'] = previous


def clear_session():
    """Forgets the learning phase, uids and used names (a fresh graph)."""
    _session.update(learning_phase=None, fixed_phase=None)
    graph.reset_uids()
    graph.forget_names()


def manual_variable_initialization(value):
    """Kept for API compatibility: gpuk variables always hold their value from creation."""
    _session['manual_init'] = bool(value)


def get_session():
    """gpuk has no session object; returns None (kept for API compatibility)."""
    return None


def set_session(session):
    """Kept for API compatibility; gpuk has no session."""


def _flat_updates(control_inputs):
    if isinstance(control_inputs, Update):
        yield control_inputs
    elif isinstance(control_inputs, (list, tuple)):
        for item in control_inputs:
            yield from _flat_updates(item)


@contextlib.contextmanager
def control_dependencies(control_inputs):
    """Tensors built inside see the variables of the updates in ``control_inputs`` as
    already updated (TensorFlow's run-after semantics: Keras 2.3.1 reads a metric's
    ``total / count`` under ``control_dependencies(update_op)``, base_layer.py:1258).
    Tensors among ``control_inputs`` need nothing: gpuk runs every node a result needs."""
    if control_inputs is not None and not isinstance(control_inputs, (list, tuple, Update, Tensor)):
        raise TypeError('control_dependencies: control_inputs must be a list of updates or '
                        'tensors, got %r' % (control_inputs,))
    updated = {u.variable: u.value for u in _flat_updates(control_inputs)}
    with graph.reading_updated(updated):
        yield


# --- sparse ---------------------------------------------------------------------------

def is_sparse(tensor):
    """Whether ``tensor`` was created sparse (gpuk computes densely on it)."""
    return bool(getattr(tensor, 'is_sparse', False))


def to_dense(tensor):
    """The dense form of ``tensor`` (gpuk keeps sparse tensors dense already)."""
    if is_sparse(tensor) and isinstance(tensor, Tensor):
        return identity(tensor)
    return tensor


# --- leaves -----------------------------------------------------------------------------

def variable(value, dtype=None, name=None, constraint=None):
    """Instantiates a variable holding ``value`` (array, list, scalar or scipy.sparse matrix).

    # Arguments
        value: initial value.
        dtype: type of the variable (default floatx).
        name: optional name; made unique within the current name scope.
        constraint: optional projection applied after optimizer updates.
    # Returns
        A variable.
    """
    sparse = hasattr(value, 'tocoo')
    if sparse:
        value = value.toarray()
    elif isinstance(value, Tensor):
        fed = [t.name for t in graph.leaves([value])
               if isinstance(t, Placeholder) and getattr(t, 'default_value', None) is None]
        if fed:   # (K.eval's error named K.function and a missing input)
            raise ValueError('variable: value %r depends on placeholder(s) %s; an initial value must be '
                             'computable without inputs' % (value.name, ', '.join(map(repr, fed))))
        value = eval(value)
    v = Variable(value, graph.dtype_name(dtype, 'variable'), name=name, constraint=constraint)
    v.is_sparse = sparse
    return v


def constant(value, dtype=None, shape=None, name=None):
    """A constant tensor; a scalar ``value`` with ``shape`` fills that shape."""
    dtype = graph.dtype_name(dtype, 'constant')
    array = graph.checked_array(value, dtype, 'constant')
    if shape is not None:
        shape = graph.normalize_shape(shape, 'constant')
        if array.size == 1:
            array = np.full(shape, array.reshape(()), dtype=dtype)
        elif array.shape != shape:
            if array.size != int(np.prod(shape, dtype=np.int64)):
                raise ValueError('constant: a value of shape %s cannot fill shape %s'
                                 % (array.shape, shape))
            array = array.reshape(shape)
    return Constant(array, name=name)


def placeholder(shape=None, ndim=None, dtype=None, sparse=False, name=None):
    """A placeholder: an input fed when a function runs.

    # Arguments
        shape: tuple of ints or None entries; or give ``ndim``.
        ndim: number of axes when ``shape`` is not given.
        dtype: placeholder type (default floatx).
        sparse: whether it stands for a sparse input (fed scipy.sparse, computed densely).
        name: optional name.
    """
    if shape is None:
        if ndim is None:
            raise ValueError('placeholder: give shape or ndim')
        if isinstance(ndim, bool) or not isinstance(ndim, (int, np.integer)):
            raise TypeError('placeholder: ndim must be an int, got %r' % (ndim,))
        if ndim < 0:
            raise ValueError('placeholder: ndim must be >= 0, got %r' % (ndim,))
        shape = (None,) * int(ndim)
    shape = graph.normalize_shape(shape, 'placeholder')
    x = Placeholder(shape, graph.dtype_name(dtype, 'placeholder'), name=name, sparse=sparse)
    x._keras_shape = shape
    x._uses_learning_phase = False
    return x


def is_variable(x):
    return isinstance(x, Variable)


def is_tensor(x):
    return isinstance(x, Tensor)


def is_keras_tensor(x):
    """Whether ``x`` came from a Keras layer or Input; ValueError for non-tensors."""
    if not is_tensor(x):
        raise ValueError('is_keras_tensor: expected a symbolic tensor, got an instance of %s'
                         % type(x).__name__)
    return hasattr(x, '_keras_history')


def is_placeholder(x):
    return bool(getattr(x, '_is_placeholder', False))


# --- static information -------------------------------------------------------------------

def int_shape(x):
    """The static shape of ``x`` as a tuple of ints / None (Keras's ``_keras_shape`` wins)."""
    if hasattr(x, '_keras_shape'):
        return x._keras_shape
    if isinstance(x, Tensor):
        return x.shape
    try:
        return tuple(int(d) for d in x.shape)
    except (AttributeError, TypeError):
        return None


def ndim(x):
    shape = int_shape(x)
    return None if shape is None else len(shape)


def dtype(x):
    """The dtype of a tensor or variable, as a string."""
    if isinstance(x, Tensor):
        return x.dtype
    return np.asarray(x).dtype.name


def count_params(x):
    """Number of scalars in a variable (or tensor of static shape)."""
    shape = int_shape(x)
    if shape is None or None in shape:
        raise ValueError('count_params: %r has a shape with unknown dims: %s' % (getattr(x, 'name', x), shape))
    return int(np.prod(shape, dtype=np.int64))


def get_variable_shape(x):
    return int_shape(x)


# --- values -------------------------------------------------------------------------------

def eval(x):
    """Evaluates a tensor (with no placeholders needed); returns a NumPy array. Evaluating
    an update (K.update, K.update_add...) applies it and returns the new value, as
    evaluating TensorFlow's assign op does."""
    if isinstance(x, Update):
        return Function([], [x.value], updates=[x])([])[0]
    if isinstance(x, Variable):
        return np.array(device.to_host(x.value), copy=True)
    if not isinstance(x, Tensor):  # a number or an array: itself, as long as it holds numbers
        return graph.checked_array(x, None, 'eval', 'x')
    return Function([], [x])([])[0]


def get_value(x):
    """The value of a variable, as a NumPy array."""
    if not isinstance(x, Tensor):
        raise TypeError('get_value: expected a variable, got %r' % (x,))
    return eval(x)


def batch_get_value(ops):
    """The values of a list of tensors, as NumPy arrays."""
    for x in ops:
        if not isinstance(x, Tensor):
            raise TypeError('batch_get_value: ops must be tensors, got %r among them' % (x,))
    return [get_value(x) for x in ops]


def set_value(x, value):
    """Sets a variable's value from a NumPy array (shape must match)."""
    if not isinstance(x, Variable):
        raise TypeError('set_value: expected a variable, got %r' % (x,))
    x.assign(value, where='set_value')


def batch_set_value(tuples):
    """Sets several variables, all or nothing: every value is checked and converted (a
    copy) before any variable changes."""
    try:
        tuples = [tuple(pair) for pair in tuples]
    except TypeError:
        raise TypeError('batch_set_value: expected a list of (variable, value) pairs, got %r'
                        % (tuples,)) from None
    new_values = []
    for pair in tuples:
        if len(pair) != 2 or not isinstance(pair[0], Variable):
            raise TypeError('batch_set_value: expected (variable, value) pairs, got %r' % (pair,))
        new_values.append(pair[0].checked_value(pair[1], where='batch_set_value'))
    for (x, _), value in zip(tuples, new_values):
        x.value = value


def cast(x, dtype):
    """Casts a tensor to ``dtype``."""
    return ew.cast(x, dtype)


# --- updates ------------------------------------------------------------------------------

def _check_update(x, where):
    if not isinstance(x, Variable):
        raise TypeError('%s: x must be a variable, got %r' % (where, x))


def _checked_update(x, new_value, where):
    """Update(x, new_value) once new_value's static dtype and shape are known to fit x."""
    check_update_value(x, new_value, where)
    return Update(x, ew.cast(new_value, x.dtype))


def update(x, new_x):
    """An update assigning ``new_x`` to variable ``x`` (pass it to K.function's updates)."""
    _check_update(x, 'update')
    return _checked_update(x, graph.as_tensor(new_x, x.dtype), 'update')


def update_add(x, increment):
    _check_update(x, 'update_add')
    return _checked_update(x, x + increment, 'update_add')


def update_sub(x, decrement):
    _check_update(x, 'update_sub')
    return _checked_update(x, x - decrement, 'update_sub')


def moving_average_update(x, value, momentum):
    """An update ``x <- x - (x - value) * (1 - momentum)``."""
    _check_update(x, 'moving_average_update')
    return _checked_update(x, x - (x - ew.cast(value, x.dtype)) * (1.0 - momentum),
                           'moving_average_update')


# --- functions and gradients --------------------------------------------------------------

def function(inputs, outputs, updates=None, **kwargs):
    """Compiles ``outputs`` (and ``updates``) of ``inputs`` into a callable.

    # Arguments
        inputs: list of placeholders.
        outputs: list of tensors (or one tensor).
        updates: list of K.update(...) results or (variable, new_value) tuples.
        name: optional name.
    # Returns
        A callable taking a list of values (arrays or Python scalars) and returning a list
        of NumPy arrays.
    """
    name = kwargs.pop('name', None)
    if kwargs:
        raise ValueError('function: unexpected keyword arguments %s' % sorted(kwargs))
    return Function(inputs, outputs, updates=updates, name=name)


def gradients(loss, variables):
    """Gradients of ``loss`` with respect to ``variables`` (None where disconnected).

    Under the 'mixed_float16' precision policy the loss is scaled and the gradients
    unscaled (gpuk/loss_scaling.py); the values are the same gradients."""
    if config.precision() == 'mixed_float16' and getattr(loss, 'dtype', None) == 'float32':
        return loss_scaling.scaled_gradients(loss, variables)
    return _gradients(loss, variables)


def stop_gradient(variables):
    """``variables`` (a tensor or a list) with no gradient flowing back through them."""
    if isinstance(variables, (list, tuple)):
        return [graph.apply(StopGradient(), v) for v in variables]
    return graph.apply(StopGradient(), variables)


def identity(x, name=None):
    """A new tensor equal to ``x``."""
    return graph.apply(Identity(), x)


def print_tensor(x, message=''):
    """``x``, printing ``message`` and its value whenever it is evaluated."""
    return graph.apply(PrintTensor(message), x)


# --- filled tensors (as variables, like Keras's tensorflow backend) -------------------------

def _filled_variable(fill, shape, dtype, name, where):
    dtype = graph.dtype_name(dtype)
    static = _static_shape(shape, where)
    if static is not None:
        return variable(fill(static, dtype), dtype=dtype, name=name)
    from gpuk.ops.shape import fill_shape
    return fill_shape(shape, 0 if fill is np.zeros else 1, dtype)


def _static_shape(shape, where):
    from gpuk.ops.shape import static_shape_tuple
    return static_shape_tuple(shape, where)


def zeros(shape, dtype=None, name=None):
    """A variable of zeros (a tensor when ``shape`` holds symbolic dims)."""
    return _filled_variable(np.zeros, shape, dtype, name, 'zeros')


def ones(shape, dtype=None, name=None):
    """A variable of ones (a tensor when ``shape`` holds symbolic dims)."""
    return _filled_variable(np.ones, shape, dtype, name, 'ones')


def eye(size, dtype=None, name=None):
    """An identity-matrix variable; ``size`` an int or (rows, cols)."""
    pair = isinstance(size, (tuple, list)) or (isinstance(size, np.ndarray) and size.ndim == 1)
    dims = tuple(size) if pair else (size, size)
    if len(dims) != 2 or any(isinstance(d, bool) or not isinstance(d, (int, np.integer)) for d in dims):
        raise TypeError('eye: size must be an int or a (rows, cols) pair of ints (an identity variable '
                        'has a static shape), got %r' % (size,))
    if min(dims) < 0:
        raise ValueError('eye: size must not be negative, got %r' % (size,))
    return variable(np.eye(*dims), dtype=dtype, name=name)


def zeros_like(x, dtype=None, name=None):
    return ew.zeros_like(x, dtype)


def ones_like(x, dtype=None, name=None):
    return ew.ones_like(x, dtype)
