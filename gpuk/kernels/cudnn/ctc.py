"""CTC loss and gradient through cuDNN 9's legacy API (cudnnCTCLoss_v8) with ctypes.

``cudnn_ctc_loss(logits, labels, input_lengths, label_lengths, blank=None)`` returns
(loss (N,), dlogits (N, T, A)) for dloss = 1. ``ctc_loss_fwd`` / ``ctc_loss_bwd`` wrap it
in the signatures of gpuk/kernels/ctc.py, which runs them when the 'ctc' family chooses
cuDNN (``GPUK_KERNELS=ctc=cudnn|auto``): one cudnnCTCLoss call in the forward (for the
loss) and one in the backward (for the gradient).

cuDNN's terms, and how ours are translated (pure Python, tested without a GPU):
- its "probs" are (T, N, A) with the blank at class 0, label values in [1, A - 1]
  (cudnn_adv.h). With CUDNN_LOSS_NORMALIZATION_SOFTMAX they are unnormalized
  activations that cuDNN softmaxes itself, and the gradient is with respect to them:
  so we pass logits and get dlogits. Our logits are (N, T, A) with the blank at `blank`
  (default A - 1):
  ``class_permutation`` moves the blank first, ``cudnn_labels`` renumbers the labels the
  same way, and the gradient is permuted back.
- labels are packed: the used part of every sample's row, concatenated, int32, on the
  device, with int32 label and input lengths (``pack_labels``).
- the descriptor is set with cudnnSetCTCLossDescriptor_v9 (float compute,
  CUDNN_CTC_ZERO_OOB_GRADIENTS; the _v8 setter is deprecated in cuDNN 9).
- ``check_cudnn_limits``: cuDNN takes labels shorter than 256, float32 only, and a label
  longer than its input made cuDNN access memory out of bounds in PyTorch's experience
  (LossCTC.cpp); such problems and a missing cuDNN raise ``library.Unsupported`` (the
  dispatcher then runs gpuk's kernels).
- labels with no alignment (input shorter than the label plus its repeats) get loss inf
  and a zero gradient, our convention, whatever cuDNN computes for them.
- a failed cuDNN call names the function called (``ctc_loss_fwd``, ``ctc_loss_bwd`` or
  ``cudnn_ctc_loss``), the logits' and labels' shapes, the longest label, the blank and the dtype.
"""
import ctypes

import numpy as np

from gpuk.contracts import ctc_checks
from . import library
from .library import Unsupported, CUDNN_LOSS_NORMALIZATION_SOFTMAX

__all__ = ['ctc_loss_fwd', 'ctc_loss_bwd', 'cudnn_ctc_loss', 'class_permutation', 'cudnn_labels',
           'pack_labels', 'min_frames', 'descriptor_args', 'check_cudnn_limits', 'MAX_LABEL_LENGTH']

MAX_LABEL_LENGTH = 255


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
    return {'data_type': library.CUDNN_DATA_FLOAT, 'dims': dims, 'strides': (batch * classes, classes, 1),
            'comp_type': library.CUDNN_DATA_FLOAT,
            'norm_mode': CUDNN_LOSS_NORMALIZATION_SOFTMAX,
            'grad_mode': library.CUDNN_CTC_ZERO_OOB_GRADIENTS, 'max_label_length': int(max_label_length),
            'algo': library.CUDNN_CTC_LOSS_ALGO_DETERMINISTIC}


# ---------------------------------------------------------------- the library

def _library():
    if not library.available():
        raise Unsupported('cuDNN unavailable: %s' % library.why_unavailable())
    return library.library()


def check_cudnn_limits(logits_shape, logits_dtype, input_lengths, label_lengths):
    """Raises Unsupported for problems cudnnCTCLoss_v8 must not be given."""
    if 0 in logits_shape:   # cuDNN's tensor descriptors refuse zero dims; gpuk's kernels take them
        raise Unsupported('cuDNN CTC needs a non-empty (batch, time, classes), got %s' % (logits_shape,))
    if logits_dtype != np.float32:
        raise Unsupported('cuDNN CTC takes float32 logits, got %s' % logits_dtype)
    if label_lengths.size and label_lengths.max() > MAX_LABEL_LENGTH:
        raise Unsupported('cuDNN CTC takes labels up to %d long, got %d'
                                   % (MAX_LABEL_LENGTH, label_lengths.max()))
    # PyTorch (aten/src/ATen/native/cudnn/LossCTC.cpp) saw illegal memory accesses in
    # cuDNN when a label is longer than its input: such a sample never reaches cuDNN.
    longer = np.flatnonzero(label_lengths > input_lengths)
    if longer.size:
        raise Unsupported('cuDNN CTC needs label_lengths <= input_lengths, sample %d has %d > %d'
                                   % (longer[0], label_lengths[longer[0]], input_lengths[longer[0]]))


def cudnn_ctc_loss(logits, labels, input_lengths, label_lengths, blank=None):
    """(loss, dlogits) by cudnnCTCLoss_v8; raises Unsupported outside its limits."""
    return _ctc_loss('cudnn_ctc_loss', logits, labels, input_lengths, label_lengths, blank)


def _ctc_loss(fn, logits, labels, input_lengths, label_lengths, blank):
    _, labels, input_lengths, label_lengths, blank = ctc_checks.check_loss_inputs(
        fn, ctc_checks.stand_in(logits), _host(labels), _host(input_lengths), _host(label_lengths), blank)
    check_cudnn_limits(logits.shape, logits.dtype, input_lengths, label_lengths)
    if isinstance(logits, np.ndarray):
        raise Unsupported('logits are not on the GPU')
    import cupy
    batch, steps, classes = logits.shape
    args = descriptor_args(logits.shape, max(int(label_lengths.max(initial=0)), 1))
    described = library.describe(fn, logits=tuple(logits.shape), labels=tuple(labels.shape),
                                 max_label_length=args['max_label_length'], blank=blank, dtype=logits.dtype.name)
    lib = _library()
    handle = library.handle(lib, described)
    order, inverse = class_permutation(classes, blank)
    activations = cupy.ascontiguousarray(logits[:, :, cupy.asarray(order)].transpose(1, 0, 2))
    packed = cupy.asarray(pack_labels(cudnn_labels(labels, blank), label_lengths))
    if packed.size == 0:
        packed = cupy.zeros(1, dtype=cupy.int32)
    label_lengths_dev = cupy.asarray(label_lengths.astype(np.int32))
    input_lengths_dev = cupy.asarray(input_lengths.astype(np.int32))
    costs = cupy.empty(batch, dtype=cupy.float32)
    grads = cupy.empty_like(activations)
    pointer = library.device_pointer
    with library.Descriptors(lib, described) as d:
        probs_desc = d.tensor(args['data_type'], args['dims'], args['strides'])
        grads_desc = d.tensor(args['data_type'], args['dims'], args['strides'])
        loss_desc = d.ctc_loss(args['comp_type'], args['norm_mode'], args['grad_mode'], args['max_label_length'])
        workspace_size = ctypes.c_size_t()
        d.check(lib.cudnnGetCTCLossWorkspaceSize_v8(handle, args['algo'], loss_desc, probs_desc, grads_desc,
                                                    ctypes.byref(workspace_size)), 'cudnnGetCTCLossWorkspaceSize_v8')
        workspace = cupy.empty(max(workspace_size.value, 1), dtype=cupy.uint8)
        d.check(lib.cudnnCTCLoss_v8(handle, args['algo'], loss_desc, probs_desc, pointer(activations), pointer(packed),
                                    pointer(label_lengths_dev), pointer(input_lengths_dev), pointer(costs), grads_desc,
                                    pointer(grads), workspace_size.value, pointer(workspace)), 'cudnnCTCLoss_v8')
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


def ctc_loss_fwd(logits, labels, input_lengths, label_lengths, blank=None):
    """The twin's ctc_loss_fwd through cuDNN: (loss, log_alpha, frame_lse).

    cudnnCTCLoss computes the loss and the gradient in one call and has no alphas to give:
    log_alpha and frame_lse (float32, the twin's shapes) are NaN. The backward of the same
    problem runs cuDNN too (one dispatch key, the same limits) and never reads them; were
    gpuk's backward ever handed them, its gradient would be NaN, never silently wrong. The
    forward's gradient is dropped and the backward's call computes both again: two cuDNN
    calls per step.
    """
    loss, _ = _ctc_loss('ctc_loss_fwd', logits, labels, input_lengths, label_lengths, blank)
    batch, steps, _ = logits.shape
    xp = _array_module(logits)
    return (loss, xp.full((batch, steps, 2 * np.shape(labels)[1] + 1), np.nan, np.float32),
            xp.full((batch, steps), np.nan, np.float32))


def ctc_loss_bwd(logits, labels, input_lengths, label_lengths, log_alpha, frame_lse, loss, dloss, blank=None):
    """The twin's ctc_loss_bwd through cuDNN: its gradient for dloss = 1, scaled by dloss.

    log_alpha, frame_lse and loss are not read (cuDNN recomputes the forward recursion)."""
    _, dlogits = _ctc_loss('ctc_loss_bwd', logits, labels, input_lengths, label_lengths, blank)
    return dlogits * _array_module(dlogits).asarray(dloss, dtype=dlogits.dtype)[:, None, None]


def _array_module(array):
    """numpy for NumPy arrays (the tests' stand-in for the GPU), else cupy."""
    if isinstance(array, np.ndarray):
        return np
    import cupy
    return cupy
