// conv_depthwise.cu: direct depthwise convolution (forward, data and filter gradients)
// with a depth multiplier M: output channel j = c * M + m reads input channel c only;
// w is (*k, C_in, M), i.e. w[tap * C_out + j]. Launched by gpuk/kernels/conv/direct.py.
// Problems are lifted to 3 spatial dims; both data formats share the index math
// (tensor_offset); channels_last is the fast path (threads run along channels).
#include "conv_common.cuh"

#ifndef DW_CHANNELS
#define DW_CHANNELS 32   // threadIdx.x: consecutive channels (coalesced in channels_last)
#endif
#ifndef DW_ROWS
#define DW_ROWS 8        // threadIdx.y: independent pixel groups
#endif
#ifndef DW_PIX
#define DW_PIX 4         // register blocking: consecutive pixels per thread
#endif
// __launch_bounds__ names the minimum blocks per SM explicitly: without it this NVRTC's
// ptxas capped registers low (32-64) and spilled the index math. 2 blocks of DW_THREADS
// (256) threads allow 128 registers per thread; the DW_PIX register blocking of fwd/dgrad
// (4 accumulators, 4 decoded pixels, 4 int64 source offsets) needs 76-101, so 2 is the
// largest figure that keeps them spill-free, and 16 warps per SM still overlap the loads.
#define DW_THREADS (DW_CHANNELS * DW_ROWS)

struct DwGeom {
    int batch, c_in, mult, c_out, taps;
    int in_d, in_h, in_w, out_d, out_h, out_w, k_d, k_h, k_w;
    int s_d, s_h, s_w, dil_d, dil_h, dil_w, pad_d, pad_h, pad_w, channels_last;
    long long in_pix, out_pix;
};

static __device__ DwGeom make_dw_geom(int batch, int c_in, int mult, int in_d, int in_h, int in_w, int out_d,
                                      int out_h, int out_w, int k_d, int k_h, int k_w, int s_d, int s_h, int s_w,
                                      int dil_d, int dil_h, int dil_w, int pad_d, int pad_h, int pad_w,
                                      int channels_last) {
    DwGeom g;
    g.batch = batch; g.c_in = c_in; g.mult = mult; g.c_out = c_in * mult; g.taps = k_d * k_h * k_w;
    g.in_d = in_d; g.in_h = in_h; g.in_w = in_w; g.out_d = out_d; g.out_h = out_h; g.out_w = out_w;
    g.k_d = k_d; g.k_h = k_h; g.k_w = k_w; g.s_d = s_d; g.s_h = s_h; g.s_w = s_w;
    g.dil_d = dil_d; g.dil_h = dil_h; g.dil_w = dil_w; g.pad_d = pad_d; g.pad_h = pad_h; g.pad_w = pad_w;
    g.channels_last = channels_last;
    g.in_pix = (long long)in_d * in_h * in_w;
    g.out_pix = (long long)out_d * out_h * out_w;
    return g;
}
#define DW_ARGS                                                                                          \
    batch, c_in, mult, in_d, in_h, in_w, out_d, out_h, out_w, k_d, k_h, k_w, s_d, s_h, s_w, dil_d, dil_h, \
        dil_w, pad_d, pad_h, pad_w, channels_last

// Index decoding runs in 32 bits (the launcher keeps N * pixels < 2^31): 64-bit division
// is a slow subroutine call on the GPU. Offsets are formed in 64 bits afterwards.
__device__ __forceinline__ void split_pixel(unsigned pix, unsigned size_h, unsigned size_w, int& d, int& h, int& w) {
    w = (int)(pix % size_w);
    h = (int)((pix / size_w) % size_h);
    d = (int)(pix / (size_w * size_h));
}
// Pixel p0 + q of a thread's DW_PIX run over (batch x `volume` spatial pixels): its sample n
// and spatial (d, h, w). A pixel at or past `total` decodes as pixel 0; its result is never
// stored (store_run), so its reads stay in bounds.
__device__ __forceinline__ void split_run_pixel(long long p0, int q, long long total, long long volume, int size_h,
                                                int size_w, int& n, int& d, int& h, int& w) {
    const unsigned p = p0 + q < total ? (unsigned)(p0 + q) : 0u;
    n = (int)(p / (unsigned)volume);
    split_pixel(p - (unsigned)n * (unsigned)volume, size_h, size_w, d, h, w);
}
// Tap t of the (k_d, k_h, k_w) window, row-major.
__device__ __forceinline__ void split_tap(int t, const DwGeom& g, int& kd, int& kh, int& kw) {
    kw = t % g.k_w;
    kh = (t / g.k_w) % g.k_h;
    kd = t / (g.k_w * g.k_h);
}
// Stores the DW_PIX results of a run (pixels p0 .. p0 + DW_PIX - 1, those below `total`)
// of channel ch of a tensor with `channels` channels and `volume` pixels per sample.
__device__ __forceinline__ void store_run(elem_t* __restrict__ out, const acc_t acc[DW_PIX], const int n[DW_PIX],
                                          long long p0, long long total, long long ch, long long channels,
                                          long long volume, int channels_last) {
#pragma unroll
    for (int q = 0; q < DW_PIX; ++q) {
        if (p0 + q >= total) break;
        const long long pix = p0 + q - (long long)n[q] * volume;
        out[tensor_offset(n[q], ch, pix, channels, volume, channels_last)] = ElementTraits<elem_t>::from_acc(acc[q]);
    }
}

// depthwise_fwd: y[n, o, j] = sum_tap x[n, o*s - pad + tap*dil, j / M] * w[tap, j].
// Thread mapping: block (DW_CHANNELS, DW_ROWS); thread (tx, ty) computes DW_PIX consecutive
//   output pixels (flattened over batch and space) of channel j = blockIdx.y*DW_CHANNELS + tx.
// Filter: the block's taps x DW_CHANNELS weights in dynamic shared memory when
//   filter_in_shared (the launcher's size check), else read from global memory.
// Limits: N*OP and N*IP < 2^31 (launcher check); grid.y = C_out tiles <= 65535. No atomics.
extern "C" __global__ void __launch_bounds__(DW_THREADS, 2)
depthwise_fwd(const elem_t* __restrict__ x, const elem_t* __restrict__ w, elem_t* __restrict__ y, int batch,
              int c_in, int mult, int in_d, int in_h, int in_w, int out_d, int out_h, int out_w, int k_d, int k_h,
              int k_w, int s_d, int s_h, int s_w, int dil_d, int dil_h, int dil_w, int pad_d, int pad_h, int pad_w,
              int channels_last, int filter_in_shared) {
    extern __shared__ acc_t filter_s[];
    const DwGeom g = make_dw_geom(DW_ARGS);
    const int j = blockIdx.y * DW_CHANNELS + threadIdx.x;
    if (filter_in_shared) {
        for (int t = threadIdx.y; t < g.taps; t += DW_ROWS)
            filter_s[t * DW_CHANNELS + threadIdx.x] = j < g.c_out ? to_acc(w[(long long)t * g.c_out + j]) : acc_t(0);
        __syncthreads();
    }
    if (j >= g.c_out) return;
    const int c = j / g.mult;
    const long long total = (long long)g.batch * g.out_pix;
    const long long p0 = ((long long)blockIdx.x * DW_ROWS + threadIdx.y) * DW_PIX;
    int n[DW_PIX], od[DW_PIX], oh[DW_PIX], ow[DW_PIX];
    acc_t acc[DW_PIX];
#pragma unroll
    for (int q = 0; q < DW_PIX; ++q) {
        split_run_pixel(p0, q, total, g.out_pix, g.out_h, g.out_w, n[q], od[q], oh[q], ow[q]);
        od[q] = od[q] * g.s_d - g.pad_d; oh[q] = oh[q] * g.s_h - g.pad_h; ow[q] = ow[q] * g.s_w - g.pad_w;
        acc[q] = acc_t(0);
    }
    for (int t = 0; t < g.taps; ++t) {
        int kd, kh, kw;
        split_tap(t, g, kd, kh, kw);
        const acc_t wv = filter_in_shared ? filter_s[t * DW_CHANNELS + threadIdx.x]
                                          : to_acc(w[(long long)t * g.c_out + j]);
#pragma unroll
        for (int q = 0; q < DW_PIX; ++q) {
            const int id = od[q] + kd * g.dil_d, ih = oh[q] + kh * g.dil_h, iw = ow[q] + kw * g.dil_w;
            if ((unsigned)id < (unsigned)g.in_d && (unsigned)ih < (unsigned)g.in_h && (unsigned)iw < (unsigned)g.in_w)
                acc[q] += to_acc(x[tensor_offset(n[q], c, ((long long)id * g.in_h + ih) * g.in_w + iw, g.c_in,
                                                 g.in_pix, g.channels_last)]) * wv;
        }
    }
    store_run(y, acc, n, p0, total, j, g.c_out, g.out_pix, g.channels_last);
}

// dgrad source along one dim: the output coordinate o with o*s == i + pad - tap*dil, or -1.
__device__ __forceinline__ int dw_source(int shifted, int tap_offset, int stride, int out_size) {
    const int t = shifted - tap_offset;
    if (t < 0) return -1;
    const int o = t / stride;
    return (o * stride == t && o < out_size) ? o : -1;
}

// depthwise_dgrad: dx[n, i, c] = sum_m sum_tap w[tap, c*M + m] * dy[n, o, c*M + m] where
//   o*s - pad + tap*dil == i (stride holes skipped by predicate, no atomics: a gather).
// Thread mapping: block (DW_CHANNELS, DW_ROWS); thread (tx, ty) computes DW_PIX consecutive
//   input pixels of channel c = blockIdx.y*DW_CHANNELS + tx.
// Filter: taps x M x DW_CHANNELS weights in dynamic shared memory when filter_in_shared.
extern "C" __global__ void __launch_bounds__(DW_THREADS, 2)
depthwise_dgrad(const elem_t* __restrict__ dy, const elem_t* __restrict__ w, elem_t* __restrict__ dx, int batch,
                int c_in, int mult, int in_d, int in_h, int in_w, int out_d, int out_h, int out_w, int k_d, int k_h,
                int k_w, int s_d, int s_h, int s_w, int dil_d, int dil_h, int dil_w, int pad_d, int pad_h,
                int pad_w, int channels_last, int filter_in_shared) {
    extern __shared__ acc_t filter_s[];
    const DwGeom g = make_dw_geom(DW_ARGS);
    const int c = blockIdx.y * DW_CHANNELS + threadIdx.x;
    if (filter_in_shared) {
        for (int tm = threadIdx.y; tm < g.taps * g.mult; tm += DW_ROWS) {
            const int t = tm / g.mult, m = tm - t * g.mult;
            filter_s[tm * DW_CHANNELS + threadIdx.x] =
                c < g.c_in ? to_acc(w[(long long)t * g.c_out + (long long)c * g.mult + m]) : acc_t(0);
        }
        __syncthreads();
    }
    if (c >= g.c_in) return;
    const long long total = (long long)g.batch * g.in_pix;
    const long long p0 = ((long long)blockIdx.x * DW_ROWS + threadIdx.y) * DW_PIX;
    int n[DW_PIX], sd[DW_PIX], sh[DW_PIX], sw[DW_PIX];
    acc_t acc[DW_PIX];
#pragma unroll
    for (int q = 0; q < DW_PIX; ++q) {
        split_run_pixel(p0, q, total, g.in_pix, g.in_h, g.in_w, n[q], sd[q], sh[q], sw[q]);
        sd[q] += g.pad_d; sh[q] += g.pad_h; sw[q] += g.pad_w;
        acc[q] = acc_t(0);
    }
    for (int t = 0; t < g.taps; ++t) {
        int kd, kh, kw;
        split_tap(t, g, kd, kh, kw);
        long long src[DW_PIX];   // dy offset of channel c*M (m = 0), or -1
#pragma unroll
        for (int q = 0; q < DW_PIX; ++q) {
            const int o_d = dw_source(sd[q], kd * g.dil_d, g.s_d, g.out_d);
            const int o_h = dw_source(sh[q], kh * g.dil_h, g.s_h, g.out_h);
            const int o_w = dw_source(sw[q], kw * g.dil_w, g.s_w, g.out_w);
            src[q] = (o_d < 0 || o_h < 0 || o_w < 0 || p0 + q >= total) ? -1
                     : tensor_offset(n[q], (long long)c * g.mult, ((long long)o_d * g.out_h + o_h) * g.out_w + o_w,
                                     g.c_out, g.out_pix, g.channels_last);
        }
        // Consecutive channels are 1 apart in channels_last, out_pix apart in channels_first.
        const long long channel_step = g.channels_last ? 1 : g.out_pix;
        for (int m = 0; m < g.mult; ++m) {
            const acc_t wv = filter_in_shared ? filter_s[(t * g.mult + m) * DW_CHANNELS + threadIdx.x]
                                              : to_acc(w[(long long)t * g.c_out + (long long)c * g.mult + m]);
#pragma unroll
            for (int q = 0; q < DW_PIX; ++q)
                if (src[q] >= 0) acc[q] += to_acc(dy[src[q] + m * channel_step]) * wv;
        }
    }
    store_run(dx, acc, n, p0, total, c, g.c_in, g.in_pix, g.channels_last);
}

// depthwise_wgrad: dw[tap, j] = sum over (n, o) of x[n, o*s - pad + tap*dil, j / M] * dy[n, o, j].
// Thread mapping: grid (taps, C_out tiles, splits), block (DW_CHANNELS, DW_ROWS); thread
//   (tx, ty) sums pixels ty, ty + DW_ROWS, ... of its split's pixel range for channel j.
// Reduction: the DW_ROWS partial sums meet in shared memory and row 0 adds them in order;
//   with several splits each writes partial[split] and depthwise_reduce_splits adds them
//   in split order. Deterministic, no atomics.
extern "C" __global__ void __launch_bounds__(DW_THREADS, 2)
depthwise_wgrad(const elem_t* __restrict__ x, const elem_t* __restrict__ dy, elem_t* __restrict__ dw,
                acc_t* __restrict__ partial, int batch, int c_in, int mult, int in_d, int in_h, int in_w,
                int out_d, int out_h, int out_w, int k_d, int k_h, int k_w, int s_d, int s_h, int s_w, int dil_d,
                int dil_h, int dil_w, int pad_d, int pad_h, int pad_w, int channels_last,
                long long pixels_per_split) {
    __shared__ acc_t row_sums[DW_ROWS][DW_CHANNELS];
    const DwGeom g = make_dw_geom(DW_ARGS);
    const int t = blockIdx.x, j = blockIdx.y * DW_CHANNELS + threadIdx.x;
    int kd, kh, kw;
    split_tap(t, g, kd, kh, kw);
    const long long total = (long long)g.batch * g.out_pix;
    const long long begin = (long long)blockIdx.z * pixels_per_split;
    const long long end = begin + pixels_per_split < total ? begin + pixels_per_split : total;
    acc_t acc = acc_t(0);
    if (j < g.c_out) {
        const int c = j / g.mult;
        for (long long p = begin + threadIdx.y; p < end; p += DW_ROWS) {
            const unsigned n = (unsigned)p / (unsigned)g.out_pix, pix = (unsigned)p - n * (unsigned)g.out_pix;
            int o_d, o_h, o_w;
            split_pixel(pix, g.out_h, g.out_w, o_d, o_h, o_w);
            const int id = o_d * g.s_d - g.pad_d + kd * g.dil_d, ih = o_h * g.s_h - g.pad_h + kh * g.dil_h;
            const int iw = o_w * g.s_w - g.pad_w + kw * g.dil_w;
            if ((unsigned)id < (unsigned)g.in_d && (unsigned)ih < (unsigned)g.in_h && (unsigned)iw < (unsigned)g.in_w)
                acc += to_acc(x[tensor_offset(n, c, ((long long)id * g.in_h + ih) * g.in_w + iw, g.c_in, g.in_pix,
                                              g.channels_last)]) *
                       to_acc(dy[tensor_offset(n, j, pix, g.c_out, g.out_pix, g.channels_last)]);
        }
    }
    row_sums[threadIdx.y][threadIdx.x] = acc;
    __syncthreads();
    if (threadIdx.y != 0 || j >= g.c_out) return;
    acc_t sum = acc_t(0);
    for (int r = 0; r < DW_ROWS; ++r) sum += row_sums[r][threadIdx.x];
    const long long out = (long long)t * g.c_out + j;
    if (gridDim.z == 1)
        dw[out] = ElementTraits<elem_t>::from_acc(sum);
    else
        partial[(long long)blockIdx.z * g.taps * g.c_out + out] = sum;
}

// depthwise_reduce_splits: out[i] = sum over splits of partial[s][i], in split order.
extern "C" __global__ void __launch_bounds__(DW_THREADS, 2)
depthwise_reduce_splits(const acc_t* __restrict__ partial, elem_t* __restrict__ out, long long count, int splits) {
    reduce_splits_body(partial, out, count, splits);
}
