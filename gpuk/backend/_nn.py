"""Neural-network K functions: batch normalization, softmax, cross-entropies and CTC
(TensorFlow backend's CTC, plus the Theano backend's helpers)."""
import numpy as np

from gpuk import config
from gpuk.graph import Constant, Tensor, apply, as_tensor, static_value
from gpuk.ops import batchnorm as bn_ops
from gpuk.ops import ctc as ctc_ops
from gpuk.ops import elementwise as ew
from gpuk.ops import shape as shape_ops
from gpuk.ops import softmax_xent as xent
from gpuk.ops.base import normalize_axis

__all__ = [
    'normalize_batch_in_training', 'batch_normalization', 'softmax', 'categorical_crossentropy',
    'sparse_categorical_crossentropy', 'binary_crossentropy', 'ctc_label_dense_to_sparse',
    'ctc_batch_cost', 'ctc_decode', 'ctc_interleave_blanks', 'ctc_create_skip_idxs',
    'ctc_update_log_p', 'ctc_path_probs', 'ctc_cost',
]


def _tensor(where, name, value):
    if value is None:
        raise ValueError('%s: %s must be a tensor, got None' % (where, name))
    return as_tensor(value)


def _float_tensor(where, name, value):
    t = _tensor(where, name, value)
    if np.dtype(t.dtype).kind != 'f':
        raise TypeError('%s: %s must be a float tensor, got dtype %s' % (where, name, t.dtype))
    return t


def _known_value(t):
    """The host value of ``t`` when the graph alone fixes it (any size for constants)."""
    return t.value if isinstance(t, Constant) else static_value(t)


def _axis(where, axis, ndim):
    if isinstance(axis, bool) or not isinstance(axis, (int, np.integer)):
        raise TypeError('%s: axis must be an int, got %r' % (where, axis))
    if ndim is not None and not -ndim <= axis < ndim:
        raise ValueError('%s: axis must lie in [-%d, %d) for output of rank %d, got %d'
                         % (where, ndim, ndim, ndim, axis))
    return normalize_axis(axis, ndim, where)


# --- batch normalization --------------------------------------------------------------------

def normalize_batch_in_training(x, gamma, beta, reduction_axes, epsilon=1e-3):
    """Computes mean and variance over ``reduction_axes``, then normalizes x with them.

    # Arguments
        x: input tensor.
        gamma, beta: scale and offset (tensors holding x's size without the reduction
            axes, e.g. shape (channels,)), or None.
        reduction_axes: iterable of ints, the axes to normalize over.
        epsilon: fuzz factor added to the variance.
    # Returns
        (normalized_tensor, mean, variance): mean and the biased variance with the
        reduction axes removed (Keras's BatchNormalization layer unbiases the variance
        it keeps for inference itself).
    """
    where = 'normalize_batch_in_training'
    x = _float_tensor(where, 'x', x)
    try:
        axes = [int(a) if not isinstance(a, bool) and isinstance(a, (int, np.integer)) else None
                for a in reduction_axes]
    except TypeError:
        raise TypeError('%s: reduction_axes must be an iterable of ints, got %r' % (where, reduction_axes)) from None
    if None in axes:
        raise TypeError('%s: reduction_axes must be an iterable of ints, got %r' % (where, reduction_axes))
    ndim = x.ndim
    if any(not -ndim <= a < ndim for a in axes):
        raise ValueError('%s: reduction_axes must lie in [-%d, %d) for x of rank %d, got %r'
                         % (where, ndim, ndim, ndim, list(reduction_axes)))
    axes = [a % ndim for a in axes]
    if len(set(axes)) != len(axes):
        raise ValueError('%s: reduction_axes must not repeat an axis, got %r' % (where, list(reduction_axes)))
    _check_epsilon(where, epsilon)
    params = [_float_tensor(where, name, p) for name, p in (('gamma', gamma), ('beta', beta)) if p is not None]
    op = bn_ops.BnTrain(tuple(sorted(axes)), epsilon, gamma is not None, beta is not None, where)
    y, mean, var, _ = apply(op, x, *params)
    return y, ew.cast(mean, x.dtype), ew.cast(var, x.dtype)


def _check_epsilon(where, epsilon):
    if isinstance(epsilon, bool) or not isinstance(epsilon, (int, float, np.number)) or not epsilon >= 0:
        raise ValueError('%s: epsilon must be a number >= 0, got %r' % (where, epsilon))


def _on_axis(param, x, axis):
    """A 1-D parameter of x.shape[axis] values reshaped to broadcast along ``axis``;
    anything else is left to broadcast as it is (TensorFlow's semantics)."""
    if param.ndim != 1 or x.ndim <= 1 or axis == x.ndim - 1:
        return param
    size, channels = param.shape[0], x.shape[axis]
    if size is not None and channels is not None and size != channels:
        return param
    shape = [1] * x.ndim
    shape[axis] = -1
    return shape_ops.reshape(param, tuple(shape))


def batch_normalization(x, mean, var, beta, gamma, axis=-1, epsilon=1e-3):
    """``(x - mean) / sqrt(var + epsilon) * gamma + beta``.

    # Arguments
        x: input tensor.
        mean, var: tensors of x.shape[axis] values, or tensors broadcasting against x.
        beta, gamma: offset and scale, alike, or None.
        axis: the features axis the 1-D parameters lie on.
        epsilon: fuzz factor.
    """
    where = 'batch_normalization'
    x = _float_tensor(where, 'x', x)
    axis = _axis(where, axis, x.ndim)
    _check_epsilon(where, epsilon)
    tensors = [_on_axis(_float_tensor(where, name, p), x, axis)
               for name, p in (('mean', mean), ('var', var), ('gamma', gamma), ('beta', beta))
               if p is not None or name in ('mean', 'var')]
    op = bn_ops.BnInfer(epsilon, gamma is not None, beta is not None, axis, where)
    return apply(op, x, *tensors)


# --- softmax and cross-entropies ---------------------------------------------------------------

def softmax(x, axis=-1):
    """Softmax of ``x`` along ``axis``."""
    x = _float_tensor('softmax', 'x', x)
    return xent.softmax(x, _axis('softmax', axis, x.ndim))


def _same_float(target, like):
    return target if target.dtype == like.dtype else ew.cast(target, like.dtype)


def categorical_crossentropy(target, output, from_logits=False, axis=-1):
    """Categorical cross-entropy between ``output`` (probabilities, or logits when
    ``from_logits``) and ``target`` of the same shape, along ``axis``.

    The output of a softmax over the same axis is replaced by its logits and the fused,
    stable softmax cross-entropy (gradient softmax - target) is used, like TensorFlow.
    """
    where = 'categorical_crossentropy'
    output = _float_tensor(where, 'output', output)
    target = _tensor(where, 'target', target)
    axis = _axis(where, axis, output.ndim)
    logits = output if from_logits else xent.softmax_logits(output, axis)
    if logits is not None:
        return apply(xent.SoftmaxXent(axis, where), logits, _same_float(target, logits))[0]
    return apply(xent.CategoricalXentProbs(axis, config.epsilon(), where), output,
                 _same_float(target, output))


def _sparse_target(where, target, output, axis):
    """``target`` as output's shape without ``axis``. Accepts that shape, or output's rank
    with a size-1 axis (at ``axis`` or last: Keras's sparse targets) whose entries are
    read in order, as TensorFlow's backend flattens the target: a channels_first model's
    (batch, 1, H, W) target placeholder is only known as (None, None, None, None)."""
    reduced_ndim = output.ndim - 1
    if target.ndim == reduced_ndim:
        return target
    if target.ndim == output.ndim and (1 in (target.shape[axis], target.shape[-1])
                                       or None in (target.shape[axis], target.shape[-1])):
        dims = [d if d is not None else shape_ops.shape(output)[i]
                for i, d in enumerate(output.shape) if i != axis]
        return shape_ops.reshape(target, dims)
    raise ValueError('%s: target must have the shape of output %s without axis %d (optionally with '
                     'a size-1 axis there or last), got shape %s' % (where, output.shape, axis, target.shape))


def sparse_categorical_crossentropy(target, output, from_logits=False, axis=-1):
    """Categorical cross-entropy with integer class targets (int or whole-number floats).

    # Arguments
        target: class indices, of output's shape without ``axis`` (a trailing 1 is allowed).
        output: probabilities (logits when ``from_logits``); a softmax node over ``axis``
            is replaced by its logits.
        axis: the class axis of ``output``.
    # Returns
        The loss, of output's shape without ``axis``.
    """
    where = 'sparse_categorical_crossentropy'
    output = _float_tensor(where, 'output', output)
    target = _tensor(where, 'target', target)
    axis = _axis(where, axis, output.ndim)
    if np.dtype(target.dtype).kind not in 'iuf':
        raise ValueError('%s: target must be an int or float tensor of class indices, got dtype %s'
                         % (where, target.dtype))
    labels = _sparse_target(where, target, output, axis)
    known = _known_value(labels)
    if known is not None and output.shape[axis] is not None:
        xent.checked_labels(np, np.asarray(known), output.shape[axis], where)
    logits = output if from_logits else xent.softmax_logits(output, axis)
    if logits is None:
        # TensorFlow: log of the clipped probabilities, then softmax cross-entropy
        eps = config.epsilon()
        logits = ew.unary('log', ew.clip(output, eps, 1 - eps))
    return apply(xent.SparseSoftmaxXent(axis, where), logits, labels)[0]


def binary_crossentropy(target, output, from_logits=False):
    """Elementwise binary cross-entropy; ``output`` holds probabilities (logits when
    ``from_logits``). A sigmoid node's input is used as logits (stable, gradient
    sigmoid - target)."""
    where = 'binary_crossentropy'
    output = _float_tensor(where, 'output', output)
    target = _same_float(_tensor(where, 'target', target), output)
    logits = output if from_logits else xent.sigmoid_logits(output)
    if logits is not None:
        return apply(xent.BinaryXentLogits(where), logits, target)
    return apply(xent.BinaryXentProbs(where, config.epsilon()), output, target)


# --- CTC (TensorFlow backend) -------------------------------------------------------------------

def _lengths(where, name, value):
    """(batch, 1) or (batch,) lengths as a (batch,) tensor."""
    t = _tensor(where, name, value)
    if t.ndim == 2:
        if t.shape[1] not in (1, None):
            raise ValueError('%s: %s must have shape (batch, 1) or (batch,), got %s' % (where, name, t.shape))
        return shape_ops.reshape(t, (t.shape[0] if t.shape[0] is not None else shape_ops.shape(t)[0],))
    if t.ndim != 1:
        raise ValueError('%s: %s must have shape (batch, 1) or (batch,), got %s' % (where, name, t.shape))
    return t


def _check_batch(where, named_shapes):
    sizes = [(name, shape[0]) for name, shape in named_shapes if shape and shape[0] is not None]
    for name, size in sizes[1:]:
        if size != sizes[0][1]:
            raise ValueError('%s: batch sizes differ: %s has %d, %s has %d'
                             % (where, sizes[0][0], sizes[0][1], name, size))


def _check_static_ctc(where, y_pred, y_true, input_length, label_length):
    """Graph-build-time checks of whatever is statically known."""
    shapes = [('y_pred', y_pred.shape), ('input_length', input_length.shape)]
    if y_true is not None:
        shapes += [('y_true', y_true.shape), ('label_length', label_length.shape)]
        if y_true.ndim != 2:
            raise ValueError('%s: y_true must have rank 2 (batch, max_label_length), got shape %s'
                             % (where, y_true.shape))
    _check_batch(where, shapes)
    values = [None if t is None else _known_value(t) for t in (y_true, input_length, label_length)]
    if any(v is not None for v in values):
        labels, inputs, label_lengths = [None if v is None else np.asarray(v) for v in values]
        if labels is not None and label_lengths is None:
            labels = None
        ctc_ops.check_loss_inputs(np, where, y_pred.shape, labels, inputs, label_lengths)


def _ctc_inputs(where, y_pred):
    y_pred = _float_tensor(where, 'y_pred', y_pred)
    if y_pred.ndim != 3:
        raise ValueError('%s: y_pred must have rank 3 (batch, time, classes), got shape %s'
                         % (where, y_pred.shape))
    return y_pred


def ctc_batch_cost(y_true, y_pred, input_length, label_length):
    """CTC loss of each batch element.

    # Arguments
        y_true: (samples, max_string_length) labels (int or whole floats; padding ignored).
        y_pred: (samples, time_steps, num_categories) softmax output; the last category
            is the blank.
        input_length: (samples, 1) used time steps of each y_pred.
        label_length: (samples, 1) label lengths.
    # Returns
        (samples, 1) losses; inf where no alignment exists (its gradient is zero). The
        logits of a softmax node are used directly, otherwise log(y_pred + epsilon) as
        TensorFlow's backend does.
    """
    where = 'ctc_batch_cost'
    y_pred = _ctc_inputs(where, y_pred)
    y_true = _tensor(where, 'y_true', y_true)
    input_length = _lengths(where, 'input_length', input_length)
    label_length = _lengths(where, 'label_length', label_length)
    _check_static_ctc(where, y_pred, y_true, input_length, label_length)
    logits = xent.softmax_logits(y_pred, 2)
    if logits is None:
        logits = ew.unary('log', y_pred + config.epsilon())
    loss = apply(ctc_ops.CtcLoss(where), logits, y_true, input_length, label_length)[0]
    return shape_ops.expand_dims(loss, 1)


def _positive_int(where, name, value):
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value < 1:
        raise ValueError('%s: %s must be an int >= 1, got %r' % (where, name, value))
    return int(value)


def ctc_decode(y_pred, input_length, greedy=True, beam_width=100, top_paths=1, merge_repeated=False):
    """Decodes softmax output with best-path (greedy) or beam search.

    # Arguments
        y_pred: (samples, time_steps, num_categories) softmax output (blank last).
        input_length: (samples,) used time steps.
        greedy: best path if True, else beam search of ``beam_width``.
        top_paths: how many paths beam search returns.
        merge_repeated: beam search only: merge equal neighbours of the output.
    # Returns
        ([decoded, ...], log_prob): one int64 (samples, longest decoded) tensor per path,
        padded with -1; log_prob (samples, 1) for greedy (minus the summed best log-probs),
        (samples, top_paths) for beam search.
    """
    where = 'ctc_decode'
    y_pred = _ctc_inputs(where, y_pred)
    input_length = _lengths(where, 'input_length', input_length)
    _check_static_ctc(where, y_pred, None, input_length, None)
    log_probs = ew.unary('log', y_pred + config.epsilon())
    if greedy:
        decoded, log_prob = apply(ctc_ops.CtcGreedyDecode(where), log_probs, input_length)
        return [decoded], log_prob
    beam_width = _positive_int(where, 'beam_width', beam_width)
    top_paths = _positive_int(where, 'top_paths', top_paths)
    if top_paths > beam_width:
        raise ValueError('%s: top_paths (%d) must not exceed beam_width (%d)' % (where, top_paths, beam_width))
    outputs = apply(ctc_ops.CtcBeamDecode(beam_width, top_paths, bool(merge_repeated), where),
                    log_probs, input_length)
    return list(outputs[:-1]), outputs[-1]


def ctc_label_dense_to_sparse(labels, label_lengths):
    """CTC labels with each row's entries past its length replaced by -1.

    gpuk has no sparse tensors: where TensorFlow returns a SparseTensor of the first
    label_lengths[i] entries of each row, this returns the dense (batch, max_labels) int
    tensor holding those entries and -1 elsewhere (what tf.sparse.to_dense(...,
    default_value=-1) of TensorFlow's result gives).
    """
    where = 'ctc_label_dense_to_sparse'
    labels = _tensor(where, 'labels', labels)
    if labels.ndim != 2:
        raise ValueError('%s: labels must have rank 2 (batch, max_labels), got shape %s' % (where, labels.shape))
    label_lengths = _lengths(where, 'label_lengths', label_lengths)
    _check_batch(where, [('labels', labels.shape), ('label_lengths', label_lengths.shape)])
    dtype = labels.dtype if np.dtype(labels.dtype).kind in 'iu' else 'int32'
    return apply(ctc_ops.MaskLabels(dtype, where), labels, label_lengths)


# --- CTC helpers of the Theano backend ----------------------------------------------------------

def ctc_interleave_blanks(Y):
    """[y1, y2, ...] -> [-1, y1, -1, y2, ..., -1] (-1 indexes the blank, the last class)."""
    return apply(ctc_ops.CtcInterleaveBlanks(), _tensor('ctc_interleave_blanks', 'Y', Y))


def ctc_create_skip_idxs(Y):
    """Positions i of an interleaved label from which state i + 2 may be entered directly."""
    return apply(ctc_ops.CtcCreateSkipIdxs(), _tensor('ctc_create_skip_idxs', 'Y', Y))


def ctc_update_log_p(skip_idxs, zeros, active, log_p_curr, log_p_prev):
    """One step of the Theano backend's CTC recursion; returns (active_next, log_p_next)."""
    where = 'ctc_update_log_p'
    if not isinstance(active, Tensor):
        if isinstance(active, bool) or not isinstance(active, (int, np.integer)) or active < 1:
            raise ValueError('%s: active must be an int >= 1, got %r' % (where, active))
        active = as_tensor(np.int32(active))
    return apply(ctc_ops.CtcUpdateLogP(), _tensor(where, 'skip_idxs', skip_idxs),
                 _float_tensor(where, 'zeros', zeros), active,
                 _float_tensor(where, 'log_p_curr', log_p_curr),
                 _float_tensor(where, 'log_p_prev', log_p_prev))


def ctc_path_probs(predict, Y, alpha=1e-4):
    """Theano backend: (log_probs, mask), the log of forward * backward / emission
    probabilities of interleaved label Y over predict (time, classes), and the mask of
    states reachable from both ends."""
    return apply(ctc_ops.CtcPathProbs(alpha), _float_tensor('ctc_path_probs', 'predict', predict),
                 _tensor('ctc_path_probs', 'Y', Y))


def ctc_cost(predict, Y):
    """Theano backend: -log of the summed path probabilities of label Y (not interleaved)
    over predict (time, classes), i.e. -log(T * P(Y)) with smoothed probabilities."""
    return apply(ctc_ops.CtcCost(), _float_tensor('ctc_cost', 'predict', predict),
                 _tensor('ctc_cost', 'Y', Y))
