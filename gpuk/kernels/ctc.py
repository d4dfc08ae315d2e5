"""Launchers for ctc.cu (loss, gradient) and ctc_decode.cu (greedy and beam-search decoding).

Same names, signatures, output dtypes and errors as gpuk/cpu_fallback/ctc.py, plus a
keyword-only `runtime` (None: runtime.current(); 'cuda', 'emulate', or a runtime object).
Every argument is checked before any launch: the small integer inputs (labels, lengths)
are validated on host copies by the checks the twin uses too (cpu_fallback/ctc_checks.py),
so the messages are identical; the logits are checked by shape and dtype only (a
zero-stride stand-in goes through the same checks).

Kernels: ctc_frame_lse (a warp per frame) normalizes the logits; ctc_alpha and
ctc_beta_grad run one block per sample with threads across the 2 Lmax + 1 label states
(any label length: the recursion reads the previous step back from global memory);
ctc_greedy_decode and ctc_beam_search run one block per sample. See the .cu files.

On the CUDA runtime the loss and its gradient run the 'ctc' family's choice
(``GPUK_KERNELS=ctc=gpuk|cudnn|auto``): these kernels or cudnnCTCLoss
(gpuk/kernels/cudnn_ctc.py), which falls back here, saying so once, outside its limits.

The Theano-backend helpers (ctc_interleave_blanks, ctc_create_skip_idxs,
ctc_update_log_p, ctc_path_probs, ctc_cost) are tiny index helpers over one label: they
delegate to the NumPy twin on host copies and return arrays of the runtime's xp.
"""
from pathlib import Path

import numpy as np

from gpuk.cpu_fallback import ctc as twin
from gpuk.cpu_fallback import ctc_checks
from gpuk.cpu_fallback.softmax_xent_checks import accumulate_dtype
from . import cudnn_ctc, dispatch
from .runtime import register_build, resolve, to_host

__all__ = list(twin.__all__)

LOSS_SOURCE = Path(__file__).with_name('ctc.cu')
DECODE_SOURCE = Path(__file__).with_name('ctc_decode.cu')
# Tile constants: #defines of the .cu files and the grids below (one place).
CTC_THREADS = 256            # a block per sample; threads stride over label states / classes
CTC_DECODE_THREADS = 256     # a block per sample for both decoders
MAX_LSE_BLOCKS = 65535       # ctc_frame_lse: a warp per frame, grid-stride beyond this
ELEMENT_TYPES = {np.dtype(np.float16): '__half', np.dtype(np.float32): 'float', np.dtype(np.float64): 'double'}


def loss_defines(dtype):
    return {'ELEMENT_T': ELEMENT_TYPES[np.dtype(dtype)], 'ACC_T': ELEMENT_TYPES[accumulate_dtype(dtype)],
            'CTC_THREADS': CTC_THREADS}


def decode_defines(dtype):
    return {'ELEMENT_T': ELEMENT_TYPES[np.dtype(dtype)], 'ACC_T': ELEMENT_TYPES[accumulate_dtype(dtype)],
            'CTC_DECODE_THREADS': CTC_DECODE_THREADS}


# Every variant builds without spills (CTC_MIN_BLOCKS in ctc.cu says what that needs).
for _dtype in ELEMENT_TYPES:
    register_build(LOSS_SOURCE, loss_defines(_dtype), ['ctc_frame_lse', 'ctc_alpha', 'ctc_beta_grad'])
    register_build(DECODE_SOURCE, decode_defines(_dtype), ['ctc_greedy_decode', 'ctc_beam_search'])


# ---------------------------------------------------------------- checks (before any launch)

def _host(value):
    """A NumPy view or copy of a NumPy / CuPy array or array-like (for validation)."""
    if hasattr(value, 'get') and not isinstance(value, np.ndarray):
        return value.get()
    return np.asarray(value)


def _stand_in(rt, fn, name, value):
    """(device array, zero-stride host stand-in of its shape and dtype for the twin's checks)."""
    array = value if isinstance(value, rt.xp.ndarray) else rt.xp.asarray(value)
    if array.dtype.kind == 'f' and array.dtype not in ELEMENT_TYPES:
        raise TypeError('%s: %s must be a float16, float32 or float64 array, got dtype %s'
                        % (fn, name, array.dtype))
    return array, np.broadcast_to(np.zeros((), dtype=array.dtype), array.shape)


def _device_ints(rt, host):
    """int64 host data on the device; a 1-element dummy for empty arrays (never read)."""
    host = np.ascontiguousarray(host, dtype=np.int64)
    return rt.xp.asarray(host if host.size else np.zeros(1, np.int64))


def _checked_loss_inputs(fn, rt, logits, labels, input_lengths, label_lengths, blank):
    logits, stand_in = _stand_in(rt, fn, 'logits', logits)
    _, labels, input_lengths, label_lengths, blank = ctc_checks.check_loss_inputs(
        fn, stand_in, to_host(rt, labels), to_host(rt, input_lengths), to_host(rt, label_lengths), blank)
    return rt.xp.ascontiguousarray(logits), labels, input_lengths, label_lengths, blank


def _frame_lse(rt, logits):
    batch, steps, classes = logits.shape
    frames = batch * steps
    lse = rt.xp.empty(frames, dtype=accumulate_dtype(logits.dtype))
    blocks = max(1, min(-(-frames // (CTC_THREADS // 32)), MAX_LSE_BLOCKS))
    rt.load(LOSS_SOURCE, loss_defines(logits.dtype)).kernel('ctc_frame_lse').launch(
        blocks, CTC_THREADS, (logits, lse, np.int64(frames), np.int64(classes)))
    return lse


# ---------------------------------------------------------------- loss

def _family_choice(rt, gpuk_fn, cudnn_fn, logits, labels, *rest):
    """gpuk_fn(rt, ...) or, on the CUDA runtime when the 'ctc' family picks it, cudnn_fn(...).

    The forward and the backward of one problem share a dispatch key, so under 'auto'
    both run the implementation timed fastest on the forward."""
    if rt.kind != 'cuda':
        return gpuk_fn(rt, logits, labels, *rest)
    key = (logits.shape, logits.dtype.name, labels.shape)
    return dispatch.run('ctc', key, lambda *args: gpuk_fn(rt, *args), cudnn_fn, logits, labels, *rest)


def ctc_loss_fwd(logits, labels, input_lengths, label_lengths, blank=None, *, runtime=None):
    """CTC negative log-likelihood of each label given softmax(logits).

    # Returns
        (loss, log_alpha): loss (N,) (inf where no alignment exists); log_alpha
        (N, T, 2 Lmax + 1), -inf past each input length and label length. float16
        logits give a float16 loss and a float32 log_alpha.
    """
    fn, rt = 'ctc_loss_fwd', resolve(runtime)
    logits, labels, input_lengths, label_lengths, blank = _checked_loss_inputs(
        fn, rt, logits, labels, input_lengths, label_lengths, blank)
    return _family_choice(rt, _ctc_loss_fwd_gpuk, cudnn_ctc.ctc_loss_fwd, logits, labels, input_lengths,
                          label_lengths, blank)


def _ctc_loss_fwd_gpuk(rt, logits, labels, input_lengths, label_lengths, blank):
    batch, steps, classes = logits.shape
    width = labels.shape[1]
    acc = accumulate_dtype(logits.dtype)
    log_alpha = rt.xp.empty((batch, steps, 2 * width + 1), dtype=acc)
    if steps == 0 or batch == 0:
        loss = np.where(label_lengths == 0, 0.0, np.inf).astype(logits.dtype)
        return rt.xp.asarray(loss), log_alpha
    loss = rt.xp.empty(batch, dtype=logits.dtype)
    lse = _frame_lse(rt, logits)
    rt.load(LOSS_SOURCE, loss_defines(logits.dtype)).kernel('ctc_alpha').launch(
        batch, CTC_THREADS,
        (logits, lse, _device_ints(rt, labels), _device_ints(rt, input_lengths), _device_ints(rt, label_lengths),
         log_alpha, loss, np.int64(steps), np.int64(classes), np.int64(width), np.int64(blank)))
    return loss, log_alpha


def _row_floats(fn, rt, name, value, shape, acc):
    array, stand_in = _stand_in(rt, fn, name, value)
    ctc_checks.float_array(fn, name, stand_in)
    if array.shape != shape:
        raise ValueError('%s: %s must have shape (%d,), got %s' % (fn, name, shape[0], array.shape))
    return rt.xp.ascontiguousarray(array.astype(acc, copy=False))


def ctc_loss_bwd(logits, labels, input_lengths, label_lengths, log_alpha, loss, dloss, blank=None, *,
                 runtime=None):
    """Gradient of ctc_loss_fwd's loss with respect to the logits (log-softmax folded in);
    zero past each input length and for impossible labels."""
    fn, rt = 'ctc_loss_bwd', resolve(runtime)
    logits, labels, input_lengths, label_lengths, blank = _checked_loss_inputs(
        fn, rt, logits, labels, input_lengths, label_lengths, blank)
    batch, steps, _ = logits.shape
    states = 2 * labels.shape[1] + 1
    acc = accumulate_dtype(logits.dtype)
    log_alpha, stand_in = _stand_in(rt, fn, 'log_alpha', log_alpha)
    ctc_checks.float_array(fn, 'log_alpha', stand_in)
    if log_alpha.shape != (batch, steps, states):
        raise ValueError('%s: log_alpha must have shape %s (batch, time, 2 * labels width + 1), got %s'
                         % (fn, (batch, steps, states), log_alpha.shape))
    loss = _row_floats(fn, rt, 'loss', loss, (batch,), acc)
    dloss = _row_floats(fn, rt, 'dloss', dloss, (batch,), acc)
    return _family_choice(rt, _ctc_loss_bwd_gpuk, cudnn_ctc.ctc_loss_bwd, logits, labels, input_lengths,
                          label_lengths, log_alpha, loss, dloss, blank)


def _ctc_loss_bwd_gpuk(rt, logits, labels, input_lengths, label_lengths, log_alpha, loss, dloss, blank):
    batch, steps, classes = logits.shape
    width = labels.shape[1]
    states = 2 * width + 1
    acc = accumulate_dtype(logits.dtype)
    dlogits = rt.xp.empty(logits.shape, dtype=logits.dtype)
    if steps == 0 or batch == 0:
        return dlogits
    lse = _frame_lse(rt, logits)
    beta = rt.xp.empty(batch * 2 * states, dtype=acc)
    occupation = rt.xp.empty(batch * states, dtype=acc)
    chain = rt.xp.empty(max(batch * 2 * width, 1), dtype=np.int64)
    rt.load(LOSS_SOURCE, loss_defines(logits.dtype)).kernel('ctc_beta_grad').launch(
        batch, CTC_THREADS,
        (logits, lse, _device_ints(rt, labels), _device_ints(rt, input_lengths), _device_ints(rt, label_lengths),
         rt.xp.ascontiguousarray(log_alpha.astype(acc, copy=False)), loss, dloss, beta, occupation, chain,
         dlogits, np.int64(steps), np.int64(classes), np.int64(width), np.int64(blank)))
    return dlogits


# ---------------------------------------------------------------- decoders

def _checked_decode_inputs(fn, rt, log_probs, input_lengths, blank):
    log_probs, stand_in = _stand_in(rt, fn, 'log_probs', log_probs)
    _, input_lengths, blank = ctc_checks.check_decode_inputs(fn, stand_in, to_host(rt, input_lengths), blank)
    return rt.xp.ascontiguousarray(log_probs), input_lengths, blank


def ctc_greedy_decode(log_probs, input_lengths, blank=None, merge_repeated=True, *, runtime=None):
    """Best path: argmax per frame within input_length, merge repeats, drop blanks.

    # Returns
        (decoded, neg_sum_logits): decoded (N, T) int64 padded with -1;
        neg_sum_logits (N, 1), minus the sum over frames of the largest log_prob.
    """
    fn, rt = 'ctc_greedy_decode', resolve(runtime)
    log_probs, input_lengths, blank = _checked_decode_inputs(fn, rt, log_probs, input_lengths, blank)
    batch, steps, classes = log_probs.shape
    decoded = rt.xp.empty((batch, steps), dtype=np.int64)
    neg_sum = rt.xp.zeros((batch, 1), dtype=log_probs.dtype)
    if steps == 0 or batch == 0:
        return decoded, neg_sum
    rt.load(DECODE_SOURCE, decode_defines(log_probs.dtype)).kernel('ctc_greedy_decode').launch(
        batch, CTC_DECODE_THREADS,
        (log_probs, _device_ints(rt, input_lengths), decoded, neg_sum, np.int64(steps), np.int64(classes),
         np.int64(blank), np.int32(bool(merge_repeated))))
    return decoded, neg_sum


def ctc_beam_search_decode(log_probs, input_lengths, beam_width=100, top_paths=1, blank=None,
                           merge_repeated=False, *, runtime=None):
    """CTC prefix beam search (TensorFlow's ctc_beam_search_decoder), on the GPU.

    # Returns
        (paths, log_probs): a list of top_paths arrays (N, T) int64 padded with -1, best
        first; log_probs (N, top_paths) (-inf with an empty path when fewer prefixes exist).
    """
    fn, rt = 'ctc_beam_search_decode', resolve(runtime)
    log_probs, input_lengths, blank = _checked_decode_inputs(fn, rt, log_probs, input_lengths, blank)
    width = ctc_checks.positive_int(fn, 'beam_width', beam_width)
    top_paths = ctc_checks.positive_int(fn, 'top_paths', top_paths, width)
    batch, steps, classes = log_probs.shape
    xp, acc = rt.xp, accumulate_dtype(log_probs.dtype)
    if steps == 0 or batch == 0:
        scores = np.full((batch, top_paths), -np.inf)
        scores[:, 0] = 0.0
        empty = xp.empty((batch, steps), dtype=np.int64)
        return [empty.copy() for _ in range(top_paths)], xp.asarray(scores.astype(log_probs.dtype))
    candidates = width * classes
    paths = xp.empty((batch, top_paths, steps), dtype=np.int64)
    scores = xp.empty((batch, top_paths), dtype=log_probs.dtype)
    scratch = (xp.empty(batch * 4 * width, dtype=acc), xp.empty(batch * 4 * width, dtype=np.int64),
               xp.empty(batch * 2 * width, dtype=np.int32), xp.empty(batch * width, dtype=np.int32),
               xp.empty(batch * candidates, dtype=acc), xp.empty(batch * candidates, dtype=np.int32),
               xp.empty(batch * width, dtype=np.int32), xp.empty(batch * steps * width, dtype=np.int32),
               xp.empty(batch * steps * width, dtype=np.int32))
    rt.load(DECODE_SOURCE, decode_defines(log_probs.dtype)).kernel('ctc_beam_search').launch(
        batch, CTC_DECODE_THREADS,
        (log_probs, _device_ints(rt, input_lengths)) + scratch +
        (paths, scores, np.int64(steps), np.int64(classes), np.int64(width), np.int64(top_paths),
         np.int64(blank), np.int32(bool(merge_repeated))))
    return [xp.ascontiguousarray(paths[:, k]) for k in range(top_paths)], scores


# ---------------------------------------------------------------- Theano backend helpers (host)

def _to_xp(rt, value):
    return rt.xp.asarray(value) if isinstance(value, np.ndarray) else value


def ctc_interleave_blanks(Y, *, runtime=None):
    """[y1, y2, ...] -> [-1, y1, -1, y2, ..., -1] (the twin on a host copy)."""
    return _to_xp(resolve(runtime), twin.ctc_interleave_blanks(_host(Y)))


def ctc_create_skip_idxs(Y, *, runtime=None):
    """Odd positions i of the interleaved Y whose label differs from Y[i + 2] (the twin)."""
    return _to_xp(resolve(runtime), twin.ctc_create_skip_idxs(_host(Y)))


def ctc_update_log_p(skip_idxs, zeros, active, log_p_curr, log_p_prev, *, runtime=None):
    """One step of the Theano-backend recursion (the twin on host copies)."""
    rt = resolve(runtime)
    active_next, log_p_next = twin.ctc_update_log_p(_host(skip_idxs), _host(zeros), active, _host(log_p_curr),
                                                    _host(log_p_prev))
    return active_next, _to_xp(rt, log_p_next)


def ctc_path_probs(predict, Y, alpha=1e-4, *, runtime=None):
    """Theano ctc_path_probs: (log_probs, mask) (the twin on host copies)."""
    rt = resolve(runtime)
    log_probs, mask = twin.ctc_path_probs(_host(predict), _host(Y), alpha)
    return _to_xp(rt, log_probs), _to_xp(rt, mask)


def ctc_cost(predict, Y, *, runtime=None):
    """Theano ctc_cost: -log of the summed path probabilities (the twin on host copies)."""
    resolve(runtime)
    return twin.ctc_cost(_host(predict), _host(Y))
