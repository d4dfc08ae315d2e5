"""CTC loss and gradient through cuDNN 9's legacy API (cudnnCTCLoss_v8) with ctypes.

``ctc_loss_with_grad(logits, labels, input_lengths, label_lengths, blank=None)`` returns
(loss (N,), dlogits (N, T, A)) for dloss = 1 and runs the implementation chosen for the
'ctc' family (``dispatch.run``): gpuk's kernels (ctc_loss_fwd + ctc_loss_bwd) or cuDNN.

cuDNN's terms, and how ours are translated (pure Python, tested without a GPU):
- probabilities are (T, N, A) with the blank at class 0 and normalized by cuDNN
  (CUDNN_LOSS_NORMALIZATION_SOFTMAX: it takes logits and returns the gradient with
  respect to them). Our logits are (N, T, A) with the blank at `blank` (default A - 1):
  ``class_permutation`` moves the blank first, ``cudnn_labels`` renumbers the labels the
  same way, and the gradient is permuted back.
- labels are packed: the used part of every sample's row, concatenated, int32, on the
  device, with int32 label and input lengths (``pack_labels``).
- cudnnCTCLoss_v8 takes labels up to 255 long; longer labels, non-float32 logits and a
  missing cuDNN raise ``dispatch.Unsupported`` (the dispatcher then runs gpuk's kernels).
- labels with no alignment (input shorter than the label plus its repeats) get loss inf
  and a zero gradient, our convention, whatever cuDNN computes for them.
"""
import ctypes

import numpy as np

from gpuk.cpu_fallback import ctc_checks
from gpuk.kernels import cudnn, dispatch

__all__ = ['ctc_loss_with_grad', 'cudnn_ctc_loss', 'class_permutation', 'cudnn_labels',
           'pack_labels', 'min_frames', 'descriptor_args', 'MAX_LABEL_LENGTH']

MAX_LABEL_LENGTH = 255
CUDNN_DATA_FLOAT = 0
CUDNN_LOSS_NORMALIZATION_SOFTMAX = 1
CUDNN_NOT_PROPAGATE_NAN = 0
CUDNN_CTC_LOSS_ALGO_DETERMINISTIC = 0
_state = {'library': None, 'handles': {}}


# ---------------------------------------------------------------- pure translation

def class_permutation(classes, blank):
    """(order, inverse): logits[..., order] has the blank first; x[..., inverse] undoes it."""
    order = np.concatenate([[blank], np.delete(np.arange(classes), blank)]).astype(np.int64)
    return order, np.argsort(order)


def cudnn_labels(labels, blank):
    """Our label values renumbered for ``class_permutation``: c < blank -> c + 1."""
    labels = np.asarray(labels, dtype=np.int64)
    return np.where(labels < blank, labels + 1, labels)


def pack_labels(labels, label_lengths):
    """Every row's first label_lengths[n] labels, concatenated, int32 (cuDNN's layout)."""
    labels = np.asarray(labels)
    used = np.arange(labels.shape[1]) < np.asarray(label_lengths)[:, None]
    return np.ascontiguousarray(labels[used], dtype=np.int32)


def min_frames(labels, label_lengths):
    """Fewest frames that can carry each label: its length plus its adjacent repeats."""
    labels = np.asarray(labels)
    lengths = np.asarray(label_lengths)
    width = labels.shape[1]
    if width < 2:
        return lengths.astype(np.int64)
    inside = np.arange(1, width) < lengths[:, None]
    repeats = np.sum((labels[:, 1:] == labels[:, :-1]) & inside, axis=1)
    return (lengths + repeats).astype(np.int64)


def descriptor_args(logits_shape, max_label_length):
    """The cuDNN arguments: probs/gradients tensor (dims, strides) and the loss descriptor."""
    batch, steps, classes = logits_shape
    dims = (steps, batch, classes)
    return {'dims': dims, 'strides': (batch * classes, classes, 1),
            'comp_type': CUDNN_DATA_FLOAT, 'norm_mode': CUDNN_LOSS_NORMALIZATION_SOFTMAX,
            'grad_mode': CUDNN_NOT_PROPAGATE_NAN, 'max_label_length': int(max_label_length),
            'algo': CUDNN_CTC_LOSS_ALGO_DETERMINISTIC}


# ---------------------------------------------------------------- the library

def _library():
    if not cudnn.available():
        raise dispatch.Unsupported('cuDNN unavailable: %s' % cudnn.why_unavailable())
    if _state['library'] is None:
        path = cudnn.library_path() or 'libcudnn.so.9'
        _state['library'] = ctypes.CDLL(path, mode=ctypes.RTLD_GLOBAL)
    return _state['library']


def _call(lib, name, *args):
    status = getattr(lib, name)(*args)
    if status != 0:
        lib.cudnnGetErrorString.restype = ctypes.c_char_p
        raise RuntimeError('cudnn_ctc_loss: %s failed: %s' % (name, lib.cudnnGetErrorString(status).decode()))


def _handle(lib, cupy):
    device = cupy.cuda.Device().id
    handle = _state['handles'].get(device)
    if handle is None:
        handle = ctypes.c_void_p()
        _call(lib, 'cudnnCreate', ctypes.byref(handle))
        _state['handles'][device] = handle
    _call(lib, 'cudnnSetStream', handle, ctypes.c_void_p(cupy.cuda.get_current_stream().ptr))
    return handle


def _tensor_descriptor(lib, args):
    desc = ctypes.c_void_p()
    _call(lib, 'cudnnCreateTensorDescriptor', ctypes.byref(desc))
    dims = (ctypes.c_int * 3)(*args['dims'])
    strides = (ctypes.c_int * 3)(*args['strides'])
    _call(lib, 'cudnnSetTensorNdDescriptor', desc, CUDNN_DATA_FLOAT, 3, dims, strides)
    return desc


def cudnn_ctc_loss(logits, labels, input_lengths, label_lengths, blank=None):
    """(loss, dlogits) by cudnnCTCLoss_v8; raises dispatch.Unsupported outside its limits."""
    fn = 'cudnn_ctc_loss'
    import cupy
    if not isinstance(logits, cupy.ndarray):
        raise dispatch.Unsupported('logits are not on the GPU')
    stand_in = np.broadcast_to(np.zeros((), dtype=logits.dtype), logits.shape)
    _, labels, input_lengths, label_lengths, blank = ctc_checks.check_loss_inputs(
        fn, stand_in, _host(labels), _host(input_lengths), _host(label_lengths), blank)
    if logits.dtype != np.float32:
        raise dispatch.Unsupported('cuDNN CTC takes float32 logits, got %s' % logits.dtype)
    if label_lengths.size and label_lengths.max() > MAX_LABEL_LENGTH:
        raise dispatch.Unsupported('cuDNN CTC takes labels up to %d long, got %d'
                                   % (MAX_LABEL_LENGTH, label_lengths.max()))
    batch, steps, classes = logits.shape
    lib = _library()
    handle = _handle(lib, cupy)
    order, inverse = class_permutation(classes, blank)
    probs = cupy.ascontiguousarray(logits[:, :, cupy.asarray(order)].transpose(1, 0, 2))
    args = descriptor_args(logits.shape, max(int(label_lengths.max(initial=0)), 1))
    packed = cupy.asarray(pack_labels(cudnn_labels(labels, blank), label_lengths))
    if packed.size == 0:
        packed = cupy.zeros(1, dtype=cupy.int32)
    label_lengths_dev = cupy.asarray(label_lengths.astype(np.int32))
    input_lengths_dev = cupy.asarray(input_lengths.astype(np.int32))
    costs = cupy.empty(batch, dtype=cupy.float32)
    grads = cupy.empty_like(probs)
    probs_desc = _tensor_descriptor(lib, args)
    grads_desc = _tensor_descriptor(lib, args)
    loss_desc = ctypes.c_void_p()
    try:
        _call(lib, 'cudnnCreateCTCLossDescriptor', ctypes.byref(loss_desc))
        _call(lib, 'cudnnSetCTCLossDescriptor_v8', loss_desc, args['comp_type'], args['norm_mode'],
              args['grad_mode'], args['max_label_length'])
        workspace_size = ctypes.c_size_t()
        _call(lib, 'cudnnGetCTCLossWorkspaceSize_v8', handle, args['algo'], loss_desc, probs_desc, grads_desc,
              ctypes.byref(workspace_size))
        workspace = cupy.empty(max(workspace_size.value, 1), dtype=cupy.uint8)
        _call(lib, 'cudnnCTCLoss_v8', handle, args['algo'], loss_desc, probs_desc, ctypes.c_void_p(probs.data.ptr),
              ctypes.c_void_p(packed.data.ptr), ctypes.c_void_p(label_lengths_dev.data.ptr),
              ctypes.c_void_p(input_lengths_dev.data.ptr), ctypes.c_void_p(costs.data.ptr), grads_desc,
              ctypes.c_void_p(grads.data.ptr), ctypes.c_size_t(workspace_size.value),
              ctypes.c_void_p(workspace.data.ptr))
    finally:
        lib.cudnnDestroyTensorDescriptor(probs_desc)
        lib.cudnnDestroyTensorDescriptor(grads_desc)
        if loss_desc.value:
            lib.cudnnDestroyCTCLossDescriptor(loss_desc)
    dlogits = cupy.ascontiguousarray(grads.transpose(1, 0, 2)[:, :, cupy.asarray(inverse)])
    impossible = cupy.asarray(input_lengths < min_frames(labels, label_lengths))
    costs = cupy.where(impossible, cupy.inf, costs)
    past_end = cupy.arange(steps)[None, :] >= cupy.asarray(input_lengths)[:, None]
    dlogits = cupy.where((impossible[:, None] | past_end)[:, :, None], 0, dlogits).astype(cupy.float32)
    return costs, dlogits


def _host(value):
    if hasattr(value, 'get') and not isinstance(value, np.ndarray):
        return value.get()
    return np.asarray(value)


def _gpuk_ctc_loss(logits, labels, input_lengths, label_lengths, blank=None):
    from gpuk.kernels import ctc
    loss, log_alpha = ctc.ctc_loss_fwd(logits, labels, input_lengths, label_lengths, blank)
    ones = np.ones(loss.shape, dtype=loss.dtype)
    if not isinstance(loss, np.ndarray):
        import cupy
        ones = cupy.asarray(ones)
    dlogits = ctc.ctc_loss_bwd(logits, labels, input_lengths, label_lengths, log_alpha, loss, ones, blank)
    return loss, dlogits


def ctc_loss_with_grad(logits, labels, input_lengths, label_lengths, blank=None):
    """(loss, dlogits for dloss = 1) from the 'ctc' family's implementation (gpuk or cuDNN)."""
    key = (tuple(logits.shape), str(logits.dtype), tuple(np.shape(labels)), blank)
    return dispatch.run('ctc', key, _gpuk_ctc_loss, cudnn_ctc_loss, logits, labels, input_lengths,
                        label_lengths, blank)
