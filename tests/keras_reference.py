"""Keras 2.3.1's NumPy reference backend (keras/backend/numpy_backend.py), loaded without
running keras/__init__.py (which would import a backend, h5py, keras_applications...).

Where Keras lives: the installed ``keras`` package (``keras==2.3.1`` is a test dependency),
found with importlib.util.find_spec, which does not import it; or, on a checkout without
it, the directory named by ``GPUK_KERAS_SOURCE`` (one holding ``keras/``). Finding neither
raises an ImportError naming both: tests that need the reference fail, never skip.

How: numpy_backend imports ``.common``, ``keras.utils.generic_utils`` and
``keras.utils.to_categorical``. While it loads, bare package modules ``keras``,
``keras.backend`` and ``keras.utils`` (``__path__`` pointing into Keras, no __init__ run)
stand in sys.modules, with ``to_categorical`` taken from ``keras/utils/np_utils.py``.
Afterwards sys.modules is put back exactly as it was, so a real ``import keras`` later
in the same process (end-to-end tests) is not shadowed by these stand-ins.

NumPy 2: Keras 2.3.1 uses aliases NumPy has removed (``np.int`` in ctc_decode, ``np.float``
and friends); the module gets a NumPy proxy that adds them back, for it alone.
"""
import importlib.util
import os
import sys
import types
import warnings

import numpy as np

# Aliases removed from NumPy (1.24 / 2.0) that Keras 2.3.1 code still spells.
_REMOVED_NUMPY_ALIASES = {'int': int, 'float': float, 'complex': complex, 'object': object,
                          'str': str, 'bool': bool, 'long': int, 'unicode': str}
_cache = {}


def keras_directory():
    """The directory of the ``keras`` package (holding backend/numpy_backend.py)."""
    reference = os.path.join('backend', 'numpy_backend.py')
    spec = importlib.util.find_spec('keras')
    installed = list(spec.submodule_search_locations or []) if spec is not None else []
    source = os.environ.get('GPUK_KERAS_SOURCE')
    candidates = installed + ([os.path.join(source, 'keras')] if source else [])
    for directory in candidates:
        if os.path.isfile(os.path.join(directory, reference)):
            return directory
    raise ImportError('keras_reference: no Keras 2.3.1 with %s found (installed keras: %s; '
                      'GPUK_KERAS_SOURCE=%r). Install the test extras (keras==2.3.1) or point '
                      'GPUK_KERAS_SOURCE at a directory holding keras/.'
                      % (reference, installed or 'none', source))


class _NumpyWithRemovedAliases(types.ModuleType):
    """numpy, plus the aliases NumPy 2 removed (only where numpy itself lacks them)."""

    def __init__(self):
        super().__init__('numpy')

    def __getattr__(self, name):
        try:
            return getattr(np, name)
        except AttributeError:
            if name in _REMOVED_NUMPY_ALIASES:
                return _REMOVED_NUMPY_ALIASES[name]
            raise


def _load_file(name, path):
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
    return module


def _package(name, path):
    package = types.ModuleType(name)
    package.__path__ = [path]
    package.__package__ = name
    sys.modules[name] = package
    return package


def numpy_backend():
    """Keras 2.3.1's keras.backend.numpy_backend module (loaded once)."""
    if 'backend' in _cache:
        return _cache['backend']
    root = keras_directory()
    saved = {k: v for k, v in sys.modules.items() if k == 'keras' or k.startswith('keras.')}
    for name in saved:
        del sys.modules[name]
    try:
        _package('keras', root)
        _package('keras.backend', os.path.join(root, 'backend'))
        utils = _package('keras.utils', os.path.join(root, 'utils'))
        np_utils = _load_file('keras.utils.np_utils', os.path.join(root, 'utils', 'np_utils.py'))
        utils.to_categorical = np_utils.to_categorical
        with warnings.catch_warnings():
            # Python 3.8+ warns about its `training is 1`; the code is Keras's, not ours.
            warnings.simplefilter('ignore', SyntaxWarning)
            module = _load_file('keras.backend.numpy_backend',
                                os.path.join(root, 'backend', 'numpy_backend.py'))
        # Its functions look `np` up in the module globals when called.
        module.np = _NumpyWithRemovedAliases()
    finally:
        for name in [k for k in sys.modules if k == 'keras' or k.startswith('keras.')]:
            del sys.modules[name]
        sys.modules.update(saved)
    _cache['backend'] = module
    return module
