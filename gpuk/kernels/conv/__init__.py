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
from .geometry import Geometry, check_gemm, dgrad_phase_rows, fwd_gemm_shape, kernel_args, wgrad_gemm_shape
from .direct import (depthwise_conv_dgrad, depthwise_conv_fwd, depthwise_conv_wgrad,  # noqa: F401
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
    element_t, acc_t = c_types(dtype)
    return {'ELEMENT_T': element_t, 'ACC_T': acc_t,
            'CONV_MATH': conv_tiles.MATH_CODES[tile.math], 'CONV_BM': tile.bm, 'CONV_BN': tile.bn,
            'CONV_BK': tile.bk, 'CONV_TM': tile.tm, 'CONV_TN': tile.tn, 'CONV_WARPS_M': tile.warps_m,
            'CONV_WARPS_N': tile.warps_n, 'CONV_THREADS': tile.threads, 'CONV_STAGES': tile.stages,
            'REDUCE_THREADS': split_k.REDUCE_THREADS}


for _table, _tiles in conv_tiles.TILES.items():
    for _tile in _tiles:
        register_build(IGEMM_SOURCE, igemm_defines(_TABLE_DTYPES[_table], _tile),
                       ['conv_igemm_fwd', 'conv_igemm_dgrad', 'conv_igemm_wgrad', 'conv_reduce_splits'])
for _table, _tiles in conv_tiles.WGRAD_ONLY.items():   # 16-bit wgrad's rectangular tiles
    for _tile in _tiles:
        register_build(IGEMM_SOURCE, igemm_defines(_TABLE_DTYPES[_table], _tile),
                       ['conv_igemm_wgrad', 'conv_reduce_splits'])


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
Launch = namedtuple('Launch', 'out_shape scalars run')


class Problem:
    """A checked convolution problem: its geometry, output shape, dispatch key, and the
    launches prepared for it (per conv_tiles.forced_state(), which tests change)."""

    def __init__(self, g, shape, key):
        self.g, self.shape, self.key = g, shape, key
        self.launches = {}
        self._wgmma_fits = {}
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


def _kernel_launch(rt, dtype, tile, name, grid, threads):
    return rt.kernel_launch(IGEMM_SOURCE, igemm_defines(dtype, tile), name, grid, threads)


def _fwd_launch(rt, g, dtype, epilogue):
    rows, cols, depth = fwd_gemm_shape(g)
    check_gemm('conv_fwd', g, rows, cols, depth)
    tile = conv_tiles.choose_tile(dtype, config.precision(), rows, cols, depth,
                                  aligned=g.c_in % _chunk_elements(dtype) == 0)
    grid = (math.ceil(rows / tile.bm), math.ceil(cols / tile.bn))
    return Launch(_kernel_shape(g, g.out_sp, g.c_out), kernel_args(g) + (np.int32(EPILOGUES[epilogue]),),
                  _kernel_launch(rt, dtype, tile, 'conv_igemm_fwd', grid, tile.threads))


def _igemm_fwd(x, w, problem, bias, epilogue, rt):
    xp = rt.xp
    bias_arg = bias if bias is not None else _no_bias(xp, x.dtype)
    if conv_wgmma.applies(rt, problem.wgmma_fits('fwd', x.dtype), x):   # Hopper: warpgroup MMA (conv/wgmma.py)
        launch = problem.launch(lambda g: conv_wgmma.fwd_launch(rt, g, x.dtype, EPILOGUES[epilogue]),
                                 conv_wgmma.launch_key())
        y = xp.empty(_kernel_shape(problem.g, problem.g.out_sp, problem.g.c_out), x.dtype)
        return conv_wgmma.conv_fwd(rt, x, w, y, bias_arg, launch)
    launch = problem.launch(lambda g: _fwd_launch(rt, g, x.dtype, epilogue))
    x, = problem.to_kernel_layout(rt, x)
    y = xp.empty(launch.out_shape, x.dtype)
    args = (xp.ascontiguousarray(x), xp.ascontiguousarray(w), bias_arg, y, *launch.scalars)
    launch.run(args)
    return problem.from_kernel_layout(rt, y)


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
    return Launch(_kernel_shape(g, g.in_sp, g.c_in), kernel_args(g),
                  _kernel_launch(rt, dtype, tile, 'conv_igemm_dgrad', grid, tile.threads))


def _igemm_dgrad(dy, w, problem, rt):
    xp = rt.xp
    if conv_wgmma.applies(rt, problem.wgmma_fits('dgrad', dy.dtype), dy):   # Hopper: conv/wgmma.py
        launch = problem.launch(lambda g: conv_wgmma.dgrad_launch(rt, g, dy.dtype), conv_wgmma.launch_key())
        dx = xp.empty(_kernel_shape(problem.g, problem.g.in_sp, problem.g.c_in), dy.dtype)
        return conv_wgmma.conv_dgrad(rt, dy, w, dx, launch)
    launch = problem.launch(lambda g: _dgrad_launch(rt, g, dy.dtype))
    dy, = problem.to_kernel_layout(rt, dy)
    dx = xp.empty(launch.out_shape, dy.dtype)
    launch.run((xp.ascontiguousarray(dy), xp.ascontiguousarray(w), dx, *launch.scalars))
    return problem.from_kernel_layout(rt, dx)


def _wgrad_launch(rt, g, dtype):
    rows, cols, depth = wgrad_gemm_shape(g)
    check_gemm('conv_wgrad', g, rows, cols, depth)
    tile = conv_tiles.choose_tile(dtype, config.precision(), rows, cols, depth, split_k=True,
                                  aligned=g.c_in % _chunk_elements(dtype) == 0)
    grid, per_split = split_k.plan(tile, rows, cols, depth)
    return split_k.wgrad_launch(
        _kernel_launch(rt, dtype, tile, 'conv_igemm_wgrad', grid, tile.threads),
        kernel_args(g) + (np.int64(per_split),), grid[2], rows * cols,
        lambda blocks: _kernel_launch(rt, dtype, tile, 'conv_reduce_splits', blocks, split_k.REDUCE_THREADS))


def _igemm_wgrad(x, dy, problem, rt):
    if conv_wgmma.applies(rt, problem.wgmma_fits('wgrad', x.dtype), x, dy):   # Hopper: conv/wgmma.py
        launch = problem.launch(lambda g: conv_wgmma.wgrad_launch(rt, g, x.dtype), conv_wgmma.launch_key())
    else:
        launch = problem.launch(lambda g: _wgrad_launch(rt, g, x.dtype))
        x, dy = problem.to_kernel_layout(rt, x, dy)
    return split_k.run(rt.xp, x, dy, problem.shape, x.dtype, launch)


def _unlift(array, shape):
    return array.reshape(shape)


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


def _run(rt, key, gpuk_fn, cudnn_fn, *args):
    return dispatch.run(rt, 'conv', key, gpuk_fn, cudnn_fn, *args)


# ---------------------------------------------------------------- public functions

def conv_fwd(x, w, strides, dilation, pads, data_format, *, epilogue=None, bias=None, runtime=None):
    """Convolution (cross-correlation) of x with w -> y; optionally y + bias, relu(y + bias)."""
    rt = resolve(runtime)
    params = (strides, dilation, pads, data_format, epilogue, bias is None)

    def prepare():
        _, _, shapes = conv_checks.fwd_problem('conv_fwd', x, w, strides, dilation, pads, data_format, rt.xp)
        g = _geometry(shapes)
        _check_epilogue('conv_fwd', epilogue, bias, g.c_out, x.dtype, rt.xp)
        out_spatial = g.out_sp[3 - (x.ndim - 2):]
        y_shape = (x.shape[0], *out_spatial, g.c_out) if g.channels_last else (x.shape[0], g.c_out, *out_spatial)
        return Problem(g, y_shape, _problem_key('fwd', x, w, strides, dilation, pads, data_format, epilogue))

    problem = _prepared(rt, 'fwd', (x, w) if bias is None else (x, w, bias), params, prepare)
    g = problem.g
    bias = rt.xp.ascontiguousarray(bias) if bias is not None else None

    def gpuk_fn(x, w, *geometry):
        return _unlift(_igemm_fwd(x, w, problem, bias, epilogue, rt), problem.shape)

    def cudnn_fn(x, w, *geometry):
        y = cudnn_conv.conv_fwd(x, w, *geometry)
        if epilogue is None:
            return y
        from .. import elementwise
        return elementwise.bias_act_fwd(y, bias, -1 if g.channels_last else 1,
                                        'relu' if epilogue == 'bias_relu' else 'linear', runtime=rt)

    return _run(rt, problem.key, gpuk_fn, cudnn_fn, x, w, strides, dilation, pads, data_format)


def conv_dgrad(dy, w, x_shape, strides, dilation, pads, data_format, *, runtime=None):
    """Gradient of conv_fwd with respect to x (also the forward of conv_transpose)."""
    rt = resolve(runtime)
    problem = _gradient_problem(rt, 'dgrad', conv_checks.dgrad_problem, dy, w, x_shape, strides, dilation, pads,
                                data_format)

    def gpuk_fn(dy, w, *geometry):
        return _unlift(_igemm_dgrad(dy, w, problem, rt), problem.shape)

    return _run(rt, problem.key, gpuk_fn, cudnn_conv.conv_dgrad, dy, w, problem.shape, strides, dilation, pads,
                data_format)


def conv_wgrad(x, dy, w_shape, strides, dilation, pads, data_format, *, runtime=None):
    """Gradient of conv_fwd with respect to w."""
    rt = resolve(runtime)
    problem = _gradient_problem(rt, 'wgrad', conv_checks.wgrad_problem, x, dy, w_shape, strides, dilation, pads,
                                data_format)

    def gpuk_fn(x, dy, *geometry):
        return _igemm_wgrad(x, dy, problem, rt)

    return _run(rt, problem.key, gpuk_fn, cudnn_conv.conv_wgrad, x, dy, problem.shape, strides, dilation, pads,
                data_format)
