// conv_local.cu: locally connected convolution (unshared weights), direct kernels.
// Launched by gpuk/kernels/conv/direct.py. Like Keras' local_conv1d/2d: no padding, no
// dilation; output position p (P = prod(output_spatial)) reads the window starting at
// p * stride. w is (P, F, C_out) with F = prod(k) * C_in flattened as (*k, C_in) for
// channels_last and (C_in, *k) for channels_first (the order Keras flattens a slice of
// each layout). Problems are lifted to 3 spatial dims.
// __launch_bounds__ names the minimum blocks per SM explicitly: without it this NVRTC's
// ptxas capped registers low (32-64) and spilled the index math.
// Thread mapping (w, (P, F, C_out), is the bulk of the traffic; its contiguous dim is C_out):
//   Images go in groups of LOCAL_IMAGES (the last one partial): a work item of local_fwd and
//   local_dgrad computes its output element in each image of its group, so w is read once per
//   group (the grid covers ceil(N / LOCAL_IMAGES) groups, direct.py _image_groups).
//   local_fwd: a 1-D grid-stride loop over warps; a warp takes 32 consecutive work items of the
//     flat (image group, P, C_out) index, C_out fastest, so lanes run along w's rows. F is walked
//     in chunks of LOCAL_CHUNK: for each (image group, p) row its lanes cover (LOCAL_ROWS at a
//     time), the warp copies the row's chunk of x, all images of the group, into shared memory,
//     lane l element f0 + l (consecutive along F, i.e. along C_in and the window's rows:
//     coalesced), then each lane multiplies its row's chunk by its w column. Warp-private shared
//     memory, __syncwarp only (no block barrier).
//   local_dgrad: lanes = C_out rounded up to a power of two, at most 32, per work item (image
//     group, dx pixel, c_in), c_in fastest; lane j sums co = j, j + lanes, ... over the covering
//     windows, so dy and w are read along C_out (coalesced for channels_last dy; channels_first
//     dy is strided by P), and the lanes' partial sums are added by a fixed xor-shuffle tree
//     (deterministic). Neighbouring lane groups take neighbouring c_in, i.e. neighbouring w rows
//     (channels_last F order).
//   local_wgrad: a 1-D grid-stride loop, one dw element per thread and step, C_out fastest
//     (coalesced dw and dy); sums over the batch.
// Sums run in a fixed order; no atomics. Limits: every tensor has < 2^31 elements (launcher
// check; indices decode in 32 bits, as 64-bit division is a slow subroutine call); offsets are
// 64-bit, except an element's offset within its image's x (< 2^31).
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

#ifndef LOCAL_IMAGES
#define LOCAL_IMAGES 4
#endif
static_assert(LOCAL_IMAGES >= 1 && (LOCAL_IMAGES & (LOCAL_IMAGES - 1)) == 0, "LOCAL_IMAGES: a power of two");
#define LOCAL_WARPS (LOCAL_THREADS / 32)
#define LOCAL_CHUNK 32   // F elements of x staged per pass: one per lane
#define LOCAL_ROWS 4     // (image group, p) rows of x a warp stages at once (C_out >= 11: all its rows)
#define FULL_WARP 0xffffffffu

// One x (or dy) position in the LOCAL_IMAGES images of a group: one shared-memory vector access.
struct alignas(sizeof(elem_t) * LOCAL_IMAGES) ImageRun { elem_t v[LOCAL_IMAGES]; };

// Offset of F-element f of a window in x, from the window's origin (window_origin); < 2^31
// (an image's x has < 2^31 elements).
__device__ __forceinline__ int window_element(const LocalGeom& g, unsigned f) {
    unsigned tap, ci;
    if (g.channels_last) {
        tap = f / (unsigned)g.c_in;
        ci = f - tap * (unsigned)g.c_in;
    } else {
        ci = f / (unsigned)g.taps;
        tap = f - ci * (unsigned)g.taps;
    }
    int kd, kh, kw;
    split3(tap, g.k_h, g.k_w, kd, kh, kw);
    const int tap_pix = (kd * g.in_h + kh) * g.in_w + kw;
    return g.channels_last ? tap_pix * g.c_in + (int)ci : (int)ci * (int)g.in_pix + tap_pix;
}
// Offset in x of the window origin of output position p in image n: x[n, p*s, channel 0].
__device__ __forceinline__ long long window_origin(const LocalGeom& g, long long n, unsigned p) {
    int od, oh, ow;
    split3(p, g.out_h, g.out_w, od, oh, ow);
    const long long pix = ((long long)od * g.s_d * g.in_h + oh * g.s_h) * g.in_w + ow * g.s_w;
    return g.channels_last ? (n * g.in_pix + pix) * g.c_in : n * g.c_in * g.in_pix + pix;
}

// local_fwd: y[n, p, co] = sum over (tap, ci) of x[n, p*s + tap, ci] * w[p, f(tap, ci), co].
// Work items (image group, p, co), co fastest; each multiplies its w column into the
// LOCAL_IMAGES images of its group (w, the bulk of the traffic, is read once per group).
extern "C" __global__ void __launch_bounds__(LOCAL_THREADS, 2)
local_fwd(const elem_t* __restrict__ x, const elem_t* __restrict__ w, elem_t* __restrict__ y, int batch, int c_in,
          int c_out, int in_d, int in_h, int in_w, int out_d, int out_h, int out_w, int k_d, int k_h, int k_w,
          int s_d, int s_h, int s_w, int channels_last) {
    const LocalGeom g = make_local_geom(LOCAL_ARGS);
    __shared__ ImageRun xs[LOCAL_WARPS][LOCAL_ROWS][LOCAL_CHUNK + 1];   // + 1: rows in distinct banks
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    const unsigned groups = (unsigned)(g.batch + LOCAL_IMAGES - 1) / LOCAL_IMAGES, cout = (unsigned)g.c_out;
    const unsigned features = (unsigned)g.features, out_pix = (unsigned)g.out_pix;
    const long long total = (long long)groups * out_pix * cout, image = g.in_pix * g.c_in;
    // warp-uniform loop: every lane takes part in the shuffles and warp barriers
    for (long long base = global_thread_index() - lane; base < total; base += grid_stride()) {
        const long long i = base + lane;
        const bool active = i < total;
        const unsigned iu = (unsigned)(active ? i : total - 1);
        const unsigned row = iu / cout, co = iu - row * cout;   // row = group * P + p
        const unsigned group = row / out_pix, p = row - group * out_pix, first_row = (unsigned)base / cout;
        const int rows = (int)((unsigned)(base + 31 < total ? base + 31 : total - 1) / cout - first_row) + 1;
        // lane r < rows: row r's window origin in the group's first image, and the group's image count
        const unsigned lane_row = first_row + (lane < rows ? lane : 0), lane_group = lane_row / out_pix;
        const long long origin =
            window_origin(g, (long long)lane_group * LOCAL_IMAGES, lane_row - lane_group * out_pix);
        const int lane_images = min(LOCAL_IMAGES, g.batch - (int)lane_group * LOCAL_IMAGES);
        const elem_t* w_col = w + (long long)p * g.features * g.c_out + co;
        acc_t acc[LOCAL_IMAGES];
#pragma unroll
        for (int b = 0; b < LOCAL_IMAGES; ++b) acc[b] = acc_t(0);
        for (unsigned f0 = 0; f0 < features; f0 += LOCAL_CHUNK) {
            const int chunk = features - f0 < LOCAL_CHUNK ? (int)(features - f0) : LOCAL_CHUNK;
            const int offset = lane < chunk ? window_element(g, f0 + lane) : 0;
            for (int r0 = 0; r0 < rows; r0 += LOCAL_ROWS) {
                for (int r = 0; r < LOCAL_ROWS && r0 + r < rows; ++r) {
                    const long long o = __shfl_sync(FULL_WARP, origin, r0 + r);
                    const int images = __shfl_sync(FULL_WARP, lane_images, r0 + r);
                    ImageRun run;
#pragma unroll
                    for (int b = 0; b < LOCAL_IMAGES; ++b)
                        run.v[b] = lane < chunk && b < images ? x[o + b * image + offset]
                                                              : ElementTraits<elem_t>::from_acc(acc_t(0));
                    xs[warp][r][lane] = run;
                }
                __syncwarp();
                const int mine = (int)(row - first_row) - r0;
                if (active && mine >= 0 && mine < LOCAL_ROWS) {
                    const ImageRun* x_row = xs[warp][mine];
                    const elem_t* w_f = w_col + (long long)f0 * g.c_out;
#pragma unroll 4
                    for (int t = 0; t < chunk; ++t) {
                        const ImageRun xv = x_row[t];
                        const acc_t wv = to_acc(*w_f);
#pragma unroll
                        for (int b = 0; b < LOCAL_IMAGES; ++b) acc[b] += to_acc(xv.v[b]) * wv;
                        w_f += g.c_out;
                    }
                }
                __syncwarp();   // the rows are read before the next pass overwrites them
            }
        }
        const int n0 = (int)group * LOCAL_IMAGES;
#pragma unroll
        for (int b = 0; b < LOCAL_IMAGES; ++b)
            if (active && n0 + b < g.batch)
                y[tensor_offset(n0 + b, co, p, g.c_out, g.out_pix, g.channels_last)] =
                    ElementTraits<elem_t>::from_acc(acc[b]);
    }
}

// First and last output coordinate whose window (start o*s, size k) covers input i.
__device__ __forceinline__ void covering(int i, int k, int s, int out_size, int& lo, int& hi) {
    lo = i - k + 1 <= 0 ? 0 : (i - k + s) / s;
    hi = i / s < out_size - 1 ? i / s : out_size - 1;
}

// log2 of the lanes per dx element in local_dgrad: C_out rounded up to a power of two, at most
// 32 (direct.py local_dgrad_lanes sizes the grid with the same rule).
__device__ __forceinline__ int local_dgrad_lane_bits(int c_out) {
    int bits = 0;
    while ((1 << bits) < c_out && bits < 5) ++bits;
    return bits;
}

// local_dgrad: dx[n, i, ci] = sum over output positions p whose window covers i, and co, of
//   dy[n, p, co] * w[p, f(i - p*s, ci), co]. A gather: no atomics. Work items (image group, i,
//   ci), ci fastest, each taken by a group of lanes that split co; each lane sums the
//   LOCAL_IMAGES images of its group (one w load per image group).
extern "C" __global__ void __launch_bounds__(LOCAL_THREADS, 2)
local_dgrad(const elem_t* __restrict__ dy, const elem_t* __restrict__ w, elem_t* __restrict__ dx, int batch,
            int c_in, int c_out, int in_d, int in_h, int in_w, int out_d, int out_h, int out_w, int k_d, int k_h,
            int k_w, int s_d, int s_h, int s_w, int channels_last) {
    const LocalGeom g = make_local_geom(LOCAL_ARGS);
    const int bits = local_dgrad_lane_bits(g.c_out), lanes = 1 << bits, lane = threadIdx.x & 31;
    const int j = lane & (lanes - 1);
    const unsigned groups = (unsigned)(g.batch + LOCAL_IMAGES - 1) / LOCAL_IMAGES;
    const long long items = (long long)groups * g.in_pix * g.c_in, total = items << bits;
    // dy[n, p, co] = dy[n * dy_image + p * p_step + co * co_step]
    const int dy_image = (int)(g.out_pix * g.c_out);
    const long long p_step = g.channels_last ? g.c_out : 1, co_step = g.channels_last ? 1 : g.out_pix;
    // warp-uniform loop: every lane reaches the shuffles
    for (long long base = global_thread_index() - lane; base < total; base += grid_stride()) {
        const long long e = (base + lane) >> bits;   // this lane's work item
        const bool active = e < items;
        acc_t acc[LOCAL_IMAGES];
#pragma unroll
        for (int b = 0; b < LOCAL_IMAGES; ++b) acc[b] = acc_t(0);
        unsigned ci = 0, ipix = 0;
        int n0 = 0, images = 0;
        if (active) {
            const unsigned eu = (unsigned)e, rest = eu / (unsigned)g.c_in, group = rest / (unsigned)g.in_pix;
            ci = eu - rest * (unsigned)g.c_in;
            ipix = rest - group * (unsigned)g.in_pix;
            n0 = (int)group * LOCAL_IMAGES;
            images = min(LOCAL_IMAGES, g.batch - n0);
            int image_offset[LOCAL_IMAGES];   // past the last image: the last one again (read, unused)
#pragma unroll
            for (int b = 0; b < LOCAL_IMAGES; ++b) image_offset[b] = (b < images ? b : images - 1) * dy_image;
            int id, ih, iw;
            split3(ipix, g.in_h, g.in_w, id, ih, iw);
            int d_lo, d_hi, h_lo, h_hi, w_lo, w_hi;
            covering(id, g.k_d, g.s_d, g.out_d, d_lo, d_hi);
            covering(ih, g.k_h, g.s_h, g.out_h, h_lo, h_hi);
            covering(iw, g.k_w, g.s_w, g.out_w, w_lo, w_hi);
            const elem_t* dy_group = dy + (long long)n0 * dy_image + j * co_step;
            for (int od = d_lo; od <= d_hi; ++od)
                for (int oh = h_lo; oh <= h_hi; ++oh)
                    for (int ow = w_lo; ow <= w_hi; ++ow) {
                        const long long p = ((long long)od * g.out_h + oh) * g.out_w + ow;
                        const int tap = ((id - od * g.s_d) * g.k_h + (ih - oh * g.s_h)) * g.k_w + (iw - ow * g.s_w);
                        const elem_t* w_row = w + (p * g.features + feature_index(g, tap, (int)ci)) * g.c_out + j;
                        const elem_t* dy_p = dy_group + p * p_step;
#pragma unroll 2
                        for (int co = j; co < g.c_out; co += lanes) {
                            const acc_t wv = to_acc(*w_row);
#pragma unroll
                            for (int b = 0; b < LOCAL_IMAGES; ++b) acc[b] += to_acc(dy_p[image_offset[b]]) * wv;
                            dy_p += lanes * co_step;
                            w_row += lanes;
                        }
                    }
        }
        // each image's partial sums over the lane group, added by a fixed butterfly (every lane
        // ends with the same sum)
#pragma unroll
        for (int b = 0; b < LOCAL_IMAGES; ++b)
            for (int m = lanes >> 1; m > 0; m >>= 1) acc[b] += __shfl_xor_sync(FULL_WARP, acc[b], m);
        if (active && j == 0) {
#pragma unroll
            for (int b = 0; b < LOCAL_IMAGES; ++b)
                if (b < images)
                    dx[tensor_offset(n0 + b, ci, ipix, g.c_in, g.in_pix, g.channels_last)] =
                        ElementTraits<elem_t>::from_acc(acc[b]);
        }
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
