"""Batch norm's launch set-up for gpuk/kernels/batchnorm.py's launchers: the tile constants and
#defines of batchnorm.cu, grids and splits, x as the kernels see it (_View), the reused scratch
buffers, and the per-problem launch objects (_TrainLaunches, _InferLaunches, _BwdLaunches) a
runner's prepare() makes once per problem signature. Kept apart from the launchers (checks,
prepare, dispatch) so that each module reads as one thing: what is checked and prepared there,
how it is launched here.
"""
import math
import threading
from collections import OrderedDict
from pathlib import Path

import numpy as np

from gpuk.contracts.dtypes import ELEMENT_TYPES, FLOAT_DTYPES_NO_BFLOAT16, accumulation_dtype
from gpuk.contracts.geometry import MAX_GRID_YZ
from .runtime import prepared, register_build

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

    def __init__(self, rt, owner=None):
        self.xp, self.owner = rt.xp, _device_key(rt) if owner is None else owner

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
            numbers = tuple(_host_number(v) for v in values)
        else:
            return xp.concatenate([xp.asarray(v, dtype=acc).reshape(1) for v in values])
        return self.cached(('scalars', numbers, np.dtype(acc).str), lambda: xp.asarray(np.array(numbers, acc)))


def _is_host_number(value):
    return isinstance(value, (int, float, np.generic)) or (isinstance(value, np.ndarray) and value.size == 1)


# ---------------------------------------------------------------- x as the kernels see it

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
        # the shape of to_kernel's arrays (the launches' outputs of x's size are made in it)
        self.kernel_shape = self.shape if self.permutation is None else tuple(shape[a] for a in self.permutation)

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


def _sums_launch(view, kind):
    """(kernel, grid, block, size arguments) of a sums pass over x viewed as (outer, C, inner):
    kind 'bn_stats' (training), 'bn_bwd_sums' or 'bn_bwd_relu_sums' (backward, dy masked by the
    fused relu's output); its partials are (splits, C, 2) in acc."""
    splits, per_split = _splits(view)
    if view.inner == 1:
        return (kind + '_channels_last', (-(-view.channels // 32), splits), (32, BN_ROWS),
                (np.int64(view.outer), np.int64(view.channels), np.int64(per_split)))
    return (kind + '_channels_first', (view.channels, splits), BN_THREADS,
            (np.int64(view.outer), np.int64(view.channels), np.int64(view.inner), np.int64(per_split)))


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


# ---------------------------------------------------------------- per-problem launches
# A runner's prepare() (runtime/prepared.py) makes one of the classes below per problem
# signature: every grid, split, size argument and layout choice is worked out there, once.
# Their ``run`` is the gpuk implementation dispatch.run calls (cuDNN's signature); per call it
# finds the problem's scratch with one look-up (_Scratch), allocates the outputs and launches.

_MAX_OWNERS = 8   # scratch bundles one problem keeps (the streams and host threads that ran it)
_MAX_SCALAR_SETS = 8   # scalar buffers one owner keeps per problem (a decay schedule changes them)


class _Scratch:
    """A problem's reused buffers, ``make(buffers)`` (a tuple taken from the shared cache, so
    problems of equal shapes share them), per owner (_device_key): one look-up per call."""
    __slots__ = ('_rt', '_make', '_by_owner')

    def __init__(self, rt, make):
        self._rt, self._make, self._by_owner = rt, make, {}

    def __call__(self):
        owner = _device_key(self._rt)
        found = self._by_owner.get(owner)
        if found is None:
            if len(self._by_owner) >= _MAX_OWNERS:
                self._by_owner.clear()
            found = self._by_owner[owner] = self._make(_Buffers(self._rt, owner))
        return found


def _kernel_layout(view, xp, array):
    """``array`` (x's shape) as the kernels read it: itself when contiguous in x's own layout."""
    if view.permutation is None and array.flags.c_contiguous:
        return array
    return view.to_kernel(xp, array)


def _host_number(value):
    """A host number (a Python or NumPy number, or a one-element NumPy array) as a float."""
    return float(value) if getattr(value, 'ndim', 0) == 0 else float(np.asarray(value).reshape(-1)[0])


class _TrainLaunches:
    """bn_train_fwd's launches for one problem: bn_train_persistent where it fits
    (_persistent_blocks), else the split path (sums, finalize, apply)."""

    def __init__(self, rt, view, layout, dtype, activation, moving, single_kernel, has_gamma, has_beta,
                 numbers=None):
        self.rt, self.xp, self.view, self.moving, self.single_kernel = rt, rt.xp, view, moving, single_kernel
        # moving-average scalars that are host numbers: their conversions to float, per slot
        # (decay, var_decay, var_factor); None when one is a device value
        self.numbers = numbers
        self.launches = prepared.Launches(rt, SOURCE, defines(dtype))
        acc = self.acc = accumulation_dtype(dtype)
        c = self.channels = view.channels
        splits, per_split = _splits(view)
        relu = np.int32(activation == 'relu')
        size = math.prod(view.shape)
        self.sums = _sums_launch(view, 'bn_stats')
        self.finalize = _finalize_grid(c)
        self.finalize_sizes = (np.int64(c), np.int64(splits), np.int64(view.count))
        self.apply_blocks = _elementwise_blocks(size, c, view.inner, dtype) if size else 0
        self.apply_sizes = (np.int64(size), np.int64(c), np.int64(view.inner), relu)
        self.persistent_sizes = (np.int64(view.outer), np.int64(c), np.int64(splits), np.int64(per_split),
                                 np.int32(moving), relu)
        self.kept = layout.kept_shape
        self.reshape_stats = tuple(self.kept) != (c,)
        self._x = _Signature(view.shape, dtype)   # what _persistent_blocks reads of x
        # mean, var, inv_std, y (in the kernels' layout)[, next_mean, next_var]
        self.outputs = prepared.Outputs(rt.xp.empty, [(c,)] * 3 + [view.kernel_shape] + [(c,)] * (2 * bool(moving)),
                                        [acc] * 3 + [dtype] + [acc] * (2 * bool(moving)))
        self.scratch = _Scratch(rt, lambda b: (
            b.scratch('partials', (splits, c, 2), acc), b.scratch('shifts', (c,), acc), b.scratch('scale', (c,), acc),
            None if has_gamma else b.filled(c, 1, acc), None if has_beta else b.filled(c, 0, acc), _barrier(b), b, {}))

    def _persistent_blocks(self):
        return _persistent_blocks(self.rt, self.launches, self.view, self._x)

    def _scalars(self, buffers, by_numbers, epsilon, decay, var_decay, var_factor):
        """(epsilon, decay, var_decay, var_factor) as one acc buffer: reused per value when all
        are host numbers, else concatenated on the device (no host copy)."""
        if self.numbers is not None:
            to_decay, to_var_decay, to_factor = self.numbers
            numbers = (epsilon, to_decay(decay), to_var_decay(var_decay), to_factor(var_factor))
            found = by_numbers.get(numbers)
            if found is None:
                if len(by_numbers) >= _MAX_SCALAR_SETS:
                    by_numbers.clear()
                found = by_numbers[numbers] = buffers.scalars(self.acc, *numbers)
            return found
        return buffers.scalars(self.acc, epsilon, decay, var_decay, var_factor)

    def run(self, x, gamma, beta, _axes, epsilon, _activation, moving_mean, moving_var, decay, var_decay, var_factor,
            outputs=None):
        """``outputs``: where the outputs go (prepared.Outputs: new arrays, or a plan step's buffers)."""
        xp, c, acc, launches, view, moving = self.xp, self.channels, self.acc, self.launches, self.view, self.moving
        partials, shifts, scale, ones, zeros, barrier, buffers, by_numbers = self.scratch()
        gamma = ones if gamma is None else gamma
        beta = zeros if beta is None else beta
        xk = _kernel_layout(view, xp, x)
        if moving:
            mean, var, inv_std, y, next_mean, next_var = (outputs or self.outputs.new)()
            scalars = self._scalars(buffers, by_numbers, epsilon, decay, var_decay, var_factor)
        else:
            mean, var, inv_std, y = (outputs or self.outputs.new)()
            next_mean, next_var = mean, var
            scalars = by_numbers.get(epsilon)
            if scalars is None:
                scalars = by_numbers[epsilon] = buffers.scalars(acc, epsilon)
        # per problem on a GPU (its L2 and occupancy are the runtime's; Launches.kept)
        blocks = self.single_kernel and launches.kept('persistent blocks', self._persistent_blocks)
        if blocks:
            launches('bn_train_persistent', blocks, BN_THREADS, (
                xk, y, gamma, beta, moving_mean if moving else gamma, moving_var if moving else gamma, mean, var,
                inv_std, scale, next_mean, next_var, partials, shifts, barrier, scalars) + self.persistent_sizes)
        else:
            if c:
                name, grid, block, sizes = self.sums
                launches(name, grid, block, (xk, partials, shifts) + sizes)
                if moving:
                    launches('bn_stats_finalize_moving', *self.finalize, args=(
                        partials, shifts, gamma, moving_mean, moving_var, mean, var, inv_std, scale, next_mean,
                        next_var, scalars) + self.finalize_sizes)
                else:
                    launches('bn_stats_finalize', *self.finalize, args=(
                        partials, shifts, gamma, mean, var, inv_std, scale, scalars) + self.finalize_sizes)
            if self.apply_blocks:
                launches('bn_apply', self.apply_blocks, BN_THREADS, (xk, y, mean, scale, beta) + self.apply_sizes)
        if view.permutation is not None:
            y = view.from_kernel(xp, y)
        if self.reshape_stats:
            kept = self.kept
            mean, var, inv_std, next_mean, next_var = (a.reshape(kept) for a in (
                mean, var, inv_std, next_mean, next_var))
        return (y, mean, var, inv_std, next_mean, next_var) if moving else (y, mean, var, inv_std)


class _Signature:
    """An array's shape, dtype and size in bytes (what a per-problem choice may read of it)."""
    __slots__ = ('shape', 'dtype', 'nbytes')

    def __init__(self, shape, dtype):
        self.shape, self.dtype = tuple(shape), np.dtype(dtype)
        self.nbytes = math.prod(self.shape) * self.dtype.itemsize


def _flat_param(xp, value, acc):
    """(convert, direct) for a kept-shape parameter of ``value``'s type, shape and dtype:
    ``convert(v)`` gives a flat contiguous acc array; ``direct`` when ``value`` is one already
    but for its contiguity (a flag the per-call part reads itself). None for None."""
    if value is None:
        return None, True
    if type(value) is xp.ndarray and value.ndim == 1 and value.dtype == acc:
        return xp.ascontiguousarray, True
    return (lambda v: xp.ascontiguousarray((v if type(v) is xp.ndarray else xp.asarray(v)).reshape(-1),
                                           dtype=acc)), False


def _flat_params(converters, values):
    """``values`` through their _flat_param converters (None stays None)."""
    return [v if f is None else f(v) for f, v in zip(converters, values)]


def _contiguous(values):
    """Whether every array among ``values`` (None aside) is C-contiguous."""
    for v in values:
        if v is not None and not v.flags.c_contiguous:
            return False
    return True


# ---------------------------------------------------------------- inference forward

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


_FLAT = 'flat'   # an inference parameter given as the span's flat acc values (a (C,) one)


class _InferLaunches:
    """bn_infer_fwd's launch for one problem. Each parameter is read on the span axes only,
    flattened: an absent one from a reused filled buffer, a (C,) acc one as it is (_FLAT), any
    other through its broadcastable shape (``_on_span``)."""

    def __init__(self, rt, plan, dtype, params, shapes):
        xp = self.xp = rt.xp
        self.plan = plan
        self.launches = prepared.Launches(rt, SOURCE, defines(dtype))
        acc = self.acc = accumulation_dtype(dtype)
        c = plan.channels
        self.modes = tuple(None if p is None else _FLAT if (
            type(p) is xp.ndarray and p.ndim == 1 and p.dtype == acc and p.size == c and not plan.scalar_x)
            else shape for p, shape in zip(params, shapes))
        absent = tuple(p is None for p in params)
        self.outputs = prepared.Outputs(xp.empty, [() if plan.scalar_x else plan.shape], [dtype])   # y, x's shape
        self.scratch = _Scratch(rt, lambda b: (tuple(
            b.filled(c, fill, acc) if none else None for none, fill in zip(absent, (0, 1, 1, 0))), b, {}))

    def _on_span(self, p, shape):
        """``p`` in its broadcastable ``shape``, restricted to the span axes, flat, in acc: a view
        where it varies on every span axis already, else a copy."""
        xp, plan = self.xp, self.plan
        p = (p if type(p) is xp.ndarray else xp.asarray(p)).astype(self.acc, copy=False).reshape(shape)
        if plan.scalar_x:
            p = p.reshape(plan.shape)
        if p.size == plan.channels and p.flags.c_contiguous:
            return p.reshape(-1)
        return xp.ascontiguousarray(xp.broadcast_to(p[plan.index], plan.span_full), dtype=self.acc).reshape(-1)

    def run(self, x, mean, var, gamma, beta, epsilon, _axis, _activation, outputs=None):
        """``outputs``: as _TrainLaunches.run's."""
        xp, plan = self.xp, self.plan
        filled, buffers, by_epsilon = self.scratch()
        params = [mean, var, gamma, beta]
        for i, mode in enumerate(self.modes):
            if mode is None:
                params[i] = filled[i]
            elif mode is _FLAT:
                if not params[i].flags.c_contiguous:
                    params[i] = xp.ascontiguousarray(params[i])
            else:
                params[i] = self._on_span(params[i], mode)
        if not x.flags.c_contiguous:
            x = xp.ascontiguousarray(x)
        y, = (outputs or self.outputs.new)()
        if plan.blocks:
            scalars = by_epsilon.get(epsilon)
            if scalars is None:
                scalars = by_epsilon[epsilon] = buffers.scalars(self.acc, epsilon)
            # the scale 1 / sqrt(var + epsilon) * gamma is computed in the kernel, where it is used
            self.launches('bn_infer_apply', plan.blocks, BN_THREADS, (x, y, *params, scalars) + plan.sizes)
        return y


# ---------------------------------------------------------------- backward

class _BwdLaunches:
    """bn_bwd's launches for one problem: sums (dy masked by the fused relu's output y when
    given), finalize (dgamma, dbeta and the dx coefficients), dx."""

    def __init__(self, rt, view, layout, dtype, relu, has_gamma):
        self.xp, self.view = rt.xp, view
        self.launches = prepared.Launches(rt, SOURCE, defines(dtype))
        acc = self.acc = accumulation_dtype(dtype)
        c = self.channels = view.channels
        splits = _splits(view)[0]
        size = math.prod(view.shape)
        self.sums = _sums_launch(view, 'bn_bwd_relu_sums' if relu else 'bn_bwd_sums')
        self.finalize = _finalize_grid(c)
        self.finalize_sizes = (np.int64(c), np.int64(splits), np.int64(view.count))
        self.dx_kernel = 'bn_bwd_relu_dx' if relu else 'bn_bwd_dx'
        self.dx_blocks = _elementwise_blocks(size, c, view.inner, dtype) if size else 0
        self.dx_sizes = (np.int64(size), np.int64(c), np.int64(view.inner))
        self.kept = layout.kept_shape
        self.reshape_stats = tuple(self.kept) != (c,)
        # dx (in the kernels' layout), dgamma, dbeta
        self.outputs = prepared.Outputs(rt.xp.empty, [view.kernel_shape, (c,), (c,)], [dtype, acc, acc])
        self.scratch = _Scratch(rt, lambda b: (
            b.scratch('partials', (splits, c, 2), acc), b.scratch('coef', (3 * c,), acc),
            None if has_gamma else b.filled(c, 1, acc), b.filled(c, 0, acc)))

    def run(self, dy, x, gamma, mean, inv_std, _axes, dmean, dvar, _activation, y, outputs=None):
        """``outputs``: as _TrainLaunches.run's."""
        xp, c, acc, view, launches = self.xp, self.channels, self.acc, self.view, self.launches
        partials, coef, ones, zeros = self.scratch()
        gamma = ones if gamma is None else gamma
        dmean = zeros if dmean is None else dmean
        dvar = zeros if dvar is None else dvar
        xk, dyk = _kernel_layout(view, xp, x), _kernel_layout(view, xp, dy)
        dx, dgamma, dbeta = (outputs or self.outputs.new)()
        if c == 0:
            return dx.reshape(x.shape), dgamma.reshape(self.kept), dbeta.reshape(self.kept)
        name, grid, block, sizes = self.sums
        if y is None:
            launches(name, grid, block, (dyk, xk, mean, partials) + sizes)
        else:
            yk = _kernel_layout(view, xp, y)
            launches(name, grid, block, (dyk, xk, yk, mean, partials) + sizes)
        launches('bn_bwd_finalize', *self.finalize, args=(
            partials, inv_std, gamma, dmean, dvar, dgamma, dbeta, coef) + self.finalize_sizes)
        if self.dx_blocks:
            operands = (dyk, xk, mean, coef, dx) if y is None else (dyk, xk, yk, mean, coef, dx)
            launches(self.dx_kernel, self.dx_blocks, BN_THREADS, operands + self.dx_sizes)
        if self.reshape_stats:
            dgamma, dbeta = dgamma.reshape(self.kept), dbeta.reshape(self.kept)
        return (dx if view.permutation is None else view.from_kernel(xp, dx)), dgamma, dbeta
