// conv_local.cu: locally connected convolution (unshared weights), direct kernels.
// Launched by gpuk/kernels/conv/direct.py. Like Keras' local_conv1d/2d: no padding, no
// dilation; output position p (P = prod(output_spatial)) reads the window starting at
// p * stride. w is (P, F, C_out) with F = prod(k) * C_in flattened as (*k, C_in) for
// channels_last and (C_in, *k) for channels_first (the order Keras flattens a slice of
// each layout). Problems are lifted to 3 spatial dims.
// __launch_bounds__ names the minimum blocks per SM explicitly: without it this NVRTC's
// ptxas capped registers low (32-64) and spilled the index math.
// All three kernels: a 1-D grid-stride loop, one output element per thread and step,
// C_out fastest (coalesced weight access); sums run in a fixed order; no shared memory,
// no atomics. Limits: every tensor has < 2^31 elements (launcher check; indices decode in
// 32 bits, as 64-bit division is a slow subroutine call); offsets are 64-bit.
#include "conv_common.cuh"

#ifndef LOCAL_THREADS
#define LOCAL_THREADS 256
#endif

struct LocalGeom {
    int batch, c_in, c_out, taps;
    int in_d, in_h, in_w, out_d, out_h, out_w, k_d, k_h, k_w, s_d, s_h, s_w, channels_last;
    long long in_pix, out_pix, features;
};

static __device__ LocalGeom make_local_geom(int batch, int c_in, int c_out, int in_d, int in_h, int in_w, int out_d,
                                            int out_h, int out_w, int k_d, int k_h, int k_w, int s_d, int s_h,
                                            int s_w, int channels_last) {
    LocalGeom g;
    g.batch = batch; g.c_in = c_in; g.c_out = c_out; g.taps = k_d * k_h * k_w;
    g.in_d = in_d; g.in_h = in_h; g.in_w = in_w; g.out_d = out_d; g.out_h = out_h; g.out_w = out_w;
    g.k_d = k_d; g.k_h = k_h; g.k_w = k_w; g.s_d = s_d; g.s_h = s_h; g.s_w = s_w;
    g.channels_last = channels_last;
    g.in_pix = (long long)in_d * in_h * in_w;
    g.out_pix = (long long)out_d * out_h * out_w;
    g.features = (long long)g.taps * c_in;
    return g;
}
#define LOCAL_ARGS \
    batch, c_in, c_out, in_d, in_h, in_w, out_d, out_h, out_w, k_d, k_h, k_w, s_d, s_h, s_w, channels_last

__device__ __forceinline__ long long feature_index(const LocalGeom& g, int tap, int ci) {
    return g.channels_last ? (long long)tap * g.c_in + ci : (long long)ci * g.taps + tap;
}

__device__ __forceinline__ void split3(unsigned index, unsigned size_h, unsigned size_w, int& d, int& h, int& w) {
    w = (int)(index % size_w);
    h = (int)((index / size_w) % size_h);
    d = (int)(index / (size_w * size_h));
}

// local_fwd: y[n, p, co] = sum over (tap, ci) of x[n, p*s + tap, ci] * w[p, f(tap, ci), co].
extern "C" __global__ void __launch_bounds__(LOCAL_THREADS, 2)
local_fwd(const elem_t* __restrict__ x, const elem_t* __restrict__ w, elem_t* __restrict__ y, int batch, int c_in,
          int c_out, int in_d, int in_h, int in_w, int out_d, int out_h, int out_w, int k_d, int k_h, int k_w,
          int s_d, int s_h, int s_w, int channels_last) {
    const LocalGeom g = make_local_geom(LOCAL_ARGS);
    GPUK_GRID_STRIDE_LOOP(i, (long long)g.batch * g.out_pix * g.c_out) {
        const unsigned iu = (unsigned)i, rest = iu / (unsigned)g.c_out, co = iu - rest * (unsigned)g.c_out;
        const unsigned n = rest / (unsigned)g.out_pix, p = rest - n * (unsigned)g.out_pix;
        int od, oh, ow;
        split3(p, g.out_h, g.out_w, od, oh, ow);
        const elem_t* w_p = w + (long long)p * g.features * g.c_out + co;
        acc_t acc = acc_t(0);
        for (int t = 0; t < g.taps; ++t) {
            int kd, kh, kw;
            split3(t, g.k_h, g.k_w, kd, kh, kw);
            const long long ipix = ((long long)(od * g.s_d + kd) * g.in_h + oh * g.s_h + kh) * g.in_w + ow * g.s_w + kw;
            for (int ci = 0; ci < g.c_in; ++ci)
                acc += to_acc(x[tensor_offset(n, ci, ipix, g.c_in, g.in_pix, g.channels_last)]) *
                       to_acc(w_p[feature_index(g, t, ci) * g.c_out]);
        }
        y[tensor_offset(n, co, p, g.c_out, g.out_pix, g.channels_last)] = ElementTraits<elem_t>::from_acc(acc);
    }
}

// First and last output coordinate whose window (start o*s, size k) covers input i.
__device__ __forceinline__ void covering(int i, int k, int s, int out_size, int& lo, int& hi) {
    lo = i - k + 1 <= 0 ? 0 : (i - k + s) / s;
    hi = i / s < out_size - 1 ? i / s : out_size - 1;
}

// local_dgrad: dx[n, i, ci] = sum over output positions p whose window covers i, and co, of
//   dy[n, p, co] * w[p, f(i - p*s, ci), co]. A gather: no atomics.
extern "C" __global__ void __launch_bounds__(LOCAL_THREADS, 2)
local_dgrad(const elem_t* __restrict__ dy, const elem_t* __restrict__ w, elem_t* __restrict__ dx, int batch,
            int c_in, int c_out, int in_d, int in_h, int in_w, int out_d, int out_h, int out_w, int k_d, int k_h,
            int k_w, int s_d, int s_h, int s_w, int channels_last) {
    const LocalGeom g = make_local_geom(LOCAL_ARGS);
    GPUK_GRID_STRIDE_LOOP(i, (long long)g.batch * g.in_pix * g.c_in) {
        const unsigned iu = (unsigned)i, rest = iu / (unsigned)g.c_in, ci = iu - rest * (unsigned)g.c_in;
        const unsigned n = rest / (unsigned)g.in_pix, ipix = rest - n * (unsigned)g.in_pix;
        int id, ih, iw;
        split3(ipix, g.in_h, g.in_w, id, ih, iw);
        int d_lo, d_hi, h_lo, h_hi, w_lo, w_hi;
        covering(id, g.k_d, g.s_d, g.out_d, d_lo, d_hi);
        covering(ih, g.k_h, g.s_h, g.out_h, h_lo, h_hi);
        covering(iw, g.k_w, g.s_w, g.out_w, w_lo, w_hi);
        acc_t acc = acc_t(0);
        for (int od = d_lo; od <= d_hi; ++od)
            for (int oh = h_lo; oh <= h_hi; ++oh)
                for (int ow = w_lo; ow <= w_hi; ++ow) {
                    const long long p = ((long long)od * g.out_h + oh) * g.out_w + ow;
                    const int tap = ((id - od * g.s_d) * g.k_h + (ih - oh * g.s_h)) * g.k_w + (iw - ow * g.s_w);
                    const elem_t* w_row = w + (p * g.features + feature_index(g, tap, (int)ci)) * g.c_out;
                    for (int co = 0; co < g.c_out; ++co)
                        acc += to_acc(dy[tensor_offset(n, co, p, g.c_out, g.out_pix, g.channels_last)]) *
                               to_acc(w_row[co]);
                }
        dx[tensor_offset(n, ci, ipix, g.c_in, g.in_pix, g.channels_last)] = ElementTraits<elem_t>::from_acc(acc);
    }
}

// local_wgrad: dw[p, f(tap, ci), co] = sum over n of x[n, p*s + tap, ci] * dy[n, p, co].
extern "C" __global__ void __launch_bounds__(LOCAL_THREADS, 2)
local_wgrad(const elem_t* __restrict__ x, const elem_t* __restrict__ dy, elem_t* __restrict__ dw, int batch,
            int c_in, int c_out, int in_d, int in_h, int in_w, int out_d, int out_h, int out_w, int k_d, int k_h,
            int k_w, int s_d, int s_h, int s_w, int channels_last) {
    const LocalGeom g = make_local_geom(LOCAL_ARGS);
    GPUK_GRID_STRIDE_LOOP(i, g.out_pix * g.features * g.c_out) {
        const unsigned iu = (unsigned)i, rest = iu / (unsigned)g.c_out, co = iu - rest * (unsigned)g.c_out;
        const unsigned p = rest / (unsigned)g.features, f = rest - p * (unsigned)g.features;
        const int tap = (int)(g.channels_last ? f / (unsigned)g.c_in : f % (unsigned)g.taps);
        const int ci = (int)(g.channels_last ? f % (unsigned)g.c_in : f / (unsigned)g.taps);
        int od, oh, ow, kd, kh, kw;
        split3(p, g.out_h, g.out_w, od, oh, ow);
        split3(tap, g.k_h, g.k_w, kd, kh, kw);
        const long long ipix = ((long long)(od * g.s_d + kd) * g.in_h + oh * g.s_h + kh) * g.in_w + ow * g.s_w + kw;
        acc_t acc = acc_t(0);
        for (int n = 0; n < g.batch; ++n)
            acc += to_acc(x[tensor_offset(n, ci, ipix, g.c_in, g.in_pix, g.channels_last)]) *
                   to_acc(dy[tensor_offset(n, co, p, g.c_out, g.out_pix, g.channels_last)]);
        dw[i] = ElementTraits<elem_t>::from_acc(acc);
    }
}
