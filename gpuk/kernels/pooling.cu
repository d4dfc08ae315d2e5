// pooling.cu: max and average pooling over 1, 2 or 3 spatial dims, forward and backward,
// and global average pooling as a reduction.
// Launched by gpuk/kernels/pooling.py, which #defines ELEMENT_T and the thread counts
// and computes the grid from the same constants.
//
// One N-d design: every problem is described with three spatial dims (d, h, w); a 1-d or
// 2-d problem gets leading dims of size 1 with window 1, stride 1 and no padding. The
// layout is a runtime code: LAYOUT_CHANNELS_FIRST (N, C, *S), LAYOUT_CHANNELS_LAST
// (N, *S, C), or LAYOUT_CHANNELS_LAST_VEC: channels last, each thread handling POOL_VEC
// consecutive channels with 16-byte loads (the launcher asks for it when C % POOL_VEC == 0;
// the kernel still checks the alignment of x and y and falls back to scalar loads).
// Padding never takes part (TensorFlow's rule, like the NumPy twin): the window is clamped
// to the input, max ignores the padding and average divides by the real element count.
//
// Max pooling's by-product for the backward (argmax) is the winner's row-major tap index
// inside its window, counted from the window's padded start: 1 byte (uint8) while a window
// has at most 256 taps (every pooling layer in practice), int32 beyond (the *_i32 kernels),
// instead of an int64 flat position: 1 byte written and read per output instead of 8. We
// keep a stored index rather than recomputing the winner from x and y in the backward (as
// cuDNN does) because that re-reads every window of x (prod(window) / prod(strides) times
// the input, 2.25x for 3x3/2) and needs y to find ties in the same order; the tap costs one
// byte per output. The backward is a gather (max_pool_bwd_*): each dx element visits the
// windows that cover it and adds the dy of those whose tap is its own position, in a fixed
// order: no atomics (atomicAdd(float) flushed subnormal sums to zero and rounded
// overlapping windows in a varying order), bit-identical results across runs.
#include "common.cuh"
#include "bitwise_select.cuh"
#include "element_types.cuh"

#ifndef POOL_THREADS
#define POOL_THREADS 256
#endif
#ifndef GLOBAL_POOL_THREADS
#define GLOBAL_POOL_THREADS 256
#endif
#ifndef GLOBAL_POOL_ROWS
#define GLOBAL_POOL_ROWS 8
#endif
// Resident blocks per SM promised to ptxas for the window kernels (max/avg forward and
// backward): a register budget of 65536 / (3 * POOL_THREADS) = 85 -> 80 per thread. Without
// a figure this NVRTC's ptxas capped them at 40-64 registers and spilled 4-40 bytes around
// the out-of-line slow path of the IEEE division (avg) and the 16-byte lanes (8 values and
// 8 int64 argmax of max_pool_fwd on half, measured before the argmax became a 1-byte tap);
// with 4 (64 registers) max_pool_fwd on half still spilled on sm_90. The vectorized max-pool
// gather (8 sums, 8 dy and 8 taps per thread on half) uses 72-80 now. 3 builds every variant without spills using 42-80 registers, i.e. 3-5
// blocks (24-40 warps) per SM: enough to hide the latency of these memory-bound gathers.
#ifndef POOL_MIN_BLOCKS
#define POOL_MIN_BLOCKS 3
#endif
#define LAYOUT_CHANNELS_FIRST 0
#define LAYOUT_CHANNELS_LAST 1
#define LAYOUT_CHANNELS_LAST_VEC 2

static_assert(gpuk_same_type<acc_t, ElementTraits<elem_t>::acc>::value, "ACC_T must be the accumulation type of ELEMENT_T");
#define POOL_VEC ((int)(16 / sizeof(elem_t)))

struct PoolGeometry {
    long long n, c;                 // batch and channels
    int in[3], out[3], k[3], s[3], p[3];   // (d, h, w); p = padding before
    long long in_volume, out_volume;
};

__device__ __forceinline__ PoolGeometry make_geometry(int n, int c, int in_d, int in_h, int in_w, int out_d,
                                                      int out_h, int out_w, int k_d, int k_h, int k_w, int s_d,
                                                      int s_h, int s_w, int p_d, int p_h, int p_w) {
    PoolGeometry g;
    g.n = n; g.c = c;
    g.in[0] = in_d; g.in[1] = in_h; g.in[2] = in_w;
    g.out[0] = out_d; g.out[1] = out_h; g.out[2] = out_w;
    g.k[0] = k_d; g.k[1] = k_h; g.k[2] = k_w;
    g.s[0] = s_d; g.s[1] = s_h; g.s[2] = s_w;
    g.p[0] = p_d; g.p[1] = p_h; g.p[2] = p_w;
    g.in_volume = (long long)in_d * in_h * in_w;
    g.out_volume = (long long)out_d * out_h * out_w;
    return g;
}

// The real (un-padded) input range [lo, hi) read by output position o along dim `dim`.
__device__ __forceinline__ void window_range(const PoolGeometry& g, int dim, int o, int& lo, int& hi) {
    const int start = o * g.s[dim] - g.p[dim];
    lo = start < 0 ? 0 : start;
    hi = start + g.k[dim] < g.in[dim] ? start + g.k[dim] : g.in[dim];
}

// Flat index t within a sample, in the memory order of its array (channels_last: the lane of
// `lanes` fastest, then w, h, d; channels first: w, h, d, then the lane) -> its lane and
// spatial coordinates pos (d, h, w) over the sizes dims; `position` is the flat spatial
// index. 32-bit divisions (the launcher checks per-sample sizes < 2^31).
__device__ __forceinline__ unsigned split_index(unsigned t, unsigned lanes, const int dims[3], bool channels_last,
                                                int pos[3], unsigned& position) {
    unsigned lane = 0;
    if (channels_last) { lane = t % lanes; t /= lanes; }
    position = t % ((unsigned)dims[0] * (unsigned)dims[1] * (unsigned)dims[2]);
    pos[2] = (int)(t % (unsigned)dims[2]); t /= (unsigned)dims[2];
    pos[1] = (int)(t % (unsigned)dims[1]); t /= (unsigned)dims[1];
    pos[0] = (int)(t % (unsigned)dims[0]); t /= (unsigned)dims[0];
    return channels_last ? lane : t;
}

// The outputs whose windows cover input position pos, per dim: lo[dim] .. hi[dim] inclusive
// (empty when lo > hi), i.e. ceil((pos + p - k + 1) / s) .. floor((pos + p) / s), clamped.
__device__ __forceinline__ void covering_outputs(const PoolGeometry& g, const int pos[3], int lo[3], int hi[3]) {
#pragma unroll
    for (int dim = 0; dim < 3; ++dim) {
        const int first = pos[dim] + g.p[dim] - g.k[dim] + 1;
        lo[dim] = first <= 0 ? 0 : (first + g.s[dim] - 1) / g.s[dim];
        const int last = (pos[dim] + g.p[dim]) / g.s[dim];
        hi[dim] = last < g.out[dim] - 1 ? last : g.out[dim] - 1;
    }
}

// The grid-stride skeleton of the window kernels: blockIdx.y strides the batch (sample b),
// a 32-bit grid-stride loop over blockIdx.x / threadIdx.x the per_sample elements i of a
// sample (64-bit division is a slow subroutine call on the GPU).
#define POOL_FOR_EACH_ELEMENT(b, i, n, per_sample)                                               \
    for (long long b = blockIdx.y; b < (n); b += gridDim.y)                                      \
        for (unsigned i = blockIdx.x * blockDim.x + threadIdx.x; i < (per_sample); i += gridDim.x * blockDim.x)

// VEC consecutive elements at p as acc_t (one 16-byte load when VEC > 1; p is 16-byte aligned).
template <int VEC> __device__ __forceinline__ void load_lanes(const elem_t* __restrict__ p, acc_t v[VEC]) {
    if (VEC == 1) {
        v[0] = to_acc(p[0]);
    } else {
        const uint4 raw = load_uint4(p);
        const elem_t* e = reinterpret_cast<const elem_t*>(&raw);
#pragma unroll
        for (int j = 0; j < VEC; ++j) v[j] = to_acc(e[j]);
    }
}
template <int VEC> __device__ __forceinline__ void store_lanes(elem_t* __restrict__ p, const acc_t v[VEC]) {
    if (VEC == 1) {
        p[0] = ElementTraits<elem_t>::from_acc(v[0]);
    } else {
        uint4 raw;
        elem_t* e = reinterpret_cast<elem_t*>(&raw);
#pragma unroll
        for (int j = 0; j < VEC; ++j) e[j] = ElementTraits<elem_t>::from_acc(v[j]);
        store_uint4(p, raw);
    }
}

__device__ __forceinline__ float minus_infinity(float) { return neg_inf_f(); }
__device__ __forceinline__ double minus_infinity(double) { return __longlong_as_double((long long)0xfff0000000000000ULL); }

// VEC taps as TapT at p, one store of VEC * sizeof(TapT) bytes (p aligned to that when VEC > 1).
template <int BYTES> struct __align__(BYTES) TapBytes {
    unsigned char b[BYTES];
};
template <int VEC, class TapT> __device__ __forceinline__ void store_taps(TapT* __restrict__ p, const int where[VEC]) {
    if (VEC == 1) {
        p[0] = (TapT)where[0];
    } else {
        TapBytes<VEC * sizeof(TapT)> packed;
        TapT* lanes = reinterpret_cast<TapT*>(packed.b);
#pragma unroll
        for (int j = 0; j < VEC; ++j) lanes[j] = (TapT)where[j];
        *reinterpret_cast<TapBytes<VEC * sizeof(TapT)>*>(p) = packed;
    }
}

// pool_fwd_body: one output element (VEC channels of it in the vectorized layout) per
// thread and step. Thread mapping: blockIdx.y strides the batch; within a sample a 1-D
// grid-stride loop over the outputs in the memory order of y, so stores coalesce, and in
// channels-last layouts neighbouring threads read neighbouring channels, so loads do too.
// Index math is 32-bit within a sample (the launcher checks per-sample sizes < 2^31):
// 64-bit division is a slow subroutine call on the GPU. Offsets are 64-bit.
// Max: the first maximum in row-major window order wins, NaN wins (np.argmax's rule);
// argmax = the winner's tap in its window (see the top of the file); a window whose real
// elements are all -inf reports its first real element (the twin's rule). The VEC taps of
// a thread go out in one store of VEC * sizeof(TapT) bytes.
template <bool IS_MAX, int VEC, class TapT>
__device__ __forceinline__ void pool_fwd_body(const elem_t* __restrict__ x, elem_t* __restrict__ y,
                                              TapT* __restrict__ argmax, const PoolGeometry& g,
                                              bool channels_last) {
    const unsigned lanes = channels_last ? (unsigned)(g.c / VEC) : (unsigned)g.c;
    const unsigned per_sample = (unsigned)g.out_volume * lanes;
    POOL_FOR_EACH_ELEMENT(b, i, g.n, per_sample) {
        int o[3];
        unsigned position;
        const unsigned lane = split_index(i, lanes, g.out, channels_last, o, position);
        const int od = o[0], oh = o[1], ow = o[2];
        // x offset of spatial position sp: base + sp * sp_stride
        const long long base = channels_last ? b * g.in_volume * g.c + (long long)lane * VEC
                                             : (b * g.c + (long long)lane) * g.in_volume;
        const long long sp_stride = channels_last ? g.c : 1;
        int d0, d1, h0, h1, w0, w1;
        window_range(g, 0, od, d0, d1);
        window_range(g, 1, oh, h0, h1);
        window_range(g, 2, ow, w0, w1);
        acc_t best[VEC];
        int where[VEC];
        // tap of input (d, h, w) = ((d - sd) * k_h + (h - sh)) * k_w + (w - sw), (sd, sh, sw)
        // the window's padded start
        const int sd = od * g.s[0] - g.p[0], sh = oh * g.s[1] - g.p[1], sw = ow * g.s[2] - g.p[2];
        if (IS_MAX) {
            // best = -inf and the first real element's tap: the loop's strict > then
            // keeps that tap for an all -inf window, and x is read once
            const int first_tap = ((d0 - sd) * g.k[1] + (h0 - sh)) * g.k[2] + (w0 - sw);
#pragma unroll
            for (int j = 0; j < VEC; ++j) {
                best[j] = minus_infinity(acc_t(0));
                where[j] = first_tap;
            }
        } else {
#pragma unroll
            for (int j = 0; j < VEC; ++j) best[j] = acc_t(0);
        }
        for (int d = d0; d < d1; ++d) {
            for (int h = h0; h < h1; ++h) {
                const long long row = ((long long)d * g.in[1] + h) * g.in[2];
                for (int w = w0; w < w1; ++w) {
                    acc_t v[VEC];
                    load_lanes<VEC>(x + base + (row + w) * sp_stride, v);
#pragma unroll
                    for (int j = 0; j < VEC; ++j) {
                        if (IS_MAX) {
                            if (v[j] > best[j] || (v[j] != v[j] && best[j] == best[j])) {
                                best[j] = v[j];
                                where[j] = ((d - sd) * g.k[1] + (h - sh)) * g.k[2] + (w - sw);
                            }
                        } else {
                            best[j] += v[j];
                        }
                    }
                }
            }
        }
        if (!IS_MAX) {
            const acc_t count = acc_t((d1 - d0) * (h1 - h0) * (w1 - w0));
#pragma unroll
            for (int j = 0; j < VEC; ++j) best[j] = best[j] / count;
        }
        const long long out = b * g.out_volume * g.c +
                              (channels_last ? (long long)(i / lanes) * g.c + (long long)lane * VEC : (long long)i);
        store_lanes<VEC>(y + out, best);
        if (IS_MAX) store_taps<VEC>(argmax + out, where);
    }
}

template <bool IS_MAX, class TapT>
__device__ __forceinline__ void pool_fwd_dispatch(const elem_t* __restrict__ x, elem_t* __restrict__ y,
                                                  TapT* __restrict__ argmax, const PoolGeometry& g, int layout) {
    // The vectorized layout needs 16-byte aligned rows: C % POOL_VEC == 0 (the launcher's
    // promise) and aligned bases (checked here: views and the emulator may be unaligned).
    const bool vec = layout == LAYOUT_CHANNELS_LAST_VEC && g.c % POOL_VEC == 0 && is_aligned(x, 16) &&
                     is_aligned(y, 16) && (!IS_MAX || is_aligned(argmax, POOL_VEC * sizeof(TapT)));
    if (vec) pool_fwd_body<IS_MAX, POOL_VEC>(x, y, argmax, g, true);
    else pool_fwd_body<IS_MAX, 1>(x, y, argmax, g, layout != LAYOUT_CHANNELS_FIRST);
}

#define POOL_GEOMETRY                                                                                       \
    make_geometry(n, c, in_d, in_h, in_w, out_d, out_h, out_w, k_d, k_h, k_w, s_d, s_h, s_w, p_d, p_h, p_w)

// max_pool_fwd_u8 / max_pool_fwd_i32: y and argmax (window taps, shaped like y; uint8 for
// windows of at most 256 taps, int32 beyond). Mapping and rules: pool_fwd_body.
// Limits: per-sample sizes < 2^31, window * stride within int. No shared memory, no atomics.
extern "C" __global__ void __launch_bounds__(POOL_THREADS, POOL_MIN_BLOCKS)
max_pool_fwd_u8(const elem_t* __restrict__ x, elem_t* __restrict__ y, unsigned char* __restrict__ argmax,
                int n, int c, int in_d, int in_h, int in_w, int out_d, int out_h,
                int out_w, int k_d, int k_h, int k_w, int s_d, int s_h, int s_w, int p_d, int p_h, int p_w, int layout) {
    pool_fwd_dispatch<true>(x, y, argmax, POOL_GEOMETRY, layout);
}

extern "C" __global__ void __launch_bounds__(POOL_THREADS, POOL_MIN_BLOCKS)
max_pool_fwd_i32(const elem_t* __restrict__ x, elem_t* __restrict__ y, int* __restrict__ argmax,
                 int n, int c, int in_d, int in_h, int in_w, int out_d, int out_h,
                int out_w, int k_d, int k_h, int k_w, int s_d, int s_h, int s_w, int p_d, int p_h, int p_w, int layout) {
    pool_fwd_dispatch<true>(x, y, argmax, POOL_GEOMETRY, layout);
}

// avg_pool_fwd: the mean of the real elements of each window, accumulated in acc_t.
// Mapping: pool_fwd_body. No shared memory, no atomics.
extern "C" __global__ void __launch_bounds__(POOL_THREADS, POOL_MIN_BLOCKS)
avg_pool_fwd(const elem_t* __restrict__ x, elem_t* __restrict__ y, int n, int c, int in_d, int in_h, int in_w,
             int out_d, int out_h, int out_w, int k_d, int k_h, int k_w, int s_d, int s_h, int s_w, int p_d,
             int p_h, int p_w, int layout) {
    pool_fwd_dispatch<false, int>(x, y, nullptr, POOL_GEOMETRY, layout);
}

// avg_pool_bwd: dx[i] = sum over the outputs o whose window covers i of dy[o] / count(o).
// Gather formulation: one dx element per thread; along each dim the covering outputs are
// ceil((i + p - k + 1) / s) .. floor((i + p) / s), clamped to the output. No atomics, no
// zero-fill pass, and a fixed summation order, so results are deterministic.
// Thread mapping: blockIdx.y strides the batch, a 32-bit grid-stride loop the sample.
// Limits: per-sample sizes < 2^31. No shared memory.
__device__ __forceinline__ void avg_pool_bwd_body(const elem_t* __restrict__ dy, elem_t* __restrict__ dx,
                                                  const PoolGeometry& g, bool channels_last) {
    const unsigned per_sample = (unsigned)(g.in_volume * g.c);
    POOL_FOR_EACH_ELEMENT(b, i, g.n, per_sample) {
        int pos[3], lo[3], hi[3];
        unsigned position;
        const unsigned ch = split_index(i, (unsigned)g.c, g.in, channels_last, pos, position);
        covering_outputs(g, pos, lo, hi);
        const long long base = channels_last ? b * g.out_volume * g.c + (long long)ch
                                             : (b * g.c + (long long)ch) * g.out_volume;
        const long long sp_stride = channels_last ? g.c : 1;
        acc_t sum = acc_t(0);
        for (int od = lo[0]; od <= hi[0]; ++od) {
            int a0, a1;
            window_range(g, 0, od, a0, a1);
            for (int oh = lo[1]; oh <= hi[1]; ++oh) {
                int b0, b1;
                window_range(g, 1, oh, b0, b1);
                for (int ow = lo[2]; ow <= hi[2]; ++ow) {
                    int c0, c1;
                    window_range(g, 2, ow, c0, c1);
                    const long long o = ((long long)od * g.out[1] + oh) * g.out[2] + ow;
                    sum += to_acc(dy[base + o * sp_stride]) / acc_t((a1 - a0) * (b1 - b0) * (c1 - c0));
                }
            }
        }
        dx[b * g.in_volume * g.c + i] = ElementTraits<elem_t>::from_acc(sum);
    }
}

extern "C" __global__ void __launch_bounds__(POOL_THREADS, POOL_MIN_BLOCKS)
avg_pool_bwd(const elem_t* __restrict__ dy, elem_t* __restrict__ dx, int n, int c, int in_d, int in_h, int in_w,
             int out_d, int out_h, int out_w, int k_d, int k_h, int k_w, int s_d, int s_h, int s_w, int p_d,
             int p_h, int p_w, int layout) {
    avg_pool_bwd_body(dy, dx, POOL_GEOMETRY, layout != LAYOUT_CHANNELS_FIRST);
}

// VEC taps at p as ints (one load of VEC * sizeof(TapT) bytes when VEC > 1; p aligned to that).
template <int VEC, class TapT> __device__ __forceinline__ void load_taps(const TapT* __restrict__ p, int out[VEC]) {
    if (VEC == 1) {
        out[0] = (int)p[0];
    } else {
        const TapBytes<VEC * sizeof(TapT)> packed = *reinterpret_cast<const TapBytes<VEC * sizeof(TapT)>*>(p);
        const TapT* lanes = reinterpret_cast<const TapT*>(packed.b);
#pragma unroll
        for (int j = 0; j < VEC; ++j) out[j] = (int)lanes[j];
    }
}

// max_pool_bwd_u8 / max_pool_bwd_i32: dx[i] = sum of dy[o] over the outputs o whose window
// covers i and whose argmax tap is i's tap in that window. Gather formulation, like
// avg_pool_bwd (covering outputs along each dim: ceil((i + p - k + 1) / s) .. floor((i +
// p) / s)): one dx element (VEC channels of it in the vectorized channels-last layout: 16
// bytes of dy and dx, VEC taps in one load) per thread and step, the covering windows
// visited in row-major output order, the sum kept in acc_t and rounded once. No atomics, no
// zero-fill pass, no scratch; deterministic, and subnormal gradients survive (plain adds,
// no flush-to-zero reduction). Taps outside the window never match, so they add nothing.
// Thread mapping: blockIdx.y strides the batch, a 32-bit grid-stride loop the sample; in
// channels-last layouts neighbouring threads take neighbouring channels, so the dy, tap and
// dx accesses coalesce. Limits: per-sample sizes < 2^31. No shared memory.
template <int VEC, class TapT>
__device__ __forceinline__ void max_pool_bwd_body(const elem_t* __restrict__ dy, const TapT* __restrict__ argmax,
                                                  elem_t* __restrict__ dx, const PoolGeometry& g,
                                                  bool channels_last) {
    const unsigned lanes = channels_last ? (unsigned)(g.c / VEC) : (unsigned)g.c;
    const unsigned per_sample = (unsigned)g.in_volume * lanes;
    POOL_FOR_EACH_ELEMENT(b, i, g.n, per_sample) {
        int pos[3], lo[3], hi[3];
        unsigned position;
        const unsigned lane = split_index(i, lanes, g.in, channels_last, pos, position);
        const long long ch = (long long)lane * (channels_last ? VEC : 1);
        covering_outputs(g, pos, lo, hi);
        const long long base = channels_last ? b * g.out_volume * g.c + ch : (b * g.c + ch) * g.out_volume;
        const long long sp_stride = channels_last ? g.c : 1;
        acc_t sum[VEC];
#pragma unroll
        for (int j = 0; j < VEC; ++j) sum[j] = acc_t(0);
        for (int od = lo[0]; od <= hi[0]; ++od) {
            const int td = pos[0] - (od * g.s[0] - g.p[0]);
            for (int oh = lo[1]; oh <= hi[1]; ++oh) {
                const int tdh = td * g.k[1] + pos[1] - (oh * g.s[1] - g.p[1]);
                for (int ow = lo[2]; ow <= hi[2]; ++ow) {
                    const int tap = tdh * g.k[2] + pos[2] - (ow * g.s[2] - g.p[2]);
                    const long long o = base + (((long long)od * g.out[1] + oh) * g.out[2] + ow) * sp_stride;
                    acc_t grad[VEC];
                    int taps[VEC];
                    load_lanes<VEC>(dy + o, grad);
                    load_taps<VEC>(argmax + o, taps);
                    // keep_or_zero (bitwise_select.cuh): every lane loads dy, so a warp's loads
                    // stay one request; adding +0.0 leaves every sum unchanged (sums start at
                    // +0.0, so none is -0.0)
#pragma unroll
                    for (int j = 0; j < VEC; ++j) sum[j] += keep_or_zero(grad[j], taps[j] == tap);
                }
            }
        }
        const long long out = channels_last ? (b * g.in_volume + position) * g.c + ch
                                            : (b * g.c + ch) * g.in_volume + position;
        store_lanes<VEC>(dx + out, sum);
    }
}

template <class TapT>
__device__ __forceinline__ void max_pool_bwd_dispatch(const elem_t* __restrict__ dy, const TapT* __restrict__ argmax,
                                                      elem_t* __restrict__ dx, const PoolGeometry& g, int layout) {
    // the vectorized layout as in pool_fwd_dispatch, with the taps aligned to their VEC-wide loads
    const bool vec = layout == LAYOUT_CHANNELS_LAST_VEC && g.c % POOL_VEC == 0 && is_aligned(dy, 16) &&
                     is_aligned(dx, 16) && is_aligned(argmax, POOL_VEC * sizeof(TapT));
    if (vec) max_pool_bwd_body<POOL_VEC>(dy, argmax, dx, g, true);
    else max_pool_bwd_body<1>(dy, argmax, dx, g, layout != LAYOUT_CHANNELS_FIRST);
}

extern "C" __global__ void __launch_bounds__(POOL_THREADS, POOL_MIN_BLOCKS)
max_pool_bwd_u8(const elem_t* __restrict__ dy, const unsigned char* __restrict__ argmax, elem_t* __restrict__ dx,
                int n, int c, int in_d, int in_h, int in_w, int out_d, int out_h,
                int out_w, int k_d, int k_h, int k_w, int s_d, int s_h, int s_w, int p_d, int p_h, int p_w, int layout) {
    max_pool_bwd_dispatch(dy, argmax, dx, POOL_GEOMETRY, layout);
}

extern "C" __global__ void __launch_bounds__(POOL_THREADS, POOL_MIN_BLOCKS)
max_pool_bwd_i32(const elem_t* __restrict__ dy, const int* __restrict__ argmax, elem_t* __restrict__ dx,
                 int n, int c, int in_d, int in_h, int in_w, int out_d, int out_h,
                 int out_w, int k_d, int k_h, int k_w, int s_d, int s_h, int s_w, int p_d, int p_h, int p_w, int layout) {
    max_pool_bwd_dispatch(dy, argmax, dx, POOL_GEOMETRY, layout);
}

// global_avg_pool_rows: channels first, y[r] = mean of the contiguous row x[r, 0:volume].
// Thread mapping: one warp per row (grid-stride over rows), lanes stride the row so loads
// coalesce, then a shuffle reduction. Rows are warp-uniform, so the full mask is exact.
// Needs blockDim.x a multiple of 32. No shared memory, no atomics.
extern "C" __global__ void __launch_bounds__(GLOBAL_POOL_THREADS)
global_avg_pool_rows(const elem_t* __restrict__ x, elem_t* __restrict__ y, long long rows, long long volume) {
    const long long warps_per_block = blockDim.x >> 5;
    const long long warp = (long long)blockIdx.x * warps_per_block + (threadIdx.x >> 5);
    const long long warps = (long long)gridDim.x * warps_per_block;
    const int lane = threadIdx.x & 31;
    for (long long r = warp; r < rows; r += warps) {
        const elem_t* __restrict__ row = x + r * volume;
        acc_t sum = acc_t(0);
        for (long long j = lane; j < volume; j += 32) sum += to_acc(row[j]);
        sum = warp_reduce_sum(sum);
        if (lane == 0) y[r] = ElementTraits<elem_t>::from_acc(sum / acc_t(volume));
    }
}

// global_avg_pool_channels_last: x (n, volume, c) -> y (n, c), the mean over volume.
// Thread mapping: 2-D blocks of 32 x GLOBAL_POOL_ROWS threads; threadIdx.x picks a channel
// of the block's 32-channel chunk (blockIdx.x), threadIdx.y strides the spatial positions,
// so a warp reads 32 consecutive channels (coalesced). The GLOBAL_POOL_ROWS partial sums
// meet in shared memory and are added in a fixed order. blockIdx.y strides the batch.
// Limits: parallelism is ceil(c / 32) * n blocks (fine for the N >= 8 it is made for).
// No atomics.
extern "C" __global__ void __launch_bounds__(32 * GLOBAL_POOL_ROWS)
global_avg_pool_channels_last(const elem_t* __restrict__ x, elem_t* __restrict__ y, long long n,
                              long long volume, long long c) {
    __shared__ acc_t partial[GLOBAL_POOL_ROWS][33];
    const long long ch = (long long)blockIdx.x * 32 + threadIdx.x;
    for (long long b = blockIdx.y; b < n; b += gridDim.y) {
        acc_t sum = acc_t(0);
        if (ch < c)
            for (long long s = threadIdx.y; s < volume; s += blockDim.y) sum += to_acc(x[(b * volume + s) * c + ch]);
        partial[threadIdx.y][threadIdx.x] = sum;
        __syncthreads();
        if (threadIdx.y == 0 && ch < c) {
            acc_t total = acc_t(0);
            for (int r = 0; r < (int)blockDim.y; ++r) total += partial[r][threadIdx.x];
            y[b * c + ch] = ElementTraits<elem_t>::from_acc(total / acc_t(volume));
        }
        __syncthreads();
    }
}
