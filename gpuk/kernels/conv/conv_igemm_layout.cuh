// conv_igemm_layout.cuh: conv_igemm.cu's shared-memory tiles: the dimension each operand tile
// keeps contiguous (Layout), the stage ring's size (A_STAGE, B_STAGE), the 16-byte-unit swizzle or
// padding (tile_offset, tile_index), and which chunks of a tile each thread copies (chunk_row /
// chunk_pos; the tap-tile mapping, TAP_TILES).
// Relies on (conv_igemm.cu, before it): the variant macros CONV_MATH, CONV_BM, CONV_BN, CONV_BK,
// CONV_STAGES, CONV_THREADS, CONV_WARPS_N, CONV_DYNAMIC_SMEM, MODE_*; elem_t (conv_common.cuh).
//
#pragma once

// ---- shared-memory layouts ----
// Every operand is stored with its contiguous global dimension contiguous in shared memory,
// so that one 16-byte cp.async moves VEC neighbours: A is [m][k] for fwd/dgrad (k runs
// along channels) and [k][m] for wgrad (m runs along c_in); B is [k][n] for fwd/wgrad and
// [n][k] for dgrad (k runs along c_out of w[tap, ci, co]).
// Bank conflicts: a row is made of 16-byte units. Tiles are XOR-swizzled (FFMA [m][k] A tiles
// need not be: A_MK_SWIZZLED below): unit u of row r is
// stored at u ^ swizzle(r), which spreads the 8 rows an ldmatrix phase (or a quarter warp of
// FFMA reads down strided columns) reads, and the 8 units a quarter warp of cp.async chunks
// writes, over the 8 bank groups; without padding, BK=16 (FFMA) and BK=32 (16-bit 128x128) fit 3
// stages in the 48 KB of static shared memory (16-bit 64x64: BK=64, 2 stages, 32 KB). tf32 k-major rows (A [k][m] in wgrad, B [k][n] in fwd
// and wgrad) are padded by SMEM_PAD_K = 2 units instead, unswizzled: tile_multiply reads them 8
// bytes per lane at rows t and t + 4 (t = lane % 4), where a swizzle would put rows 0/1 and
// 2/3 in the same banks; a stride of 2 mod 8 units puts the 4 rows of a phase 8 banks apart, so
// 4 lanes' 8-byte pairs per row fill all 32 banks (and an ldmatrix phase over
// tf32 wgrad's transposed blocks, 4 rows x 2 units, 8 bank groups). tf32 [mn][k] rows stay
// swizzled (a padding could not serve both their ldmatrix phases, 8 rows x 1 unit, and their
// chunk accesses, BK=16: 2 rows x 4 units, per quarter warp).
#define VEC (16 / (int)sizeof(elem_t))   // elements per 16-byte unit (chunk)
#if CONV_MATH == 2
#define SMEM_PAD_K (2 * VEC)
#else
#define SMEM_PAD_K 0
#endif
template <int MODE> struct Layout {
    static constexpr bool a_mk = MODE != MODE_WGRAD;   // A as [m][k], else [k][m]
    static constexpr bool b_nk = MODE == MODE_DGRAD;   // B as [n][k], else [k][n]
};
#define CONV_MAX(a, b) ((a) > (b) ? (a) : (b))
#define A_STAGE CONV_MAX(CONV_BM * CONV_BK, CONV_BK * (CONV_BM + SMEM_PAD_K))
#define B_STAGE CONV_MAX(CONV_BN * CONV_BK, CONV_BK * (CONV_BN + SMEM_PAD_K))
#define CONV_STAGE_BYTES (CONV_STAGES * (A_STAGE + B_STAGE) * (int)sizeof(elem_t))
static_assert(CONV_DYNAMIC_SMEM == 0 ? CONV_STAGE_BYTES <= 48 * 1024 : CONV_DYNAMIC_SMEM == CONV_STAGE_BYTES,
              "stage ring: static up to 48 KB, else dynamic of the launcher's size (tiles.dynamic_smem)");

// The unit a row's unit u is stored at: rows of U units, U a power of two >= 2; groups of
// 8/U rows share one XOR pattern when U < 8.
// Unsigned bit arithmetic (rows and columns are never negative): the compiler then sees that
// rows 8 apart share a pattern, so the addresses of a thread's fragments 16 rows apart differ
// by constants (immediate offsets, not one address register per fragment).
template <int U> __device__ __forceinline__ int swizzled_unit(int row, int u) {
    static_assert(U >= 2 && (U & (U - 1)) == 0, "swizzle: rows of 2^n >= 2 units");
    const unsigned r = (unsigned)row;
    return (int)((unsigned)u ^ (U >= 8 ? r & 7u : (r / (8u / U)) & (unsigned)(U - 1)));
}
// [m][k] A tiles (fwd, dgrad) are swizzled for ldmatrix (16-bit, tf32) but not on the FFMA path:
// there every read of them is a quarter-warp broadcast (the 8 threads share their rows, see
// micro_row) and a quarter warp's cp.async chunks fill whole 128-byte lines, so no access
// conflicts either way; unswizzled, a thread's A reads are one base register plus immediates
// (swizzled, one register per (row pattern, unit): 32 of them at BK=32, which spilled the 32x32
// dgrad).
constexpr bool A_MK_SWIZZLED = CONV_MATH != 0;
// Index of a tile element at (row, col) of a tile with rows of LEN elements: swizzled, or padded
// by PAD elements (then not swizzled), or neither.
template <int LEN, int PAD = 0, bool SWIZZLED = true> __device__ __forceinline__ int tile_offset(int row, int col) {
    if (SWIZZLED && PAD == 0) {
        const unsigned c = (unsigned)col;
        return row * LEN + swizzled_unit<LEN / VEC>(row, (int)(c / VEC)) * VEC + (int)(c % VEC);
    }
    return row * (LEN + PAD) + col;
}
// Index of element (mn, k) of a tile with MN rows/columns, stored mn-major ([mn][k]) or k-major.
template <bool MN_MAJOR, int MN, bool SWIZZLED = true>
__device__ __forceinline__ int tile_index(int mn, int k) {
    return MN_MAJOR ? tile_offset<CONV_BK, 0, SWIZZLED>(mn, k) : tile_offset<MN, SMEM_PAD_K, SWIZZLED>(k, mn);
}

// Rows of a k-major tile `rows` apart (a multiple of the swizzle's period, 8 rows, or any count in
// padded tiles) start `rows` whole rows apart: a thread's copies into rows one pass apart then
// address one base register plus immediates (k_rows_apart), where each row's own swizzled index
// took a register per row.
__device__ __forceinline__ constexpr bool k_rows_linear(int rows) { return SMEM_PAD_K != 0 || rows % 8 == 0; }
template <int MN> __device__ __forceinline__ constexpr int k_rows_apart(int rows) { return rows * (MN + SMEM_PAD_K); }

// Chunk mapping: a tile of R rows (the strided dimension) x L contiguous elements is cut into
// L/VEC chunks per row; chunk c = threadIdx.x + j * CONV_THREADS. Every block-wide pass covers
// whole rows, so a thread's position along the contiguous dimension is the same for all j.
#define A_CHUNKS_PER_THREAD (CONV_BM * CONV_BK / VEC / CONV_THREADS)
#define B_CHUNKS_PER_THREAD (CONV_BN * CONV_BK / VEC / CONV_THREADS)
static_assert(A_CHUNKS_PER_THREAD >= 1 && A_CHUNKS_PER_THREAD * VEC * CONV_THREADS == CONV_BM * CONV_BK,
              "A tile: whole 16-byte chunks, at least one per thread");
static_assert(B_CHUNKS_PER_THREAD >= 1 && B_CHUNKS_PER_THREAD * VEC * CONV_THREADS == CONV_BN * CONV_BK,
              "B tile: whole 16-byte chunks, at least one per thread");
static_assert(CONV_THREADS % (CONV_BK / VEC) == 0 && CONV_THREADS % (CONV_BM / VEC) == 0 &&
              CONV_THREADS % (CONV_BN / VEC) == 0, "a block-wide pass covers whole tile rows");
// (row, position along the contiguous dimension) of chunk j of this thread; `len` elements per row.
__device__ __forceinline__ int chunk_row(int j, int len) { return (threadIdx.x + j * CONV_THREADS) / (len / VEC); }
__device__ __forceinline__ int chunk_pos(int len) { return (threadIdx.x % (len / VEC)) * VEC; }

// Tap tiles (TAP_TILES: the tf32 64x64x32 and 128x128x16 tiles): where the gathered operand's channel count is a
// multiple of CONV_BK (fwd: C_in, dgrad: C_out; most layers), every K tile lies within one tap, so
// its chunks along k need no cursor of their own: a thread then copies TAP_UNITS chunks of each of
// TAP_ROWS rows (of fwd's and dgrad's [m][k] A, dgrad's [n][k] B), at units q, q + 2, ... of the row
// (q = tap_unit(0)), each the row's address plus an immediate. Per row and K tile that is one address
// (IMAD.WIDE) and one tap-mask test for 4 chunks, where the chunk mapping above (one k per thread,
// 8 rows) takes one of each per chunk (and on the forward, whose row pointers ptxas keeps in
// unaligned register halves, two register moves per chunk: 32 per 2 K tiles, now 4). Lanes 8i..8i+7
// take 8 neighbouring rows (distinct swizzle patterns: their chunks hit 8 bank groups) at one unit
// parity, lanes 8i + 8 .. 8i + 15 the same rows at the other: a warp's copies fill whole 32-byte
// sectors. Other channel counts keep the chunk mapping above (the per-block choice: GatherA::init).
// The tf32 128x128x16 tile (4 units per row, 2 x 2 warps) takes them too (k14-tf32a100): a thread
// copies units q, q + 2 of 2 rows; the rows of a swizzle pattern are pairs there, so the 8 rows of a
// quarter warp at one unit parity still hit 8 bank groups (even rows the first 4, odd the last 4),
// and the 16 lanes of two parities fill one 32-byte sector per row. Its A, read by both warps of a
// row, is rounded in shared memory by its copier (round_landed_tf32<MODE, TAP>).
#if CONV_MATH == 2 && (CONV_WARPS_N == 1 || (CONV_BK == 16 && CONV_BM == 128 && CONV_BN == 128))
#define TAP_TILES 1
#else
#define TAP_TILES 0
#endif
#define TAP_ROWS_PER_PASS (CONV_THREADS / 2)
#define TAP_UNITS (CONV_BK / VEC / 2)                  // chunks per row and thread
#define TAP_ROWS(mn) ((mn) / TAP_ROWS_PER_PASS)        // rows per thread of a tile with mn rows
static_assert(!TAP_TILES || (CONV_THREADS % 16 == 0 && (CONV_BK / VEC == 8 || CONV_BK / VEC == 4) &&
                             CONV_BM % TAP_ROWS_PER_PASS == 0 && CONV_BN % TAP_ROWS_PER_PASS == 0 &&
                             TAP_ROWS(CONV_BM) <= A_CHUNKS_PER_THREAD),
              "tap tiles: 8 or 4 units per row (8 rows of one quarter warp on 8 bank groups), whole passes of "
              "rows, GatherA's row arrays");
__device__ __forceinline__ int tap_row(int r) {
    return (int)(((threadIdx.x >> 4) << 3) | (threadIdx.x & 7)) + r * TAP_ROWS_PER_PASS;
}
__device__ __forceinline__ int tap_unit(int i) { return 2 * i + (int)((threadIdx.x >> 3) & 1); }
