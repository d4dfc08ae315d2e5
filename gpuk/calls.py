"""Which K function the user called, so that errors name it.

Every public K function is wrapped by ``traced`` (gpuk/backend/__init__.py). The outermost
K call on the stack is the one the user (or Keras) made: graph nodes record it when they are
built (graph.apply), errors raised while building are prefixed with it, and K.function names
it again when a node fails at run time (shapes known only then).
"""
import functools
import threading

_state = threading.local()


class KCall:
    """One call of a K function: its name and the tensors it was given."""
    __slots__ = ('name', 'args')

    def __init__(self, name, args):
        self.name, self.args = name, args


def current():
    """The K call being made (the outermost), or None outside K calls."""
    return getattr(_state, 'call', None)


def _tensor_args(args, kwargs):
    from gpuk.graph import Tensor  # late: graph imports this module
    found = []
    for value in list(args) + list(kwargs.values()):
        for item in (value if isinstance(value, (list, tuple)) else (value,)):
            if isinstance(item, Tensor):
                found.append(item)
    return tuple(found)


_k_function_names = set()
# K functions that evaluate graphs: their errors are those of the K call that built the
# failing node, which they keep naming (K.eval(K.relu(x)) fails as 'relu: ...').
_EVALUATING = frozenset(['eval', 'get_value', 'batch_get_value'])


def named(error, name):
    """``error`` with its message prefixed by ``name:`` (a new exception of the same type),
    or ``error`` itself when it already names ``name`` (or, for an evaluating K function,
    any K function) or is not a plain ValueError/TypeError."""
    message = str(error)
    first = message.split(':', 1)[0]
    if type(error) not in (ValueError, TypeError) or first == name or (
            name in _EVALUATING and first in _k_function_names):
        return error
    return type(error)('%s: %s' % (name, message))


def traced(name, function):
    """``function`` recording ``name`` as the current K call while it runs."""
    _k_function_names.add(name)
    @functools.wraps(function)
    def k_function(*args, **kwargs):
        if current() is not None:  # a K function calling another: the outer one is the user's
            return function(*args, **kwargs)
        _state.call = KCall(name, _tensor_args(args, kwargs))
        try:
            return function(*args, **kwargs)
        except (ValueError, TypeError) as error:
            renamed = named(error, name)
            if renamed is error:
                raise
            raise renamed.with_traceback(error.__traceback__) from None
        except MemoryError as error:   # an allocation outside K.function's steps (K.zeros(...))
            from gpuk import device   # (here: device sits below this layer but imports much)
            if isinstance(error, device.OutOfMemoryError):   # named after its step already
                raise
            raise device.OutOfMemoryError('%s: out of memory: %s' % (name, error),
                                          device.requested_bytes(error)) from error
        finally:
            _state.call = None
    k_function._gpuk_k_function = name
    return k_function
