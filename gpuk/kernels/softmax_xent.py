"""Launchers for softmax_xent.cu: softmax, log-softmax and the cross-entropy losses.

Same names, signatures, output dtypes and errors as gpuk/cpu_fallback/softmax_xent.py,
plus a keyword-only `runtime` (None: runtime.current(); 'cuda', 'emulate', or a runtime).

Any axis: the launcher moves the class axis last (a contiguous copy when it is not
already last, none when it is) so the kernels see `rows` x `cols` row-major data, and
moves it back in the result. Rows up to WARP_ROW_MAX_COLS classes get one warp each,
longer rows one block each; rows of up to SUB_WARP_MAX_COLS classes share a warp (32 / lanes
rows). float16 and bfloat16 (ml_dtypes.bfloat16) are computed in
float32 and the saved log-sum-exp (and the dloss the backward kernels read) stay float32. Inputs paired with the logits
or probabilities (target, dloss) are cast to their dtype first.

On the CUDA runtime the softmax functions run the 'softmax_xent' family's choice
(``GPUK_KERNELS=softmax_xent=gpuk|cudnn|auto``): these kernels or cuDNN's softmax
(gpuk/kernels/cudnn/softmax.py). cuDNN has no fused cross-entropy, so the cross-entropy
functions always run these kernels (saying so once when the family is set to 'cudnn').
"""
import functools
import math
from pathlib import Path

import numpy as np

from gpuk import config
from gpuk.cpu_fallback import softmax_xent as twin
from gpuk.contracts import softmax_xent_checks as checks
from gpuk.contracts.dtypes import ELEMENT_TYPES, FLOAT_DTYPES, accumulation_dtype
from . import dispatch
from .cudnn import library as cudnn_library
from .cudnn import softmax as cudnn_softmax
from .runtime import deferred, prepared, register_build, resolve, to_host

__all__ = list(twin.__all__)

SOURCE = Path(__file__).with_name('softmax_xent.cu')
# Tile constants: #defines of the .cu and the grid below (one place).
ROW_THREADS = 256
WARP_ROW_MAX_COLS = 1024      # rows up to this many classes: a warp per row; longer: a block
SUB_WARP_MAX_COLS = 32        # rows up to this many classes: several rows per warp (sub-warp groups)
MAX_ROW_BLOCKS = 65535
BINARY_THREADS = 256
MAX_BINARY_BLOCKS = 8192
BINARY_OPS = {'logits_fwd': 0, 'logits_bwd': 1, 'logits_dtarget': 2,
              'probs_fwd': 3, 'probs_bwd': 4, 'probs_dtarget': 5}
ROW_KERNELS = ['softmax_rows_fwd', 'softmax_rows_bwd', 'softmax_xent_rows_fwd', 'softmax_xent_rows_bwd',
               'softmax_xent_rows_dtarget', 'sparse_softmax_xent_rows_fwd', 'sparse_softmax_xent_rows_bwd',
               'categorical_xent_probs_rows', 'binary_xent_elementwise']


def defines(dtype):
    return {'ELEMENT_T': ELEMENT_TYPES[np.dtype(dtype)], 'ACC_T': ELEMENT_TYPES[accumulation_dtype(dtype)],
            'ROW_THREADS': ROW_THREADS,
            'WARP_ROW_MAX_COLS': WARP_ROW_MAX_COLS, 'SUB_WARP_MAX_COLS': SUB_WARP_MAX_COLS,
            'BINARY_THREADS': BINARY_THREADS,
            # softmax_xent.cu, XENT_BWD_MIN_BLOCKS: float64 needs 128 registers to stay spill-free
            'XENT_BWD_MIN_BLOCKS': 2 if np.dtype(dtype) == np.float64 else 3}


# Every variant builds without spills (ROW_MIN_BLOCKS in softmax_xent.cu says what that needs).
for _dtype in FLOAT_DTYPES:
    register_build(SOURCE, defines(_dtype), ROW_KERNELS)


# ---------------------------------------------------------------- checks (before any launch)

def _float(fn, name, rt, value, dtype=None):
    """`value` as a contiguous-able array of rt.xp; float16, bfloat16, float32 or float64 only
    (or cast to `dtype`)."""
    array = value if isinstance(value, rt.xp.ndarray) else rt.xp.asarray(value)
    if array.dtype not in FLOAT_DTYPES:
        raise TypeError('%s: %s must be a %s array, got dtype %s'
                        % (fn, name, checks.FLOAT_DTYPE_NAMES, array.dtype))
    return array if dtype is None else array.astype(dtype, copy=False)


def _nonempty_axis(fn, name, shape, axis):
    if shape[axis] == 0:
        raise ValueError('%s: %s must have at least one class along axis %d, got shape %s'
                         % (fn, name, axis, shape))


class _Rows:
    """An array with its class axis moved last, as (rows, cols) contiguous data."""

    def __init__(self, rt, array, axis):
        self.rt, self.axis, self.shape = rt, axis, array.shape
        moved = rt.xp.moveaxis(array, axis, -1) if axis != array.ndim - 1 else array
        self.moved_shape = moved.shape
        self.data = rt.xp.ascontiguousarray(moved)
        self.cols = array.shape[axis]
        self.rows = array.size // self.cols if self.cols else 0

    def like(self, other):
        """`other` (same shape as the original array) moved the same way."""
        moved = self.rt.xp.moveaxis(other, self.axis, -1) if self.axis != other.ndim - 1 else other
        return self.rt.xp.ascontiguousarray(moved)

    def empty(self, dtype):
        return self.rt.xp.empty(self.moved_shape, dtype=dtype)

    def restore(self, out):
        """A kernel output in moved layout back in the caller's axis order (contiguous)."""
        if self.axis == len(self.shape) - 1:
            return out
        return self.rt.xp.ascontiguousarray(self.rt.xp.moveaxis(out, -1, self.axis))


def _row_values(fn, name, rt, value, full_shape, axis, acc):
    array = _float(fn, name, rt, value)
    checks.reduced_shape_check(fn, name, array, full_shape, axis)
    return rt.xp.ascontiguousarray(array.astype(acc, copy=False))


def _saved_lse_and_dloss(fn, rt, lse, dloss, logits, axis):
    """The backward ops' per-row inputs, checked and cast to the accumulation dtype."""
    acc = accumulation_dtype(logits.dtype)
    return (_row_values(fn, 'lse', rt, lse, logits.shape, axis, acc),
            _row_values(fn, 'dloss', rt, dloss, logits.shape, axis, acc))


def _lse_and_dloss(rt, lse, dloss, logits):
    """The backward ops' per-row inputs in the accumulation dtype, as _saved_lse_and_dloss
    gives them, without its checks (they ran once for the problem's signature)."""
    acc, xp = accumulation_dtype(logits.dtype), rt.xp
    return tuple(xp.ascontiguousarray((v if isinstance(v, xp.ndarray) else xp.asarray(v)).astype(acc, copy=False))
                 for v in (lse, dloss))


def _label_shape(fn, rt, labels, logits_shape, axis):
    """``labels`` as an array of rt.xp, its dtype and shape checked."""
    labels = labels if isinstance(labels, rt.xp.ndarray) else rt.xp.asarray(labels)
    if labels.dtype.kind not in 'iu':
        raise TypeError('%s: labels must be an integer array, got dtype %s' % (fn, labels.dtype))
    checks.reduced_shape_check(fn, 'labels', labels, logits_shape, axis)
    return labels


def _labels(fn, rt, labels, logits_shape, axis):
    """int64 labels, their dtype and shape already checked (_label_shape, once per problem);
    their range is checked on the device (runtime/deferred.py: no host sync, the error is
    raised where the results are read) and the kernels never index with a bad one."""
    labels = labels if isinstance(labels, rt.xp.ndarray) else rt.xp.asarray(labels)
    classes = logits_shape[axis]
    if labels.size:
        deferred.defer(rt, rt.xp.any((labels < 0) | (labels >= classes)),
                       lambda: checks.label_range_check(fn, to_host(rt, labels), classes, axis))
    return rt.xp.ascontiguousarray(labels.astype(np.int64, copy=False))


# ---------------------------------------------------------------- launches

def _rows_per_warp(cols):
    """Rows a warp takes at once: softmax_xent.cu's sub_warp_lanes for vector rows (cols % 4
    == 0; a misaligned buffer takes fewer per warp, and the kernels' grid-stride loops cover
    the rest), 1 for longer rows."""
    if cols > SUB_WARP_MAX_COLS:
        return 1
    steps = cols // 4 if cols % 4 == 0 else cols
    return 32 // min(32, 1 << max(0, (steps - 1).bit_length()))


def _row_blocks(rows, cols):
    if cols <= WARP_ROW_MAX_COLS:
        rows_per_block = (ROW_THREADS // 32) * _rows_per_warp(cols)
        return max(1, min(-(-rows // rows_per_block), MAX_ROW_BLOCKS))
    return max(1, min(rows, MAX_ROW_BLOCKS))


def _launch_rows(launches, name, rows, cols, args):
    if rows == 0:
        return
    launches(name, _row_blocks(rows, cols), ROW_THREADS, tuple(args) + (np.int64(rows), np.int64(cols)))


def _checked_axis(rt, fn, arrays, axis, check, params=()):
    """(``check()``'s result, the problem's kernel launches), once per problem signature
    (runtime/prepared.py): the checks of dtypes and shapes run on the first call of a problem,
    not on the next ones. ``arrays[0]`` is the float array whose dtype builds the kernels."""
    def prepare():
        checked = check()
        return checked, prepared.Launches(rt, SOURCE, defines(rt.xp.asarray(arrays[0]).dtype))
    return prepared.get(rt, fn, arrays, (axis,) + params, prepare)


def _softmax_like_fwd(fn, x, axis, log_output, rt):
    def check():
        checked = _float(fn, 'x', rt, x)
        checked_axis = checks.check_axis(fn, axis, checked.ndim)
        _nonempty_axis(fn, 'x', checked.shape, checked_axis)
        return checked_axis

    axis, launches = _checked_axis(rt, fn, (x,), axis, check)
    x = _float(fn, 'x', rt, x)
    rows = _Rows(rt, x, axis)
    y = rows.empty(x.dtype)
    if rows.rows:
        launches('softmax_rows_fwd', _row_blocks(rows.rows, rows.cols), ROW_THREADS,
                 (rows.data, y, np.int64(rows.rows), np.int64(rows.cols), np.int32(log_output)))
    return rows.restore(y)


def _softmax_like_bwd(fn, first_name, y, dy, axis, log_input, rt):
    def check():
        checked_y, checked_dy = _float(fn, first_name, rt, y), _float(fn, 'dy', rt, dy)
        checks.same_shape(fn, first_name, checked_y, 'dy', checked_dy)
        checked_axis = checks.check_axis(fn, axis, checked_y.ndim)
        _nonempty_axis(fn, first_name, checked_y.shape, checked_axis)
        return checked_axis

    axis, launches = _checked_axis(rt, fn, (y, dy), axis, check)
    y, dy = _float(fn, first_name, rt, y), _float(fn, 'dy', rt, dy)
    rows = _Rows(rt, y, axis)
    dx = rows.empty(y.dtype)
    if rows.rows:
        launches('softmax_rows_bwd', _row_blocks(rows.rows, rows.cols), ROW_THREADS,
                 (rows.data, rows.like(dy.astype(y.dtype, copy=False)), dx, np.int64(rows.rows),
                  np.int64(rows.cols), np.int32(log_input)))
    return rows.restore(dx)


def _softmax_entry(op, rt, gpuk_fn, cudnn_fn, first, *rest):
    """Runs the 'softmax_xent' family's implementation of a softmax function (gpuk or cuDNN)."""
    key = (op, np.shape(first), str(getattr(first, 'dtype', '')), rest[-1])   # rest[-1]: axis
    return dispatch.run(rt, 'softmax_xent', key, gpuk_fn, cudnn_fn, first, *rest)


def softmax_fwd(x, axis=-1, *, runtime=None):
    """exp(x - max) / sum(exp(x - max)) along axis."""
    rt = resolve(runtime)
    return _softmax_entry('softmax_fwd', rt, functools.partial(_softmax_like_fwd, 'softmax_fwd', log_output=0, rt=rt),
                          cudnn_softmax.softmax_fwd, x, axis)


def softmax_bwd(y, dy, axis=-1, *, runtime=None):
    """dx = y * (dy - sum(dy * y)) with y the saved softmax output."""
    rt = resolve(runtime)
    return _softmax_entry('softmax_bwd', rt,
                          functools.partial(_softmax_like_bwd, 'softmax_bwd', 'y', log_input=0, rt=rt),
                          cudnn_softmax.softmax_bwd, y, dy, axis)


def log_softmax_fwd(x, axis=-1, *, runtime=None):
    """x - log(sum(exp(x))) along axis."""
    rt = resolve(runtime)
    return _softmax_entry('log_softmax_fwd', rt,
                          functools.partial(_softmax_like_fwd, 'log_softmax_fwd', log_output=1, rt=rt),
                          cudnn_softmax.log_softmax_fwd, x, axis)


def log_softmax_bwd(log_y, dy, axis=-1, *, runtime=None):
    """dx = dy - exp(log_y) * sum(dy) with log_y the saved log_softmax output."""
    rt = resolve(runtime)
    return _softmax_entry('log_softmax_bwd', rt,
                          functools.partial(_softmax_like_bwd, 'log_softmax_bwd', 'log_y', log_input=1, rt=rt),
                          cudnn_softmax.log_softmax_bwd, log_y, dy, axis)


def _no_cudnn_cross_entropy(function):
    """cuDNN has no fused cross-entropy: on the CUDA runtime the call still goes through the
    dispatcher, which runs gpuk's kernel and, when the family is set to 'cudnn', says so once."""
    @functools.wraps(function)
    def entry(*args, runtime=None, **kwargs):
        rt = resolve(runtime)
        gpuk_fn = functools.partial(function, runtime=rt)
        return dispatch.run(rt, 'softmax_xent', function.__name__, gpuk_fn, cudnn_softmax.fused_cross_entropy_unsupported,
                            *args, **kwargs)
    return entry


# ---------------------------------------------------------------- cross-entropy from logits

def _reduced(rows):
    return rows.moved_shape[:-1]


def _check_xent_fwd(rt, logits, target, axis, fn='softmax_xent_fwd'):
    """softmax_xent_fwd's argument checks -> the axis made non-negative."""
    checked, checked_target = _float(fn, 'logits', rt, logits), _float(fn, 'target', rt, target)
    checks.same_shape(fn, 'logits', checked, 'target', checked_target)
    checked_axis = checks.check_axis(fn, axis, checked.ndim)
    _nonempty_axis(fn, 'logits', checked.shape, checked_axis)
    return checked_axis


def _check_xent_bwd(rt, logits, target, lse, dloss, axis, fn='softmax_xent_bwd'):
    """softmax_xent_bwd's argument checks -> the axis made non-negative."""
    checked, checked_target = _float(fn, 'logits', rt, logits), _float(fn, 'target', rt, target)
    checks.same_shape(fn, 'logits', checked, 'target', checked_target)
    checked_axis = checks.check_axis(fn, axis, checked.ndim)
    _saved_lse_and_dloss(fn, rt, lse, dloss, checked, checked_axis)
    _nonempty_axis(fn, 'logits', checked.shape, checked_axis)
    return checked_axis


class _XentRows:
    """What softmax_xent_fwd/bwd fix for one problem (their launcher and their runner alike):
    the class axis, whether it must move last, the rows and columns, dtypes, the kernel launch
    and its size arguments."""

    def __init__(self, rt, logits, axis, kernel):
        xp = rt.xp
        logits = xp.asarray(logits)   # (checked already: an array, or what becomes one)
        self.xp, self.array_type, self.axis = xp, xp.ndarray, axis
        self.dtype = logits.dtype
        self.acc = accumulation_dtype(self.dtype)
        self.moved = axis != logits.ndim - 1
        self.moved_shape = tuple(n for i, n in enumerate(logits.shape) if i != axis) + (logits.shape[axis],)
        cols = logits.shape[axis]
        rows = math.prod(logits.shape) // cols
        self.launch = rt.kernel_launch(SOURCE, defines(self.dtype), kernel, _row_blocks(rows, cols),
                                       ROW_THREADS) if rows else None
        self.sizes = (np.int64(rows), np.int64(cols))

    def data(self, array, dtype=None):
        """``array`` (of the problem's shape) as contiguous rows, in ``dtype`` when given."""
        xp = self.xp
        if type(array) is not self.array_type:
            array = xp.asarray(array)
        if dtype is not None:
            array = array.astype(dtype, copy=False)
        return xp.ascontiguousarray(xp.moveaxis(array, self.axis, -1) if self.moved else array)

    def is_data(self, array, dtype):
        """Whether ``array`` is what ``data(array, dtype)`` returns already (a runtime array of
        contiguous rows in ``dtype``): a plan step's variant, which knows its arrays' layouts
        (prepared.Kept), then passes it as it is."""
        return (type(array) is self.array_type and not self.moved and array.flags.c_contiguous
                and array.dtype == dtype)


def _cudnn_asked():
    """Whether the family is set to cuDNN (or auto, with cuDNN here): a runner then calls the
    launcher, whose dispatcher says once that cuDNN has no fused cross-entropy. The common
    answer (gpuk's kernels) is read in place, as dispatch.run reads it: this runs per call."""
    return config._kernels.get('softmax_xent') != 'gpuk' and cudnn_library.choose('softmax_xent') != 'gpuk'


def _prepare_xent_fwd(rt, logits, target, axis, launcher=None):
    """``run(logits, target)`` of softmax_xent_fwd's kernel for this problem (checked now);
    with ``launcher`` (the runner's), a call while the family is set to cuDNN goes to it."""
    rows = _XentRows(rt, logits, _check_xent_fwd(rt, logits, target, axis), 'softmax_xent_rows_fwd')
    empty, reduced, data, launch, sizes = rt.xp.empty, rows.moved_shape[:-1], rows.data, rows.launch, rows.sizes
    dtype, acc = rows.dtype, rows.acc

    def run_with(outputs, logits_as_is=False, target_as_is=False):
        """The run taking (loss, lse) from ``outputs()``, passing logits or target as they
        are where they are the kernel's data already (_XentRows.is_data)."""
        def run(logits, target):
            if launcher is not None and _cudnn_asked():
                return launcher(logits, target, axis, runtime=rt)
            loss, lse = outputs()
            if launch is not None:
                launch((logits if logits_as_is else data(logits), target if target_as_is else data(target, dtype),
                        loss, lse) + sizes)
            return loss, lse
        return run

    run = run_with(lambda: (empty(reduced, dtype), empty(reduced, acc)))

    def specialized(arrays):
        """A plan step's run (prepared.Kept): loss and lse in the step's reused buffers, logits and
        target tested once here (their layouts are the kept ones)."""
        buffers = prepared.StepBuffers(empty, None, (dtype, acc), shapes=(reduced, reduced))
        return run_with(buffers.take_all, rows.is_data(arrays[0], dtype), rows.is_data(arrays[1], dtype))
    run.specialized = specialized
    return run


def _prepare_xent_bwd(rt, logits, target, lse, dloss, axis, launcher=None):
    """``run(logits, target, lse, dloss)`` of softmax_xent_bwd's kernel for this problem
    (checked now); ``launcher``: as _prepare_xent_fwd's."""
    rows = _XentRows(rt, logits, _check_xent_bwd(rt, logits, target, lse, dloss, axis), 'softmax_xent_rows_bwd')
    xp, data, launch, sizes, dtype, acc = rt.xp, rows.data, rows.launch, rows.sizes, rows.dtype, rows.acc
    # the per-row inputs: flat in the rows' order, in the accumulation dtype
    per_row = lambda v: xp.ascontiguousarray((v if type(v) is rows.array_type else xp.asarray(v))  # noqa: E731
                                             .astype(acc, copy=False))

    def run_with(output, as_is=(False,) * 4):
        """The run taking dlogits from ``output()``, passing each input as it is where ``as_is``
        says it is the kernel's data already (_XentRows.is_data)."""
        logits_as_is, target_as_is, lse_as_is, dloss_as_is = as_is

        def run(logits, target, lse, dloss):
            if launcher is not None and _cudnn_asked():
                return launcher(logits, target, lse, dloss, axis, runtime=rt)
            dlogits = output()
            if launch is not None:
                launch((logits if logits_as_is else data(logits), target if target_as_is else data(target, dtype),
                        lse if lse_as_is else per_row(lse), dloss if dloss_as_is else per_row(dloss), dlogits)
                       + sizes)
            return xp.ascontiguousarray(xp.moveaxis(dlogits, -1, axis)) if rows.moved else dlogits
        return run

    run = run_with(functools.partial(xp.empty, rows.moved_shape, dtype))

    def specialized(arrays):
        """A plan step's run (prepared.Kept): dlogits in the step's reused buffer (classes on
        the last axis; a moved axis gives a new array as before), the inputs tested once here
        (their layouts are the kept ones)."""
        if rows.moved:
            return run
        output = functools.partial(prepared.StepBuffers(xp.empty, rows.moved_shape, (dtype,)).take, 0)
        return run_with(output, tuple(map(rows.is_data, arrays, (dtype, dtype, acc, acc))))
    run.specialized = specialized
    return run


def softmax_xent_fwd_runner(logits, target, axis=-1, *, runtime=None):
    """``run(logits, target)``, softmax_xent_fwd(logits, target, axis) for arrays of the types,
    shapes and dtypes of these: checked and set up once per problem signature
    (runtime/prepared.py); a SoftmaxXent plan step keeps it (prepared.Kept). It goes through
    the launcher (and its dispatcher) only when the family is set to cuDNN."""
    rt = resolve(runtime)
    return prepared.get(rt, 'softmax_xent_fwd_runner', (logits, target), (axis,),
                        lambda: _prepare_xent_fwd(rt, logits, target, axis, softmax_xent_fwd))


def softmax_xent_bwd_runner(logits, target, lse, dloss, axis=-1, *, runtime=None):
    """``run(logits, target, lse, dloss)``, softmax_xent_bwd(logits, target, lse, dloss, axis)
    for arrays of the types, shapes and dtypes of these: checked and set up once per problem
    signature (runtime/prepared.py); a SoftmaxXentGrad plan step keeps it (prepared.Kept)."""
    rt = resolve(runtime)
    return prepared.get(rt, 'softmax_xent_bwd_runner', (logits, target, lse, dloss), (axis,),
                        lambda: _prepare_xent_bwd(rt, logits, target, lse, dloss, axis, softmax_xent_bwd))


@_no_cudnn_cross_entropy
def softmax_xent_fwd(logits, target, axis=-1, *, runtime=None):
    """Cross-entropy of softmax(logits) against `target`; one read pass per row.

    # Returns
        (loss, lse) with the input shape without axis; lse float32 for float16 and bfloat16
        logits.
    """
    rt = resolve(runtime)
    return prepared.get(rt, 'softmax_xent_fwd', (logits, target), (axis,),
                        lambda: _prepare_xent_fwd(rt, logits, target, axis))(logits, target)


@_no_cudnn_cross_entropy
def softmax_xent_bwd(logits, target, lse, dloss, axis=-1, *, runtime=None):
    """dlogits = (softmax(logits) * sum(target) - target) * dloss."""
    rt = resolve(runtime)
    return prepared.get(rt, 'softmax_xent_bwd', (logits, target, lse, dloss), (axis,),
                        lambda: _prepare_xent_bwd(rt, logits, target, lse, dloss, axis))(logits, target, lse, dloss)


@_no_cudnn_cross_entropy
def softmax_xent_dtarget(logits, lse, dloss, axis=-1, *, runtime=None):
    """Gradient of softmax_xent_fwd's loss with respect to target: -(logits - lse) * dloss."""
    fn, rt = 'softmax_xent_dtarget', resolve(runtime)

    def check():
        checked = _float(fn, 'logits', rt, logits)
        checked_axis = checks.check_axis(fn, axis, checked.ndim)
        _saved_lse_and_dloss(fn, rt, lse, dloss, checked, checked_axis)
        _nonempty_axis(fn, 'logits', checked.shape, checked_axis)
        return checked_axis

    axis, launches = _checked_axis(rt, fn, (logits, lse, dloss), axis, check)
    logits = _float(fn, 'logits', rt, logits)
    lse, dloss = _lse_and_dloss(rt, lse, dloss, logits)
    rows = _Rows(rt, logits, axis)
    dtarget = rows.empty(logits.dtype)
    _launch_rows(launches, 'softmax_xent_rows_dtarget', rows.rows, rows.cols,
                 (rows.data, lse, dloss, dtarget))
    return rows.restore(dtarget)


@_no_cudnn_cross_entropy
def sparse_softmax_xent_fwd(logits, labels, axis=-1, *, runtime=None):
    """Cross-entropy of softmax(logits) against integer class `labels`.

    # Returns
        (loss, lse): loss = lse - logits[label], both with the input shape without axis.
    """
    fn, rt = 'sparse_softmax_xent_fwd', resolve(runtime)

    def check():
        checked = _float(fn, 'logits', rt, logits)
        checked_axis = checks.check_axis(fn, axis, checked.ndim)
        _label_shape(fn, rt, labels, checked.shape, checked_axis)
        _nonempty_axis(fn, 'logits', checked.shape, checked_axis)
        return checked_axis

    axis, launches = _checked_axis(rt, fn, (logits, labels), axis, check)
    logits = _float(fn, 'logits', rt, logits)
    labels = _labels(fn, rt, labels, logits.shape, axis)
    rows = _Rows(rt, logits, axis)
    loss = rt.xp.empty(_reduced(rows), dtype=logits.dtype)
    lse = rt.xp.empty(_reduced(rows), dtype=accumulation_dtype(logits.dtype))
    _launch_rows(launches, 'sparse_softmax_xent_rows_fwd', rows.rows, rows.cols,
                 (rows.data, labels, loss, lse))
    return loss, lse


@_no_cudnn_cross_entropy
def sparse_softmax_xent_bwd(logits, labels, lse, dloss, axis=-1, *, runtime=None):
    """dlogits = (softmax(logits) - one_hot(labels)) * dloss."""
    fn, rt = 'sparse_softmax_xent_bwd', resolve(runtime)

    def check():
        checked = _float(fn, 'logits', rt, logits)
        checked_axis = checks.check_axis(fn, axis, checked.ndim)
        _label_shape(fn, rt, labels, checked.shape, checked_axis)
        _saved_lse_and_dloss(fn, rt, lse, dloss, checked, checked_axis)
        return checked_axis

    axis, launches = _checked_axis(rt, fn, (logits, labels, lse, dloss), axis, check)
    logits = _float(fn, 'logits', rt, logits)
    labels = _labels(fn, rt, labels, logits.shape, axis)
    lse, dloss = _lse_and_dloss(rt, lse, dloss, logits)
    rows = _Rows(rt, logits, axis)
    dlogits = rows.empty(logits.dtype)
    _launch_rows(launches, 'sparse_softmax_xent_rows_bwd', rows.rows, rows.cols,
                 (rows.data, labels, lse, dloss, dlogits))
    return rows.restore(dlogits)


# ---------------------------------------------------------------- cross-entropy from probabilities

def _epsilon_buffer(rt, epsilon, acc):
    """epsilon as a one-element device array the kernels read (never written: a prepared
    problem keeps it, so a call allocates no buffer for it)."""
    return rt.xp.full(1, epsilon, dtype=acc)


def _categorical(fn, rt, probs, target, dloss, axis, epsilon, mode):
    def check():   # once per problem signature (runtime/prepared.py)
        checked = _float(fn, 'probs', rt, probs)
        checked_axis = checks.check_axis(fn, axis, checked.ndim)
        checked_epsilon = checks.check_epsilon(fn, epsilon)
        acc = accumulation_dtype(checked.dtype)
        if target is not None:
            checks.same_shape(fn, 'probs', checked, 'target', _float(fn, 'target', rt, target))
        if dloss is not None:
            _row_values(fn, 'dloss', rt, dloss, checked.shape, checked_axis, acc)
        _nonempty_axis(fn, 'probs', checked.shape, checked_axis)
        return checked_axis, acc, _epsilon_buffer(rt, checked_epsilon, acc)

    (axis, acc, epsilon_buffer), launches = _checked_axis(rt, fn, (probs, target, dloss), axis, check,
                                                          (epsilon, type(epsilon), mode))   # True == 1.0
    probs = _float(fn, 'probs', rt, probs)
    if target is not None:
        target = _float(fn, 'target', rt, target)
    if dloss is not None:
        dloss = rt.xp.ascontiguousarray(_float(fn, 'dloss', rt, dloss).astype(acc, copy=False))
    rows = _Rows(rt, probs, axis)
    target_rows = rows.like(target.astype(probs.dtype, copy=False)) if target is not None else rows.data
    loss = rt.xp.empty(_reduced(rows), dtype=probs.dtype)
    out = rows.empty(probs.dtype) if mode else loss
    dloss = dloss if dloss is not None else rt.xp.zeros(_reduced(rows), dtype=acc)
    if rows.rows:
        launches('categorical_xent_probs_rows', _row_blocks(rows.rows, rows.cols), ROW_THREADS,
                 (rows.data, target_rows, dloss, out, loss, np.int64(rows.rows), np.int64(rows.cols),
                  np.int32(mode), epsilon_buffer))
    return loss if mode == 0 else rows.restore(out)


@_no_cudnn_cross_entropy
def categorical_xent_probs_fwd(probs, target, axis=-1, epsilon=1e-7, *, runtime=None):
    """Keras categorical_crossentropy(from_logits=False):
    p = probs / sum(probs); -sum(target * log(clip(p, eps, 1 - eps)))."""
    return _categorical('categorical_xent_probs_fwd', resolve(runtime), probs, target, None, axis, epsilon, 0)


@_no_cudnn_cross_entropy
def categorical_xent_probs_bwd(probs, target, dloss, axis=-1, epsilon=1e-7, *, runtime=None):
    """Gradient of categorical_xent_probs_fwd with respect to probs."""
    return _categorical('categorical_xent_probs_bwd', resolve(runtime), probs, target, dloss, axis, epsilon, 1)


@_no_cudnn_cross_entropy
def categorical_xent_probs_dtarget(probs, dloss, axis=-1, epsilon=1e-7, *, runtime=None):
    """Gradient of categorical_xent_probs_fwd with respect to target: -log(clip(p)) * dloss."""
    return _categorical('categorical_xent_probs_dtarget', resolve(runtime), probs, None, dloss, axis, epsilon, 2)


# ---------------------------------------------------------------- binary cross-entropy (elementwise)

def _binary(fn, rt, first_name, first, second_name, second, dloss, op, epsilon=0.0):
    def prepare():   # once per problem signature (runtime/prepared.py)
        checked, checked_second = _float(fn, first_name, rt, first), _float(fn, second_name, rt, second)
        checks.same_shape(fn, first_name, checked, second_name, checked_second)
        if dloss is not None:
            checks.same_shape(fn, first_name, checked, 'dloss', _float(fn, 'dloss', rt, dloss))
        checked_epsilon = checks.check_epsilon(fn, epsilon) if op.startswith('probs') else epsilon
        blocks = max(1, min(-(-checked.size // BINARY_THREADS), MAX_BINARY_BLOCKS))
        return (blocks, (np.int64(checked.size), np.int32(BINARY_OPS[op]),
                         _epsilon_buffer(rt, checked_epsilon, accumulation_dtype(checked.dtype))),
                prepared.Launches(rt, SOURCE, defines(checked.dtype)))

    blocks, tail, launches = prepared.get(rt, fn, (first, second, dloss), (epsilon, type(epsilon)), prepare)
    a = rt.xp.ascontiguousarray(_float(fn, first_name, rt, first))
    b = rt.xp.ascontiguousarray(_float(fn, second_name, rt, second).astype(a.dtype, copy=False))
    c = rt.xp.ascontiguousarray(_float(fn, 'dloss', rt, dloss).astype(a.dtype, copy=False)) if dloss is not None else a
    out = rt.xp.empty(a.shape, dtype=a.dtype)
    if a.size:
        launches('binary_xent_elementwise', blocks, BINARY_THREADS, (a, b, c, out) + tail)
    return out


@_no_cudnn_cross_entropy
def binary_xent_logits_fwd(logits, target, *, runtime=None):
    """Elementwise max(x, 0) - x z + log1p(exp(-|x|)) (no overflow for any x)."""
    return _binary('binary_xent_logits_fwd', resolve(runtime), 'logits', logits, 'target', target, None,
                   'logits_fwd')


@_no_cudnn_cross_entropy
def binary_xent_logits_bwd(logits, target, dloss, *, runtime=None):
    """dlogits = (sigmoid(x) - z) * dloss."""
    return _binary('binary_xent_logits_bwd', resolve(runtime), 'logits', logits, 'target', target, dloss,
                   'logits_bwd')


@_no_cudnn_cross_entropy
def binary_xent_logits_dtarget(logits, dloss, *, runtime=None):
    """dtarget = -x * dloss."""
    return _binary('binary_xent_logits_dtarget', resolve(runtime), 'logits', logits, 'dloss', dloss, None,
                   'logits_dtarget')


@_no_cudnn_cross_entropy
def binary_xent_probs_fwd(probs, target, epsilon=1e-7, *, runtime=None):
    """Keras binary_crossentropy(from_logits=False): q = clip(p); -(z log q + (1 - z) log(1 - q))."""
    return _binary('binary_xent_probs_fwd', resolve(runtime), 'probs', probs, 'target', target, None,
                   'probs_fwd', epsilon)


@_no_cudnn_cross_entropy
def binary_xent_probs_bwd(probs, target, dloss, epsilon=1e-7, *, runtime=None):
    """dprobs = (-z / q + (1 - z) / (1 - q)) * dloss inside the clip range, 0 outside."""
    return _binary('binary_xent_probs_bwd', resolve(runtime), 'probs', probs, 'target', target, dloss,
                   'probs_bwd', epsilon)


@_no_cudnn_cross_entropy
def binary_xent_probs_dtarget(probs, dloss, epsilon=1e-7, *, runtime=None):
    """dtarget = (log(1 - q) - log q) * dloss."""
    return _binary('binary_xent_probs_dtarget', resolve(runtime), 'probs', probs, 'dloss', dloss, None,
                   'probs_dtarget', epsilon)
