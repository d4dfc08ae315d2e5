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

_install_keras_compat()
