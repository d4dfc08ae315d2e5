// conv_igemm.cu: one N-d implicit-GEMM design for the convolution forward pass and
// both gradients. Launched by gpuk/kernels/conv/__init__.py, which #defines the element type,
// the math path and the tile shape (chosen by gpuk/kernels/conv/tiles.py) and computes
// the grid from the same constants.
//
// The three GEMM views (taps = KD*KH*KW, OP/IP = output/input pixels per image):
//   conv_igemm_fwd:   y[m, n]  = sum_k A[m, k] B[k, n]   M = N*OP,      N = C_out, K = taps*C_in
//       A = im2col(x) gathered on the fly (padding/stride/dilation predicates), B = w as (K, C_out).
//   conv_igemm_dgrad: dx[m, n] = ...                     M = N*IP,      N = C_in,  K = taps*C_out
//       A[(img, i), (tap, co)] = dy[img, o, co] where i = o*s - pad + tap*dil (o must be an
//       integer in range: the stride holes are predicates, no zeros are inserted),
//       B[(tap, co), ci] = w[tap, ci, co] (the transposed filter; the flip is implicit).
//   conv_igemm_wgrad: dw[m, n] = ...                     M = taps*C_in, N = C_out, K = N*OP
//       A = im2col(x) transposed, B = dy as (N*OP, C_out). Split-K over gridDim.z: each
//       split writes acc_t partial sums; conv_reduce_splits adds them in split order
//       (deterministic, no atomics). With one split the block writes dw directly.
//
// Math paths (CONV_MATH): 0 = register-blocked FFMA (float32 strict, float64);
//   1 = mma.m16n8k16 with float32 accumulation on 16-bit inputs: f16 for float16, bf16 for
//       bfloat16 (ELEMENT_T picks the instruction, see Mma16);
//   2 = mma.m16n8k8 tf32 (float32 when gpuk.config.precision() == 'tf32').
// Tiling: CONV_BM x CONV_BN output tile per block, K in steps of CONV_BK. A and B tiles
//   live in shared memory k-major (As[k][m], Bs[k][n]), double-buffered: the next tile is
//   fetched with cp.async (4-byte elements; 16-bit elements and zero-fills use plain stores) while
//   the current one is multiplied. FFMA: each thread owns a CONV_TM x CONV_TN micro-tile.
//   MMA: CONV_WARPS_M x CONV_WARPS_N warps, each a (BM/WARPS_M) x (BN/WARPS_N) warp tile
//   of 16x8 MMA tiles.
// Layouts: channels_last and channels_first share the kernel through tensor_offset().
//   channels_last is the fast path (K runs along contiguous channels).
// Epilogue (fwd only): 0 none, 1 + bias[c_out], 2 + bias then relu (relu keeps NaN).
// Limits: M, N, K < 2^31 (checked by the launcher; indices decode in 32 bits); offsets are 64-bit; grid.y = N tiles
//   <= 65535, grid.z = splits <= 65535. No atomics.
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
#ifndef REDUCE_THREADS
#define REDUCE_THREADS 256
#endif

// __launch_bounds__ names the minimum blocks per SM explicitly: without it this NVRTC's
// ptxas capped registers low (32-64) and spilled the index math.
#define MODE_FWD 0
#define MODE_DGRAD 1
#define MODE_WGRAD 2
#define SMEM_PAD 4   // breaks the power-of-two row stride of the k-major tiles

#if CONV_MATH == 0
static_assert(CONV_THREADS == (CONV_BM / CONV_TM) * (CONV_BN / CONV_TN), "FFMA: one thread per micro-tile");
#else
static_assert(CONV_THREADS == 32 * CONV_WARPS_M * CONV_WARPS_N, "MMA: one warp per warp tile");
static_assert((CONV_BM / CONV_WARPS_M) % 16 == 0 && (CONV_BN / CONV_WARPS_N) % 8 == 0, "MMA warp tile");
static_assert(CONV_BK % (CONV_MATH == 1 ? 16 : 8) == 0, "MMA k step");
#endif
static_assert(CONV_THREADS % CONV_BK == 0 && CONV_THREADS % CONV_BM == 0 && CONV_THREADS % CONV_BN == 0,
              "loader mappings need the block to cover whole tile rows");
static_assert((CONV_BM * CONV_BK) % CONV_THREADS == 0 && (CONV_BN * CONV_BK) % CONV_THREADS == 0, "loads");

#define A_LOADS (CONV_BM * CONV_BK / CONV_THREADS)
#define B_LOADS (CONV_BN * CONV_BK / CONV_THREADS)

struct ConvGeom {
    int batch, c_in, c_out;
    int in_d, in_h, in_w, out_d, out_h, out_w;
    int k_d, k_h, k_w, s_d, s_h, s_w, dil_d, dil_h, dil_w, pad_d, pad_h, pad_w;
    int channels_last;
    long long in_pix, out_pix;
    int taps;
};

// A row of A, decoded once per block: fwd/dgrad an image and the window origin of one
// pixel; wgrad one (tap, c_in) pair as tap offsets.
struct RowCoord {
    int n, d, h, w, c;
    bool valid;
};

template <int MODE>
__device__ __forceinline__ RowCoord decode_row(const ConvGeom& g, long long m, long long rows) {
    RowCoord r;
    r.valid = m < rows;
    // Index decoding in 32 bits (the launcher keeps M, N, K < 2^31): 64-bit division is a
    // slow subroutine call on the GPU. Offsets are formed in 64 bits afterwards.
    const unsigned mu = r.valid ? (unsigned)m : 0u;
    if (MODE == MODE_WGRAD) {
        const int tap = (int)(mu / (unsigned)g.c_in);
        r.c = (int)(mu - (unsigned)tap * (unsigned)g.c_in);
        const int kw = tap % g.k_w, kh = (tap / g.k_w) % g.k_h, kd = tap / (g.k_w * g.k_h);
        r.d = kd * g.dil_d - g.pad_d;
        r.h = kh * g.dil_h - g.pad_h;
        r.w = kw * g.dil_w - g.pad_w;
        r.n = 0;
    } else {
        const unsigned pixels = (unsigned)(MODE == MODE_FWD ? g.out_pix : g.in_pix);
        const unsigned sz_h = MODE == MODE_FWD ? g.out_h : g.in_h, sz_w = MODE == MODE_FWD ? g.out_w : g.in_w;
        r.n = (int)(mu / pixels);
        const unsigned pix = mu - (unsigned)r.n * pixels;
        const int w = (int)(pix % sz_w), h = (int)((pix / sz_w) % sz_h), d = (int)(pix / (sz_w * sz_h));
        if (MODE == MODE_FWD) {   // window origin in the unpadded input
            r.d = d * g.s_d - g.pad_d;
            r.h = h * g.s_h - g.pad_h;
            r.w = w * g.s_w - g.pad_w;
        } else {                  // input position shifted by the padding
            r.d = d + g.pad_d;
            r.h = h + g.pad_h;
            r.w = w + g.pad_w;
        }
        r.c = 0;
    }
    return r;
}

__device__ __forceinline__ void decode_tap(const ConvGeom& g, int tap, int& kd, int& kh, int& kw) {
    kw = tap % g.k_w;
    kh = (tap / g.k_w) % g.k_h;
    kd = tap / (g.k_w * g.k_h);
}

// dgrad: the output coordinate o with o*s == shifted - tap*dil, or -1 (a stride hole or out of range).
__device__ __forceinline__ int dgrad_source(int shifted, int tap_offset, int stride, int out_size) {
    const int t = shifted - tap_offset;
    if (t < 0) return -1;
    const int o = t / stride;
    return (o * stride == t && o < out_size) ? o : -1;
}

// Address of A[row, k] or nullptr where the element is a zero (padding, stride hole, tail).
template <int MODE>
__device__ __forceinline__ const elem_t* a_source(const ConvGeom& g, const elem_t* __restrict__ src,
                                                  const RowCoord& r, long long k, long long depth) {
    if (!r.valid || k >= depth) return nullptr;
    if (MODE == MODE_FWD) {
        const unsigned ku = (unsigned)k;
        const int tap = (int)(ku / (unsigned)g.c_in), ci = (int)(ku - (unsigned)tap * (unsigned)g.c_in);
        int kd, kh, kw;
        decode_tap(g, tap, kd, kh, kw);
        const int id = r.d + kd * g.dil_d, ih = r.h + kh * g.dil_h, iw = r.w + kw * g.dil_w;
        if ((unsigned)id >= (unsigned)g.in_d || (unsigned)ih >= (unsigned)g.in_h || (unsigned)iw >= (unsigned)g.in_w)
            return nullptr;
        const long long pix = ((long long)id * g.in_h + ih) * g.in_w + iw;
        return src + tensor_offset(r.n, ci, pix, g.c_in, g.in_pix, g.channels_last);
    } else if (MODE == MODE_DGRAD) {
        const unsigned ku = (unsigned)k;
        const int tap = (int)(ku / (unsigned)g.c_out), co = (int)(ku - (unsigned)tap * (unsigned)g.c_out);
        int kd, kh, kw;
        decode_tap(g, tap, kd, kh, kw);
        const int od = dgrad_source(r.d, kd * g.dil_d, g.s_d, g.out_d);
        const int oh = dgrad_source(r.h, kh * g.dil_h, g.s_h, g.out_h);
        const int ow = dgrad_source(r.w, kw * g.dil_w, g.s_w, g.out_w);
        if (od < 0 || oh < 0 || ow < 0) return nullptr;
        const long long pix = ((long long)od * g.out_h + oh) * g.out_w + ow;
        return src + tensor_offset(r.n, co, pix, g.c_out, g.out_pix, g.channels_last);
    } else {
        const unsigned ku = (unsigned)k, opix = (unsigned)g.out_pix;
        const unsigned n = ku / opix, pix = ku - n * opix;
        const int ow = (int)(pix % (unsigned)g.out_w), oh = (int)((pix / (unsigned)g.out_w) % (unsigned)g.out_h);
        const int od = (int)(pix / ((unsigned)g.out_w * (unsigned)g.out_h));
        const int id = od * g.s_d + r.d, ih = oh * g.s_h + r.h, iw = ow * g.s_w + r.w;
        if ((unsigned)id >= (unsigned)g.in_d || (unsigned)ih >= (unsigned)g.in_h || (unsigned)iw >= (unsigned)g.in_w)
            return nullptr;
        const long long ipix = ((long long)id * g.in_h + ih) * g.in_w + iw;
        return src + tensor_offset(n, r.c, ipix, g.c_in, g.in_pix, g.channels_last);
    }
}

// Address of B[k, col] or nullptr outside the matrix.
template <int MODE>
__device__ __forceinline__ const elem_t* b_source(const ConvGeom& g, const elem_t* __restrict__ src, long long k,
                                                  int col, long long depth, int cols) {
    if (k >= depth || col >= cols) return nullptr;
    if (MODE == MODE_FWD) return src + k * g.c_out + col;                 // w as (taps*C_in, C_out)
    if (MODE == MODE_DGRAD) {                                              // w[tap, ci=col, co]
        const unsigned tap = (unsigned)k / (unsigned)g.c_out, co = (unsigned)k - tap * (unsigned)g.c_out;
        return src + ((long long)tap * g.c_in + col) * g.c_out + co;
    }
    const unsigned n = (unsigned)k / (unsigned)g.out_pix, pix = (unsigned)k - n * (unsigned)g.out_pix;  // dy[n, pix, co]
    return src + tensor_offset(n, col, pix, g.c_out, g.out_pix, g.channels_last);
}

// One element global -> shared: cp.async where the size allows, else a plain copy; zeros
// where `src` is null (cp.async zero-fill needs 16-byte granules, too coarse for a gather).
__device__ __forceinline__ void copy_element(float* dst, const float* src) {
    if (src) cp_async_4(dst, src); else *dst = 0.0f;
}
__device__ __forceinline__ void copy_element(double* dst, const double* src) {
    if (src) {
        cp_async_4(dst, src);
        cp_async_4(reinterpret_cast<unsigned*>(dst) + 1, reinterpret_cast<const unsigned*>(src) + 1);
    } else {
        *dst = 0.0;
    }
}
// float16 and bfloat16: 2-byte elements, below cp.async's 4-byte minimum.
template <class T>
__device__ __forceinline__ void copy_element(T* dst, const T* src) {
    *dst = src ? *src : ElementTraits<T>::from_acc(0.0f);
}

// Loader mappings: which tile index runs fastest across threads. fwd/dgrad A and dgrad
// B run along k (contiguous channels in channels_last); the others along m / n.
#define A_K_FAST (MODE != MODE_WGRAD)
#define B_K_FAST (MODE == MODE_DGRAD)

template <int MODE>
__device__ __forceinline__ int a_tile_m(int j) {
    const int i = threadIdx.x + j * CONV_THREADS;
    return A_K_FAST ? i / CONV_BK : i % CONV_BM;
}
template <int MODE>
__device__ __forceinline__ int a_tile_k(int j) {
    const int i = threadIdx.x + j * CONV_THREADS;
    return A_K_FAST ? i % CONV_BK : i / CONV_BM;
}

template <int MODE>
__device__ __forceinline__ void load_tiles(const ConvGeom& g, const elem_t* __restrict__ a_src,
                                           const elem_t* __restrict__ b_src, const RowCoord* rows,
                                           elem_t (*as)[CONV_BM + SMEM_PAD], elem_t (*bs)[CONV_BN + SMEM_PAD],
                                           long long k0, long long depth, int col0, int cols) {
#pragma unroll
    for (int j = 0; j < A_LOADS; ++j) {
        const int mm = a_tile_m<MODE>(j), kk = a_tile_k<MODE>(j);
        copy_element(&as[kk][mm], a_source<MODE>(g, a_src, rows[j], k0 + kk, depth));
    }
#pragma unroll
    for (int j = 0; j < B_LOADS; ++j) {
        const int i = threadIdx.x + j * CONV_THREADS;
        const int nn = B_K_FAST ? i / CONV_BK : i % CONV_BN, kk = B_K_FAST ? i % CONV_BK : i / CONV_BN;
        copy_element(&bs[kk][nn], b_source<MODE>(g, b_src, k0 + kk, col0 + nn, depth, cols));
    }
}

// ---- the multiply of one K-tile, per math path ----
#if CONV_MATH == 0
#define ACC_COUNT (CONV_TM * CONV_TN)
__device__ __forceinline__ void tile_multiply(elem_t (*as)[CONV_BM + SMEM_PAD], elem_t (*bs)[CONV_BN + SMEM_PAD],
                                              acc_t* acc) {
    const int tx = threadIdx.x % (CONV_BN / CONV_TN), ty = threadIdx.x / (CONV_BN / CONV_TN);
#pragma unroll
    for (int kk = 0; kk < CONV_BK; ++kk) {
        acc_t a[CONV_TM], b[CONV_TN];
#pragma unroll
        for (int i = 0; i < CONV_TM; ++i) a[i] = to_acc(as[kk][ty * CONV_TM + i]);
#pragma unroll
        for (int j = 0; j < CONV_TN; ++j) b[j] = to_acc(bs[kk][tx * CONV_TN + j]);
#pragma unroll
        for (int i = 0; i < CONV_TM; ++i)
#pragma unroll
            for (int j = 0; j < CONV_TN; ++j) acc[i * CONV_TN + j] = fma(a[i], b[j], acc[i * CONV_TN + j]);
    }
}
// (row, col) within the block tile of accumulator e.
__device__ __forceinline__ void acc_position(int e, int& row, int& col) {
    const int tx = threadIdx.x % (CONV_BN / CONV_TN), ty = threadIdx.x / (CONV_BN / CONV_TN);
    row = ty * CONV_TM + e / CONV_TN;
    col = tx * CONV_TN + e % CONV_TN;
}
#else
#define WARP_TILE_M (CONV_BM / CONV_WARPS_M)
#define WARP_TILE_N (CONV_BN / CONV_WARPS_N)
#define MMA_M_TILES (WARP_TILE_M / 16)
#define MMA_N_TILES (WARP_TILE_N / 8)
#define ACC_COUNT (MMA_M_TILES * MMA_N_TILES * 4)
#if CONV_MATH == 1
// A packed MMA operand register from two 16-bit elements (the lower k in the low half).
__device__ __forceinline__ unsigned pack_bits(__half lo, __half hi) {
    return (unsigned)__half_as_ushort(lo) | ((unsigned)__half_as_ushort(hi) << 16);
}
__device__ __forceinline__ unsigned pack_bits(__nv_bfloat16 lo, __nv_bfloat16 hi) {
    return (unsigned)__bfloat16_as_ushort(lo) | ((unsigned)__bfloat16_as_ushort(hi) << 16);
}
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
__device__ __forceinline__ void tile_multiply(elem_t (*as)[CONV_BM + SMEM_PAD], elem_t (*bs)[CONV_BN + SMEM_PAD],
                                              acc_t* acc) {
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, gr = lane >> 2, t = lane & 3;
    const int row0 = (warp / CONV_WARPS_N) * WARP_TILE_M, col0 = (warp % CONV_WARPS_N) * WARP_TILE_N;
#if CONV_MATH == 1
#pragma unroll
    for (int ks = 0; ks < CONV_BK; ks += 16) {
        const int k0 = ks + 2 * t;
        unsigned b[MMA_N_TILES][2];
#pragma unroll
        for (int ni = 0; ni < MMA_N_TILES; ++ni) {
            const int c = col0 + ni * 8 + gr;
            b[ni][0] = pack_bits(bs[k0][c], bs[k0 + 1][c]);
            b[ni][1] = pack_bits(bs[k0 + 8][c], bs[k0 + 9][c]);
        }
#pragma unroll
        for (int mi = 0; mi < MMA_M_TILES; ++mi) {
            const int r0 = row0 + mi * 16 + gr, r1 = r0 + 8;
            const unsigned a[4] = {pack_bits(as[k0][r0], as[k0 + 1][r0]), pack_bits(as[k0][r1], as[k0 + 1][r1]),
                                   pack_bits(as[k0 + 8][r0], as[k0 + 9][r0]),
                                   pack_bits(as[k0 + 8][r1], as[k0 + 9][r1])};
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
        const int k0 = ks + t;
        unsigned b[MMA_N_TILES][2];
#pragma unroll
        for (int ni = 0; ni < MMA_N_TILES; ++ni) {
            const int c = col0 + ni * 8 + gr;
            b[ni][0] = float_to_tf32(bs[k0][c]);
            b[ni][1] = float_to_tf32(bs[k0 + 4][c]);
        }
#pragma unroll
        for (int mi = 0; mi < MMA_M_TILES; ++mi) {
            const int r0 = row0 + mi * 16 + gr, r1 = r0 + 8;
            const unsigned a[4] = {float_to_tf32(as[k0][r0]), float_to_tf32(as[k0][r1]),
                                   float_to_tf32(as[k0 + 4][r0]), float_to_tf32(as[k0 + 4][r1])};
#pragma unroll
            for (int ni = 0; ni < MMA_N_TILES; ++ni) {
                float* c = acc + (mi * MMA_N_TILES + ni) * 4;
                mma_m16n8k8_tf32(c, a, b[ni], c);
            }
        }
    }
#endif
}
__device__ __forceinline__ void acc_position(int e, int& row, int& col) {
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, gr = lane >> 2, t = lane & 3;
    const int tile = e >> 2, part = e & 3, mi = tile / MMA_N_TILES, ni = tile % MMA_N_TILES;
    row = (warp / CONV_WARPS_N) * WARP_TILE_M + mi * 16 + gr + (part >= 2 ? 8 : 0);
    col = (warp % CONV_WARPS_N) * WARP_TILE_N + ni * 8 + 2 * t + (part & 1);
}
#endif

// The shared main loop: accumulates the block's tile over k in [k_begin, k_end).
template <int MODE>
__device__ __forceinline__ void igemm_mainloop(const ConvGeom& g, const elem_t* __restrict__ a_src,
                                               const elem_t* __restrict__ b_src, long long rows, int cols,
                                               long long k_begin, long long k_end, acc_t* acc) {
    __shared__ elem_t as[2][CONV_BK][CONV_BM + SMEM_PAD];
    __shared__ elem_t bs[2][CONV_BK][CONV_BN + SMEM_PAD];
    const long long row0 = (long long)blockIdx.x * CONV_BM;
    const int col0 = blockIdx.y * CONV_BN;
    RowCoord row_coords[A_LOADS];
#pragma unroll
    for (int j = 0; j < A_LOADS; ++j) row_coords[j] = decode_row<MODE>(g, row0 + a_tile_m<MODE>(j), rows);
#pragma unroll
    for (int e = 0; e < ACC_COUNT; ++e) acc[e] = acc_t(0);
    const long long tiles = (k_end - k_begin + CONV_BK - 1) / CONV_BK;
    if (tiles <= 0) return;
    load_tiles<MODE>(g, a_src, b_src, row_coords, as[0], bs[0], k_begin, k_end, col0, cols);
    cp_async_commit();
    for (long long t = 0; t < tiles; ++t) {
        const int stage = (int)(t & 1);
        if (t + 1 < tiles) {   // the other buffer was released by the barrier ending step t-1
            load_tiles<MODE>(g, a_src, b_src, row_coords, as[stage ^ 1], bs[stage ^ 1],
                             k_begin + (t + 1) * CONV_BK, k_end, col0, cols);
            cp_async_commit();
            cp_async_wait<1>();
        } else {
            cp_async_wait<0>();
        }
        __syncthreads();
        tile_multiply(as[stage], bs[stage], acc);
        __syncthreads();
    }
}

static __device__ ConvGeom make_geom(int batch, int c_in, int c_out, int in_d, int in_h, int in_w, int out_d,
                                     int out_h, int out_w, int k_d, int k_h, int k_w, int s_d, int s_h, int s_w,
                                     int dil_d, int dil_h, int dil_w, int pad_d, int pad_h, int pad_w,
                                     int channels_last) {
    ConvGeom g;
    g.batch = batch; g.c_in = c_in; g.c_out = c_out;
    g.in_d = in_d; g.in_h = in_h; g.in_w = in_w; g.out_d = out_d; g.out_h = out_h; g.out_w = out_w;
    g.k_d = k_d; g.k_h = k_h; g.k_w = k_w; g.s_d = s_d; g.s_h = s_h; g.s_w = s_w;
    g.dil_d = dil_d; g.dil_h = dil_h; g.dil_w = dil_w; g.pad_d = pad_d; g.pad_h = pad_h; g.pad_w = pad_w;
    g.channels_last = channels_last;
    g.in_pix = (long long)in_d * in_h * in_w;
    g.out_pix = (long long)out_d * out_h * out_w;
    g.taps = k_d * k_h * k_w;
    return g;
}

#define CONV_GEOM_ARGS                                                                                   \
    batch, c_in, c_out, in_d, in_h, in_w, out_d, out_h, out_w, k_d, k_h, k_w, s_d, s_h, s_w, dil_d, dil_h, \
        dil_w, pad_d, pad_h, pad_w, channels_last

// Writes this block's accumulator tile (rows = N * pix GEMM rows, `channels` GEMM columns) to an
// activation tensor in either layout, with the epilogue: 0 none, 1 + bias[c], 2 + bias[c] then relu.
__device__ __forceinline__ void store_activation_tile(const acc_t (&acc)[ACC_COUNT], long long rows, int channels,
                                                      int pix, const elem_t* __restrict__ bias, int epilogue,
                                                      elem_t* __restrict__ out, int channels_last) {
#pragma unroll
    for (int e = 0; e < ACC_COUNT; ++e) {
        int r, c;
        acc_position(e, r, c);
        const long long m = (long long)blockIdx.x * CONV_BM + r;
        const int channel = blockIdx.y * CONV_BN + c;
        if (m >= rows || channel >= channels) continue;
        acc_t v = acc[e];
        if (epilogue >= 1) v += to_acc(bias[channel]);
        if (epilogue == 2) v = v < acc_t(0) ? acc_t(0) : v;
        const unsigned n = (unsigned)m / (unsigned)pix;
        out[tensor_offset(n, channel, (unsigned)m - n * (unsigned)pix, channels, pix, channels_last)] =
            ElementTraits<elem_t>::from_acc(v);
    }
}

// conv_igemm_fwd: y = conv(x, w) (+ bias, relu). Grid (M tiles, C_out tiles), CONV_THREADS threads.
extern "C" __global__ void __launch_bounds__(CONV_THREADS, 1)
conv_igemm_fwd(const elem_t* __restrict__ x, const elem_t* __restrict__ w, const elem_t* __restrict__ bias,
               elem_t* __restrict__ y, int batch, int c_in, int c_out, int in_d, int in_h, int in_w, int out_d,
               int out_h, int out_w, int k_d, int k_h, int k_w, int s_d, int s_h, int s_w, int dil_d, int dil_h,
               int dil_w, int pad_d, int pad_h, int pad_w, int channels_last, int epilogue) {
    const ConvGeom g = make_geom(CONV_GEOM_ARGS);
    const long long rows = (long long)batch * g.out_pix, depth = (long long)g.taps * c_in;
    acc_t acc[ACC_COUNT];
    igemm_mainloop<MODE_FWD>(g, x, w, rows, c_out, 0, depth, acc);
    store_activation_tile(acc, rows, c_out, g.out_pix, bias, epilogue, y, channels_last);
}

// conv_igemm_dgrad: dx = dgrad(dy, w). Grid (N*IP tiles, C_in tiles), CONV_THREADS threads.
extern "C" __global__ void __launch_bounds__(CONV_THREADS, 1)
conv_igemm_dgrad(const elem_t* __restrict__ dy, const elem_t* __restrict__ w, elem_t* __restrict__ dx, int batch,
                 int c_in, int c_out, int in_d, int in_h, int in_w, int out_d, int out_h, int out_w, int k_d,
                 int k_h, int k_w, int s_d, int s_h, int s_w, int dil_d, int dil_h, int dil_w, int pad_d,
                 int pad_h, int pad_w, int channels_last) {
    const ConvGeom g = make_geom(CONV_GEOM_ARGS);
    const long long rows = (long long)batch * g.in_pix, depth = (long long)g.taps * c_out;
    acc_t acc[ACC_COUNT];
    igemm_mainloop<MODE_DGRAD>(g, dy, w, rows, c_in, 0, depth, acc);
    store_activation_tile(acc, rows, c_in, g.in_pix, nullptr, 0, dx, channels_last);
}

// conv_igemm_wgrad: dw (Keras layout (*k, C_in, C_out), i.e. row-major (taps*C_in, C_out)).
// Grid (taps*C_in tiles, C_out tiles, splits); split z covers k in [z*k_per_split, ...).
// splits == 1: writes dw; else writes partial[z] (acc_t, M x C_out) for conv_reduce_splits.
extern "C" __global__ void __launch_bounds__(CONV_THREADS, 1)
conv_igemm_wgrad(const elem_t* __restrict__ x, const elem_t* __restrict__ dy, elem_t* __restrict__ dw,
                 acc_t* __restrict__ partial, int batch, int c_in, int c_out, int in_d, int in_h, int in_w,
                 int out_d, int out_h, int out_w, int k_d, int k_h, int k_w, int s_d, int s_h, int s_w, int dil_d,
                 int dil_h, int dil_w, int pad_d, int pad_h, int pad_w, int channels_last, long long k_per_split) {
    const ConvGeom g = make_geom(CONV_GEOM_ARGS);
    const long long rows = (long long)g.taps * c_in, depth = (long long)batch * g.out_pix;
    const long long k_begin = (long long)blockIdx.z * k_per_split;
    const long long k_end = k_begin + k_per_split < depth ? k_begin + k_per_split : depth;
    acc_t acc[ACC_COUNT];
    igemm_mainloop<MODE_WGRAD>(g, x, dy, rows, c_out, k_begin, k_end, acc);
    acc_t* split_out = partial + (long long)blockIdx.z * rows * c_out;
#pragma unroll
    for (int e = 0; e < ACC_COUNT; ++e) {
        int r, c;
        acc_position(e, r, c);
        const long long m = (long long)blockIdx.x * CONV_BM + r;
        const int co = blockIdx.y * CONV_BN + c;
        if (m >= rows || co >= c_out) continue;
        if (gridDim.z == 1)
            dw[m * c_out + co] = ElementTraits<elem_t>::from_acc(acc[e]);
        else
            split_out[m * c_out + co] = acc[e];
    }
}

// conv_reduce_splits: dw[i] = sum over splits of partial[s][i], in split order.
// 1-D grid-stride loop; no shared memory, no atomics.
extern "C" __global__ void __launch_bounds__(REDUCE_THREADS)
conv_reduce_splits(const acc_t* __restrict__ partial, elem_t* __restrict__ out, long long count, int splits) {
    reduce_splits_body(partial, out, count, splits);
}
