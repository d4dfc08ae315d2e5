"""Launchers for batchnorm.cu: fused batch normalization (training, inference, backward).

Same names and signatures as gpuk/cpu_fallback/batchnorm.py, plus a keyword-only `runtime`
(None: runtime.current(); 'cuda', 'emulate', or a runtime object); the same checks and
messages, before any launch. On the CUDA runtime each call goes through
``dispatch.run('batchnorm', ...)``, which may pick the cuDNN Frontend graphs in
gpuk/kernels/cudnn/batchnorm.py (``GPUK_KERNELS=batchnorm=cudnn|auto``).

Layouts: x is viewed as (outer, C, inner) when the kept (non-reduced) axes are one
contiguous run: channels last (inner == 1) and channels first (N, C, H, W...) run natively.
Any other set of reduced axes (kept axes not contiguous, e.g. axes=(1,) of a 3-d x) is
transposed here to a channels-last (count, C) copy, computed, and transposed back: two
extra copies of x (and dy) for a case no Keras layer produces.
Float16 accumulates in float32; statistics and dgamma / dbeta are float32 then, like the twin.

Fusions (see the twin): ``activation='relu'`` is bn_apply's relu flag (training and inference)
and the *_relu backward kernels, which mask dy by the fused output y (plans call them where
gpuk/fusion.py folds the relu's gradient into BnGrad: no learning-phase switch between
them); the moving-average update is bn_stats_finalize_moving, the training forward's
finalize launch itself.
"""
import functools
import math
import threading
from collections import OrderedDict
from pathlib import Path

import numpy as np

from gpuk.contracts import batchnorm_checks
from gpuk.contracts.dtypes import ELEMENT_TYPES, FLOAT_DTYPES_NO_BFLOAT16, accumulation_dtype
from gpuk.contracts.geometry import MAX_GRID_YZ
from . import dispatch
from .cudnn import batchnorm as cudnn_batchnorm
from .runtime import prepared, register_build, resolve

__all__ = ['bn_train_fwd', 'bn_infer_fwd', 'bn_bwd', 'bn_train_fwd_runner', 'bn_infer_fwd_runner', 'bn_bwd_runner']

SOURCE = Path(__file__).with_name('batchnorm.cu')
# Tile constants: passed to the .cu as #defines and used for the grids below (one place).
BN_THREADS = 256          # 1-D kernels: channels-first sums, finalize, elementwise passes
BN_ROWS = 8               # channels-last sums: blocks of 32 channels x BN_ROWS rows
BN_UNROLL = 2             # elementwise passes: 16-byte vectors per thread and step
BN_FIN_ROWS = 16          # finalize: blocks of 32 channels x BN_FIN_ROWS split rows
BN_MAX_BLOCKS = 65535
TARGET_BLOCKS = 1024      # enough blocks to fill any current GPU several times over
MIN_ROWS_PER_SPLIT = 64   # channels last: at least this many rows per split
MIN_PER_SPLIT = 4 * BN_THREADS   # channels first: at least this many elements per split
MAX_SPLITS = MAX_GRID_YZ  # gridDim.y
# The single-kernel training forward (bn_train_persistent): channels last, x at most this
# fraction of the L2 (x's second read must still be there after the first pass and the
# barriers; y's writes and the partials share the cache meanwhile).
PERSISTENT_L2_FRACTION = 0.5
KERNELS = ['bn_stats_channels_last', 'bn_bwd_sums_channels_last', 'bn_bwd_relu_sums_channels_last',
           'bn_stats_channels_first', 'bn_bwd_sums_channels_first', 'bn_bwd_relu_sums_channels_first',
           'bn_stats_finalize', 'bn_stats_finalize_moving', 'bn_bwd_finalize', 'bn_apply', 'bn_infer_apply',
           'bn_bwd_dx', 'bn_bwd_relu_dx', 'bn_train_persistent']


def defines(dtype):
    return {'ELEMENT_T': ELEMENT_TYPES[np.dtype(dtype)], 'ACC_T': ELEMENT_TYPES[accumulation_dtype(dtype)],
            'BN_THREADS': BN_THREADS, 'BN_ROWS': BN_ROWS, 'BN_UNROLL': BN_UNROLL, 'BN_FIN_ROWS': BN_FIN_ROWS}


for _dtype in FLOAT_DTYPES_NO_BFLOAT16:
    register_build(SOURCE, defines(_dtype), KERNELS)


def _blocks(work_items, threads=BN_THREADS):
    return max(1, min(-(-work_items // threads), BN_MAX_BLOCKS))


def _elementwise_blocks(total, channels, inner, dtype):
    """Grid of the elementwise passes: BN_UNROLL 16-byte vectors per thread; channels last,
    rounded up where possible so that the grid stride is a multiple of C, which lets each
    thread load its channels' coefficients once (MODE_VEC_CONSECUTIVE_HOISTED in the .cu)."""
    vec = 16 // np.dtype(dtype).itemsize
    blocks = _blocks(total, BN_THREADS * vec * BN_UNROLL)
    if inner == 1 and channels and channels % vec == 0:
        step = channels // math.gcd(channels, BN_THREADS * vec)   # blocks must be a multiple of this
        rounded = -(-blocks // step) * step
        if rounded <= BN_MAX_BLOCKS:
            blocks = rounded
    return blocks


def _finalize_grid(channels):
    return max(1, min(-(-channels // 32), BN_MAX_BLOCKS)), (32, BN_FIN_ROWS)


# ---------------------------------------------------------------- reused buffers
# Scratch (split partials, the training scale, dx coefficients) and constant buffers (ones,
# zeros, epsilon and the moving-average scalars) are kept per (runtime, device, CUDA stream,
# host thread, shape, dtype) and reused, so a call allocates only its outputs. Reuse is safe
# because one thread's launches on one stream run in order: a call's kernels finish with a
# buffer before the next call's kernels write it (another stream or thread, whose launches
# could interleave, gets its own buffers). Outputs are always fresh arrays.
_BUFFERS = OrderedDict()
_MAX_BUFFERS = 64


def _device_key(rt):
    """(runtime, current device, current stream, thread): the buffers' owner."""
    cuda = getattr(rt.xp, 'cuda', None)
    if cuda is None:
        return (id(rt), 0, 0, threading.get_ident())
    return (id(rt), cuda.Device().id, cuda.get_current_stream().ptr, threading.get_ident())


class _Buffers:
    """The reused buffers of one launcher call: their owner (_device_key: the current device
    and stream, read from the array library) is read once per call, not once per buffer."""
    __slots__ = ('xp', 'owner')

    def __init__(self, rt):
        self.xp, self.owner = rt.xp, _device_key(rt)

    def cached(self, key, make):
        key = self.owner + key
        buffer = _BUFFERS.get(key)
        if buffer is None:
            buffer = _BUFFERS[key] = make()
            if len(_BUFFERS) > _MAX_BUFFERS:
                _BUFFERS.popitem(last=False)
        else:
            _BUFFERS.move_to_end(key)
        return buffer

    def scratch(self, name, shape, dtype):
        """A reused uninitialized buffer (contents left from the previous call)."""
        return self.cached(('scratch', name, tuple(shape), np.dtype(dtype).str),
                           lambda: self.xp.empty(shape, dtype))

    def filled(self, count, value, dtype):
        """A reused read-only buffer of `count` copies of `value`."""
        return self.cached(('filled', count, float(value), np.dtype(dtype).str),
                           lambda: self.xp.full(count, value, dtype))

    def scalars(self, acc, *values):
        """Host numbers or one-element (device) arrays as one acc buffer, without a host copy;
        reused per value when all are host numbers."""
        xp = self.xp
        if len(values) == 1 and type(values[0]) is float:   # a checked epsilon: the common case, short
            numbers = values
        elif all(_is_host_number(v) for v in values):
            numbers = tuple(float(np.asarray(v).reshape(-1)[0]) for v in values)
        else:
            return xp.concatenate([xp.asarray(v, dtype=acc).reshape(1) for v in values])
        return self.cached(('scalars', numbers, np.dtype(acc).str), lambda: xp.asarray(np.array(numbers, acc)))


def _is_host_number(value):
    return isinstance(value, (int, float, np.generic)) or (isinstance(value, np.ndarray) and value.size == 1)


# ---------------------------------------------------------------- checks (xp arrays)

def _float_array(fn, name, value, xp):
    array = value if isinstance(value, xp.ndarray) else xp.asarray(value)
    if array.dtype.kind != 'f' or array.dtype not in FLOAT_DTYPES_NO_BFLOAT16:
        raise TypeError('%s: %s must be a float16, float32 or float64 array, got dtype %s'
                        % (fn, name, array.dtype))
    return array


def _kept_param(fn, name, value, layout, acc, xp):
    """None, or any array with the kept size, as a flat contiguous acc-dtype array."""
    if value is None:
        return None
    array = _float_array(fn, name, value, xp)
    if array.shape != layout.kept_shape and array.size != math.prod(layout.kept_shape):
        raise ValueError('%s: %s must have shape %s (x shape %s without the reduced axes %s), '
                         'got shape %s' % (fn, name, layout.kept_shape, layout.shape, layout.axes, array.shape))
    return xp.ascontiguousarray(array.reshape(-1), dtype=acc)


class _View:
    """x as (outer, C, inner), or a transposition to channels last when that is impossible."""

    def __init__(self, shape, layout):
        kept = layout.kept_axes
        self.shape = tuple(shape)
        self.channels = math.prod(layout.kept_shape)
        self.count = layout.count
        if not kept:
            self.permutation, self.outer, self.inner = None, 1, self.count
        elif kept == tuple(range(kept[0], kept[-1] + 1)):
            self.permutation = None
            self.outer, self.inner = math.prod(shape[:kept[0]]), math.prod(shape[kept[-1] + 1:])
        else:
            self.permutation = layout.axes + kept
            self.outer, self.inner = self.count, 1

    def to_kernel(self, xp, array):
        if self.permutation is None:
            return xp.ascontiguousarray(array)
        return xp.ascontiguousarray(array.transpose(self.permutation))

    def from_kernel(self, xp, array):
        if self.permutation is None:
            return array.reshape(self.shape)
        inverse = np.argsort(self.permutation)
        permuted = tuple(self.shape[a] for a in self.permutation)
        return xp.ascontiguousarray(array.reshape(permuted).transpose(tuple(int(a) for a in inverse)))

    def key(self):
        return (self.shape, self.outer, self.channels, self.inner, self.permutation)


def _splits(view):
    """(number of splits, elements or rows per split) of the reduction over (outer, inner)."""
    if view.inner == 1:
        chunks = -(-view.channels // 32)
        wanted = min(-(-TARGET_BLOCKS // chunks), -(-view.outer // MIN_ROWS_PER_SPLIT), MAX_SPLITS)
        per_split = -(-view.outer // max(wanted, 1))
        return -(-view.outer // per_split), per_split
    reduced = view.outer * view.inner
    wanted = min(-(-TARGET_BLOCKS // view.channels), -(-reduced // MIN_PER_SPLIT), MAX_SPLITS)
    per_split = -(-reduced // max(wanted, 1))
    return -(-reduced // per_split), per_split


def _reduce(buffers, launches, view, x, dy, mean, acc, relu_y=None):
    """The sums pass: partials (splits, C, 2) in acc, for training (dy None) or backward
    (dy masked by the fused relu output when relu_y is given)."""
    splits, per_split = _splits(view)
    partials = buffers.scratch('partials', (splits, view.channels, 2), acc)
    backward = dy is not None
    kind = 'bn_stats' if not backward else 'bn_bwd_sums' if relu_y is None else 'bn_bwd_relu_sums'
    if view.inner == 1:
        name = kind + '_channels_last'
        args = (np.int64(view.outer), np.int64(view.channels), np.int64(per_split))
        grid, block = (-(-view.channels // 32), splits), (32, BN_ROWS)
    else:
        name = kind + '_channels_first'
        args = (np.int64(view.outer), np.int64(view.channels), np.int64(view.inner), np.int64(per_split))
        grid, block = (view.channels, splits), BN_THREADS
    if not backward:
        operands = (x, partials, _shifts(buffers, view, acc))
    elif relu_y is None:
        operands = (dy, x, mean, partials)
    else:
        operands = (dy, x, relu_y, mean, partials)
    launches(name, grid, block, operands + args)
    return partials, splits


def _shifts(buffers, view, acc):
    """The per-channel shifts K the training sums kernels wrote beside the partials."""
    return buffers.scratch('shifts', (view.channels,), acc)


def _persistent_blocks(rt, launches, view, x):
    """The grid of bn_train_persistent, or 0 for the split path: it needs channels last, x
    within PERSISTENT_L2_FRACTION of the L2 and a grid that is resident all at once (its grid
    barriers wait for every block): the split path's (chunk, split) tiles, at most the
    kernel's co-resident blocks (occupancy x SMs on a GPU, the worker threads on the emulator)."""
    if view.inner != 1 or not view.channels or x.nbytes > PERSISTENT_L2_FRACTION * getattr(rt, 'l2_bytes', 0):
        return 0
    capacity = launches.kernel('bn_train_persistent').coresident_blocks(BN_THREADS)
    tiles = -(-view.channels // 32) * _splits(view)[0]
    return max(0, min(capacity, tiles))


def _barrier(buffers):
    """bn_train_persistent's grid-barrier state: zeroed once, left as found by every launch.
    Two launches that overlap must never share one (each would count the other's blocks at its
    barriers, and wait forever or run on early): like the scratch buffers it is kept per
    (runtime, device, stream, host thread) (_device_key), and launches on one stream run one
    after the other, so concurrent launches on two streams (or threads) use two barriers. A
    captured CUDA Graph keeps the one of its capture stream, on which it is also replayed."""
    return buffers.cached(('barrier',), lambda: buffers.xp.zeros(2, np.uint32))


def _train_persistent(buffers, launches, view, xk, gamma, beta, moving_args, activation, epsilon, blocks):
    """The training forward as one bn_train_persistent launch -> (y in the kernel's layout,
    mean, var, inv_std, next_mean, next_var)."""
    xp, c = buffers.xp, view.channels
    acc = accumulation_dtype(xk.dtype)
    splits, per_split = _splits(view)
    moving_mean, moving_var, decay, var_decay, var_factor = moving_args
    moving = moving_mean is not None
    mean, var, inv_std = (xp.empty(c, acc) for _ in range(3))
    next_mean, next_var = (xp.empty(c, acc) for _ in range(2)) if moving else (mean, var)
    scalars = buffers.scalars(acc, epsilon, decay, var_decay, var_factor) if moving else buffers.scalars(acc, epsilon)
    y = xp.empty(xk.shape, xk.dtype)
    launches('bn_train_persistent', blocks, BN_THREADS, (
        xk, y, gamma, beta, moving_mean if moving else gamma, moving_var if moving else gamma, mean, var, inv_std,
        buffers.scratch('scale', (c,), acc), next_mean, next_var, buffers.scratch('partials', (splits, c, 2), acc),
        _shifts(buffers, view, acc), _barrier(buffers), scalars, np.int64(view.outer), np.int64(c), np.int64(splits),
        np.int64(per_split), np.int32(moving), np.int32(activation == 'relu')))
    return y, mean, var, inv_std, (next_mean if moving else None), (next_var if moving else None)


def _apply(launches, channels, inner, x, mean, scale, shift, dtype, xp, activation):
    """y = (x - mean[ch]) * scale[ch] + shift[ch] [then max(y, 0)] over x viewed as
    (outer, channels, inner)."""
    y = xp.empty(x.shape, dtype)
    if x.size:
        launches('bn_apply', _elementwise_blocks(x.size, channels, inner, dtype), BN_THREADS, (
            x, y, mean, scale, shift, np.int64(x.size), np.int64(channels), np.int64(inner),
            np.int32(activation == 'relu')))
    return y




# ---------------------------------------------------------------- training forward

def bn_train_fwd(x, gamma, beta, axes, epsilon=1e-3, activation='linear', moving_mean=None, moving_var=None,
                 decay=None, var_decay=None, var_factor=None, *, runtime=None, single_kernel=True):
    """Batch statistics over `axes`, then normalize, scale and shift [and relu]
    -> (y, mean, var, inv_std[, next_moving_mean, next_moving_var]).

    ``single_kernel``: True takes bn_train_persistent where it fits (channels last, x within
    PERSISTENT_L2_FRACTION of the L2, a resident grid); False always takes the split path
    (sums, finalize, apply), as activations past the L2 do (the inspect report measures both)."""
    return bn_train_fwd_runner(x, gamma, beta, axes, epsilon, activation, moving_mean, moving_var, decay, var_decay,
                               var_factor, runtime=runtime, single_kernel=single_kernel)(
        x, gamma, beta, moving_mean, moving_var, decay, var_decay, var_factor)


def bn_train_fwd_runner(x, gamma, beta, axes, epsilon=1e-3, activation='linear', moving_mean=None, moving_var=None,
                        decay=None, var_decay=None, var_factor=None, *, runtime=None, single_kernel=True):
    """``run(x, gamma, beta, moving_mean=None, moving_var=None, decay=None, var_decay=None,
    var_factor=None)``, bn_train_fwd with these axes, epsilon and activation for arguments of the
    types, shapes and dtypes of these: checked and set up once per problem signature
    (runtime/prepared.py); a BnTrain plan step keeps it (prepared.Kept)."""
    fn = 'bn_train_fwd'
    if not isinstance(single_kernel, bool):
        raise TypeError('%s: single_kernel must be True or False, got %r' % (fn, single_kernel))
    rt = resolve(runtime)
    xp = rt.xp

    def prepare():   # once per problem signature (runtime/prepared.py)
        checked = _float_array(fn, 'x', x, xp)
        checked_epsilon = batchnorm_checks.check_epsilon(fn, epsilon)
        batchnorm_checks.check_activation(fn, activation)
        moving = batchnorm_checks.check_moving_args(fn, moving_mean, moving_var, decay, var_decay, var_factor)
        checked_axes = batchnorm_checks.normalize_axes(fn, axes, checked.ndim)
        layout = batchnorm_checks.Layout(checked.shape, checked_axes)
        if layout.count == 0:
            raise ValueError('%s: x must have elements along the reduced axes %s, got shape %s'
                             % (fn, checked_axes, checked.shape))
        acc = accumulation_dtype(checked.dtype)
        for name, value in (('gamma', gamma), ('beta', beta)) + (
                (('moving_mean', moving_mean), ('moving_var', moving_var)) if moving else ()):
            _kept_param(fn, name, value, layout, acc, xp)
        view = _View(checked.shape, layout)
        key = ('train', checked.dtype, view.key(), gamma is None, beta is None, activation, moving)
        gpuk_fn = functools.partial(_bn_train_fwd_gpuk, rt, view, layout,
                                    prepared.Launches(rt, SOURCE, defines(checked.dtype)), single_kernel)
        array, flat = _converters(xp, acc)
        # host numbers stay host numbers (reused buffers in scalars; cuDNN takes them by value),
        # device values become (1,) acc arrays: which is which is part of the signature
        scalar_slots = tuple(_is_host_number(v) for v in (decay, decay if var_decay is None else var_decay,
                                                             1 if var_factor is None else var_factor))

        def scalar(value, host):
            return value if host else xp.asarray(value, dtype=acc).reshape(1)

        def run(x, gamma, beta, moving_mean=None, moving_var=None, decay=None, var_decay=None, var_factor=None):
            if moving:
                moving_mean, moving_var = flat(moving_mean), flat(moving_var)
                host_decay, host_var_decay, host_factor = scalar_slots
                var_decay = scalar(decay if var_decay is None else var_decay, host_var_decay)
                decay = scalar(decay, host_decay)
                var_factor = scalar(1 if var_factor is None else var_factor, host_factor)
            return dispatch.run(rt, 'batchnorm', key, gpuk_fn, cudnn_batchnorm.bn_train_fwd, array(x), flat(gamma),
                                flat(beta), checked_axes, checked_epsilon, activation, moving_mean, moving_var, decay,
                                var_decay, var_factor)
        return run
    return prepared.get(rt, fn, (x, gamma, beta, moving_mean, moving_var, decay, var_decay, var_factor),
                        (axes, epsilon, activation, single_kernel), prepare)


def _converters(xp, acc):
    """(array, flat): a checked argument as the runtime's array, and a checked kept-shape
    parameter (or None) as a flat contiguous acc array (a NumPy array or a list handed to the
    CUDA runtime is converted per call; the checks ran on it in prepare())."""
    array_type = xp.ndarray

    def array(value):
        return value if type(value) is array_type else xp.asarray(value)

    def flat(value):
        if value is None:
            return None
        return xp.ascontiguousarray((value if type(value) is array_type else xp.asarray(value)).reshape(-1),
                                    dtype=acc)
    return array, flat


def _bn_train_fwd_gpuk(rt, view, layout, launches, single_kernel, x, gamma, beta, _axes, epsilon, activation,
                       moving_mean, moving_var, decay, var_decay, var_factor):
    xp = rt.xp
    buffers = _Buffers(rt)
    acc = accumulation_dtype(x.dtype)
    c = view.channels
    gamma = buffers.filled(c, 1, acc) if gamma is None else gamma
    beta = buffers.filled(c, 0, acc) if beta is None else beta
    moving = moving_mean is not None
    xk = view.to_kernel(xp, x)
    moving_args = (moving_mean, moving_var, decay, var_decay, var_factor)
    # per problem on a GPU (its L2 and occupancy are the runtime's; Launches.kept)
    blocks = single_kernel and launches.kept('persistent blocks', lambda: _persistent_blocks(rt, launches, view, xk))
    if blocks:
        outs = _train_persistent(buffers, launches, view, xk, gamma, beta, moving_args, activation, epsilon, blocks)
    else:
        outs = _train_split(buffers, launches, view, xk, gamma, beta, moving_args, activation, epsilon)
    y, mean, var, inv_std, next_mean, next_var = outs
    kept = layout.kept_shape
    stats = (view.from_kernel(xp, y), mean.reshape(kept), var.reshape(kept), inv_std.reshape(kept))
    return stats + (next_mean.reshape(kept), next_var.reshape(kept)) if moving else stats


def _train_split(buffers, launches, view, xk, gamma, beta, moving_args, activation, epsilon):
    """The training forward as the split path (sums, finalize, apply) -> (y in the kernel's
    layout, mean, var, inv_std, next_mean, next_var)."""
    xp, c = buffers.xp, view.channels
    acc = accumulation_dtype(xk.dtype)
    moving_mean, moving_var, decay, var_decay, var_factor = moving_args
    moving = moving_mean is not None
    mean, var, inv_std = (xp.empty(c, acc) for _ in range(3))
    scale = buffers.scratch('scale', (c,), acc)
    next_mean, next_var = (xp.empty(c, acc) for _ in range(2)) if moving else (None, None)
    if c:
        partials, splits = _reduce(buffers, launches, view, xk, None, None, acc)
        sizes = (np.int64(c), np.int64(splits), np.int64(view.count))
        shifts = _shifts(buffers, view, acc)
        if moving:
            launches('bn_stats_finalize_moving', *_finalize_grid(c), args=(
                partials, shifts, gamma, moving_mean, moving_var, mean, var, inv_std, scale, next_mean, next_var,
                buffers.scalars(acc, epsilon, decay, var_decay, var_factor)) + sizes)
        else:
            launches('bn_stats_finalize', *_finalize_grid(c), args=(
                partials, shifts, gamma, mean, var, inv_std, scale, buffers.scalars(acc, epsilon)) + sizes)
    y = _apply(launches, c, view.inner, xk, mean, scale, beta, xk.dtype, xp, activation)
    return y, mean, var, inv_std, next_mean, next_var


# ---------------------------------------------------------------- inference forward

def _channel_param(fn, name, value, x, axis, acc, xp):
    """The twin's rule: 1-D of x.shape[axis] values goes on `axis`; else it must broadcast to x."""
    array = _float_array(fn, name, value, xp)
    if array.ndim == 1 and array.shape[0] == x.shape[axis] and x.ndim > 1:
        shape = [1] * x.ndim
        shape[axis] = array.shape[0]
        return array.astype(acc, copy=False).reshape(shape)
    try:
        full = np.broadcast_shapes(array.shape, x.shape)
    except ValueError:
        raise ValueError('%s: %s must have shape (%d,) (x.shape[axis] with axis=%d) or broadcast '
                         'to x shape %s, got shape %s'
                         % (fn, name, x.shape[axis], axis, x.shape, array.shape)) from None
    if full != x.shape:
        raise ValueError('%s: %s of shape %s would broadcast x shape %s to a larger shape'
                         % (fn, name, array.shape, x.shape))
    return array.astype(acc, copy=False).reshape((1,) * (x.ndim - array.ndim) + array.shape)


def bn_infer_fwd(x, mean, var, gamma, beta, epsilon=1e-3, axis=-1, activation='linear', *, runtime=None):
    """Keras `batch_normalization`: (x - mean) / sqrt(var + epsilon) * gamma + beta [then relu]."""
    return bn_infer_fwd_runner(x, mean, var, gamma, beta, epsilon, axis, activation, runtime=runtime)(
        x, mean, var, gamma, beta)


def bn_infer_fwd_runner(x, mean, var, gamma, beta, epsilon=1e-3, axis=-1, activation='linear', *, runtime=None):
    """``run(x, mean, var, gamma, beta)``, bn_infer_fwd with this epsilon, axis and activation for
    arguments of the types, shapes and dtypes of these: checked and set up once per problem
    signature (runtime/prepared.py); a BnInfer plan step keeps it (prepared.Kept)."""
    fn = 'bn_infer_fwd'
    rt = resolve(runtime)
    xp = rt.xp

    named = (('mean', mean), ('var', var), ('gamma', gamma), ('beta', beta))

    def prepare():   # once per problem signature (runtime/prepared.py)
        checked = _float_array(fn, 'x', x, xp)
        checked_epsilon = batchnorm_checks.check_epsilon(fn, epsilon)
        batchnorm_checks.check_activation(fn, activation)
        checked_axis = batchnorm_checks.check_channel_axis(fn, axis, checked.ndim)
        acc = accumulation_dtype(checked.dtype)
        # the parameters are part of the signature: their shapes (checked once) set their layout
        shapes = tuple(None if p is None else _channel_param(fn, n, p, checked, checked_axis, acc, xp).shape
                       for n, p in named)
        key = ('infer', checked.dtype, checked.shape, shapes, activation)
        gpuk_fn = functools.partial(_bn_infer_fwd_gpuk, rt, prepared.Launches(rt, SOURCE, defines(checked.dtype)),
                                    _InferPlan(checked.shape, shapes, checked.dtype, activation))
        array, _ = _converters(xp, acc)

        def run(x, mean, var, gamma, beta):
            params = [None if p is None else array(p).astype(acc, copy=False).reshape(shape)
                      for p, shape in zip((mean, var, gamma, beta), shapes)]
            return dispatch.run(rt, 'batchnorm', key, gpuk_fn, cudnn_batchnorm.bn_infer_fwd, array(x), *params,
                                checked_epsilon, checked_axis, activation)
        return run
    return prepared.get(rt, fn, (x, mean, var, gamma, beta), (epsilon, axis, activation), prepare)


def parameter_span(x_shape, param_shapes):
    """(first, last + 1): the run of axes on which any parameter varies ((0, 0) if none)."""
    varying = [i for shape in param_shapes for i, size in enumerate(shape) if size != 1 and x_shape[i] != 1]
    return (min(varying), max(varying) + 1) if varying else (0, 0)


class _InferPlan:
    """What bn_infer_fwd's launch reads of its problem's shapes, once per problem: the run of
    axes the parameters vary on (parameter_span; x viewed as (outer, channels, inner) around
    it), the grid and the launch's sizes."""

    def __init__(self, x_shape, param_shapes, dtype, activation):
        self.scalar_x = not x_shape
        self.shape = shape = tuple(x_shape) if x_shape else (1,)
        # a 0-d x: every parameter is reshaped to (1,) too
        lo, hi = parameter_span(shape, [shape if self.scalar_x else s for s in param_shapes if s is not None])
        span_shape = shape[lo:hi]
        self.channels = max(math.prod(span_shape), 1)
        size, inner = math.prod(shape), math.prod(shape[hi:])
        self.blocks = _elementwise_blocks(size, self.channels, inner, dtype) if size else 0
        # a parameter restricted to the span axes (it is constant elsewhere)
        self.index = tuple(slice(None) if lo <= i < hi else slice(0, 1) for i in range(len(shape)))
        self.span_full = (1,) * lo + span_shape + (1,) * (len(shape) - hi)
        self.sizes = (np.int64(size), np.int64(self.channels), np.int64(inner), np.int32(activation == 'relu'))


def _bn_infer_fwd_gpuk(rt, launches, plan, x, mean, var, gamma, beta, epsilon, _axis, _activation):
    xp = rt.xp
    buffers = _Buffers(rt)
    acc = accumulation_dtype(x.dtype)
    channels = plan.channels

    def on_span(p, fill):
        # the parameter restricted to the span axes, flattened: a view of a (C,) parameter in
        # acc already, so no copy in the common case
        if p is None:
            return buffers.filled(channels, fill, acc)
        if plan.scalar_x:
            p = p.reshape(plan.shape)
        if p.size == channels and p.dtype == acc and p.flags.c_contiguous:
            return p.reshape(-1)   # it varies on every span axis (a (C,) parameter): already flat
        return xp.ascontiguousarray(xp.broadcast_to(p[plan.index], plan.span_full), dtype=acc).reshape(-1)
    mean_s, var_s, gamma_s, beta_s = on_span(mean, 0), on_span(var, 1), on_span(gamma, 1), on_span(beta, 0)
    x = xp.ascontiguousarray(x)
    y = xp.empty(x.shape, x.dtype)
    if plan.blocks:
        # the scale 1 / sqrt(var + epsilon) * gamma is computed in the kernel, where it is used
        launches('bn_infer_apply', plan.blocks, BN_THREADS, (
            x, y, mean_s, var_s, gamma_s, beta_s, buffers.scalars(acc, epsilon)) + plan.sizes)
    return y


# ---------------------------------------------------------------- backward

def bn_bwd(dy, x, gamma, mean, inv_std, axes, dmean=None, dvar=None, activation='linear', y=None, *,
           runtime=None):
    """Gradients of bn_train_fwd -> (dx, dgamma, dbeta), in two passes over x and dy (and y, the
    fused forward's output, with activation='relu': dy counts only where y > 0)."""
    return bn_bwd_runner(dy, x, gamma, mean, inv_std, axes, dmean, dvar, activation, y, runtime=runtime)(
        dy, x, gamma, mean, inv_std, dmean, dvar, y)


def bn_bwd_runner(dy, x, gamma, mean, inv_std, axes, dmean=None, dvar=None, activation='linear', y=None, *,
                  runtime=None):
    """``run(dy, x, gamma, mean, inv_std, dmean=None, dvar=None, y=None)``, bn_bwd with these axes
    and activation for arguments of the types, shapes and dtypes of these: checked and set up
    once per problem signature (runtime/prepared.py); a BnGrad plan step keeps it (prepared.Kept)."""
    fn = 'bn_bwd'
    rt = resolve(runtime)
    xp = rt.xp

    def prepare():   # once per problem signature (runtime/prepared.py)
        checked_x, checked_dy = _float_array(fn, 'x', x, xp), _float_array(fn, 'dy', dy, xp)
        if checked_dy.shape != checked_x.shape:
            raise ValueError('%s: dy must have the shape of x, got dy %s and x %s'
                             % (fn, checked_dy.shape, checked_x.shape))
        batchnorm_checks.check_relu_output(fn, activation, None if y is None else _float_array(fn, 'y', y, xp),
                                           checked_x)
        checked_axes = batchnorm_checks.normalize_axes(fn, axes, checked_x.ndim)
        layout = batchnorm_checks.Layout(checked_x.shape, checked_axes)
        if layout.count == 0:
            raise ValueError('%s: x must have elements along the reduced axes %s, got shape %s'
                             % (fn, checked_axes, checked_x.shape))
        if mean is None or inv_std is None:
            raise ValueError('%s: mean and inv_std (outputs of bn_train_fwd) are required' % fn)
        acc = accumulation_dtype(checked_x.dtype)
        for name, value in (('mean', mean), ('inv_std', inv_std), ('gamma', gamma), ('dmean', dmean),
                            ('dvar', dvar)):
            _kept_param(fn, name, value, layout, acc, xp)
        view = _View(checked_x.shape, layout)
        key = ('bwd', checked_x.dtype, view.key(), gamma is None, dmean is None, dvar is None, activation)
        gpuk_fn = functools.partial(_bn_bwd_gpuk, rt, view, layout,
                                    prepared.Launches(rt, SOURCE, defines(checked_x.dtype)))
        array, flat = _converters(xp, acc)
        dtype = checked_x.dtype

        def run(dy, x, gamma, mean, inv_std, dmean=None, dvar=None, y=None):
            # dy in x's precision: the twin computes in it too
            return dispatch.run(rt, 'batchnorm', key, gpuk_fn, cudnn_batchnorm.bn_bwd,
                                array(dy).astype(dtype, copy=False), array(x), flat(gamma), flat(mean),
                                flat(inv_std), checked_axes, flat(dmean), flat(dvar), activation,
                                None if y is None else array(y))
        return run
    return prepared.get(rt, fn, (dy, x, gamma, mean, inv_std, dmean, dvar, y), (axes, activation), prepare)


def _bn_bwd_gpuk(rt, view, layout, launches, dy, x, gamma, mean, inv_std, _axes, dmean, dvar, _activation, y):
    xp = rt.xp
    buffers = _Buffers(rt)
    acc = accumulation_dtype(x.dtype)
    c = view.channels
    gamma = buffers.filled(c, 1, acc) if gamma is None else gamma
    dmean = buffers.filled(c, 0, acc) if dmean is None else dmean
    dvar = buffers.filled(c, 0, acc) if dvar is None else dvar
    xk, dyk = view.to_kernel(xp, x), view.to_kernel(xp, dy)
    yk = None if y is None else view.to_kernel(xp, y)
    dgamma, dbeta = xp.empty(c, acc), xp.empty(c, acc)
    coef = buffers.scratch('coef', (3 * c,), acc)
    kept = layout.kept_shape
    if c == 0:
        return xp.empty(x.shape, x.dtype), dgamma.reshape(kept), dbeta.reshape(kept)
    partials, splits = _reduce(buffers, launches, view, xk, dyk, mean, acc, relu_y=yk)
    launches('bn_bwd_finalize', *_finalize_grid(c), args=(
        partials, inv_std, gamma, dmean, dvar, dgamma, dbeta, coef, np.int64(c), np.int64(splits),
        np.int64(view.count)))
    dx = xp.empty(xk.shape, x.dtype)
    if x.size:
        sizes = (np.int64(x.size), np.int64(c), np.int64(view.inner))
        blocks = _elementwise_blocks(x.size, c, view.inner, x.dtype)
        if yk is None:
            launches('bn_bwd_dx', blocks, BN_THREADS, (dyk, xk, mean, coef, dx) + sizes)
        else:
            launches('bn_bwd_relu_dx', blocks, BN_THREADS, (dyk, xk, yk, mean, coef, dx) + sizes)
    return view.from_kernel(xp, dx), dgamma.reshape(kept), dbeta.reshape(kept)
