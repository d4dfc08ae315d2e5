"""The cuDNN 9 library through ctypes: prototypes, enumerators, handle and descriptors.

Shared by the legacy-API paths (pooling in ``cudnn_legacy``, CTC in ``cudnn_ctc``, softmax
in ``cudnn_softmax``); the convolution path uses the cuDNN Frontend instead (``cudnn``).

Every function we call (and the getters the tests read descriptors back with) is declared
in ``PROTOTYPES`` (restype and argtypes, as in the cuDNN 9 headers cudnn_graph.h /
cudnn_ops.h / cudnn_adv.h), so ctypes converts and counts the arguments of each call
instead of guessing them; tests compare the table with the headers and run the descriptor
calls without a GPU. The enumerator values below are
those of the same headers.

``library()`` is the loaded library with the prototypes applied: the copy detection loaded
(``cudnn._state``) when the cuDNN path is available, else ``load()`` (no GPU needed, for the
descriptor tests). ``handle()`` is one legacy handle per device bound to CuPy's current
stream; ``Descriptors`` creates and sets descriptors for one call and destroys them on exit.
"""
import ctypes
import threading

from . import cudnn

__all__ = ['PROTOTYPES', 'DATA_TYPES', 'load', 'library', 'check', 'handle', 'Descriptors', 'scalars']

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
        found, reason = cudnn._load_library()
        if found is None:
            raise RuntimeError('cudnn_library: %s' % reason)
        _loaded['library'] = declare(found)
    return _loaded['library']


def library():
    """The library of the available cuDNN path (prototypes applied); RuntimeError when unavailable."""
    if not cudnn.available():
        raise RuntimeError('cudnn_library: the cuDNN path is unavailable: %s' % cudnn.why_unavailable())
    return declare(cudnn._state['library'])


def check(lib, status, what):
    """Raises RuntimeError naming ``what`` and cuDNN's message when ``status`` is not success."""
    if status != 0:
        message = lib.cudnnGetErrorString(status).decode(errors='replace')
        raise RuntimeError('cuDNN: %s failed with status %d (%s)' % (what, status, message))


def handle(lib):
    """This thread's legacy handle for this device, bound to CuPy's current stream (it may change
    between calls)."""
    import cupy
    device_id = cupy.cuda.Device().id
    by_device = _handles.__dict__.setdefault('by_device', {})
    if device_id not in by_device:
        created = ctypes.c_void_p()
        check(lib, lib.cudnnCreate(ctypes.byref(created)), 'cudnnCreate')
        by_device[device_id] = created
    bound = by_device[device_id]
    check(lib, lib.cudnnSetStream(bound, cupy.cuda.get_current_stream().ptr), 'cudnnSetStream')
    return bound


def scalars(dtype_name):
    """(alpha = 1, beta = 0): double for double data, float otherwise (cuDNN's scaling rule)."""
    kind = ctypes.c_double if dtype_name == 'float64' else ctypes.c_float
    return kind(1.0), kind(0.0)


def _int_array(values):
    return (ctypes.c_int * len(values))(*values)


class Descriptors:
    """The descriptors of one call: created and set on request, destroyed on exit."""

    def __init__(self, lib):
        self.lib, self._created = lib, []   # (destroy function name, descriptor)

    def _create(self, kind):
        desc = ctypes.c_void_p()
        check(self.lib, getattr(self.lib, 'cudnnCreate%sDescriptor' % kind)(ctypes.byref(desc)),
              'cudnnCreate%sDescriptor' % kind)
        self._created.append(('cudnnDestroy%sDescriptor' % kind, desc))
        return desc

    def tensor(self, data_type, dims, strides):
        """cudnnSetTensorNdDescriptor(dataType, nbDims, dimA, strideA)."""
        desc = self._create('Tensor')
        check(self.lib, self.lib.cudnnSetTensorNdDescriptor(desc, data_type, len(dims), _int_array(dims),
                                                           _int_array(strides)), 'cudnnSetTensorNdDescriptor')
        return desc

    def pooling(self, mode, nan_propagation, window, pads, strides):
        """cudnnSetPoolingNdDescriptor(mode, maxpoolingNanOpt, nbDims, windowDimA, paddingA, strideA)."""
        desc = self._create('Pooling')
        check(self.lib, self.lib.cudnnSetPoolingNdDescriptor(desc, mode, nan_propagation, len(window),
                                                            _int_array(window), _int_array(pads),
                                                            _int_array(strides)), 'cudnnSetPoolingNdDescriptor')
        return desc

    def ctc_loss(self, comp_type, norm_mode, grad_mode, max_label_length):
        """cudnnSetCTCLossDescriptor_v9(compType, normMode, ctcGradMode, maxLabelLength)."""
        desc = self._create('CTCLoss')
        check(self.lib, self.lib.cudnnSetCTCLossDescriptor_v9(desc, comp_type, norm_mode, grad_mode,
                                                             max_label_length), 'cudnnSetCTCLossDescriptor_v9')
        return desc

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        for destroy, desc in reversed(self._created):
            getattr(self.lib, destroy)(desc)
        self._created.clear()
