"""Launchers for pooling.cu: max and average pooling, forward and backward, 1 to 3 spatial dims.

Same names and signatures as gpuk/cpu_fallback/pooling.py, plus a keyword-only `runtime`
(None: runtime.current(); 'cuda', 'emulate', or a runtime object). Arguments are checked
with the twin's own helpers, so errors read the same and come before any launch.
On the CUDA runtime each call goes through ``dispatch.run('pooling', ...)``, which may pick
the cuDNN path in gpuk/kernels/cudnn/pooling.py (``GPUK_KERNELS=pooling=cudnn|auto``).

Which kernel runs: max/avg forward -> max_pool_fwd / avg_pool_fwd (channels-last with
C % (16 / itemsize) == 0 uses 16-byte channel loads); average pooling whose window is the
whole input without padding -> a reduction kernel (global_avg_pool_*); avg and max backward
-> gather kernels (no atomics: deterministic, subnormals kept). Max pooling's argmax is the
winner's tap in its window, uint8 for windows of at most 256 taps, int32 beyond
(pooling_checks.tap_dtype; the *_u8 / *_i32 kernels). No call reads anything back to the host.
"""
import functools
import math
from pathlib import Path

import numpy as np

from gpuk.contracts import conv_checks
from gpuk.contracts import pooling_checks
from gpuk.contracts.dtypes import ELEMENT_TYPES, FLOAT_DTYPES_NO_BFLOAT16, accumulation_dtype
from gpuk.contracts.geometry import MAX_GRID_YZ
from . import dispatch
from .cudnn import pooling as cudnn_pooling
from .runtime import prepared, register_build, resolve

__all__ = ['max_pool_fwd', 'max_pool_bwd', 'avg_pool_fwd', 'avg_pool_bwd', 'max_pool_fwd_runner', 'max_pool_bwd_runner',
           'avg_pool_fwd_runner', 'avg_pool_bwd_runner']

SOURCE = Path(__file__).with_name('pooling.cu')
# Tile constants: passed to the .cu as #defines and used for the grids below (one place).
POOL_THREADS = 256
POOL_MAX_BLOCKS = 65535
POOL_MAX_BATCH_BLOCKS = MAX_GRID_YZ   # grid y strides the batch
GLOBAL_POOL_THREADS = 256
GLOBAL_POOL_ROWS = 8
GLOBAL_POOL_MAX_BATCH_BLOCKS = MAX_GRID_YZ
LAYOUT_CHANNELS_FIRST, LAYOUT_CHANNELS_LAST, LAYOUT_CHANNELS_LAST_VEC = 0, 1, 2
KERNELS = ['max_pool_fwd_u8', 'max_pool_fwd_i32', 'avg_pool_fwd', 'avg_pool_bwd', 'max_pool_bwd_u8',
           'max_pool_bwd_i32', 'global_avg_pool_rows', 'global_avg_pool_channels_last']


def defines(dtype):
    return {'ELEMENT_T': ELEMENT_TYPES[np.dtype(dtype)], 'ACC_T': ELEMENT_TYPES[accumulation_dtype(dtype)],
            'POOL_THREADS': POOL_THREADS,
            'GLOBAL_POOL_THREADS': GLOBAL_POOL_THREADS, 'GLOBAL_POOL_ROWS': GLOBAL_POOL_ROWS}


# Every variant builds without spills (POOL_MIN_BLOCKS in pooling.cu says why it is needed).
for _dtype in FLOAT_DTYPES_NO_BFLOAT16:
    register_build(SOURCE, defines(_dtype), KERNELS)


def _blocks(work_items, threads, max_blocks=POOL_MAX_BLOCKS):
    return max(1, min(-(-work_items // threads), max_blocks))


def _batch_grid(per_sample, n):
    """(x, y) grid of the window kernels: x covers one sample, y strides the batch."""
    return _blocks(per_sample, POOL_THREADS), max(1, min(n, POOL_MAX_BATCH_BLOCKS))


def _float_array(fn, name, value, xp):
    """The twin's check (float dtype, no zero-size dim) on arrays of the runtime's xp."""
    array = value if isinstance(value, xp.ndarray) else xp.asarray(value)
    if array.dtype.kind != 'f' or array.dtype not in FLOAT_DTYPES_NO_BFLOAT16:
        raise TypeError('%s: %s must be a float16, float32 or float64 array, got dtype %s'
                        % (fn, name, array.dtype))
    if array.size == 0:
        raise ValueError('%s: %s must not have a zero-size dimension, got shape %s'
                         % (fn, name, array.shape))
    return xp.ascontiguousarray(array)


def vector_width(dtype):
    """Channels per 16-byte load in the vectorized channels-last path."""
    return 16 // np.dtype(dtype).itemsize


def layout_code(channels_first, channels, dtype):
    if channels_first:
        return LAYOUT_CHANNELS_FIRST
    return LAYOUT_CHANNELS_LAST_VEC if channels % vector_width(dtype) == 0 else LAYOUT_CHANNELS_LAST


def geometry_args(n, channels, in_spatial, out_spatial, window, strides, pads):
    """The 17 int32 geometry arguments: n, c, then (d, h, w) of input, output, window,
    stride and leading pad, a 1-d or 2-d problem lifted with leading size-1 dims."""
    lift = 3 - len(in_spatial)
    values = [n, channels]
    for per_dim, fill in ((in_spatial, 1), (out_spatial, 1), (window, 1), (strides, 1),
                          (tuple(b for b, _ in pads), 0)):
        values.extend((fill,) * lift + tuple(per_dim))
    per_sample = channels * max(math.prod(in_spatial), math.prod(out_spatial))
    if max(values + [per_sample]) >= 2**31:
        raise ValueError('pooling: %d elements per sample (or a dimension) do not fit the kernels\' 32-bit '
                         'indexing; the limit is 2^31 - 1' % max(values + [per_sample]))
    return tuple(np.int32(v) for v in values)


class _Problem:
    """A checked pooling problem: layout, spatial sizes and the kernel geometry."""

    def __init__(self, n, channels, channels_first, in_spatial, out_spatial, window, strides, pads, dtype):
        self.n, self.channels, self.channels_first = n, channels, channels_first
        self.in_spatial, self.out_spatial = tuple(in_spatial), tuple(out_spatial)
        self.window, self.strides, self.pads, self.dtype = window, strides, pads, np.dtype(dtype)
        self.layout = layout_code(channels_first, channels, dtype)
        self.geometry = geometry_args(n, channels, in_spatial, out_spatial, window, strides, pads)
        # what the launches derive from the problem alone, once (not per call)
        self.in_shape, self.out_shape = self.shape(self.in_spatial), self.shape(self.out_spatial)
        self.tap_dtype = pooling_checks.tap_dtype(window)
        self.tap_suffix = _tap_suffix(window)
        self.geometry_and_layout = self.geometry + (np.int32(self.layout),)
        lane = vector_width(dtype) if self.layout == LAYOUT_CHANNELS_LAST_VEC else 1
        per = max(n, 1)   # (the checks refuse an empty batch)
        self.out_grid = _batch_grid(math.prod(self.out_shape) // lane // per, n)   # over y (vector lanes)
        self.in_grid = _batch_grid(math.prod(self.in_shape) // lane // per, n)     # over dx (vector lanes)
        self._keys = {}

    @property
    def is_global(self):
        """Window == whole input and no padding: a plain reduction."""
        return self.window == self.in_spatial and not any(b or a for b, a in self.pads)

    def shape(self, spatial):
        if self.channels_first:
            return (self.n, self.channels) + tuple(spatial)
        return (self.n,) + tuple(spatial) + (self.channels,)

    def key(self, op):
        key = self._keys.get(op)
        if key is None:
            key = self._keys[op] = (op, self.dtype, self.channels_first, self.n, self.channels, self.in_spatial,
                                    self.window, self.strides, self.pads)
        return key


def _problem(setup, dtype, rt):
    """The _Problem of a pooling_checks.PoolSetup, with its kernel launches (kept with it)."""
    problem = _Problem(setup.x_shape[0], conv_checks.channel_count(setup.x_shape, setup.channels_first),
                    setup.channels_first, setup.in_spatial, setup.out_spatial, setup.window, setup.strides,
                    setup.pads, dtype)
    problem.launches = prepared.Launches(rt, SOURCE, defines(dtype))
    return problem


def _tap_suffix(window):
    """The kernel-name suffix of the argmax dtype: '_u8' or '_i32'."""
    return '_u8' if pooling_checks.tap_dtype(window) == np.uint8 else '_i32'


# ---------------------------------------------------------------- forward

def max_pool_fwd(x, window, strides, pads, data_format, *, runtime=None):
    """Max pooling -> (y, argmax); argmax (shaped like y, uint8 up to 256 window taps, int32
    beyond) is the winner's row-major tap in its window, the first one winning ties."""
    return max_pool_fwd_runner(x, window, strides, pads, data_format, runtime=runtime)(x)


def max_pool_fwd_runner(x, window, strides, pads, data_format, *, runtime=None):
    """``run(x)``, max_pool_fwd with this geometry for an x of the type, shape and dtype of this
    one: checked and set up once per problem signature (runtime/prepared.py); a MaxPool plan
    step keeps it (prepared.Kept)."""
    return _fwd_runner('max_pool_fwd', 'max_fwd', _max_pool_fwd_gpuk, cudnn_pooling.max_pool_fwd, x, window, strides,
                       pads, data_format, runtime)


def _fwd_runner(fn, op, gpuk_impl, cudnn_impl, x, window, strides, pads, data_format, runtime):
    """The forward runner of max and average pooling: ``fn`` the K function, ``op`` the
    prepared key's op, ``gpuk_impl(rt, problem, x, *geometry)`` gpuk's kernels, ``cudnn_impl``
    cuDNN's."""
    rt = resolve(runtime)
    xp = rt.xp

    def prepare():
        checked = _float_array(fn, 'x', x, xp)
        problem = _problem(pooling_checks.forward_setup(fn, checked, window, strides, pads, data_format),
                           checked.dtype, rt)
        key, geometry, contiguous = problem.key(op), (problem.window, problem.strides, problem.pads), \
            _contiguous(xp)
        dtypes = (checked.dtype, problem.tap_dtype) if op == 'max_fwd' else (checked.dtype,)   # y[, argmax]
        outputs = prepared.Outputs(xp.empty, [problem.out_shape] * len(dtypes), dtypes)

        def run_with(make_outputs):
            gpuk_fn = functools.partial(gpuk_impl, rt, problem, make_outputs)

            def run(x):
                return dispatch.run(rt, 'pooling', key, gpuk_fn, cudnn_impl, contiguous(x), *geometry, data_format)
            return run
        return prepared.with_step_buffers(run_with, outputs)
    return prepared.get(rt, fn, (x,), (window, strides, pads, data_format), prepare)


def _contiguous(xp):
    """A checked argument as a contiguous array of the runtime's xp (converted per call: the
    checks ran on it once per signature)."""
    array_type = xp.ndarray
    return lambda value: xp.ascontiguousarray(value if type(value) is array_type else xp.asarray(value))


def _max_pool_fwd_gpuk(rt, problem, outputs, x, *_geometry):
    y, argmax = outputs()
    problem.launches('max_pool_fwd' + problem.tap_suffix, problem.out_grid, POOL_THREADS,
                     (x, y, argmax) + problem.geometry_and_layout)
    return y, argmax


def avg_pool_fwd(x, window, strides, pads, data_format, *, runtime=None):
    """Average pooling over the real inputs of each window (padding excluded)."""
    return avg_pool_fwd_runner(x, window, strides, pads, data_format, runtime=runtime)(x)


def avg_pool_fwd_runner(x, window, strides, pads, data_format, *, runtime=None):
    """``run(x)``, avg_pool_fwd with this geometry for an x of the type, shape and dtype of this
    one: checked and set up once per problem signature (runtime/prepared.py); an AvgPool plan
    step keeps it (prepared.Kept)."""
    return _fwd_runner('avg_pool_fwd', 'avg_fwd', _avg_pool_fwd_gpuk, cudnn_pooling.avg_pool_fwd, x, window, strides,
                       pads, data_format, runtime)


def _avg_pool_fwd_gpuk(rt, problem, outputs, x, *_geometry):
    y, = outputs()
    if problem.is_global:
        _global_avg_pool(problem, x, y)
        return y
    problem.launches('avg_pool_fwd', problem.out_grid, POOL_THREADS, (x, y) + problem.geometry_and_layout)
    return y


def _global_avg_pool(problem, x, y):
    volume = math.prod(problem.in_spatial)
    if problem.channels_first:
        rows = problem.n * problem.channels
        warps_per_block = GLOBAL_POOL_THREADS // 32
        problem.launches('global_avg_pool_rows', _blocks(rows, warps_per_block), GLOBAL_POOL_THREADS,
                         (x, y, np.int64(rows), np.int64(volume)))
    else:
        grid = (-(-problem.channels // 32), min(problem.n, GLOBAL_POOL_MAX_BATCH_BLOCKS))
        problem.launches('global_avg_pool_channels_last', grid, (32, GLOBAL_POOL_ROWS),
                         (x, y, np.int64(problem.n), np.int64(volume), np.int64(problem.channels)))


# ---------------------------------------------------------------- backward

def avg_pool_bwd(dy, x_shape, window, strides, pads, data_format, *, runtime=None):
    """Gradient of avg_pool_fwd with respect to x."""
    return avg_pool_bwd_runner(dy, x_shape, window, strides, pads, data_format, runtime=runtime)(dy)


def avg_pool_bwd_runner(dy, x_shape, window, strides, pads, data_format, *, runtime=None):
    """``run(dy)``, avg_pool_bwd with this x_shape and geometry for a dy of the type, shape and
    dtype of this one: checked and set up once per problem signature (runtime/prepared.py); an
    AvgPoolBwd plan step keeps it (prepared.Kept)."""
    fn = 'avg_pool_bwd'
    rt = resolve(runtime)
    xp = rt.xp

    def prepare():   # once per problem signature (runtime/prepared.py)
        checked = _float_array(fn, 'dy', dy, xp)
        setup = pooling_checks.avg_backward_setup(fn, checked, x_shape, window, strides, pads, data_format)
        problem = _problem(setup, checked.dtype, rt)
        layout = LAYOUT_CHANNELS_FIRST if problem.channels_first else LAYOUT_CHANNELS_LAST
        grid, tail = _batch_grid(math.prod(problem.in_shape) // problem.n, problem.n), problem.geometry + (
            np.int32(layout),)   # dx element by element: no vector lanes
        key, geometry, contiguous = problem.key('avg_bwd'), (setup.x_shape, setup.window, setup.strides,
                                                             setup.pads), _contiguous(xp)

        def run_with(make_outputs):
            gpuk_fn = functools.partial(_avg_pool_bwd_gpuk, problem, make_outputs, grid, tail)

            def run(dy):
                return dispatch.run(rt, 'pooling', key, gpuk_fn, cudnn_pooling.avg_pool_bwd, contiguous(dy),
                                    *geometry, data_format)
            return run
        return prepared.with_step_buffers(run_with, prepared.Outputs(xp.empty, [problem.in_shape], [checked.dtype]))
    return prepared.get(rt, fn, (dy,), (x_shape, window, strides, pads, data_format), prepare)


def _avg_pool_bwd_gpuk(problem, outputs, grid, tail, dy, *_geometry):
    dx, = outputs()
    problem.launches('avg_pool_bwd', grid, POOL_THREADS, (dy, dx) + tail)
    return dx


def max_pool_bwd(dy, argmax, x_shape, window, strides, pads, data_format, *, runtime=None):
    """Gradient of max_pool_fwd: dy added at the winners (argmax: window taps) of dx, gathered
    per dx element in output order (bit for bit the twin's order)."""
    return max_pool_bwd_runner(dy, argmax, x_shape, window, strides, pads, data_format, runtime=runtime)(dy, argmax)


def max_pool_bwd_runner(dy, argmax, x_shape, window, strides, pads, data_format, *, runtime=None):
    """``run(dy, argmax)``, max_pool_bwd with this x_shape and geometry for arrays of the types,
    shapes and dtypes of these: checked and set up once per problem signature
    (runtime/prepared.py); a MaxPoolBwd plan step keeps it (prepared.Kept)."""
    fn = 'max_pool_bwd'
    rt = resolve(runtime)
    xp = rt.xp

    def prepare():   # once per problem signature (runtime/prepared.py)
        checked = _float_array(fn, 'dy', dy, xp)
        taps = argmax if isinstance(argmax, xp.ndarray) else xp.asarray(argmax)
        setup = pooling_checks.max_backward_setup(fn, checked, taps, x_shape, window, strides, pads, data_format)
        problem = _problem(setup, checked.dtype, rt)
        key, geometry, contiguous = problem.key('max_bwd'), (setup.x_shape, setup.window, setup.strides,
                                                             setup.pads), _contiguous(xp)
        array_type, tap_dtype = xp.ndarray, problem.tap_dtype

        def run_with(make_outputs):
            gpuk_fn = functools.partial(_max_pool_bwd_gpuk, rt, problem, make_outputs)

            def run(dy, argmax):
                # taps of another integer dtype (a caller's own array) become the kernels' dtype on the device
                taps = xp.ascontiguousarray(argmax if type(argmax) is array_type else xp.asarray(argmax),
                                            dtype=tap_dtype)
                return dispatch.run(rt, 'pooling', key, gpuk_fn, cudnn_pooling.max_pool_bwd, contiguous(dy), taps,
                                    *geometry, data_format)
            return run
        return prepared.with_step_buffers(run_with, prepared.Outputs(xp.empty, [problem.in_shape], [checked.dtype]))
    return prepared.get(rt, fn, (dy, argmax), (x_shape, window, strides, pads, data_format), prepare)


def _max_pool_bwd_gpuk(rt, problem, outputs, dy, argmax, *_geometry):
    dx, = outputs()
    problem.launches('max_pool_bwd' + problem.tap_suffix, problem.in_grid, POOL_THREADS,
                     (dy, argmax, dx) + problem.geometry_and_layout)
    return dx
