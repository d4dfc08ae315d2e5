"""The cuDNN library: whether it can run here, the handles, the per-family choice, and the
cuDNN 9 library itself through ctypes (prototypes, enumerators, descriptors).

Optional. ``available()`` says whether the cuDNN path can run here and ``why_unavailable()``
why not: it needs the frontend (``import cudnn``, PyPI ``nvidia-cudnn-frontend``), the
cuDNN 9 library (``libcudnn.so.9``, e.g. from the ``nvidia-cudnn-cu13`` / ``-cu12`` wheels)
and a usable GPU through CuPy. ``choose(family)`` says which implementation a family runs
with; one set to 'cudnn' that must fall back to gpuk's kernels says so once. A cuDNN
function that cannot take a problem raises ``Unsupported`` (gpuk's kernels then run it).

The convolution and batch-norm paths use the cuDNN Frontend (``frontend()``,
``frontend_handle()``); pooling, CTC and softmax call the legacy API. For those, every
function we call (and the getters the tests read descriptors back with) is declared
in ``PROTOTYPES`` (restype and argtypes, as in the cuDNN 9 headers cudnn_graph.h /
cudnn_ops.h / cudnn_adv.h), so ctypes converts and counts the arguments of each call
instead of guessing them; tests compare the table with the headers and run the descriptor
calls without a GPU. The enumerator values below are those of the same headers.

``library()`` is the loaded library with the prototypes applied: the copy detection loaded
when the cuDNN path is available, else ``load()`` (no GPU needed, for the descriptor
tests). ``handle()`` is one legacy handle per device bound to CuPy's current stream;
``Descriptors`` creates and sets descriptors for one call and destroys them on exit.
A legacy call's failures name the gpuk function called and its problem (a ``Described``, made
once per call by ``describe`` and passed to ``check``, ``handle`` and ``Descriptors``), the cuDNN
function and cuDNN's status.
"""
import ctypes
import glob
import os
import re
import sys
import threading
import warnings
from collections import namedtuple

from gpuk import config
from gpuk.kernels import runtime
from gpuk.kernels.runtime import device_pointer   # cuDNN's calls take device_pointer(array)

__all__ = ['Unsupported', 'AllocationFailed', 'ALLOCATION_FAILED_STATUSES', 'allocation_failed', 'available',
           'why_unavailable', 'reset_probe', 'choose', 'library_path', 'frontend', 'frontend_handle', 'BuiltGraph',
           'cached_graph', 'device_pointer', 'execute_graph', 'PROTOTYPES', 'DATA_TYPES', 'load', 'library',
           'Described', 'describe', 'check', 'handle', 'Descriptors', 'scalars']


class Unsupported(Exception):
    """Raised by a cuDNN path for a problem outside cuDNN's limits (e.g. CTC labels >= 256)."""


class AllocationFailed(RuntimeError, MemoryError):
    """cuDNN could not allocate memory (``allocation_failed``): the message names the call, the
    problem's sizes and cuDNN's reason; ``status`` is the cudnnStatus_t where a legacy call
    returned one, else None. A RuntimeError like cuDNN's other failures, and a MemoryError, so
    that K.function raises gpuk.OutOfMemoryError for it (device.out_of_memory: any MemoryError)
    with its guarantees: no variable changed, the call's memory released."""

    def __init__(self, message, status=None):
        super().__init__(message)
        self.status = status

    def __reduce__(self):
        return type(self), (str(self), self.status)


# cudnnStatus_t (cuDNN 9, cudnn_graph.h) of a failed allocation inside cuDNN: host memory and
# device memory (cuDNN's own cudaMalloc, e.g. a runtime-compiled engine's buffers; the workspace
# is ours, CuPy's). cuDNN 8's CUDNN_STATUS_ALLOC_FAILED, deprecated in 9, is matched by its name.
ALLOCATION_FAILED_STATUSES = {4003: 'CUDNN_STATUS_INTERNAL_ERROR_HOST_ALLOCATION_FAILED',
                              4004: 'CUDNN_STATUS_INTERNAL_ERROR_DEVICE_ALLOCATION_FAILED'}
# The cuDNN Frontend's Python binding raises a plain RuntimeError for a failed cuDNN or CUDA call,
# whose message is "<call> failed with <cudnnGetErrorString(status)>" (cudaGetErrorString's for a
# CUDA call: "out of memory" for cudaErrorMemoryAllocation); pybind11 turns std::bad_alloc into
# MemoryError. These names in the message say the allocation failed.
_ALLOCATION_FAILED_MESSAGE = re.compile(
    r'\b(CUDNN_STATUS_INTERNAL_ERROR_HOST_ALLOCATION_FAILED|CUDNN_STATUS_INTERNAL_ERROR_DEVICE_ALLOCATION_FAILED'
    r'|CUDNN_STATUS_ALLOC_FAILED)\b|failed with out of memory')


def allocation_failed(error):
    """Whether ``error`` (raised by a cuDNN Frontend call, or a MemoryError from anywhere) says an
    allocation failed. Statuses that may stem from memory but do not say so (INTERNAL_ERROR,
    EXECUTION_FAILED) are not counted."""
    return isinstance(error, MemoryError) or bool(_ALLOCATION_FAILED_MESSAGE.search(str(error)))


def _failure(what, exc):
    """The error for ``exc`` raised inside a cuDNN call: ``what`` (the call and problem), then the
    cause; AllocationFailed when the allocation failed, else RuntimeError."""
    kind = AllocationFailed if allocation_failed(exc) else RuntimeError
    return kind('%s (%s: %s)' % (what, type(exc).__name__, exc))


_state = {'reason': None, 'probed': False, 'library': None, 'frontend': None}
_warned_families = set()
_frontend_handles = threading.local()   # per thread: device id -> Frontend handle (not shared across threads)


# ---------------------------------------------------------------- detection

def library_path(search_paths=None):
    """Path of libcudnn.so.9 inside the NVIDIA wheels (site-packages/nvidia/*/lib), or None.

    ``search_paths`` defaults to ``sys.path``.
    """
    for base in (sys.path if search_paths is None else search_paths):
        if not base or not os.path.isdir(os.path.join(base, 'nvidia')):
            continue
        # nvidia-cudnn-cu12 installs nvidia/cudnn/lib; keep any nvidia/*/lib layout too
        for pattern in ('cudnn/lib/libcudnn.so.9', '*/lib/libcudnn.so.9'):
            found = sorted(glob.glob(os.path.join(base, 'nvidia', pattern)))
            if found:
                return found[0]
    return None


def _load_library():
    """(ctypes library, None) or (None, reason). Wheels first, then the loader's path."""
    candidates = [p for p in (library_path(),) if p] + ['libcudnn.so.9']
    errors = []
    for candidate in candidates:
        try:
            # RTLD_GLOBAL so the frontend's own dlopen of libcudnn finds this copy
            library = ctypes.CDLL(candidate, mode=ctypes.RTLD_GLOBAL)
        except OSError as exc:
            errors.append('%s: %s' % (candidate, exc))
            continue
        library.cudnnGetVersion.restype = ctypes.c_size_t
        version = library.cudnnGetVersion()
        if version // 10000 != 9:
            errors.append('%s is cuDNN %d, need 9.x' % (candidate, version))
            continue
        return library, None
    return None, ('the cuDNN 9 library was not found or failed to load (pip install '
                  'nvidia-cudnn-cu13 or nvidia-cudnn-cu12): %s' % '; '.join(errors))


def _import_frontend():
    """(cudnn module, None) or (None, reason)."""
    try:
        import cudnn as frontend
    except Exception as exc:
        return None, ('the cuDNN Frontend Python package cannot be imported (pip install '
                      'nvidia-cudnn-frontend): %s: %s' % (type(exc).__name__, exc))
    if not hasattr(frontend, 'pygraph'):
        return None, ('the imported module cudnn (%s) is not the cuDNN Frontend: it has no '
                      'pygraph' % getattr(frontend, '__file__', '?'))
    return frontend, None


def _probe():
    if _state['probed']:
        return
    reason = runtime.gpu_unusable_reason()
    library = frontend = None
    if reason is None:
        library, reason = _load_library()
    if reason is None:
        frontend, reason = _import_frontend()
    _state.update(probed=True, reason=reason, library=library, frontend=frontend)


def available():
    """True when the cuDNN path can run here (frontend, cuDNN 9 and a GPU)."""
    _probe()
    return _state['reason'] is None


def why_unavailable():
    """Why the cuDNN path cannot run here; '' when it can."""
    _probe()
    return _state['reason'] or ''


def reset_probe():
    """Forget the detection result (after installing cuDNN, or in tests)."""
    _state.update(reason=None, probed=False, library=None, frontend=None)
    _warned_families.clear()


def fallback_message(family, reason):
    """The sentence printed once when ``family`` was set to 'cudnn' but cannot use it."""
    return ("gpuk: kernels for %r are set to 'cudnn' but cuDNN is unavailable (%s); "
            "using gpuk's own kernels" % (family, reason))


def choose(family):
    """The implementation ``family`` runs with here: 'gpuk', 'cudnn' or 'auto'.

    'cudnn' or 'auto' without cuDNN gives 'gpuk'; for 'cudnn' that warns once per family.
    """
    wanted = config.kernels(family)
    if wanted == 'gpuk' or available():
        return wanted
    if wanted == 'cudnn' and family not in _warned_families:
        _warned_families.add(family)
        warnings.warn(fallback_message(family, why_unavailable()), RuntimeWarning, stacklevel=2)
    return 'gpuk'



def frontend():
    """The cuDNN Frontend module of the available cuDNN path; RuntimeError saying why when unavailable."""
    if not available():
        raise RuntimeError('cudnn: the cuDNN path is unavailable: %s' % why_unavailable())
    return _state['frontend']


def frontend_handle(frontend, cupy):
    """(device id, this thread's cuDNN Frontend handle for it), bound to CuPy's current stream."""
    device_id = cupy.cuda.Device().id
    by_device = _frontend_handles.__dict__.setdefault('by_device', {})
    handle = by_device.get(device_id)
    if handle is None:
        handle = by_device[device_id] = frontend.create_handle()
    # bound on every call: CuPy's current stream may change between calls
    frontend.set_stream(handle=handle, stream=cupy.cuda.get_current_stream().ptr)
    return device_id, handle


# ---------------------------------------------------------------- Frontend graphs, built once per key

BuiltGraph = namedtuple('BuiltGraph', ['graph', 'tensors', 'workspace_size'])


def cached_graph(cache, key, build, what):
    """``cache[key]``, built by ``build()`` (a BuiltGraph) on first use. A build failure other
    than ``Unsupported`` raises RuntimeError (AllocationFailed when cuDNN could not allocate):
    ``what`` (the call and problem), then the cause. A failed build is not kept: the next call
    builds again."""
    built = cache.get(key)
    if built is None:
        try:
            built = cache[key] = build()
        except Unsupported:
            raise
        except Exception as exc:
            raise _failure(what, exc) from exc
    return built


def execute_graph(built, pack, handle, what):
    """Runs a BuiltGraph on ``pack`` (its tensors -> device pointers) with a fresh workspace on
    CuPy's current stream (CuPy's OutOfMemoryError when it does not fit); a failure raises
    RuntimeError (AllocationFailed when cuDNN could not allocate): ``what``, then the cause."""
    import cupy
    workspace = cupy.empty(max(built.workspace_size, 1), dtype=cupy.uint8)
    try:
        built.graph.execute(pack, device_pointer(workspace), handle=handle)
    except Exception as exc:
        raise _failure(what, exc) from exc


# ---------------------------------------------------------------- the cuDNN 9 library (legacy API)


# cudnn_graph.h: cudnnDataType_t, cudnnNanPropagation_t
DATA_TYPES = {'float32': 0, 'float64': 1, 'float16': 2}     # CUDNN_DATA_FLOAT / _DOUBLE / _HALF
CUDNN_DATA_FLOAT = DATA_TYPES['float32']
CUDNN_NOT_PROPAGATE_NAN = 0
CUDNN_PROPAGATE_NAN = 1
# cudnn_ops.h: cudnnPoolingMode_t, cudnnSoftmaxAlgorithm_t, cudnnSoftmaxMode_t
CUDNN_POOLING_MAX = 0
CUDNN_POOLING_AVERAGE_COUNT_EXCLUDE_PADDING = 2
CUDNN_POOLING_MAX_DETERMINISTIC = 3
CUDNN_SOFTMAX_ACCURATE = 1
CUDNN_SOFTMAX_LOG = 2
CUDNN_SOFTMAX_MODE_CHANNEL = 1
# cudnn_adv.h: cudnnCTCLossAlgo_t, cudnnLossNormalizationMode_t, cudnnCTCGradMode_t
CUDNN_CTC_LOSS_ALGO_DETERMINISTIC = 0
CUDNN_LOSS_NORMALIZATION_SOFTMAX = 1
CUDNN_CTC_ZERO_OOB_GRADIENTS = 0

_status = ctypes.c_int          # cudnnStatus_t
_enum = ctypes.c_int            # every cudnn*_t enumeration
_opaque = ctypes.c_void_p       # cudnnHandle_t, cudaStream_t, cudnn*Descriptor_t, void*
_opaque_out = ctypes.POINTER(ctypes.c_void_p)
_ints = ctypes.POINTER(ctypes.c_int)        # int[] / int* / enum* (enums are int-sized)
_size = ctypes.c_size_t

PROTOTYPES = {
    # cudnn_graph.h
    'cudnnGetVersion': (ctypes.c_size_t, []),
    'cudnnGetErrorString': (ctypes.c_char_p, [_status]),
    'cudnnCreate': (_status, [_opaque_out]),
    'cudnnSetStream': (_status, [_opaque, _opaque]),
    # cudnn_ops.h: tensors
    'cudnnCreateTensorDescriptor': (_status, [_opaque_out]),
    'cudnnSetTensorNdDescriptor': (_status, [_opaque, _enum, ctypes.c_int, _ints, _ints]),
    'cudnnGetTensorNdDescriptor': (_status, [_opaque, ctypes.c_int, _ints, _ints, _ints, _ints]),
    'cudnnDestroyTensorDescriptor': (_status, [_opaque]),
    # cudnn_ops.h: pooling
    'cudnnCreatePoolingDescriptor': (_status, [_opaque_out]),
    'cudnnSetPoolingNdDescriptor': (_status, [_opaque, _enum, _enum, ctypes.c_int, _ints, _ints, _ints]),
    'cudnnGetPoolingNdDescriptor': (_status, [_opaque, ctypes.c_int, _ints, _ints, _ints, _ints, _ints, _ints]),
    'cudnnGetPoolingNdForwardOutputDim': (_status, [_opaque, _opaque, ctypes.c_int, _ints]),
    'cudnnDestroyPoolingDescriptor': (_status, [_opaque]),
    'cudnnPoolingForward': (_status, [_opaque, _opaque, _opaque, _opaque, _opaque, _opaque, _opaque, _opaque]),
    'cudnnPoolingBackward': (_status, [_opaque, _opaque, _opaque, _opaque, _opaque, _opaque, _opaque, _opaque,
                                       _opaque, _opaque, _opaque, _opaque]),
    # cudnn_ops.h: softmax
    'cudnnSoftmaxForward': (_status, [_opaque, _enum, _enum, _opaque, _opaque, _opaque, _opaque, _opaque,
                                      _opaque]),
    'cudnnSoftmaxBackward': (_status, [_opaque, _enum, _enum, _opaque, _opaque, _opaque, _opaque, _opaque,
                                       _opaque, _opaque, _opaque]),
    # cudnn_adv.h: CTC (the _v9 descriptor calls: _v8's are deprecated in cuDNN 9)
    'cudnnCreateCTCLossDescriptor': (_status, [_opaque_out]),
    'cudnnSetCTCLossDescriptor_v9': (_status, [_opaque, _enum, _enum, _enum, ctypes.c_int]),
    'cudnnGetCTCLossDescriptor_v9': (_status, [_opaque, _ints, _ints, _ints, _ints]),
    'cudnnDestroyCTCLossDescriptor': (_status, [_opaque]),
    'cudnnGetCTCLossWorkspaceSize_v8': (_status, [_opaque, _enum, _opaque, _opaque, _opaque,
                                                  ctypes.POINTER(ctypes.c_size_t)]),
    # labels, labelLengths, inputLengths: int arrays in GPU memory, passed as CuPy addresses
    'cudnnCTCLoss_v8': (_status, [_opaque, _enum, _opaque, _opaque, _opaque, _opaque, _opaque, _opaque, _opaque,
                                  _opaque, _opaque, _size, _opaque]),
}

_loaded = {'library': None}     # a library load() opened (no GPU needed)
_declared = set()               # id() of the libraries declare() has prepared
# One cudnnHandle_t per (thread, device): cuDNN handles must not be shared across threads,
# and CuPy's current stream, which each call binds, is per thread too.
_handles = threading.local()


def declare(library):
    """Applies ``PROTOTYPES`` to a ctypes library (once per library); returns it."""
    if id(library) not in _declared:
        for name, (restype, argtypes) in PROTOTYPES.items():
            function = getattr(library, name)
            function.restype, function.argtypes = restype, argtypes
        _declared.add(id(library))
    return library


def load():
    """The cuDNN 9 library with the prototypes applied, loaded without asking for a GPU.

    Raises RuntimeError saying why when it cannot be loaded."""
    if _loaded['library'] is None:
        found, reason = _load_library()
        if found is None:
            raise RuntimeError('cudnn.library: %s' % reason)
        _loaded['library'] = declare(found)
    return _loaded['library']


def library():
    """The library of the available cuDNN path (prototypes applied); RuntimeError when unavailable."""
    if not available():
        raise RuntimeError('cudnn.library: the cuDNN path is unavailable: %s' % why_unavailable())
    return declare(_state['library'])


class Described(namedtuple('Described', ['fn', 'sizes'])):
    """What a legacy call's errors name (made by ``describe``): ``fn``, the gpuk function the user
    called, and ``sizes``, its problem as cuDNN gets it (shapes, dtype, layout, window ...): a
    dict, formatted only when a call failed."""

    def failed(self, call):
        """'<fn>: cuDNN <call> failed for <name> <value>, ...' (``sizes`` in their order)."""
        return '%s: cuDNN %s failed for %s' % (self.fn, call, ', '.join('%s %s' % item for item in self.sizes.items()))


def describe(fn, **sizes):
    """One call of ``fn`` described for its errors (``describe('pool_fwd', x=(8, 5, 5, 3),
    dtype='float32').failed('cudnnPoolingForward')``: 'pool_fwd: cuDNN cudnnPoolingForward failed
    for x (8, 5, 5, 3), dtype float32')."""
    return Described(fn, sizes)


def check(lib, status, call, described):
    """Raises RuntimeError when ``status`` is not success, naming the call ``described``,
    the cuDNN function ``call`` and cuDNN's status: AllocationFailed for an allocation failure
    (ALLOCATION_FAILED_STATUSES, or a status cuDNN names as one)."""
    if status != 0:
        message = lib.cudnnGetErrorString(status).decode(errors='replace')
        text = '%s (status %d: %s)' % (described.failed(call), status, message)
        if status in ALLOCATION_FAILED_STATUSES or _ALLOCATION_FAILED_MESSAGE.search(message):
            raise AllocationFailed(text, status)
        raise RuntimeError(text)


def handle(lib, described):
    """This thread's legacy handle for this device, bound to CuPy's current stream (it may change
    between calls); a failure names the call ``described``."""
    import cupy
    device_id = cupy.cuda.Device().id
    by_device = _handles.__dict__.setdefault('by_device', {})
    if device_id not in by_device:
        created = ctypes.c_void_p()
        check(lib, lib.cudnnCreate(ctypes.byref(created)), 'cudnnCreate', described)
        by_device[device_id] = created
    bound = by_device[device_id]
    check(lib, lib.cudnnSetStream(bound, cupy.cuda.get_current_stream().ptr), 'cudnnSetStream', described)
    return bound


def scalars(dtype_name):
    """(alpha = 1, beta = 0): double for double data, float otherwise (cuDNN's scaling rule)."""
    kind = ctypes.c_double if dtype_name == 'float64' else ctypes.c_float
    return kind(1.0), kind(0.0)


def _int_array(values):
    return (ctypes.c_int * len(values))(*values)


class Descriptors:
    """The descriptors of the call ``described`` (which failures name): created and set on
    request, destroyed on exit. ``check(status, call)`` checks the call's other cuDNN calls."""

    def __init__(self, lib, described):
        self.lib, self.described, self._created = lib, described, []   # (destroy function name, descriptor)

    def check(self, status, call):
        check(self.lib, status, call, self.described)

    def _create(self, kind):
        desc = ctypes.c_void_p()
        self.check(getattr(self.lib, 'cudnnCreate%sDescriptor' % kind)(ctypes.byref(desc)),
                   'cudnnCreate%sDescriptor' % kind)
        self._created.append(('cudnnDestroy%sDescriptor' % kind, desc))
        return desc

    def tensor(self, data_type, dims, strides):
        """cudnnSetTensorNdDescriptor(dataType, nbDims, dimA, strideA)."""
        desc = self._create('Tensor')
        self.check(self.lib.cudnnSetTensorNdDescriptor(desc, data_type, len(dims), _int_array(dims),
                                                       _int_array(strides)), 'cudnnSetTensorNdDescriptor')
        return desc

    def pooling(self, mode, nan_propagation, window, pads, strides):
        """cudnnSetPoolingNdDescriptor(mode, maxpoolingNanOpt, nbDims, windowDimA, paddingA, strideA)."""
        desc = self._create('Pooling')
        self.check(self.lib.cudnnSetPoolingNdDescriptor(desc, mode, nan_propagation, len(window), _int_array(window),
                                                        _int_array(pads), _int_array(strides)),
                   'cudnnSetPoolingNdDescriptor')
        return desc

    def ctc_loss(self, comp_type, norm_mode, grad_mode, max_label_length):
        """cudnnSetCTCLossDescriptor_v9(compType, normMode, ctcGradMode, maxLabelLength)."""
        desc = self._create('CTCLoss')
        self.check(self.lib.cudnnSetCTCLossDescriptor_v9(desc, comp_type, norm_mode, grad_mode, max_label_length),
                   'cudnnSetCTCLossDescriptor_v9')
        return desc

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        for destroy, desc in reversed(self._created):
            getattr(self.lib, destroy)(desc)
        self._created.clear()
