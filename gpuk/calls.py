"""Which K function the user called, so that errors name it.

Every public K function is wrapped by ``traced`` (gpuk/backend/__init__.py). The outermost
K call on the stack is the one the user (or Keras) made: graph nodes record it when they are
built (graph.apply), errors raised while building are prefixed with it, and K.function names
it again when a node fails at run time (shapes known only then).
"""
import functools
import threading

_state = threading.local()


def current():
    """The K function being called (the outermost), or None outside K calls."""
    return getattr(_state, 'name', None)


_k_function_names = set()


def named(error, name):
    """``error`` with its message prefixed by ``name:`` (a new exception of the same type),
    or ``error`` itself when it already names a K function (e.g. K.eval reporting the K call
    that built the failing node) or is not a plain ValueError/TypeError."""
    message = str(error)
    if type(error) not in (ValueError, TypeError) or message.split(':', 1)[0] in _k_function_names:
        return error
    return type(error)('%s: %s' % (name, message))


def traced(name, function):
    """``function`` recording ``name`` as the current K call while it runs."""
    _k_function_names.add(name)
    @functools.wraps(function)
    def k_function(*args, **kwargs):
        if current() is not None:  # a K function calling another: the outer one is the user's
            return function(*args, **kwargs)
        _state.name = name
        try:
            return function(*args, **kwargs)
        except (ValueError, TypeError) as error:
            renamed = named(error, name)
            if renamed is error:
                raise
            raise renamed.with_traceback(error.__traceback__) from None
        finally:
            _state.name = None
    k_function._gpuk_k_function = name
    return k_function
