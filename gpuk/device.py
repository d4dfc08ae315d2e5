"""Where arrays live and which implementation computes them.

``GPUK_DEVICE`` picks the device once, on first use:
- ``cuda``: CuPy arrays on the GPU, handwritten CUDA kernels; an error if no GPU is usable;
- ``cpu``: NumPy arrays, the NumPy twins in ``gpuk.cpu_fallback``;
- ``emulate``: NumPy arrays, the CUDA kernels run on the emulated CUDA runtime;
- ``auto`` (default): ``cuda`` when CuPy finds a usable GPU, else ``cpu``.

Importing gpuk never fails for lack of CuPy, a driver or a GPU: probing happens lazily.
All host<->device copies go through ``to_device`` / ``to_host``.
"""
import importlib
import os

import numpy as np

from gpuk.contracts.families import FAMILIES

from gpuk import config
from gpuk.config import DEVICE_KINDS
from gpuk.kernels.runtime import counters
from gpuk.kernels.runtime import gpu_unusable_reason  # noqa: F401 (part of this module's API)

_state = {'kind': None, 'impl': None}


class DeviceError(RuntimeError):
    """The requested device cannot be used."""


def _resolve_kind():
    try:
        requested = config.requested_device()
    except ValueError as exc:
        raise DeviceError(str(exc)) from None
    if requested in ('cpu', 'emulate'):
        return requested
    reason = gpu_unusable_reason()
    if reason is None:
        return 'cuda'
    if requested == 'cuda':
        raise DeviceError('GPUK_DEVICE=cuda but no GPU is usable: %s' % reason)
    return 'cpu'


def kind():
    """The device in use: 'cuda', 'cpu' or 'emulate'."""
    if _state['kind'] is None:
        _state['kind'] = _resolve_kind()
    return _state['kind']


def set_device(name):
    """Switches device ('auto', 'cuda', 'cpu', 'emulate'); existing variables keep their arrays,
    so call this before creating any."""
    if name not in DEVICE_KINDS:
        raise ValueError('set_device: name must be one of %s, got %r' % (DEVICE_KINDS, name))
    previous = os.environ.get('GPUK_DEVICE')
    os.environ['GPUK_DEVICE'] = name
    try:
        _state['kind'] = _resolve_kind()
    finally:
        if previous is None:
            del os.environ['GPUK_DEVICE']
        else:
            os.environ['GPUK_DEVICE'] = previous
    _state['impl'] = None


def xp():
    """The array namespace of the device: cupy on 'cuda', numpy otherwise."""
    return impl().xp


class Implementation:
    """What ops compute with: ``.xp`` plus one module per kernel family, imported on first use.

    On 'cuda' and 'emulate' a family uses gpuk.kernels.<family> where that launcher exists and
    the NumPy twin gpuk.cpu_fallback.<family> otherwise; on 'cpu' always the NumPy twin.
    """

    def __init__(self, device_kind, array_module):
        self.kind = device_kind
        self.xp = array_module
        self._use_kernels = device_kind in ('cuda', 'emulate')

    def __getattr__(self, family):
        if family not in FAMILIES:
            raise AttributeError(family)
        module = None
        if self._use_kernels:
            try:
                module = importlib.import_module('gpuk.kernels.' + family)
            except ModuleNotFoundError as exc:
                if exc.name != 'gpuk.kernels.' + family:
                    raise
        if module is None:
            module = importlib.import_module('gpuk.cpu_fallback.' + family)
        setattr(self, family, module)
        return module

    def check_later(self, flag, recheck):
        """A data-dependent argument check: `flag` (a 0-d boolean or integer array of xp) is
        true / nonzero when some value is bad, `recheck()` raises the check's ValueError on host
        copies. On 'cpu' it runs now; on 'cuda' and 'emulate' its flag is read with the others by
        `run_checked` (gpuk/kernels/runtime/deferred.py), so checking costs no host sync per op."""
        if self._use_kernels:
            from gpuk.kernels.runtime import current, deferred
            deferred.defer(current(), flag, recheck)
        elif bool(flag):
            recheck()


def impl():
    """The Implementation of the current device (see ``Implementation``)."""
    if _state['impl'] is None:
        device_kind = kind()
        if device_kind == 'cuda':
            import cupy
            array_module = cupy
        else:
            array_module = np
        if device_kind in ('cuda', 'emulate'):
            from gpuk.kernels import runtime
            runtime.set_current(device_kind)
        _state['impl'] = Implementation(device_kind, array_module)
    return _state['impl']


def run_checked(run, *args):
    """``run(*args)``, then the deferred argument checks its ops queued (Implementation.check_later,
    gpuk/kernels/runtime/deferred.py): the first failed one raises its ValueError. When ``run``
    itself fails, a failed check is raised instead (a bad value explains the failure best), and
    none is left pending for the next call."""
    from gpuk.kernels.runtime import deferred
    result = run_deferring(run, *args)
    deferred.raise_pending()
    return result


def run_deferring(run, *args):
    """``run(*args)``, leaving the checks its ops queued pending for the caller to read where it
    reads the results (K.function: with the step's outputs, so the step itself makes no host
    sync); when ``run`` fails, a failed check is raised instead and none is left pending."""
    from gpuk.kernels.runtime import deferred
    try:
        return run(*args)
    except BaseException:
        deferred.raise_pending()
        raise


def to_device(value, dtype=None):
    """An array of the device's namespace holding ``value`` (copied to the GPU when needed)."""
    array_module = xp()
    if array_module is np:
        return np.asarray(value, dtype=dtype)
    if not isinstance(value, array_module.ndarray):
        value = np.asarray(to_host(value), dtype=dtype)
    return array_module.asarray(value, dtype=dtype)


def to_host(value):
    """A NumPy array (or NumPy scalar) holding ``value``."""
    array_module = _state['impl'].xp if _state['impl'] is not None else np
    if array_module is not np and isinstance(value, array_module.ndarray):
        counters.host_sync()   # a copy that waits for the stream (the GPU rehearsal's too)
    if isinstance(value, np.ndarray):
        return value
    get = getattr(value, 'get', None)
    if get is not None and type(value).__module__.startswith('cupy'):
        return get()
    return np.asarray(value)
