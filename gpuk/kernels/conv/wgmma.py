"""The Hopper path of conv_fwd: conv_wgmma.cu (warpgroup MMA, sm_90a), when it applies.

``applies`` decides per problem: float16 / bfloat16 inputs, or float32 under precision
'tf32'; channels_last with C_in a multiple of 16 bytes / element (8 or 4 channels) and a
16-byte aligned x; an sm_90 device (the kernel is built for sm_90a, which runs on sm_90
only). Everything else, and every dgrad and wgrad, runs conv_igemm.cu. The emulator has no
architecture, so there the path runs only inside ``forced()`` (tests).

The launch transposes the filter to (C_out, taps * C_in) first: both wgmma operands are then
K-major in shared memory (wgmma's only layout for tf32). That is one extra pass over the
filter per call (small next to the activations on the layers this path is for).
"""
import contextlib
import math
from pathlib import Path

import ml_dtypes
import numpy as np

from gpuk.contracts.dtypes import c_types
from ..runtime import register_build

SOURCE = Path(__file__).with_name('conv_wgmma.cu')
ARCH = 'sm_90a'
KERNEL = 'conv_wgmma_fwd'
# Tile constants of conv_wgmma.cu (WG_*): a 128 x 128 output tile, K in 128-byte steps.
THREADS = 384             # producer warpgroup + 2 consumer warpgroups
BLOCK_M = BLOCK_N = 128
ROW_BYTES = 128
STAGES = 4
SHARED_BYTES = STAGES * (BLOCK_M + BLOCK_N) * ROW_BYTES + 1024   # WG_SMEM_BYTES (+ 1 KB alignment slack)
MAX_GRID_Y = 65535
DTYPES = (np.dtype(np.float16), np.dtype(ml_dtypes.bfloat16), np.dtype(np.float32))   # float32: as tf32

_forced = {'on': None}


def defines(dtype):
    element_t, acc_t = c_types(np.dtype(dtype))
    return {'ELEMENT_T': element_t, 'ACC_T': acc_t, 'WG_STAGES': STAGES}


for _dtype in DTYPES:
    register_build(SOURCE, defines(_dtype), [KERNEL], archs=(ARCH,))


@contextlib.contextmanager
def forced(on=True):
    """Within the block, conv_fwd takes the wgmma path wherever the problem fits it (on=True,
    on any runtime, the emulator included) or never (on=False)."""
    previous = _forced['on']
    _forced['on'] = bool(on)
    try:
        yield
    finally:
        _forced['on'] = previous


def forced_state():
    """What forced() set (None, True or False): part of a launch's prepared key."""
    return _forced['on']


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


def applies(rt, g, x, precision):
    """Whether conv_fwd of x (Geometry g) runs conv_wgmma_fwd on runtime rt."""
    forced_on = _forced['on']
    if forced_on is False or not (forced_on or (rt.kind == 'cuda' and getattr(rt, 'arch', None) == 'sm_90')):
        return False   # the common case costs two compares
    return fits(g, x.dtype, precision) and _aligned16(x)


def launch_shape(g):
    """(grid, threads, shared bytes) of conv_wgmma_fwd for Geometry g."""
    rows = g.batch * math.prod(g.out_sp)
    return (math.ceil(rows / BLOCK_M), math.ceil(g.c_out / BLOCK_N)), THREADS, SHARED_BYTES


def conv_fwd(rt, x, w, y, bias, epilogue_code, g):
    """Launches conv_wgmma_fwd: y = conv(x, w) (+ bias, relu); y is channels_last, preallocated."""
    xp = rt.xp
    w_t = xp.ascontiguousarray(w.reshape(-1, g.c_out).T)   # (C_out, taps * C_in): K-major B
    grid, threads, shared = launch_shape(g)
    geometry = (g.batch, g.c_in, g.c_out, *g.in_sp, *g.out_sp, *g.k_sp, *g.strides, *g.dilation, *g.pad_before)
    args = (xp.ascontiguousarray(x), w_t, bias, y, *(np.int32(v) for v in geometry), np.int32(epilogue_code))
    rt.load(SOURCE, defines(x.dtype), arch=ARCH).kernel(KERNEL).launch(grid, threads, args, shared_mem=shared)
    return y
