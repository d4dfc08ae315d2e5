"""The Hopper path of conv_fwd and stride-1 conv_dgrad: conv_wgmma.cu (warpgroup MMA, sm_90a).

``applies`` decides per problem: float16 / bfloat16 inputs, or float32 under precision
'tf32'; channels_last with C_in a multiple of 16 bytes / element (8 or 4 channels) and a
16-byte aligned x; an sm_90 device (the kernel is built for sm_90a, which runs on sm_90
only). conv_dgrad with every stride 1 is the forward convolution of dy with the flipped,
transposed filter (``dgrad_geometry``) and takes the same path when that problem fits (C_out
a multiple of 16 bytes / element). Everything else, strided dgrad and every wgrad, runs
conv_igemm.cu. The emulator has no architecture, so there the path runs only inside
``forced()`` (tests).

The launch transposes the filter to (C_out, taps * C_in) first (dgrad: flips it too, to
(C_in, taps * C_out)): both wgmma operands are then K-major in shared memory (wgmma's only
layout for tf32). That is one extra pass over the filter per call (small next to the
activations on the layers this path is for).
"""
import contextlib
import math
from pathlib import Path

import ml_dtypes
import numpy as np

from gpuk.contracts.dtypes import c_types
from ..runtime import prepared, register_build

SOURCE = Path(__file__).with_name('conv_wgmma.cu')
ARCH = 'sm_90a'
KERNEL = 'conv_wgmma_fwd'
# Tile constants of conv_wgmma.cu (WG_*): a 128 x 128 output tile, K in steps of ATOMS 128-byte
# swizzle atoms (128 16-bit or 64 tf32 elements), a ring of STAGES stages of 64 KB.
THREADS = 256             # producer warpgroup + consumer warpgroup
BLOCK_M = BLOCK_N = 128
ROW_BYTES = 128
ATOMS = 2
STAGES = 3
SHARED_BYTES = STAGES * (BLOCK_M + BLOCK_N) * ATOMS * ROW_BYTES + 1024   # WG_SMEM_BYTES (+ 1 KB alignment slack)
MAX_GRID_Y = 65535
DTYPES = (np.dtype(np.float16), np.dtype(ml_dtypes.bfloat16), np.dtype(np.float32))   # float32: as tf32

_forced = {'on': None}


def defines(dtype):
    element_t, acc_t = c_types(np.dtype(dtype))
    return {'ELEMENT_T': element_t, 'ACC_T': acc_t, 'WG_STAGES': STAGES, 'WG_ATOMS': ATOMS}


for _dtype in DTYPES:
    register_build(SOURCE, defines(_dtype), [KERNEL], archs=(ARCH,))


@contextlib.contextmanager
def forced(on=True):
    """Within the block, conv_fwd and stride-1 conv_dgrad take the wgmma path wherever the
    problem fits it (on=True, on any runtime, the emulator included) or never (on=False)."""
    previous = _forced['on']
    _forced['on'] = bool(on)
    try:
        yield
    finally:
        _forced['on'] = previous


def _aligned16(array):
    pointer = array.ctypes.data if isinstance(array, np.ndarray) else array.data.ptr
    return pointer % 16 == 0


def fits(g, dtype, precision):
    """Whether the problem (conv Geometry) has what conv_wgmma_fwd needs, device aside."""
    dtype = np.dtype(dtype)
    if dtype not in DTYPES or (dtype == np.float32 and precision != 'tf32'):
        return False
    vec = 16 // dtype.itemsize
    return bool(g.channels_last and g.c_in % vec == 0 and math.ceil(g.c_out / BLOCK_N) <= MAX_GRID_Y)


def active(rt):
    """Whether the path may run on runtime rt at all: an sm_90 device, or forced on."""
    forced_on = _forced['on']
    return forced_on is not False and bool(forced_on or (rt.kind == 'cuda' and getattr(rt, 'arch', None) == 'sm_90'))


def applies(rt, g, x, precision):
    """Whether the forward convolution of x (Geometry g) runs conv_wgmma_fwd on runtime rt."""
    return active(rt) and fits(g, x.dtype, precision) and _aligned16(x)


def dgrad_geometry(g):
    """The forward problem whose result is conv_dgrad of Geometry g when every stride is 1:
    dy convolved with the flipped, transposed filter (see conv_dgrad); None for strided g."""
    if any(s != 1 for s in g.strides):
        return None
    pads = tuple(d * (k - 1) - p for d, k, p in zip(g.dilation, g.k_sp, g.pad_before))
    return g._replace(c_in=g.c_out, c_out=g.c_in, in_sp=g.out_sp, out_sp=g.in_sp, pad_before=pads)


def gemm_shape(g):
    """(M, N, K) of the forward GEMM of Geometry g (the launcher checks them against 2^31)."""
    return g.batch * math.prod(g.out_sp), g.c_out, math.prod(g.k_sp) * g.c_in


def launch_shape(g):
    """(grid, threads, shared bytes) of conv_wgmma_fwd for Geometry g."""
    rows = g.batch * math.prod(g.out_sp)
    return (math.ceil(rows / BLOCK_M), math.ceil(g.c_out / BLOCK_N)), THREADS, SHARED_BYTES


def conv_fwd(rt, x, w, y, bias, epilogue_code, g):
    """Launches conv_wgmma_fwd: y = conv(x, w) (+ bias, relu); y is channels_last, preallocated."""
    w_t = rt.xp.ascontiguousarray(w.reshape(-1, g.c_out).T)   # (C_out, taps * C_in): K-major B
    return _launch(rt, x, w_t, y, bias, epilogue_code, g)


def conv_dgrad(rt, dy, w, dx, no_bias, g):
    """dx = conv_dgrad(dy, w) of a stride-1 Geometry g as conv_wgmma_fwd of dgrad_geometry(g):
    dx[i, ci] = sum over taps t', co of dy[i - pad' + t' dil, co] w[k - 1 - t', ci, co], so B is
    the filter flipped along every spatial axis, as (C_in, taps * C_out)."""
    spatial = w.ndim - 2
    flipped = w[(slice(None, None, -1),) * spatial]
    w_t = rt.xp.ascontiguousarray(rt.xp.moveaxis(flipped, -2, 0)).reshape(g.c_in, -1)
    return _launch(rt, dy, w_t, dx, no_bias, 0, dgrad_geometry(g))


def _launch(rt, x, w_t, y, bias, epilogue_code, g):
    def prepare():   # once per (geometry, dtype, epilogue): runtime/prepared.py
        grid, threads, shared = launch_shape(g)
        # conv_wgmma_fwd's geometry: (batch, c_in, c_out, in, out, kernel, strides, dilation, pads)
        geometry = (g.batch, g.c_in, g.c_out, *g.in_sp, *g.out_sp, *g.k_sp, *g.strides, *g.dilation, *g.pad_before)
        return (rt.kernel_launch(SOURCE, defines(x.dtype), KERNEL, grid, threads, shared, arch=ARCH),
                tuple(np.int32(v) for v in geometry) + (np.int32(epilogue_code),))

    launch, scalars = prepared.get(rt, 'conv_wgmma', (x,), (g, epilogue_code), prepare)
    launch((rt.xp.ascontiguousarray(x), w_t, bias, y) + scalars)
    return y
