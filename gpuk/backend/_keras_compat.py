"""Compatibility shims so Keras 2.3.1 runs on Python 3.10+, NumPy 2 and h5py 3.

Keras 2.3.1 (2019) predates all three. When — and only when — Keras 2.3.x loads gpuk.backend
as its backend, ``install()`` patches exactly what that Keras release needs; each shim names
the Keras lines it serves. ``GPUK_KERAS_COMPAT=0`` turns them all off.

Nothing here imports Keras: the loader imports gpuk while Keras is half-initialized. Keras
modules that are not imported yet are patched right after their first import, by a finder
on ``sys.meta_path`` that watches only those module names and removes itself when done.
When gpuk.backend was imported before Keras (``from gpuk import backend as K``, then
``import keras``), the same finder waits for ``keras.backend.load_backend`` and installs the
shims once that module has chosen gpuk.
"""
import collections
import collections.abc
import functools
import importlib.abc
import importlib.machinery
import importlib.metadata
import os
import sys

import numpy as np

BACKEND_NAME = 'gpuk.backend'

# keras/engine/training_utils.py:639 (collections.Container), :696,811,823,857,927
# (collections.Mapping / Sequence) and keras/callbacks/callbacks.py:19
# (`from collections import Iterable`): removed in Python 3.10.
_COLLECTIONS_ABC = ('Container', 'Iterable', 'Mapping', 'MutableMapping', 'Sequence', 'Callable',
                    'Hashable')

# keras/callbacks/callbacks.py:685-695,813,1024-1027 (np.Inf) and keras/utils/io_utils.py:296
# (np.string_): removed in NumPy 2.0.
_NUMPY_ALIASES = {'Inf': np.inf, 'NaN': np.nan, 'string_': np.bytes_, 'unicode_': np.str_}

_installed = []


def loaded_by_keras_2_3():
    """True while Keras 2.3.x's backend loader is importing us."""
    return 'keras.backend.load_backend' in sys.modules and _keras_is_2_3()


def _keras_is_2_3():
    try:
        return importlib.metadata.version('keras').startswith('2.3.')
    except importlib.metadata.PackageNotFoundError:
        return False


# --- h5py 3 -----------------------------------------------------------------------------------
# h5py 3 reads string attributes as ``str``; h5py 2 gave ``bytes``, and Keras 2.3.1 calls
# ``.decode('utf8')`` on them. The shims hand Keras bytes again, only where it reads them.

def _as_bytes(value):
    """str -> utf-8 bytes; an array of str -> an array of bytes (h5py 3 reads Keras's
    byte-string arrays back as str arrays when they were stored variable-length)."""
    if isinstance(value, str):
        return value.encode('utf-8')
    if isinstance(value, np.ndarray) and value.dtype.kind in 'OU' and value.size and all(
            isinstance(v, (str, bytes)) for v in value.flat):
        return np.array([_as_bytes(v) for v in value.flat], dtype=np.bytes_).reshape(value.shape)
    return value


class _BytesAttrs:
    """An h5py AttributeManager whose string values read as bytes (as under h5py 2)."""

    def __init__(self, attrs):
        self._attrs = attrs

    def __getitem__(self, name):
        return _as_bytes(self._attrs[name])

    def __contains__(self, name):
        return name in self._attrs

    def __iter__(self):
        return iter(self._attrs)

    def __len__(self):
        return len(self._attrs)

    def get(self, name, default=None):
        return _as_bytes(self._attrs[name]) if name in self._attrs else default

    def __getattr__(self, name):
        return getattr(self._attrs, name)


class _BytesAttrsGroup:
    """An h5py Group/File seen through _BytesAttrs; everything else is the group's."""

    def __init__(self, group):
        self._group = group

    @property
    def attrs(self):
        return _BytesAttrs(self._group.attrs)

    def __getitem__(self, name):
        return self._group[name]

    def __contains__(self, name):
        return name in self._group

    def __iter__(self):
        return iter(self._group)

    def __len__(self):
        return len(self._group)

    def __getattr__(self, name):
        return getattr(self._group, name)


def _with_bytes_attrs(load_weights):
    """keras/engine/saving.py:1183,1187 (load_weights_from_hdf5_group), :1262,1266
    (load_weights_from_hdf5_group_by_name): ``f.attrs['keras_version'].decode('utf8')``;
    :722,727 (load_attributes_from_hdf5_group): ``n.decode('utf8')`` on each name."""
    @functools.wraps(load_weights)
    def wrapper(f, *args, **kwargs):
        return load_weights(_BytesAttrsGroup(f), *args, **kwargs)
    wrapper._gpuk_shim = True
    return wrapper


def _h5dict_getitem_bytes(getitem):
    """keras/engine/saving.py:273,278,282,345 (_deserialize_model): ``h5dict['model_config']
    .decode('utf-8')`` and friends, where H5Dict.__getitem__ (keras/utils/io_utils.py:266)
    returns an h5py attribute as it is."""
    @functools.wraps(getitem)
    def wrapper(self, attr):
        return _as_bytes(getitem(self, attr)) if not isinstance(self.data, dict) else getitem(self, attr)
    wrapper._gpuk_shim = True
    return wrapper


def _save_to_binary_h5py(save_function, stream):
    """keras/utils/io_utils.py:416 (save_to_binary_h5py, used by saving.py:546 for file-like
    targets) opens ``h5py.File('in-memory-h5py', driver='core', backing_store=False)``
    without a mode (h5py 3's default mode is 'r': the file does not exist) and reads
    ``h5file.fid`` (gone in h5py 3: ``h5file.id``). Same body, fixed."""
    import h5py
    with h5py.File('in-memory-h5py', mode='w', driver='core', backing_store=False) as h5file:
        return_value = save_function(h5file)
        h5file.flush()
        binary_data = h5file.id.get_file_image()  # h5py 3 has no File.fid
    stream.write(binary_data)
    return return_value


_save_to_binary_h5py._gpuk_shim = True


def _patch_io_utils(io_utils):
    getitem = io_utils.H5Dict.__getitem__
    if not getattr(getitem, '_gpuk_shim', False):
        io_utils.H5Dict.__getitem__ = _h5dict_getitem_bytes(getitem)
        _installed.append('keras.utils.io_utils.H5Dict.__getitem__')
    if not getattr(io_utils.save_to_binary_h5py, '_gpuk_shim', False):
        io_utils.save_to_binary_h5py = _save_to_binary_h5py
        _installed.append('keras.utils.io_utils.save_to_binary_h5py')


def _patch_saving(saving):
    for name in ('load_weights_from_hdf5_group', 'load_weights_from_hdf5_group_by_name',
                 'load_attributes_from_hdf5_group'):
        function = getattr(saving, name)
        if not getattr(function, '_gpuk_shim', False):
            setattr(saving, name, _with_bytes_attrs(function))
            _installed.append('keras.engine.saving.' + name)
    # saving.py:24 took its own reference to save_to_binary_h5py.
    if not getattr(saving.save_to_binary_h5py, '_gpuk_shim', False):
        saving.save_to_binary_h5py = _save_to_binary_h5py
        _installed.append('keras.engine.saving.save_to_binary_h5py')


_MODULE_PATCHES = {'keras.utils.io_utils': _patch_io_utils, 'keras.engine.saving': _patch_saving}


# --- patching modules after their import --------------------------------------------------------

class _PatchingLoader(importlib.abc.Loader):
    def __init__(self, loader, after_exec):
        self._loader = loader
        self._after_exec = after_exec

    def create_module(self, spec):
        return self._loader.create_module(spec)

    def exec_module(self, module):
        self._loader.exec_module(module)
        self._after_exec(module)


class _AfterImportFinder(importlib.abc.MetaPathFinder):
    """Runs ``callbacks[name](module)`` right after module ``name`` first executes."""

    def __init__(self):
        self.callbacks = {}

    def find_spec(self, name, path, target=None):
        if name not in self.callbacks:
            return None
        spec = importlib.machinery.PathFinder.find_spec(name, path)
        if spec is None or spec.loader is None or not hasattr(spec.loader, 'exec_module'):
            return None
        callback = self.callbacks.pop(name)
        if not self.callbacks and self in sys.meta_path:
            sys.meta_path.remove(self)
        spec.loader = _PatchingLoader(spec.loader, callback)
        return spec


_finder = _AfterImportFinder()


def _after_import(name, callback):
    """Calls ``callback(module)`` now if ``name`` is imported, else right after its import."""
    module = sys.modules.get(name)
    if module is not None:
        callback(module)
        return
    _finder.callbacks[name] = callback
    if _finder not in sys.meta_path:
        sys.meta_path.insert(0, _finder)


def install():
    """Installs every shim (idempotent); returns the names of those installed now."""
    start = len(_installed)
    for name in _COLLECTIONS_ABC:
        if not hasattr(collections, name):
            setattr(collections, name, getattr(collections.abc, name))
            _installed.append('collections.' + name)
    for name, value in _NUMPY_ALIASES.items():
        if not hasattr(np, name):
            setattr(np, name, value)
            _installed.append('numpy.' + name)
    for module_name, patch in _MODULE_PATCHES.items():
        _after_import(module_name, patch)
    return _installed[start:]


def _install_if_gpuk_chosen(load_backend):
    if getattr(load_backend, '_BACKEND', None) == BACKEND_NAME and _keras_is_2_3():
        install()


def install_when_loaded_by_keras():
    """Called when gpuk.backend is imported: installs the shims if Keras 2.3.x is loading
    us, else arranges to install them if Keras 2.3.x later picks gpuk.backend."""
    if os.environ.get('GPUK_KERAS_COMPAT', '1').strip() == '0':
        return
    if loaded_by_keras_2_3():
        install()
    elif 'keras' not in sys.modules:
        _after_import('keras.backend.load_backend', _install_if_gpuk_chosen)
