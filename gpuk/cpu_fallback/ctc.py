"""NumPy twins of the CTC kernels (gpuk/kernels/ctc.py).

Layout: logits (N, T, A) batch-major, labels (N, Lmax) dense (padding past
label_lengths ignored), input_lengths (N,), label_lengths (N,). `blank` is
a class index, None for the last class (A - 1, as Keras and TensorFlow use).

The loss applies log-softmax to the logits itself and runs the alpha / beta
recursions in log space over the extended label (blank, l1, blank, l2, ...,
blank) of S = 2 Lmax + 1 states, vectorized over batch and states, with one
Python loop over time. A label that cannot be aligned in its input length
gets loss inf and a zero gradient (as TensorFlow), never NaN.

Decoders follow TensorFlow's ctc_greedy_decoder and ctc_beam_search_decoder
(what Keras 2.3.1's ctc_decode calls); the Theano-backend helpers at the end
reproduce keras/backend/theano_backend.py 2.3.1 on NumPy arrays.
"""
from types import MappingProxyType

import numpy as np

from gpuk.contracts.dtypes import accumulation_dtype
from gpuk.contracts import ctc_checks as checks
from gpuk.cpu_fallback.softmax_xent import log_sum_exp

__all__ = [
    'ctc_check_loss_values', 'ctc_loss_fwd', 'ctc_loss_bwd', 'ctc_loss_fwd_runner', 'ctc_loss_bwd_runner',
    'ctc_greedy_decode', 'ctc_beam_search_decode',
    'ctc_interleave_blanks', 'ctc_create_skip_idxs', 'ctc_update_log_p',
    'ctc_path_probs', 'ctc_cost',
]

# Empty: the twin checks the labels' and lengths' values at once on every call, so a caller that
# checked them itself has no switch to pass (the launchers' values_checked=True: gpuk/kernels/ctc.py).
VALUES_CHECKED_KEYWORDS = MappingProxyType({})


# ---------------------------------------------------------------- loss

def _log_softmax_classes(logits):
    return _log_softmax_from(logits, _frame_lse(logits))


def _frame_lse(logits):
    """(N, T) log-sum-exp of each frame's logits, in the accumulation dtype."""
    x = logits.astype(accumulation_dtype(logits.dtype), copy=False)
    with np.errstate(invalid='ignore'):
        return log_sum_exp(x, -1)[..., 0]


def _log_softmax_from(logits, frame_lse):
    x = logits.astype(frame_lse.dtype, copy=False)
    with np.errstate(invalid='ignore'):
        return x - frame_lse[..., None]


class _StateBuffer:
    """(N, S) log-space variables inside an (N, S + 2) buffer padded with -inf.

    `values` is the (N, S) part; `shifted(k)` views the variables of state s - k
    at state s (k = 1, 2 from lower states, -1, -2 from higher ones), -inf off the
    end, with no copy: the time loops run ~15 small ufuncs per step, not ~25.
    """

    def __init__(self, batch, states, dtype, from_lower):
        self._padded = np.full((batch, states + 2), -np.inf, dtype=dtype)
        self._offset = 2 if from_lower else 0
        self.values = self._padded[:, self._offset:self._offset + states]
        self._states = states

    def shifted(self, k):
        start = self._offset - k
        return self._padded[:, start:start + self._states]


def _log_add3(a, b, c, out):
    """log(exp(a) + exp(b) + exp(c)) into `out` (not aliasing a, b or c), -inf safe.

    Values here are log-probabilities (<= 0, -inf or NaN): where all three are
    -inf the shift is the dtype's lowest finite value instead of -inf, so each
    exp is exp(-inf) = 0 rather than NaN, and the result is log(0) + shift = -inf.
    """
    shift = np.maximum(a, b)
    np.maximum(shift, c, out=shift)
    np.maximum(shift, np.finfo(shift.dtype).min, out=shift)
    term = np.empty_like(shift)
    np.subtract(a, shift, out=out)
    np.exp(out, out=out)
    for other in (b, c):
        np.subtract(other, shift, out=term)
        np.exp(term, out=term)
        out += term
    with np.errstate(divide='ignore'):
        np.log(out, out=out)
    out += shift
    return out


class _ExtendedLabels:
    """blank, l1, blank, l2, ..., blank for every sample, padded to S states."""

    def __init__(self, labels, label_lengths, blank):
        batch, width = labels.shape
        self.states = 2 * width + 1
        used = np.arange(width) < label_lengths[:, None]
        padded = np.where(used, labels, blank)
        self.classes = np.full((batch, self.states), blank, dtype=np.int64)
        self.classes[:, 1::2] = padded
        # state s may be entered from s - 2 when it is a label differing
        # from the previous label (a repeat needs the blank between)
        self.skip_into = np.zeros((batch, self.states), dtype=bool)
        self.skip_into[:, 3::2] = padded[:, 1:] != padded[:, :-1]
        self.count = 2 * label_lengths + 1
        self.valid = np.arange(self.states) < self.count[:, None]

    def emissions(self, log_probs):
        """(N, T, A) log-probabilities -> (N, T, S) per extended state."""
        index = np.broadcast_to(self.classes[:, None, :],
                                log_probs.shape[:2] + (self.states,))
        return np.take_along_axis(log_probs, index, axis=2)


def _final_log_likelihood(log_alpha, ext, input_lengths, label_lengths):
    batch = log_alpha.shape[0]
    if log_alpha.shape[1] == 0:
        return np.where(label_lengths == 0, 0.0, -np.inf)
    rows = np.arange(batch)
    last = log_alpha[rows, np.maximum(input_lengths - 1, 0)]
    end_blank = last[rows, ext.count - 1]
    end_label = np.where(label_lengths > 0, last[rows, np.maximum(ext.count - 2, 0)], -np.inf)
    log_likelihood = np.logaddexp(end_blank, end_label)
    empty_input = np.where(label_lengths == 0, 0.0, -np.inf)
    return np.where(input_lengths == 0, empty_input, log_likelihood)


def ctc_loss_fwd(logits, labels, input_lengths, label_lengths, blank=None):
    """CTC negative log-likelihood of each label given softmax(logits).

    # Returns
        (loss, log_alpha, frame_lse): loss (N,) (inf where no alignment exists);
        log_alpha (N, T, 2 Lmax + 1), the forward variables including the
        emission at t, -inf past each input length and label length;
        frame_lse (N, T), the log-sum-exp of each frame's logits (the backward
        reads it instead of recomputing it). float16 logits give a float16
        loss and float32 by-products.
    """
    fn = 'ctc_loss_fwd'
    logits, labels, input_lengths, label_lengths, blank = checks.check_loss_inputs(
        fn, logits, labels, input_lengths, label_lengths, blank)
    batch, steps, _ = logits.shape
    ext = _ExtendedLabels(labels, label_lengths, blank)
    frame_lse = _frame_lse(logits)
    emit = ext.emissions(_log_softmax_from(logits, frame_lse))
    log_alpha = np.full(emit.shape, -np.inf, dtype=emit.dtype)
    if steps:
        # states past a label's end get emission -inf, so they stay -inf; the skip
        # rule is a 0 / -inf log mask added to the s - 2 predecessor
        emit = np.where(ext.valid[:, None, :], emit, -np.inf)
        skip_mask = np.where(ext.skip_into, 0, -np.inf).astype(emit.dtype)
        alpha = _StateBuffer(batch, ext.states, emit.dtype, from_lower=True)
        alpha.values[:, :2] = emit[:, 0, :2]
        log_alpha[:, 0] = alpha.values
        summed = np.empty_like(alpha.values)
        for t in range(1, steps):
            _log_add3(alpha.values, alpha.shifted(1), alpha.shifted(2) + skip_mask, summed)
            np.add(summed, emit[:, t], out=alpha.values)
            log_alpha[:, t] = alpha.values
        log_alpha[np.arange(steps)[None, :] >= input_lengths[:, None]] = -np.inf
    # + 0.0 turns the -0.0 of an empty label on no frames into 0.0
    loss = 0.0 - _final_log_likelihood(log_alpha, ext, input_lengths, label_lengths) + 0.0
    return loss.astype(logits.dtype), log_alpha, frame_lse


def ctc_loss_bwd(logits, labels, input_lengths, label_lengths, log_alpha, frame_lse, loss, dloss,
                 blank=None):
    """Gradient of ctc_loss_fwd's loss with respect to the logits.

    Computes the backward variables beta, then per frame
    dlogits = (softmax - occupation / P(label)) * dloss, the log-softmax
    folded in; zero past each input length and for impossible labels.
    """
    fn = 'ctc_loss_bwd'
    logits, labels, input_lengths, label_lengths, blank = checks.check_loss_inputs(
        fn, logits, labels, input_lengths, label_lengths, blank)
    batch, steps, classes = logits.shape
    ext = _ExtendedLabels(labels, label_lengths, blank)
    log_alpha = checks.float_array(fn, 'log_alpha', log_alpha)
    if log_alpha.shape != (batch, steps, ext.states):
        raise ValueError('%s: log_alpha must have shape %s (batch, time, 2 * labels width + 1), '
                         'got %s' % (fn, (batch, steps, ext.states), log_alpha.shape))
    frame_lse = checks.float_array(fn, 'frame_lse', frame_lse)
    if frame_lse.shape != (batch, steps):
        raise ValueError('%s: frame_lse must have shape %s (batch, time), got %s'
                         % (fn, (batch, steps), frame_lse.shape))
    loss = checks.float_array(fn, 'loss', loss)
    dloss = checks.float_array(fn, 'dloss', dloss)
    for name, array in (('loss', loss), ('dloss', dloss)):
        if array.shape != (batch,):
            raise ValueError('%s: %s must have shape (%d,), got %s'
                             % (fn, name, batch, array.shape))
    acc = accumulation_dtype(logits.dtype)
    log_probs = _log_softmax_from(logits, frame_lse.astype(acc, copy=False))
    emit = ext.emissions(log_probs)
    log_alpha = log_alpha.astype(acc, copy=False)

    # log_beta[t, s]: log-probability of frames t+1 .. T_n-1 given state s at t
    log_beta = np.full(emit.shape, -np.inf, dtype=acc)
    rows = np.arange(batch)
    end_state = np.full((batch, ext.states), -np.inf, dtype=acc)
    end_state[rows, ext.count - 1] = 0
    end_state[rows[label_lengths > 0], ext.count[label_lengths > 0] - 2] = 0
    skip_from = np.zeros_like(ext.skip_into)
    skip_from[:, :-2] = ext.skip_into[:, 2:]
    # as in ctc_loss_fwd: -inf emissions past the label end, a 0 / -inf skip mask
    emit = np.where(ext.valid[:, None, :], emit, -np.inf)
    skip_mask = np.where(skip_from, 0, -np.inf).astype(acc)
    ahead = _StateBuffer(batch, ext.states, acc, from_lower=False)
    beta = np.full((batch, ext.states), -np.inf, dtype=acc)
    recursed = np.full_like(beta, -np.inf)
    frames = np.arange(steps)[:, None, None]
    at_end = frames == (input_lengths - 1)[None, :, None]          # (T, N, 1)
    before_end = frames < (input_lengths - 1)[None, :, None]
    for t in range(steps - 1, -1, -1):
        if t < steps - 1:
            np.add(beta, emit[:, t + 1], out=ahead.values)
            _log_add3(ahead.values, ahead.shifted(-1), ahead.shifted(-2) + skip_mask, recursed)
        beta = np.where(at_end[t], end_state, np.where(before_end[t], recursed, -np.inf))
        log_beta[:, t] = beta

    possible = np.isfinite(loss)
    shift = np.where(possible, loss, 0).astype(acc)
    occupation = np.exp(log_alpha + log_beta + shift[:, None, None])
    one_hot = (ext.classes[:, :, None] == np.arange(classes)).astype(acc)
    occupation_per_class = np.matmul(occupation, one_hot)
    grad = (np.exp(log_probs) - occupation_per_class) * dloss.astype(acc)[:, None, None]
    inside = (np.arange(steps)[None, :] < input_lengths[:, None]) & possible[:, None]
    grad = np.where(inside[:, :, None], grad, 0)
    return grad.astype(logits.dtype, copy=False)


# ---------------------------------------------------------------- the loss inputs' values (Keras)

def ctc_loss_fwd_runner(logits, labels, input_lengths, label_lengths, blank=None):
    """``run(logits, labels, input_lengths, label_lengths)``: ctc_loss_fwd with this blank (what a
    CtcLoss plan step keeps; checked per call here, as in ctc_loss_fwd)."""
    return lambda logits, labels, input_lengths, label_lengths: ctc_loss_fwd(logits, labels, input_lengths,
                                                                             label_lengths, blank)


def ctc_loss_bwd_runner(logits, labels, input_lengths, label_lengths, log_alpha, frame_lse, loss, dloss, blank=None):
    """``run(logits, labels, input_lengths, label_lengths, log_alpha, frame_lse, loss, dloss)``:
    ctc_loss_bwd with this blank (a CtcLossGrad plan step's; checked per call here)."""
    def run(logits, labels, input_lengths, label_lengths, log_alpha, frame_lse, loss, dloss):
        return ctc_loss_bwd(logits, labels, input_lengths, label_lengths, log_alpha, frame_lse, loss, dloss, blank)
    return run

def _clamped_lengths(lengths, upper):
    """Lengths clamped to [0, upper] and truncated, NaN as 0: what ctc_check.cu writes (it reads
    every value as a double)."""
    return np.nan_to_num(np.clip(np.asarray(lengths, dtype=np.float64), 0, upper)).astype(np.int64)


def ctc_check_loss_values(labels, input_lengths, label_lengths, steps, classes):
    """The values of a CTC loss's labels (N, L) and lengths (N,), as Keras's ctc_batch_cost
    takes them (the blank is class ``classes - 1`` and ends a label; any integer or float dtype),
    checked and converted for the loss: the reference of ctc_check.cu's ctc_check_inputs.

    # Returns
        (labels, input_lengths, label_lengths, bad): int64 arrays, the label lengths clamped to
        [0, L] and cut at their first label >= classes - 1, the input lengths clamped to
        [0, steps] (NaN: 0), each label within its cut length kept when it is whole and >= 0 and
        -1 elsewhere; ``bad`` (0-d bool) is True when a length is not whole or out of its bounds,
        a label within its cut length is not whole or negative, or a label past the cut but within
        its length is not a blank (gpuk/ops/ctc.py's check_loss_inputs then raises the error).
    """
    labels, input_lengths, label_lengths = (np.asarray(a) for a in (labels, input_lengths, label_lengths))
    checks.check_value_arrays('ctc_check_loss_values', labels, input_lengths, label_lengths)
    width = labels.shape[1]
    cut = checks.lengths_to_first_blank(np, labels, _clamped_lengths(label_lengths, width), classes)
    within = np.arange(width) < cut[:, None]
    bad_labels = within & (checks.not_integral(np, labels) | (labels < 0))
    after_cut = checks.labels_after_the_cut(np, labels, _clamped_lengths(label_lengths, width), cut, classes)
    bad = (checks.lengths_flag(np, input_lengths, label_lengths, steps, width) | np.any(bad_labels)
           | np.any(after_cut))
    kept = within & ~bad_labels
    checked = np.full(labels.shape, -1, dtype=np.int64)
    checked[kept] = labels[kept]
    return checked, _clamped_lengths(input_lengths, steps), cut, np.asarray(bad)


# ---------------------------------------------------------------- decoders

def _compact_labels(labels):
    """(..., T) labels with -1 holes -> labels moved to the front, -1 padded."""
    keep = labels >= 0
    position = np.cumsum(keep, axis=-1) - 1
    out = np.full(labels.shape, -1, dtype=np.int64)
    index = np.nonzero(keep)
    out[index[:-1] + (position[index],)] = labels[index]
    return out


def ctc_greedy_decode(log_probs, input_lengths, blank=None, merge_repeated=True):
    """Best path: argmax per frame within input_length, merge repeats, drop blanks.

    TensorFlow's ctc_greedy_decoder: repeats merge only when adjacent frames
    agree (a blank between two equal labels keeps both); ties take the lowest
    class.

    # Returns
        (decoded, neg_sum_logits): decoded (N, T) int64 padded with -1;
        neg_sum_logits (N, 1), minus the sum over frames of the largest
        log_prob (Keras returns it as `log_prob`).
    """
    fn = 'ctc_greedy_decode'
    log_probs, input_lengths, blank = checks.check_decode_inputs(
        fn, log_probs, input_lengths, blank)
    batch, steps, _ = log_probs.shape
    inside = np.arange(steps)[None, :] < input_lengths[:, None]
    best = np.argmax(log_probs, axis=2) if steps else np.zeros((batch, 0), np.int64)
    previous = np.concatenate([np.full((batch, 1), -1), best[:, :-1]], axis=1)
    keep = inside & (best != blank)
    if merge_repeated:
        keep &= best != previous
    decoded = _compact_labels(np.where(keep, best, -1))
    acc = accumulation_dtype(log_probs.dtype)
    frame_max = np.max(log_probs, axis=2, initial=-np.inf).astype(acc)
    neg_sum = 0.0 - np.sum(np.where(inside, frame_max, 0), axis=1, keepdims=True) + 0.0
    return decoded, neg_sum.astype(log_probs.dtype)


# Prefixes are identified by a polynomial hash of their labels modulo two
# primes (~62 bits): merging equal prefixes across beams is then one sort.
_P1, _B1 = 2147483647, 1000003
_P2, _B2 = 1000000007, 911382323
# ctc_beam_search_decode's scratch per candidate (a beam staying or extended by a label) of a
# step: about 25 int64 / float arrays of one entry per candidate alive at once, with temporaries
_CANDIDATE_BYTES = 32 * 8


def _beam_scratch_bytes(batch, steps, classes, width):
    """The memory ctc_beam_search_decode needs, at most: each step's candidates, width
    beams times (the stay and the classes - 1 labels), and the parents and labels of every
    step's beams, kept for the backtrace."""
    return batch * width * (classes * _CANDIDATE_BYTES + steps * 2 * 8)


def ctc_beam_search_decode(log_probs, input_lengths, beam_width=100, top_paths=1, blank=None,
                           merge_repeated=False):
    """CTC prefix beam search, TensorFlow's ctc_beam_search_decoder.

    Each prefix carries the probability of ending in a blank and in its last
    label; extending by the label it ends with draws only from the blank
    part; equal prefixes reached from several beams are merged (summed).
    Frames are log-softmax normalized first, as TensorFlow does. Keras
    2.3.1's ctc_decode passes merge_repeated=False, so by default the
    prefixes come back as found; merge_repeated=True collapses equal
    neighbours in the output only (TF's semantics). Ranking ties may order
    differently from TF; prefixes are told apart by a 62-bit hash.

    # Returns
        (paths, log_probs): a list of top_paths arrays (N, T) int64 padded
        with -1, best first; log_probs (N, top_paths), the log-probability
        of each prefix (-inf with an empty path when fewer prefixes exist).
    """
    fn = 'ctc_beam_search_decode'
    log_probs, input_lengths, blank = checks.check_decode_inputs(
        fn, log_probs, input_lengths, blank)
    beam_width = checks.positive_int(fn, 'beam_width', beam_width)
    top_paths = checks.positive_int(fn, 'top_paths', top_paths, beam_width)
    batch, steps, classes = log_probs.shape
    width = checks.useful_beam_width(beam_width, steps, classes)   # the same results, no dead beams
    checks.check_beam_scratch(fn, beam_width, _beam_scratch_bytes(batch, steps, classes, width),
                              checks.host_bytes_available(), 'host', log_probs.shape)
    found_paths = min(top_paths, width)   # the paths past the prefixes that exist: empty, -inf
    frames = _log_softmax_classes(log_probs)
    acc = frames.dtype
    extend_with = np.array([c for c in range(classes) if c != blank], dtype=np.int64)
    n_ext = extend_with.size
    rows = np.arange(batch)[:, None]

    p_blank = np.full((batch, width), -np.inf, dtype=acc)
    p_blank[:, 0] = 0
    p_label = np.full((batch, width), -np.inf, dtype=acc)
    hash1 = np.zeros((batch, width), dtype=np.int64)
    hash2 = np.zeros((batch, width), dtype=np.int64)
    last = np.full((batch, width), -1, dtype=np.int64)
    parents = np.tile(np.arange(width), (steps, batch, 1))
    emitted = np.full((steps, batch, width), -1, dtype=np.int64)

    slots = np.broadcast_to(np.arange(width)[None, :, None], (batch, width, n_ext))
    for t in range(steps):
        frame = frames[:, t]
        total = np.logaddexp(p_blank, p_label)
        # candidates: every beam staying as it is, then every beam extended
        last_prob = np.where(last >= 0, np.take_along_axis(frame, np.maximum(last, 0), 1),
                             -np.inf)
        repeat = last[:, :, None] == extend_with
        ext_label = np.where(repeat, p_blank[:, :, None], total[:, :, None]) \
            + frame[:, extend_with][:, None, :]

        def join(stay, extended):
            return np.concatenate([stay, extended.reshape(batch, width * n_ext)], axis=1)

        c_blank = join(total + frame[:, blank:blank + 1],
                       np.full((batch, width, n_ext), -np.inf, dtype=acc))
        c_label = join(p_label + last_prob, ext_label)
        c_hash1 = join(hash1, (hash1[:, :, None] * _B1 + extend_with + 1) % _P1)
        c_hash2 = join(hash2, (hash2[:, :, None] * _B2 + extend_with + 1) % _P2)
        c_last = join(last, np.broadcast_to(extend_with, (batch, width, n_ext)))
        c_parent = join(np.broadcast_to(np.arange(width), (batch, width)), slots)
        c_emit = join(np.full((batch, width), -1), np.broadcast_to(extend_with,
                                                                   (batch, width, n_ext)))
        c_total = np.logaddexp(c_blank, c_label)
        count = c_total.shape[1]

        # merge equal prefixes of a row: sort by (row, hash, best first)
        key = (c_hash1 * _P2 + c_hash2).ravel()
        row_of = np.repeat(np.arange(batch), count)
        order = np.lexsort((-c_total.ravel(), key, row_of))
        key_sorted, row_sorted = key[order], row_of[order]
        first = np.ones(order.size, dtype=bool)
        first[1:] = (key_sorted[1:] != key_sorted[:-1]) | (row_sorted[1:] != row_sorted[:-1])
        starts = np.flatnonzero(first)
        g_blank = np.logaddexp.reduceat(c_blank.ravel()[order], starts)
        g_label = np.logaddexp.reduceat(c_label.ravel()[order], starts)
        g_best = order[starts]
        g_row = row_sorted[starts]
        g_col = np.arange(starts.size) - np.searchsorted(g_row, g_row)

        # keep the best `width` merged prefixes of every row
        padded = np.full((batch, count), -np.inf, dtype=acc)
        padded[g_row, g_col] = np.logaddexp(g_blank, g_label)
        group_at = np.zeros((batch, count), dtype=np.int64)
        group_at[g_row, g_col] = np.arange(starts.size)
        pick = np.argsort(-padded, axis=1, kind='stable')[:, :width]
        group = group_at[rows, pick]
        alive = np.isfinite(padded[rows, pick])
        best = g_best[group]
        active = (t < input_lengths)[:, None]

        def update(old, new, dead):
            return np.where(active, np.where(alive, new, dead), old)

        p_blank = update(p_blank, g_blank[group], -np.inf)
        p_label = update(p_label, g_label[group], -np.inf)
        hash1 = update(hash1, c_hash1.ravel()[best], 0)
        hash2 = update(hash2, c_hash2.ravel()[best], 0)
        last = update(last, c_last.ravel()[best], -1)
        parents[t] = update(parents[t], c_parent.ravel()[best], 0)
        emitted[t] = update(emitted[t], c_emit.ravel()[best], -1)

    final = np.logaddexp(p_blank, p_label)
    chosen = np.argsort(-final, axis=1, kind='stable')[:, :found_paths]
    scores = np.take_along_axis(final, chosen, 1)
    sequence = np.full((batch, found_paths, steps), -1, dtype=np.int64)
    slot = chosen
    for t in range(steps - 1, -1, -1):
        sequence[:, :, t] = np.take_along_axis(emitted[t], slot, 1)
        slot = np.take_along_axis(parents[t], slot, 1)
    sequence = np.where(np.isfinite(scores)[:, :, None], sequence, -1)
    if merge_repeated:
        compact = _compact_labels(sequence)
        repeat = np.concatenate([np.zeros((batch, found_paths, 1), bool),
                                 compact[:, :, 1:] == compact[:, :, :-1]], axis=2)
        sequence = np.where(repeat, -1, compact)
    decoded = _compact_labels(sequence)
    scores = np.concatenate([scores, np.full((batch, top_paths - found_paths), -np.inf, dtype=acc)], axis=1)
    empty = np.full((batch, steps), -1, dtype=np.int64)
    return ([decoded[:, k] for k in range(found_paths)] + [empty.copy() for _ in range(found_paths, top_paths)],
            scores.astype(log_probs.dtype))


# ---------------------------------------------------------------- Theano backend helpers

def _label_vector(fn, name, value):
    return checks.int_array(fn, name, value, 1)


def ctc_interleave_blanks(Y):
    """[y1, y2, ...] -> [-1, y1, -1, y2, ..., -1]; -1 indexes the last (blank) class."""
    labels = _label_vector('ctc_interleave_blanks', 'Y', Y)
    out = np.full(2 * labels.shape[0] + 1, -1, dtype=np.int64)
    out[1::2] = labels
    return out


def ctc_create_skip_idxs(Y):
    """Odd positions i of the interleaved Y whose label differs from Y[i + 2]."""
    interleaved = _label_vector('ctc_create_skip_idxs', 'Y', Y)
    skip = np.arange(max((interleaved.shape[0] - 3) // 2, 0), dtype=np.int64) * 2 + 1
    return skip[interleaved[skip] != interleaved[skip + 2]]


def ctc_update_log_p(skip_idxs, zeros, active, log_p_curr, log_p_prev):
    """One step of the Theano-backend recursion over the first `active` states.

    # Returns
        (active_next, log_p_next), log_p_next holding `zeros` past active_next.
    """
    fn = 'ctc_update_log_p'
    skip_idxs = _label_vector(fn, 'skip_idxs', skip_idxs)
    zeros = checks.float_array(fn, 'zeros', zeros)
    log_p_curr = checks.float_array(fn, 'log_p_curr', log_p_curr)
    log_p_prev = checks.float_array(fn, 'log_p_prev', log_p_prev)
    if isinstance(active, bool) or not isinstance(active, (int, np.integer)) \
            or not 1 <= active <= log_p_prev.shape[0]:
        raise ValueError('%s: active must be an int in [1, %d], got %r'
                         % (fn, log_p_prev.shape[0], active))
    active = int(active)
    active_skip = skip_idxs[skip_idxs < active]
    active_next = min(max(active + 1, int(np.max(active_skip, initial=-1)) + 3),
                      log_p_curr.shape[0])
    common_factor = np.max(log_p_prev[:active])
    p_prev = np.exp(log_p_prev[:active] - common_factor)
    staying = zeros[:active_next].copy()
    staying[:active] = p_prev
    moved = staying.copy()
    moved[1:] += staying[:-1]
    moved[active_skip + 2] += p_prev[active_skip]
    with np.errstate(divide='ignore'):
        updated_log_p_prev = np.log(moved) + common_factor
    log_p_next = zeros.copy()
    log_p_next[:active_next] = log_p_curr[:active_next] + updated_log_p_prev
    return active_next, log_p_next


def ctc_path_probs(predict, Y, alpha=1e-4):
    """Theano ctc_path_probs: forward and backward log-probabilities.

    predict (T, A) holds probabilities, Y is an interleaved label; each
    probability is smoothed as (1 - alpha) p + alpha / len(Y).

    # Returns
        (log_probs, mask): (T, len(Y)) log(alpha * beta / y) and the states
        reachable from both ends.
    """
    fn = 'ctc_path_probs'
    predict = checks.float_array(fn, 'predict', predict)
    if predict.ndim != 2:
        raise ValueError('%s: predict must have rank 2 (time, classes), got shape %s'
                         % (fn, predict.shape))
    Y = _label_vector(fn, 'Y', Y)
    if Y.size and (Y.min() < -predict.shape[1] or Y.max() >= predict.shape[1]):
        raise ValueError('%s: Y must index the %d classes of predict, got values in [%d, %d]'
                         % (fn, predict.shape[1], Y.min(), Y.max()))
    smoothed = (1 - alpha) * predict[:, Y] + alpha * np.float32(1.) / Y.shape[0]
    log_smoothed = np.log(smoothed)
    zeros = np.zeros_like(log_smoothed[0])
    forward_skips = ctc_create_skip_idxs(Y)
    backward_skips = ctc_create_skip_idxs(Y[::-1])
    reversed_log = log_smoothed[::-1, ::-1]
    f_active, log_f, b_active, log_b = 1, zeros, 1, zeros
    f_actives, log_fs, b_actives, log_bs = [], [], [], []
    for t in range(log_smoothed.shape[0]):
        f_active, log_f = ctc_update_log_p(forward_skips, zeros, f_active,
                                           log_smoothed[t], log_f)
        b_active, log_b = ctc_update_log_p(backward_skips, zeros, b_active,
                                           reversed_log[t], log_b)
        f_actives.append(f_active)
        log_fs.append(log_f)
        b_actives.append(b_active)
        log_bs.append(log_b)
    steps = log_smoothed.shape[0]
    log_f_probs = np.array(log_fs).reshape(steps, -1)
    log_b_probs = np.array(log_bs).reshape(steps, -1)
    idxs = np.arange(log_smoothed.shape[1])[None, :]
    mask = ((idxs < np.array(f_actives, dtype=np.int64)[:, None])
            & (idxs < np.array(b_actives, dtype=np.int64)[:, None])[::-1, ::-1])
    log_probs = log_f_probs + log_b_probs[::-1, ::-1] - log_smoothed
    return log_probs, mask


def ctc_cost(predict, Y):
    """Theano ctc_cost: -log of sum over (t, s) of alpha beta / y for label Y.

    Summed over every frame t, this is -log(T * P(Y)) with smoothed
    probabilities: the Theano backend's ctc_batch_cost returns exactly this.
    """
    log_probs, mask = ctc_path_probs(predict, ctc_interleave_blanks(Y))
    common_factor = np.max(log_probs)
    total_log_prob = np.log(np.sum(np.exp(log_probs - common_factor)[mask.nonzero()]))
    return -(total_log_prob + common_factor)
