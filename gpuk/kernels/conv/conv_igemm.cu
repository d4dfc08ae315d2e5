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
//       Where fwd's C_in / dgrad's C_out is a multiple of BK, the 64x64x32 and 128x128x16 tiles
//       copy by tap tiles (TAP_TILES: each K tile in one tap, one address and tap test per row);
//       the 128x128x16 tile's A is then rounded along that mapping (round_landed_tf32<MODE, TAP>):
//       other instructions per MMA (inspect, no GPU) sm_80 fwd 2.21 -> 1.89, dgrad 2.16 -> 1.93,
//       sm_90 1.75 -> 1.41, 1.73 -> 1.55 (docs/kernels.md, "tf32 128x128x16 tap tiles").
//       Why round, and to nearest even: the note beside Tf32Rounding (conv_igemm_math.cuh).
// Tiling: CONV_BM x CONV_BN output tile per block, K in steps of CONV_BK, a CONV_STAGES-deep
//   cp.async pipeline (one barrier per K tile), the K loop unrolled by the stage count so that
//   every shared address is a register plus an immediate (16-bit and most tf32 wgrad's also free
//   of per-tile end tests and its copies of row tests against k_end until its last one or two
//   groups: pipeline_group). Each operand tile is stored in shared memory
//   with its contiguous global dimension contiguous (conv_igemm_layout.cuh), XOR-swizzled in 16-byte units
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
// Loads: conv_igemm_loaders.cuh's header comment; epilogue: conv_igemm_epilogue.cuh's.
// Layout: channels_last only (K runs along contiguous channels). The launcher transposes
//   channels_first activations around the kernels (layout.cu; conv/__init__.py Problem), so the
//   kernels have no channels_first path and no layout parameter.
// Limits: M, N, K and the pixels of one image < 2^31 (checked by the launcher; indices decode
//   in 32 bits); offsets are 64-bit, except the 32-bit tap, filter (dgrad) and row-stream
//   offsets of the vector path (checked per block: larger reaches take the per-element path),
//   which also needs the filter's taps per dim (of the dgrad phase) plus CONV_BK / VEC to sum
//   to <= 31 for the fwd/dgrad tap masks (tap_masks_fit), and for wgrad x's pixels (all images)
//   < 2^31 and every window origin's pixel index (pads included) < 2^32 (a row's window origin
//   is a 32-bit pixel index); grid.y = N tiles <= 65535,
//   grid.z = splits (wgrad) or stride phases s_d*s_h*s_w (dgrad) <= 65535. No atomics.
// Files: this translation unit sets the variant's macros (the launcher's #defines, else the
//   defaults below) and holds the kernels; the rest is in headers beside it, included in this
//   order, each relying on the macros and on the headers before it (their own comments say what):
//   conv_igemm_layout.cuh    shared-memory tiles: layouts, swizzle and padding, stage ring, chunk mapping
//   conv_igemm_index.cuh     integer helpers: wide multiplies, selects, FastDiv, wgrad's K-position decode
//   conv_igemm_gather.cuh    global -> shared copies: chunks, tap masks and TapCursor, GatherA, RowStream
//   conv_igemm_loaders.cuh   Loader<MODE> for fwd, dgrad and wgrad (WgradPack): the Loads
//   conv_igemm_math.cuh      one K tile's multiply: FFMA micro-tiles, mma.sync (16-bit, tf32) and tf32 rounding
//   conv_igemm_pipeline.cuh  the cp.async pipeline and main loop (igemm_mainloop)
//   conv_igemm_epilogue.cuh  the output stores (store_tile)
//   ConvGeom, TapSeq / TapIter (K positions) and DgradPhase (stride phases): conv_common.cuh.
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

// Headers, in dependency order (see Files above): each expects the macros above defined.
#include "conv_igemm_layout.cuh"
#include "conv_igemm_index.cuh"
#include "conv_igemm_gather.cuh"
#include "conv_igemm_loaders.cuh"
#include "conv_igemm_math.cuh"
#include "conv_igemm_pipeline.cuh"
#include "conv_igemm_epilogue.cuh"

// __launch_bounds__ names the minimum blocks per SM explicitly: without it this NVRTC's
// ptxas capped registers low (32-64) and spilled the index math.

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
