// batchnorm.cu: fused batch normalization: training statistics, normalize, backward.
// Launched by gpuk/kernels/batchnorm.py, which #defines ELEMENT_T / ACC_T and the thread
// counts and computes the grids from the same constants.
//
// Every problem is x viewed as (outer, C, inner) with per-channel statistics over
// (outer, inner): channels last is inner == 1 (a (rows, C) matrix), channels first is
// (N, C, H*W...). Other sets of reduced axes are transposed to channels last by the
// launcher. Reductions run in two passes: a sums kernel writes per-(split, channel)
// partial sums to a workspace, each split a fixed slice of the reduced elements, then a
// finalize kernel adds the splits in order. No float atomics: results are deterministic.
// Training statistics are shifted sums in acc_t: with K = the channel's first element,
// sum(x - K) and sum((x - K)^2) add exactly across threads and splits, and the shift
// keeps a large common offset from cancelling (mean = K + S1/n, var = (S2 - S1^2/n)/n).
// Fusions (gpuk/fusion.py): bn_apply's relu flag is the BN -> relu epilogue; the *_relu
// backward kernels mask dy where the fused output y is not > 0 (they read y: the mask is
// then exactly the unfused relu gradient's); bn_stats_finalize_moving also writes Keras's
// moving-average updates, so training needs no separate launches for them.
#include "common.cuh"

#ifndef ELEMENT_T
#define ELEMENT_T float
#endif
#ifndef ACC_T
#define ACC_T float   // the accumulation type of ELEMENT_T: float for half and float, double for double
#endif
#ifndef BN_THREADS
#define BN_THREADS 256
#endif
#ifndef BN_ROWS
#define BN_ROWS 8
#endif

typedef ELEMENT_T elem_t;
typedef ACC_T acc_t;   // a #define, not ElementTraits<elem_t>::acc, so kernel signatures can name it
static_assert(gpuk_same_type<acc_t, ElementTraits<elem_t>::acc>::value, "ACC_T must be the accumulation type of ELEMENT_T");

// dy, or 0 where the fused relu output y is not > 0 (NaN included): relu'(y) selects.
template <bool RELU>
__device__ __forceinline__ acc_t masked_grad(const elem_t* __restrict__ dy, const elem_t* __restrict__ y, long long off) {
    if (RELU && !(to_acc(y[off]) > acc_t(0))) return acc_t(0);
    return to_acc(dy[off]);
}

// The two per-element terms: training (x - K, (x - K)^2); backward (dy, dy * (x - mean)),
// dy masked by the fused relu's output when RELU.
template <bool BACKWARD, bool RELU>
__device__ __forceinline__ void add_terms(const elem_t* __restrict__ x, const elem_t* __restrict__ dy,
                                          const elem_t* __restrict__ y, long long off, acc_t center, acc_t& a,
                                          acc_t& b) {
    const acc_t centred = to_acc(x[off]) - center;
    if (BACKWARD) {
        const acc_t g = masked_grad<RELU>(dy, y, off);
        a += g;
        b += g * centred;
    } else {
        a += centred;
        b += centred * centred;
    }
}

// Channels-last sums: x is (rows, c). Thread mapping: 2-D blocks of 32 x BN_ROWS threads;
// threadIdx.x picks a channel of the block's 32-channel chunk (blockIdx.x), so a warp reads
// 32 consecutive channels (coalesced); threadIdx.y strides the rows of split blockIdx.y
// (rows [blockIdx.y * rows_per_split, +rows_per_split)). The BN_ROWS partials meet in
// shared memory and are added in row order. partials[(split * c + ch) * 2 + {0, 1}].
// Limits: gridDim.y (splits) <= 65535. No atomics.
template <bool BACKWARD, bool RELU>
__device__ __forceinline__ void sums_channels_last(const elem_t* __restrict__ x, const elem_t* __restrict__ dy,
                                                   const elem_t* __restrict__ y, const acc_t* __restrict__ mean,
                                                   acc_t* __restrict__ partials,
                                                   long long rows, long long c, long long rows_per_split) {
    __shared__ acc_t part_a[BN_ROWS][33], part_b[BN_ROWS][33];
    const long long ch = (long long)blockIdx.x * 32 + threadIdx.x;
    const long long r0 = (long long)blockIdx.y * rows_per_split;
    const long long r1 = r0 + rows_per_split < rows ? r0 + rows_per_split : rows;
    acc_t a = acc_t(0), b = acc_t(0);
    if (ch < c) {
        const acc_t center = BACKWARD ? mean[ch] : to_acc(x[ch]);
        for (long long r = r0 + threadIdx.y; r < r1; r += BN_ROWS) add_terms<BACKWARD, RELU>(x, dy, y, r * c + ch, center, a, b);
    }
    part_a[threadIdx.y][threadIdx.x] = a;
    part_b[threadIdx.y][threadIdx.x] = b;
    __syncthreads();
    if (threadIdx.y == 0 && ch < c) {
        acc_t sa = acc_t(0), sb = acc_t(0);
        for (int r = 0; r < BN_ROWS; ++r) {
            sa += part_a[r][threadIdx.x];
            sb += part_b[r][threadIdx.x];
        }
        partials[((long long)blockIdx.y * c + ch) * 2] = sa;
        partials[((long long)blockIdx.y * c + ch) * 2 + 1] = sb;
    }
}

// Channels-first sums: x is (outer, c, inner). Thread mapping: block (ch = blockIdx.x,
// split = blockIdx.y) reduces the flattened j = o * inner + i in [split * per_split,
// +per_split); consecutive threads read consecutive i (coalesced along inner); then two
// block reductions. Index math in I (32-bit when outer * inner < 2^31). No atomics.
template <bool BACKWARD, bool RELU, class I>
__device__ __forceinline__ void sums_channels_first_body(const elem_t* __restrict__ x, const elem_t* __restrict__ dy,
                                                         const elem_t* __restrict__ y, const acc_t* __restrict__ mean,
                                                         acc_t* __restrict__ partials,
                                                         long long outer, long long c, long long inner,
                                                         long long per_split) {
    __shared__ acc_t scratch[32];
    const long long ch = blockIdx.x;
    const I count = (I)(outer * inner);
    const I j0 = (I)((long long)blockIdx.y * per_split);
    const I j1 = (I)(j0 + per_split < outer * inner ? j0 + per_split : outer * inner);
    const acc_t center = BACKWARD ? mean[ch] : to_acc(x[ch * inner]);
    acc_t a = acc_t(0), b = acc_t(0);
    for (I j = j0 + (I)threadIdx.x; j < j1 && j < count; j += (I)blockDim.x) {
        const long long o = (long long)(j / (I)inner), i = (long long)(j % (I)inner);
        add_terms<BACKWARD, RELU>(x, dy, y, (o * c + ch) * inner + i, center, a, b);
    }
    a = block_reduce_sum(a, scratch);
    b = block_reduce_sum(b, scratch);
    if (threadIdx.x == 0) {
        partials[((long long)blockIdx.y * c + ch) * 2] = a;
        partials[((long long)blockIdx.y * c + ch) * 2 + 1] = b;
    }
}

// The same with the index type picked at run time: 32-bit when outer * inner < 2^31.
template <bool BACKWARD, bool RELU>
__device__ __forceinline__ void sums_channels_first(const elem_t* __restrict__ x, const elem_t* __restrict__ dy,
                                                    const elem_t* __restrict__ y, const acc_t* __restrict__ mean,
                                                    acc_t* __restrict__ partials, long long outer, long long c,
                                                    long long inner, long long per_split) {
    if (outer * inner < 0x7fffffffLL)
        sums_channels_first_body<BACKWARD, RELU, unsigned>(x, dy, y, mean, partials, outer, c, inner, per_split);
    else
        sums_channels_first_body<BACKWARD, RELU, unsigned long long>(x, dy, y, mean, partials, outer, c, inner,
                                                                     per_split);
}

extern "C" __global__ void __launch_bounds__(32 * BN_ROWS)
bn_stats_channels_last(const elem_t* __restrict__ x, acc_t* __restrict__ partials, long long rows, long long c,
                       long long rows_per_split) {
    sums_channels_last<false, false>(x, x, x, nullptr, partials, rows, c, rows_per_split);
}

extern "C" __global__ void __launch_bounds__(32 * BN_ROWS)
bn_bwd_sums_channels_last(const elem_t* __restrict__ dy, const elem_t* __restrict__ x,
                          const acc_t* __restrict__ mean, acc_t* __restrict__ partials, long long rows, long long c,
                          long long rows_per_split) {
    sums_channels_last<true, false>(x, dy, dy, mean, partials, rows, c, rows_per_split);
}

// bn_bwd_relu_sums_channels_last: bn_bwd_sums_channels_last of dy masked by y (the fused
// BN + relu output).
extern "C" __global__ void __launch_bounds__(32 * BN_ROWS)
bn_bwd_relu_sums_channels_last(const elem_t* __restrict__ dy, const elem_t* __restrict__ x,
                               const elem_t* __restrict__ y, const acc_t* __restrict__ mean,
                               acc_t* __restrict__ partials, long long rows, long long c, long long rows_per_split) {
    sums_channels_last<true, true>(x, dy, y, mean, partials, rows, c, rows_per_split);
}

extern "C" __global__ void __launch_bounds__(BN_THREADS)
bn_stats_channels_first(const elem_t* __restrict__ x, acc_t* __restrict__ partials, long long outer, long long c,
                        long long inner, long long per_split) {
    sums_channels_first<false, false>(x, x, x, nullptr, partials, outer, c, inner, per_split);
}

extern "C" __global__ void __launch_bounds__(BN_THREADS)
bn_bwd_sums_channels_first(const elem_t* __restrict__ dy, const elem_t* __restrict__ x,
                           const acc_t* __restrict__ mean, acc_t* __restrict__ partials, long long outer,
                           long long c, long long inner, long long per_split) {
    sums_channels_first<true, false>(x, dy, dy, mean, partials, outer, c, inner, per_split);
}

// bn_bwd_relu_sums_channels_first: bn_bwd_sums_channels_first of dy masked by y.
extern "C" __global__ void __launch_bounds__(BN_THREADS)
bn_bwd_relu_sums_channels_first(const elem_t* __restrict__ dy, const elem_t* __restrict__ x,
                                const elem_t* __restrict__ y, const acc_t* __restrict__ mean,
                                acc_t* __restrict__ partials, long long outer, long long c, long long inner,
                                long long per_split) {
    sums_channels_first<true, true>(x, dy, y, mean, partials, outer, c, inner, per_split);
}

// The two sums of channel ch over the splits, added in split order (deterministic):
// partials is (splits, c, 2), written by the sums kernels.
__device__ __forceinline__ void add_split_pairs(const acc_t* __restrict__ partials, long long c, long long ch,
                                                long long splits, acc_t& first, acc_t& second) {
    first = acc_t(0);
    second = acc_t(0);
    for (long long s = 0; s < splits; ++s) {
        first += partials[(s * c + ch) * 2];
        second += partials[(s * c + ch) * 2 + 1];
    }
}

// The moments of channel ch from the split sums: mean and the biased var. K is re-read
// from x[ch * inner] (the element the sums kernels shifted by).
__device__ __forceinline__ void channel_moments(const elem_t* __restrict__ x, const acc_t* __restrict__ partials,
                                                long long c, long long ch, long long inner, long long splits,
                                                long long count, acc_t& mean, acc_t& var) {
    acc_t s1, s2;
    add_split_pairs(partials, c, ch, splits, s1, s2);
    const acc_t n = acc_t(count);
    const acc_t shift_mean = s1 / n;
    const acc_t v = (s2 - s1 * shift_mean) / n;
    var = v < acc_t(0) ? acc_t(0) : v;   // rounding can leave a tiny negative
    mean = to_acc(x[ch * inner]) + shift_mean;
}

// Writes mean, var, inv_std = 1 / sqrt(var + epsilon) and scale = inv_std * gamma of channel ch.
__device__ __forceinline__ void store_statistics(const acc_t* __restrict__ gamma, acc_t* __restrict__ mean,
                                                 acc_t* __restrict__ var, acc_t* __restrict__ inv_std,
                                                 acc_t* __restrict__ scale, acc_t epsilon, long long ch, acc_t m,
                                                 acc_t v) {
    const acc_t r = acc_t(1) / sqrt(v + epsilon);
    mean[ch] = m;
    var[ch] = v;
    inv_std[ch] = r;
    scale[ch] = r * gamma[ch];
}

// bn_stats_finalize: one thread per channel adds the splits in order and writes the
// statistics. epsilon is a one-element buffer: the launch check refuses numpy.float64
// scalars (a float subclass).
extern "C" __global__ void __launch_bounds__(BN_THREADS)
bn_stats_finalize(const elem_t* __restrict__ x, const acc_t* __restrict__ partials, const acc_t* __restrict__ gamma,
                  acc_t* __restrict__ mean, acc_t* __restrict__ var, acc_t* __restrict__ inv_std,
                  acc_t* __restrict__ scale, const acc_t* __restrict__ epsilon, long long c, long long inner,
                  long long splits, long long count) {
    GPUK_GRID_STRIDE_LOOP(ch, c) {
        acc_t m, v;
        channel_moments(x, partials, c, ch, inner, splits, count, m, v);
        store_statistics(gamma, mean, var, inv_std, scale, epsilon[0], ch, m, v);
    }
}

// bn_stats_finalize_moving: bn_stats_finalize, plus Keras's moving_average_update of both
// statistics into new buffers (the variables change only after the whole call succeeds):
//   next_mean = moving_mean - (moving_mean - mean) * decay
//   next_var  = moving_var - (moving_var - var * var_factor) * var_decay
// with scalars = [epsilon, decay, var_decay, var_factor] (decay = 1 - momentum, var_decay
// the variance's; var_factor the layer's variance correction). Each step rounds in acc_t in
// the unfused graph's order, except that the compiler may contract a multiply and subtract
// into one FMA. The averages are written before store_statistics: on sm_80 the float
// divide / sqrt slow paths are calls, and values live across them would spill.
extern "C" __global__ void __launch_bounds__(BN_THREADS)
bn_stats_finalize_moving(const elem_t* __restrict__ x, const acc_t* __restrict__ partials,
                         const acc_t* __restrict__ gamma, const acc_t* __restrict__ moving_mean,
                         const acc_t* __restrict__ moving_var, acc_t* __restrict__ mean, acc_t* __restrict__ var,
                         acc_t* __restrict__ inv_std, acc_t* __restrict__ scale, acc_t* __restrict__ next_mean,
                         acc_t* __restrict__ next_var, const acc_t* __restrict__ scalars, long long c,
                         long long inner, long long splits, long long count) {
    GPUK_GRID_STRIDE_LOOP(ch, c) {
        acc_t m, v;
        channel_moments(x, partials, c, ch, inner, splits, count, m, v);
        const acc_t old_mean = moving_mean[ch], old_var = moving_var[ch];
        next_mean[ch] = old_mean - (old_mean - m) * scalars[1];
        next_var[ch] = old_var - (old_var - v * scalars[3]) * scalars[2];
        store_statistics(gamma, mean, var, inv_std, scale, scalars[0], ch, m, v);
    }
}

// bn_bwd_finalize: per channel, dbeta = sum(dy), dgamma = inv_std * sum(dy * (x - mean)),
// and the coefficients of dx = a * dy + b * (x - mean) + d:
//   a = inv_std * gamma
//   b = -a * inv_std * dgamma / n + 2 * dvar / n      (the var output's gradient)
//   d = -a * dbeta / n + dmean / n                     (the mean output's gradient)
// coef is [a(0..c), b(0..c), d(0..c)]. One thread per channel, splits added in order.
extern "C" __global__ void __launch_bounds__(BN_THREADS)
bn_bwd_finalize(const acc_t* __restrict__ partials, const acc_t* __restrict__ inv_std,
                const acc_t* __restrict__ gamma, const acc_t* __restrict__ dmean, const acc_t* __restrict__ dvar,
                acc_t* __restrict__ dgamma, acc_t* __restrict__ dbeta, acc_t* __restrict__ coef, long long c,
                long long splits, long long count) {
    GPUK_GRID_STRIDE_LOOP(ch, c) {
        acc_t sum_dy, sum_dy_centred;
        add_split_pairs(partials, c, ch, splits, sum_dy, sum_dy_centred);
        const acc_t n = acc_t(count), r = inv_std[ch];
        const acc_t dg = r * sum_dy_centred;
        const acc_t a = r * gamma[ch];
        dgamma[ch] = dg;
        dbeta[ch] = sum_dy;
        coef[ch] = a;
        coef[c + ch] = -a * r * dg / n + acc_t(2) * dvar[ch] / n;
        coef[2 * c + ch] = -a * sum_dy / n + dmean[ch] / n;
    }
}

// Elementwise passes over x viewed as (outer, c, inner): channel = (i / inner) % c.
// Thread mapping: 1-D grid-stride loop; index math in I (32-bit below 2^31 elements).
template <class I>
__device__ __forceinline__ void apply_body(const elem_t* __restrict__ x, elem_t* __restrict__ y,
                                           const acc_t* __restrict__ mean, const acc_t* __restrict__ scale,
                                           const acc_t* __restrict__ shift, I total, I c, I inner, bool relu) {
    const I stride = (I)gridDim.x * (I)blockDim.x;
    for (I i = (I)blockIdx.x * (I)blockDim.x + (I)threadIdx.x; i < total; i += stride) {
        const I ch = (i / inner) % c;
        acc_t v = (to_acc(x[i]) - mean[ch]) * scale[ch] + shift[ch];
        if (relu && v < acc_t(0)) v = acc_t(0);   // max(v, 0); NaN passes, as in the relu op
        y[i] = ElementTraits<elem_t>::from_acc(v);
    }
}

// bn_apply: y = (x - mean[ch]) * scale[ch] + shift[ch] (training normalize and inference),
// then max(y, 0) when relu != 0 (rounding to elem_t after the max equals rounding before
// it: rounding is monotone and keeps 0). No shared memory, no atomics.
extern "C" __global__ void __launch_bounds__(BN_THREADS)
bn_apply(const elem_t* __restrict__ x, elem_t* __restrict__ y, const acc_t* __restrict__ mean,
         const acc_t* __restrict__ scale, const acc_t* __restrict__ shift, long long total, long long c,
         long long inner, int relu) {
    if (total < 0x7fffffffLL)
        apply_body<unsigned>(x, y, mean, scale, shift, (unsigned)total, (unsigned)c, (unsigned)inner, relu != 0);
    else
        apply_body<unsigned long long>(x, y, mean, scale, shift, total, c, inner, relu != 0);
}

template <bool RELU, class I>
__device__ __forceinline__ void dx_body(const elem_t* __restrict__ dy, const elem_t* __restrict__ x,
                                        const elem_t* __restrict__ y, const acc_t* __restrict__ mean,
                                        const acc_t* __restrict__ coef, elem_t* __restrict__ dx, I total, I c,
                                        I inner) {
    const I stride = (I)gridDim.x * (I)blockDim.x;
    for (I i = (I)blockIdx.x * (I)blockDim.x + (I)threadIdx.x; i < total; i += stride) {
        const I ch = (i / inner) % c;
        const acc_t g = masked_grad<RELU>(dy, y, (long long)i);
        const acc_t v = coef[ch] * g + coef[c + ch] * (to_acc(x[i]) - mean[ch]) + coef[2 * c + ch];
        dx[i] = ElementTraits<elem_t>::from_acc(v);
    }
}

// bn_bwd_dx: dx = a * dy + b * (x - mean) + d with bn_bwd_finalize's coefficients.
// No shared memory, no atomics.
extern "C" __global__ void __launch_bounds__(BN_THREADS)
bn_bwd_dx(const elem_t* __restrict__ dy, const elem_t* __restrict__ x, const acc_t* __restrict__ mean,
          const acc_t* __restrict__ coef, elem_t* __restrict__ dx, long long total, long long c, long long inner) {
    if (total < 0x7fffffffLL)
        dx_body<false, unsigned>(dy, x, dy, mean, coef, dx, (unsigned)total, (unsigned)c, (unsigned)inner);
    else
        dx_body<false, unsigned long long>(dy, x, dy, mean, coef, dx, total, c, inner);
}

// bn_bwd_relu_dx: bn_bwd_dx of dy masked by y (the fused BN + relu output).
extern "C" __global__ void __launch_bounds__(BN_THREADS)
bn_bwd_relu_dx(const elem_t* __restrict__ dy, const elem_t* __restrict__ x, const elem_t* __restrict__ y,
               const acc_t* __restrict__ mean, const acc_t* __restrict__ coef, elem_t* __restrict__ dx,
               long long total, long long c, long long inner) {
    if (total < 0x7fffffffLL)
        dx_body<true, unsigned>(dy, x, y, mean, coef, dx, (unsigned)total, (unsigned)c, (unsigned)inner);
    else
        dx_body<true, unsigned long long>(dy, x, y, mean, coef, dx, total, c, inner);
}
