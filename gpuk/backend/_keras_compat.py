"""Compatibility shims so Keras 2.3.1 runs on Python 3.10+, NumPy 2 and h5py 3.

Keras 2.3.1 (2019) predates all three. When — and only when — gpuk.backend is imported by
Keras 2.3.x's backend loader, ``install()`` patches exactly what that Keras release needs;
each shim names the Keras lines it serves. ``GPUK_KERAS_COMPAT=0`` turns them all off.
Nothing here imports Keras: the loader imports gpuk while Keras is half-initialized.
"""
import collections
import collections.abc
import importlib.metadata
import os
import sys

import numpy as np

# keras/engine/training_utils.py:696,811,823,857,927 (collections.Mapping / Sequence) and
# keras/callbacks/callbacks.py:19 (`from collections import Iterable`): removed in Python 3.10.
_COLLECTIONS_ABC = ('Iterable', 'Mapping', 'MutableMapping', 'Sequence', 'Callable', 'Hashable')

# keras/callbacks/callbacks.py:685-695,813,1024-1027 (np.Inf) and keras/utils/io_utils.py:296
# (np.string_): removed in NumPy 2.0.
_NUMPY_ALIASES = {'Inf': np.inf, 'NaN': np.nan, 'string_': np.bytes_, 'unicode_': np.str_}

_installed = []


def loaded_by_keras_2_3():
    """True while Keras 2.3.x's backend loader is importing us."""
    if 'keras.backend.load_backend' not in sys.modules:
        return False
    try:
        return importlib.metadata.version('keras').startswith('2.3.')
    except importlib.metadata.PackageNotFoundError:
        return False


def install():
    """Installs every shim (idempotent); returns the names of those installed now."""
    added = []
    for name in _COLLECTIONS_ABC:
        if not hasattr(collections, name):
            setattr(collections, name, getattr(collections.abc, name))
            added.append('collections.' + name)
    for name, value in _NUMPY_ALIASES.items():
        if not hasattr(np, name):
            setattr(np, name, value)
            added.append('numpy.' + name)
    _installed.extend(added)
    return added


def install_when_loaded_by_keras():
    if os.environ.get('GPUK_KERAS_COMPAT', '1').strip() == '0':
        return
    if loaded_by_keras_2_3():
        install()
