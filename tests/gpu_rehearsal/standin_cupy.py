"""A NumPy-backed stand-in for the ``cupy`` module, for the GPU rehearsal only.

It is the NumPy namespace plus the part of CuPy that gpuk, bench/ and tests/ use (found
with grep for ``cupy.`` and ``xp.``): ``ndarray`` *is* ``numpy.ndarray``, so the emulated
runtime can run the CUDA kernels on these arrays in place, and ``cuda`` answers like one
H100 (compute capability '90', 227 KB opt-in shared memory, 50 MB L2). Events are
perf_counter readings: timings taken with them are host times of synchronous emulated
launches and mean nothing.

It is installed into ``sys.modules['cupy']`` by ``tests.gpu_rehearsal.activate()`` and by
nothing else. What it cannot show, because it is NumPy and not CuPy:

- attributes, keywords and functions CuPy lacks: every name NumPy has exists here, and
  NumPy's signatures are accepted (tests/kernels/test_cupy_conformance.py checks our
  names against the real CuPy; it is skipped in the rehearsal);
- host/device separation: ``cupy.asarray(numpy_array)`` copies to the GPU, here it may
  return the same array, so code that writes a "device" array it got from asarray and
  expects the host array unchanged is not caught; ``ndarray.get()`` does not exist here
  (gpuk calls ``device.to_host`` / ``cupy.asnumpy`` instead, which work on both);
- 0-d results: CuPy reductions return 0-d device arrays, NumPy returns scalars; code that
  passes such a result to a kernel as an array argument fails here but not on CuPy;
- ``numpy.random.default_rng`` stands in for ``cupy.random.default_rng``, whose Generator
  has fewer methods and dtypes;
- cuBLAS: ``cuda.cublas.gemmStridedBatchedEx`` (the one call gpuk/kernels/matmul.py makes)
  is NumPy on the host memory the pointers address, so it checks the launcher's sizes,
  leading dimensions, strides and pointers, not cuBLAS's own numerics;
- asynchronous execution, streams, the memory pool, real CUDA errors: launches run
  synchronously, the pool caches nothing, and only the errors the rehearsal runtime raises
  itself (dynamic shared memory above the kernel's allowance) are CUDA-like;
- device memory: only the default pool's limit (``get_default_memory_pool().set_limit``, as in
  CuPy) is modelled, so a test can run a step out of memory. While a limit is set, the arrays
  made by the allocation functions (ALLOCATORS: what gpuk's launchers, step buffers and
  workspaces allocate with) count while they are alive, and one that would take the count past
  the limit raises ``cupy.cuda.memory.OutOfMemoryError`` with CuPy's arguments and message.
  NumPy's own results (ops computed with xp, ``asarray`` of host arrays) are not counted, a
  freed array's bytes are available at once (CuPy would cache the block), and what a CUDA
  Graph capture allocates counts too (CuPy gives it a private pool, which that limit does not
  bound);
- CUDA Graphs: ``Stream.begin_capture`` / ``end_capture`` / ``Graph.launch`` record and
  replay what the rehearsal can see: gpuk's kernel launches (rehearsal_runtime.py), the
  cuBLAS GEMM and ``cupy.copyto``; while capturing those are recorded, not run, as on a GPU.
  Everything else (ops computed with NumPy here, CuPy kernels on a GPU) runs at capture
  time and is *not* replayed, so a replay is right only for steps made of those calls;
  capturing on the legacy default stream and synchronizing a capturing stream raise as
  CUDA does.
"""
import ctypes
import functools
import itertools
import os
import sys
import time
import types
import weakref

import ml_dtypes

import numpy as np

__all__ = ['build_module']

STANDIN_NAME = 'GPU rehearsal: NumPy stand-in for CuPy (not a GPU; timings are meaningless)'


# ---- cupy.cuda ----
class CUDARuntimeError(RuntimeError):
    """cupy.cuda.runtime.CUDARuntimeError."""


class CUDADriverError(RuntimeError):
    """cupy.cuda.driver.CUDADriverError."""


class CompileException(Exception):
    """cupy.cuda.compiler.CompileException."""


# cudaDeviceAttr values (driver_types.h) of the attributes our code asks for, and an H100's answers.
RUNTIME_ATTRIBUTES = {
    'cudaDevAttrMaxThreadsPerBlock': (1, 1024),
    'cudaDevAttrMaxSharedMemoryPerBlock': (8, 49152),
    'cudaDevAttrMultiProcessorCount': (16, 132),
    'cudaDevAttrL2CacheSize': (38, 50 * 1024 * 1024),
    'cudaDevAttrComputeCapabilityMajor': (75, 9),
    'cudaDevAttrComputeCapabilityMinor': (76, 0),
    'cudaDevAttrMaxSharedMemoryPerBlockOptin': (97, 232448),
}
_ATTRIBUTE_VALUES = {code: value for code, value in RUNTIME_ATTRIBUTES.values()}


def _device_id(device):
    if device != 0:
        raise CUDARuntimeError('cudaErrorInvalidDevice: the rehearsal has one device, 0; got %r' % (device,))
    return 0


def getDeviceCount():
    return 1


def deviceGetAttribute(attribute, device):
    _device_id(device)
    if attribute not in _ATTRIBUTE_VALUES:
        raise CUDARuntimeError('cudaErrorInvalidValue: the rehearsal knows no device attribute %r' % (attribute,))
    return _ATTRIBUTE_VALUES[attribute]


def getDeviceProperties(device):
    _device_id(device)
    return {'name': STANDIN_NAME.encode(), 'major': 9, 'minor': 0, 'multiProcessorCount': 132,
            'l2CacheSize': _ATTRIBUTE_VALUES[38], 'sharedMemPerBlockOptin': _ATTRIBUTE_VALUES[97],
            'totalGlobalMem': 80 * 1024 ** 3}


def memGetInfo():
    """(free, total) bytes of an H100's 80 GiB; the stand-in's arrays live in host memory, so
    free is at most the host's free physical memory."""
    total = getDeviceProperties(0)['totalGlobalMem']
    return min(total, os.sysconf('SC_AVPHYS_PAGES') * os.sysconf('SC_PAGE_SIZE')), total


class _Synchronous:
    """What Device and Stream share: usable as context managers, and nothing to wait for."""

    def synchronize(self):
        """Launches are synchronous in the rehearsal."""

    def use(self):
        return self

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        return False


class Device(_Synchronous):
    """cupy.cuda.Device: device 0 only, compute capability '90' (CuPy's spelling of 9.0)."""

    def __init__(self, device=None):
        self.id = _device_id(0 if device is None else device)

    compute_capability = '90'

    @property
    def attributes(self):
        return {name.replace('cudaDevAttr', ''): value for name, (_, value) in RUNTIME_ATTRIBUTES.items()}


class Stream(_Synchronous):
    """cupy.cuda.Stream: ``ptr`` 0 is CUDA's legacy default stream, as in CuPy. ``with stream:``
    makes it current; capture records the calls the rehearsal sees (see the module docstring)."""

    _next_ptr = [1]

    def __init__(self, null=False, non_blocking=False, ptr=0):
        if not null and not ptr:
            ptr, Stream._next_ptr[0] = Stream._next_ptr[0], Stream._next_ptr[0] + 1
        self.ptr = ptr
        self._capture = None   # the list of recorded calls while capturing

    def __enter__(self):
        _CURRENT_STREAMS.append(self)
        return self

    def __exit__(self, *exc):
        _CURRENT_STREAMS.pop()
        return False

    def use(self):
        _CURRENT_STREAMS[0] = self
        return self

    def synchronize(self):
        if self._capture is not None:
            raise CUDARuntimeError('cudaErrorStreamCaptureUnsupported: synchronize on a capturing stream')

    def begin_capture(self, mode=None):
        if self.ptr == 0:
            raise CUDARuntimeError('cudaErrorStreamCaptureUnsupported: the legacy default stream cannot capture')
        if self._capture is not None:
            raise CUDARuntimeError('cudaErrorIllegalState: the stream is capturing already')
        self._capture = []

    def is_capturing(self):
        return self._capture is not None

    def end_capture(self):
        if self._capture is None:
            raise CUDARuntimeError('cudaErrorIllegalState: the stream is not capturing')
        calls, self._capture = self._capture, None
        return Graph(calls)


class Graph:
    """cupy.cuda.graph.Graph: replays the recorded calls in order."""

    def __init__(self, calls):
        self.calls = calls

    def launch(self, stream=None):
        for call, args, kwargs in self.calls:
            call(*args, **kwargs)


_NULL_STREAM = Stream(null=True)
_CURRENT_STREAMS = [_NULL_STREAM]


def get_current_stream(device_id=None):
    return _CURRENT_STREAMS[-1]


def run_or_record(call, *args, **kwargs):
    """call(*args, **kwargs) now, or recorded into the graph the current stream is capturing."""
    capture = _CURRENT_STREAMS[-1]._capture
    if capture is None:
        return call(*args, **kwargs)
    capture.append((call, args, kwargs))
    return None


def copyto(dst, src, casting='same_kind', where=True):
    """cupy.copyto: a device copy (a kernel on the stream, so a capture records it)."""
    return run_or_record(np.copyto, dst, src, casting=casting, where=where)


class Event:
    """cupy.cuda.Event: record() reads perf_counter (launches ran already: they are synchronous)."""

    def __init__(self, block=False, disable_timing=False, interprocess=False):
        self.disable_timing = disable_timing
        self._time = None

    def record(self, stream=None):
        self._time = time.perf_counter()

    def synchronize(self):
        if self._time is None:
            raise CUDARuntimeError('cudaErrorInvalidResourceHandle: Event.synchronize before record')

    @property
    def done(self):
        return self._time is not None


def get_elapsed_time(start_event, end_event):
    """Milliseconds between two recorded events, like cupy.cuda.get_elapsed_time."""
    for event in (start_event, end_event):
        if event._time is None or event.disable_timing:
            raise CUDARuntimeError('cudaErrorInvalidResourceHandle: get_elapsed_time needs two recorded '
                                   'timing events')
    return (end_event._time - start_event._time) * 1e3


class OutOfMemoryError(MemoryError):
    """cupy.cuda.memory.OutOfMemoryError: CuPy's arguments (the size asked for, the bytes
    allocated so far, the pool's limit or 0) and message."""

    def __init__(self, size, total, limit=0):
        self._size, self._total, self._limit = size, total, limit
        message = 'Out of memory allocating {:,} bytes '.format(size)
        if limit:
            message += '(allocated so far: {:,} bytes, limit set to: {:,} bytes).'.format(total, limit)
        else:
            message += '(allocated so far: {:,} bytes).'.format(total)
        super().__init__(message)

    def __reduce__(self):
        return type(self), (self._size, self._total, self._limit)


class MemoryPool:
    """cupy.cuda.MemoryPool as far as we use it: NumPy owns the memory, so nothing is cached
    (free_all_blocks has nothing to free); a limit counts the arrays of ALLOCATORS (see the
    module docstring). ``used_bytes``/``total_bytes``: the bytes of the counted arrays alive."""

    def __init__(self):
        self._limit = 0
        self._alive = {}   # a counted array's number -> its bytes, until it is freed
        self._numbers = itertools.count()

    def malloc(self, size):
        raise CUDARuntimeError('the rehearsal allocates with NumPy: MemoryPool.malloc is only passed to '
                               'using_allocator, never called')

    def free_all_blocks(self, stream=None):
        pass

    def set_limit(self, size=None, fraction=None):
        """CuPy's: ``size`` bytes, or a ``fraction`` of the device's memory; 0 or None: none."""
        if fraction is not None:
            size = int(fraction * getDeviceProperties(0)['totalGlobalMem'])
        self._limit = size or 0

    def get_limit(self):
        return self._limit

    def used_bytes(self):
        return sum(self._alive.values())

    def free_bytes(self):
        return 0   # the stand-in's pool caches nothing

    def total_bytes(self):
        return self.used_bytes()

    def count(self, array):
        """Counts ``array`` (just allocated) while it is alive, or raises OutOfMemoryError when
        it does not fit under the limit (the array is dropped: nothing was handed out)."""
        used = self.used_bytes()
        if used + array.nbytes > self._limit:
            raise OutOfMemoryError(array.nbytes, used, self._limit)
        number = next(self._numbers)
        self._alive[number] = array.nbytes
        weakref.finalize(array, self._alive.pop, number, None)


_DEFAULT_POOL = MemoryPool()


def get_default_memory_pool():
    return _DEFAULT_POOL


# The NumPy functions the stand-in allocates "device" arrays with, counted under a pool limit
ALLOCATORS = ('empty', 'zeros', 'ones', 'full', 'empty_like', 'zeros_like', 'ones_like', 'full_like')


def _pooled(allocate):
    """``allocate`` (one of ALLOCATORS) handing out memory of the default pool."""
    @functools.wraps(allocate)
    def pooled(*args, **kwargs):
        array = allocate(*args, **kwargs)
        if _DEFAULT_POOL._limit:
            _DEFAULT_POOL.count(array)
        return array
    return pooled


class using_allocator:
    """cupy.cuda.using_allocator: NumPy allocates here, so the allocator is remembered, not used."""

    def __init__(self, allocator=None):
        self.allocator = allocator

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        return False


# ---- cupy.cuda.cublas: the one GEMM gpuk calls, on host memory ----
# cudaDataType_t codes (library_types.h) -> NumPy dtypes, and cublasComputeType_t CUBLAS_COMPUTE_32F
_CUDA_DATA_TYPES = {0: np.float32, 2: np.float16, 14: ml_dtypes.bfloat16}
_CUBLAS_COMPUTE_32F = 68


class CUBLASError(RuntimeError):
    """cupy_backends.cuda.libs.cublas.CUBLASError."""


def _column_major(pointer, dtype, rows, cols, ld, stride, batch):
    """(batch, rows, cols) view of column-major matrices at ``pointer`` (host memory)."""
    itemsize = np.dtype(dtype).itemsize
    extent = stride * (batch - 1) + ld * (cols - 1) + rows
    buffer = (ctypes.c_char * (extent * itemsize)).from_address(pointer)
    flat = np.frombuffer(buffer, dtype=dtype, count=extent)
    return np.lib.stride_tricks.as_strided(flat, (batch, rows, cols), (stride * itemsize, itemsize, ld * itemsize))


def gemmStridedBatchedEx(handle, transa, transb, m, n, k, alpha, A, Atype, lda, strideA, B, Btype, ldb,
                         strideB, beta, C, Ctype, ldc, strideC, batchCount, computeType, algo):
    """cublasGemmStridedBatchedEx with float32 compute, untransposed operands and host-mode
    alpha/beta (what gpuk/kernels/matmul.py passes; anything else is refused): C_i = alpha
    A_i B_i + beta C_i over column-major matrices, summed in float32."""
    if (transa, transb) != (0, 0) or computeType != _CUBLAS_COMPUTE_32F or handle != _CUBLAS_HANDLE:
        raise CUBLASError('CUBLAS_STATUS_NOT_SUPPORTED: the rehearsal takes only OP_N, COMPUTE_32F and its handle')
    if lda < m or ldb < k or ldc < m or min(m, n, k, batchCount) < 1:
        raise CUBLASError('CUBLAS_STATUS_INVALID_VALUE: m=%d n=%d k=%d lda=%d ldb=%d ldc=%d batch=%d'
                          % (m, n, k, lda, ldb, ldc, batchCount))
    a = _column_major(A, _CUDA_DATA_TYPES[Atype], m, k, lda, strideA, batchCount).astype(np.float32)
    b = _column_major(B, _CUDA_DATA_TYPES[Btype], k, n, ldb, strideB, batchCount).astype(np.float32)
    c = _column_major(C, _CUDA_DATA_TYPES[Ctype], m, n, ldc, strideC, batchCount)
    scale = [np.frombuffer((ctypes.c_char * 4).from_address(p), np.float32)[0] for p in (alpha, beta)]
    result = scale[0] * np.matmul(a, b)
    if scale[1] != 0:
        result += scale[1] * c.astype(np.float32)
    c[...] = result.astype(c.dtype)


_CUBLAS_HANDLE = 1


def _set_pointer_mode(handle, mode):
    if mode != 0:
        raise CUBLASError('CUBLAS_STATUS_NOT_SUPPORTED: the rehearsal reads alpha and beta from the host only')


def _build_cublas():
    cublas = types.ModuleType('cupy.cuda.cublas')
    cublas.CUBLASError = CUBLASError
    cublas.CUBLAS_POINTER_MODE_HOST = 0
    cublas.setPointerMode = _set_pointer_mode
    cublas.setStream = lambda handle, stream_ptr: None    # launches are synchronous here
    cublas.gemmStridedBatchedEx = lambda *args: run_or_record(gemmStridedBatchedEx, *args)
    return cublas


# ---- cupy.random ----
class RandomState:
    """cupy.random.RandomState: CuPy's samplers take ``dtype`` (float32 or float64), NumPy's legacy
    RandomState does not, so this draws with a NumPy Generator and casts."""

    def __init__(self, seed=None):
        self._generator = np.random.default_rng(seed)

    def standard_normal(self, size=None, dtype=float):
        return self._generator.standard_normal(size, dtype=_float_dtype(dtype))

    def normal(self, loc=0.0, scale=1.0, size=None, dtype=float):
        return (loc + scale * self._generator.standard_normal(size)).astype(_float_dtype(dtype))

    def uniform(self, low=0.0, high=1.0, size=None, dtype=float):
        return self._generator.uniform(low, high, size).astype(_float_dtype(dtype))

    def random_sample(self, size=None, dtype=float):
        return self._generator.random(size, dtype=_float_dtype(dtype))

    def randint(self, low, high=None, size=None, dtype=int):
        return self._generator.integers(low, high, size, dtype=dtype)


def _float_dtype(dtype):
    dtype = np.dtype(dtype)
    if dtype not in (np.float32, np.float64):
        raise TypeError('cupy.random: dtype must be float32 or float64, got %s' % dtype)
    return dtype


_GLOBAL_RANDOM_STATE = RandomState()


def _seed(seed=None):
    _GLOBAL_RANDOM_STATE._generator = np.random.default_rng(seed)


def _build_random():
    random = types.ModuleType('cupy.random')
    random.RandomState = RandomState
    random.default_rng = np.random.default_rng   # see the module docstring: CuPy's Generator is smaller
    random.Generator = np.random.Generator
    random.seed = _seed
    for name in ('standard_normal', 'normal', 'uniform', 'random_sample', 'randint'):
        setattr(random, name, getattr(_GLOBAL_RANDOM_STATE, name))
    return random


# ---- the module ----
def asnumpy(a, stream=None, order='C', out=None):
    """cupy.asnumpy: a NumPy copy (CuPy always copies device memory to the host)."""
    array = np.array(a, order=order)
    if out is not None:
        out[...] = array
        return out
    return array


def get_array_module(*args):
    return sys.modules['cupy']


def _build_cuda():
    cuda = types.ModuleType('cupy.cuda')
    runtime = types.ModuleType('cupy.cuda.runtime')
    for name, (code, _) in RUNTIME_ATTRIBUTES.items():
        setattr(runtime, name, code)
    runtime.CUDARuntimeError = CUDARuntimeError
    runtime.getDeviceCount = getDeviceCount
    runtime.deviceGetAttribute = deviceGetAttribute
    runtime.getDeviceProperties = getDeviceProperties
    runtime.memGetInfo = memGetInfo
    runtime.runtimeGetVersion = lambda: 13000
    runtime.driverGetVersion = lambda: 13000
    runtime.profilerStart = runtime.profilerStop = lambda: None   # no profiler here (bench/ncu_cases.py)
    driver = types.ModuleType('cupy.cuda.driver')
    driver.CUDADriverError = CUDADriverError
    compiler = types.ModuleType('cupy.cuda.compiler')
    compiler.CompileException = CompileException
    memory = types.ModuleType('cupy.cuda.memory')
    memory.OutOfMemoryError, memory.MemoryPool = OutOfMemoryError, MemoryPool
    cuda.runtime, cuda.driver, cuda.compiler, cuda.memory = runtime, driver, compiler, memory
    cuda.Device, cuda.Stream, cuda.Event, cuda.MemoryPool = Device, Stream, Event, MemoryPool
    cuda.Graph, cuda.using_allocator = Graph, using_allocator
    cuda.set_allocator = lambda allocator=None: None   # NumPy allocates: there is no pool to turn off
    runtime.streamCaptureModeRelaxed = 2
    cuda.get_current_stream = get_current_stream
    cuda.get_elapsed_time = get_elapsed_time
    cuda.is_available = lambda: True
    cuda.cublas = _build_cublas()
    cuda.get_cublas_handle = lambda: _CUBLAS_HANDLE
    return cuda


def build_module():
    """A fresh ``cupy`` stand-in module (see the module docstring); its submodules are returned too,
    keyed by their import names, so ``import cupy.cuda`` works once they are in sys.modules."""
    cupy = types.ModuleType('cupy', __doc__)
    for name in dir(np):
        if not name.startswith('_'):
            setattr(cupy, name, getattr(np, name))
    cupy.__version__ = 'gpu-rehearsal-standin'
    cupy.ndarray = np.ndarray
    for name in ALLOCATORS:
        setattr(cupy, name, _pooled(getattr(np, name)))
    cupy.asnumpy = asnumpy
    cupy.copyto = copyto
    cupy.get_array_module = get_array_module
    cupy.get_default_memory_pool = get_default_memory_pool
    cupy.cuda = _build_cuda()
    cupy.random = _build_random()
    cupy.STANDIN = True          # activate() reads it: the stand-in is in sys.modules
    submodules = {'cupy': cupy, 'cupy.cuda': cupy.cuda, 'cupy.random': cupy.random,
                  'cupy.cuda.runtime': cupy.cuda.runtime, 'cupy.cuda.driver': cupy.cuda.driver,
                  'cupy.cuda.compiler': cupy.cuda.compiler, 'cupy.cuda.cublas': cupy.cuda.cublas,
                  'cupy.cuda.memory': cupy.cuda.memory}
    return cupy, submodules
