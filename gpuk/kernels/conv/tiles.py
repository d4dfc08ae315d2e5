"""Tile shapes of the implicit-GEMM convolution (conv_igemm.cu) and how one is chosen.

A tile is (math path, BM x BN x BK, per-thread or per-warp blocking). The table:

    path   name         block tile     threads  stages  per thread / warp     used for
    ffma   128x128x16   128 x 128 x 16 256      3       8 x 8 FFMA micro-tile float32, big M and N
    ffma   64x64x16     64 x 64 x 16   64       3       8 x 8                 float32, mid-size
    ffma   32x32x32     32 x 32 x 32   32       2       8 x 4                 small M or N (tails)
    ffma64 64x64x8      64 x 64 x 8    256      3       4 x 4 DFMA            float64
    ffma64 32x32x8      32 x 32 x 8    64       3       4 x 4                 float64, small
    f16    128x128x32   128 x 128 x 32 128      3       4 warps, 64 x 64/warp float16 (mma m16n8k16)
    f16    64x64x64     64 x 64 x 64   64       2       2 warps, 64 x 32      float16, smaller problems
    f16    64x128x64    64 x 128 x 64  128     2       4 warps, 64 x 32      wgrad only: taps*C_in <= 64
    f16    128x64x64    128 x 64 x 64  128     2       4 warps, 64 x 32      wgrad only: C_out <= 64
    bf16   (as f16)                                                           bfloat16 (mma m16n8k16 bf16)
    tf32   128x128x32   128 x 128 x 32 128      2       4 warps, 64 x 64      fwd only (FWD_ONLY): float32, 'tf32'
    tf32   128x128x16   128 x 128 x 16 128      2       4 warps, 64 x 64      float32 with precision 'tf32'
    tf32   64x64x32     64 x 64 x 32   64       2       2 warps, 32 x 64

Every tile moves whole 16-byte chunks: BM*BK and BN*BK are multiples of (16 bytes / element)
x threads (static_asserts in conv_igemm.cu). FFMA and 16-bit tiles are XOR-swizzled without
padding (except the FFMA [m][k] A tiles of fwd/dgrad, whose reads are broadcasts and need no
swizzle), so BK=16 (FFMA) and BK=32 (16-bit 128x128) fit 3 stages in 48 KB of static shared
memory; tf32 pads its k-major tiles (wgrad A, fwd/wgrad B) by 8 floats per row (conflict-free
fragment reads): 128x128 tf32 runs BK=16 and 2 stages (34 KB) for dgrad and wgrad, and for the
forward BK=32 with 2 stages (68 KB: a stage ring past 48 KB is dynamic shared memory, sized by
`dynamic_smem`, still 2 blocks per SM on sm_80 and sm_90), which shares each K tile's fixed work
(barrier, tap cursor, pointer steps) by twice the MMAs: 1.44 other instructions per MMA on sm_90
against 1.75 at BK=16 (inspect figures). dgrad and wgrad spill at BK=32 (8 A chunks per thread:
twice the row pointers, tap masks or packed bounds), so the BK=32 tile is built for conv_igemm_fwd only
(FWD_ONLY; FWD_TILES is the forward's table). 64x64 tf32 runs BK=32 with 2 stages (36 KB). The 128x128
tensor-core tiles use 64x64 warp tiles (32 MMAs per k16 step per warp) and the 64x64 ones 2
warps (not 4 of 32x32): the ldmatrix and loader work per thread is shared by twice the MMAs;
16-bit as 1 x 2 warps of 64x32, tf32 as 2 x 1 of 32x64 (each warp then reads A alone, which it
rounds in its registers, see below). 16-bit 64x64 runs BK=64 with 2 stages (32 KB: 4 blocks per
SM on sm_80 too, as many as its 242-255 registers allow): each K tile's fixed work (barrier, tap
cursor, pointer steps) is then shared by 64 MMAs per warp, which brings fwd and dgrad to 1.7-1.9
other instructions per MMA (3.0-3.8 with BK=32, 3 stages); the data in flight is the same as 3
stages of BK=32 (one 64-deep tile while the other is multiplied). tf32 rounds the filter (fwd's
and dgrad's B) once per call ahead of the conv kernel (conv_igemm.cu, conv_round_tf32) and every
other operand element once per block in shared memory (round_landed_tf32; to nearest even:
common.cuh float_to_tf32), at 1.5 instructions per element on sm_90 (one cvt.rn.tf32.f32 plus a
quarter of a 16-byte load and store) and 3.5 on sm_80 (no cvt.rn there: 3 on the bits): 0.375 /
0.875 per MMA for A on the 128x128 tiles (0.25 elements per MMA), as much again for wgrad's B
(its pass also transposes 4 x 4 blocks, with an ldmatrix in place of the 16-byte load). The
64x64 tile's warps (2 x 1) share B and each reads its own 32 rows of A: A is rounded in the
fragment registers of its one warp (0.5 elements per MMA: 0.5 / 1.5 per MMA on sm_90 / sm_80,
against 0.75 / 1.75 for the 16-byte pass of 1 x 2 warps), wgrad's B in shared memory as on
128x128 (its transposed blocks, so ldmatrix reads its fragments: per 16 MMAs 8 fragment loads
instead of 16 with 1 x 2 warps' 4-byte reads). Other instructions per MMA (inspect, sm_90
[sm_80]), 1 x 2 -> 2 x 1 warps: fwd 2.88 -> 2.75 [3.84 -> 3.71], dgrad 2.86 -> 2.36 [3.79 ->
3.54], wgrad 3.67 -> 3.16 [5.65 -> 5.38]. Where fwd's C_in or dgrad's C_out is a multiple of
BK = 32, the 64x64 tile copies by tap tiles (conv_igemm.cu TAP_TILES: each K tile in one tap, a
thread's chunks 2 rows x 4 units, one address and one tap test per row): fwd 1.95 [2.92], dgrad
1.85 [2.81]; other channel counts 2.56 [3.49] and 2.39 [3.35]. The 128x128x16 tile copies by
tap tiles too where that channel count is a multiple of 16 (2 rows x 2 units per thread, its A
rounded in shared memory along that mapping): fwd 1.41 [1.89], dgrad 1.55 [1.93] (chunk mapping
1.75 [2.21], 1.86 [2.16]). wgrad, where C_in is a multiple
of 32, copies x by tap groups (conv_igemm.cu WG_TAP_GROUPS: one address and one bounds test per 4
chunks): 2.49 [4.62]. It stays above 2 (both operands rounded in the loop: 1.0 conversion per MMA
on 64x64), yet it remains the choice for the problems that get it: the 128x128 tile's rejection
there is padding waste over MAX_WASTE (half of its MMAs on zeros: about 6 instructions per useful
MMA against 3.5) or a K too short to fill two waves even split (the 64x64 tile has 4 times the
blocks).

16-bit wgrad has its own table (WGRAD_TILES: 128x128x32, 64x128x64, 128x64x64, 64x64x64; the
two rectangular tiles are built for conv_igemm_wgrad only). Its K (batch x output pixels) is long,
so split-K fills the GPU with any tile and the smaller tiles are only there for small M =
taps*C_in or N = C_out (padding waste). The wgrad A loader is the costly one (per k row and K
tile its pixel decoded; per chunk a packed bounds test and its address): on 64x64x64 (64
threads) each thread copies two pixel rows (decoded one per lane of a pair) and 8 A + 8 B
chunks per 64 MMAs of its warp (1.84 / 1.83 other instructions per MMA, sm_90 / sm_80, with the
decode by linear forms and an untested steady-state K loop); 128 threads on 64x128 or 128x64
copy one pixel row and 12 chunks per 64 MMAs (cp.async per MMA: 8(BM+BN)/(BM*BN)): 64x128
(4 A + 8 B chunks) 1.42 / 1.41, 128x64 (8 A + 4 B) 1.67 / 1.66; 128x128x32 1.17 / 1.17. The
rectangles run 2 stages of BK=64 in 48 KB (2 blocks per SM, 8 warps, as 64x64x64's 4 blocks of 2 warps). 64x128 comes first (the
cheaper loader where both fit); 64x64x64 stays last, for M and N both <= 64, where either
rectangle would run half its MMAs on padding. The fill rule there also passes a tile whose K is
split as far as the split rule allows (MAX_SPLITS, MIN_K_TILES_PER_SPLIT): a 1x1 256 -> 64 layer
(M x N = 256 x 64) is then 2 x 64 blocks of 128x64 (4 warps each) rather than 4 x 64 of 64x64
(2 warps each), the same warps at a cheaper loader per MMA.

FFMA micro-tiles: 8 x 8 per thread on 128x128 and 64x64 (64 multiply-adds per 4 shared reads
of 16 bytes: 85-88% of the hot loop is FFMA on sm_90; 4 x 4 on 256 threads gave 64x64 only
70%), 8 x 4 on one warp for 32x32. A 32x32 tile gives each thread only 64 multiply-adds per
16-byte chunk it copies (4 BM BN / (BM + BN); 128 on 64x64), and 8 x 4 needs 3 shared reads
per 32 multiply-adds, so the per-K-tile work (barrier, iterator steps, tap masks) decides: at
BK=16 it left 76-79% FFMA; BK=32 halves it per multiply-add: 80-83% for fwd and dgrad, 77-78%
for wgrad (its A copies test 3 bounds per chunk, and with 32 threads for 32 k rows each thread
steps two pixel iterators: one row per thread read half sectors), 0 spills since the [m][k] A
tile is unswizzled (one address register for its reads instead of 32: BK=32 spilled dgrad
before). 2 stages of 32 keep the 3 x 16 stages' prefetch distance (one 32-deep K tile ahead)
in 16 KB, so 8 blocks (the register limit) still fit an sm_80 SM (3 stages: 6). 4 x 4 on 64
threads with BK=8 gave 57-60%. The 32x32 tile stays in the table: split-K exists for wgrad
only, so without it a forward or dgrad with C_out or C_in <= 32 (or a few M rows) would run the
64-wide tile at more than MAX_WASTE padding, i.e. half its multiply-adds on zeros, which costs
more than the lower FFMA share of the 32-wide loop.

f16 and bf16 share the math code (both m16n8k16, float32 accumulation): the element
type of the build picks the instruction. float64 has no 128x128 tile: 64 double
accumulators per thread plus fragments would spill.

Choice (`choose_tile`): candidates from big to small; take the first that passes every rule
below, else the smallest. wgrad (K = N * output pixels, often huge next to M x N) splits K
over blocks (`wgrad_splits`) so that small filters still fill the GPU. No GPU was at hand to
time these rules: they come from the compiled hot loops (python -m gpuk.kernels.inspect:
instructions per K tile, registers, occupancy) and are to be checked with bench/bench_conv.py.

    rule              condition for the bigger tile            why (from the instruction counts)
    fill              M tiles x N tiles x splits >= MIN_BLOCKS about two waves of 132 SMs: the big
                                                               tiles sit at 1 block (8 warps) per SM
    small N           padding waste <= MAX_WASTE (1.5)         C_out = 64 on a 128-wide tile wastes
                                                               half of every MMA/FFMA
    1x1 / short K     the largest tiles only (the table's      a 1x1 layer with C_in = 64 has 4 FFMA
    (largest tile)    first block area: tf32 fwd's BK=32 and   K tiles: the 3-stage prologue and the
                      BK=16 128x128): K >= MIN_K_TILES x BK    epilogue are not amortized
                      per split
    7x7 stem, odd C   waste <= MAX_WASTE_PER_ELEMENT (2.0)     C_in = 3 takes per-element copies (VEC
                      when C % (16 bytes) != 0                 per chunk): the loader then costs as
                                                               much as the math, so the tile with
                                                               the most math per loaded element wins

Tests force a tile with ``forced(name)`` (a context manager) to cover every variant on
tiny shapes.
"""
import contextlib
import math
from collections import namedtuple

import ml_dtypes
import numpy as np

Tile = namedtuple('Tile', 'name math bm bn bk tm tn warps_m warps_n threads stages')

MATH_CODES = {'ffma': 0, 'f16': 1, 'bf16': 1, 'tf32': 2}


def _ffma(bm, bn, bk, tm, tn, stages=3):
    return Tile('%dx%dx%d' % (bm, bn, bk), 'ffma', bm, bn, bk, tm, tn, 1, 1, (bm // tm) * (bn // tn), stages)


def _mma(math_path, bm, bn, warps_m, warps_n, bk=16, stages=3):
    return Tile('%dx%dx%d' % (bm, bn, bk), math_path, bm, bn, bk, 1, 1, warps_m, warps_n, 32 * warps_m * warps_n,
                stages)


TILES = {
    'ffma': (_ffma(128, 128, 16, 8, 8), _ffma(64, 64, 16, 8, 8), _ffma(32, 32, 32, 8, 4, stages=2)),
    'ffma64': (_ffma(64, 64, 8, 4, 4), _ffma(32, 32, 8, 4, 4)),
    'f16': (_mma('f16', 128, 128, 2, 2, bk=32), _mma('f16', 64, 64, 1, 2, bk=64, stages=2)),
    'bf16': (_mma('bf16', 128, 128, 2, 2, bk=32), _mma('bf16', 64, 64, 1, 2, bk=64, stages=2)),
    'tf32': (_mma('tf32', 128, 128, 2, 2, stages=2), _mma('tf32', 64, 64, 2, 1, bk=32, stages=2)),
}
# 16-bit wgrad (see the docstring); the rectangular tiles exist for conv_igemm_wgrad only.
WGRAD_ONLY = {math_path: (_mma(math_path, 64, 128, 1, 4, bk=64, stages=2),
                          _mma(math_path, 128, 64, 2, 2, bk=64, stages=2))
              for math_path in ('f16', 'bf16')}
WGRAD_TILES = {math_path: (TILES[math_path][0],) + WGRAD_ONLY[math_path] + (TILES[math_path][1],)
               for math_path in ('f16', 'bf16')}
# tf32 forward's own largest tile (see the docstring): BK=32, its 68 KB stage ring in dynamic shared
# memory; built for conv_igemm_fwd only (the dgrad and wgrad loaders spill at BK=32).
FWD_ONLY = {'tf32': (_mma('tf32', 128, 128, 2, 2, bk=32, stages=2),)}
FWD_TILES = {'tf32': FWD_ONLY['tf32'] + TILES['tf32']}
STATIC_SMEM_LIMIT = 48 * 1024   # bytes a kernel may declare as static shared memory
MIN_BLOCKS = 264          # two waves on a 132-SM H100
MAX_WASTE = 1.5           # tile area / real area
MAX_WASTE_PER_ELEMENT = 2.0   # ... when the gathered operand is copied element by element (C % chunk != 0)
MIN_K_TILES = 6           # K tiles the largest tile needs to fill its pipeline (2 x 3 stages)
MAX_SPLITS = 64
MIN_K_TILES_PER_SPLIT = 4
_forced = {'tile': None, 'splits': None}


def stage_bytes(tile, dtype):
    """Shared-memory bytes of the tile's stage ring (conv_igemm_layout.cuh: A_STAGE + B_STAGE
    elements per stage): tf32 pads its k-major rows by two 16-byte units (SMEM_PAD_K), the other paths by none."""
    size = np.dtype(dtype).itemsize
    pad = 2 * (16 // size) if tile.math == 'tf32' else 0
    a_stage = max(tile.bm * tile.bk, tile.bk * (tile.bm + pad))
    b_stage = max(tile.bn * tile.bk, tile.bk * (tile.bn + pad))
    return tile.stages * (a_stage + b_stage) * size


def dynamic_smem(tile, dtype):
    """Bytes of dynamic shared memory the tile's stage ring is launched with: 0 (static shared
    memory) where it fits STATIC_SMEM_LIMIT, else stage_bytes (the kernel checks that it agrees)."""
    needed = stage_bytes(tile, dtype)
    return needed if needed > STATIC_SMEM_LIMIT else 0


def forced_state():
    """What forced() set (tile, splits): part of a launch's prepared key in the launcher."""
    return _forced['tile'], _forced['splits']


def table_for(dtype, precision, wgrad=False, fwd=False):
    """The candidate tiles (big to small) for inputs of ``dtype`` under ``precision`` (``wgrad``:
    of conv_igemm_wgrad; ``fwd``: of conv_igemm_fwd)."""
    dtype = np.dtype(dtype)
    if fwd and dtype == np.float32 and precision == 'tf32':
        return FWD_TILES['tf32']
    tables = WGRAD_TILES if wgrad else TILES
    if dtype == np.float16:
        return tables['f16']
    if dtype == ml_dtypes.bfloat16:
        return tables['bf16']
    if dtype == np.float64:
        return TILES['ffma64']
    return TILES['tf32'] if precision == 'tf32' else TILES['ffma']


def _blocks(tile, rows, cols):
    return math.ceil(rows / tile.bm) * math.ceil(cols / tile.bn)


def _waste(tile, rows, cols):
    return (math.ceil(rows / tile.bm) * tile.bm * math.ceil(cols / tile.bn) * tile.bn) / (rows * cols)


def choose_tile(dtype, precision, rows, cols, depth, wgrad=False, aligned=True, fwd=False):
    """The tile for a GEMM of rows x cols x depth (see the module docstring). ``aligned``: the
    gathered operand's channel count is a multiple of the 16-byte chunk (16-byte copies);
    ``wgrad``: a weights-gradient GEMM (its K is split; 16-bit wgrad has its own table); ``fwd``:
    a forward GEMM (tf32 has its own table)."""
    table = table_for(dtype, precision, wgrad=wgrad, fwd=fwd)
    if _forced['tile'] is not None:
        for tile in table:
            if tile.name == _forced['tile']:
                return tile
        raise ValueError('conv_tiles.forced: no tile %r for %s/%s; have %s'
                         % (_forced['tile'], np.dtype(dtype), precision, [t.name for t in table]))
    max_waste = MAX_WASTE if aligned else MAX_WASTE_PER_ELEMENT
    # 16-bit wgrad: K split as far as the split rule allows also counts as filled (see the docstring)
    split_cap_fills = wgrad and table in WGRAD_TILES.values()
    for tile in table[:-1]:
        splits = wgrad_splits(tile, rows, cols, depth) if wgrad else 1
        filled = (_blocks(tile, rows, cols) * splits >= MIN_BLOCKS
                  or split_cap_fills and splits == _most_splits(tile, depth))
        if (filled and _waste(tile, rows, cols) <= max_waste
                and (tile.bm * tile.bn < table[0].bm * table[0].bn
                     or math.ceil(depth / splits) >= MIN_K_TILES * tile.bk)):
            return tile
    return table[-1]


def wgrad_splits(tile, rows, cols, depth):
    """How many K ranges a wgrad GEMM is split into (1: no split)."""
    if _forced['splits'] is not None:
        return max(1, min(_forced['splits'], math.ceil(depth / tile.bk)))
    wanted = math.ceil(MIN_BLOCKS / _blocks(tile, rows, cols))   # >= 1
    return min(wanted, _most_splits(tile, depth))


def _most_splits(tile, depth):
    """The split count wgrad_splits gives when the GPU is far from filled: at least
    MIN_K_TILES_PER_SPLIT K tiles per split, at most MAX_SPLITS splits, at least 1."""
    return int(max(1, min(math.ceil(depth / tile.bk) // MIN_K_TILES_PER_SPLIT, MAX_SPLITS)))


def k_per_split(tile, depth, splits):
    """K elements per split: whole BK tiles, so every split but the last is full."""
    return math.ceil(math.ceil(depth / tile.bk) / splits) * tile.bk


def forced_splits():
    """The split count forced by ``forced(splits=...)`` (also for depthwise wgrad), or None."""
    return _forced['splits']


@contextlib.contextmanager
def forced(tile=None, splits=None):
    """Within the block, choose_tile returns the tile named ``tile`` and wgrad (igemm and depthwise) uses ``splits``."""
    previous = dict(_forced)
    _forced.update(tile=tile, splits=splits)
    try:
        yield
    finally:
        _forced.update(previous)
