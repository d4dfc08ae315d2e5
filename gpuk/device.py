"""Where arrays live and which implementation computes them.

``GPUK_DEVICE`` picks the device once, on first use:
- ``cuda``: CuPy arrays on the GPU, handwritten CUDA kernels; an error if no GPU is usable;
- ``cpu``: NumPy arrays, the NumPy twins in ``gpuk.cpu_fallback``;
- ``emulate``: NumPy arrays, the CUDA kernels run on the emulated CUDA runtime;
- ``auto`` (default): ``cuda`` when CuPy finds a usable GPU, else ``cpu``.

Importing gpuk never fails for lack of CuPy, a driver or a GPU: probing happens lazily.
All host<->device copies go through ``to_device`` / ``to_host``. A K.function call that runs
out of memory raises ``OutOfMemoryError`` (``out_of_memory`` tells an allocation failure,
``release_memory`` frees what the failed call held).
"""
import importlib
import os
import traceback

import numpy as np

from gpuk.contracts.families import FAMILIES

from gpuk import config
from gpuk.config import DEVICE_KINDS
from gpuk.kernels.runtime import KernelLaunchError, counters, prepared
from gpuk.kernels.runtime import gpu_unusable_reason  # noqa: F401 (part of this module's API)

_state = {'kind': None, 'impl': None}


class DeviceError(RuntimeError):
    """The requested device cannot be used."""


class OutOfMemoryError(MemoryError):
    """A K.function call ran out of device memory (host memory on the NumPy devices): what it
    raises in place of CuPy's OutOfMemoryError, a CUDA out-of-memory status, cuDNN's failed
    allocation or NumPy's MemoryError (kept as ``__cause__``), naming the K function whose step failed and the dtypes
    and shapes of that step's inputs. The call changed no variable (unless a replayed CUDA Graph
    had applied its updates, which the message then says) and released what it had
    allocated (``release_memory``): a smaller batch can run next. A MemoryError, so ``except
    MemoryError`` catches it; ``requested_bytes`` is the size of the allocation that failed
    where the error said it (CuPy's and NumPy's do), else None. Also ``gpuk.OutOfMemoryError``."""

    def __init__(self, message, requested_bytes=None):
        super().__init__(message)
        self.requested_bytes = requested_bytes

    def __reduce__(self):   # pickled (a worker's error) with its size
        return type(self), (str(self), self.requested_bytes)

    @classmethod
    def of(cls, name, error, arrays, replayed=False):
        """The error for ``error`` (``out_of_memory(error)`` is true) in ``name`` (the K
        function whose step failed, or the function copying its inputs), given ``arrays``;
        ``replayed``: after a replayed CUDA Graph, which applied the updates itself (the one
        failure that comes after any variable changed: copying the outputs to the host)."""
        memory = 'GPU' if kind() == 'cuda' else 'host'
        reason = (str(error) or type(error).__name__).rstrip('.')
        outcome = ('The step\'s updates were applied (a replayed CUDA Graph writes them itself) and its outputs '
                   'lost; the call\'s memory was released.' if replayed else
                   'No variable was updated and the call\'s memory was released: try a smaller batch.')
        inputs = 'on inputs %s' % ', '.join(map(_described, arrays)) if arrays else 'with no inputs'
        return cls('%s: out of %s memory (at run time, %s): %s. %s'
                   % (name, memory, inputs, reason, outcome), requested_bytes(error))


def _described(value):
    if hasattr(value, 'shape') and hasattr(value, 'dtype'):
        return '%s %s' % (value.dtype, tuple(value.shape))
    return type(value).__name__   # a host number, or None for a value a step does not read


def requested_bytes(error):
    """The failed allocation's size: CuPy's OutOfMemoryError keeps it as ``_size``, NumPy's
    (``_ArrayMemoryError``) as ``_total_size``; neither is public, so read if present."""
    for name in ('_size', '_total_size'):
        size = getattr(error, name, None)
        if isinstance(size, int):
            return size
    return None


# cudaErrorMemoryAllocation (CUDARuntimeError) and CUDA_ERROR_OUT_OF_MEMORY (CUDADriverError)
_CUDA_OUT_OF_MEMORY = 2
_CUBLAS_STATUS_ALLOC_FAILED = 3


def out_of_memory(error):
    """Whether ``error`` says an allocation failed: a MemoryError (CuPy's pool raises its
    OutOfMemoryError, one, also for a cuDNN workspace it allocates; the cuDNN path raises
    cudnn.library.AllocationFailed, one, for cuDNN's own failed allocations; NumPy raises
    MemoryError), or on the CUDA device a CUDA runtime or driver error with the out-of-memory
    status or cuBLAS's ALLOC_FAILED, also as the cause of the KernelLaunchError a launch wraps
    it in. Other errors that may stem from memory (cuDNN's INTERNAL_ERROR or EXECUTION_FAILED,
    a launch out of resources) do not say so reliably and keep their own type."""
    if isinstance(error, MemoryError):
        return True
    if isinstance(error, KernelLaunchError):
        error = error.__cause__
    implementation = _state['impl']
    if error is None or implementation is None or implementation.kind != 'cuda':
        return False
    cuda, status = implementation.xp.cuda, getattr(error, 'status', None)
    if isinstance(error, (cuda.runtime.CUDARuntimeError, cuda.driver.CUDADriverError)):
        return status == _CUDA_OUT_OF_MEMORY
    try:   # CuPy loads cuBLAS on first use (cupy.cuda's __getattr__), which can fail
        cublas_error = cuda.cublas.CUBLASError
    except Exception:   # then no cuBLAS error was raised; the error being asked about must propagate
        return False
    return isinstance(error, cublas_error) and status == _CUBLAS_STATUS_ALLOC_FAILED


def release_memory(error):
    """Releases what a call that failed with ``error`` (an allocation failure) still holds, so
    that a smaller call can get the memory:

    - the locals of the frames ``error`` and its causes passed through (the plan's slot values,
      its inputs on the device, an op's temporaries), which the exception keeps alive as long
      as the caller keeps it (``except MemoryError as e``, pytest.raises); the frames stay in
      the traceback, without their locals;
    - the output buffers the ops' kept runners reuse from call to call (prepared.release_kept:
      made for the failed call's shapes, and the earlier calls'), and from now on no such buffer
      is kept (prepared.stop_keeping_buffers): kept buffers hold every step's outputs, where the
      pool lets values never alive together share memory, so a step that failed with them may
      fit without (K.function runs it again once, Function.__call__);
    - on CUDA, the blocks CuPy's default pool caches, which the above returned to it: the pool
      retries a failed cudaMalloc after freeing its own cache, but cached memory is lost to
      every allocation outside that pool (a CUDA Graph capture's private pool, a library's
      own workspace, another process) and a pool limit (CUPY_GPU_MEMORY_LIMIT, set_limit)
      counts it and refuses without freeing it. It costs a device sync and fresh cudaMallocs
      for the next call, once, after a failure. Captured graphs keep their memory: it is in
      their private pools, which this does not touch."""
    seen = set()
    while error is not None and id(error) not in seen:
        seen.add(id(error))
        traceback.clear_frames(error.__traceback__)
        error = error.__cause__
    prepared.release_kept()
    prepared.stop_keeping_buffers()
    if kind() == 'cuda':
        impl().xp.get_default_memory_pool().free_all_blocks()


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
    sync); when ``run`` fails, a failed check is raised instead and none is left pending. An
    OutOfMemoryError drops the checks unread: no bad value explains a failed allocation, and
    reading them would hold the failed call's flags (and sync) before it is released."""
    from gpuk.kernels.runtime import deferred
    try:
        return run(*args)
    except OutOfMemoryError:
        deferred.discard()
        raise
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
