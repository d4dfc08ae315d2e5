"""Launchers for ctc.cu (loss, gradient) and ctc_decode.cu (greedy and beam-search decoding).

Same names, signatures, output dtypes and errors as gpuk/cpu_fallback/ctc.py, plus a
keyword-only `runtime` (None: runtime.current(); 'cuda', 'emulate', or a runtime object).
Shapes and dtypes are checked before any launch, by the checks the twin uses too
(contracts/ctc_checks.py) run on zero-stride stand-ins; the values of the small integer
inputs (labels, lengths) are checked on the device, without a host sync, and a bad one is
raised where the results are read (runtime/deferred.py), with the twin's very message.

Kernels (ctc.cu, warp-ctc style): ctc_emissions (a warp per frame) computes each frame's
log-sum-exp (a forward output, read again by the backward) and gathers the states'
emissions in parallel; ctc_alpha and ctc_beta_occupation run one block per sample with
threads across the 2 Lmax + 1 label states, the previous step in shared memory, one
barrier per step; ctc_grad (a warp per frame) writes the gradient.
ctc_greedy_decode and ctc_beam_search run one block per sample. ctc_check_loss_values
(ctc_check.cu, one block) checks and converts the labels and lengths of Keras's
ctc_batch_cost in one launch: the graph op's value check. See the .cu files.

ctc_loss_fwd_runner and ctc_loss_bwd_runner are the loss and its gradient checked and set up
once per problem, whose ``specialized`` variants (the ones the graph ops' plan steps keep) write
the outputs and the backward's work arrays into the step's reused buffers (runtime/prepared.py).

On the CUDA runtime the loss and its gradient run the 'ctc' family's choice
(``GPUK_KERNELS=ctc=gpuk|cudnn|auto``): these kernels or cudnnCTCLoss
(gpuk/kernels/cudnn/ctc.py), which falls back here, saying so once, outside its limits.

The Theano-backend helpers (ctc_interleave_blanks, ctc_create_skip_idxs,
ctc_update_log_p, ctc_path_probs, ctc_cost) are tiny index helpers over one label: they
delegate to the NumPy twin on host copies and return arrays of the runtime's xp.
"""
import functools
import math
import weakref
from pathlib import Path
from types import MappingProxyType

import numpy as np

from gpuk.cpu_fallback import ctc as twin
from gpuk.contracts import ctc_checks
from gpuk.contracts.dtypes import ELEMENT_TYPES, FLOAT_DTYPES_NO_BFLOAT16, accumulation_dtype
from . import dispatch
from .cudnn import ctc as cudnn_ctc
from .runtime import deferred, prepared, register_build, resolve, to_host

__all__ = list(twin.__all__)

# The keywords of a caller that has queued the check of the labels' and lengths' values itself
# (the graph ops, naming the K function: ops/ctc.py), for the loss, gradient and decoder
# launchers, which then queue no second one. The twin's mapping is empty: it has no such switch.
VALUES_CHECKED_KEYWORDS = MappingProxyType({'values_checked': True})

LOSS_SOURCE = Path(__file__).with_name('ctc.cu')
DECODE_SOURCE = Path(__file__).with_name('ctc_decode.cu')
CHECK_SOURCE = Path(__file__).with_name('ctc_check.cu')
# Tile constants: #defines of the .cu files and the grids below (one place).
CTC_THREADS = 256            # a block per sample; threads stride over label states / classes
CTC_SHARED_STATES = 2049     # extended labels up to this many states keep alpha / beta in shared memory
CTC_DECODE_THREADS = 256     # a block per sample for both decoders
BEAM_SHARED_CLASSES = 2048   # beam search: frames up to this many classes are cached in shared memory
BEAM_PITCH_ELEMENTS = 8      # beam search: per-sample scratch arrays padded to start on a sector
MAX_FRAME_BLOCKS = 65535     # ctc_emissions, ctc_grad: a warp per frame, grid-stride beyond this
CTC_STAGE_BYTES = 48 * 1024  # ctc_emissions / ctc_grad stage a row per warp in shared memory up to this
SECTOR_BYTES = 32            # state rows (log_alpha, the backward's work) start on a sector
CTC_CHECK_THREADS = 256      # ctc_check_inputs: one block, a warp per sample, then threads over the labels
# ctc_check.cu's CheckType codes: the element type of each raw labels / lengths array
CHECK_TYPE_CODES = {np.dtype(t): np.int32(code) for code, t in enumerate(
    (np.int8, np.int16, np.int32, np.int64, np.uint8, np.uint16, np.uint32, np.uint64, np.float16, np.float32,
     np.float64))}
CHECK_DEFINES = {'CTC_CHECK_THREADS': CTC_CHECK_THREADS}


def loss_defines(dtype):
    return {'ELEMENT_T': ELEMENT_TYPES[np.dtype(dtype)], 'ACC_T': ELEMENT_TYPES[accumulation_dtype(dtype)],
            'CTC_THREADS': CTC_THREADS, 'CTC_SHARED_STATES': CTC_SHARED_STATES}


def decode_defines(dtype):
    return {'ELEMENT_T': ELEMENT_TYPES[np.dtype(dtype)], 'ACC_T': ELEMENT_TYPES[accumulation_dtype(dtype)],
            'CTC_DECODE_THREADS': CTC_DECODE_THREADS, 'BEAM_SHARED_CLASSES': BEAM_SHARED_CLASSES,
            'BEAM_PITCH_ELEMENTS': BEAM_PITCH_ELEMENTS}


def beam_pitch(count):
    """ctc_decode.cu's beam_pitch: count rounded up to BEAM_PITCH_ELEMENTS."""
    return -(-count // BEAM_PITCH_ELEMENTS) * BEAM_PITCH_ELEMENTS


# Every variant builds without spills (CTC_MIN_BLOCKS in ctc.cu says what that needs).
for _dtype in FLOAT_DTYPES_NO_BFLOAT16:
    register_build(LOSS_SOURCE, loss_defines(_dtype), ['ctc_emissions', 'ctc_alpha', 'ctc_label_map',
                                                        'ctc_beta_occupation', 'ctc_grad'])
    register_build(DECODE_SOURCE, decode_defines(_dtype), ['ctc_greedy_decode', 'ctc_beam_search'])
register_build(CHECK_SOURCE, CHECK_DEFINES, ['ctc_check_inputs'])


# ---------------------------------------------------------------- checks (before any launch)

def _host(value):
    """A NumPy view or copy of a NumPy / CuPy array or array-like (for validation)."""
    if hasattr(value, 'get') and not isinstance(value, np.ndarray):
        return value.get()
    return np.asarray(value)


def _device_float_and_stand_in(rt, fn, name, value):
    """(``value`` as a device array of a float dtype the kernels take, ctc_checks.stand_in of it
    for the twin's checks)."""
    array = value if isinstance(value, rt.xp.ndarray) else rt.xp.asarray(value)
    if array.dtype.kind == 'f' and array.dtype not in FLOAT_DTYPES_NO_BFLOAT16:
        raise TypeError('%s: %s must be a float16, float32 or float64 array, got dtype %s'
                        % (fn, name, array.dtype))
    return array, ctc_checks.stand_in(array)


def _small_ints(rt, value):
    """A labels / lengths argument as an array of rt.xp (no copy when it already is one)."""
    return value if isinstance(value, rt.xp.ndarray) else rt.xp.asarray(value)


def _device_ints(rt, array):
    """int64 contiguous data on the device; a 1-element dummy for empty arrays (never read)."""
    array = rt.xp.ascontiguousarray(array.astype(np.int64, copy=False))
    return array if array.size else rt.xp.zeros(1, np.int64)


def _checked_loss_inputs(fn, rt, logits, labels, input_lengths, label_lengths, blank, values_checked,
                         more_checks=None, more_arrays=()):
    """Shapes and dtypes checked once per problem signature (runtime/prepared.py; with
    `more_checks(logits, labels)` on the other arguments, ``more_arrays``, which join the
    signature); values (lengths in range, labels in [0, A) without the blank) checked on the
    device on every call and raised later (runtime/deferred.py) with the twin's message, unless
    ``values_checked`` (the caller queued that check itself). The
    kernels clamp every data-dependent index meanwhile. Returns the arrays, the checked blank
    and the problem's kernel launches (prepared.Launches)."""
    def prepare():
        checked, stand_in = _device_float_and_stand_in(rt, fn, 'logits', logits)
        ints = [_small_ints(rt, v) for v in (labels, input_lengths, label_lengths)]
        checked_blank = ctc_checks.check_loss_inputs(fn, stand_in, *map(ctc_checks.stand_in, ints), blank)[4]
        if more_checks is not None:
            more_checks(checked, ints[0])
        return checked_blank, prepared.Launches(rt, LOSS_SOURCE, loss_defines(checked.dtype))

    blank, launches = prepared.get(rt, fn, (logits, labels, input_lengths, label_lengths) + tuple(more_arrays),
                                   (blank,), prepare)
    return _loss_arrays(fn, rt, logits, labels, input_lengths, label_lengths, blank, values_checked) + (blank, launches)


def _loss_arrays(fn, rt, logits, labels, input_lengths, label_lengths, blank, values_checked):
    """The per-call part of _checked_loss_inputs: the arrays as the kernels take them (contiguous
    logits, int64 labels and lengths: no copy where they already are) and, unless
    ``values_checked``, the values' deferred check."""
    logits = logits if isinstance(logits, rt.xp.ndarray) else rt.xp.asarray(logits)
    labels, input_lengths, label_lengths = (_small_ints(rt, v) for v in (labels, input_lengths, label_lengths))
    steps, classes = logits.shape[1:]
    if (labels.size or input_lengths.size) and not values_checked:
        deferred.defer(rt, ctc_checks.loss_values_flag(rt.xp, labels, input_lengths, label_lengths, steps, classes,
                                                       blank),
                       lambda: ctc_checks.check_loss_inputs(
                           fn, _device_float_and_stand_in(rt, fn, 'logits', logits)[1], to_host(rt, labels),
                           to_host(rt, input_lengths), to_host(rt, label_lengths), blank))
    as_int64 = lambda v: rt.xp.ascontiguousarray(v.astype(np.int64, copy=False))   # noqa: E731
    return rt.xp.ascontiguousarray(logits), as_int64(labels), as_int64(input_lengths), as_int64(label_lengths)


# ---------------------------------------------------------------- the loss inputs' values (Keras)

def ctc_check_loss_values(labels, input_lengths, label_lengths, steps, classes, *, runtime=None):
    """The twin's ctc_check_loss_values in one launch (ctc_check.cu's ctc_check_inputs), no host
    sync: the int64 labels and lengths and the flag are views of one new int64 buffer (the flag
    its last element, so each call's flag lives as long as the pending check that holds it)."""
    fn, rt = 'ctc_check_loss_values', resolve(runtime)
    raw = [rt.xp.ascontiguousarray(_small_ints(rt, v)) for v in (labels, input_lengths, label_lengths)]

    def prepare():   # the checks, type codes and scalar arguments: per signature (steps, classes in it)
        ctc_checks.check_value_arrays(fn, *raw)
        batch, width = raw[0].shape
        return (prepared.Launches(rt, CHECK_SOURCE, CHECK_DEFINES), [CHECK_TYPE_CODES[a.dtype] for a in raw],
                batch, width, (np.int64(batch), np.int64(width), np.int64(steps), np.int64(classes)))

    launches, codes, batch, width, sizes = prepared.get(rt, fn, raw, (steps, classes), prepare)
    count = batch * width
    packed = rt.xp.empty(count + 2 * batch + 1, dtype=np.int64)
    labels_out = packed[:count].reshape(batch, width)
    input_lengths_out, label_lengths_out, bad = packed[count:count + batch], packed[count + batch:-1], packed[-1:]
    launches('ctc_check_inputs', 1, CTC_CHECK_THREADS,
             (raw[0], codes[0], raw[1], codes[1], raw[2], codes[2], labels_out, input_lengths_out, label_lengths_out,
              bad) + sizes)
    return labels_out, input_lengths_out, label_lengths_out, bad.reshape(())


# ---------------------------------------------------------------- loss

def _family_choice(rt, gpuk_fn, cudnn_fn, logits, labels, *rest):
    """gpuk_fn(...) or, on the CUDA runtime when the 'ctc' family picks it, cudnn_fn(...).

    The forward and the backward of one problem share a dispatch key, so under 'auto'
    both run the implementation timed fastest on the forward."""
    key = (logits.shape, logits.dtype, labels.shape)
    return dispatch.run(rt, 'ctc', key, gpuk_fn, cudnn_fn, logits, labels, *rest)


def ctc_loss_fwd(logits, labels, input_lengths, label_lengths, blank=None, *, runtime=None, values_checked=False):
    """CTC negative log-likelihood of each label given softmax(logits).
    ``values_checked=True``: the caller has queued the device-side check of the labels' and
    lengths' values itself (the graph op does, naming the K function), so none is queued here.

    # Returns
        (loss, log_alpha, frame_lse): loss (N,) (inf where no alignment exists); log_alpha
        (N, T, 2 Lmax + 1), -inf past each input length and label length; frame_lse (N, T),
        the log-sum-exp of each frame's logits, which the backward reads instead of
        recomputing it. float16 logits give a float16 loss and float32 by-products.
    """
    fn, rt = 'ctc_loss_fwd', resolve(runtime)
    logits, labels, input_lengths, label_lengths, blank, launches = _checked_loss_inputs(
        fn, rt, logits, labels, input_lengths, label_lengths, blank, values_checked)
    return _family_choice(rt, functools.partial(_ctc_loss_fwd_gpuk, rt, launches), cudnn_ctc.ctc_loss_fwd, logits,
                          labels, input_lengths, label_lengths, blank)


def ctc_loss_fwd_runner(logits, labels, input_lengths, label_lengths, blank=None, *, runtime=None,
                        values_checked=False):
    """``run(logits, labels, input_lengths, label_lengths)``: ctc_loss_fwd with this blank for
    arguments of the types, shapes and dtypes of these, checked and set up once (the checks run
    here, raising the user's error); the values are checked per call as ctc_loss_fwd does (unless
    ``values_checked``). Its ``specialized`` variant (the one a CtcLoss plan step keeps:
    prepared.Kept) writes the loss, log_alpha's padded rows and frame_lse into the step's reused
    buffers (prepared.with_step_buffers); log_alpha is a view of those rows, and the rows are
    written again only when nothing holds the view (StepBuffers' rule), so the backward still
    reads them without a copy. cudnnCTCLoss, where the 'ctc' family picks it, makes its own."""
    fn, rt = 'ctc_loss_fwd', resolve(runtime)
    logits, labels, _, _, blank, launches = _checked_loss_inputs(
        fn, rt, logits, labels, input_lengths, label_lengths, blank, True)
    batch, steps, _ = logits.shape
    acc = accumulation_dtype(logits.dtype)
    outputs = prepared.Outputs(rt.xp.empty, [(batch,), (batch, steps, state_pitch(2 * labels.shape[1] + 1, acc)),
                                             (batch, steps)], [logits.dtype, acc, acc])

    def run_with(make_outputs):
        gpuk_fn = functools.partial(_ctc_loss_fwd_gpuk, rt, launches, make_outputs=make_outputs)

        def run(logits, labels, input_lengths, label_lengths):
            arrays = _loss_arrays(fn, rt, logits, labels, input_lengths, label_lengths, blank, values_checked)
            return _family_choice(rt, gpuk_fn, cudnn_ctc.ctc_loss_fwd, *arrays, blank)
        return run
    return prepared.with_step_buffers(run_with, outputs)


def state_pitch(states, dtype):
    """The row pitch (elements) of the (N, T, S) state arrays: S rounded up to a 32-byte sector,
    so that every row starts on a sector (ctc.cu's header); ctc_label_map's int32 rows too."""
    per_sector = SECTOR_BYTES // np.dtype(dtype).itemsize
    return -(-states // per_sector) * per_sector


# ctc_loss_fwd's log_alpha views -> their padded buffers, while the view lives (the backward
# then reads the buffer without a copy). Keyed by id with a weak reference: arrays are unhashable.
_PADDED_BUFFERS = {}


def _state_rows(rt, batch, steps, states, acc):
    """(padded (N, T, P) buffer, its (N, T, S) view)."""
    padded = rt.xp.empty((batch, steps, state_pitch(states, acc)), dtype=acc)
    return padded, _state_view(padded, states)


def _state_view(padded, states):
    """The (N, T, S) view of a padded (N, T, P) state buffer, registered so that the backward
    finds the buffer under it (_padded_rows)."""
    view = padded[:, :, :states]
    key = id(view)
    try:
        _PADDED_BUFFERS[key] = (weakref.ref(view, lambda _, k=key: _PADDED_BUFFERS.pop(k, None)), padded)
    except TypeError:   # an array type without weak references: the backward copies instead
        pass
    return view


def _padded_rows(rt, view, acc):
    """The (N, T, P) buffer under a state array: the one `view` was sliced from when it is
    ctc_loss_fwd's log_alpha (no copy), else a padded copy of it."""
    entry = _PADDED_BUFFERS.get(id(view))
    if entry is not None and entry[0]() is view and entry[1].dtype == np.dtype(acc):
        return entry[1]
    padded, inner = _state_rows(rt, *view.shape, acc)
    inner[...] = view
    return padded


def _stage(per_warp_bytes):
    """(stage flag, dynamic shared bytes): `per_warp_bytes` of rows per warp, if they fit."""
    nbytes = (CTC_THREADS // 32) * per_warp_bytes
    return (1, nbytes) if nbytes <= CTC_STAGE_BYTES else (0, 0)


def _frame_blocks(frames):
    """ctc_emissions and ctc_grad: a warp per frame, grid-stride beyond MAX_FRAME_BLOCKS."""
    return max(1, min(-(-frames // (CTC_THREADS // 32)), MAX_FRAME_BLOCKS))


def _emissions(rt, launches, logits, labels, input_lengths, label_lengths, frame_lse, out, blank, compute_lse):
    """ctc_emissions: out (N, T, P) <- each state's log-probability per frame; frame_lse
    written (compute_lse) or read."""
    batch, steps, classes = logits.shape
    stage, shared = _stage(classes * out.dtype.itemsize)
    launches(
        'ctc_emissions', _frame_blocks(batch * steps), CTC_THREADS,
        (logits, _device_ints(rt, labels), _device_ints(rt, input_lengths), _device_ints(rt, label_lengths),
         frame_lse, out, np.int64(batch), np.int64(steps), np.int64(classes), np.int64(labels.shape[1]),
         np.int64(out.shape[2]), np.int64(blank), np.int32(compute_lse), np.int32(stage)), shared_mem=shared)


def _ctc_loss_fwd_gpuk(rt, launches, logits, labels, input_lengths, label_lengths, blank, make_outputs=None):
    """``make_outputs()``: (loss, log_alpha's padded rows, frame_lse) to write (a runner's step
    buffers); None: new ones."""
    batch, steps, classes = logits.shape
    width = labels.shape[1]
    acc = accumulation_dtype(logits.dtype)
    if make_outputs is None:
        loss = rt.xp.empty(batch, dtype=logits.dtype)
        padded, log_alpha = _state_rows(rt, batch, steps, 2 * width + 1, acc)
        frame_lse = rt.xp.empty((batch, steps), dtype=acc)
    else:
        loss, padded, frame_lse = make_outputs()
        log_alpha = _state_view(padded, 2 * width + 1)
    if steps == 0 or batch == 0:
        return rt.xp.where(label_lengths == 0, 0.0, np.inf).astype(logits.dtype), log_alpha, frame_lse
    _emissions(rt, launches, logits, labels, input_lengths, label_lengths, frame_lse, padded, blank, 1)
    launches(
        'ctc_alpha', batch, CTC_THREADS,
        (_device_ints(rt, labels), _device_ints(rt, input_lengths), _device_ints(rt, label_lengths),
         padded, loss, np.int64(steps), np.int64(classes), np.int64(width), np.int64(padded.shape[2]),
         np.int64(blank)))
    return loss, log_alpha, frame_lse


def _float_by_product(fn, rt, name, value, shape, acc, meaning):
    array, stand_in = _device_float_and_stand_in(rt, fn, name, value)
    ctc_checks.float_array(fn, name, stand_in)
    if array.shape != shape:
        raise ValueError('%s: %s must have shape %s (%s), got %s' % (fn, name, shape, meaning, array.shape))
    return array.astype(acc, copy=False)   # the launchers lay it out (contiguous or padded rows)


def _row_floats(fn, rt, name, value, shape, acc):
    array, stand_in = _device_float_and_stand_in(rt, fn, name, value)
    ctc_checks.float_array(fn, name, stand_in)
    if array.shape != shape:
        raise ValueError('%s: %s must have shape (%d,), got %s' % (fn, name, shape[0], array.shape))
    return rt.xp.ascontiguousarray(array.astype(acc, copy=False))


def ctc_loss_bwd(logits, labels, input_lengths, label_lengths, log_alpha, frame_lse, loss, dloss, blank=None, *,
                 runtime=None, values_checked=False):
    """Gradient of ctc_loss_fwd's loss with respect to the logits (log-softmax folded in);
    zero past each input length and for impossible labels. log_alpha, frame_lse and loss are
    ctc_loss_fwd's outputs. ``values_checked``: as ctc_loss_fwd's."""
    fn, rt = 'ctc_loss_bwd', resolve(runtime)
    by = (log_alpha, frame_lse, loss, dloss)
    logits, labels, input_lengths, label_lengths, blank, launches = _checked_loss_inputs(
        fn, rt, logits, labels, input_lengths, label_lengths, blank, values_checked, _by_products_check(fn, rt, *by),
        by)
    return _family_choice(rt, functools.partial(_ctc_loss_bwd_gpuk, rt, launches), cudnn_ctc.ctc_loss_bwd, logits,
                          labels, input_lengths, label_lengths, *_by_product_arrays(rt, logits.dtype, *by), blank)


def _by_products_check(fn, rt, log_alpha, frame_lse, loss, dloss):
    """ctc_loss_bwd's checks of ctc_loss_fwd's outputs and dloss (with the other checks, once per
    problem signature)."""
    def check_by_products(logits, labels):
        batch, steps, _ = logits.shape
        states = 2 * labels.shape[1] + 1
        acc = accumulation_dtype(logits.dtype)
        _float_by_product(fn, rt, 'log_alpha', log_alpha, (batch, steps, states), acc,
                          'batch, time, 2 * labels width + 1')
        _float_by_product(fn, rt, 'frame_lse', frame_lse, (batch, steps), acc, 'batch, time')
        _row_floats(fn, rt, 'loss', loss, (batch,), acc)
        _row_floats(fn, rt, 'dloss', dloss, (batch,), acc)
    return check_by_products


def _by_product_arrays(rt, dtype, log_alpha, frame_lse, loss, dloss):
    """The by-products as the kernels take them: the accumulation dtype, all but log_alpha
    contiguous (its rows are laid out by _padded_rows)."""
    acc, xp = accumulation_dtype(dtype), rt.xp
    as_acc = lambda v: (v if isinstance(v, xp.ndarray) else xp.asarray(v)).astype(acc, copy=False)   # noqa: E731
    return (as_acc(log_alpha),) + tuple(xp.ascontiguousarray(as_acc(v)) for v in (frame_lse, loss, dloss))


def ctc_loss_bwd_runner(logits, labels, input_lengths, label_lengths, log_alpha, frame_lse, loss, dloss, blank=None,
                        *, runtime=None, values_checked=False):
    """``run(logits, labels, input_lengths, label_lengths, log_alpha, frame_lse, loss, dloss)``:
    ctc_loss_bwd for arguments of the types, shapes and dtypes of these, checked and set up once
    (as ctc_loss_fwd_runner). Its ``specialized`` variant (a CtcLossGrad plan step's) writes the
    gradient into the step's reused buffer and reuses its work arrays (the emissions, then
    occupations rows, the label maps, beta's rows when they do not fit in shared memory) from one
    call to the next, none of which outlives a call (prepared.with_step_buffers)."""
    fn, rt = 'ctc_loss_bwd', resolve(runtime)
    by = (log_alpha, frame_lse, loss, dloss)
    logits, labels, _, _, blank, launches = _checked_loss_inputs(
        fn, rt, logits, labels, input_lengths, label_lengths, blank, True, _by_products_check(fn, rt, *by), by)
    batch, steps, classes = logits.shape
    width = labels.shape[1]
    acc = accumulation_dtype(logits.dtype)
    shapes, dtypes = zip(*_bwd_buffers(batch, steps, classes, width, logits.dtype, acc))
    outputs = prepared.Outputs(rt.xp.empty, [logits.shape] + list(shapes), [logits.dtype] + list(dtypes))

    def run_with(make_outputs):
        gpuk_fn = functools.partial(_ctc_loss_bwd_gpuk, rt, launches, make_outputs=make_outputs)

        def run(logits, labels, input_lengths, label_lengths, log_alpha, frame_lse, loss, dloss):
            arrays = _loss_arrays(fn, rt, logits, labels, input_lengths, label_lengths, blank, values_checked)
            return _family_choice(rt, gpuk_fn, cudnn_ctc.ctc_loss_bwd, *arrays,
                                  *_by_product_arrays(rt, arrays[0].dtype, log_alpha, frame_lse, loss, dloss), blank)
        return run
    return prepared.with_step_buffers(run_with, outputs)


def _bwd_buffers(batch, steps, classes, width, dtype, acc):
    """(shape, dtype) of the backward's work arrays: the (N, T, P) emissions / occupations rows,
    first_of_class and next_same (int32 rows on sectors), beta's two rows per sample when they do
    not fit in shared memory (else a 1-element dummy)."""
    states = 2 * width + 1
    pitch = state_pitch(states, acc)
    class_pitch, label_pitch = (state_pitch(k, np.int32) for k in (classes, width))
    return (((batch, steps, pitch), acc), ((batch * class_pitch,), np.dtype(np.int32)),
            ((max(batch * label_pitch, 1),), np.dtype(np.int32)),
            ((batch * 2 * pitch if states > CTC_SHARED_STATES else 1,), acc))


def _ctc_loss_bwd_gpuk(rt, launches, logits, labels, input_lengths, label_lengths, log_alpha, frame_lse, loss, dloss,
                       blank, make_outputs=None):
    """``make_outputs()``: (dlogits, then the work arrays of _bwd_buffers) to write (a runner's
    step buffers); None: new ones."""
    batch, steps, classes = logits.shape
    width = labels.shape[1]
    acc = accumulation_dtype(logits.dtype)
    if make_outputs is None:
        dlogits = rt.xp.empty(logits.shape, dtype=logits.dtype)
    else:
        dlogits, *work_arrays = make_outputs()
    if steps == 0 or batch == 0:
        return dlogits
    if make_outputs is None:
        work_arrays = [rt.xp.empty(shape, dtype=dtype)
                       for shape, dtype in _bwd_buffers(batch, steps, classes, width, logits.dtype, acc)]
    # emissions, then occupations; first_of_class, next_same; beta's two rows (when they do not
    # live in shared memory, up to CTC_SHARED_STATES states)
    work, first_of_class, next_same, gamma = work_arrays
    ints = [_device_ints(rt, a) for a in (labels, input_lengths, label_lengths)]
    log_alpha = _padded_rows(rt, log_alpha, acc)
    pitch = work.shape[2]
    _emissions(rt, launches, logits, labels, input_lengths, label_lengths, frame_lse, work, blank, 0)
    class_pitch, label_pitch = (state_pitch(k, np.int32) for k in (classes, width))   # int32 rows on sectors too
    launches(
        'ctc_label_map', batch, CTC_THREADS,
        (ints[0], ints[2], first_of_class, next_same, np.int64(classes), np.int64(width), np.int64(class_pitch),
         np.int64(label_pitch), np.int64(blank)))
    launches(
        'ctc_beta_occupation', batch, CTC_THREADS,
        tuple(ints) + (log_alpha, loss, work, gamma, np.int64(steps), np.int64(classes), np.int64(width),
                       np.int64(pitch), np.int64(blank)))
    stage, shared = _stage(pitch * np.dtype(acc).itemsize + label_pitch * 4)   # occupation and next_same rows
    span = (CTC_THREADS // 32) * classes * logits.dtype.itemsize   # a block's logits rows (stage_rows)
    stage_rows = int(shared + span <= CTC_STAGE_BYTES)
    shared += span if stage_rows else 0
    launches(
        'ctc_grad', _frame_blocks(batch * steps), CTC_THREADS,
        (logits, frame_lse, ints[1], ints[2], work, first_of_class, next_same, loss, dloss, dlogits,
         np.int64(batch), np.int64(steps), np.int64(classes), np.int64(width), np.int64(pitch),
         np.int64(class_pitch), np.int64(label_pitch), np.int64(blank), np.int32(stage), np.int32(stage_rows)),
        shared_mem=shared)
    return dlogits


# ---------------------------------------------------------------- decoders

def _checked_decode_inputs(fn, rt, log_probs, input_lengths, blank, values_checked, more_checks=None, params=()):
    """Shapes, dtypes and the blank (and `more_checks()`, of ``params``) checked once per problem
    signature (runtime/prepared.py); the lengths' values on the device on every call (raised
    where the results are read, runtime/deferred.py) unless ``values_checked`` (the caller
    queued that check itself). Returns the arrays, the checked blank and the problem's kernel
    launches."""
    def prepare():
        checked, stand_in = _device_float_and_stand_in(rt, fn, 'log_probs', log_probs)
        lengths = _small_ints(rt, input_lengths)
        checked_blank = ctc_checks.check_decode_inputs(fn, stand_in, ctc_checks.stand_in(lengths), blank)[2]
        if more_checks is not None:
            more_checks()
        return checked_blank, prepared.Launches(rt, DECODE_SOURCE, decode_defines(checked.dtype))

    blank, launches = prepared.get(rt, fn, (log_probs, input_lengths), (blank,) + params, prepare)
    log_probs = log_probs if isinstance(log_probs, rt.xp.ndarray) else rt.xp.asarray(log_probs)
    input_lengths = _small_ints(rt, input_lengths)
    if input_lengths.size and not values_checked:
        deferred.defer(rt, rt.xp.any(ctc_checks.bad_lengths(rt.xp, input_lengths, log_probs.shape[1])),
                       lambda: ctc_checks.check_decode_inputs(
                           fn, _device_float_and_stand_in(rt, fn, 'log_probs', log_probs)[1],
                           to_host(rt, input_lengths), blank))
    return rt.xp.ascontiguousarray(log_probs), input_lengths.astype(np.int64, copy=False), blank, launches


def ctc_greedy_decode(log_probs, input_lengths, blank=None, merge_repeated=True, *, runtime=None,
                      values_checked=False):
    """Best path: argmax per frame within input_length, merge repeats, drop blanks.
    ``values_checked=True``: the caller has queued the device-side check of input_lengths'
    values itself (the graph op does, naming the K function), so none is queued here.

    # Returns
        (decoded, neg_sum_logits): decoded (N, T) int64 padded with -1;
        neg_sum_logits (N, 1), minus the sum over frames of the largest log_prob.
    """
    fn, rt = 'ctc_greedy_decode', resolve(runtime)
    log_probs, input_lengths, blank, launches = _checked_decode_inputs(fn, rt, log_probs, input_lengths, blank,
                                                                       values_checked)
    batch, steps, classes = log_probs.shape
    decoded = rt.xp.empty((batch, steps), dtype=np.int64)
    neg_sum = rt.xp.zeros((batch, 1), dtype=log_probs.dtype)
    if steps == 0 or batch == 0:
        return decoded, neg_sum
    launches(
        'ctc_greedy_decode', batch, CTC_DECODE_THREADS,
        (log_probs, _device_ints(rt, input_lengths), decoded, neg_sum, np.int64(steps), np.int64(classes),
         np.int64(blank), np.int32(bool(merge_repeated))))
    return decoded, neg_sum


def ctc_beam_search_decode(log_probs, input_lengths, beam_width=100, top_paths=1, blank=None,
                           merge_repeated=False, *, runtime=None, values_checked=False):
    """CTC prefix beam search (TensorFlow's ctc_beam_search_decoder), on the GPU.
    ``values_checked=True``: the caller has queued the device-side check of input_lengths'
    values itself (the graph op does, naming the K function), so none is queued here.

    # Returns
        (paths, log_probs): a list of top_paths arrays (N, T) int64 padded with -1, best
        first; log_probs (N, top_paths) (-inf with an empty path when fewer prefixes exist).
    """
    fn, rt = 'ctc_beam_search_decode', resolve(runtime)
    log_probs, input_lengths, blank, launches = _checked_decode_inputs(
        fn, rt, log_probs, input_lengths, blank, values_checked,
        lambda: (ctc_checks.positive_int(fn, 'beam_width', beam_width),
                 ctc_checks.positive_int(fn, 'top_paths', top_paths, beam_width)),
        (beam_width, top_paths, type(beam_width), type(top_paths)))   # True == 1: the types key too
    width, top_paths = int(beam_width), int(top_paths)
    batch, steps, classes = log_probs.shape
    xp, acc = rt.xp, accumulation_dtype(log_probs.dtype)
    if steps == 0 or batch == 0:
        scores = np.full((batch, top_paths), -np.inf)
        scores[:, 0] = 0.0
        empty = xp.empty((batch, steps), dtype=np.int64)
        return [empty.copy() for _ in range(top_paths)], xp.asarray(scores.astype(log_probs.dtype))
    width = ctc_checks.useful_beam_width(width, steps, classes)   # the same results, no dead beams
    found_paths = min(top_paths, width)   # the paths past the prefixes that exist: empty, -inf
    arrays = _beam_arrays(batch, steps, width, found_paths, log_probs.dtype, acc)
    needed = sum(math.prod(shape) * np.dtype(dtype).itemsize for shape, dtype in arrays)
    ctc_checks.check_beam_scratch(fn, int(beam_width), needed, *_bytes_available(rt), log_probs.shape)
    paths, scores = _beam_search(rt, launches, log_probs, input_lengths, width, found_paths, blank,
                                 merge_repeated, arrays)
    if found_paths < top_paths:
        scores = xp.concatenate([scores, xp.full((batch, top_paths - found_paths), -np.inf, dtype=scores.dtype)],
                                axis=1)
        paths += [xp.full((batch, steps), -1, dtype=np.int64) for _ in range(found_paths, top_paths)]
    return paths, scores


def _beam_arrays(batch, steps, width, top_paths, dtype, acc):
    """(shape, dtype) of every array _beam_search allocates, in ctc_beam_search's argument
    order: its scratch (per-sample pitches: ctc_decode.cu), then the paths and their scores."""
    candidates = beam_pitch(width + width * width)   # the stays and each beam's best W extensions
    beams, history = beam_pitch(width), beam_pitch(steps * width)
    scratch = ((4 * beams, acc), (4 * beams, np.int64), (2 * beams, np.int32), (3 * beams, np.int32),
               (beam_pitch(width * width), np.int32), (candidates, acc), (candidates, np.int32),
               (beams, np.int32), (history, np.int32), (history, np.int32))
    return [((batch * n,), t) for n, t in scratch] + [((batch, top_paths, steps), np.int64),
                                                       ((batch, top_paths), dtype)]


def _bytes_available(rt):
    """(bytes free for allocations, 'GPU' or 'host') where ``rt`` allocates: on CUDA the
    device's free memory and the blocks CuPy's pool caches, within the pool's limit."""
    if rt.kind != 'cuda':
        return ctc_checks.host_bytes_available(), 'host'
    cuda, pool = rt.xp.cuda, rt.xp.get_default_memory_pool()
    free = cuda.runtime.memGetInfo()[0] + pool.free_bytes()
    limit = pool.get_limit()
    return (min(free, limit - pool.used_bytes()) if limit else free), 'GPU'


def _beam_search(rt, launches, log_probs, input_lengths, width, top_paths, blank, merge_repeated, arrays):
    """The beam search kernel's launch, with ``arrays`` (_beam_arrays) allocated for it."""
    batch, steps, classes = log_probs.shape
    xp = rt.xp
    *scratch, paths, scores = (xp.empty(shape, dtype=dtype) for shape, dtype in arrays)
    launches(
        'ctc_beam_search', batch, CTC_DECODE_THREADS,
        (log_probs, _device_ints(rt, input_lengths), *scratch,
         paths, scores, np.int64(steps), np.int64(classes), np.int64(width), np.int64(top_paths),
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
