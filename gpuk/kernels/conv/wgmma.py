"""The Hopper path of conv_fwd, conv_dgrad and conv_wgrad: conv_wgmma.cu (warpgroup MMA, sm_90a).

Each op has its ``*_fits`` (FITS), decided once per problem: float16 / bfloat16 inputs, or
float32 under precision 'tf32'; channels_last with the channels the kernel reads in 16-byte
units a multiple of 16 bytes / element (8 or 4 channels: fwd C_in, dgrad C_out, wgrad C_in and
C_out); then ``applies`` per call: those operands 16-byte aligned and an sm_90 device (the
kernels are built for sm_90a, which runs on sm_90 only).
Everything else runs conv_igemm.cu. The emulator has no architecture, so there the path runs
only inside ``forced()`` (tests).

The launches transpose the filter first: fwd to (C_out, taps * C_in), dgrad to (C_in, taps,
C_out), so that B is K-major in shared memory (wgmma's only layout for tf32); one extra pass
over the filter per call (small next to the activations on the layers this path is for).
dgrad runs one stride phase per grid z (conv_common.cuh's DgradPhase, as the implicit GEMM);
wgrad splits K = batch * pixels over grid z (``wgrad_plan``: tiles.py's split rule with the
problem's tile and K step) and adds the float32 partials in split order.

Tiles (one build of conv_wgmma.cu per dtype and tile, WG_BN; M is always 128 rows, two m64
halves of one consumer warpgroup):

    tile      wgmma     shared memory (3 stages)  used for
    128x128   m64n128   193 KB                    N > 64 where 128x128 blocks fill the SMs
    128x64    m64n64    145 KB                    N <= 64; fwd / dgrad grids under FILL_BLOCKS

Choice (``choose_tile``, once per problem: the prepared launch keeps it), N being C_out (fwd,
wgrad) or C_in (dgrad):
    rule      condition for 128x64                 why
    small N   N <= 64                              a 128-wide tile spends half of every wgmma
                                                   and of B's copies on zero columns (C_out = 64
                                                   in ResNet-50's first stage)
    fill      fwd / dgrad: 128x128 blocks (x dgrad  one block per SM (193 KB of shared memory):
              phases) < FILL_BLOCKS (132)           a grid under one wave of an H100's 132 SMs
                                                   leaves SMs idle; 128x64 doubles the blocks
                                                   (small-M layers: 7x7 / 14x14 maps, 1x1
                                                   projections at small batch)
wgrad has no fill rule: its split-K already sizes grid z to fill the GPU (tiles.py's rule). No
GPU was at hand to time the rule: it comes from the wgmma shapes and the grid sizes, and is to be
checked with bench/bench_conv.py on an H100. Tests force a tile with ``forced(tile=...)``.
"""
import contextlib
import math
from collections import namedtuple
from pathlib import Path

import ml_dtypes
import numpy as np

from gpuk.contracts.dtypes import c_types
from gpuk.contracts.geometry import MAX_GRID_YZ
from ..runtime import device_pointer, register_build
from . import split_k
from . import tiles as conv_tiles
from .geometry import check_gemm, dgrad_phase_rows, fwd_gemm_shape, kernel_args, wgrad_gemm_shape

SOURCE = Path(__file__).with_name('conv_wgmma.cu')
ARCH = 'sm_90a'
KERNEL = 'conv_wgmma_fwd'
DGRAD_KERNEL, WGRAD_KERNEL, REDUCE_KERNEL = 'conv_wgmma_dgrad', 'conv_wgmma_wgrad', 'conv_wgmma_reduce_splits'
KERNELS = (KERNEL, DGRAD_KERNEL, WGRAD_KERNEL, REDUCE_KERNEL)
STAGED_KERNELS = KERNELS[:3]   # the ones launched with SHARED_BYTES of dynamic shared memory
# Tile constants of conv_wgmma.cu (WG_*): a BLOCK_M x (BLOCK_N of the tile) output tile, K in
# steps of ATOMS 128-byte swizzle atoms (128 16-bit or 64 tf32 elements), a ring of STAGES stages.
THREADS = 256             # producer warpgroup + consumer warpgroup
BLOCK_M = 128
BLOCK_NS = (128, 64)      # the tile table (module docstring): WG_BN of each build, big to small
BLOCK_N = BLOCK_NS[0]
ROW_BYTES = 128
ATOMS = 2
STAGES = 3
FILL_BLOCKS = 132         # one wave of an H100's SMs at one block per SM
DTYPES = (np.dtype(np.float16), np.dtype(ml_dtypes.bfloat16), np.dtype(np.float32))   # float32: as tf32


def shared_bytes(block_n):
    """WG_SMEM_BYTES of the build with WG_BN = block_n: the stage ring (+ 1 KB alignment slack)."""
    return STAGES * (BLOCK_M + block_n) * ATOMS * ROW_BYTES + 1024


SHARED_BYTES = shared_bytes(BLOCK_N)   # the 128x128 tile's

_forced = {'on': None, 'tile': None}


def tile_name(block_n):
    return '%dx%d' % (BLOCK_M, block_n)


TILE_NAMES = tuple(tile_name(n) for n in BLOCK_NS)


def defines(dtype, block_n=BLOCK_N):
    element_t, acc_t = c_types(np.dtype(dtype))
    return {'ELEMENT_T': element_t, 'ACC_T': acc_t, 'WG_STAGES': STAGES, 'WG_ATOMS': ATOMS, 'WG_BN': block_n,
            'REDUCE_THREADS': split_k.REDUCE_THREADS}


for _dtype in DTYPES:
    for _block_n in BLOCK_NS:
        register_build(SOURCE, defines(_dtype, _block_n), list(KERNELS), archs=(ARCH,))


@contextlib.contextmanager
def forced(on=True, tile=None):
    """Within the block, conv_fwd, conv_dgrad and conv_wgrad take the wgmma path wherever the
    problem fits it (on=True, on any runtime, the emulator included) or never (on=False);
    ``tile`` (a TILE_NAMES name) overrides choose_tile."""
    if tile is not None and tile not in TILE_NAMES:
        raise ValueError('conv_wgmma.forced: tile must be one of %s, got %r' % (TILE_NAMES, tile))
    previous = dict(_forced)
    _forced.update(on=bool(on), tile=tile)
    try:
        yield
    finally:
        _forced.update(previous)


def launch_key():
    """What a prepared wgmma launch depends on besides the problem (conv.Problem.launch's path):
    the tile forced by ``forced(tile=...)``."""
    return 'wgmma' if _forced['tile'] is None else 'wgmma ' + _forced['tile']


def choose_tile(op, rows, cols, blocks_z=1):
    """BLOCK_N of the tile for op ('fwd', 'dgrad', 'wgrad') on a GEMM of rows x cols with
    blocks_z grid z blocks per tile (dgrad: stride phases), by the module docstring's rule."""
    if _forced['tile'] is not None:
        return BLOCK_NS[TILE_NAMES.index(_forced['tile'])]
    small_n = cols <= BLOCK_NS[1]
    underfilled = op != 'wgrad' and math.ceil(rows / BLOCK_M) * math.ceil(cols / BLOCK_N) * blocks_z < FILL_BLOCKS
    return BLOCK_NS[1] if small_n or underfilled else BLOCK_N


def _aligned16(array):
    return device_pointer(array) % 16 == 0


def _vec(dtype, precision):
    """Elements per 16-byte unit when the path takes this dtype under precision, else None."""
    dtype = np.dtype(dtype)
    if dtype not in DTYPES or (dtype == np.float32 and precision != 'tf32'):
        return None
    return 16 // dtype.itemsize


def fits(g, dtype, precision):
    """Whether the forward problem (conv Geometry) has what conv_wgmma_fwd needs, device aside."""
    vec = _vec(dtype, precision)
    return bool(vec and g.channels_last and g.c_in % vec == 0 and math.ceil(g.c_out / BLOCK_NS[-1]) <= MAX_GRID_YZ)


def dgrad_fits(g, dtype, precision):
    """Whether conv_dgrad of Geometry g has what conv_wgmma_dgrad needs (dy's C_out in 16-byte units)."""
    vec = _vec(dtype, precision)
    return bool(vec and g.channels_last and g.c_out % vec == 0 and math.ceil(g.c_in / BLOCK_NS[-1]) <= MAX_GRID_YZ
                and math.prod(g.strides) <= MAX_GRID_YZ)


def wgrad_fits(g, dtype, precision):
    """Whether conv_wgrad of Geometry g has what conv_wgmma_wgrad needs (x's C_in and dy's C_out in
    16-byte units)."""
    vec = _vec(dtype, precision)
    return bool(vec and g.channels_last and g.c_in % vec == 0 and g.c_out % vec == 0
                and math.ceil(g.c_out / BLOCK_NS[-1]) <= MAX_GRID_YZ)


def active(rt):
    """Whether the path may run on runtime rt at all: an sm_90 device, or forced on."""
    forced_on = _forced['on']
    return forced_on is not False and bool(forced_on or (rt.kind == 'cuda' and getattr(rt, 'arch', None) == 'sm_90'))


FITS = {'fwd': fits, 'dgrad': dgrad_fits, 'wgrad': wgrad_fits}   # op -> whether a problem fits its kernel


def applies(rt, problem_fits, *operands):
    """Whether an op runs its conv_wgmma.cu kernel on runtime rt: its problem fits (FITS[op]: the
    conv launcher decides it once per problem, conv.Problem.wgmma_fits), the path is active on
    rt, and the operands the kernel reads in 16-byte units (fwd x, dgrad dy, wgrad x and dy) are
    16-byte aligned (checked per call: a view may start anywhere)."""
    return problem_fits and active(rt) and all(_aligned16(a) for a in operands)


def dgrad_gemm_shape(g):
    """Bounds on (M, N, K) of conv_wgmma_dgrad's stride phases: ceil(in / s) pixels and
    ceil(k / (s / gcd(s, dil))) taps per dim at most (dgrad_launch checks them against 2^31)."""
    taps = math.prod(math.ceil(k / (s // math.gcd(s, d))) for k, s, d in zip(g.k_sp, g.strides, g.dilation))
    return dgrad_phase_rows(g), g.c_in, taps * g.c_out


def fwd_tile(g):
    """BLOCK_N of conv_wgmma_fwd's tile for Geometry g (choose_tile)."""
    rows, cols, _ = fwd_gemm_shape(g)
    return choose_tile('fwd', rows, cols)


def dgrad_tile(g):
    """BLOCK_N of conv_wgmma_dgrad's tile for Geometry g (choose_tile; every phase a grid z)."""
    return choose_tile('dgrad', dgrad_phase_rows(g), g.c_in, math.prod(g.strides))


def launch_shape(g, block_n=None):
    """(grid, threads, shared bytes) of conv_wgmma_fwd for Geometry g on its tile (or block_n's)."""
    rows, cols, _ = fwd_gemm_shape(g)
    block_n = block_n or fwd_tile(g)
    return (math.ceil(rows / BLOCK_M), math.ceil(cols / block_n)), THREADS, shared_bytes(block_n)


def dgrad_launch_shape(g, block_n=None):
    """(grid, threads, shared bytes) of conv_wgmma_dgrad: grid z is the stride phase, grid x
    covers the largest phase (phase 0: ceil(in / s) pixels per dim)."""
    block_n = block_n or dgrad_tile(g)
    return ((math.ceil(dgrad_phase_rows(g) / BLOCK_M), math.ceil(g.c_in / block_n), math.prod(g.strides)), THREADS,
            shared_bytes(block_n))


def k_step(dtype):
    """K elements per tile (WG_BK): ATOMS atoms of 128 bytes."""
    return ATOMS * ROW_BYTES // np.dtype(dtype).itemsize


def wgrad_tile(g):
    """BLOCK_N of conv_wgmma_wgrad's tile for Geometry g (choose_tile: the small-N rule only)."""
    rows, cols, _ = wgrad_gemm_shape(g)
    return choose_tile('wgrad', rows, cols)


def wgrad_plan(g, dtype, block_n=None):
    """(grid, K elements per split) of conv_wgmma_wgrad: tiles.py's split rule (enough blocks to
    fill the GPU, at least MIN_K_TILES_PER_SPLIT K tiles per split; ``tiles.forced(splits=)``
    applies) with the problem's tile (or block_n's); every split but the last has whole K tiles."""
    rows, cols, depth = wgrad_gemm_shape(g)
    block_n = block_n or wgrad_tile(g)
    tile = conv_tiles.Tile(tile_name(block_n) + ' wgmma', 'wgmma', BLOCK_M, block_n, k_step(dtype), 1, 1, 1, 1,
                           THREADS, STAGES)
    return split_k.plan(tile, rows, cols, depth)


# A prepared fwd / dgrad launch (kept per problem by the conv launcher, runtime/prepared.py): the
# kernel's launch (rt.kernel_launch: kernel, grid and block checked once) and scalar arguments.
# wgrad's is split_k.WgradLaunch (wgrad_launch; run by split_k.run).
Launch = namedtuple('Launch', 'run scalars')


def _kernel_launch(rt, dtype, block_n, name, grid, threads=THREADS, shared=None):
    shared = shared_bytes(block_n) if shared is None else shared
    return rt.kernel_launch(SOURCE, defines(dtype, block_n), name, grid, threads, shared, arch=ARCH)


def fwd_launch(rt, g, dtype, epilogue_code):
    """conv_wgmma_fwd's launch for Geometry g with epilogue code 0 / 1 (+ bias) / 2 (+ bias, relu),
    on the tile choose_tile picks for it."""
    check_gemm('conv_fwd', g, *fwd_gemm_shape(g))
    block_n = fwd_tile(g)
    return Launch(_kernel_launch(rt, dtype, block_n, KERNEL, launch_shape(g, block_n)[0]),
                  kernel_args(g) + (np.int32(epilogue_code),))


def dgrad_launch(rt, g, dtype):
    """conv_wgmma_dgrad's launch for Geometry g, on the tile choose_tile picks for it."""
    check_gemm('conv_dgrad', g, *dgrad_gemm_shape(g))
    block_n = dgrad_tile(g)
    return Launch(_kernel_launch(rt, dtype, block_n, DGRAD_KERNEL, dgrad_launch_shape(g, block_n)[0]),
                  kernel_args(g))


def wgrad_launch(rt, g, dtype):
    """conv_wgmma_wgrad's launch (and its reduce's, with several splits) for Geometry g, on the
    tile choose_tile picks for it."""
    check_gemm('conv_wgrad', g, *wgrad_gemm_shape(g))
    block_n = wgrad_tile(g)
    grid, per_split = wgrad_plan(g, dtype, block_n)
    rows, cols, _ = wgrad_gemm_shape(g)
    def reduce_launch(blocks):
        return _kernel_launch(rt, dtype, block_n, REDUCE_KERNEL, blocks, split_k.REDUCE_THREADS, 0)
    return split_k.wgrad_launch(_kernel_launch(rt, dtype, block_n, WGRAD_KERNEL, grid),
                                kernel_args(g) + (np.int64(per_split),), grid[2], rows * cols, reduce_launch)


def conv_fwd(rt, x, w, y, bias, launch):
    """Launches conv_wgmma_fwd: y = conv(x, w) (+ bias, relu); y is channels_last, preallocated."""
    w_t = rt.xp.ascontiguousarray(w.reshape(-1, w.shape[-1]).T)   # (C_out, taps * C_in): K-major B
    launch.run((rt.xp.ascontiguousarray(x), w_t, bias, y, *launch.scalars))
    return y


def conv_dgrad(rt, dy, w, dx, launch):
    """dx = conv_dgrad(dy, w) (dx channels_last, preallocated): one stride phase per grid z;
    B is the filter as (C_in, taps, C_out), K-major along each phase's (tap, C_out)."""
    w_t = rt.xp.ascontiguousarray(rt.xp.moveaxis(w.reshape(-1, *w.shape[-2:]), 1, 0))
    launch.run((rt.xp.ascontiguousarray(dy), w_t, dx, *launch.scalars))
    return dx
