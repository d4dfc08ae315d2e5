"""Launchers of the convolution kernels: implicit GEMM (conv_igemm.cu; on sm_90 devices
conv_wgmma.cu where conv/wgmma.py says it applies), depthwise (conv_depthwise.cu) and locally
connected (conv_local.cu).

Same names and signatures as gpuk/cpu_fallback/conv.py, plus a keyword-only `runtime`
(None: runtime.current(); 'cuda', 'emulate' or a runtime object). conv_fwd also takes
keyword-only ``epilogue=None|'bias'|'bias_relu'`` and ``bias=`` (a fused bias + relu).
Bad input raises the twin's errors before any launch (the checks are the twin's own).

conv_fwd / conv_dgrad / conv_wgrad go through ``dispatch.run('conv', ...)`` on the CUDA
runtime, so ``GPUK_KERNELS=conv=cudnn|auto`` picks cuDNN Frontend instead. The
implicit-GEMM kernels run channels_last: a channels_first problem is transposed to it on
the way in and its result back on the way out (layout.cu; a channels_first load of the
GEMM's channel dimension would stride a whole plane per element). The fused bias/ReLU
epilogue stays in the kernel. Every problem is lifted to 3 spatial dims.
"""
import math
from collections import namedtuple
from pathlib import Path

import ml_dtypes
import numpy as np

from gpuk import config
from gpuk.cpu_fallback import conv as twin
from gpuk.contracts import conv_checks
from gpuk.contracts.geometry import MAX_GRID_YZ
from .. import dispatch, layout
from ..cudnn import conv as cudnn_conv
from . import tiles as conv_tiles
from . import split_k
from . import wgmma as conv_wgmma
from .geometry import (Geometry, check_gemm, dgrad_phase_rows, fwd_gemm_shape, kernel_args, wgrad_decode_args,
                       wgrad_gemm_shape)
from .direct import (depthwise_conv_dgrad, depthwise_conv_fwd, depthwise_conv_wgrad,  # noqa: F401
                     depthwise_conv_dgrad_runner, depthwise_conv_fwd_runner, depthwise_conv_wgrad_runner,
                     local_conv_dgrad, local_conv_fwd, local_conv_wgrad)
from gpuk.contracts.dtypes import c_types
from .direct import lift3
from ..runtime import prepared, register_build, resolve

__all__ = list(twin.__all__)

IGEMM_SOURCE = Path(__file__).with_name('conv_igemm.cu')
EPILOGUES = {None: 0, 'bias': 1, 'bias_relu': 2}
_TABLE_DTYPES = {'ffma': np.float32, 'tf32': np.float32, 'ffma64': np.float64, 'f16': np.float16,
                 'bf16': ml_dtypes.bfloat16}


def igemm_defines(dtype, tile):
    dtype = np.dtype(dtype)
    kernels = igemm_kernels(tile)
    element_t, acc_t = c_types(dtype)
    dynamic = conv_tiles.dynamic_smem(tile, dtype)
    return {'ELEMENT_T': element_t, 'ACC_T': acc_t,
            'CONV_MATH': conv_tiles.MATH_CODES[tile.math], 'CONV_BM': tile.bm, 'CONV_BN': tile.bn,
            'CONV_BK': tile.bk, 'CONV_TM': tile.tm, 'CONV_TN': tile.tn, 'CONV_WARPS_M': tile.warps_m,
            'CONV_WARPS_N': tile.warps_n, 'CONV_THREADS': tile.threads, 'CONV_STAGES': tile.stages,
            'REDUCE_THREADS': split_k.REDUCE_THREADS,
            # stage rings past the static limit (tiles.dynamic_smem): the kernel checks the size
            **({'CONV_DYNAMIC_SMEM': dynamic} if dynamic else {}),
            **({'CONV_KERNELS': sum(_KERNEL_BITS[k] for k in kernels)} if kernels != _ALL_KERNELS else {})}


_KERNEL_BITS = {'conv_igemm_fwd': 1, 'conv_igemm_dgrad': 2, 'conv_igemm_wgrad': 4}   # conv_igemm.cu's CONV_KERNEL_*
_ALL_KERNELS = tuple(_KERNEL_BITS)


def igemm_kernels(tile):
    """The conv kernels ``tile``'s build compiles (the others trap): the forward only for
    tiles.FWD_ONLY, wgrad only for tiles.WGRAD_ONLY, else all three."""
    if tile in conv_tiles.FWD_ONLY.get(tile.math, ()):
        return ('conv_igemm_fwd',)
    if tile in conv_tiles.WGRAD_ONLY.get(tile.math, ()):
        return ('conv_igemm_wgrad',)
    return _ALL_KERNELS


def _rounds_filter(tile, kernels):
    """Whether ``tile``'s fwd / dgrad read the filter pre-rounded by conv_round_tf32 (tf32: conv_igemm.cu,
    Tf32Rounding), so that its build has that kernel."""
    return tile.math == 'tf32' and any(k in kernels for k in ('conv_igemm_fwd', 'conv_igemm_dgrad'))


# every tile of the tables, the forward's (tf32 BK=32) and wgrad's (16-bit rectangles) own ones too
for _tables in (conv_tiles.TILES, conv_tiles.FWD_ONLY, conv_tiles.WGRAD_ONLY):
    for _table, _tiles in _tables.items():
        for _tile in _tiles:
            _kernels = igemm_kernels(_tile)
            register_build(IGEMM_SOURCE, igemm_defines(_TABLE_DTYPES[_table], _tile),
                           list(_kernels) + (['conv_reduce_splits'] if 'conv_igemm_wgrad' in _kernels else [])
                           + (['conv_round_tf32'] if _rounds_filter(_tile, _kernels) else []))


# ---------------------------------------------------------------- checks (the twin's, on shapes)

def _geometry(s):
    """The kernels' Geometry (3-d, channels-last flag) of the checked ConvShapes."""
    return Geometry(s.batch, s.c_in, s.c_out, lift3(s.in_spatial, 1), lift3(s.out_spatial, 1),
                    lift3(s.kernel_spatial, 1), lift3(s.strides, 1), lift3(s.dilation, 1),
                    lift3([b for b, _ in s.pads], 0), not s.channels_first)


def _check_epilogue(fn, epilogue, bias, c_out, dtype, xp):
    if epilogue not in EPILOGUES:
        raise ValueError("%s: epilogue must be None, 'bias' or 'bias_relu', got %r" % (fn, epilogue))
    if epilogue is None:
        if bias is not None:
            raise ValueError("%s: bias is only used with epilogue='bias' or 'bias_relu', got epilogue=None" % fn)
        return None
    if not isinstance(bias, xp.ndarray):
        raise TypeError('%s: bias must be a %s.ndarray of shape (%d,) with epilogue=%r, got %s'
                        % (fn, xp.__name__, c_out, epilogue, type(bias).__name__))
    if bias.shape != (c_out,):
        raise ValueError('%s: bias must have shape (%d,) (C_out), got %s' % (fn, c_out, tuple(bias.shape)))
    if bias.dtype != dtype:
        raise TypeError('%s: bias.dtype must equal x.dtype (%s), got %s' % (fn, dtype, bias.dtype))
    return xp.ascontiguousarray(bias)


# ---------------------------------------------------------------- launches

def _kernel_shape(g, spatial, channels):
    """The shape of a lifted (N, spatial, C) tensor as the kernels write it: channels_last, lifted
    dims kept (a channels_first problem's result is transposed back by Problem.from_kernel_layout)."""
    return (g.batch, *spatial, channels)


def _chunk_elements(dtype):
    """Elements per 16-byte chunk (VEC in conv_igemm.cu)."""
    return 16 // np.dtype(dtype).itemsize


_NO_BIAS = {}


def _no_bias(xp, dtype):
    """The bias argument of an epilogue-free launch (never read): one array per (xp, dtype),
    not a fresh allocation and fill per call."""
    key = (xp.__name__, np.dtype(dtype))
    if key not in _NO_BIAS:
        _NO_BIAS[key] = xp.zeros(1, dtype)
    return _NO_BIAS[key]


# ---------------------------------------------------------------- prepared launches
# A convolution's checks and launch set-up are kept per problem signature (runtime/prepared.py,
# with the precision policy among the parameters): a repeated problem (every step of a training
# loop) skips the checks, the tile choice, the grid and the scalar arguments and goes straight
# to the kernel handle.
# Each Launch keeps its kernel launch (rt.kernel_launch: on the CUDA runtime the loaded kernel
# with its grid checked; the emulated runtime's loads the module per call, since it swaps in
# instrumented builds when its sanitizer or counters are switched on).
# round_filter: fwd / dgrad under tf32 (conv_igemm.cu, Tf32Rounding) take w rounded by this
# conv_round_tf32 launch (_kernel_filter); None elsewhere.
Launch = namedtuple('Launch', 'scalars run round_filter')


class Problem:
    """A checked convolution problem: its geometry, output shape, dispatch key, and the
    launches prepared for it (per conv_tiles.forced_state(), which tests change)."""

    def __init__(self, g, shape, key):
        self.g, self.shape, self.key = g, shape, key
        self.launches = {}
        self._wgmma_fits = {}
        self._runner = None
        # The kernels see the problem channels_last; channels_first arrays are transposed
        # around them (to_kernel_layout / from_kernel_layout).
        self.kernel_g = g._replace(channels_last=True)

    def launch(self, make, path='igemm'):
        """The launch make(kernel geometry) prepared for this problem on `path` ('igemm', or
        conv/wgmma.py's launch_key(): 'wgmma' and the tile it forces), once per forced tile /
        split state. The launch keeps the tile chosen for the problem."""
        key = (path,) + conv_tiles.forced_state()
        found = self.launches.get(key)
        if found is None:
            found = self.launches[key] = make(self.kernel_g)
        return found

    def runner(self, make):
        """``make()``, this problem's runner (conv_*_runner): made on its first call, kept with it."""
        found = self._runner
        if found is None:
            found = self._runner = make()
        return found

    def wgmma_fits(self, op, dtype):
        """Whether this problem has what conv_wgmma.cu's `op` kernel ('fwd', 'dgrad', 'wgrad')
        needs (conv/wgmma.py FITS), decided on its first call: the dtype and the precision
        policy are part of the problem's signature."""
        found = self._wgmma_fits.get(op)
        if found is None:
            found = self._wgmma_fits[op] = conv_wgmma.FITS[op](self.g, dtype, config.precision())
        return found

    def to_kernel_layout(self, rt, *arrays):
        """The activation arrays (x, dy) as the kernels read them: channels_last."""
        if self.g.channels_last:
            return arrays
        return tuple(layout.to_channels_last(a, runtime=rt) for a in arrays)

    def from_kernel_layout(self, rt, out):
        """A kernel's (lifted, channels_last) activation result in the problem's layout."""
        return out if self.g.channels_last else layout.to_channels_first(out, runtime=rt)


def _prepared(rt, kind, arrays, params, prepare):
    """The Problem of these arrays and parameters (runtime/prepared.py: prepare() once per signature)."""
    return prepared.get(rt, 'conv_' + kind, arrays, (config.precision(),) + params, prepare)


# conv_igemm.cu's kernels without the tile's stage ring: launched without its dynamic shared memory
_NO_STAGE_RING = ('conv_reduce_splits', 'conv_round_tf32')


def _kernel_launch(rt, dtype, tile, name, grid, threads):
    shared = 0 if name in _NO_STAGE_RING else conv_tiles.dynamic_smem(tile, dtype)
    return rt.kernel_launch(IGEMM_SOURCE, igemm_defines(dtype, tile), name, grid, threads, shared)


def _filter_rounding(rt, g, dtype, tile):
    """The conv_round_tf32 launch over the filter (taps x C_in x C_out) of ``tile``'s module, or None
    when the tile rounds nothing ahead (not tf32)."""
    if tile.math != 'tf32':
        return None
    count = math.prod(g.k_sp) * g.c_in * g.c_out
    run = _kernel_launch(rt, dtype, tile, 'conv_round_tf32', split_k.grid_stride_blocks(count),
                         split_k.REDUCE_THREADS)
    return lambda w, rounded: run((w, rounded, np.int64(count)))


def _kernel_filter(xp, launch, w):
    """w as the launch's kernel reads it: contiguous, and rounded to tf32 where the launch says so."""
    w = xp.ascontiguousarray(w)
    if launch.round_filter is None:
        return w
    rounded = xp.empty_like(w)
    launch.round_filter(w, rounded)
    return rounded


def _fwd_launch(rt, g, dtype, epilogue):
    rows, cols, depth = fwd_gemm_shape(g)
    check_gemm('conv_fwd', g, rows, cols, depth)
    tile = conv_tiles.choose_tile(dtype, config.precision(), rows, cols, depth, fwd=True,
                                  aligned=g.c_in % _chunk_elements(dtype) == 0)
    grid = (math.ceil(rows / tile.bm), math.ceil(cols / tile.bn))
    return Launch(kernel_args(g) + (np.int32(EPILOGUES[epilogue]),),
                  _kernel_launch(rt, dtype, tile, 'conv_igemm_fwd', grid, tile.threads),
                  _filter_rounding(rt, g, dtype, tile))


def _dgrad_launch(rt, g, dtype):
    """dgrad runs one sub-convolution per stride phase (conv_igemm.cu, DgradPhase): grid z is the
    phase, grid x covers the largest phase (phase 0: ceil(in / s) pixels per dim)."""
    rows, cols, depth = g.batch * math.prod(g.in_sp), g.c_in, math.prod(g.k_sp) * g.c_out
    check_gemm('conv_dgrad', g, rows, cols, depth)
    phases = math.prod(g.strides)
    if phases > MAX_GRID_YZ:
        raise ValueError('conv_dgrad: the product of the strides must be at most %d (one block row per stride '
                         'phase), got strides %s' % (MAX_GRID_YZ, tuple(g.strides)))
    phase_rows = dgrad_phase_rows(g)
    tile = conv_tiles.choose_tile(dtype, config.precision(), phase_rows * phases, cols,
                                  math.ceil(depth / phases), aligned=g.c_out % _chunk_elements(dtype) == 0)
    grid = (math.ceil(phase_rows / tile.bm), math.ceil(cols / tile.bn), phases)
    return Launch(kernel_args(g),
                  _kernel_launch(rt, dtype, tile, 'conv_igemm_dgrad', grid, tile.threads),
                  _filter_rounding(rt, g, dtype, tile))


def _wgrad_launch(rt, g, dtype):
    rows, cols, depth = wgrad_gemm_shape(g)
    check_gemm('conv_wgrad', g, rows, cols, depth)
    tile = conv_tiles.choose_tile(dtype, config.precision(), rows, cols, depth, wgrad=True,
                                  aligned=g.c_in % _chunk_elements(dtype) == 0)
    grid, per_split = split_k.plan(tile, rows, cols, depth)
    return split_k.wgrad_launch(
        _kernel_launch(rt, dtype, tile, 'conv_igemm_wgrad', grid, tile.threads),
        kernel_args(g) + (np.int64(per_split),) + wgrad_decode_args(g), grid[2], rows * cols,
        lambda blocks: _kernel_launch(rt, dtype, tile, 'conv_reduce_splits', blocks, split_k.REDUCE_THREADS))


def _problem_key(*parts):
    return tuple(tuple(p.shape) + (str(p.dtype),) if hasattr(p, 'shape') else p for p in parts)


def _gradient_problem(rt, kind, checks, a, b, shape, strides, dilation, pads, data_format):
    """The prepared Problem of conv_dgrad / conv_wgrad ('dgrad' / 'wgrad'): inputs a, b and the
    shape of the result, checked by conv_checks.<kind>_problem."""
    def prepare():
        _, _, checked_shape, shapes = checks('conv_' + kind, a, b, shape, strides, dilation, pads, data_format,
                                             rt.xp)
        return Problem(_geometry(shapes), checked_shape,
                       _problem_key(kind, a, b, checked_shape, strides, dilation, pads, data_format))

    return _prepared(rt, kind, (a, b), (shape, strides, dilation, pads, data_format), prepare)


# ---------------------------------------------------------------- runners
# A conv plan step keeps its last problem's runner (prepared.Kept in gpuk/ops/conv.py): ``run``
# compares the switches its launches depend on (the precision policy, and the tile and wgmma
# switches tests force) with those its kernel call was made under, then goes to dispatch.run and
# that call, which does only the per-call array work: the wgmma path's 16-byte alignment check
# (it reads pointers), layout transposes, contiguity, the output, the launch.

def _switches():
    """The precision policy, then what conv/tiles.py's and conv/wgmma.py's ``forced()`` set
    (read in place: this runs per call)."""
    tiles, wgmma = conv_tiles._forced, conv_wgmma._forced
    return config.precision(), tiles['tile'], tiles['splits'], wgmma['on'], wgmma['tile']


def _runner(rt, problem, make_kernel_call, output, cudnn_fn, geometry, again):
    """``run(*arrays)`` of a prepared Problem: dispatch.run(kernel call, cudnn_fn, *arrays,
    *geometry). The kernel call (``make_kernel_call(make_output)``: the wgmma-or-igemm choice and
    launches of the Problem, writing the result into ``make_output()``, an array of ``output``'s
    (shape, dtype)) is remade when the tile /
    wgmma switches change; under another precision policy the call is another problem's
    (``again(*arrays)``: the launcher, with its checks). A plan step's variant writes the result
    into the step's reused buffer (prepared.with_step_buffers); the run a Problem keeps for every
    caller allocates it."""
    precision, key = _switches()[0], problem.key

    def run_with(make_outputs):
        made = [(None, None)]   # (switches, kernel call): replaced in one assignment
        make_output = lambda: make_outputs()[0]   # noqa: E731

        def run(*arrays):
            switches = _switches()
            if switches[0] != precision:
                return again(*arrays)
            kept_switches, kernel_call = made[0]
            if switches != kept_switches:
                kernel_call = make_kernel_call(make_output)
                made[0] = switches, kernel_call
            return dispatch.run(rt, 'conv', key, kernel_call, cudnn_fn, *arrays, *geometry)
        return run
    return prepared.with_step_buffers(run_with, prepared.Outputs(rt.xp.empty, [output[0]], [output[1]]))


def _wgmma_active(rt, problem, op, dtype):
    """Whether `op` of this problem takes the wgmma path when its operands are 16-byte aligned
    (conv_wgmma.applies without the per-call alignment check)."""
    return conv_wgmma.applies(rt, problem.wgmma_fits(op, dtype))


def _fwd_kernel_call(rt, problem, dtype, epilogue, make_output):
    """kernel_call(x, w, bias, *geometry) of a conv_fwd runner under the current switches, y (in
    the kernels' layout) written into ``make_output()``."""
    xp, g, shape, code = rt.xp, problem.g, problem.shape, EPILOGUES[epilogue]
    wgmma, aligned16 = _wgmma_active(rt, problem, 'fwd', dtype), conv_wgmma._aligned16
    no_bias = _no_bias(xp, dtype)
    launches = {}

    def kernel_call(x, w, bias, *_geometry):
        bias = no_bias if bias is None else bias
        if wgmma and aligned16(x):   # Hopper: warpgroup MMA (conv/wgmma.py)
            try:
                launch = launches['wgmma']
            except KeyError:
                launch = launches['wgmma'] = problem.launch(lambda g: conv_wgmma.fwd_launch(rt, g, dtype, code),
                                                            conv_wgmma.launch_key())
            return conv_wgmma.conv_fwd(rt, x, w, make_output(), bias, launch).reshape(shape)
        try:
            launch = launches['igemm']
        except KeyError:
            launch = launches['igemm'] = problem.launch(lambda g: _fwd_launch(rt, g, dtype, epilogue))
        if not g.channels_last:
            x = layout.to_channels_last(x, runtime=rt)
        y = make_output()
        launch.run((xp.ascontiguousarray(x), _kernel_filter(xp, launch, w), bias, y, *launch.scalars))
        return problem.from_kernel_layout(rt, y).reshape(shape)
    return kernel_call


def _dgrad_kernel_call(rt, problem, dtype, make_output):
    """kernel_call(dy, w, *geometry) of a conv_dgrad runner under the current switches, dx (in the
    kernels' layout) written into ``make_output()``."""
    xp, g, shape = rt.xp, problem.g, problem.shape
    wgmma, aligned16 = _wgmma_active(rt, problem, 'dgrad', dtype), conv_wgmma._aligned16
    launches = {}

    def kernel_call(dy, w, *_geometry):
        if wgmma and aligned16(dy):   # Hopper: conv/wgmma.py
            try:
                launch = launches['wgmma']
            except KeyError:
                launch = launches['wgmma'] = problem.launch(lambda g: conv_wgmma.dgrad_launch(rt, g, dtype),
                                                            conv_wgmma.launch_key())
            return conv_wgmma.conv_dgrad(rt, dy, w, make_output(), launch).reshape(shape)
        try:
            launch = launches['igemm']
        except KeyError:
            launch = launches['igemm'] = problem.launch(lambda g: _dgrad_launch(rt, g, dtype))
        if not g.channels_last:
            dy = layout.to_channels_last(dy, runtime=rt)
        dx = make_output()
        launch.run((xp.ascontiguousarray(dy), _kernel_filter(xp, launch, w), dx, *launch.scalars))
        return problem.from_kernel_layout(rt, dx).reshape(shape)
    return kernel_call


def _wgrad_kernel_call(rt, problem, dtype, make_output):
    """kernel_call(x, dy, *geometry) of a conv_wgrad runner under the current switches, dw written
    into ``make_output()``."""
    xp, channels_last = rt.xp, problem.g.channels_last
    wgmma, aligned16 = _wgmma_active(rt, problem, 'wgrad', dtype), conv_wgmma._aligned16
    launches = {}

    def kernel_call(x, dy, *_geometry):
        if wgmma and aligned16(x) and aligned16(dy):   # Hopper: conv/wgmma.py
            try:
                launch = launches['wgmma']
            except KeyError:
                launch = launches['wgmma'] = problem.launch(lambda g: conv_wgmma.wgrad_launch(rt, g, dtype),
                                                            conv_wgmma.launch_key())
        else:
            try:
                launch = launches['igemm']
            except KeyError:
                launch = launches['igemm'] = problem.launch(lambda g: _wgrad_launch(rt, g, dtype))
            if not channels_last:
                x, dy = problem.to_kernel_layout(rt, x, dy)
        return split_k.run(xp, x, dy, make_output(), launch)
    return kernel_call


# ---------------------------------------------------------------- public functions

def conv_fwd(x, w, strides, dilation, pads, data_format, *, epilogue=None, bias=None, runtime=None):
    """Convolution (cross-correlation) of x with w -> y; optionally y + bias, relu(y + bias)."""
    return conv_fwd_runner(x, w, strides, dilation, pads, data_format, epilogue=epilogue, bias=bias,
                           runtime=runtime)(x, w, bias)


def conv_fwd_runner(x, w, strides, dilation, pads, data_format, *, epilogue=None, bias=None, runtime=None):
    """``run(x, w, bias=None)``, conv_fwd with this geometry and epilogue for arrays of the types,
    shapes and dtypes of these (``bias`` given or not as here): checked and set up once per
    problem signature (runtime/prepared.py); a ConvFwd plan step keeps it (prepared.Kept)."""
    rt = resolve(runtime)
    xp = rt.xp
    params = (strides, dilation, pads, data_format, epilogue, bias is None)

    def prepare():
        _, _, shapes = conv_checks.fwd_problem('conv_fwd', x, w, strides, dilation, pads, data_format, xp)
        g = _geometry(shapes)
        _check_epilogue('conv_fwd', epilogue, bias, g.c_out, x.dtype, xp)
        out_spatial = g.out_sp[3 - (x.ndim - 2):]
        y_shape = (x.shape[0], *out_spatial, g.c_out) if g.channels_last else (x.shape[0], g.c_out, *out_spatial)
        return Problem(g, y_shape, _problem_key('fwd', x, w, strides, dilation, pads, data_format, epilogue))

    problem = _prepared(rt, 'fwd', (x, w) if bias is None else (x, w, bias), params, prepare)
    dtype, channel_axis = x.dtype, -1 if problem.g.channels_last else 1

    def cudnn_fn(x, w, bias, *geometry):
        y = cudnn_conv.conv_fwd(x, w, *geometry)
        if epilogue is None:
            return y
        from .. import elementwise
        return elementwise.bias_act_fwd(y, bias, channel_axis, 'relu' if epilogue == 'bias_relu' else 'linear',
                                        runtime=rt)

    def again(x, w, bias=None):
        return conv_fwd(x, w, strides, dilation, pads, data_format, epilogue=epilogue, bias=bias, runtime=rt)

    def make():
        launch = _runner(rt, problem, lambda make_output: _fwd_kernel_call(rt, problem, dtype, epilogue, make_output),
                         (_kernel_shape(problem.g, problem.g.out_sp, problem.g.c_out), dtype), cudnn_fn,
                         (strides, dilation, pads, data_format), again)
        return prepared.reordered(launch, lambda x, w, bias=None: (x, w, None if bias is None
                                                                    else xp.ascontiguousarray(bias)))
    return problem.runner(make)


def conv_dgrad(dy, w, x_shape, strides, dilation, pads, data_format, *, runtime=None):
    """Gradient of conv_fwd with respect to x (also the forward of conv_transpose)."""
    return conv_dgrad_runner(dy, w, x_shape, strides, dilation, pads, data_format, runtime=runtime)(dy, w)


def conv_dgrad_runner(dy, w, x_shape, strides, dilation, pads, data_format, *, runtime=None):
    """``run(dy, w)``, conv_dgrad with this x_shape and geometry for arrays of the types, shapes
    and dtypes of these: checked and set up once per problem signature (runtime/prepared.py); a
    ConvDgrad plan step keeps it (prepared.Kept)."""
    return _gradient_runner('dgrad', dy, w, x_shape, strides, dilation, pads, data_format, runtime)


def conv_wgrad(x, dy, w_shape, strides, dilation, pads, data_format, *, runtime=None):
    """Gradient of conv_fwd with respect to w."""
    return conv_wgrad_runner(x, dy, w_shape, strides, dilation, pads, data_format, runtime=runtime)(x, dy)


def conv_wgrad_runner(x, dy, w_shape, strides, dilation, pads, data_format, *, runtime=None):
    """``run(x, dy)``, conv_wgrad with this w_shape and geometry for arrays of the types, shapes
    and dtypes of these: checked and set up once per problem signature (runtime/prepared.py); a
    ConvWgrad plan step keeps it (prepared.Kept)."""
    return _gradient_runner('wgrad', x, dy, w_shape, strides, dilation, pads, data_format, runtime)


_GRADIENT_KERNEL_CALLS = {'dgrad': _dgrad_kernel_call, 'wgrad': _wgrad_kernel_call}
# the shape the kernel call writes: dx in the kernels' layout, dw as it is
_GRADIENT_OUTPUT_SHAPES = {'dgrad': lambda problem: _kernel_shape(problem.g, problem.g.in_sp, problem.g.c_in),
                           'wgrad': lambda problem: problem.shape}


def _gradient_runner(kind, a, b, shape, strides, dilation, pads, data_format, runtime):
    """``run(a, b)`` of conv_dgrad (kind 'dgrad': a = dy, b = w, shape = x_shape) or conv_wgrad
    ('wgrad': a = x, b = dy, shape = w_shape): the prepared Problem's runner, its kernel call
    made by _dgrad_kernel_call / _wgrad_kernel_call, checked by conv_checks.dgrad_problem /
    wgrad_problem, cuDNN's conv_dgrad / conv_wgrad beside it (both looked up by name per problem,
    not bound at import, so a test's patch of conv_checks or cudnn_conv is seen)."""
    rt = resolve(runtime)
    kernel_call = _GRADIENT_KERNEL_CALLS[kind]
    problem = _gradient_problem(rt, kind, getattr(conv_checks, kind + '_problem'), a, b, shape, strides, dilation,
                                pads, data_format)
    dtype = a.dtype

    def again(a, b):   # under another precision policy: the launcher, with its checks
        return _gradient_runner(kind, a, b, shape, strides, dilation, pads, data_format, rt)(a, b)
    return problem.runner(lambda: _runner(rt, problem, lambda make_output: kernel_call(rt, problem, dtype, make_output),
                                          (_GRADIENT_OUTPUT_SHAPES[kind](problem), dtype),
                                          getattr(cudnn_conv, 'conv_' + kind),
                                          (problem.shape, strides, dilation, pads, data_format), again))
