// conv_igemm.cu: one N-d implicit-GEMM design for the convolution forward pass and
// both gradients. Launched by gpuk/kernels/conv/__init__.py, which #defines the element type,
// the math path and the tile shape (chosen by gpuk/kernels/conv/tiles.py) and computes
// the grid from the same constants.
//
// The three GEMM views (taps = KD*KH*KW, OP/IP = output/input pixels per image):
//   conv_igemm_fwd:   y[m, n]  = sum_k A[m, k] B[k, n]   M = N*OP,      N = C_out, K = taps*C_in
//       A = im2col(x) gathered on the fly (padding/stride/dilation predicates), B = w as (K, C_out).
//   conv_igemm_dgrad: dx[m, n] = ...  per stride phase   M = N*IP/s^k,  N = C_in,  K = taps/s^k*C_out
//       one sub-convolution per stride phase r (grid z; DgradPhase): input pixels i = r + s*q
//       get A[(img, q), (tap, co)] = dy[img, q + (r + pad - tap*dil)/s, co] over the phase's
//       taps only ((r + pad - tap*dil) % s == 0), so no work lands on the stride holes;
//       B[(tap, co), ci] = w[tap, ci, co] (the transposed filter; the flip is implicit).
//   conv_igemm_wgrad: dw[m, n] = ...                     M = taps*C_in, N = C_out, K = N*OP
//       A = im2col(x) transposed, B = dy as (N*OP, C_out). Split-K over gridDim.z: each
//       split writes acc_t partial sums; conv_reduce_splits adds them in split order
//       (deterministic, no atomics). With one split the block writes dw directly.
//
// Math paths (CONV_MATH): 0 = register-blocked FFMA (float32 strict, float64), 16-byte shared reads;
//   1 = mma.m16n8k16 with float32 accumulation on 16-bit inputs: f16 for float16, bf16 for
//       bfloat16 (ELEMENT_T picks the instruction, see Mma16);
//   2 = mma.m16n8k8 tf32 (float32 when gpuk.config.precision() == 'tf32'): each operand element
//       is rounded once (float_to_tf32: to nearest, ties to even; cvt.rn.tf32.f32 on sm_90, one
//       instruction; the same rounding on the bits on sm_80, 3). The filter (fwd's and dgrad's B,
//       read by every block) arrives rounded: conv_round_tf32, launched ahead by the launcher,
//       rounds it once per call. The other operands are rounded in shared memory, by the thread
//       that copied them, between its cp.async wait and the barrier that publishes the stage
//       (round_landed_tf32: the rounding plus a 16-byte load and store per 4 elements, instead
//       of a rounding per fragment register in every warp that reads it; an operand read by one
//       warp only keeps the per-register rounding: Tf32Rounding). Fragments come from ldmatrix for [mn][k]
//       tiles and from 8-byte shared loads for k-major ones: fwd runs as D^T = B^T A^T and wgrad
//       pairs its A rows (Tf32Order); wgrad's dy (and the 128x128 wgrad's x) is rounded and
//       transposed in 4 x 4 blocks by its copiers' warp (round_transposed_tf32) and read by
//       ldmatrix too (K4Transposed). The 64x64 tile runs 2 x 1 warps of 32x64, so each warp
//       reads its rows of A alone and rounds them in its fragment registers (tiles.py).
//       Why round at all: the tensor core reads the top 19 bits of each 32-bit word, i.e. it
//       truncates. Truncation would be free (measured: 1.91 / 1.94 / 2.56 other instructions
//       per MMA for 128x128x16 fwd / dgrad / wgrad on sm_90, 2.5-3.6 on 64x64) but doubles the
//       worst input error (2^-10 instead of 2^-11 relative) and biases every product toward zero,
//       an error that adds up along K instead of averaging out (triton-lang/triton#4574: a
//       truncating tf32 dot measured far less accurate than one rounding with cvt.rna). Ties go
//       to even, not away from zero (cvt.rna, the only rounding sm_80 has): no bias on ties
//       either (they are frequent in data with few significant bits), one instruction on sm_90,
//       and the one rounding of every tf32 path (the wgmma path too), which the tests model
//       (gpuk.kernels.testing.round_tf32, then float32 tolerance). tf32 is opt-in; float32
//       strict runs the FFMA path.
// Tiling: CONV_BM x CONV_BN output tile per block, K in steps of CONV_BK, a CONV_STAGES-deep
//   cp.async pipeline (one barrier per K tile), the K loop unrolled by the stage count so that
//   every shared address is a register plus an immediate (16-bit and most tf32 wgrad's also free
//   of per-tile end tests and its copies of row tests against k_end until its last one or two
//   groups: pipeline_group). Each operand tile is stored in shared memory
//   with its contiguous global dimension contiguous (see Layout), XOR-swizzled in 16-byte units
//   (but FFMA [m][k] A tiles, read by broadcast: A_MK_SWIZZLED); tf32 k-major tiles are padded
//   by two units per row instead (no bank conflicts on the cp.async writes, ldmatrix phases,
//   fragment and FFMA reads). Tile shapes and their choice per
//   problem: gpuk/kernels/conv/tiles.py (table and rules in its docstring): the largest tile
//   that fills two waves of SMs with padding waste <= 1.5 (2.0 where the gathered operand is
//   copied per element, the 7x7 stem) and, for the largest tile, K >= 6 K tiles (1x1 layers);
//   16-bit wgrad picks from its own table, with 64x128 and 128x64 tiles built for it only.
//   FFMA: each thread owns a CONV_TM x CONV_TN micro-tile made of runs of 4 rows/columns
//   (conflict-free 16-byte shared reads). MMA: CONV_WARPS_M x CONV_WARPS_N warps, each a
//   (BM/WARPS_M) x (BN/WARPS_N) warp tile of 16x8 MMA tiles.
// Loads (Loader<MODE>): fwd/dgrad decode their indices (divisions) once per block: each thread
//   keeps, per A row it loads, a pointer to the row's window origin, and one (tap, channel)
//   position for all its chunks (they share k; a TapCursor on the 16-byte path, a TapIter on the
//   per-element one), advanced every K tile by adds and a wrap compare (the cursor's tap wrap:
//   shifts and selects, no nested branches). wgrad keeps, per chunk column, the fixed (tap,
//   channel) as a source pointer for the window origin at pixel 0, and decodes the K position of
//   each k row it loads (1 or 2) afresh every K tile by multiply-shift divisions into its window
//   origin's pixel index and packed coordinates, linear forms of the quotients (PixDecode,
//   PixLinear: constants the launcher computes, read from the constant bank): no state carried
//   across tiles, no branch. Row-major operands
//   (fwd w, wgrad dy) are a pointer plus a count of K rows left (RowStream). Rows past the end get a far-outside origin
//   (or an empty tap mask), so one bounds check covers padding and tails; zero-filled chunks
//   pass their address unread. No thread returns early (dgrad blocks past their phase's rows
//   exit whole).
//   Vector path (channel counts that are multiples of VEC = 16 bytes / element, 16-byte-aligned
//   pointers, tap offsets within 32 bits): one 16-byte zero-filling cp.async per VEC neighbouring
//   channels, which share one padding check; fwd/dgrad test it with the row's tap mask (one LOP3
//   per chunk, see tap_masks_fit) and address the chunk as row pointer + one 32-bit tap offset
//   shared by the thread's chunks; dgrad's filter chunks step a 32-bit offset with the cursor;
//   wgrad packs the pixel's window origin and each chunk's tap offsets into 32-bit words with
//   guard bits (WgradPack: two adds and a LOP3 per chunk) where the image fits the fields (d <
//   2^7, h < 2^10, w < 2^12 coordinates, pads included; checked per block, else three compares:
//   pipeline<MODE, true, PACKED>). Otherwise each element is copied on its own
//   (cp.async of 4/8 bytes; 16-bit elements synchronously; copy_tap_run), the K loop rotating
//   its stages instead of unrolling them. The choice is made once per block, outside the K loop
//   (pipeline<MODE, VECTOR>).
//   Tap tiles (TAP_TILES: the tf32 64x64 tile; pipeline<MODE, true, false, true>): where the
//   gathered channel count (fwd C_in, dgrad C_out) is a multiple of CONV_BK, each K tile lies in one
//   tap, so a thread copies 4 chunks of each of 2 rows (row address + immediates, one tap-mask test
//   per row), fwd's filter rows whole by lane pairs where the block's columns all lie before C_out
//   (RowStream::load_tap: one address step and row test per K tile), dgrad's filter rows through
//   pointers stepped with the cursor; the cursor wraps at most once per tile, and the untested
//   groups run. Other instructions per MMA (inspect, no GPU) 2.75 -> 1.95 fwd, 2.36 -> 1.85 dgrad on
//   sm_90 (3.71 -> 2.92, 3.54 -> 2.81 on sm_80, where A's rounding alone is 1.5); other channel
//   counts keep the chunk mapping (2.56 / 2.39 sm_90). wgrad's tap groups (WG_TAP_GROUPS, the same
//   tile; pipeline<MODE_WGRAD, true, true, TAP>): where C_in is a multiple of 32, each half of a
//   thread's 8 A chunks (units lane % 2 + 2j of its k row) lies in one tap (TAP 1), where it is a
//   multiple of 64 the whole row (TAP 2), so a half (a row) takes one address and one packed bounds
//   test for its 4 (8) chunks; in the untested groups the two lanes of a row decode two tiles' K
//   positions, one each, and swap them by shuffles (WG_SHARED_DECODE); dy's chunks are copied in
//   unit pairs, one address per row for two chunks (RowStream<true>::UNIT_PAIRS). Other
//   instructions per MMA (inspect, no GPU): 3.16 -> 2.69 -> 2.49 on sm_90 (532 -> 472 -> 447
//   instructions per 128 MMAs; C_in a multiple of 32 only: 459, 2.59), 5.38 -> 4.62 on sm_80 (its
//   tap loop had 136 register moves while placed first, see igemm_mainloop). Still above 2, and not
//   reachable on this design: both wgrad operands are activations, rounded in the loop at one
//   conversion per element, which on a 64x64 tile is 1.0 per MMA (32 (BM + BN) / (BM BN) elements
//   per MMA, whatever the warps), and the copies (0.25), A's 8-byte fragment reads (0.25), B's
//   ldmatrix fragments (0.25) and its transposing pass (ldmatrix + store: 0.25) add 1.0 more before
//   any address, index or pipeline instruction (docs/kernels.md, "The tf32 64x64 wgrad's floor").
// Layout: channels_last only (K runs along contiguous channels). The launcher transposes
//   channels_first activations around the kernels (layout.cu; conv/__init__.py Problem), so the
//   kernels have no channels_first path and no layout parameter.
// Epilogue (fwd only): 0 none, 1 + bias[c_out], 2 + bias then relu (relu keeps NaN). Stores
//   go out in runs of consecutive channels (store_tile), each output row out_row(m) mapped once
//   per row a thread owns, before the stores (dgrad's phase rows divide); 16-bit MMA outputs are
//   regrouped in each quad by shuffles into 8-byte runs (store_tile_16bit), so a warp's stores
//   fill whole 32-byte sectors.
// Limits: M, N, K and the pixels of one image < 2^31 (checked by the launcher; indices decode
//   in 32 bits); offsets are 64-bit, except the 32-bit tap, filter (dgrad) and row-stream
//   offsets of the vector path (checked per block: larger reaches take the per-element path),
//   which also needs the filter's taps per dim (of the dgrad phase) plus CONV_BK / VEC to sum
//   to <= 31 for the fwd/dgrad tap masks (tap_masks_fit), and for wgrad x's pixels (all images)
//   < 2^31 and every window origin's pixel index (pads included) < 2^32 (a row's window origin
//   is a 32-bit pixel index); grid.y = N tiles <= 65535,
//   grid.z = splits (wgrad) or stride phases s_d*s_h*s_w (dgrad) <= 65535. No atomics.
#include "conv_common.cuh"

#ifndef CONV_MATH
#define CONV_MATH 0
#endif
#ifndef CONV_BM
#define CONV_BM 64
#endif
#ifndef CONV_BN
#define CONV_BN 64
#endif
#ifndef CONV_BK
#define CONV_BK 8
#endif
#ifndef CONV_TM
#define CONV_TM 4
#endif
#ifndef CONV_TN
#define CONV_TN 4
#endif
#ifndef CONV_WARPS_M
#define CONV_WARPS_M 2
#endif
#ifndef CONV_WARPS_N
#define CONV_WARPS_N 2
#endif
#ifndef CONV_THREADS
#define CONV_THREADS 256
#endif
#ifndef CONV_STAGES
#define CONV_STAGES 3
#endif
#ifndef REDUCE_THREADS
#define REDUCE_THREADS 256
#endif

// __launch_bounds__ names the minimum blocks per SM explicitly: without it this NVRTC's
// ptxas capped registers low (32-64) and spilled the index math.
#define MODE_FWD 0
#define MODE_DGRAD 1
#define MODE_WGRAD 2

#if CONV_MATH == 0
static_assert(CONV_THREADS == (CONV_BM / CONV_TM) * (CONV_BN / CONV_TN), "FFMA: one thread per micro-tile");
#else
static_assert(CONV_THREADS == 32 * CONV_WARPS_M * CONV_WARPS_N, "MMA: one warp per warp tile");
static_assert((CONV_BM / CONV_WARPS_M) % 16 == 0 && (CONV_BN / CONV_WARPS_N) % 8 == 0, "MMA warp tile");
static_assert(CONV_BK % (CONV_MATH == 1 ? 16 : 8) == 0, "MMA k step");
#endif

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
// The stage ring is static shared memory where it fits the 48 KB a kernel may declare statically;
// past that (tf32 128x128x32: 68 KB) the launcher passes its size as CONV_DYNAMIC_SMEM (conv/tiles.py
// dynamic_smem, the same formula) and launches with that much dynamic shared memory.
#ifndef CONV_DYNAMIC_SMEM
#define CONV_DYNAMIC_SMEM 0
#endif
// CONV_KERNELS: the conv kernels this build compiles, as bits (CONV_KERNEL_FWD | _DGRAD | _WGRAD;
// all three unless the launcher says otherwise). A tile registered for one pass only leaves the
// other two as a trap: tiles.FWD_ONLY (tf32 128x128x32: the dgrad and wgrad loaders keep twice
// the per-chunk state at BK=32 and spill) and tiles.WGRAD_ONLY (16-bit 64x128x64 / 128x64x64: the
// forward and dgrad bodies would only cost compile time, about two thirds of the build's). The
// kernel list stays the same in every build (the emulator reads it from this text), and the
// launcher never launches a trapped kernel.
#define CONV_KERNEL_FWD 1
#define CONV_KERNEL_DGRAD 2
#define CONV_KERNEL_WGRAD 4
#ifndef CONV_KERNELS
#define CONV_KERNELS (CONV_KERNEL_FWD | CONV_KERNEL_DGRAD | CONV_KERNEL_WGRAD)
#endif
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

// Tap tiles (TAP_TILES: the tf32 64x64 tile): where the gathered operand's channel count is a
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
#if CONV_MATH == 2 && CONV_WARPS_N == 1
#define TAP_TILES 1
#else
#define TAP_TILES 0
#endif
#define TAP_ROWS_PER_PASS (CONV_THREADS / 2)
#define TAP_UNITS (CONV_BK / VEC / 2)                  // chunks per row and thread
#define TAP_ROWS(mn) ((mn) / TAP_ROWS_PER_PASS)        // rows per thread of a tile with mn rows
static_assert(!TAP_TILES || (CONV_THREADS % 16 == 0 && CONV_BK / VEC == 8 && CONV_BM % TAP_ROWS_PER_PASS == 0 &&
                             CONV_BN % TAP_ROWS_PER_PASS == 0 && TAP_ROWS(CONV_BM) <= A_CHUNKS_PER_THREAD),
              "tap tiles: 8 units per row (one swizzle period), whole passes of rows, GatherA's row arrays");
__device__ __forceinline__ int tap_row(int r) {
    return (int)(((threadIdx.x >> 4) << 3) | (threadIdx.x & 7)) + r * TAP_ROWS_PER_PASS;
}
__device__ __forceinline__ int tap_unit(int i) { return 2 * i + (int)((threadIdx.x >> 3) & 1); }

// ConvGeom, TapSeq / TapIter (K positions) and DgradPhase (stride phases): conv_common.cuh.

// 32 x 32 -> 64-bit multiply(-add)s as single PTX instructions (mad.wide / mul.wide). Written
// in C++, the wgrad loader's chunk addresses (a per-chunk pointer fixed for the block plus the
// row's pixel times the pixel's size) get folded into 64-bit index arithmetic (3-4 instructions
// per chunk; as mad.wide.u32, ptxas computes the row's product once, one IMAD.WIDE.U32, and adds
// it to each chunk's pointer, 2 instructions), and a u64 product of two u32 gets an extra add of
// a zero high word. The emulator computes the same in plain C++.
template <class T> __device__ __forceinline__ const T* index_wide(const T* p, unsigned i, unsigned stride) {
    // p + i * stride elements (i * stride < 2^64: no overflow)
#if !defined(GPUK_EMULATE) && defined(__CUDA_ARCH__)
    const T* r;
    asm("mad.wide.u32 %0, %1, %2, %3;" : "=l"(r) : "r"(i), "r"(stride * (unsigned)sizeof(T)), "l"(p));
    return r;
#else
    return p + (unsigned long long)i * stride;
#endif
}
__device__ __forceinline__ unsigned long long mul_wide(unsigned a, unsigned b) {
#if !defined(GPUK_EMULATE) && defined(__CUDA_ARCH__)
    unsigned long long r;
    asm("mul.wide.u32 %0, %1, %2;" : "=l"(r) : "r"(a), "r"(b));
    return r;
#else
    return (unsigned long long)a * b;
#endif
}

// c ? a : b as one SEL: written in C++, the compiler may branch around the computation of a.
__device__ __forceinline__ unsigned select_u32(bool c, unsigned a, unsigned b) {
#if !defined(GPUK_EMULATE) && defined(__CUDA_ARCH__)
    unsigned r;
    asm("{ .reg .pred p; setp.ne.u32 p, %1, 0; selp.b32 %0, %2, %3, p; }" : "=r"(r) : "r"((unsigned)c), "r"(a), "r"(b));
    return r;
#else
    return c ? a : b;
#endif
}

// Division of numerators n < 2^31 by a block-uniform divisor d >= 1 as one 32 x 32 -> 64-bit
// multiply and a shift (IMAD.WIDE.U32, SHF): with l = ceil(log2 d), s = 31 + l and
// mul = ceil(2^s / d) < 2^32, n * mul / 2^s = n / d + e with 0 <= e < n / 2^s < 2^-l <= 1/d, which
// keeps floor exact. The launcher computes (mul, s) (conv/geometry.py fast_div) and passes them
// as kernel parameters.
struct FastDiv {
    unsigned mul;
    int shift;
    __device__ __forceinline__ int operator()(unsigned n) const {
        return (int)(mul_wide(n, mul) >> shift);
    }
};

// An (image, output pixel) position along K (wgrad), k = ((n * out_d + od) * out_h + oh) * out_w + ow,
// and its quotients: rows = k / out_w, planes = rows / out_h, n = planes / out_d.
struct PixPos { unsigned n; int od, oh, ow; };
struct PixQuot { unsigned k, rows, planes, n; };
// K position -> quotients, decoded afresh for every K tile by three FastDivs (by out_w, out_h,
// out_d; multipliers from the launcher): 6 instructions without a branch, where an iterator carried across tiles needs its wrap branches (pixel -> row ->
// plane -> image, each step of CONV_BK: ~20 instructions per row and tile, counted statically).
// position() adds the three remainders (the bounds-checking paths that need the coordinates).
// k < 2^31 (K < 2^31, checked by the launcher); rows past K decode to garbage no copy reads.
struct PixDecode {
    FastDiv by_w, by_h, by_d;
    __device__ __forceinline__ PixQuot operator()(unsigned k) const {
        PixQuot q;
        q.k = k;
        q.rows = (unsigned)by_w(k);
        q.planes = (unsigned)by_h(q.rows);
        q.n = (unsigned)by_d(q.planes);
        return q;
    }
    __device__ __forceinline__ static PixPos position(const ConvGeom& g, const PixQuot& q) {
        return PixPos{q.n, (int)(q.planes - q.n * (unsigned)g.out_d), (int)(q.rows - q.planes * (unsigned)g.out_h),
                      (int)(q.k - q.rows * (unsigned)g.out_w)};
    }
};
// A value linear in a K position's coordinates, v = n c_n + od c_d + oh c_h + ow s_w (mod 2^32),
// computed from the quotients alone: with ow = k - rows out_w, oh = rows - planes out_h and
// od = planes - n out_d, v = k s_w + rows (c_h - out_w s_w) + planes (c_d - out_h c_h) +
// n (c_n - out_d c_d): four IMADs, none of the remainders (3 more) nor the coordinates' own
// products. The wgrad loader's window origin (its pixel index in x) and packed origin (WgradPack)
// are two such values, both with ow's factor s_w (the stride), so they share the IMAD of k s_w;
// the launcher computes the other three factors (conv/geometry.py wgrad_decode_args).
struct PixLinear {
    unsigned by_rows, by_planes, by_n;
    __device__ __forceinline__ unsigned operator()(const PixQuot& q, unsigned k_term) const {
        return k_term + q.rows * by_rows + q.planes * by_planes + q.n * by_n;
    }
};
// conv_igemm_wgrad's K-position decode: the three divisions and the two linear forms, computed
// per problem by the launcher (conv/geometry.py wgrad_decode_args) and passed as kernel
// parameters, so that the K loop reads them as constant-bank operands: computed by the kernel,
// in registers, ptxas recomputed them in every K tile (uniform IMADs) instead.
struct WgradDecode {
    PixDecode divide;
    unsigned s_w;       // ow's factor in both forms
    PixLinear pixel;    // the window origin of (n, od, oh, ow): pixel ((n in_d + od s_d) in_h + oh s_h) in_w + ow s_w of x
    PixLinear packed;   // the origin's coordinates (od s_d, oh s_h, ow s_w) packed (WgradPack::pack)
    // both forms of a K position
    __device__ __forceinline__ void origin(unsigned k, unsigned& pixel_index, unsigned& packed_origin) const {
        const PixQuot q = divide(k);
        const unsigned k_term = q.k * s_w;
        pixel_index = pixel(q, k_term);
        packed_origin = packed(q, k_term);
    }
};

// ---- global -> shared copies ----
// A 16-byte chunk, zero-filled when !valid: then the source is not read (cp.async with a
// source size of 0), so the address of an out-of-range element may be passed as it is.
__device__ __forceinline__ void copy_chunk(elem_t* dst, const elem_t* src, bool valid) {
    cp_async_16_zfill(dst, src, valid);
}
// Two 16-byte chunks OFFSET elements apart in both shared and global memory from one source
// address, the second's offset inside its cp.async's address (RowStream<true>::UNIT_PAIRS): written
// as two copies, ptxas reassociated the second source (src + OFFSET) + row step and gave it a 64-bit
// address of its own in every row but the first (10 instructions for a tile's 4 row pairs, not 5).
template <int OFFSET>
__device__ __forceinline__ void copy_chunk_pair(elem_t* dst, const elem_t* src, bool valid0, bool valid1) {
#if !defined(GPUK_EMULATE) && defined(__CUDA_ARCH__)
    const unsigned s = (unsigned)__cvta_generic_to_shared(dst);
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n"
                 "cp.async.cg.shared.global [%0+%4], [%1+%4], 16, %3;\n"
                 ::"r"(s), "l"(src), "r"(valid0 ? 16 : 0), "r"(valid1 ? 16 : 0), "n"(OFFSET * (int)sizeof(elem_t)));
#else
    copy_chunk(dst, src, valid0);
    copy_chunk(dst + OFFSET, src + OFFSET, valid1);
#endif
}
// One element, for chunks whose neighbours do not share a padding check (unaligned channel
// counts, unaligned pointers, filters too large for tap masks): cp.async for 4- and 8-byte
// elements, a synchronous copy for 16-bit ones (below cp.async's 4-byte minimum).
__device__ __forceinline__ void copy_scalar(elem_t* dst, const elem_t* src, bool valid) {
    if constexpr (sizeof(elem_t) >= 4) {
        cp_async_zfill<sizeof(elem_t)>(dst, src, valid);
    } else {
        *dst = valid ? *src : ElementTraits<elem_t>::from_acc(0.0f);
    }
}

// Tile rows one block-wide pass of chunks covers (chunk j of a thread is row chunk_row(0) + j * this).
#define ROWS_PER_PASS(len) (CONV_THREADS / ((len) / VEC))
// tf32 wgrad's B (dy) where it is rounded in shared memory (several warps read it: CONV_WARPS_M > 1,
// Tf32Rounding): each warp copies whole 4 x 4 blocks (RowStream<true>) and its rounding pass stores
// them transposed, so ldmatrix reads the MMA's B fragments (K4Transposed).
#define TF32_B_TRANSPOSED (CONV_MATH == 2 && CONV_WARPS_M > 1)

// VEC consecutive positions of a (tap, channel) iterator copied one element at a time (the
// per-element path of every gathered operand): element(t, src) gives position t's source
// element and whether it is inside; `ok` covers what does not depend on t (K or N tails).
// 16-bit elements: not unrolled. There the fallback copies synchronously, which costs far more
// than the loop's branch, and unrolled 8 times inside every chunk loop it tripled the NVRTC time
// of the 16-bit variants (15 -> 5 CPU-s for f16 128x128 on sm_90) without changing the vector
// path's loop. Nor for the float32 FFMA tiles: a branch per element against a cp.async and its
// bounds test, and unrolled it is a fifth of their NVRTC time (docs/kernels.md, "How long it
// takes"); their registers do not grow. float64 and tf32 stay unrolled: rolled, registers grow
// there (the tf32 128x128x32 forward spills on sm_90).
constexpr int COPY_RUN_UNROLL = sizeof(elem_t) == 2 || (sizeof(elem_t) == 4 && CONV_MATH == 0) ? 1 : VEC;
template <class Element>
__device__ __forceinline__ void copy_tap_run(elem_t* dst, const elem_t* __restrict__ data, const TapSeq& taps,
                                             TapIter t, int channels, bool ok, const Element& element) {
#pragma unroll COPY_RUN_UNROLL
    for (int e = 0; e < VEC; ++e) {
        const elem_t* src;
        const bool valid = ok && element(t, src);
        copy_scalar(dst + e, valid ? src : data, valid);   // an invalid element passes a readable address
        t.advance(taps, 1, channels);
    }
}

// ---- tap masks and the tap cursor (the 16-byte path of the gathered A operand) ----
// A tap is a bit per spatial dim, by its index in the sequence (TapSeq): index iw at bit iw, ih
// at bit cw + ih, id at bit cw + ch + id (cw, ch, cd: the sequence's tap counts). A row's mask
// holds the bits of the indices that keep its window inside the source, so the tap is inside
// for that row iff its bits are all in the mask: one LOP3 (need & ~mask, to a predicate) per
// chunk in the K loop instead of three adds and three compares. Past the filter the d index
// runs on to cd and beyond, bits no mask holds: the same test refuses those taps. Needs
// cw + ch + cd plus the taps one K tile can step past the filter (CONV_BK / VEC) <= 31
// (tap_masks_fit); larger filters take the per-element path.
__device__ __forceinline__ bool tap_masks_fit(const TapSeq& s) {
    return s.w.count + s.h.count + s.d.count + CONV_BK / VEC <= 31;
}
__device__ __forceinline__ unsigned dim_mask(const TapDim& t, int size, int origin, int extent, int shift) {
    unsigned bits = 0;
    for (int i = 0; i < t.count; ++i) {
        const int coord = t.k0 + i * t.kstep;
        if (coord < size && (unsigned)(origin + t.o0 + i * t.ostep) < (unsigned)extent) bits |= 1u << (shift + i);
    }
    return bits;
}
// The 16-byte path's K position (fwd/dgrad): (tap, channel c) as the copies use it, the tap's
// offset from a row's window origin plus c (32-bit: GatherA::fast) and its one-hot index bits
// per dim. A K tile adds CONV_BK to c and the offset; each step into the next tap (the wrap,
// c >= channels) shifts the bits and adds one of three precomputed offset steps (next w index;
// w wraps, next h; h wraps too, next d), all by selects: no divisions, no nested branches, so
// the K loop stays short. wrapped(w_end, h_end) lets the dgrad loader step its filter offset.
struct TapCursor {
    int c;
    unsigned off;                 // offset of (tap, c) from a row's window origin (wraps past the filter, unread)
    unsigned wbit, hbit, dbit;    // the tap's index bits (see tap_masks_fit)
    unsigned step_w, step_h, step_d;   // offset steps into the next tap, less `channels` (c wraps)

    __device__ __forceinline__ unsigned need() const { return wbit | hbit | dbit; }
    __device__ __forceinline__ bool in_filter(const TapSeq& s) const {
        return dbit < 1u << (s.w.count + s.h.count + s.d.count);
    }
    __device__ __forceinline__ void start(const TapSeq& s, int k, int channels, int sh, int sw) {
        const int i = k / channels, iw = i % s.w.count, ih = (i / s.w.count) % s.h.count;
        const int id = i / (s.w.count * s.h.count);
        c = k - i * channels;
        wbit = 1u << iw;
        hbit = 1u << (s.w.count + ih);
        dbit = 1u << (s.w.count + s.h.count + id);   // id <= cd + CONV_BK / VEC: tap_masks_fit
        const unsigned C = (unsigned)channels, dw = (unsigned)s.w.ostep * C, dh = (unsigned)(s.h.ostep * sw) * C,
                       dd = (unsigned)(s.d.ostep * sh * sw) * C;
        const unsigned back_w = (unsigned)(s.w.count - 1) * dw, back_h = (unsigned)(s.h.count - 1) * dh;
        step_w = dw - C;
        step_h = dh - back_w - C;
        step_d = dd - back_h - back_w - C;
        off = (((unsigned)(s.d.o0 + id * s.d.ostep) * (unsigned)sh + (unsigned)(s.h.o0 + ih * s.h.ostep)) * (unsigned)sw +
               (unsigned)(s.w.o0 + iw * s.w.ostep)) * C + (unsigned)c;
    }
    // AT_MOST_ONE_WRAP: channels >= CONV_BK (the tap tiles: a multiple of it), so one K tile steps
    // into the next tap at most once (an `if`: no loop and its branch per tile).
    template <bool AT_MOST_ONE_WRAP = false, class Wrapped>
    __device__ __forceinline__ void advance(const TapSeq& s, int channels, const Wrapped& wrapped) {
        c += CONV_BK;
        off += CONV_BK;
        if constexpr (AT_MOST_ONE_WRAP) {
            if (c >= channels) next_tap(s, channels, wrapped);
        } else {
            while (c >= channels) next_tap(s, channels, wrapped);
        }
    }
    template <class Wrapped>
    __device__ __forceinline__ void next_tap(const TapSeq& s, int channels, const Wrapped& wrapped) {
        c -= channels;
        wbit <<= 1;
        const bool w_end = wbit == 1u << s.w.count;
        wbit = w_end ? 1u : wbit;
        const unsigned h = w_end ? hbit << 1 : hbit;
        const bool h_end = h == 1u << (s.w.count + s.h.count);
        hbit = h_end ? 1u << s.w.count : h;
        dbit = h_end ? dbit << 1 : dbit;
        off += w_end ? (h_end ? step_d : step_h) : step_w;
        wrapped(w_end, h_end);
    }
};
// Largest |offset| a dim's taps add to a window origin.
__device__ __forceinline__ long long dim_reach(const TapDim& t) {
    const long long first = t.o0, last = t.o0 + (long long)(t.count - 1) * t.ostep;
    return first < 0 ? (last < 0 ? (-first > -last ? -first : -last) : (-first > last ? -first : last))
                     : (last < 0 ? (first > -last ? first : -last) : (first > last ? first : last));
}

// The gathered A operand of fwd and dgrad: A[m][k] = src[n, origin(m) + offset(tap), c] over a
// channels_last (N, sd, sh, sw, C) source (fwd: x; dgrad: dy), k = (tap of `taps`, c). Row m =
// (n, p) with p a pixel of the grid (gd, gh, gw); its window origin is p * mul + add per dim. A
// thread's chunks share one k (its position along the tile's K), so one TapIter serves them
// all; each chunk keeps its row's base offset, and its window origin (per-element path) or tap
// mask (16-byte path).
struct Source { int sd, sh, sw, channels; long long pix; };
struct RowGrid { int gd, gh, gw, mul_d, mul_h, mul_w, add_d, add_h, add_w; };
struct GatherA {
    const elem_t* row[A_CHUNKS_PER_THREAD];                 // the source at (n, window origin) of row j
    int o_d[A_CHUNKS_PER_THREAD], o_h[A_CHUNKS_PER_THREAD], o_w[A_CHUNKS_PER_THREAD];   // window origin
    unsigned mask[A_CHUNKS_PER_THREAD];                     // taps inside the source for row j
    TapIter k;                                              // this thread's k within the tile (per-element path)
    TapCursor at;                                           // the same k, for the 16-byte path
    bool fast;                                              // 16-byte path allowed (masks, 32-bit tap offsets)
    bool tap_tiles;                                         // the tap-tile mapping (TAP_TILES): row j = tap_row(j)

    // vector: both operands may take 16-byte copies (the loader's other conditions); then TAP_TILES
    // builds take the tap-tile mapping where the channel count allows it.
    __device__ __forceinline__ void init(const Source& src, const RowGrid& grid, const TapSeq& taps,
                                         const elem_t* data, long long rows, long long k_begin, bool vector) {
        const long long row0 = (long long)blockIdx.x * CONV_BM;
        // Tap offsets fit 32 bits, so a chunk's address is its row's pointer plus one 32-bit offset.
        const long long reach = ((dim_reach(taps.d) * src.sh + dim_reach(taps.h)) * src.sw + dim_reach(taps.w) + 1) *
                                src.channels;
        fast = tap_masks_fit(taps) && reach < (1ll << 31);
        // (every use also tests TAP_TILES: the member alone was not folded away where it is 0, and
        // moved the registers of other builds)
        tap_tiles = TAP_TILES && vector && fast && src.channels % CONV_BK == 0 && k_begin % CONV_BK == 0;
#pragma unroll
        for (int j = 0; j < A_CHUNKS_PER_THREAD; ++j) {   // (tap tiles: rows past TAP_ROWS(CONV_BM) unused)
            const long long m = row0 + (TAP_TILES && tap_tiles ? tap_row(j) : chunk_row(j, CONV_BK));
            if (m < rows) {
                const unsigned mu = (unsigned)m, pixels = (unsigned)grid.gd * grid.gh * grid.gw;
                const unsigned n = mu / pixels, p = mu - n * pixels;
                const int pw = (int)(p % (unsigned)grid.gw), ph = (int)((p / (unsigned)grid.gw) % (unsigned)grid.gh);
                const int pd = (int)(p / ((unsigned)grid.gw * (unsigned)grid.gh));
                o_d[j] = pd * grid.mul_d + grid.add_d;
                o_h[j] = ph * grid.mul_h + grid.add_h;
                o_w[j] = pw * grid.mul_w + grid.add_w;
                const long long origin = ((long long)o_d[j] * src.sh + o_h[j]) * src.sw + o_w[j];
                row[j] = data + ((long long)n * src.pix + origin) * src.channels;
            } else {
                o_d[j] = o_h[j] = o_w[j] = FAR_OUTSIDE;
                row[j] = data;
            }
            mask[j] = 0;
            if (fast)   // one region of bits per dim: the test needs each of the tap's three bits
                mask[j] = dim_mask(taps.w, taps.size_w, o_w[j], src.sw, 0) |
                          dim_mask(taps.h, taps.size_h, o_h[j], src.sh, taps.w.count) |
                          dim_mask(taps.d, taps.size_d, o_d[j], src.sd, taps.w.count + taps.h.count);
        }
        // tap tiles: the k of the thread's first unit, in the tile's tap (the others: + 2 * VEC each)
        const int k0 = (int)k_begin + (TAP_TILES && tap_tiles ? tap_unit(0) * VEC : chunk_pos(CONV_BK));
        k.start(taps, k0, src.channels);
        if (fast) at.start(taps, k0, src.channels, src.sh, src.sw);
    }
    // Issues this thread's chunks of one K tile into `as` ([m][k]); does not advance k or `at`.
    // TAP: the tap-tile mapping (tap_tiles; 16-byte path only).
    template <bool VECTOR, bool TAP = false>
    __device__ __forceinline__ void load(const Source& src, const TapSeq& taps, const elem_t* __restrict__ data,
                                         elem_t* as) const {
        static_assert(!TAP || (VECTOR && TAP_TILES), "tap tiles: 16-byte path of TAP_TILES builds");
        const int kc = chunk_pos(CONV_BK);
        if constexpr (TAP) {
            const unsigned need = at.need();
#pragma unroll
            for (int r = 0; r < TAP_ROWS(CONV_BM); ++r) {
                const elem_t* src_row = row[r] + (int)at.off;   // at unit tap_unit(0)
                const bool inside = (need & ~mask[r]) == 0u;
#pragma unroll
                for (int i = 0; i < TAP_UNITS; ++i)
                    copy_chunk(as + tile_index<true, CONV_BM, A_MK_SWIZZLED>(tap_row(r), tap_unit(i) * VEC),
                               src_row + 2 * i * VEC, inside);
            }
        } else if constexpr (VECTOR) {
            const unsigned need = at.need();
#pragma unroll
            for (int j = 0; j < A_CHUNKS_PER_THREAD; ++j)
                copy_chunk(as + tile_index<true, CONV_BM, A_MK_SWIZZLED>(chunk_row(j, CONV_BK), kc),
                           row[j] + (int)at.off, (need & ~mask[j]) == 0u);
        } else {
#pragma unroll
            for (int j = 0; j < A_CHUNKS_PER_THREAD; ++j)
                copy_tap_run(as + tile_index<true, CONV_BM, A_MK_SWIZZLED>(chunk_row(j, CONV_BK), kc), data, taps, k,
                             src.channels, true, [&](const TapIter& t, const elem_t*& at) {
                                 at = row[j] + ((long long)(t.od * src.sh + t.oh) * src.sw + t.ow) * src.channels + t.c;
                                 return t.in_filter(taps) && (unsigned)(o_d[j] + t.od) < (unsigned)src.sd &&
                                        (unsigned)(o_h[j] + t.oh) < (unsigned)src.sh &&
                                        (unsigned)(o_w[j] + t.ow) < (unsigned)src.sw;
                             });
        }
    }
};

// A row-major (K, ld) operand streamed by whole rows (fwd B = w as (taps*C_in, C_out); wgrad
// B = dy as (N*OP, C_out) in channels_last): one pointer per thread, advanced by CONV_BK rows per
// tile, and the count of K rows from the thread's first chunk to k_end, so the per-chunk check is
// one compare with an immediate (the chunk's row offset). A thread's chunks lie in one column of
// units, one block-wide pass (ROWS_PER_PASS) apart. Which thread takes which: chunk_row /
// chunk_pos (a warp's copies fill whole tile rows), or, WARP_BLOCKS (tf32 wgrad's B), lane
// 8i + g of warp w takes unit 8w + g at rows 4j + i: lanes g, g + 8, g + 16, g + 24 copy the 4 rows
// of one 4 x 4 block, which the warp transposes with one ldmatrix per j (round_transposed_tf32),
// and a warp's copies fill 4 rows x 128 bytes.
template <bool WARP_BLOCKS> struct RowStream {
    static constexpr int STEP = ROWS_PER_PASS(CONV_BN);   // rows between a thread's chunks
    static_assert(!WARP_BLOCKS || (STEP == 4 && CONV_BN / VEC == 8 * (CONV_THREADS / 32)),
                  "warp blocks: each warp copies 8 units of 4 x 4 blocks");
    // UNIT_PAIRS (warp blocks of a 16-unit tile, 2 warps: the tf32 64x64 wgrad): lane 8i + g of warp w
    // takes units g and g + 8 at rows 4p + i, p = w, w + 2, w + 4, w + 6 (the warp's blocks are 4 block
    // rows x all 16 units, not 8 block rows x its 8 units), so a thread's chunks are 4 rows x 2 units
    // 32 elements apart: one address per row and tile (the second chunk an immediate further), where
    // 8 rows took one each. A warp's copies still fill 4 rows x 128 bytes per instruction. The second
    // unit of a thread whose first lies before ld but the second not is zero-filled (hi_ok: a
    // thread-constant predicate; it would read past the row, and at dy's last row past dy).
    static constexpr bool UNIT_PAIRS = WARP_BLOCKS && CONV_BN / VEC == 16;
    static constexpr int PAIR_STEP = 8;                  // UNIT_PAIRS: rows between a thread's chunk pairs
    static constexpr int PAIR_UNITS = 8;                 // UNIT_PAIRS: units between a pair's two chunks
    // The tile row of this thread's chunk j, and its position along the row (UNIT_PAIRS: chunk j's
    // is pos() + unit_offset(j)).
    __device__ __forceinline__ static int row(int j) {
        if (UNIT_PAIRS) return ((int)(threadIdx.x & 31) >> 3) + 4 * (int)(threadIdx.x >> 5) + (j >> 1) * PAIR_STEP;
        return (WARP_BLOCKS ? (int)(threadIdx.x & 31) >> 3 : chunk_row(0, CONV_BN)) + j * STEP;
    }
    __device__ __forceinline__ static int pos() {
        if (UNIT_PAIRS) return VEC * (int)(threadIdx.x & 7);
        return WARP_BLOCKS ? VEC * (8 * (int)(threadIdx.x >> 5) + (int)(threadIdx.x & 7)) : chunk_pos(CONV_BN);
    }
    __device__ __forceinline__ static constexpr int unit_offset(int j) { return UNIT_PAIRS ? (j & 1) * PAIR_UNITS * VEC : 0; }
    const elem_t* ptr;   // this thread's chunk 0 of the next tile
    int ahead;           // K rows from this thread's chunk 0 of the next tile to k_end
    int col;             // this thread's first column
    bool hi_ok;          // UNIT_PAIRS: the second unit of each pair lies before ld
    // ld: the operand's columns (its row length). A thread whose columns lie past them (the N tail)
    // points at column 0 instead: its 16-byte copies then read real data into tile columns that
    // only feed accumulator columns the epilogue does not store, so they need no column test
    // (the per-element path tests every column: its copies past ld read nothing).
    // TAP: the tap-tile mapping (fwd's B where TAP_TILES: load_tap), else the one above.
    __device__ __forceinline__ void init(const elem_t* data, long long k_begin, long long k_end, int ld,
                                         bool tap = false) {
        if (TAP_TILES && tap) {
            col = blockIdx.y * CONV_BN + tap_pos();
            ptr = data + (k_begin + tap_k_row()) * ld + col;   // (tap: col < ld)
            ahead = (int)(k_end - k_begin) - tap_k_row();
            return;
        }
        col = blockIdx.y * CONV_BN + pos();
        ptr = data + (k_begin + row(0)) * ld + (col < ld ? col : 0);
        ahead = (int)(k_end - k_begin) - row(0);
        hi_ok = col + PAIR_UNITS * VEC < ld;
    }
    // Tap tiles (TAP_TILES; the block's columns all before ld): thread t copies k row t / 2 whole,
    // units t % 2, t % 2 + 2, ... (a lane pair's copies fill 32-byte sectors; a quarter warp's 4 rows
    // x 2 unit parities hit 8 bank groups at the padded stride of 2 mod 8 units): one address step
    // and one row test per K tile for all of its chunks, immediates apart, where the mapping above
    // takes an address and a row test per chunk (chunks a pass of rows apart).
    static constexpr int TAP_CHUNKS = CONV_BN / VEC / 2;
    __device__ __forceinline__ static int tap_k_row() { return (int)(threadIdx.x >> 1); }
    __device__ __forceinline__ static int tap_pos() { return (int)(threadIdx.x & 1) * VEC; }
    __device__ __forceinline__ void load_tap(elem_t* bs, int ld) {
        static_assert(!TAP_TILES || (CONV_THREADS == 2 * CONV_BK && TAP_CHUNKS == B_CHUNKS_PER_THREAD),
                      "tap tiles: one k row per lane pair");
        elem_t* const dst = bs + tile_index<false, CONV_BN>(tap_pos(), tap_k_row());
        const bool k_ok = 0 < ahead;
#pragma unroll
        for (int i = 0; i < TAP_CHUNKS; ++i) copy_chunk(dst + 2 * i * VEC, ptr + 2 * i * VEC, k_ok);
        ptr += (long long)CONV_BK * ld;
        ahead -= CONV_BK;
    }
    // Whether row `r` of the next tile lies before k_end (another operand's rows, e.g. wgrad A's).
    __device__ __forceinline__ bool row_before_end(int r) const { return r - row(0) < ahead; }
    // The 16-byte path offsets a thread's chunks from `ptr` in 32 bits (one IMAD.WIDE each).
    __device__ __forceinline__ static bool fits(int ld) { return (long long)CONV_BK * ld < (1ll << 31); }
    // FULL: the tile lies before k_end (no row test).
    template <bool VECTOR, bool FULL = false>
    __device__ __forceinline__ void load(elem_t* bs, int ld, int cols) {
        if constexpr (UNIT_PAIRS) {
            elem_t* const dst0 = bs + tile_index<false, CONV_BN>(pos(), row(0));
            const int pair_pass = PAIR_STEP * ld;
#pragma unroll
            for (int q = 0; q < B_CHUNKS_PER_THREAD / 2; ++q) {
                elem_t* const dst = dst0 + k_rows_apart<CONV_BN>(q * PAIR_STEP);
                const elem_t* const src = ptr + q * pair_pass;   // q * pair_pass < CONV_BK * ld: fits()
                const bool k_ok = FULL || q * PAIR_STEP < ahead;   // row(2q) before k_end
                if constexpr (VECTOR) {
                    copy_chunk_pair<PAIR_UNITS * VEC>(dst, src, k_ok, k_ok && hi_ok);
                } else {
#pragma unroll
                    for (int h = 0; h < 2; ++h)
#pragma unroll
                        for (int e = 0; e < VEC; ++e) {
                            const int c = h * PAIR_UNITS * VEC + e;
                            const bool valid = k_ok && col + c < cols;
                            copy_scalar(dst + c, valid ? src + c : ptr, valid);
                        }
                }
            }
            ptr += (long long)CONV_BK * ld;
            ahead -= CONV_BK;
            return;
        }
        const int nc = pos();
        const long long pass = (long long)STEP * ld;
        elem_t* const dst0 = bs + tile_index<false, CONV_BN>(nc, row(0));
#pragma unroll
        for (int j = 0; j < B_CHUNKS_PER_THREAD; ++j) {
            elem_t* dst = k_rows_linear(STEP) ? dst0 + k_rows_apart<CONV_BN>(j * STEP)
                                              : bs + tile_index<false, CONV_BN>(nc, row(j));
            const elem_t* src = ptr + j * pass;
            const bool k_ok = FULL || j * STEP < ahead;   // row(j) before k_end
            if constexpr (VECTOR) {
                copy_chunk(dst, ptr + j * (int)pass, k_ok);   // j * pass < CONV_BK * ld: fits()
            } else {
#pragma unroll
                for (int e = 0; e < VEC; ++e) {
                    const bool valid = k_ok && col + e < cols;
                    copy_scalar(dst + e, valid ? src + e : ptr, valid);
                }
            }
        }
        ptr += (long long)CONV_BK * ld;
        ahead -= CONV_BK;
    }
};

// The per-thread loader state of one operand tile stream. Built once per block (the only
// divisions), then load() issues one K tile and steps every iterator by CONV_BK.
template <int MODE> struct Loader;

// fwd: A = im2col(x) [m = (n, output pixel)][k = (tap, c_in)]; B = w as (taps*C_in, C_out).
template <> struct Loader<MODE_FWD> {
    GatherA a;
    RowStream<false> b;
    bool a_vec, b_vec;

    __device__ __forceinline__ static Source source(const ConvGeom& g) {
        return Source{g.in_d, g.in_h, g.in_w, g.c_in, g.in_pix};
    }
    __device__ __forceinline__ void init(const ConvGeom& g, const elem_t* x, const elem_t* w, long long rows,
                                         long long k_begin, long long k_end) {
        const RowGrid grid{g.out_d, g.out_h, g.out_w, g.s_d, g.s_h, g.s_w, -g.pad_d, -g.pad_h, -g.pad_w};
        // (the conditions in this order, the tap-tile one folded away where TAP_TILES is 0: computing
        // b_vec ahead of a.init moved the 16-bit builds' registers, +6 instructions in one loop)
        // (tap tiles: where the block's columns all lie before C_out, RowStream::load_tap)
        a.init(source(g), grid, dense_taps(g, 0, 0, 0), x, rows, k_begin,
               TAP_TILES && x_vec(g, x) && w_vec(g, w) && (int)(blockIdx.y + 1) * CONV_BN <= g.c_out);
        b.init(w, k_begin, k_end, g.c_out, a.tap_tiles);
        a_vec = a.fast && x_vec(g, x);
        b_vec = w_vec(g, w);
    }
    __device__ __forceinline__ static bool x_vec(const ConvGeom& g, const elem_t* x) {
        return g.c_in % VEC == 0 && is_aligned(x, 16);
    }
    __device__ __forceinline__ static bool w_vec(const ConvGeom& g, const elem_t* w) {
        return g.c_out % VEC == 0 && is_aligned(w, 16) && RowStream<false>::fits(g.c_out);
    }
    template <bool VECTOR, bool TAP = false>
    __device__ __forceinline__ void load(const ConvGeom& g, const elem_t* __restrict__ x,
                                         const elem_t* __restrict__ w, elem_t* as, elem_t* bs, int cols) {
        const TapSeq taps = dense_taps(g, 0, 0, 0);
        a.load<VECTOR, TAP>(source(g), taps, x, as);
        if constexpr (VECTOR) a.at.advance<TAP>(taps, g.c_in, [](bool, bool) {});
        else a.k.advance(taps, CONV_BK, g.c_in);
        if constexpr (TAP) b.load_tap(bs, g.c_out);
        else b.load<VECTOR>(bs, g.c_out, cols);
    }
};

// dgrad, one stride phase (DgradPhase): A[(n, q), (tap, co)] = dy[n, q + offset(tap), co];
// B[(tap, co), ci] = w[tap, ci, co], stored [n=ci][k]. A and B chunks of a thread sit at the
// same k, so A's TapIter also steps B.
template <> struct Loader<MODE_DGRAD> {
    GatherA a;
    TapSeq taps;
    int b_ci;   // this thread's chunk-0 input channel
    // 16-byte path: w at (k's tap, ci, k's c_out channel) as an offset from w + b_ci * C_out,
    // stepped with A's cursor: CONV_BK per tile, and at each tap wrap one of three steps
    unsigned b_off, b_step_w, b_step_h, b_step_d;
    // tap tiles: each of the thread's B rows (input channels) at the K tile's (tap, c_out), stepped
    // as b_off (steps >= 0): one 64-bit add per row and tile, where b_off's sign extension, add to
    // the row's 64-bit offset and scaling took about 5
    const elem_t* b_row[TAP_TILES ? TAP_ROWS(CONV_BN) : 1];
    bool a_vec, b_vec;

    __device__ __forceinline__ static Source source(const ConvGeom& g) {
        return Source{g.out_d, g.out_h, g.out_w, g.c_out, g.out_pix};
    }
    __device__ __forceinline__ void init(const ConvGeom& g, const DgradPhase& phase, const elem_t* dy,
                                         const elem_t* w) {
        taps = phase.taps;
        const RowGrid grid{phase.q_d, phase.q_h, phase.q_w, 1, 1, 1, 0, 0, 0};
        a.init(source(g), grid, taps, dy, phase.rows, 0, TAP_TILES && dy_vec(g, dy) && w_vec(g, w));   // (as fwd's)
        b_ci = blockIdx.y * CONV_BN + (TAP_TILES && a.tap_tiles ? tap_row(0) : chunk_row(0, CONV_BK));
        a_vec = a.fast && dy_vec(g, dy);
        b_vec = w_vec(g, w);
        if (a_vec && b_vec) {
            const unsigned cico = (unsigned)g.c_in * (unsigned)g.c_out, co = (unsigned)g.c_out;
            const unsigned tw = (unsigned)taps.w.kstep, th = (unsigned)(taps.h.kstep * taps.size_w),
                           td = (unsigned)(taps.d.kstep * taps.size_h * taps.size_w);
            const unsigned back_w = (unsigned)(taps.w.count - 1) * tw, back_h = (unsigned)(taps.h.count - 1) * th;
            b_step_w = tw * cico - co;
            b_step_h = (th - back_w) * cico - co;
            b_step_d = (td - back_h - back_w) * cico - co;
            b_off = (unsigned)a.k.tap(taps) * cico + (unsigned)a.k.c;
        }
        if constexpr (TAP_TILES) {
#pragma unroll
            for (int r = 0; r < TAP_ROWS(CONV_BN); ++r)
                b_row[r] = w + (long long)(b_ci + r * TAP_ROWS_PER_PASS) * g.c_out + b_off;
        }
    }
    __device__ __forceinline__ static bool dy_vec(const ConvGeom& g, const elem_t* dy) {
        return g.c_out % VEC == 0 && is_aligned(dy, 16);
    }
    // the filter offsets of the 16-byte path fit 32 bits (past the filter they may wrap: unread)
    __device__ __forceinline__ static bool w_vec(const ConvGeom& g, const elem_t* w) {
        return g.c_out % VEC == 0 && is_aligned(w, 16) && ((long long)g.taps + 1) * g.c_in * g.c_out < (1ll << 31);
    }
    template <bool VECTOR, bool TAP = false>
    __device__ __forceinline__ void load(const ConvGeom& g, const elem_t* __restrict__ dy,
                                         const elem_t* __restrict__ w, elem_t* as, elem_t* bs, int cols) {
        a.load<VECTOR, TAP>(source(g), taps, dy, as);
        const int kc = chunk_pos(CONV_BK);
        if constexpr (TAP) {   // B as A: TAP_ROWS input channels per thread, TAP_UNITS chunks each
            const bool in_filter = a.at.in_filter(taps);
#pragma unroll
            for (int r = 0; r < TAP_ROWS(CONV_BN); ++r) {
                const elem_t* src_row = b_row[r];   // at unit tap_unit(0)
                const bool valid = in_filter && b_ci + r * TAP_ROWS_PER_PASS < cols;
#pragma unroll
                for (int i = 0; i < TAP_UNITS; ++i)
                    copy_chunk(bs + tile_index<true, CONV_BN>(tap_row(r), tap_unit(i) * VEC), src_row + 2 * i * VEC, valid);
            }
            unsigned step = CONV_BK;
            a.at.advance<true>(taps, g.c_out, [&](bool w_end, bool h_end) {
                step += w_end ? (h_end ? b_step_d : b_step_h) : b_step_w;
            });
#pragma unroll
            for (int r = 0; r < TAP_ROWS(CONV_BN); ++r) b_row[r] += step;
        } else if constexpr (VECTOR) {
            const int filter_pass = ROWS_PER_PASS(CONV_BK) * g.c_out;   // < 2^31: b_vec
            const elem_t* tap_w = w + (long long)b_ci * g.c_out + (int)b_off;
            const bool in_filter = a.at.in_filter(taps);
#pragma unroll
            for (int j = 0; j < B_CHUNKS_PER_THREAD; ++j)
                copy_chunk(bs + tile_index<true, CONV_BN>(chunk_row(j, CONV_BK), kc), tap_w + j * filter_pass,
                           in_filter && b_ci + j * ROWS_PER_PASS(CONV_BK) < cols);
            b_off += CONV_BK;
            a.at.advance(taps, g.c_out, [&](bool w_end, bool h_end) {
                b_off += w_end ? (h_end ? b_step_d : b_step_h) : b_step_w;
            });
        } else {
#pragma unroll
            for (int j = 0; j < B_CHUNKS_PER_THREAD; ++j) {
                const int ci = b_ci + j * ROWS_PER_PASS(CONV_BK);
                copy_tap_run(bs + tile_index<true, CONV_BN>(chunk_row(j, CONV_BK), kc), w, taps, a.k, g.c_out,
                             ci < cols, [&](const TapIter& t, const elem_t*& at) {
                                 at = w + ((long long)t.tap(taps) * g.c_in + ci) * g.c_out + t.c;
                                 return t.in_filter(taps);
                             });
            }
            a.k.advance(taps, CONV_BK, g.c_out);
        }
    }
};

// wgrad: A[(tap, ci), (n, output pixel)] = x[n, o*s + tap*dil - pad, ci], stored [k][m];
// B = dy as (N*OP, C_out), stored [k][n] (a RowStream).
// A's chunks: WG_LANES threads share each k row (one output pixel), so that a warp's copies
// read whole 32-byte sectors (neighbouring lanes, neighbouring 16-byte units of one pixel);
// each thread copies WG_ROWS k rows (2 where the block has as many threads as K rows, the
// f16 64x64x64 tile; else 1), THREADS / WG_LANES rows apart, and WG_CHUNKS chunks along m in
// each (wgrad_a_unit). Each K tile decodes each row's pixel once for its chunks (PixDecode; two
// lanes sharing two rows decode one each and swap, WG_PAIRED), and each chunk column keeps its
// fixed (tap, channel) as a 32-bit offset from the pixel's window origin plus the tap's spatial
// offsets for the bounds check (shared by the thread's rows).
#define WG_LANES (CONV_THREADS / CONV_BK >= 2 ? CONV_THREADS / CONV_BK : 2)
#define WG_ROWS (CONV_BK * WG_LANES / CONV_THREADS)
#define WG_CHUNKS (A_CHUNKS_PER_THREAD / WG_ROWS)
static_assert(WG_ROWS * CONV_THREADS == CONV_BK * WG_LANES && WG_LANES * WG_CHUNKS * VEC == CONV_BM &&
              (WG_CHUNKS & (WG_CHUNKS - 1)) == 0 && (CONV_THREADS / WG_LANES) % WG_CHUNKS == 0,
              "wgrad A: whole k rows per thread, 2^n chunks per row");
// Packed path: the two lanes that share a thread's two k rows decode one each (Loader::load).
#define WG_PAIRED (WG_ROWS == 2 && WG_LANES % 2 == 0)
// tf32 wgrad's A, where rounded in shared memory (CONV_WARPS_N > 1) and copied one k row per 8 lanes
// (lane 8i + g of warp w: row 4w + i, units g + 8j): a warp holds whole 4 x 4 blocks, which its
// rounding pass stores transposed like B's (TF32_B_TRANSPOSED, K4Transposed), and ldmatrix reads
// the MMA's A fragments in the plain row order (not Tf32Order's paired rows).
#define TF32_A_TRANSPOSED (CONV_MATH == 2 && CONV_WARPS_N > 1 && WG_LANES == 8 && WG_ROWS == 1)
__device__ __forceinline__ int wgrad_a_row(int r) { return threadIdx.x / WG_LANES + r * (CONV_THREADS / WG_LANES); }
// The row a thread decodes first: its own (lane & 1) of the pair's two where WG_PAIRED, else its row 0.
__device__ __forceinline__ int wgrad_decoded_row() { return wgrad_a_row(WG_PAIRED ? threadIdx.x & 1 : 0); }
// The 16-byte unit of chunk j along m: a row's units are dealt to its lanes in turn and
// in swizzled tiles permuted per row (j ^ row; a thread's rows share the low bits), so that the
// 8 chunks a quarter warp writes at once land in 8 distinct bank groups. tf32's padded k-major
// rows (a stride of 2 mod 8 units, see SMEM_PAD_K) need no permutation: there j ^ row would put
// rows 0 and 2 of the 64x64 tile (2 threads per row) on the same groups.
__device__ __forceinline__ int wgrad_a_unit(int j) {
    const int permute = SMEM_PAD_K ? 0 : wgrad_a_row(0) & (WG_CHUNKS - 1);
    return threadIdx.x % WG_LANES + WG_LANES * (j ^ permute);
}
// WgradPack: the wgrad 16-byte path's bounds test, "0 <= origin + tap < size on d, h and w",
// in one add per side and one AND. A coordinate v of an axis of size S gets a W-bit field
// (d: 8, h: 11, w: 13 bits; half = 2^(W-1)) in two 32-bit words: up = v + half - S and
// lo = half - 1 - v. While every reachable v lies in [S - half, half - 1] (fits(), per block)
// both stay in [0, 2^W), so the fields never carry into each other, and a field's top (guard)
// bit is set exactly when v >= S (up) or v < 0 (lo). The words are linear in v: up = origin +
// (tap + up_bias), the tap term fixed per chunk column, the origin packed once per row and tile,
// and lo = bounds - up (bounds = up_bias + lo_bias, per block; lo = lo_bias - tap - origin), so a
// chunk column keeps one word (a register each; two words were recomputed every K tile instead). Rows past k_end take fake_origin() (w = -1 - last tap)
// and chunks past the filter far_tap() (w = -1 - the largest origin), both outside on w.
// Larger images (or pads) keep the three compares (Loader<MODE_WGRAD>::load<true, false>), and so do
// tiles with fewer than 4 chunks per row (f64): there the per-tile packing and biases cost more
// than the 3 instructions a chunk saves.
#define WG_PACKED (WG_CHUNKS >= 4)
// Tap groups (the tf32 64x64 tile, TAP_TILES): a thread's WG_CHUNKS = 8 chunks of its k row are units
// lane % 2 + 2j; chunks 0-3 lie in the row's first WG_TAP_SPAN elements along m, 4-7 in its second.
// Where C_in is a multiple of that span (and the block's m0 of it: CONV_BM = 2 spans), each group lies
// in one tap: one address (the 64-bit add of the row's pixel offset) and one packed bounds test per
// group and K tile instead of one per chunk (Loader<MODE_WGRAD>::load<..., TAP = 1>); where C_in is a
// multiple of CONV_BM, the whole row lies in one tap: one address and one test per row and K tile
// (TAP = 2; Loader::a_tap says which, per block). Per 128 MMAs (with the shared decode and dy's unit
// pairs below): halves 459 instructions on sm_90, 730 on sm_80; whole rows 447 / 720.
#define WG_TAP_GROUPS (TAP_TILES && WG_LANES == 2 && WG_ROWS == 1 && WG_CHUNKS == 8 && WG_PACKED)
#define WG_TAP_CHUNKS 4
// Shared decode (the tf32 64x64 wgrad's packed path, tap groups and per chunk, in the untested
// pipeline groups of an even stage count): the two lanes of a k row (WG_LANES = 2) decoded the same K
// position, so each decodes one of two tiles' (its pair's row in this tile, lane & 1 == 0, or in the
// next one) and the pair swaps them by shuffles: per two tiles one decode and 4 SHFL per thread
// instead of two decodes (Loader<MODE_WGRAD>::load, SHARED; sm_90: halves 472 -> 463, per chunk
// 528 -> 517 instructions per 128 MMAs).
#define WG_SHARED_DECODE (WG_TAP_GROUPS && CONV_STAGES % 2 == 0)
#define WG_TAP_SPAN (CONV_BM / 2)
static_assert(!WG_TAP_GROUPS || (WG_TAP_SPAN == WG_LANES * WG_TAP_CHUNKS * VEC && CONV_BM == 2 * WG_TAP_SPAN),
              "tap groups: two halves of the row");
struct WgradPack {
    static constexpr int W_BITS = 13, H_BITS = 11, D_BITS = 8;
    static constexpr int H_SHIFT = W_BITS, D_SHIFT = W_BITS + H_BITS;   // also in conv/geometry.py (WGRAD_PACK_*)
    static_assert(D_SHIFT + D_BITS == 32, "three fields fill 32 bits");
    static constexpr unsigned GUARD = (1u << (W_BITS - 1)) | (1u << (H_SHIFT + H_BITS - 1)) | (1u << 31);
    __device__ __forceinline__ static unsigned pack(int d, int h, int w) {   // mod 2^32: exact once added up
        return ((unsigned)d << D_SHIFT) + ((unsigned)h << H_SHIFT) + (unsigned)w;
    }
    __device__ __forceinline__ static unsigned up_bias(const ConvGeom& g) {
        return pack((1 << (D_BITS - 1)) - g.in_d, (1 << (H_BITS - 1)) - g.in_h, (1 << (W_BITS - 1)) - g.in_w);
    }
    __device__ __forceinline__ static unsigned lo_bias() {
        return pack((1 << (D_BITS - 1)) - 1, (1 << (H_BITS - 1)) - 1, (1 << (W_BITS - 1)) - 1);
    }
    __device__ __forceinline__ static unsigned bounds(const ConvGeom& g) { return up_bias(g) + lo_bias(); }
    __device__ __forceinline__ static bool inside(unsigned up, unsigned bounds) { return ((up | (bounds - up)) & GUARD) == 0; }
    __device__ __forceinline__ static long long first(const TapDim& t) { return t.o0; }
    __device__ __forceinline__ static long long last(const TapDim& t) { return t.o0 + (long long)(t.count - 1) * t.ostep; }
    __device__ __forceinline__ static long long lesser(long long a, long long b) { return a < b ? a : b; }
    __device__ __forceinline__ static long long greater(long long a, long long b) { return a > b ? a : b; }
    __device__ __forceinline__ static long long tap_min(const TapDim& t) { return lesser(first(t), last(t)); }
    __device__ __forceinline__ static long long tap_max(const TapDim& t) { return greater(first(t), last(t)); }
    __device__ __forceinline__ static int fake_w(const ConvGeom& g, const TapSeq& taps) { return (int)(-1 - tap_max(taps.w)); }
    __device__ __forceinline__ static unsigned fake_origin(const ConvGeom& g) {
        return pack(0, 0, fake_w(g, dense_taps(g, -g.pad_d, -g.pad_h, -g.pad_w)));
    }
    __device__ __forceinline__ static int far_tap(const ConvGeom& g, const TapSeq& taps) {
        return (int)(-1 - greater((long long)(g.out_w - 1) * g.s_w, fake_w(g, taps)));
    }
    // every reachable coordinate v of the axis within [size - half, half - 1]
    __device__ __forceinline__ static bool axis_fits(long long vmin, long long vmax, long long size, int bits) {
        const long long half = 1ll << (bits - 1);
        return vmin >= size - half && vmax <= half - 1;
    }
    __device__ __forceinline__ static bool fits(const ConvGeom& g, const TapSeq& taps) {
        const long long od = (long long)(g.out_d - 1) * g.s_d, oh = (long long)(g.out_h - 1) * g.s_h;
        const long long ow = (long long)(g.out_w - 1) * g.s_w, fake = fake_w(g, taps), far = far_tap(g, taps);
        // d, h: origins [0, o], taps [min, max] (the far chunks use the first tap, the fake origin 0);
        // w: origins [0, ow] and the fake one, taps [min, max] and the far one
        return axis_fits(tap_min(taps.d), od + tap_max(taps.d), g.in_d, D_BITS) &&
               axis_fits(tap_min(taps.h), oh + tap_max(taps.h), g.in_h, H_BITS) &&
               axis_fits(lesser(0, fake) + lesser(tap_min(taps.w), far), greater(ow, fake) + greater(tap_max(taps.w), far),
                         g.in_w, W_BITS);
    }
};

template <> struct Loader<MODE_WGRAD> {
    WgradDecode decode;                   // K position -> quotients -> window origin (pixel, packed)
    unsigned k_row;                       // K position of wgrad_decoded_row() in the next tile (< 2^32)
    TapIter a_m[WG_CHUNKS];               // chunk j's (tap, ci) column, fixed for the block (per-element path)
    const elem_t* a_base[WG_CHUNKS];      // 16-byte path: chunk j's source for the window origin at pixel 0
    int a_td[WG_CHUNKS], a_th[WG_CHUNKS], a_tw[WG_CHUNKS];   // its tap's offsets
    unsigned a_up[WG_CHUNKS];             // packed path: its tap + WgradPack::up_bias
    RowStream<TF32_B_TRANSPOSED> b;       // b.row_before_end: whether a k row of the next tile is before k_end
    bool a_vec, b_vec, a_packed;          // a_packed: the image fits WgradPack (16-byte path only)
    int a_tap;                            // tap groups (WG_TAP_GROUPS): 2 where C_in is a multiple of the whole
                                          // row's span (CONV_BM), 1 of a half's (WG_TAP_SPAN), else 0
    unsigned shared_pixel, shared_at;     // WG_SHARED_DECODE: this lane's decoded row (its tile: lane & 1)

    __device__ __forceinline__ void init(const ConvGeom& g, const WgradDecode& wgrad_decode, const elem_t* x,
                                         const elem_t* dy, long long k_begin, long long k_end) {
        const TapSeq taps = dense_taps(g, -g.pad_d, -g.pad_h, -g.pad_w);
        decode = wgrad_decode;
        k_row = (unsigned)k_begin + (unsigned)wgrad_decoded_row();
        // 16-byte path: x's pixels (all images) fit 32 bits, and so does every row's window origin
        // as a pixel index (PixLinear computes it mod 2^32; padding can put origins past x's
        // pixels), so a chunk's address is its a_base plus that index times C_in (one IMAD.WIDE.U32)
        const long long last_origin =
            ((((long long)g.batch - 1) * g.in_d + (long long)(g.out_d - 1) * g.s_d) * g.in_h +
             (long long)(g.out_h - 1) * g.s_h) * g.in_w + (long long)(g.out_w - 1) * g.s_w;
        const bool fits = (long long)g.batch * g.in_pix < (1ll << 31) && last_origin < (1ll << 32);
#pragma unroll
        for (int j = 0; j < WG_CHUNKS; ++j) {
            TapIter& t = a_m[j];
            t.start(taps, blockIdx.x * CONV_BM + wgrad_a_unit(j) * VEC, g.c_in);
            const bool inside = t.in_filter(taps);   // false past the last (tap, ci) column
            a_td[j] = inside ? t.od : FAR_OUTSIDE;
            a_th[j] = t.oh;
            a_tw[j] = t.ow;
            // (an address for the zero-filled chunks past the filter too; a_base itself may lie before x)
            a_base[j] = x + (inside ? ((long long)(t.od * g.in_h + t.oh) * g.in_w + t.ow) * g.c_in + t.c : 0);
            // past the filter: a w offset that puts every origin (the rows' and the fake) left of 0
            const unsigned tap = WgradPack::pack(inside ? t.od : taps.d.o0, inside ? t.oh : taps.h.o0,
                                                 inside ? t.ow : WgradPack::far_tap(g, taps));
            a_up[j] = tap + WgradPack::up_bias(g);
        }
        a_packed = WG_PACKED && WgradPack::fits(g, taps);
        a_tap = !WG_TAP_GROUPS ? 0 : g.c_in % CONV_BM == 0 ? 2 : g.c_in % WG_TAP_SPAN == 0 ? 1 : 0;
        b.init(dy, k_begin, k_end, g.c_out);
        a_vec = fits && g.c_in % VEC == 0 && is_aligned(x, 16);
        b_vec = g.c_out % VEC == 0 && is_aligned(dy, 16) && RowStream<TF32_B_TRANSPOSED>::fits(g.c_out);
    }

    // x's element (tap, channel t; image and output pixel p): its offset and whether it is inside.
    __device__ __forceinline__ bool a_element(const ConvGeom& g, const TapSeq& taps, const TapIter& t,
                                              const PixPos& p, long long& offset) const {
        const int id = p.od * g.s_d + t.od, ih = p.oh * g.s_h + t.oh, iw = p.ow * g.s_w + t.ow;
        const int ipix = (id * g.in_h + ih) * g.in_w + iw;   // within one image: < 2^31 (launcher)
        offset = p.n * (g.in_pix * g.c_in) + ((long long)ipix * g.c_in + t.c);
        return t.in_filter(taps) && (unsigned)id < (unsigned)g.in_d && (unsigned)ih < (unsigned)g.in_h &&
               (unsigned)iw < (unsigned)g.in_w;
    }

    // The K position of k row `row` in the next tile.
    __device__ __forceinline__ unsigned row_k(int row) const { return k_row + (unsigned)(row - wgrad_decoded_row()); }
    // The packed path's view of k row `row`: its window origin's pixel index in x and the origin
    // packed (WgradPack), the fake origin for rows past k_end.
    template <bool FULL>
    __device__ __forceinline__ void row_origin(const ConvGeom& g, int row, unsigned& pixel, unsigned& at) const {
        unsigned packed;
        decode.origin(row_k(row), pixel, packed);
        at = FULL ? packed : select_u32(b.row_before_end(row), packed, WgradPack::fake_origin(g));
    }

    // One K tile: this thread's chunks of each of its k rows, then B (RowStream).
    //   16-byte path (VECTOR): a chunk's address is its a_base plus the row's origin pixel times
    //     C_in; its bounds test is packed (PACKED: two adds and a LOP3, WgradPack) or three compares.
    //     Packed, where a thread has two rows and shares them with its neighbour lane (WG_PAIRED),
    //     each lane decodes one (wgrad_decoded_row: row lane & 1) and the pair swaps them by
    //     shuffles (4 instead of ~16 instructions). Both lanes copy the same row at once (their
    //     units of one pixel fill whole sectors): handing a lane its own row first (2 shuffles)
    //     dropped the emulated coalescing to 0.74-0.83.
    //   Per-element path: copy_tap_run over each chunk's VEC (tap, channel) positions.
    // Rows past k_end copy nothing (k_ok; packed: the fake origin). FULL: every row of the tile lies
    // before k_end (the tiles before a split's last: k_per_split is whole K tiles), no row test.
    //   TAP (tap groups, WG_TAP_GROUPS; packed path, a_tap): the WG_TAP_CHUNKS chunks of a group (TAP 1)
    //     or the row's WG_CHUNKS (TAP 2) lie in one tap, so the group's first chunk column gives the
    //     address (its a_base, the others immediates apart) and the bounds test of all of them.
    //   SHARED (WG_SHARED_DECODE; untested groups, FULL): 1 in a group's even tiles, where each lane
    //     decodes its pair's row of this tile (lane & 1 == 0) or of the next (1) and both lanes take
    //     the first by a shuffle; 2 in the odd tiles, which take the second (no decode).
    template <bool VECTOR, bool PACKED = false, bool FULL = false, int TAP = 0, int SHARED = 0>
    __device__ __forceinline__ void load(const ConvGeom& g, const elem_t* __restrict__ x,
                                         const elem_t* __restrict__ dy, elem_t* as, elem_t* bs, int cols) {
        static_assert(VECTOR || !PACKED, "packed bounds: 16-byte path only");
        static_assert(!TAP || (PACKED && WG_TAP_GROUPS), "tap groups: packed 16-byte path of WG_TAP_GROUPS builds");
        static_assert(!SHARED || (PACKED && FULL && WG_SHARED_DECODE && WG_ROWS == 1), "shared decode: packed, untested");
        constexpr bool PAIRED = PACKED && WG_PAIRED;
        unsigned own_pixel = 0, own_at = 0;   // PAIRED: this lane's row (lane & 1), decoded once
        if constexpr (PAIRED) row_origin<FULL>(g, wgrad_decoded_row(), own_pixel, own_at);
#pragma unroll
        for (int r = 0; r < WG_ROWS; ++r) {
            const int row = wgrad_a_row(r);
            const bool k_ok = FULL || b.row_before_end(row);
            unsigned pixel = 0;   // 16-byte path: the window origin's pixel index in x
            unsigned at = 0;      // packed path
            PixPos p{};           // three compares and per-element path
            if constexpr (SHARED) {
                // SHARED 1: this tile and the next one's row of the pair, decoded by lanes 0 and 1 of it;
                // 2: the next one's, decoded then
                if constexpr (SHARED == 1)
                    decode.origin(row_k(row) + (threadIdx.x & 1) * (unsigned)CONV_BK, shared_pixel, shared_at);
                const int lane = (threadIdx.x & 31 & ~1) | (SHARED - 1);
                pixel = __shfl_sync(0xffffffffu, shared_pixel, lane);
                at = __shfl_sync(0xffffffffu, shared_at, lane);
            } else if constexpr (PAIRED) {
                const int lane = (threadIdx.x & 31 & ~1) | r;   // the lane that decoded row r
                pixel = __shfl_sync(0xffffffffu, own_pixel, lane);
                at = __shfl_sync(0xffffffffu, own_at, lane);
            } else if constexpr (PACKED) {
                row_origin<FULL>(g, row, pixel, at);
            } else {
                const PixQuot q = decode.divide(row_k(row));
                p = PixDecode::position(g, q);
                if constexpr (VECTOR) pixel = decode.pixel(q, q.k * decode.s_w);
            }
            if constexpr (TAP) {
                constexpr int GROUP = TAP == 2 ? WG_CHUNKS : WG_TAP_CHUNKS;   // chunks in one tap
#pragma unroll
                for (int h = 0; h < WG_CHUNKS / GROUP; ++h) {
                    const int j0 = h * GROUP;
                    const elem_t* const src = index_wide(a_base[j0], pixel, (unsigned)g.c_in);
                    const bool inside = WgradPack::inside(at + a_up[j0], WgradPack::bounds(g));
#pragma unroll
                    for (int i = 0; i < GROUP; ++i)
                        copy_chunk(as + tile_index<false, CONV_BM>(wgrad_a_unit(j0 + i) * VEC, row),
                                   src + (wgrad_a_unit(j0 + i) - wgrad_a_unit(j0)) * VEC, inside);
                }
                continue;
            }
#pragma unroll
            for (int j = 0; j < WG_CHUNKS; ++j) {
                elem_t* dst = as + tile_index<false, CONV_BM>(wgrad_a_unit(j) * VEC, row);
                if constexpr (PACKED) {
                    copy_chunk(dst, index_wide(a_base[j], pixel, (unsigned)g.c_in),
                               WgradPack::inside(at + a_up[j], WgradPack::bounds(g)));
                } else if constexpr (VECTOR) {
                    // & rather than &&: no branches around the compares
                    copy_chunk(dst, index_wide(a_base[j], pixel, (unsigned)g.c_in),
                               k_ok & ((unsigned)(p.od * g.s_d + a_td[j]) < (unsigned)g.in_d) &
                                   ((unsigned)(p.oh * g.s_h + a_th[j]) < (unsigned)g.in_h) &
                                   ((unsigned)(p.ow * g.s_w + a_tw[j]) < (unsigned)g.in_w));
                } else {
                    const TapSeq taps = dense_taps(g, -g.pad_d, -g.pad_h, -g.pad_w);
                    copy_tap_run(dst, x, taps, a_m[j], g.c_in, k_ok, [&](const TapIter& t, const elem_t*& src) {
                        long long offset;
                        const bool inside = a_element(g, taps, t, p, offset);
                        src = x + offset;
                        return inside;
                    });
                }
            }
        }
        k_row += CONV_BK;
        b.load<VECTOR, FULL>(bs, g.c_out, cols);
    }
};

// ---- the multiply of one K-tile, per math path ----
#if CONV_MATH == 0
#define ACC_COUNT (CONV_TM * CONV_TN)
static_assert(CONV_TM % 4 == 0 && CONV_TN % 4 == 0, "FFMA micro-tile: runs of 4");
// Micro-tile mapping: a thread's TM rows are runs of 4 consecutive rows, BM / (TM/4) apart
// (likewise for columns), so 8 neighbouring threads read 8 consecutive 16-byte pieces of a
// k-major tile: no bank conflicts, one LDS.128 per run. The 8 threads of a quarter warp share
// ty, so [m][k] A tiles are broadcast reads (stored unswizzled). An [n][k] B tile (dgrad) is read along k by
// neighbouring tx: there the columns are strided (tx, tx + BN/TN, ...), so the 8 threads read
// 8 consecutive rows, which the swizzle puts in 8 distinct 16-byte bank groups.
__device__ __forceinline__ int micro_row(int i) {
    const int ty = threadIdx.x / (CONV_BN / CONV_TN);
    return (i / 4) * (CONV_BM / (CONV_TM / 4)) + ty * 4 + i % 4;
}
template <int MODE>
__device__ __forceinline__ int micro_col(int j) {
    const int tx = threadIdx.x % (CONV_BN / CONV_TN);
    if (Layout<MODE>::b_nk) return j * (CONV_BN / CONV_TN) + tx;
    return (j / 4) * (CONV_BN / (CONV_TN / 4)) + tx * 4 + j % 4;
}
// Four consecutive elements of a tile row (rows of LEN elements), from a column that is a
// multiple of 4: explicit 16-byte shared reads (one float4 or two double2), whose address
// the swizzle computes once per unit.
static_assert(sizeof(elem_t) == 4 || sizeof(elem_t) == 8, "FFMA: float or double");
template <int LEN, bool SWIZZLED = true>
__device__ __forceinline__ void read_run4(const elem_t* __restrict__ tile, int row, int col, acc_t (&out)[4]) {
    if constexpr (sizeof(elem_t) == 4) {
        const float4 v = *reinterpret_cast<const float4*>(tile + tile_offset<LEN, 0, SWIZZLED>(row, col));
        out[0] = v.x; out[1] = v.y; out[2] = v.z; out[3] = v.w;
    } else {
        const double2 lo = *reinterpret_cast<const double2*>(tile + tile_offset<LEN, 0, SWIZZLED>(row, col));
        const double2 hi = *reinterpret_cast<const double2*>(tile + tile_offset<LEN, 0, SWIZZLED>(row, col + 2));
        out[0] = lo.x; out[1] = lo.y; out[2] = hi.x; out[3] = hi.y;
    }
}
// Four k at a time: an [m][k] tile gives each row's 4 k in one run, a k-major tile each run
// of 4 rows per k.
template <int MODE>
__device__ __forceinline__ void tile_multiply(const elem_t* __restrict__ as, const elem_t* __restrict__ bs,
                                              acc_t* acc) {
#pragma unroll
    for (int k0 = 0; k0 < CONV_BK; k0 += 4) {
        acc_t a[CONV_TM][4], b[CONV_TN][4];
        if (Layout<MODE>::a_mk) {
#pragma unroll
            for (int i = 0; i < CONV_TM; ++i) read_run4<CONV_BK, A_MK_SWIZZLED>(as, micro_row(i), k0, a[i]);
        } else {
#pragma unroll
            for (int kk = 0; kk < 4; ++kk)
#pragma unroll
                for (int i0 = 0; i0 < CONV_TM; i0 += 4) {
                    acc_t run[4];
                    read_run4<CONV_BM>(as, k0 + kk, micro_row(i0), run);
#pragma unroll
                    for (int q = 0; q < 4; ++q) a[i0 + q][kk] = run[q];
                }
        }
        if (Layout<MODE>::b_nk) {
#pragma unroll
            for (int j = 0; j < CONV_TN; ++j) read_run4<CONV_BK>(bs, micro_col<MODE>(j), k0, b[j]);
        } else {
#pragma unroll
            for (int kk = 0; kk < 4; ++kk)
#pragma unroll
                for (int j0 = 0; j0 < CONV_TN; j0 += 4) {
                    acc_t run[4];
                    read_run4<CONV_BN>(bs, k0 + kk, micro_col<MODE>(j0), run);
#pragma unroll
                    for (int q = 0; q < 4; ++q) b[j0 + q][kk] = run[q];
                }
        }
#pragma unroll
        for (int kk = 0; kk < 4; ++kk)
#pragma unroll
            for (int i = 0; i < CONV_TM; ++i)
#pragma unroll
                for (int j = 0; j < CONV_TN; ++j)
                    acc[i * CONV_TN + j] = fma(a[i][kk], b[j][kk], acc[i * CONV_TN + j]);
    }
}
// Accumulator e lies in the thread's row slot `slot` (of ThreadRows<MODE>::count) and at column
// `col` of the block tile; slot s is block-tile row slot_row(s).
template <int MODE> struct ThreadRows { static constexpr int count = CONV_TM; };
template <int MODE>
__device__ __forceinline__ void acc_position(int e, int& slot, int& col) {
    slot = e / CONV_TN;
    col = micro_col<MODE>(e % CONV_TN);
}
template <int MODE>
__device__ __forceinline__ int slot_row(int slot) { return micro_row(slot); }
#else
#define WARP_TILE_M (CONV_BM / CONV_WARPS_M)
#define WARP_TILE_N (CONV_BN / CONV_WARPS_N)
#define MMA_M_TILES (WARP_TILE_M / 16)
#define MMA_N_TILES (WARP_TILE_N / 8)
#define ACC_COUNT (MMA_M_TILES * MMA_N_TILES * 4)
#if CONV_MATH == 1
// The m16n8k16 MMA whose operands are elem_t: same fragment layout for f16 and bf16.
template <class T> struct Mma16;
template <> struct Mma16<__half> {
    __device__ __forceinline__ static void run(float* c, const unsigned a[4], const unsigned b[2]) {
        mma_m16n8k16_f16(c, a, b, c);
    }
};
template <> struct Mma16<__nv_bfloat16> {
    __device__ __forceinline__ static void run(float* c, const unsigned a[4], const unsigned b[2]) {
        mma_m16n8k16_bf16(c, a, b, c);
    }
};
#endif
#if CONV_MATH == 2
// tf32 fragments. ldmatrix moves 16-bit columns, so it serves only [mn][k] tiles (a 32-bit
// element is two columns; .trans would split each word); a k-major tile (A [k][m] in wgrad,
// B [k][n] in fwd and wgrad) is read with plain shared loads. Each lane's two k (t, t + 4) lie in
// two rows there, so the MMA rows (or columns) are ordered to make a lane's other fragment
// elements shared-memory neighbours, and k-major rows are padded to a stride of 2 mod 8 units
// (SMEM_PAD_K) so those reads are conflict-free. Reordering the output rows or columns is exact
// (each output is still one row of A times one column of B); position() says where accumulator e
// lands. Per K step of 8, per warp:
//   dgrad (A [m][k], B [n][k]): ldmatrix for both, the plain order.
//   wgrad 128x128 (A [k][m], B [k][n]): both stored in transposed 4 x 4 blocks by their rounding
//     pass (TF32_A_TRANSPOSED, TF32_B_TRANSPOSED, K4Transposed) and read by ldmatrix, plain order.
//   wgrad 64x64 (2 x 1 warps): B as on 128x128 (TF32_B_TRANSPOSED); A, which each warp reads
//     alone and rounds in its registers: row g + 8h of 16-row MMA tile mi is warp-tile row
//     16 mi + 2g + h, so a lane's (a0, a1) (k = t) and (a2, a3) (k = t + 4) are one 8-byte read
//     each, straight into the MMA's register quad (Tf32Order's paired rows).
//   fwd (A [m][k], B [k][n]): the transposed product D^T = B^T A^T, so that the k-major B is the
//     MMA's A operand (8-byte reads as in wgrad, 16-row tiles along n) and A is the MMA's B
//     operand (ldmatrix, 8-column tiles along m). Lane (g, t) then holds output rows m = 2t, 2t+1
//     of each 8-row m tile at the channel pair n = 2g, 2g + 1 of each 16-channel n tile: acc keeps
//     each pair together, one 8-byte store (EpilogueRun 2), 4 rows x 64 contiguous bytes per warp.
// Rounding (float_to_tf32, to nearest even): fwd's and dgrad's B is the filter, which every block
// reads: the launcher rounds it once per call (conv_round_tf32), so those kernels never round B.
// Any other operand whose elements are read by several warps (A by CONV_WARPS_N, wgrad's B by
// CONV_WARPS_M) is rounded once per element in shared memory, by the thread that copied it
// (round_landed_tf32: the rounding, 1 instruction on sm_90 and 3 on sm_80, plus its share of a
// 16-byte load and store), otherwise in the fragment registers of its one reader (the rounding
// per register): 128x128 rounds A (and wgrad's B) in shared memory; 64x64 (2 x 1 warps: each
// warp reads its own rows of A, 0.5 elements per MMA against 0.75 for the shared pass with its
// load and store) A in registers and wgrad's B in shared memory. Every tf32 tile has several
// warps along M, so wgrad's B is always rounded (and transposed) in shared memory.
template <int MODE> struct Tf32Rounding {
    static constexpr bool b_prerounded = MODE != MODE_WGRAD;   // B = w: conv_round_tf32
    static constexpr bool a_shared = CONV_WARPS_N > 1, b_shared = !b_prerounded;
    static constexpr bool a_registers = !a_shared;
    static_assert(!(TAP_TILES && a_shared), "tap tiles: round_landed_tf32 follows the chunk mapping only");
    static_assert(!b_shared || TF32_B_TRANSPOSED, "wgrad's B: read by several warps, rounded where transposed");
    static_assert(!a_shared || MODE != MODE_WGRAD || TF32_A_TRANSPOSED,
                  "wgrad's A: rounded in shared memory where transposed");
};
// A k-major tile of MN columns as TF32_A_TRANSPOSED / TF32_B_TRANSPOSED store it: each 4 x 4 block
// (k rows 4q..4q+3, one unit of 4 columns) transposed in place, so that the 16 bytes at row 4q + j
// of unit u hold column 4u + j at k = 4q..4q+3: a lane's fragment element at k = t (or t + 4) of
// column (MMA row) g is word t of one 16-byte row, and ldmatrix (plain: lane (g, t) takes word t
// of row g) loads an MMA A quad, or the B fragments of two 8-column tiles, at once. The 8 rows of
// a phase (4 rows x 2 units) hit 8 bank groups (the padded stride, 2 mod 8 units).
template <int MN> struct K4Transposed {
    // The 16-byte row of column n4 + r (n4 a multiple of 4, r < 4) at k = k4..k4+3 (k4 a multiple
    // of 4). The caller passes n4 and r apart, so that index is linear in k4 and n4 and the offsets
    // between a thread's rows are immediates (computed from n, they took a register each).
    __device__ __forceinline__ static int row(int k4, int n4, int r) { return (k4 + r) * (MN + SMEM_PAD_K) + n4; }
};
// float_to_tf32 (common.cuh): round to nearest even, as the MMA reads it.
__device__ __forceinline__ float tf32_round_for_mma(float x) { return __uint_as_float(float_to_tf32(x)); }
// Rounds fragment registers where their operand is rounded there (Tf32Rounding::a_registers: wgrad's B
// is always rounded in shared memory).
template <bool ROUND, int N> __device__ __forceinline__ void round_fragment(unsigned (&r)[N]) {
    if constexpr (ROUND) {
#pragma unroll
        for (int i = 0; i < N; ++i) r[i] = __float_as_uint(tf32_round_for_mma(__uint_as_float(r[i])));
    }
}
template <int MODE> struct Tf32Order {
    static constexpr bool swapped = MODE == MODE_FWD;          // D^T = B^T A^T
    static constexpr bool paired_rows = !Layout<MODE>::a_mk && !TF32_A_TRANSPOSED;   // wgrad's A rows 16 mi + 2g + h
    static constexpr int M8 = WARP_TILE_M / 8;                 // swapped: 8-row m tiles
    static_assert(WARP_TILE_M % 16 == 0 && WARP_TILE_N % 16 == 0, "tf32 warp tile: 16-row and 16-column tiles");
    // swapped: accumulator index of (n tile ni, m tile mj, part c0..c3): pairs (c0, c2), (c1, c3)
    __device__ __forceinline__ static constexpr int acc_swapped(int ni, int mj, int part) {
        return (ni * M8 + mj) * 4 + (part & 1) * 2 + (part >> 1);
    }
    // Accumulator e's row slot (swapped: 2 per 8 rows of the warp tile, else 2 per 16) and column
    // within the warp tile, for lane (g, t); slot_row: the slot's row within the warp tile.
    static constexpr int thread_rows = swapped ? 2 * M8 : 2 * MMA_M_TILES;
    __device__ __forceinline__ static void position(int e, int g, int t, int& slot, int& col) {
        const int tile = e >> 2, q = e & 3;
        if (swapped) {
            slot = (tile % M8) * 2 + (q >> 1);
            col = (tile / M8) * 16 + 2 * g + (q & 1);
        } else {
            slot = (tile / MMA_N_TILES) * 2 + (q >> 1);
            col = (tile % MMA_N_TILES) * 8 + 2 * t + (q & 1);
        }
    }
    __device__ __forceinline__ static int slot_row(int slot, int g, int t) {
        const int tile = slot >> 1, h = slot & 1;
        if (swapped) return tile * 8 + 2 * t + h;
        return paired_rows ? tile * 16 + 2 * g + h : tile * 16 + g + 8 * h;
    }
};
// An MMA A fragment from a k-major tile whose paired rows r, r + 1 (a0, a1 at k; a2, a3 at k + 4)
// are neighbours: two 8-byte reads.
__device__ __forceinline__ void load_paired_a(unsigned (&a)[4], const elem_t* at_k, const elem_t* at_k4) {
    const float2 lo = *reinterpret_cast<const float2*>(at_k), hi = *reinterpret_cast<const float2*>(at_k4);
    a[0] = __float_as_uint(lo.x); a[1] = __float_as_uint(lo.y);
    a[2] = __float_as_uint(hi.x); a[3] = __float_as_uint(hi.y);
}
#endif
// Fragments come from ldmatrix (common.cuh) wherever the stored layout allows it:
//   16-bit A: [m][k] plain, [k][m] .trans;  16-bit B: [n][k] plain, [k][n] .trans;
//   tf32 (a 32-bit element is two 16-bit columns, so only the plain form applies): [m][k] and
//   [n][k] tiles and wgrad's transposed blocks (K4Transposed) by ldmatrix, the other k-major
//   ones by 8-byte shared loads (paired rows), see Tf32Order.
// Swizzled rows keep every ldmatrix phase (8 rows of 16 bytes) on 8 distinct 16-byte bank groups.
static_assert(MMA_N_TILES % 2 == 0, "B fragments load two 8-column tiles per ldmatrix.x4");
#define AS(k, m) as[tile_index<Layout<MODE>::a_mk, CONV_BM>((m), (k))]
#define BS(k, n) bs[tile_index<Layout<MODE>::b_nk, CONV_BN>((n), (k))]
template <int MODE>
__device__ __forceinline__ void tile_multiply(const elem_t* __restrict__ as, const elem_t* __restrict__ bs,
                                              acc_t* acc) {
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, gr = lane >> 2, t = lane & 3;
    const int row0 = (warp / CONV_WARPS_N) * WARP_TILE_M, col0 = (warp % CONV_WARPS_N) * WARP_TILE_N;
    const int mat = lane >> 3, mrow = lane & 7;   // the ldmatrix matrix and row this lane addresses
#if CONV_MATH == 1
#pragma unroll
    for (int ks = 0; ks < CONV_BK; ks += 16) {
        unsigned b[MMA_N_TILES][2];
#pragma unroll
        for (int ni = 0; ni < MMA_N_TILES; ni += 2) {
            // matrices: (k 0-7, tile ni), (k 8-15, ni), (k 0-7, ni+1), (k 8-15, ni+1)
            const int n = col0 + (ni + (mat >> 1)) * 8, k = ks + (mat & 1) * 8;
            unsigned r[4];
            if (Layout<MODE>::b_nk) ldmatrix<4, false>(r, &BS(k, n + mrow));
            else ldmatrix<4, true>(r, &BS(k + mrow, n));
            b[ni][0] = r[0]; b[ni][1] = r[1]; b[ni + 1][0] = r[2]; b[ni + 1][1] = r[3];
        }
#pragma unroll
        for (int mi = 0; mi < MMA_M_TILES; ++mi) {
            // matrices: (m 0-7, k 0-7), (m 8-15, k 0-7), (m 0-7, k 8-15), (m 8-15, k 8-15) = a0..a3
            const int m = row0 + mi * 16 + (mat & 1) * 8, k = ks + (mat >> 1) * 8;
            unsigned a[4];
            if (Layout<MODE>::a_mk) ldmatrix<4, false>(a, &AS(k, m + mrow));
            else ldmatrix<4, true>(a, &AS(k + mrow, m));
#pragma unroll
            for (int ni = 0; ni < MMA_N_TILES; ++ni) {
                float* c = acc + (mi * MMA_N_TILES + ni) * 4;
                Mma16<elem_t>::run(c, a, b[ni]);
            }
        }
    }
#else
#pragma unroll
    for (int ks = 0; ks < CONV_BK; ks += 8) {
        if constexpr (Tf32Order<MODE>::swapped) {   // fwd: MMA A = B^T (k-major, paired), MMA B = A^T (ldmatrix)
            constexpr int M8 = Tf32Order<MODE>::M8;
            unsigned b[M8][2];
#pragma unroll
            for (int mj = 0; mj < M8; mj += 2) {   // matrices: (k 0-3, mj), (k 4-7, mj), (k 0-3, mj+1), (k 4-7, mj+1)
                unsigned r[4];
                ldmatrix<4, false>(r, &AS(ks + (mat & 1) * 4, row0 + (mj + (mat >> 1)) * 8 + mrow));
                b[mj][0] = r[0]; b[mj][1] = r[1]; b[mj + 1][0] = r[2]; b[mj + 1][1] = r[3];
            }
#pragma unroll
            for (int mj = 0; mj < M8; ++mj) round_fragment<Tf32Rounding<MODE>::a_registers>(b[mj]);
#pragma unroll
            for (int ni = 0; ni < WARP_TILE_N / 16; ++ni) {
                unsigned a[4];
                const int n = col0 + ni * 16 + 2 * gr;
                load_paired_a(a, &BS(ks + t, n), &BS(ks + t + 4, n));
#pragma unroll
                for (int mj = 0; mj < M8; ++mj) {
                    float c[4];
#pragma unroll
                    for (int part = 0; part < 4; ++part) c[part] = acc[Tf32Order<MODE>::acc_swapped(ni, mj, part)];
                    mma_m16n8k8_tf32(c, a, b[mj], c);
#pragma unroll
                    for (int part = 0; part < 4; ++part) acc[Tf32Order<MODE>::acc_swapped(ni, mj, part)] = c[part];
                }
            }
        } else {
            static_assert(Layout<MODE>::b_nk || TF32_B_TRANSPOSED, "tf32 B fragments by ldmatrix");
            unsigned b[MMA_N_TILES][2];
#pragma unroll
            for (int ni = 0; ni < MMA_N_TILES; ni += 2) {
                // matrices: (k 0-3, ni), (k 4-7, ni), (k 0-3, ni+1), (k 4-7, ni+1)
                const int k = ks + (mat & 1) * 4, n8 = col0 + (ni + (mat >> 1)) * 8;
                unsigned r[4];
                ldmatrix<4, false>(r, Layout<MODE>::b_nk ? &BS(k, n8 + mrow)
                                                         : bs + K4Transposed<CONV_BN>::row(k, n8 + (mrow & 4), mrow & 3));
                b[ni][0] = r[0]; b[ni][1] = r[1]; b[ni + 1][0] = r[2]; b[ni + 1][1] = r[3];
            }
#pragma unroll
            for (int mi = 0; mi < MMA_M_TILES; ++mi) {
                unsigned a[4];
                if (Layout<MODE>::a_mk || TF32_A_TRANSPOSED) {
                    // matrices: (m 0-7, k 0-3), (m 8-15, k 0-3), (m 0-7, k 4-7), (m 8-15, k 4-7)
                    const int k = ks + (mat >> 1) * 4, m8 = row0 + mi * 16 + (mat & 1) * 8;
                    ldmatrix<4, false>(a, Layout<MODE>::a_mk ? &AS(k, m8 + mrow)
                                                             : as + K4Transposed<CONV_BM>::row(k, m8 + (mrow & 4), mrow & 3));
                } else {   // paired rows (Tf32Order)
                    const int m = row0 + mi * 16 + 2 * gr;
                    load_paired_a(a, &AS(ks + t, m), &AS(ks + t + 4, m));
                }
                round_fragment<Tf32Rounding<MODE>::a_registers>(a);
#pragma unroll
                for (int ni = 0; ni < MMA_N_TILES; ++ni) {
                    float* c = acc + (mi * MMA_N_TILES + ni) * 4;
                    mma_m16n8k8_tf32(c, a, b[ni], c);
                }
            }
        }
    }
#endif
}
#undef AS
#undef BS
#if CONV_MATH == 2
// tf32 rounding in shared memory (Tf32Rounding's *_shared): after its cp_async_wait,
// each thread rounds (float_to_tf32, in place) the 16-byte chunks of the landed stage that it copied
// itself, before the barrier that publishes the stage, so no other thread's copy is read before
// it landed and no barrier is added (the transposed blocks: each lane reads only its own chunk,
// and its store into another lane's follows the warp's ldmatrix, round_transposed_tf32). These
// offsets must follow the loaders' chunk mapping (GatherA: chunk_row / chunk_pos of a [mn][k]
// tile; RowStream<true> (wgrad's B): row / pos; wgrad A: wgrad_a_row / wgrad_a_unit); the
// emulator's racecheck flags a chunk rounded by a thread other than its copier, and a lane that
// hands ldmatrix another lane's chunk (tried: it does).
__device__ __forceinline__ float4 rounded_tf32(float4 v) {
    v.x = tf32_round_for_mma(v.x);
    v.y = tf32_round_for_mma(v.y);
    v.z = tf32_round_for_mma(v.z);
    v.w = tf32_round_for_mma(v.w);
    return v;
}
__device__ __forceinline__ void round_chunk_tf32(elem_t* p) {
    *reinterpret_cast<float4*>(p) = rounded_tf32(*reinterpret_cast<const float4*>(p));
}
// A warp's 8 landed 4 x 4 blocks of a k-major tile (8 units at rows k0..k0+3), rounded and stored
// transposed (K4Transposed): `own` is the chunk this lane copied, row lane / 8 of block lane % 8;
// `column` is where the column this lane receives goes (column lane % 4 of block lane / 4: its
// K4Transposed row). Each lane hands ldmatrix its own chunk (so every shared read of landed data is
// its copier's), rounds the column it receives (k = k0..k0+3) and stores it as one 16-byte row; the
// ldmatrix, a warp collective, orders those stores after every lane's read. 1 ldmatrix + 4 cvt +
// 1 store per 4 elements, no register moves (a transpose of 16-byte loads took one per element off
// the diagonal: sm_90's cvt.rn rounds in place).
__device__ __forceinline__ void round_transposed_tf32(const elem_t* own, elem_t* column) {
    unsigned r[4];
    ldmatrix<4, false>(r, own);
    *reinterpret_cast<float4*>(column) = rounded_tf32(make_float4(__uint_as_float(r[0]), __uint_as_float(r[1]),
                                                                  __uint_as_float(r[2]), __uint_as_float(r[3])));
}
template <int MODE> __device__ __forceinline__ void round_landed_tf32(elem_t* as, elem_t* bs) {
    // round_transposed_tf32: the warp's blocks lie in 8 neighbouring units; this lane receives
    // column lane % 4 of unit lane / 4 of them
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, unit = lane >> 2, in_unit = lane & 3;
    if constexpr (Tf32Rounding<MODE>::a_shared) {
        if constexpr (MODE == MODE_WGRAD) {   // warp w: rows 4w..4w+3, units g + 8j
            elem_t* const column = as + K4Transposed<CONV_BM>::row(4 * warp, VEC * unit, in_unit);
#pragma unroll
            for (int j = 0; j < WG_CHUNKS; ++j)
                round_transposed_tf32(as + tile_index<false, CONV_BM>(wgrad_a_unit(j) * VEC, wgrad_a_row(0)),
                                      column + 8 * VEC * j);
        } else {
#pragma unroll
            for (int j = 0; j < A_CHUNKS_PER_THREAD; ++j)
                round_chunk_tf32(as + tile_index<true, CONV_BM, A_MK_SWIZZLED>(chunk_row(j, CONV_BK), chunk_pos(CONV_BK)));
        }
    }
    if constexpr (Tf32Rounding<MODE>::b_shared && RowStream<true>::UNIT_PAIRS) {
        // warp w: block rows w + 2q (rows 4w + 8q ..), units g + 8h (RowStream<true>::UNIT_PAIRS)
        elem_t* const column = bs + K4Transposed<CONV_BN>::row(4 * warp, VEC * unit, in_unit);
#pragma unroll
        for (int j = 0; j < B_CHUNKS_PER_THREAD; ++j)
            round_transposed_tf32(bs + tile_index<false, CONV_BN>(RowStream<true>::pos() + RowStream<true>::unit_offset(j),
                                                                  RowStream<true>::row(j)),
                                  column + k_rows_apart<CONV_BN>((j >> 1) * RowStream<true>::PAIR_STEP) +
                                      RowStream<true>::unit_offset(j));
    } else if constexpr (Tf32Rounding<MODE>::b_shared) {   // wgrad's dy (RowStream<true>), warp w: rows 4j..4j+3, units 8w + g
        elem_t* const column = bs + K4Transposed<CONV_BN>::row(0, VEC * (8 * warp + unit), in_unit);
#pragma unroll
        for (int j = 0; j < B_CHUNKS_PER_THREAD; ++j)
            round_transposed_tf32(bs + tile_index<false, CONV_BN>(RowStream<true>::pos(), RowStream<true>::row(j)),
                                  column + k_rows_apart<CONV_BN>(4 * j));
    }
}
#define TF32_ROUND_LANDED(as_stage, bs_stage) round_landed_tf32<MODE>(as_stage, bs_stage)
#endif
// Accumulator e lies in the thread's row slot `slot` (of ThreadRows<MODE>::count: two per 16 rows
// of its warp tile, tf32 fwd two per 8) and at column `col` of the block tile; slot s is
// block-tile row slot_row(s).
#if CONV_MATH == 1
template <int MODE> struct ThreadRows { static constexpr int count = 2 * MMA_M_TILES; };
template <int MODE>
__device__ __forceinline__ void acc_position(int e, int& slot, int& col) {
    const int warp = threadIdx.x >> 5, t = threadIdx.x & 3;
    const int tile = e >> 2, part = e & 3;
    slot = (tile / MMA_N_TILES) * 2 + (part >> 1);
    col = (warp % CONV_WARPS_N) * WARP_TILE_N + (tile % MMA_N_TILES) * 8 + 2 * t + (part & 1);
}
template <int MODE>
__device__ __forceinline__ int slot_row(int slot) {   // slot 2 mi + h: row 16 mi + g + 8 h of the warp tile
    const int warp = threadIdx.x >> 5, gr = (threadIdx.x & 31) >> 2;
    return (warp / CONV_WARPS_N) * WARP_TILE_M + (slot >> 1) * 16 + gr + 8 * (slot & 1);
}
#else
template <int MODE> struct ThreadRows { static constexpr int count = Tf32Order<MODE>::thread_rows; };
template <int MODE>
__device__ __forceinline__ void acc_position(int e, int& slot, int& col) {
    const int warp = threadIdx.x >> 5, gr = (threadIdx.x & 31) >> 2, t = threadIdx.x & 3;
    Tf32Order<MODE>::position(e, gr, t, slot, col);
    col += (warp % CONV_WARPS_N) * WARP_TILE_N;
}
template <int MODE>
__device__ __forceinline__ int slot_row(int slot) {
    const int warp = threadIdx.x >> 5, gr = (threadIdx.x & 31) >> 2, t = threadIdx.x & 3;
    return (warp / CONV_WARPS_N) * WARP_TILE_M + Tf32Order<MODE>::slot_row(slot, gr, t);
}
#endif
#endif

// TF32_ROUND_LANDED(as, bs): the tf32 path's per-stage rounding (round_landed_tf32), between a
// thread's cp_async_wait and the barrier that publishes the stage; nothing on the other paths.
#ifndef TF32_ROUND_LANDED
#define TF32_ROUND_LANDED(as_stage, bs_stage) ((void)0)
#endif

// The shared main loop: accumulates the block's tile over k in [k_begin, k_end) through a
// CONV_STAGES-deep cp.async pipeline (one barrier per K tile; stage indices rotate by compare).
// One K tile's copies: the loader's load<VECTOR>, or wgrad's packed-bounds 16-byte path; FULL (wgrad):
// a tile before the split's last, whose rows need no test against k_end.
// TAP (fwd, dgrad): the tap-tile mapping (TAP_TILES).
template <bool VECTOR, bool PACKED, class L, bool FULL = false, int TAP = 0, int SHARED = 0>
__device__ __forceinline__ void load_tile(L& loader, const ConvGeom& g, const elem_t* __restrict__ a_src,
                                          const elem_t* __restrict__ b_src, elem_t* as, elem_t* bs, int cols) {
    if constexpr (PACKED)   // wgrad's packed path (TAP: its tap groups; SHARED: WG_SHARED_DECODE)
        loader.template load<VECTOR, true, FULL, TAP, SHARED>(g, a_src, b_src, as, bs, cols);
    else if constexpr (FULL && !TAP)   // (the fwd/dgrad tap-tile loads keep their row tests in untested groups)
        loader.template load<VECTOR, false, true>(g, a_src, b_src, as, bs, cols);
    else if constexpr (TAP)   // fwd, dgrad: load<VECTOR, TAP>
        loader.template load<VECTOR, true>(g, a_src, b_src, as, bs, cols);
    else
        loader.template load<VECTOR>(g, a_src, b_src, as, bs, cols);
}

// Whether the tf32 128x128 wgrad runs untested groups (pipeline): on sm_90 and in the emulator,
// which then runs the code sm_90 runs (sm_80 keeps the tested loop).
#if !defined(GPUK_EMULATE) && defined(__CUDA_ARCH__) && __CUDA_ARCH__ < 900
#define TF32_WIDE_UNTESTED false
#else
#define TF32_WIDE_UNTESTED true
#endif
// One group of CONV_STAGES K tiles from tile t0 on, unrolled (every stage index a constant). CHECKED:
// a tile or a prefetch of the group may lie past the last tile (tiles), so each is tested; in 16-bit
// and most tf32 wgrad (UNTESTED_GROUPS) the groups before (where t0 + 2 * CONV_STAGES <= tiles) run
// without those two tests per tile (about 4.5 instructions a tile), and prefetch only tiles before
// the last (the one that may end before BK rows), whose copies skip their row tests against k_end
// (FULL: ~10 instructions a tile).
template <int MODE, bool VECTOR, bool PACKED, bool CHECKED, int TAP = 0>
__device__ __forceinline__ void pipeline_group(Loader<MODE>& loader, elem_t (*as)[A_STAGE], elem_t (*bs)[B_STAGE],
                                               const ConvGeom& g, const elem_t* __restrict__ a_src,
                                               const elem_t* __restrict__ b_src, int cols, int t0, int tiles,
                                               acc_t* acc) {
#pragma unroll
    for (int s = 0; s < CONV_STAGES; ++s) {
        const int t = t0 + s;
        if (CHECKED && t >= tiles) break;
        cp_async_wait<CONV_STAGES - 2>();   // tile t has landed (this thread's copies) ...
        TF32_ROUND_LANDED(as[s], bs[s]);
        __syncthreads();                    // ... everyone's, and stage t-1 is free again
        const int write_stage = (s + CONV_STAGES - 1) % CONV_STAGES;
        // wgrad's packed path in an untested group (every load of it runs): the decode of two tiles' rows
        // shared by the lane pairs (WG_SHARED_DECODE), the first tile of each pair decoding both
        constexpr bool SHARED = MODE == MODE_WGRAD && WG_SHARED_DECODE && PACKED && !CHECKED;
        if constexpr (SHARED) {
            if (s % 2 == 0)
                load_tile<VECTOR, PACKED, Loader<MODE>, true, TAP, 1>(loader, g, a_src, b_src, as[write_stage],
                                                                      bs[write_stage], cols);
            else
                load_tile<VECTOR, PACKED, Loader<MODE>, true, TAP, 2>(loader, g, a_src, b_src, as[write_stage],
                                                                      bs[write_stage], cols);
        } else if (!CHECKED || t + CONV_STAGES - 1 < tiles) {
            load_tile<VECTOR, PACKED, Loader<MODE>, !CHECKED, TAP>(loader, g, a_src, b_src, as[write_stage],
                                                                   bs[write_stage], cols);
        }
        cp_async_commit();
        tile_multiply<MODE>(as[s], bs[s], acc);
    }
}

template <int MODE, bool VECTOR, bool PACKED = false, int TAP = 0>
__device__ __forceinline__ void pipeline(Loader<MODE>& loader, elem_t (*as)[A_STAGE], elem_t (*bs)[B_STAGE],
                                         const ConvGeom& g, const elem_t* __restrict__ a_src,
                                         const elem_t* __restrict__ b_src, int cols, long long depth, acc_t* acc) {
    const int tiles = (int)((depth + CONV_BK - 1) / CONV_BK);
#pragma unroll
    for (int s = 0; s < CONV_STAGES - 1; ++s) {
        if (s < tiles) load_tile<VECTOR, PACKED, Loader<MODE>, false, TAP>(loader, g, a_src, b_src, as[s], bs[s], cols);
        cp_async_commit();   // empty groups keep the count uniform for the wait below
    }
    // Unrolled by the stage count, so that every stage index is a constant: the shared
    // addresses of fragments and copies become register + immediate (no per-tile address math).
    // Not for the per-element path, whose copies cost more than the address math (unrolled,
    // its VEC-times-longer loader spills the 128x128 tiles): it rotates the stage indices.
    if constexpr (!VECTOR) {
        int read_stage = 0, write_stage = CONV_STAGES - 1;
        for (int t = 0; t < tiles; ++t) {
            cp_async_wait<CONV_STAGES - 2>();
            TF32_ROUND_LANDED(as[read_stage], bs[read_stage]);
            __syncthreads();
            if (t + CONV_STAGES - 1 < tiles)
                load_tile<VECTOR, PACKED>(loader, g, a_src, b_src, as[write_stage], bs[write_stage], cols);
            cp_async_commit();
            tile_multiply<MODE>(as[read_stage], bs[read_stage], acc);
            read_stage = read_stage == CONV_STAGES - 1 ? 0 : read_stage + 1;
            write_stage = write_stage == CONV_STAGES - 1 ? 0 : write_stage + 1;
        }
    } else {
        // wgrad only (its split K is long): the untested groups are a second copy of the loop. 16-bit
        // and the tf32 64x64 tile take it; the tf32 128x128 wgrad on its packed path on sm_90 only
        // (TF32_WIDE_UNTESTED: 2.08 -> 1.98 other instructions per MMA), as its three-compare path
        // spills with the copy (16 bytes) and on sm_80 the copy costs 22 register moves (3.07 ->
        // 3.16); the tf32 fwd 128x128x32 spilled 420 bytes with it.
        constexpr bool UNTESTED_GROUPS =
            CONV_MATH == 1 || (CONV_MATH == 2 && (CONV_BM * CONV_BN <= 64 * 64 || (PACKED && TF32_WIDE_UNTESTED)));
        // The tap-tile path (fwd, dgrad) takes them too, its copies tested as in the last groups.
        int t0 = 0;
        if constexpr ((MODE == MODE_WGRAD && UNTESTED_GROUPS) || TAP)
            for (; t0 + 2 * CONV_STAGES <= tiles; t0 += CONV_STAGES)   // tiles and prefetches before the last
                pipeline_group<MODE, VECTOR, PACKED, false, TAP>(loader, as, bs, g, a_src, b_src, cols, t0, tiles, acc);
        for (; t0 < tiles; t0 += CONV_STAGES)   // the rest (wgrad: the last one or two groups)
            pipeline_group<MODE, VECTOR, PACKED, true, TAP>(loader, as, bs, g, a_src, b_src, cols, t0, tiles, acc);
    }
    cp_async_wait_all();
}

// Runs the pipeline over `depth` (= k_end - k_begin) K elements with an initialized loader.
// dynamic_smem: the kernel's dynamic shared memory (CONV_DYNAMIC_SMEM), else unused.
template <int MODE>
__device__ __forceinline__ void igemm_mainloop(Loader<MODE>& loader, const ConvGeom& g,
                                               const elem_t* __restrict__ a_src, const elem_t* __restrict__ b_src,
                                               int cols, long long depth, acc_t* acc, unsigned char* dynamic_smem) {
#if CONV_DYNAMIC_SMEM
    elem_t (*as)[A_STAGE] = reinterpret_cast<elem_t (*)[A_STAGE]>(dynamic_smem);
    elem_t (*bs)[B_STAGE] = reinterpret_cast<elem_t (*)[B_STAGE]>(dynamic_smem + CONV_STAGES * A_STAGE * sizeof(elem_t));
#else
    (void)dynamic_smem;
    __shared__ __align__(16) elem_t as[CONV_STAGES][A_STAGE];
    __shared__ __align__(16) elem_t bs[CONV_STAGES][B_STAGE];
#endif
#pragma unroll
    for (int e = 0; e < ACC_COUNT; ++e) acc[e] = acc_t(0);
    // One uniform choice per block, outside the loop: both operands in 16-byte chunks, or every
    // element on its own (unaligned channel counts or pointers, filters too large for tap masks).
    // wgrad's 16-byte path tests its bounds packed where the image fits (WgradPack).
    if constexpr (MODE == MODE_WGRAD && WG_PACKED) {
        if (loader.a_vec && loader.b_vec && loader.a_packed) {
            if constexpr (WG_TAP_GROUPS) {
                // The branch order is ptxas's register allocation on sm_80, not taste: of the orders
                // tried, each gave one of the three untested loops 130-150 register moves (the tap
                // groups' first: halves 848 instructions per 128 MMAs, 136 moves), but this one, where
                // the worst is the per-chunk loop with 55 (827, was 783 when the halves' loop had the
                // moves); whole rows 720, halves 730. On sm_90 (this order against the tap groups' first) the
                // tap loops are the same length and the per-chunk loop 6 shorter (528).
                if (!loader.a_tap) {
                    pipeline<MODE, true, true>(loader, as, bs, g, a_src, b_src, cols, depth, acc);
                    return;
                }
                if (loader.a_tap == 2)
                    pipeline<MODE, true, true, 2>(loader, as, bs, g, a_src, b_src, cols, depth, acc);
                else
                    pipeline<MODE, true, true, 1>(loader, as, bs, g, a_src, b_src, cols, depth, acc);
                return;
            }
            pipeline<MODE, true, true>(loader, as, bs, g, a_src, b_src, cols, depth, acc);
            return;
        }
    }
    if constexpr (MODE != MODE_WGRAD && TAP_TILES) {
        if (loader.a.tap_tiles) {   // implies a_vec && b_vec (GatherA::init)
            pipeline<MODE, true, false, true>(loader, as, bs, g, a_src, b_src, cols, depth, acc);
            return;
        }
    }
    if (loader.a_vec && loader.b_vec)
        pipeline<MODE, true>(loader, as, bs, g, a_src, b_src, cols, depth, acc);
    else
        pipeline<MODE, false>(loader, as, bs, g, a_src, b_src, cols, depth, acc);
}

// ---- epilogue ----
// Accumulators come in runs of EpilogueRun consecutive columns of one row: FFMA micro-tile
// runs of 4 (1 where dgrad's B columns are strided), MMA pairs (c0, c1) and (c2, c3). A run is
// one vector store where the channel count is a multiple of the run (rows then start aligned);
// elsewhere one store per element. A thread's accumulators lie in a few rows (ThreadRows, the
// slots of acc_position); each one's output row out_row(m) is computed once, before the stores
// (thread_out_rows): dgrad's PhaseRows divides, and its FFMA runs are single elements.
// 16-bit MMA outputs are regrouped first (store_tile_16bit): a pair is only 4 bytes, and the 8
// rows x 4 lanes of one store would fill half of each 32-byte sector.
#if CONV_MATH == 0
template <int MODE> struct EpilogueRun { static constexpr int len = Layout<MODE>::b_nk ? 1 : 4; };
#else
template <int MODE> struct EpilogueRun { static constexpr int len = 2; };
#endif
template <class T, int LEN> struct alignas(LEN * sizeof(T)) ValueRun { T v[LEN]; };
template <class T> __device__ __forceinline__ T out_value(acc_t v) {
    if constexpr (gpuk_same_type<T, acc_t>::value) return v;
    else return ElementTraits<T>::from_acc(v);
}
// v + bias[channel] (epilogue >= 1), then relu (epilogue 2; NaN is kept); channel < channels.
__device__ __forceinline__ acc_t epilogue_value(acc_t v, const elem_t* __restrict__ bias, int channel, int epilogue) {
    if (epilogue >= 1) v += to_acc(bias[channel]);
    if (epilogue == 2) v = v < acc_t(0) ? acc_t(0) : v;
    return v;
}

// GEMM row -> row of the output matrix: the identity except for dgrad's stride phases.
struct SameRows {
    __device__ __forceinline__ long long operator()(long long m) const { return m; }
};
struct PhaseRows {
    const ConvGeom& g;
    const DgradPhase& phase;
    __device__ __forceinline__ long long operator()(long long m) const { return phase.out_row(g, m); }
};
// row[s]: the output row out_row(m) of this thread's row slot s (GEMM row m), -1 where m >= rows.
// 32-bit (output rows < 2^31, checked by the launcher: check_gemm): 64-bit offsets cost the
// tiles with the most rows per thread a spill. out_row runs for every slot, then the select: no
// branch, so the divisions' reciprocals (one per divisor) are shared by all rows.
template <int MODE, class RowMap>
__device__ __forceinline__ void thread_out_rows(int (&row)[ThreadRows<MODE>::count], long long rows,
                                                const RowMap& out_row) {
#pragma unroll
    for (int s = 0; s < ThreadRows<MODE>::count; ++s) {
        const long long m = (long long)blockIdx.x * CONV_BM + slot_row<MODE>(s);
        const int mapped = (int)out_row(m);
        row[s] = m < rows ? mapped : -1;
    }
}
// The element offset of (row, channel) in a (rows, channels) matrix, row >= 0: unsigned, so the
// 64-bit product needs no sign extension (one wide multiply-add).
__device__ __forceinline__ unsigned long long out_offset(int row, int channels, int channel) {
    return (unsigned long long)(unsigned)row * (unsigned)channels + (unsigned)channel;
}

#if CONV_MATH != 0
// Two 16-bit outputs in one 32-bit word (low: the first).
__device__ __forceinline__ unsigned pack_out2(float lo, float hi) {
    if constexpr (gpuk_same_type<elem_t, __half>::value) return pack_half2(lo, hi);
    else return pack_bfloat162(lo, hi);
}
// The 16-bit MMA epilogue. A lane holds columns (2t, 2t+1) of two neighbouring 8-column MMA
// tiles (t = lane % 4), per row gr and gr + 8. Within each quad the 16 columns are regrouped by
// 4 shuffles so that lane t holds columns 4t..4t+3: one 8-byte store per lane, and the 8 rows x 32
// bytes of a warp's store are whole sectors.
template <int MODE, class RowMap>
__device__ __forceinline__ void store_tile_16bit(const acc_t (&acc)[ACC_COUNT], long long rows, int channels,
                                                 const elem_t* __restrict__ bias, int epilogue,
                                                 elem_t* __restrict__ out, const RowMap& out_row) {
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, t = lane & 3;
    const bool vector = channels % 4 == 0 && is_aligned(out, 8);
    const int src = (lane & ~3) | ((t & 1) << 1);   // the lane holding columns 4t, 4t+1 of its tile
    int out_rows[ThreadRows<MODE>::count];
    thread_out_rows<MODE>(out_rows, rows, out_row);
#pragma unroll
    for (int mi = 0; mi < MMA_M_TILES; ++mi)
#pragma unroll
        for (int ni = 0; ni < MMA_N_TILES; ni += 2)
#pragma unroll
            for (int h = 0; h < 2; ++h) {
                const int first = blockIdx.y * CONV_BN + (warp % CONV_WARPS_N) * WARP_TILE_N + ni * 8;
                unsigned word[2];
#pragma unroll
                for (int u = 0; u < 2; ++u) {
                    const int e = ((mi * MMA_N_TILES + ni + u) * 2 + h) * 2, channel = first + u * 8 + 2 * t;
                    const acc_t v0 = channel < channels ? epilogue_value(acc[e], bias, channel, epilogue) : acc_t(0);
                    const acc_t v1 =
                        channel + 1 < channels ? epilogue_value(acc[e + 1], bias, channel + 1, epilogue) : acc_t(0);
                    word[u] = pack_out2(v0, v1);
                }
                const unsigned a0 = __shfl_sync(0xffffffffu, word[0], src), a1 = __shfl_sync(0xffffffffu, word[1], src);
                const unsigned b0 = __shfl_sync(0xffffffffu, word[0], src + 1);
                const unsigned b1 = __shfl_sync(0xffffffffu, word[1], src + 1);
                const unsigned lo = t >= 2 ? a1 : a0, hi = t >= 2 ? b1 : b0;   // columns 4t, 4t+1 and 4t+2, 4t+3
                const int row = out_rows[2 * mi + h];   // the slot of row 16 mi + gr + 8 h (acc_position)
                const int channel = first + 4 * t;
                if (row < 0 || channel >= channels) continue;
                unsigned short* dst = reinterpret_cast<unsigned short*>(out + out_offset(row, channels, channel));
                if (vector) {
                    *reinterpret_cast<uint2*>(dst) = make_uint2(lo, hi);
                } else {
                    const unsigned short bits[4] = {(unsigned short)lo, (unsigned short)(lo >> 16),
                                                    (unsigned short)hi, (unsigned short)(hi >> 16)};
#pragma unroll
                    for (int q = 0; q < 4; ++q)
                        if (channel + q < channels) dst[q] = bits[q];
                }
            }
}
#endif

// Writes this block's accumulator tile (rows GEMM rows, `channels` GEMM columns) to a
// (rows, channels) row-major matrix (a channels_last activation, dw, split partials), GEMM row
// m going to output row out_row(m), with the epilogue: 0 none, 1 + bias[c], 2 + bias[c] then relu.
template <int MODE, class T, class RowMap>
__device__ __forceinline__ void store_tile(const acc_t (&acc)[ACC_COUNT], long long rows, int channels,
                                           const elem_t* __restrict__ bias, int epilogue, T* __restrict__ out,
                                           const RowMap& out_row) {
#if CONV_MATH != 0
    if constexpr (sizeof(T) == 2) {
        store_tile_16bit<MODE>(acc, rows, channels, bias, epilogue, out, out_row);
        return;
    }
#endif
    constexpr int LEN = EpilogueRun<MODE>::len;
    const bool vector = channels % LEN == 0 && is_aligned(out, LEN * sizeof(T));
    int out_rows[ThreadRows<MODE>::count];
    thread_out_rows<MODE>(out_rows, rows, out_row);
#pragma unroll
    for (int e = 0; e < ACC_COUNT; e += LEN) {
        int slot, c;
        acc_position<MODE>(e, slot, c);
        const int row = out_rows[slot];
        const int channel = blockIdx.y * CONV_BN + c;
        if (row < 0 || channel >= channels) continue;
        T* dst = out + out_offset(row, channels, channel);
        if (vector) {
            ValueRun<T, LEN> run;
#pragma unroll
            for (int q = 0; q < LEN; ++q) run.v[q] = out_value<T>(epilogue_value(acc[e + q], bias, channel + q, epilogue));
            *reinterpret_cast<ValueRun<T, LEN>*>(dst) = run;
        } else {
#pragma unroll
            for (int q = 0; q < LEN; ++q)
                if (channel + q < channels) dst[q] = out_value<T>(epilogue_value(acc[e + q], bias, channel + q, epilogue));
        }
    }
}

// conv_igemm_fwd: y = conv(x, w) (+ bias, relu). Grid (M tiles, C_out tiles), CONV_THREADS threads.
extern "C" __global__ void __launch_bounds__(CONV_THREADS, 1)
conv_igemm_fwd(const elem_t* __restrict__ x, const elem_t* __restrict__ w, const elem_t* __restrict__ bias,
               elem_t* __restrict__ y, int batch, int c_in, int c_out, int in_d, int in_h, int in_w, int out_d,
               int out_h, int out_w, int k_d, int k_h, int k_w, int s_d, int s_h, int s_w, int dil_d, int dil_h,
               int dil_w, int pad_d, int pad_h, int pad_w, int epilogue) {
#if !(CONV_KERNELS & CONV_KERNEL_FWD)
    __trap();
#else
    const ConvGeom g = make_geom(CONV_GEOM_ARGS);
    const long long rows = (long long)batch * g.out_pix, depth = (long long)g.taps * c_in;
    acc_t acc[ACC_COUNT];
    Loader<MODE_FWD> loader;
    loader.init(g, x, w, rows, 0, depth);
#if CONV_DYNAMIC_SMEM
    extern __shared__ __align__(16) unsigned char conv_dynamic_smem[];
#else
    unsigned char* const conv_dynamic_smem = nullptr;
#endif
    igemm_mainloop<MODE_FWD>(loader, g, x, w, c_out, depth, acc, conv_dynamic_smem);
    store_tile<MODE_FWD>(acc, rows, c_out, bias, epilogue, y, SameRows{});
#endif
}

// dgrad's phase for the epilogue. The MMA paths rebuild it from blockIdx.z read anew (an opaque
// read on the GPU) rather than keep the prologue's values live across the K loop: with them the
// tf32 64x64x32 dgrad (2 x 1 warps) spilled 3 registers on sm_80, and 16-bit 128x128 dgrad drops
// 252 -> 244 registers. The FFMA paths keep the prologue's (rebuilt, float64 lost 1-2% of its
// FFMA share).
__device__ __forceinline__ DgradPhase epilogue_phase(const ConvGeom& g, const DgradPhase& phase) {
#if CONV_MATH != 0
    unsigned z = blockIdx.z;
#if !defined(GPUK_EMULATE) && defined(__CUDA_ARCH__)
    asm volatile("mov.u32 %0, %%ctaid.z;" : "=r"(z));
#endif
    DgradPhase again;
    again.init(g, (int)z);
    return again;
#else
    return phase;
#endif
}

// conv_igemm_dgrad: dx = dgrad(dy, w), as stride-phase sub-convolutions (DgradPhase).
// Grid (tiles of the largest phase's rows, C_in tiles, s_d*s_h*s_w phases), CONV_THREADS threads;
// a block past its phase's rows exits at once (the whole block: no barrier is skipped).
extern "C" __global__ void __launch_bounds__(CONV_THREADS, 1)
conv_igemm_dgrad(const elem_t* __restrict__ dy, const elem_t* __restrict__ w, elem_t* __restrict__ dx, int batch,
                 int c_in, int c_out, int in_d, int in_h, int in_w, int out_d, int out_h, int out_w, int k_d,
                 int k_h, int k_w, int s_d, int s_h, int s_w, int dil_d, int dil_h, int dil_w, int pad_d,
                 int pad_h, int pad_w) {
#if !(CONV_KERNELS & CONV_KERNEL_DGRAD)
    __trap();
#else
    const ConvGeom g = make_geom(CONV_GEOM_ARGS);
    DgradPhase phase;
    phase.init(g, blockIdx.z);
    if ((long long)blockIdx.x * CONV_BM >= phase.rows) return;
    acc_t acc[ACC_COUNT];
    Loader<MODE_DGRAD> loader;
    loader.init(g, phase, dy, w);
#if CONV_DYNAMIC_SMEM
    extern __shared__ __align__(16) unsigned char conv_dynamic_smem[];
#else
    unsigned char* const conv_dynamic_smem = nullptr;
#endif
    igemm_mainloop<MODE_DGRAD>(loader, g, dy, w, c_in, phase.depth, acc, conv_dynamic_smem);
    const DgradPhase out_phase = epilogue_phase(g, phase);
    store_tile<MODE_DGRAD>(acc, out_phase.rows, c_in, nullptr, 0, dx, PhaseRows{g, out_phase});
#endif
}

// conv_igemm_wgrad: dw (Keras layout (*k, C_in, C_out), i.e. row-major (taps*C_in, C_out)).
// Grid (taps*C_in tiles, C_out tiles, splits); split z covers k in [z*k_per_split, ...).
// splits == 1: writes dw; else writes partial[z] (acc_t, M x C_out) for conv_reduce_splits.
extern "C" __global__ void __launch_bounds__(CONV_THREADS, 1)
conv_igemm_wgrad(const elem_t* __restrict__ x, const elem_t* __restrict__ dy, elem_t* __restrict__ dw,
                 acc_t* __restrict__ partial, int batch, int c_in, int c_out, int in_d, int in_h, int in_w,
                 int out_d, int out_h, int out_w, int k_d, int k_h, int k_w, int s_d, int s_h, int s_w, int dil_d,
                 int dil_h, int dil_w, int pad_d, int pad_h, int pad_w, long long k_per_split, unsigned w_mul,
                 int w_shift, unsigned h_mul, int h_shift, unsigned d_mul, int d_shift, unsigned pixel_rows,
                 unsigned pixel_planes, unsigned pixel_n, unsigned packed_rows, unsigned packed_planes,
                 unsigned packed_n) {
#if !(CONV_KERNELS & CONV_KERNEL_WGRAD)
    __trap();
#else
    const ConvGeom g = make_geom(CONV_GEOM_ARGS);
    const long long rows = (long long)g.taps * c_in, depth = (long long)batch * g.out_pix;
    const long long k_begin = (long long)blockIdx.z * k_per_split;
    const long long k_end = k_begin + k_per_split < depth ? k_begin + k_per_split : depth;
    acc_t acc[ACC_COUNT];
    const WgradDecode decode{{{w_mul, w_shift}, {h_mul, h_shift}, {d_mul, d_shift}}, (unsigned)s_w,
                             {pixel_rows, pixel_planes, pixel_n}, {packed_rows, packed_planes, packed_n}};
    Loader<MODE_WGRAD> loader;
    loader.init(g, decode, x, dy, k_begin, k_end);
#if CONV_DYNAMIC_SMEM
    extern __shared__ __align__(16) unsigned char conv_dynamic_smem[];
#else
    unsigned char* const conv_dynamic_smem = nullptr;
#endif
    igemm_mainloop<MODE_WGRAD>(loader, g, x, dy, c_out, k_end - k_begin, acc, conv_dynamic_smem);
    if (gridDim.z == 1)
        store_tile<MODE_WGRAD>(acc, rows, c_out, nullptr, 0, dw, SameRows{});
    else
        store_tile<MODE_WGRAD>(acc, rows, c_out, nullptr, 0, partial + (long long)blockIdx.z * rows * c_out, SameRows{});
#endif
}

// conv_round_tf32: y[i] = x[i] rounded to tf32 (float_to_tf32, to nearest even), for the filter
// that the tf32 fwd and dgrad kernels read as B unrounded in-kernel (Tf32Rounding): once per call
// here instead of once per block there (every block of those kernels reads all of w's K rows for
// its columns). Built for the tf32 tiles only (traps elsewhere); 1-D grid-stride loop.
extern "C" __global__ void __launch_bounds__(REDUCE_THREADS)
conv_round_tf32(const float* __restrict__ x, float* __restrict__ y, long long n) {
#if CONV_MATH == 2
    GPUK_GRID_STRIDE_LOOP(i, n) y[i] = __uint_as_float(float_to_tf32(x[i]));
#else
    __trap();
#endif
}

// conv_reduce_splits: dw[i] = sum over splits of partial[s][i], in split order.
// 1-D grid-stride loop; no shared memory, no atomics.
extern "C" __global__ void __launch_bounds__(REDUCE_THREADS)
conv_reduce_splits(const acc_t* __restrict__ partial, elem_t* __restrict__ out, long long count, int splits) {
    reduce_splits_body(partial, out, count, splits);
}
