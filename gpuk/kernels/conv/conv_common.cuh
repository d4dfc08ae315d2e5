// conv_common.cuh: geometry shared by the convolution kernels (conv_igemm.cu, conv_wgmma.cu,
// conv_depthwise.cu, conv_local.cu). Every problem is lifted to 3 spatial dims
// (D, H, W; missing dims have size 1, stride 1, no padding), so one kernel serves
// conv1d, conv2d and conv3d. The implicit GEMMs (conv_igemm.cu on mma.sync / FFMA,
// conv_wgmma.cu on Hopper's wgmma) share the problem (ConvGeom), the K walk over filter
// taps (TapSeq, TapIter) and dgrad's stride-phase decomposition (DgradPhase).
//
// Layouts: both data formats run through the same index math. A pixel index `pix`
// flattens (d, h, w); channels_last stores (n, pix, c), channels_first (n, c, pix).
#pragma once
#include "common.cuh"
#include "element_types.cuh"

// Offset of element (n, c, pix) of a (N, pixels, channels) tensor in either layout.
__device__ __forceinline__ long long tensor_offset(long long n, long long c, long long pix, long long channels,
                                                   long long pixels, int channels_last) {
    return channels_last ? (n * pixels + pix) * channels + c : (n * channels + c) * pixels + pix;
}

// Deterministic second pass of a split reduction: out[i] = sum over s (in order) of
// partial[s * count + i]. 1-D grid-stride loop, one output per thread and step.
__device__ __forceinline__ void reduce_splits_body(const acc_t* __restrict__ partial, elem_t* __restrict__ out,
                                                   long long count, int splits) {
    GPUK_GRID_STRIDE_LOOP(i, count) {
        acc_t sum = acc_t(0);
        for (int s = 0; s < splits; ++s) sum += partial[(long long)s * count + i];
        out[i] = ElementTraits<elem_t>::from_acc(sum);
    }
}

// ---- the implicit GEMMs' geometry ----
struct ConvGeom {
    int batch, c_in, c_out;
    int in_d, in_h, in_w, out_d, out_h, out_w;
    int k_d, k_h, k_w, s_d, s_h, s_w, dil_d, dil_h, dil_w, pad_d, pad_h, pad_w;
    long long in_pix, out_pix;
    int taps;
};

#define FAR_OUTSIDE (-(1 << 29))   // a coordinate that fails every bounds check (rows past the end)

// The filter taps a GEMM's K (or wgrad's M) runs over, per spatial dim: tap coordinates
// k0, k0 + kstep, ... (< the filter size; `count` of them) and, for each, the offset the tap
// adds to a row's window origin: o0, o0 + ostep, ...
//   fwd:   every tap, offset k*dil (source coordinate = o*s - pad + k*dil);
//   wgrad: every tap, offset k*dil - pad (along M);
//   dgrad: one stride phase's taps (dgrad_phase_dim), offset (r + pad - k*dil) / s.
struct TapDim { int k0, kstep, o0, ostep, count; };
struct TapSeq { TapDim d, h, w; int size_d, size_h, size_w; };

__device__ __forceinline__ TapDim dense_dim(int size, int dil, int base) { return TapDim{0, 1, base, dil, size}; }
__device__ __forceinline__ TapSeq dense_taps(const ConvGeom& g, int base_d, int base_h, int base_w) {
    return TapSeq{dense_dim(g.k_d, g.dil_d, base_d), dense_dim(g.k_h, g.dil_h, base_h),
                  dense_dim(g.k_w, g.dil_w, base_w), g.k_d, g.k_h, g.k_w};
}

// A (tap, channel) position along K (fwd/dgrad A, dgrad B) or along M (wgrad A), advanced
// by adds and one wrap compare per step: the divisions happen once, in start().
// (od, oh, ow) are the tap's offsets (TapSeq); the tap is past the filter when kd >= size_d.
struct TapIter {
    int c, kw, kh, kd, ow, oh, od;
    __device__ __forceinline__ void start(const TapSeq& s, int k, int channels) {
        const int i = k / channels;   // the tap's index in the sequence
        c = k - i * channels;
        const int iw = i % s.w.count, ih = (i / s.w.count) % s.h.count, id = i / (s.w.count * s.h.count);
        kw = s.w.k0 + iw * s.w.kstep; ow = s.w.o0 + iw * s.w.ostep;
        kh = s.h.k0 + ih * s.h.kstep; oh = s.h.o0 + ih * s.h.ostep;
        kd = s.d.k0 + id * s.d.kstep; od = s.d.o0 + id * s.d.ostep;
    }
    __device__ __forceinline__ void next_tap(const TapSeq& s) {
        kw += s.w.kstep;
        ow += s.w.ostep;
        if (kw >= s.size_w) {
            kw = s.w.k0; ow = s.w.o0;
            kh += s.h.kstep; oh += s.h.ostep;
            if (kh >= s.size_h) {
                kh = s.h.k0; oh = s.h.o0;
                kd += s.d.kstep; od += s.d.ostep;
            }
        }
    }
    __device__ __forceinline__ void advance(const TapSeq& s, int step, int channels) {
        c += step;
        while (c >= channels) {
            c -= channels;
            next_tap(s);
        }
    }
    __device__ __forceinline__ bool in_filter(const TapSeq& s) const { return kd < s.size_d; }
    // The tap's index in the filter (w is (taps, C_in, C_out)).
    __device__ __forceinline__ int tap(const TapSeq& s) const { return (kd * s.size_h + kh) * s.size_w + kw; }
};

// ---- dgrad as stride-phase sub-convolutions ----
// Input pixel i = r + s*q (phase r in [0, s), per dim) receives dy[o] * w[k] exactly for the taps
// with (r + pad - k*dil) % s == 0, at o = q + (r + pad - k*dil) / s. Those taps are
// k0, k0 + s/gcd(s, dil), ...: each phase is a dense (stride-1) convolution of dy with a
// subsampled, flipped filter, so no work lands on the stride holes. Block z of the grid runs
// phase z; its GEMM has M = N * Q_d*Q_h*Q_w rows (Q = pixels of the phase) and
// K = (taps of the phase) * C_out; a phase without taps writes zeros (K = 0).
__device__ __forceinline__ TapDim dgrad_phase_dim(int r, int s, int pad, int dil, int size) {
    TapDim t{size, 1, 0, 0, 0};
    for (int k = 0; k < size && k < s; ++k)   // the first tap of the phase, if any (period s)
        if ((r + pad - k * dil) % s == 0) {   // (C's % is 0 exactly for multiples, negative or not)
            t.k0 = k;
            break;
        }
    while ((t.kstep * dil) % s != 0) ++t.kstep;   // s / gcd(s, dil)
    t.count = t.k0 < size ? (size - 1 - t.k0) / t.kstep + 1 : 0;
    t.o0 = (r + pad - t.k0 * dil) / s;          // exact
    t.ostep = -(t.kstep * dil) / s;             // exact
    return t;
}
__device__ __forceinline__ int phase_pixels(int r, int s, int size) { return r < size ? (size - r + s - 1) / s : 0; }

struct DgradPhase {
    TapSeq taps;
    int r_d, r_h, r_w, q_d, q_h, q_w;   // the phase and its pixel grid
    long long rows, depth;              // its GEMM's M and K
    __device__ __forceinline__ void init(const ConvGeom& g, int z) {
        r_w = z % g.s_w;
        r_h = (z / g.s_w) % g.s_h;
        r_d = z / (g.s_w * g.s_h);
        taps.d = dgrad_phase_dim(r_d, g.s_d, g.pad_d, g.dil_d, g.k_d);
        taps.h = dgrad_phase_dim(r_h, g.s_h, g.pad_h, g.dil_h, g.k_h);
        taps.w = dgrad_phase_dim(r_w, g.s_w, g.pad_w, g.dil_w, g.k_w);
        taps.size_d = g.k_d; taps.size_h = g.k_h; taps.size_w = g.k_w;
        q_d = phase_pixels(r_d, g.s_d, g.in_d);
        q_h = phase_pixels(r_h, g.s_h, g.in_h);
        q_w = phase_pixels(r_w, g.s_w, g.in_w);
        rows = (long long)g.batch * q_d * q_h * q_w;
        depth = (long long)taps.d.count * taps.h.count * taps.w.count * g.c_out;
        if (depth == 0) taps.d.count = taps.h.count = taps.w.count = 1;   // nothing to load; start() divides
    }
    // The dx row (n * in_pix + pixel) of GEMM row m.
    __device__ __forceinline__ long long out_row(const ConvGeom& g, long long m) const {
        const unsigned mu = (unsigned)m, pixels = (unsigned)q_d * q_h * q_w;
        const unsigned n = mu / pixels, p = mu - n * pixels;
        const int qw = (int)(p % (unsigned)q_w), qh = (int)((p / (unsigned)q_w) % (unsigned)q_h);
        const int qd = (int)(p / ((unsigned)q_w * (unsigned)q_h));
        return (long long)n * g.in_pix +
               ((long long)(r_d + g.s_d * qd) * g.in_h + (r_h + g.s_h * qh)) * g.in_w + (r_w + g.s_w * qw);
    }
};

static __device__ ConvGeom make_geom(int batch, int c_in, int c_out, int in_d, int in_h, int in_w, int out_d,
                                     int out_h, int out_w, int k_d, int k_h, int k_w, int s_d, int s_h, int s_w,
                                     int dil_d, int dil_h, int dil_w, int pad_d, int pad_h, int pad_w) {
    ConvGeom g;
    g.batch = batch; g.c_in = c_in; g.c_out = c_out;
    g.in_d = in_d; g.in_h = in_h; g.in_w = in_w; g.out_d = out_d; g.out_h = out_h; g.out_w = out_w;
    g.k_d = k_d; g.k_h = k_h; g.k_w = k_w; g.s_d = s_d; g.s_h = s_h; g.s_w = s_w;
    g.dil_d = dil_d; g.dil_h = dil_h; g.dil_w = dil_w; g.pad_d = pad_d; g.pad_h = pad_h; g.pad_w = pad_w;
    g.in_pix = (long long)in_d * in_h * in_w;
    g.out_pix = (long long)out_d * out_h * out_w;
    g.taps = k_d * k_h * k_w;
    return g;
}

#define CONV_GEOM_ARGS                                                                                   \
    batch, c_in, c_out, in_d, in_h, in_w, out_d, out_h, out_w, k_d, k_h, k_w, s_d, s_h, s_w, dil_d, dil_h, \
        dil_w, pad_d, pad_h, pad_w
