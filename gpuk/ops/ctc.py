"""CTC as graph ops: the loss (with its fused gradient), greedy and beam-search decoding,
and the Theano-backend helpers.

The loss node runs ``impl.ctc.ctc_loss_fwd`` on logits (the log-softmax is folded in) and
outputs the forward variables log_alpha and each frame's log-sum-exp for the backward
node; impossible alignments give an infinite loss and a zero gradient. Shapes are checked
before any computation, values (labels, lengths) on the device without a host sync and
raised before the K.function call returns (``impl.check_later``), always with the K
function's name in the message (``where``). The CTC backward node and the decoders are not
differentiable.
"""
import numpy as np

from gpuk.contracts import ctc_checks
from gpuk.device import to_host
from gpuk.graph import Meta, apply
from gpuk.kernels.runtime import check_launches_forced, prepared
from gpuk.ops.base import Op
from gpuk.ops.fused import accumulate_dtype, is_zero, require_float


# --- checks (shared by graph-build time, on NumPy values, and run time, on xp arrays) ----------

def integer_values(xp, where, name, values):
    """``values`` as int64 after checking it holds whole numbers (Keras feeds float labels)."""
    kind = values.dtype.kind
    if kind == 'f':
        if values.size and (not bool(xp.all(xp.isfinite(values)))
                            or bool(xp.any(values != xp.round(values)))):
            raise ValueError('%s: %s must hold integers, got non-integer values' % (where, name))
    elif kind not in 'iu':
        raise ValueError('%s: %s must be an int or float tensor, got dtype %s' % (where, name, values.dtype))
    return values.astype(np.int64)


def lengths_vector(xp, where, name, values, batch, upper, upper_desc):
    """(N,) or (N, 1) lengths as an int64 vector in [0, upper], batch size checked."""
    if values.ndim == 2 and values.shape[1] == 1:
        values = values.reshape(-1)
    if values.ndim != 1:
        raise ValueError('%s: %s must have shape (batch,) or (batch, 1), got %s' % (where, name, values.shape))
    values = integer_values(xp, where, name, values)
    if batch is not None and values.shape[0] != batch:
        raise ValueError('%s: %s has %d entries for a batch of %d' % (where, name, values.shape[0], batch))
    if values.size:
        low, high = int(xp.min(values)), int(xp.max(values))
        if low < 0:
            raise ValueError('%s: %s must not be negative, got %d' % (where, name, low))
        if upper is not None and high > upper:
            raise ValueError('%s: %s must be at most %d (%s), got %d' % (where, name, upper, upper_desc, high))
    return values


def label_matrix(xp, where, name, labels, batch, classes, label_lengths):
    """(N, L) labels as int64; the entries within each label length lie in [0, classes - 1)
    (the last class is the blank; check_loss_inputs cuts the lengths at the first blank)."""
    if labels.ndim != 2:
        raise ValueError('%s: %s must have rank 2 (batch, max_label_length), got shape %s'
                         % (where, name, labels.shape))
    if batch is not None and labels.shape[0] != batch:
        raise ValueError('%s: %s has a batch of %d, y_pred has %d' % (where, name, labels.shape[0], batch))
    used = xp.arange(labels.shape[1])[None, :] < label_lengths[:, None]
    values = integer_values(xp, where, name, labels[used])
    if values.size and classes is not None:
        low, high = int(xp.min(values)), int(xp.max(values))
        if low < 0 or high >= classes - 1:
            raise ValueError('%s: %s must lie in [0, %d) (the classes of y_pred without the blank %d), '
                             'got values in [%d, %d]' % (where, name, classes - 1, classes - 1, low, high))
    # padding past the lengths may hold anything (Keras pads with any value)
    return xp.where(used, xp.where(used, labels, 0).astype(np.int64), -1)


def _refuse_labels_after_the_blank(xp, where, labels, label_lengths, cut, classes):
    """A blank (the last class of y_pred, or a class past it) ends a label, as in TensorFlow;
    a class after it within label_length would be dropped silently, so it is refused, as
    TensorFlow does."""
    after = ctc_checks.labels_after_the_cut(xp, labels, label_lengths, cut, classes)
    if after is None or not bool(xp.any(after)):
        return
    n, k = (int(i[0]) for i in xp.nonzero(after))
    row = [int(v) if float(v).is_integer() else v for v in to_host(labels[n, :int(label_lengths[n])]).tolist()]
    raise ValueError('%s: y_true holds class %r after the blank %d (the last class of y_pred) within '
                     'label_length, in sample %d at position %d (labels %s): the blank ends a label. '
                     'If the labels use all %d classes of y_pred, y_pred needs one more, for the blank'
                     % (where, row[k], classes - 1, n, k, row, classes))


def check_loss_inputs(xp, where, logits_shape, labels, input_lengths, label_lengths):
    """Checked (labels, input_lengths, label_lengths) as int64; any may be None (unknown)."""
    batch, steps, classes = logits_shape
    if input_lengths is not None:
        input_lengths = lengths_vector(xp, where, 'input_length', input_lengths, batch, steps,
                                       'the time steps of y_pred')
    if label_lengths is not None:
        width = None if labels is None else labels.shape[1]
        label_lengths = lengths_vector(xp, where, 'label_length', label_lengths, batch, width,
                                       'the width of y_true')
        if labels is not None:
            cut = ctc_checks.lengths_to_first_blank(xp, labels, label_lengths, classes)
            _refuse_labels_after_the_blank(xp, where, labels, label_lengths, cut, classes)
            label_lengths = cut
            labels = label_matrix(xp, where, 'y_true', labels, batch, classes, label_lengths)
    return labels, input_lengths, label_lengths


_SHAPES_CHECKED = set()   # loss_inputs_checked_later's signatures whose shapes and dtypes passed


_LAST_RUN_CHECKED = [None]   # (run stamp, impl, where, logits shape, the raw arrays, the result)


def loss_inputs_checked_later(impl, where, logits_shape, labels, input_lengths, label_lengths):
    """``check_loss_inputs`` without a host sync: shapes and dtypes now (once per signature, or
    on every call under GPUK_CHECK_LAUNCHES=1), the values by a flag that ``impl.check_later``
    reads with the others before the call's results are used, the same messages (a set flag runs
    check_loss_inputs on host copies). ``impl.ctc.ctc_check_loss_values`` computes the flag and
    the int64 labels and lengths together: one kernel launch on 'cuda' and 'emulate' (ctc_check.cu),
    NumPy on 'cpu'. Labels past each length become -1, as label_matrix gives. The loss's backward
    step, in the same plan run on the same arrays, gets the forward's result (its check is
    pending already): prepared.run_stamp."""
    stamp = prepared.run_stamp()
    last = _LAST_RUN_CHECKED[0]
    raw = (labels, input_lengths, label_lengths)
    if (stamp is not None and last is not None and last[0] == stamp and last[1] is impl and last[2] == where
            and last[3] == tuple(logits_shape) and all(a is b for a, b in zip(last[4], raw))
            and not check_launches_forced()):
        return last[5]
    result = _loss_inputs_checked_later(impl, where, logits_shape, labels, input_lengths, label_lengths)
    _LAST_RUN_CHECKED[0] = None if stamp is None else (stamp, impl, where, tuple(logits_shape), raw, result)
    return result


def _loss_inputs_checked_later(impl, where, logits_shape, labels, input_lengths, label_lengths):
    signature = (where, tuple(logits_shape), labels.shape, labels.dtype, input_lengths.shape, input_lengths.dtype,
                 label_lengths.shape, label_lengths.dtype)
    if signature not in _SHAPES_CHECKED or check_launches_forced():
        check_loss_inputs(np, where, logits_shape,
                          *map(ctc_checks.stand_in, (labels, input_lengths, label_lengths)))
        if len(_SHAPES_CHECKED) >= 1024:
            _SHAPES_CHECKED.clear()
        _SHAPES_CHECKED.add(signature)
    _, steps, classes = logits_shape
    raw = (labels, input_lengths.reshape(-1), label_lengths.reshape(-1))
    labels, input_lengths, label_lengths, bad = impl.ctc.ctc_check_loss_values(*raw, steps, classes)
    impl.check_later(bad, lambda: check_loss_inputs(np, where, logits_shape, *map(to_host, raw)))
    return labels, input_lengths, label_lengths


# --- loss ---------------------------------------------------------------------------------------

class CtcLoss(Op):
    """(loss (N,), log_alpha (N, T, 2 L + 1), frame_lse (N, T)) for logits (N, T, A), blank
    A - 1. log_alpha and frame_lse (each frame's log-sum-exp) are by-products the backward
    node reads."""

    def __init__(self, where='ctc_batch_cost'):
        self.where = where
        self.kept = prepared.Kept()

    def infer(self, logits, labels, input_lengths, label_lengths):
        require_float(self.where, 'y_pred', logits)
        if logits.shape is not None and len(logits.shape) != 3:
            raise ValueError('%s: y_pred must have rank 3 (batch, time, classes), got shape %s'
                             % (self.where, logits.shape))
        batch, steps = (None, None) if logits.shape is None else logits.shape[:2]
        width = None if labels.shape is None else labels.shape[1]
        states = None if width is None else 2 * width + 1
        acc = accumulate_dtype(logits.dtype)
        return Meta((batch,), logits.dtype), Meta((batch, steps, states), acc), Meta((batch, steps), acc)

    def forward(self, impl, logits, labels, input_lengths, label_lengths):
        # the step keeps the launcher's runner, which writes into its reused buffers (prepared.Kept)
        return self.kept.run(impl, (logits, labels, input_lengths, label_lengths), self._runner)

    def _runner(self, impl, *arrays):
        return values_checked_runner(impl, self.where, impl.ctc.ctc_loss_fwd_runner)

    def grad(self, inputs, outputs, output_grads):
        if not (is_zero(output_grads[1]) and is_zero(output_grads[2])):
            raise ValueError('%s: gradients through log_alpha or frame_lse (by-products of the CTC loss) '
                             'are not supported; differentiate the loss' % self.where)
        logits, labels, input_lengths, label_lengths = inputs
        d_logits = apply(CtcLossGrad(), logits, labels, input_lengths, label_lengths,
                         outputs[1], outputs[2], outputs[0], output_grads[0])
        return [d_logits, None, None, None]


class CtcLossGrad(Op):
    """dlogits = (softmax - occupation / P(label)) * dloss, zero for impossible labels."""
    differentiable = False

    def __init__(self):
        self.kept = prepared.Kept()

    def infer(self, logits, *rest):
        return Meta(logits.shape, logits.dtype)

    def forward(self, impl, logits, labels, input_lengths, label_lengths, log_alpha, frame_lse, loss, dloss):
        return self.kept.run(impl, (logits, labels, input_lengths, label_lengths, log_alpha, frame_lse, loss, dloss),
                             self._runner)

    def _runner(self, impl, *arrays):
        return values_checked_runner(impl, 'ctc_batch_cost', impl.ctc.ctc_loss_bwd_runner)


def values_checked_runner(impl, where, make_kernel):
    """The kept runner of a CtcLoss / CtcLossGrad step: ``run(logits, labels, input_lengths,
    label_lengths, *by_products)`` checks the raw labels and lengths (loss_inputs_checked_later:
    on every call, the backward reusing the forward's check in the same run) and calls the
    launcher's runner, ``make_kernel(logits, <the checked int64 labels and lengths>, *by_products,
    values_checked=True)``, made on the first call from the checked arrays (their layouts follow
    from the raw ones the step's Kept compares). Its ``specialized`` variant calls the launcher
    runner's own (the one writing into the step's reused buffers, prepared.with_step_buffers)."""
    def variant(specialize):
        kernel = None

        def run(logits, labels, input_lengths, label_lengths, *by_products):
            nonlocal kernel
            checked = (logits,) + loss_inputs_checked_later(impl, where, logits.shape, labels, input_lengths,
                                                            label_lengths) + by_products
            if kernel is None:
                made = make_kernel(*checked, **impl.ctc.VALUES_CHECKED_KEYWORDS)
                specialized = getattr(made, 'specialized', None) if specialize else None
                kernel = made if specialized is None else specialized(checked)
            return kernel(*checked)
        return run
    run = variant(False)
    run.specialized = lambda arrays: variant(True)
    return run


# --- decoders -----------------------------------------------------------------------------------

def lengths_checked_later(impl, where, name, values, batch, upper, upper_desc):
    """``lengths_vector`` without a host sync: the shape and dtype now, the values (whole,
    in [0, upper]) by a device-side flag read with the others (``impl.check_later``), with
    the same messages. The decoding kernels clamp the lengths meanwhile."""
    xp = impl.xp
    lengths_vector(np, where, name, ctc_checks.stand_in(values), batch, upper, upper_desc)
    vector = values.reshape(-1)
    bad = xp.any(ctc_checks.bad_lengths(xp, vector, upper))
    impl.check_later(bad, lambda: lengths_vector(np, where, name, to_host(values), batch, upper, upper_desc))
    return vector.astype(np.int64)


def _cut_trailing_padding(xp, decoded):
    """(N, T) labels padded with -1 -> (N, longest decoded), as tf.sparse.to_dense gives."""
    width = int(xp.max(xp.sum(decoded >= 0, axis=1))) if decoded.size else 0
    return decoded[:, :width]


class CtcGreedyDecode(Op):
    """(decoded (N, longest), neg_sum_logits (N, 1)) from log-probabilities (N, T, A)."""
    shape_from_values = slice(0, None)   # decoded lengths
    differentiable = False

    def __init__(self, where='ctc_decode'):
        self.where = where

    def infer(self, log_probs, input_lengths):
        batch = None if log_probs.shape is None else log_probs.shape[0]
        return Meta((batch, None), 'int64'), Meta((batch, 1), log_probs.dtype)

    def forward(self, impl, log_probs, input_lengths):
        lengths = lengths_checked_later(impl, self.where, 'input_length', input_lengths,
                                        log_probs.shape[0], log_probs.shape[1], 'the time steps of y_pred')
        decoded, neg_sum = impl.ctc.ctc_greedy_decode(log_probs, lengths, None, True,
                                                      **impl.ctc.VALUES_CHECKED_KEYWORDS)
        return _cut_trailing_padding(impl.xp, decoded), neg_sum


class CtcBeamDecode(Op):
    """top_paths decoded (N, longest) arrays, then the log-probabilities (N, top_paths)."""
    shape_from_values = slice(0, None)   # decoded lengths
    differentiable = False

    def __init__(self, beam_width, top_paths, merge_repeated, where='ctc_decode'):
        self.beam_width, self.top_paths = beam_width, top_paths
        self.merge_repeated, self.where = merge_repeated, where

    def infer(self, log_probs, input_lengths):
        batch = None if log_probs.shape is None else log_probs.shape[0]
        return tuple([Meta((batch, None), 'int64')] * self.top_paths) + (
            Meta((batch, self.top_paths), log_probs.dtype),)

    def forward(self, impl, log_probs, input_lengths):
        lengths = lengths_checked_later(impl, self.where, 'input_length', input_lengths,
                                        log_probs.shape[0], log_probs.shape[1], 'the time steps of y_pred')
        paths, scores = impl.ctc.ctc_beam_search_decode(
            log_probs, lengths, self.beam_width, self.top_paths, None, self.merge_repeated,
            **impl.ctc.VALUES_CHECKED_KEYWORDS)
        return tuple(_cut_trailing_padding(impl.xp, p) for p in paths) + (scores,)


class MaskLabels(Op):
    """Dense labels with the entries past each label length set to -1."""
    differentiable = False

    def __init__(self, dtype, where='ctc_label_dense_to_sparse'):
        self.dtype, self.where = dtype, where

    def infer(self, labels, label_lengths):
        return Meta(labels.shape, self.dtype)

    def forward(self, impl, labels, label_lengths):
        lengths = lengths_vector(impl.xp, self.where, 'label_lengths', label_lengths,
                                 labels.shape[0], labels.shape[1], 'the width of labels')
        masked = label_matrix(impl.xp, self.where, 'labels', labels, labels.shape[0], None, lengths)
        return masked.astype(self.dtype)


# --- the Theano backend's CTC helpers -------------------------------------------------------------
# Forward values come from impl.ctc; the gradients replay the Theano recursion in xp code
# (one step function and its vector-Jacobian product), vectorized over states.

def _skip_idxs(xp, interleaved):
    skip = xp.arange(max((interleaved.shape[0] - 3) // 2, 0)) * 2 + 1
    return skip[interleaved[skip] != interleaved[skip + 2]]


def _update_step(xp, skip_idxs, zeros, active, log_p_curr, log_p_prev):
    """ctc_update_log_p, keeping what its vector-Jacobian product needs."""
    active_skip = skip_idxs[skip_idxs < active]
    top = int(xp.max(active_skip)) if active_skip.size else -1
    active_next = min(max(active + 1, top + 3), log_p_curr.shape[0])
    arg = int(xp.argmax(log_p_prev[:active]))
    p_prev = xp.exp(log_p_prev[:active] - log_p_prev[arg])
    base = zeros[:active_next].copy()
    base[:active] = p_prev
    moved = base.copy()
    moved[1:] += base[:-1]
    moved[active_skip + 2] += p_prev[active_skip]
    log_p_next = zeros.copy()
    log_p_next[:active_next] = log_p_curr[:active_next] + xp.log(moved) + log_p_prev[arg]
    return active_next, log_p_next, (active, active_skip, active_next, arg, p_prev, moved)


def _update_step_vjp(xp, cache, g):
    """(g_zeros, g_log_p_curr, g_log_p_prev) of one step for the gradient g of log_p_next."""
    active, active_skip, active_next, arg, p_prev, moved = cache
    g_curr = xp.zeros_like(g)
    g_curr[:active_next] = g[:active_next]
    g_zeros = xp.zeros_like(g)
    g_zeros[active_next:] = g[active_next:]
    g_in = g[:active_next]
    positive = moved > 0
    g_moved = xp.where(positive, g_in / xp.where(positive, moved, 1),
                       xp.where(g_in == 0, 0, xp.copysign(xp.inf, g_in)))
    g_base = g_moved.copy()
    g_base[:-1] += g_moved[1:]
    g_p = g_base[:active].copy()
    g_p[active_skip] += g_moved[active_skip + 2]
    g_zeros[active:active_next] += g_base[active:active_next]
    g_prev = xp.zeros_like(g)
    g_prev[:active] = g_p * p_prev
    # the common factor max(log_p_prev) enters both p_prev and the result
    g_prev[arg] += xp.sum(g_in) - xp.sum(g_prev[:active])
    return g_zeros, g_curr, g_prev


def _smoothed(xp, predict, interleaved, alpha):
    columns = interleaved % predict.shape[1]  # -1 is the last (blank) class
    return columns, (1 - alpha) * predict[:, columns] + alpha * 1.0 / interleaved.shape[0]


def _to_classes(xp, d_smoothed, columns, classes, alpha, dtype):
    one_hot = (columns[:, None] == xp.arange(classes)[None, :]).astype(d_smoothed.dtype)
    return ((1 - alpha) * (d_smoothed @ one_hot)).astype(dtype)


def path_probs_vjp(xp, predict, interleaved, alpha, g):
    """Gradient w.r.t. predict of ctc_path_probs's log_probs for the gradient g (T, S)."""
    columns, smoothed = _smoothed(xp, predict, interleaved, alpha)
    log_smoothed = xp.log(smoothed)
    zeros = xp.zeros_like(log_smoothed[0])
    d_log = -g
    for skips, sequence, upstream, flipped in (
            (_skip_idxs(xp, interleaved), log_smoothed, g, False),
            (_skip_idxs(xp, interleaved[::-1]), log_smoothed[::-1, ::-1], g[::-1, ::-1], True)):
        caches, active, state = [], 1, zeros
        for t in range(sequence.shape[0]):
            active, state, cache = _update_step(xp, skips, zeros, active, sequence[t], state)
            caches.append(cache)
        d_sequence = xp.zeros_like(sequence)
        g_state = xp.zeros_like(zeros)
        for t in range(sequence.shape[0] - 1, -1, -1):
            _, d_sequence[t], g_state = _update_step_vjp(xp, caches[t], upstream[t] + g_state)
        d_log = d_log + (d_sequence[::-1, ::-1] if flipped else d_sequence)
    return _to_classes(xp, d_log / smoothed, columns, predict.shape[1], alpha, predict.dtype)


def _vector_meta(where, name, meta):
    if meta.shape is not None and len(meta.shape) != 1:
        raise ValueError('%s: %s must be a vector, got shape %s' % (where, name, meta.shape))


def _predict_labels_meta(where, predict, labels):
    """The Theano-style CTC ops' inputs: a float (time, classes) predict and a label vector Y."""
    require_float(where, 'predict', predict)
    if predict.shape is not None and len(predict.shape) != 2:
        raise ValueError('%s: predict must have rank 2 (time, classes), got shape %s'
                         % (where, predict.shape))
    _vector_meta(where, 'Y', labels)


class CtcInterleaveBlanks(Op):
    differentiable = False

    def infer(self, labels):
        _vector_meta('ctc_interleave_blanks', 'Y', labels)
        n = None if labels.shape is None or labels.shape[0] is None else 2 * labels.shape[0] + 1
        return Meta((n,), 'int64')

    def forward(self, impl, labels):
        integer_values(impl.xp, 'ctc_interleave_blanks', 'Y', labels)
        return impl.ctc.ctc_interleave_blanks(labels)


class CtcCreateSkipIdxs(Op):
    differentiable = False

    def infer(self, labels):
        _vector_meta('ctc_create_skip_idxs', 'Y', labels)
        return Meta((None,), 'int64')

    def forward(self, impl, labels):
        integer_values(impl.xp, 'ctc_create_skip_idxs', 'Y', labels)
        return impl.ctc.ctc_create_skip_idxs(labels)


class CtcUpdateLogP(Op):
    """(active_next, log_p_next) of one Theano CTC recursion step."""

    def infer(self, skip_idxs, zeros, active, log_p_curr, log_p_prev):
        if active.shape not in ((), None):
            raise ValueError('ctc_update_log_p: active must be a scalar, got shape %s' % (active.shape,))
        return Meta((), 'int32'), Meta(zeros.shape, zeros.dtype)

    def forward(self, impl, skip_idxs, zeros, active, log_p_curr, log_p_prev):
        active_next, log_p_next = impl.ctc.ctc_update_log_p(
            skip_idxs, zeros, int(active), log_p_curr, log_p_prev)
        return impl.xp.asarray(active_next, dtype=np.int32), log_p_next

    def grad(self, inputs, outputs, output_grads):
        g_zeros, g_curr, g_prev = apply(CtcUpdateLogPGrad(), *inputs, output_grads[1])
        return [None, g_zeros, None, g_curr, g_prev]


class CtcUpdateLogPGrad(Op):
    differentiable = False

    def infer(self, skip_idxs, zeros, active, log_p_curr, log_p_prev, g):
        return (Meta(zeros.shape, zeros.dtype), Meta(log_p_curr.shape, log_p_curr.dtype),
                Meta(log_p_prev.shape, log_p_prev.dtype))

    def forward(self, impl, skip_idxs, zeros, active, log_p_curr, log_p_prev, g):
        xp = impl.xp
        skip_idxs = integer_values(xp, 'ctc_update_log_p', 'skip_idxs', skip_idxs)
        _, _, cache = _update_step(xp, skip_idxs, zeros, int(active), log_p_curr, log_p_prev)
        g_zeros, g_curr, g_prev = _update_step_vjp(xp, cache, g)
        return g_zeros.astype(zeros.dtype), g_curr.astype(log_p_curr.dtype), g_prev.astype(log_p_prev.dtype)


class CtcPathProbs(Op):
    """(log_probs (T, S), mask (T, S)) of the Theano backend for an interleaved label."""

    def __init__(self, alpha):
        self.alpha = float(alpha)

    def infer(self, predict, labels):
        _predict_labels_meta('ctc_path_probs', predict, labels)
        shape = (None if predict.shape is None else predict.shape[0],
                 None if labels.shape is None else labels.shape[0])
        return Meta(shape, predict.dtype), Meta(shape, 'bool')

    def forward(self, impl, predict, labels):
        labels = integer_values(impl.xp, 'ctc_path_probs', 'Y', labels)
        log_probs, mask = impl.ctc.ctc_path_probs(predict, labels, self.alpha)
        return log_probs.astype(predict.dtype), mask

    def grad(self, inputs, outputs, output_grads):
        return [apply(CtcPathProbsGrad(self.alpha), inputs[0], inputs[1], output_grads[0]), None]


class CtcPathProbsGrad(Op):
    differentiable = False

    def __init__(self, alpha):
        self.alpha = alpha

    def infer(self, predict, labels, g):
        return Meta(predict.shape, predict.dtype)

    def forward(self, impl, predict, labels, g):
        xp = impl.xp
        labels = integer_values(xp, 'ctc_path_probs', 'Y', labels)
        return path_probs_vjp(xp, predict, labels, self.alpha, g)


class CtcCost(Op):
    """Theano ctc_cost: -log of the summed path probabilities of label Y (not interleaved)."""

    def infer(self, predict, labels):
        _predict_labels_meta('ctc_cost', predict, labels)
        return Meta((), predict.dtype)

    def forward(self, impl, predict, labels):
        labels = integer_values(impl.xp, 'ctc_cost', 'Y', labels)
        return impl.xp.asarray(impl.ctc.ctc_cost(predict, labels), dtype=predict.dtype)

    def grad(self, inputs, outputs, output_grads):
        return [apply(CtcCostGrad(), inputs[0], inputs[1], output_grads[0]), None]


class CtcCostGrad(Op):
    """cost = -log(T P(Y)): d cost / d log y_t(s) = -T alpha_t(s) beta_t(s) / (y_t(s) sum)."""
    differentiable = False
    alpha = 1e-4  # ctc_cost's smoothing (Theano's ctc_path_probs default)

    def infer(self, predict, labels, g):
        return Meta(predict.shape, predict.dtype)

    def forward(self, impl, predict, labels, g):
        xp = impl.xp
        interleaved = impl.ctc.ctc_interleave_blanks(integer_values(xp, 'ctc_cost', 'Y', labels))
        log_probs, mask = impl.ctc.ctc_path_probs(predict, interleaved, self.alpha)
        top = xp.max(xp.where(mask, log_probs, -xp.inf))
        weights = xp.where(mask, xp.exp(log_probs - top), 0)
        d_log = -predict.shape[0] * weights / xp.sum(weights) * g
        columns, smoothed = _smoothed(xp, predict, interleaved, self.alpha)
        return _to_classes(xp, d_log / smoothed, columns, predict.shape[1], self.alpha, predict.dtype)


__all__ = ['CtcLoss', 'CtcLossGrad', 'CtcGreedyDecode', 'CtcBeamDecode', 'MaskLabels',
           'CtcInterleaveBlanks', 'CtcCreateSkipIdxs', 'CtcUpdateLogP', 'CtcPathProbs', 'CtcCost',
           'check_loss_inputs', 'lengths_vector', 'label_matrix', 'integer_values']
