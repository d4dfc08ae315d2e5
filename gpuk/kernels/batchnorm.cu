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
// keeps a large common offset from cancelling (mean = K + S1/n, var = (S2 - S1^2/n)/n);
// the training sums kernels' first split writes K to shifts[ch] for the finalize.
// Fusions (gpuk/fusion.py): bn_apply's relu flag is the BN -> relu epilogue; the *_relu
// backward kernels mask dy where the fused output y is not > 0 (they read y: the mask is
// then exactly the unfused relu gradient's); bn_stats_finalize_moving also writes Keras's
// moving-average updates, so training needs no separate launches for them.
#include "common.cuh"
#include "bitwise_select.cuh"
#include "element_types.cuh"

#ifndef BN_THREADS
#define BN_THREADS 256
#endif
#ifndef BN_ROWS
#define BN_ROWS 8
#endif

static_assert(gpuk_same_type<acc_t, ElementTraits<elem_t>::acc>::value, "ACC_T must be the accumulation type of ELEMENT_T");

// dy, or 0 where the fused relu output y is not > 0 (NaN included): relu'(y) selects.
// Both loads are unconditional: lanes skipping the dy load where y <= 0 would leave the warp
// moving the same sectors for fewer bytes (masked lanes rarely leave a whole sector idle),
// and the branch would put the dy load behind the y load's latency.
template <bool RELU>
__device__ __forceinline__ acc_t masked_grad(const elem_t* __restrict__ dy, const elem_t* __restrict__ y, long long off) {
    const acc_t g = to_acc(dy[off]);
    return RELU ? keep_or_zero(g, to_acc(y[off]) > acc_t(0)) : g;
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

// partials[2 * index + {0, 1}] = (a, b) as one 2 * sizeof(acc_t)-byte store (a warp writing
// consecutive channels then moves whole sectors; two scalar stores would half-fill each).
struct __align__(2 * sizeof(acc_t)) AccPair {
    acc_t first, second;
};
__device__ __forceinline__ void store_pair(acc_t* __restrict__ partials, long long index, acc_t a, acc_t b) {
    AccPair p;
    p.first = a;
    p.second = b;
    reinterpret_cast<AccPair*>(partials)[index] = p;
}

// Channels-last sums: x is (rows, c). Thread mapping: 2-D blocks of 32 x BN_ROWS threads;
// threadIdx.x picks a channel of the block's 32-channel chunk (blockIdx.x), so a warp reads
// 32 consecutive channels (coalesced); threadIdx.y strides the rows of split blockIdx.y
// (rows [blockIdx.y * rows_per_split, +rows_per_split)). The BN_ROWS partials meet in
// shared memory and are added in row order. partials[(split * c + ch) * 2 + {0, 1}].
// Limits: gridDim.y (splits) <= 65535. No atomics. The body takes the (chunk, split) and
// (tx, ty) = (channel lane, row lane) it works on: bn_train_persistent runs it with 1-D blocks.
template <bool BACKWARD, bool RELU>
__device__ __forceinline__ void sums_channels_last_tile(const elem_t* __restrict__ x, const elem_t* __restrict__ dy,
                                                        const elem_t* __restrict__ y, const acc_t* __restrict__ mean,
                                                        acc_t* __restrict__ partials, acc_t* __restrict__ shifts,
                                                        long long rows, long long c, long long rows_per_split,
                                                        long long chunk, long long split, unsigned tx, unsigned ty) {
    __shared__ acc_t part_a[BN_ROWS][33], part_b[BN_ROWS][33];
    const long long ch = chunk * 32 + tx;
    const long long r0 = split * rows_per_split;
    const long long r1 = r0 + rows_per_split < rows ? r0 + rows_per_split : rows;
    acc_t a = acc_t(0), b = acc_t(0);
    if (ch < c) {
        const acc_t center = BACKWARD ? mean[ch] : to_acc(x[ch]);
        if (!BACKWARD && split == 0 && ty == 0) shifts[ch] = center;
        for (long long r = r0 + ty; r < r1; r += BN_ROWS) add_terms<BACKWARD, RELU>(x, dy, y, r * c + ch, center, a, b);
    }
    part_a[ty][tx] = a;
    part_b[ty][tx] = b;
    __syncthreads();
    if (ty == 0 && ch < c) {
        acc_t sa = acc_t(0), sb = acc_t(0);
        for (int r = 0; r < BN_ROWS; ++r) {
            sa += part_a[r][tx];
            sb += part_b[r][tx];
        }
        store_pair(partials, split * c + ch, sa, sb);
    }
}
template <bool BACKWARD, bool RELU>
__device__ __forceinline__ void sums_channels_last(const elem_t* __restrict__ x, const elem_t* __restrict__ dy,
                                                   const elem_t* __restrict__ y, const acc_t* __restrict__ mean,
                                                   acc_t* __restrict__ partials, acc_t* __restrict__ shifts,
                                                   long long rows, long long c, long long rows_per_split) {
    sums_channels_last_tile<BACKWARD, RELU>(x, dy, y, mean, partials, shifts, rows, c, rows_per_split, blockIdx.x,
                                            blockIdx.y, threadIdx.x, threadIdx.y);
}

// Channels-first sums: x is (outer, c, inner). Thread mapping: block (ch = blockIdx.x,
// split = blockIdx.y) reduces the flattened j = o * inner + i in [split * per_split,
// +per_split); consecutive threads read consecutive i (coalesced along inner); then two
// block reductions. Index math in I (32-bit when outer * inner < 2^31). No atomics.
template <bool BACKWARD, bool RELU, class I>
__device__ __forceinline__ void sums_channels_first_body(const elem_t* __restrict__ x, const elem_t* __restrict__ dy,
                                                         const elem_t* __restrict__ y, const acc_t* __restrict__ mean,
                                                         acc_t* __restrict__ partials, acc_t* __restrict__ shifts,
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
        store_pair(partials, (long long)blockIdx.y * c + ch, a, b);
        // after the loads: one lane's extra store before them would break the warp's requests
        // apart in the emulator's counters (lanes' k-th accesses form a request)
        if (!BACKWARD && blockIdx.y == 0) shifts[ch] = center;
    }
}

// The same with the index type picked at run time: 32-bit when outer * inner < 2^31.
template <bool BACKWARD, bool RELU>
__device__ __forceinline__ void sums_channels_first(const elem_t* __restrict__ x, const elem_t* __restrict__ dy,
                                                    const elem_t* __restrict__ y, const acc_t* __restrict__ mean,
                                                    acc_t* __restrict__ partials, acc_t* __restrict__ shifts,
                                                    long long outer, long long c, long long inner,
                                                    long long per_split) {
    if (outer * inner < 0x7fffffffLL)
        sums_channels_first_body<BACKWARD, RELU, unsigned>(x, dy, y, mean, partials, shifts, outer, c, inner,
                                                           per_split);
    else
        sums_channels_first_body<BACKWARD, RELU, unsigned long long>(x, dy, y, mean, partials, shifts, outer, c,
                                                                     inner, per_split);
}

extern "C" __global__ void __launch_bounds__(32 * BN_ROWS)
bn_stats_channels_last(const elem_t* __restrict__ x, acc_t* __restrict__ partials, acc_t* __restrict__ shifts,
                       long long rows, long long c, long long rows_per_split) {
    sums_channels_last<false, false>(x, x, x, nullptr, partials, shifts, rows, c, rows_per_split);
}

extern "C" __global__ void __launch_bounds__(32 * BN_ROWS)
bn_bwd_sums_channels_last(const elem_t* __restrict__ dy, const elem_t* __restrict__ x,
                          const acc_t* __restrict__ mean, acc_t* __restrict__ partials, long long rows, long long c,
                          long long rows_per_split) {
    sums_channels_last<true, false>(x, dy, dy, mean, partials, nullptr, rows, c, rows_per_split);
}

// bn_bwd_relu_sums_channels_last: bn_bwd_sums_channels_last of dy masked by y (the fused
// BN + relu output).
extern "C" __global__ void __launch_bounds__(32 * BN_ROWS)
bn_bwd_relu_sums_channels_last(const elem_t* __restrict__ dy, const elem_t* __restrict__ x,
                               const elem_t* __restrict__ y, const acc_t* __restrict__ mean,
                               acc_t* __restrict__ partials, long long rows, long long c, long long rows_per_split) {
    sums_channels_last<true, true>(x, dy, y, mean, partials, nullptr, rows, c, rows_per_split);
}

extern "C" __global__ void __launch_bounds__(BN_THREADS)
bn_stats_channels_first(const elem_t* __restrict__ x, acc_t* __restrict__ partials, acc_t* __restrict__ shifts,
                        long long outer, long long c, long long inner, long long per_split) {
    sums_channels_first<false, false>(x, x, x, nullptr, partials, shifts, outer, c, inner, per_split);
}

extern "C" __global__ void __launch_bounds__(BN_THREADS)
bn_bwd_sums_channels_first(const elem_t* __restrict__ dy, const elem_t* __restrict__ x,
                           const acc_t* __restrict__ mean, acc_t* __restrict__ partials, long long outer,
                           long long c, long long inner, long long per_split) {
    sums_channels_first<true, false>(x, dy, dy, mean, partials, nullptr, outer, c, inner, per_split);
}

// bn_bwd_relu_sums_channels_first: bn_bwd_sums_channels_first of dy masked by y.
extern "C" __global__ void __launch_bounds__(BN_THREADS)
bn_bwd_relu_sums_channels_first(const elem_t* __restrict__ dy, const elem_t* __restrict__ x,
                                const elem_t* __restrict__ y, const acc_t* __restrict__ mean,
                                acc_t* __restrict__ partials, long long outer, long long c, long long inner,
                                long long per_split) {
    sums_channels_first<true, true>(x, dy, y, mean, partials, nullptr, outer, c, inner, per_split);
}

// ---------------------------------------------------------------- finalize
// Thread mapping of the three finalize kernels: blocks of 32 x BN_FIN_ROWS threads, a block
// per 32-channel chunk (grid-stride over the chunks). threadIdx.x picks the channel, so a
// warp reads the (sum, sum) pairs of 32 consecutive channels of one split (one 16-byte-pair
// load per lane, coalesced); threadIdx.y strides the splits. The BN_FIN_ROWS partial sums of
// a channel meet in shared memory and row 0 adds them in row order and writes the results:
// at most ceil(splits / BN_FIN_ROWS) serial additions per thread where one thread per
// channel used to add all the splits. Deterministic (a fixed order), no atomics.
#ifndef BN_FIN_ROWS
#define BN_FIN_ROWS 16
#endif

// The two sums of channel ch over the splits, valid in the threads of row 0 (all threads
// of the block must call it: it holds two barriers). (tx, ty): the channel lane and the
// split row (ROWS of them) of this thread.
template <int ROWS>
__device__ __forceinline__ void block_split_sums(const acc_t* __restrict__ partials, long long c, long long ch,
                                                 long long splits, acc_t& first, acc_t& second, unsigned tx,
                                                 unsigned ty) {
    __shared__ acc_t part_a[ROWS][33], part_b[ROWS][33];
    acc_t a = acc_t(0), b = acc_t(0);
    if (ch < c) {
        const AccPair* __restrict__ pairs = reinterpret_cast<const AccPair*>(partials);
#pragma unroll 4
        for (long long s = ty; s < splits; s += ROWS) {
            const AccPair p = pairs[s * c + ch];
            a += p.first;
            b += p.second;
        }
    }
    part_a[ty][tx] = a;
    part_b[ty][tx] = b;
    __syncthreads();
    first = acc_t(0);
    second = acc_t(0);
    if (ty == 0) {
        for (int r = 0; r < ROWS; ++r) {
            first += part_a[r][tx];
            second += part_b[r][tx];
        }
    }
    __syncthreads();   // the next chunk overwrites part_a / part_b
}

// The 32-channel chunks of a block (grid-stride), ch = the channel of this thread's lane in each.
#define BN_FOR_EACH_CHANNEL_CHUNK(ch, c)                                                        \
    for (long long chunk = blockIdx.x, ch = chunk * 32 + threadIdx.x; chunk * 32 < (c);          \
         chunk += gridDim.x, ch = chunk * 32 + threadIdx.x)

// The moments of channel ch from the split sums s1, s2: mean and the biased var. K is
// shifts[ch], the element the sums kernels shifted by (written by their first split, so the
// finalize reads it coalesced instead of one strided x element per channel).
__device__ __forceinline__ void channel_moments(const acc_t* __restrict__ shifts, acc_t s1, acc_t s2, long long ch,
                                                long long count, acc_t& mean, acc_t& var) {
    const acc_t n = acc_t(count);
    const acc_t shift_mean = s1 / n;
    const acc_t v = (s2 - s1 * shift_mean) / n;
    var = v < acc_t(0) ? acc_t(0) : v;   // rounding can leave a tiny negative
    mean = shifts[ch] + shift_mean;
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

// Keras's moving_average_update of channel ch (see bn_stats_finalize_moving).
__device__ __forceinline__ void store_moving_averages(const acc_t* __restrict__ moving_mean,
                                                      const acc_t* __restrict__ moving_var, acc_t* __restrict__ next_mean,
                                                      acc_t* __restrict__ next_var, const acc_t* __restrict__ scalars,
                                                      long long ch, acc_t m, acc_t v) {
    const acc_t old_mean = moving_mean[ch], old_var = moving_var[ch];
    next_mean[ch] = old_mean - (old_mean - m) * scalars[1];
    next_var[ch] = old_var - (old_var - v * scalars[3]) * scalars[2];
}

// One channel chunk of the training statistics' finalize, shared by bn_stats_finalize[_moving]
// and bn_train_persistent (each loops over its block's 32-channel chunks and calls this with
// all its threads: block_split_sums holds two barriers): the ROWS split rows' sums, then row 0
// writes the statistics of channel ch and, when `moving`, its moving averages. scalars[0] is
// epsilon; with moving, scalars = [epsilon, decay, var_decay, var_factor]. (tx, ty): the
// channel lane and split row of this thread.
template <int ROWS>
__device__ __forceinline__ void finalize_statistics(const acc_t* __restrict__ partials,
                                                    const acc_t* __restrict__ shifts, const acc_t* __restrict__ gamma,
                                                    const acc_t* __restrict__ moving_mean,
                                                    const acc_t* __restrict__ moving_var, acc_t* __restrict__ mean,
                                                    acc_t* __restrict__ var, acc_t* __restrict__ inv_std,
                                                    acc_t* __restrict__ scale, acc_t* __restrict__ next_mean,
                                                    acc_t* __restrict__ next_var, const acc_t* __restrict__ scalars,
                                                    long long c, long long ch, long long splits, long long count,
                                                    bool moving, unsigned tx, unsigned ty) {
    acc_t s1, s2;
    block_split_sums<ROWS>(partials, c, ch, splits, s1, s2, tx, ty);
    if (ty == 0 && ch < c) {
        acc_t m, v;
        channel_moments(shifts, s1, s2, ch, count, m, v);
        if (moving) store_moving_averages(moving_mean, moving_var, next_mean, next_var, scalars, ch, m, v);
        store_statistics(gamma, mean, var, inv_std, scale, scalars[0], ch, m, v);
    }
}

// bn_stats_finalize: the statistics of each channel from the split sums. epsilon is a
// one-element buffer (the launcher keeps one per value).
extern "C" __global__ void __launch_bounds__(32 * BN_FIN_ROWS)
bn_stats_finalize(const acc_t* __restrict__ partials, const acc_t* __restrict__ shifts,
                  const acc_t* __restrict__ gamma, acc_t* __restrict__ mean, acc_t* __restrict__ var,
                  acc_t* __restrict__ inv_std, acc_t* __restrict__ scale, const acc_t* __restrict__ epsilon,
                  long long c, long long splits, long long count) {
    BN_FOR_EACH_CHANNEL_CHUNK(ch, c) {
        finalize_statistics<BN_FIN_ROWS>(partials, shifts, gamma, nullptr, nullptr, mean, var, inv_std, scale,
                                         nullptr, nullptr, epsilon, c, ch, splits, count, false, threadIdx.x,
                                         threadIdx.y);
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
extern "C" __global__ void __launch_bounds__(32 * BN_FIN_ROWS)
bn_stats_finalize_moving(const acc_t* __restrict__ partials, const acc_t* __restrict__ shifts,
                         const acc_t* __restrict__ gamma, const acc_t* __restrict__ moving_mean,
                         const acc_t* __restrict__ moving_var, acc_t* __restrict__ mean, acc_t* __restrict__ var,
                         acc_t* __restrict__ inv_std, acc_t* __restrict__ scale, acc_t* __restrict__ next_mean,
                         acc_t* __restrict__ next_var, const acc_t* __restrict__ scalars, long long c,
                         long long splits, long long count) {
    BN_FOR_EACH_CHANNEL_CHUNK(ch, c) {
        finalize_statistics<BN_FIN_ROWS>(partials, shifts, gamma, moving_mean, moving_var, mean, var, inv_std, scale,
                                         next_mean, next_var, scalars, c, ch, splits, count, true, threadIdx.x,
                                         threadIdx.y);
    }
}

// bn_bwd_finalize: per channel, dbeta = sum(dy), dgamma = inv_std * sum(dy * (x - mean)),
// and the coefficients of dx = a * dy + b * (x - mean) + d:
//   a = inv_std * gamma
//   b = -a * inv_std * dgamma / n + 2 * dvar / n      (the var output's gradient)
//   d = -a * dbeta / n + dmean / n                     (the mean output's gradient)
// coef is [a(0..c), b(0..c), d(0..c)]. Mapping: the finalize blocks above.
extern "C" __global__ void __launch_bounds__(32 * BN_FIN_ROWS)
bn_bwd_finalize(const acc_t* __restrict__ partials, const acc_t* __restrict__ inv_std,
                const acc_t* __restrict__ gamma, const acc_t* __restrict__ dmean, const acc_t* __restrict__ dvar,
                acc_t* __restrict__ dgamma, acc_t* __restrict__ dbeta, acc_t* __restrict__ coef, long long c,
                long long splits, long long count) {
    BN_FOR_EACH_CHANNEL_CHUNK(ch, c) {
        acc_t sum_dy, sum_dy_centred;
        block_split_sums<BN_FIN_ROWS>(partials, c, ch, splits, sum_dy, sum_dy_centred, threadIdx.x, threadIdx.y);
        if (threadIdx.y == 0 && ch < c) {
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
}

// ---------------------------------------------------------------- elementwise passes
// x viewed as (outer, c, inner): the channel of flat element i is (i / inner) % c.
// Thread mapping: 1-D grid-stride loop over 16-byte vectors of BN_VEC elements, BN_UNROLL
// vectors per thread and step, all loaded before any is used (BN_UNROLL * 16 bytes of each
// input in flight per thread: one element per thread kept too few bytes in flight to fill
// HBM). The per-channel coefficients of a vector are, by layout:
//  - VEC_SHARED (inner % BN_VEC == 0, channels first): one channel for the whole vector;
//  - VEC_CONSECUTIVE (inner == 1, c % BN_VEC == 0, channels last): BN_VEC consecutive
//    channels, loaded as 16-byte vectors; when the grid stride (in elements) is a multiple
//    of c a thread meets the same channels at every step (the launcher sizes the grid so),
//    and loads them once, before its loop;
//  - otherwise, or when a base pointer is not 16-byte aligned (views, the emulator), one
//    element per thread and step (SCALAR).
// Both vector layouts make the element count a multiple of BN_VEC (inner or c is), so no
// vector straddles the end or two channel rows. Index math in I (32-bit below 2^31
// elements). No shared memory, no atomics.
#define BN_VEC ((int)(16 / sizeof(elem_t)))
#ifndef BN_UNROLL
#define BN_UNROLL 2
#endif
#define MODE_SCALAR 0
#define MODE_VEC_SHARED 1
#define MODE_VEC_CONSECUTIVE 2
#define MODE_VEC_CONSECUTIVE_HOISTED 3

// What each kernel computes from x, the masked gradient g and four per-channel values:
//   KIND_APPLY: (x - m) * p1 + p2 [relu]                 p1 = scale, p2 = shift
//   KIND_INFER: (x - m) * (1 / sqrt(p1 + eps) * p2) + p3 [relu]   p1 = var, p2 = gamma, p3 = beta
//   KIND_DX:    p1 * g + p2 * (x - m) + p3               bn_bwd_finalize's a, b, d
// KIND_INFER turns (var, gamma, beta) into (scale, shift) where it loads them (once per thread,
// vector or element, by layout; see infer_scale), so the inference scale is computed where it
// is used and nothing is rebuilt or allocated per call.
#define KIND_APPLY 0
#define KIND_INFER 1
#define KIND_DX 2

struct ChannelArrays {
    const acc_t* __restrict__ m;
    const acc_t* __restrict__ p1;
    const acc_t* __restrict__ p2;
    const acc_t* __restrict__ p3;
};

// The channel (e / inner) % c of flat element e. In 64-bit indexing that is one 64-bit
// remainder (a subroutine call on the GPU) and a 32-bit division: with two calls in the
// vector loop ptxas spilled around them (bn_apply, double, sm_80).
__device__ __forceinline__ unsigned channel_of(unsigned e, unsigned c, unsigned inner) { return (e / inner) % c; }
__device__ __forceinline__ unsigned long long channel_of(unsigned long long e, unsigned long long c,
                                                         unsigned long long inner) {
    const unsigned long long within = e % (c * inner);   // < c * inner < 2^31 * inner
    return inner == 1 ? within : (within >> 32) == 0 && (inner >> 32) == 0 ? (unsigned)within / (unsigned)inner
                                                                          : within / inner;
}

// KIND_INFER's scale 1 / sqrt(var + eps) * gamma, rounded in the twin's order.
__device__ __forceinline__ acc_t infer_scale(acc_t var, acc_t gamma, acc_t eps) {
    return acc_t(1) / sqrt(var + eps) * gamma;
}

// (x - m) * scale + shift [relu] (KIND_APPLY, and KIND_INFER once its scale is made), or
// KIND_DX's p1 * g + p2 * (x - m) + p3.
template <int KIND>
__device__ __forceinline__ acc_t combine(acc_t xv, acc_t g, acc_t m, acc_t p1, acc_t p2, acc_t p3, bool relu) {
    acc_t v;
    if (KIND == KIND_DX) {
        v = p1 * g + p2 * (xv - m) + p3;
    } else {
        v = (xv - m) * p1 + p2;
        if (relu && v < acc_t(0)) v = acc_t(0);   // max(v, 0); NaN passes, as in the relu op
    }
    return v;
}

// n consecutive acc_t at p (16-byte loads when `vector`: p 16-byte aligned, n * sizeof(acc_t) % 16 == 0).
template <int N>
__device__ __forceinline__ void load_acc_lanes(const acc_t* __restrict__ p, bool vector, acc_t out[N]) {
    if (vector && (N * sizeof(acc_t)) % 16 == 0) {
#pragma unroll
        for (int q = 0; q < (int)(N * sizeof(acc_t) / 16); ++q) {
            const uint4 raw = load_uint4(p + q * (16 / sizeof(acc_t)));
            const acc_t* lanes = reinterpret_cast<const acc_t*>(&raw);
#pragma unroll
            for (int j = 0; j < (int)(16 / sizeof(acc_t)); ++j) out[q * (16 / sizeof(acc_t)) + j] = lanes[j];
        }
    } else {
#pragma unroll
        for (int j = 0; j < N; ++j) out[j] = p[j];
    }
}

// The four coefficient lanes of the vector whose first element has channel ch (KIND_INFER:
// m, scale, shift).
template <int KIND, int MODE>
__device__ __forceinline__ void load_coefficients(const ChannelArrays& a, long long ch, bool acc_vector, acc_t eps,
                                                  acc_t m[BN_VEC], acc_t p1[BN_VEC], acc_t p2[BN_VEC],
                                                  acc_t p3[BN_VEC]) {
    if (MODE == MODE_VEC_SHARED) {
        const acc_t vm = a.m[ch];
        acc_t v1 = a.p1[ch], v2 = a.p2[ch], v3 = KIND == KIND_APPLY ? acc_t(0) : a.p3[ch];
        if (KIND == KIND_INFER) {
            v1 = infer_scale(v1, v2, eps);
            v2 = v3;
        }
#pragma unroll
        for (int j = 0; j < BN_VEC; ++j) { m[j] = vm; p1[j] = v1; p2[j] = v2; p3[j] = v3; }
    } else {
        load_acc_lanes<BN_VEC>(a.m + ch, acc_vector, m);
        load_acc_lanes<BN_VEC>(a.p1 + ch, acc_vector, p1);
        load_acc_lanes<BN_VEC>(a.p2 + ch, acc_vector, p2);
        if (KIND != KIND_APPLY) load_acc_lanes<BN_VEC>(a.p3 + ch, acc_vector, p3);
        else {
#pragma unroll
            for (int j = 0; j < BN_VEC; ++j) p3[j] = acc_t(0);
        }
        if (KIND == KIND_INFER) {
#pragma unroll
            for (int j = 0; j < BN_VEC; ++j) {
                p1[j] = infer_scale(p1[j], p2[j], eps);
                p2[j] = p3[j];
            }
        }
    }
}

template <int KIND, bool RELU_GRAD, int MODE, class I>
__device__ __forceinline__ void vector_body(const elem_t* __restrict__ x, const elem_t* __restrict__ dy,
                                            const elem_t* __restrict__ y, elem_t* __restrict__ out,
                                            const ChannelArrays& a, acc_t eps, I total, I c, I inner, bool relu,
                                            bool acc_vector) {
    const I vectors = total / (I)BN_VEC;
    const I stride = (I)gridDim.x * (I)blockDim.x;
    const I first = (I)blockIdx.x * (I)blockDim.x + (I)threadIdx.x;
    acc_t m[BN_VEC], p1[BN_VEC], p2[BN_VEC], p3[BN_VEC];
    if (MODE == MODE_VEC_CONSECUTIVE_HOISTED && first < vectors)
        load_coefficients<KIND, MODE>(a, (long long)((first * (I)BN_VEC) % c), acc_vector, eps, m, p1, p2, p3);
    for (I v0 = first; v0 < vectors; v0 += stride * (I)BN_UNROLL) {
        uint4 rx[BN_UNROLL], rg[BN_UNROLL], ry[BN_UNROLL];
#pragma unroll
        for (int k = 0; k < BN_UNROLL; ++k) {
            const I v = v0 + (I)k * stride;
            rx[k] = rg[k] = ry[k] = make_uint4(0u, 0u, 0u, 0u);
            if (v < vectors) {
                rx[k] = load_uint4(x + (long long)v * BN_VEC);
                if (KIND == KIND_DX) rg[k] = load_uint4(dy + (long long)v * BN_VEC);
                if (RELU_GRAD) ry[k] = load_uint4(y + (long long)v * BN_VEC);
            }
        }
#pragma unroll
        for (int k = 0; k < BN_UNROLL; ++k) {
            const I v = v0 + (I)k * stride;
            if (v >= vectors) break;
            const I e = v * (I)BN_VEC;
            if (MODE == MODE_VEC_SHARED)
                load_coefficients<KIND, MODE>(a, (long long)channel_of(e, c, inner), acc_vector, eps, m, p1, p2, p3);
            else if (MODE == MODE_VEC_CONSECUTIVE)
                load_coefficients<KIND, MODE>(a, (long long)(e % c), acc_vector, eps, m, p1, p2, p3);
            const elem_t* xs = reinterpret_cast<const elem_t*>(&rx[k]);
            const elem_t* gs = reinterpret_cast<const elem_t*>(&rg[k]);
            const elem_t* ys = reinterpret_cast<const elem_t*>(&ry[k]);
            uint4 result;
            elem_t* rs = reinterpret_cast<elem_t*>(&result);
#pragma unroll
            for (int j = 0; j < BN_VEC; ++j) {
                acc_t g = acc_t(0);
                if (KIND == KIND_DX) g = (RELU_GRAD && !(to_acc(ys[j]) > acc_t(0))) ? acc_t(0) : to_acc(gs[j]);
                rs[j] = ElementTraits<elem_t>::from_acc(combine<KIND>(to_acc(xs[j]), g, m[j], p1[j], p2[j], p3[j], relu));
            }
            store_uint4(out + (long long)v * BN_VEC, result);
        }
    }
}

// MODE_SCALAR: one element per thread and step.
template <int KIND, bool RELU_GRAD, class I>
__device__ __forceinline__ void scalar_body(const elem_t* __restrict__ x, const elem_t* __restrict__ dy,
                                            const elem_t* __restrict__ y, elem_t* __restrict__ out,
                                            const ChannelArrays& a, acc_t eps, I total, I c, I inner, bool relu) {
    const I stride = (I)gridDim.x * (I)blockDim.x;
    for (I i = (I)blockIdx.x * (I)blockDim.x + (I)threadIdx.x; i < total; i += stride) {
        const I ch = channel_of(i, c, inner);
        acc_t g = acc_t(0);
        if (KIND == KIND_DX) g = masked_grad<RELU_GRAD>(dy, y, (long long)i);
        acc_t p1 = a.p1[ch], p2 = a.p2[ch];
        const acc_t p3 = KIND == KIND_APPLY ? acc_t(0) : a.p3[ch];
        if (KIND == KIND_INFER) {
            p1 = infer_scale(p1, p2, eps);
            p2 = p3;
        }
        out[i] = ElementTraits<elem_t>::from_acc(combine<KIND>(to_acc(x[i]), g, a.m[ch], p1, p2, p3, relu));
    }
}

// Picks the layout (see the top of this section) and runs it.
template <int KIND, bool RELU_GRAD, class I>
__device__ __forceinline__ void elementwise(const elem_t* __restrict__ x, const elem_t* __restrict__ dy,
                                            const elem_t* __restrict__ y, elem_t* __restrict__ out,
                                            const ChannelArrays& a, acc_t eps, I total, I c, I inner, bool relu) {
    const bool aligned = is_aligned(x, 16) && is_aligned(out, 16) && (KIND != KIND_DX || is_aligned(dy, 16)) &&
                         (!RELU_GRAD || is_aligned(y, 16));
    const bool acc_vector = is_aligned(a.m, 16) && is_aligned(a.p1, 16) && is_aligned(a.p2, 16) &&
                            (KIND == KIND_APPLY || is_aligned(a.p3, 16));
    const I stride_elements = (I)gridDim.x * (I)blockDim.x * (I)BN_VEC;
    int mode = MODE_SCALAR;
    if (aligned && inner % (I)BN_VEC == 0) mode = MODE_VEC_SHARED;
    else if (aligned && inner == 1 && c % (I)BN_VEC == 0)
        mode = stride_elements % c == 0 ? MODE_VEC_CONSECUTIVE_HOISTED : MODE_VEC_CONSECUTIVE;
    if (mode == MODE_VEC_SHARED)
        vector_body<KIND, RELU_GRAD, MODE_VEC_SHARED>(x, dy, y, out, a, eps, total, c, inner, relu, acc_vector);
    else if (mode == MODE_VEC_CONSECUTIVE)
        vector_body<KIND, RELU_GRAD, MODE_VEC_CONSECUTIVE>(x, dy, y, out, a, eps, total, c, inner, relu, acc_vector);
    else if (mode == MODE_VEC_CONSECUTIVE_HOISTED)
        vector_body<KIND, RELU_GRAD, MODE_VEC_CONSECUTIVE_HOISTED>(x, dy, y, out, a, eps, total, c, inner, relu,
                                                                   acc_vector);
    else
        scalar_body<KIND, RELU_GRAD>(x, dy, y, out, a, eps, total, c, inner, relu);
}

template <int KIND, bool RELU_GRAD>
__device__ __forceinline__ void elementwise_any_size(const elem_t* __restrict__ x, const elem_t* __restrict__ dy,
                                                     const elem_t* __restrict__ y, elem_t* __restrict__ out,
                                                     const ChannelArrays& a, acc_t eps, long long total, long long c,
                                                     long long inner, bool relu) {
    if (total < 0x7fffffffLL)
        elementwise<KIND, RELU_GRAD, unsigned>(x, dy, y, out, a, eps, (unsigned)total, (unsigned)c, (unsigned)inner,
                                               relu);
    else
        elementwise<KIND, RELU_GRAD, unsigned long long>(x, dy, y, out, a, eps, total, c, inner, relu);
}

// bn_apply: y = (x - mean[ch]) * scale[ch] + shift[ch] (training normalize), then max(y, 0)
// when relu != 0 (rounding to elem_t after the max equals rounding before it: rounding is
// monotone and keeps 0). Mapping: elementwise above.
extern "C" __global__ void __launch_bounds__(BN_THREADS)
bn_apply(const elem_t* __restrict__ x, elem_t* __restrict__ y, const acc_t* __restrict__ mean,
         const acc_t* __restrict__ scale, const acc_t* __restrict__ shift, long long total, long long c,
         long long inner, int relu) {
    const ChannelArrays a = {mean, scale, shift, shift};
    elementwise_any_size<KIND_APPLY, false>(x, x, x, y, a, acc_t(0), total, c, inner, relu != 0);
}

// bn_infer_apply: inference, y = (x - mean) * (1 / sqrt(var + eps) * gamma) + beta [relu],
// the scale computed per vector (per element in the consecutive-channel layouts) from the
// parameters themselves: nothing to cache, nothing rebuilt per call. eps is a one-element
// buffer (the launcher keeps one per value).
extern "C" __global__ void __launch_bounds__(BN_THREADS)
bn_infer_apply(const elem_t* __restrict__ x, elem_t* __restrict__ y, const acc_t* __restrict__ mean,
               const acc_t* __restrict__ var, const acc_t* __restrict__ gamma, const acc_t* __restrict__ beta,
               const acc_t* __restrict__ epsilon, long long total, long long c, long long inner, int relu) {
    const ChannelArrays a = {mean, var, gamma, beta};
    elementwise_any_size<KIND_INFER, false>(x, x, x, y, a, epsilon[0], total, c, inner, relu != 0);
}

// bn_bwd_dx: dx = a * dy + b * (x - mean) + d with bn_bwd_finalize's coefficients
// (coef = [a(0..c), b(0..c), d(0..c)]). Mapping: elementwise above.
extern "C" __global__ void __launch_bounds__(BN_THREADS)
bn_bwd_dx(const elem_t* __restrict__ dy, const elem_t* __restrict__ x, const acc_t* __restrict__ mean,
          const acc_t* __restrict__ coef, elem_t* __restrict__ dx, long long total, long long c, long long inner) {
    const ChannelArrays a = {mean, coef, coef + c, coef + 2 * c};
    elementwise_any_size<KIND_DX, false>(x, dy, dy, dx, a, acc_t(0), total, c, inner, false);
}

// bn_bwd_relu_dx: bn_bwd_dx of dy masked by y (the fused BN + relu output).
extern "C" __global__ void __launch_bounds__(BN_THREADS)
bn_bwd_relu_dx(const elem_t* __restrict__ dy, const elem_t* __restrict__ x, const elem_t* __restrict__ y,
               const acc_t* __restrict__ mean, const acc_t* __restrict__ coef, elem_t* __restrict__ dx,
               long long total, long long c, long long inner) {
    const ChannelArrays a = {mean, coef, coef + c, coef + 2 * c};
    elementwise_any_size<KIND_DX, true>(x, dy, y, dx, a, acc_t(0), total, c, inner, false);
}

// ---------------------------------------------------------------- persistent training forward
// bn_train_persistent: the whole training forward of a channels-last x (rows, c) in one
// launch, for activations that fit in L2 (the launcher's rule): the sums of bn_stats_channels_last
// (its (32-channel chunk, split) tiles, the split path's own, spread over the blocks: block b
// takes tiles b, b + gridDim.x, ...; threads as (tx, ty) = (tid % 32, tid / 32)), a grid barrier, the
// finalize of bn_stats_finalize[_moving] (32-channel chunks over the blocks, BN_ROWS split
// rows), a grid barrier, then bn_apply's elementwise pass over the whole of x, whose second
// read of x then comes from L2 instead of HBM. Two launches fewer than the split path, with
// its splits and per-split sums (the finalize adds the splits in BN_ROWS rows, not
// BN_FIN_ROWS: the last bits may differ). Deterministic, no float atomics.
// The grid barriers need every block resident at once: the launcher sizes the grid from the
// occupancy (blocks per SM x SMs; on the emulator its worker threads) and takes the split
// path where that is not possible. barrier: two unsigned, zero when allocated, left as found;
// one launch at a time may use it (two overlapping launches on one barrier would count each
// other's arrivals): the launcher keeps one per (device, stream, host thread) (batchnorm.py
// _barrier), so only launches that run in order (one stream) share one.
// moving != 0: the moving averages too (scalars = [epsilon, decay, var_decay, var_factor]);
// else scalars = [epsilon] and the moving buffers are not touched.
static_assert(BN_ROWS * 32 == BN_THREADS, "bn_train_persistent runs the channels-last tiles with 1-D blocks");
extern "C" __global__ void __launch_bounds__(BN_THREADS)
bn_train_persistent(const elem_t* __restrict__ x, elem_t* __restrict__ y, const acc_t* __restrict__ gamma,
                    const acc_t* __restrict__ beta, const acc_t* __restrict__ moving_mean,
                    const acc_t* __restrict__ moving_var, acc_t* __restrict__ mean, acc_t* __restrict__ var,
                    acc_t* __restrict__ inv_std, acc_t* __restrict__ scale, acc_t* __restrict__ next_mean,
                    acc_t* __restrict__ next_var, acc_t* __restrict__ partials, acc_t* __restrict__ shifts,
                    unsigned* __restrict__ barrier, const acc_t* __restrict__ scalars, long long rows, long long c,
                    long long splits, long long rows_per_split, int moving, int relu) {
    const unsigned tx = threadIdx.x & 31u, ty = threadIdx.x >> 5;
    const long long chunks = (c + 31) / 32;
    for (long long tile = blockIdx.x; tile < chunks * splits; tile += gridDim.x) {   // uniform per block
        sums_channels_last_tile<false, false>(x, x, x, nullptr, partials, shifts, rows, c, rows_per_split,
                                              tile % chunks, tile / chunks, tx, ty);
        __syncthreads();   // row 0 has read part_a / part_b before the next tile writes them
    }
    grid_barrier(barrier);   // every split's partials (and the shifts) written
    for (long long chunk = blockIdx.x; chunk * 32 < c; chunk += gridDim.x)
        finalize_statistics<BN_ROWS>(partials, shifts, gamma, moving_mean, moving_var, mean, var, inv_std, scale,
                                     next_mean, next_var, scalars, c, chunk * 32 + tx, splits, rows, moving != 0, tx,
                                     ty);
    grid_barrier(barrier);   // every channel's mean and scale written
    const ChannelArrays a = {mean, scale, beta, beta};
    elementwise_any_size<KIND_APPLY, false>(x, x, x, y, a, acc_t(0), rows * c, c, 1, relu != 0);
}
