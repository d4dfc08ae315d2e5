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
# ``.decode('utf8')`` on them. The shims hand Keras strings that also have ``decode``, only
# where it reads them: callers still get ``str`` ('abcd' stays 'abcd', not b'abcd').

class _DecodableStr(str):
    """A ``str`` that also answers ``.decode()`` (with itself), for Keras's h5py-2 reads."""
    __slots__ = ()

    def decode(self, encoding='utf-8', errors='strict'):
        return str(self)


def _decodable(value):
    """str -> _DecodableStr; an array of str (h5py 3 reads Keras's byte-string arrays back
    as str arrays when they were stored variable-length) -> an object array of them."""
    if isinstance(value, str):
        return _DecodableStr(value)
    if isinstance(value, np.ndarray) and value.dtype.kind in 'OU' and value.size and all(
            isinstance(v, str) for v in value.flat):
        out = np.empty(value.shape, dtype=object)
        for index, v in np.ndenumerate(value):
            out[index] = _DecodableStr(v)
        return out
    return value


def _is_str_vector(value):
    return (isinstance(value, np.ndarray) and value.ndim == 1 and value.dtype.kind in 'OU'
            and all(isinstance(v, str) for v in value))


def _attribute_name(attr):
    return attr.decode('utf-8') if isinstance(attr, bytes) else attr


class _Delegating:
    """Membership, iteration, length and every other attribute answered by the wrapped h5py
    object, as its own would be."""

    def __init__(self, wrapped):
        self._wrapped = wrapped

    def __contains__(self, name):
        return name in self._wrapped

    def __iter__(self):
        return iter(self._wrapped)

    def __len__(self):
        return len(self._wrapped)

    def __getattr__(self, name):
        return getattr(self._wrapped, name)


class _DecodableAttrs(_Delegating):
    """An h5py AttributeManager whose string values also answer ``.decode()``."""

    def __getitem__(self, name):
        return _decodable(self._wrapped[name])

    def get(self, name, default=None):
        return _decodable(self._wrapped[name]) if name in self._wrapped else default


class _DecodableAttrsGroup(_Delegating):
    """An h5py Group/File seen through _DecodableAttrs; everything else is the group's."""

    @property
    def attrs(self):
        return _DecodableAttrs(self._wrapped.attrs)

    def __getitem__(self, name):
        return self._wrapped[name]


def _with_decodable_attrs(load_weights):
    """keras/engine/saving.py:1183,1187 (load_weights_from_hdf5_group), :1262,1266
    (load_weights_from_hdf5_group_by_name): ``f.attrs['keras_version'].decode('utf8')``;
    :722,727 (load_attributes_from_hdf5_group): ``n.decode('utf8')`` on each name."""
    @functools.wraps(load_weights)
    def wrapper(f, *args, **kwargs):
        return load_weights(_DecodableAttrsGroup(f), *args, **kwargs)
    wrapper._gpuk_shim = True
    return wrapper


def _h5dict_getitem_decodable(getitem):
    """keras/engine/saving.py:273,278,282,345 (_deserialize_model): ``h5dict['model_config']
    .decode('utf-8')`` and friends, where H5Dict.__getitem__ (keras/utils/io_utils.py:266)
    returns an h5py attribute as it is.

    A list attribute comes back as the list of bytes it was stored as (H5Dict.__setitem__,
    io_utils.py:253, encodes str items): h5py 2 read it as a bytes array that io_utils.py:269
    turned into that list; h5py 3 reads it as an array of str, which ``== [b'a', b'b']`` (Keras's
    own io_utils_test) cannot compare."""
    @functools.wraps(getitem)
    def wrapper(self, attr):
        value = getitem(self, attr)
        if isinstance(self.data, dict):
            return value
        if _is_str_vector(value) and _attribute_name(attr) in self.data.attrs:
            return [v.encode('utf-8') for v in value]
        return _decodable(value)
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
        io_utils.H5Dict.__getitem__ = _h5dict_getitem_decodable(getitem)
        _installed.append('keras.utils.io_utils.H5Dict.__getitem__')
    if not getattr(io_utils.save_to_binary_h5py, '_gpuk_shim', False):
        io_utils.save_to_binary_h5py = _save_to_binary_h5py
        _installed.append('keras.utils.io_utils.save_to_binary_h5py')


def _patch_saving(saving):
    for name in ('load_weights_from_hdf5_group', 'load_weights_from_hdf5_group_by_name',
                 'load_attributes_from_hdf5_group'):
        function = getattr(saving, name)
        if not getattr(function, '_gpuk_shim', False):
            setattr(saving, name, _with_decodable_attrs(function))
            _installed.append('keras.engine.saving.' + name)
    # saving.py:24 took its own reference to save_to_binary_h5py.
    if not getattr(saving.save_to_binary_h5py, '_gpuk_shim', False):
        saving.save_to_binary_h5py = _save_to_binary_h5py
        _installed.append('keras.engine.saving.save_to_binary_h5py')


# --- NumPy 2 numbers where Keras shows them ------------------------------------------------------

def _python_shape(shape):
    """A shape (or list of shapes) with NumPy ints as Python ints: NumPy 2 prints
    np.int64(144) where NumPy 1 printed 144 (Flatten's compute_output_shape uses np.prod)."""
    if isinstance(shape, list):
        return [_python_shape(s) for s in shape]
    if isinstance(shape, tuple):
        return tuple(int(d) if isinstance(d, np.integer) else d for d in shape)
    return shape


def _python_shapes_on_nodes(add_inbound_node):
    """keras/engine/base_layer.py:542 (_add_inbound_node) stores compute_output_shape's
    result on the Node (model.summary(), layer.output_shape) and as ``_keras_shape``."""
    @functools.wraps(add_inbound_node)
    def wrapper(self, input_tensors, output_tensors, input_masks, output_masks,
                input_shapes, output_shapes, arguments=None):
        return add_inbound_node(self, input_tensors, output_tensors, input_masks, output_masks,
                                _python_shape(input_shapes), _python_shape(output_shapes), arguments)
    wrapper._gpuk_shim = True
    return wrapper


def _python_number(value):
    """A NumPy scalar or 0-d array as a Python number (what ``round`` and ``json`` take)."""
    if isinstance(value, (np.generic, np.ndarray)) and np.ndim(value) == 0:
        return value.item()
    return value


def _python_numbers_in_logs(on_epoch_end):
    """keras/callbacks/callbacks.py:626 (History.on_epoch_end) records the epoch's logs as
    they come: a stateful metric's value is the 0-d array K.function returned."""
    @functools.wraps(on_epoch_end)
    def wrapper(self, epoch, logs=None):
        logs = {k: _python_number(v) for k, v in (logs or {}).items()}
        return on_epoch_end(self, epoch, logs)
    wrapper._gpuk_shim = True
    return wrapper


def _patch_base_layer(base_layer):
    if not getattr(base_layer.Layer._add_inbound_node, '_gpuk_shim', False):
        base_layer.Layer._add_inbound_node = _python_shapes_on_nodes(base_layer.Layer._add_inbound_node)
        _installed.append('keras.engine.base_layer.Layer._add_inbound_node')


def _patch_callbacks(callbacks):
    if not getattr(callbacks.History.on_epoch_end, '_gpuk_shim', False):
        callbacks.History.on_epoch_end = _python_numbers_in_logs(callbacks.History.on_epoch_end)
        _installed.append('keras.callbacks.callbacks.History.on_epoch_end')


# --- NumPy >= 1.24: ragged np.array in the dataset loaders -----------------------------------

class _NumpyWithRaggedArrays:
    """NumPy as the imdb and reuters loaders see it: ``np.array`` of sequences of unequal
    lengths gives a 1-D object array, as NumPy < 1.24 did (with a warning) where NumPy 1.24
    raises. keras/datasets/imdb.py:125-126 and reuters.py:104-105 build
    ``np.array(xs[:idx])`` from lists of word-index lists of many lengths."""

    def __getattr__(self, name):
        return getattr(np, name)

    @staticmethod
    def array(obj, *args, **kwargs):
        try:
            return np.array(obj, *args, **kwargs)
        except ValueError:
            if args or kwargs or not isinstance(obj, (list, tuple)):
                raise
            ragged = np.empty(len(obj), dtype=object)
            for i, item in enumerate(obj):
                ragged[i] = item
            return ragged


def _patch_dataset_loader(module):
    if not isinstance(module.np, _NumpyWithRaggedArrays):
        module.np = _NumpyWithRaggedArrays()
        _installed.append(module.__name__ + '.np')


# --- selu rounded once ------------------------------------------------------------------------

_SELU_ALPHA = 1.6732632423543772848170429916717
_SELU_SCALE = 1.0507009873554804934193349852946


def _selu(x):
    """keras/activations.py:57 computes ``scale * K.elu(x, alpha)``: two roundings in float32
    put a third of the values one ulp away from the exact result. The same formula in float64,
    rounded once to x's dtype, gives the float64 reference's value."""
    from gpuk import backend as K
    x = K.identity(x) if not K.is_tensor(x) else x
    if x.dtype not in ('float16', 'float32'):
        return _SELU_SCALE * K.elu(x, _SELU_ALPHA)
    return K.cast(_SELU_SCALE * K.elu(K.cast(x, 'float64'), _SELU_ALPHA), x.dtype)


_selu.__name__ = 'selu'  # Keras serializes activations by function name
_selu._gpuk_shim = True


def _patch_activations(activations):
    if not getattr(activations.selu, '_gpuk_shim', False):
        _selu.__doc__ = activations.selu.__doc__
        activations.selu = _selu
        _installed.append('keras.activations.selu')


_MODULE_PATCHES = {'keras.utils.io_utils': _patch_io_utils, 'keras.engine.saving': _patch_saving,
                   'keras.engine.base_layer': _patch_base_layer,
                   'keras.callbacks.callbacks': _patch_callbacks,
                   'keras.activations': _patch_activations,
                   'keras.datasets.imdb': _patch_dataset_loader,
                   'keras.datasets.reuters': _patch_dataset_loader}


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
