"""gpuk's Keras 2 backend: ``from gpuk import backend as K`` or ``KERAS_BACKEND=gpuk.backend``.

Every name of the Keras 2.3.1 backend API, with tensorflow_backend's signatures and
defaults. The functions are grouped in private modules by theme; this package is the K
namespace. Importing it never imports Keras (Keras imports us half-initialized).
"""
from gpuk.backend._core import *  # noqa: F401,F403
from gpuk.backend._math import *  # noqa: F401,F403
from gpuk.backend._shapes import *  # noqa: F401,F403
from gpuk.backend._random import *  # noqa: F401,F403
from gpuk.backend._control import *  # noqa: F401,F403
from gpuk.backend._conv import *  # noqa: F401,F403
from gpuk.backend._nn import *  # noqa: F401,F403
from gpuk.backend._keras_compat import install_when_loaded_by_keras as _install_keras_compat


def _trace_k_functions():
    """Each K function records its name while it runs: errors and graph nodes name the K
    function the user called (gpuk/calls.py)."""
    import inspect
    from gpuk import calls
    from gpuk.backend import _conv, _control, _core, _math, _nn, _random, _shapes
    for module in (_core, _math, _shapes, _random, _control, _conv, _nn):
        for name in module.__all__:
            function = globals()[name]
            if inspect.isfunction(function) and not hasattr(function, '_gpuk_k_function'):
                globals()[name] = calls.traced(name, function)


_trace_k_functions()
_install_keras_compat()
