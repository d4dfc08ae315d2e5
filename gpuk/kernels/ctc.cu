// ctc.cu: CTC loss in log space, forward (alpha) and backward (beta and the gradient
// with respect to the logits, log-softmax folded in). Launched by gpuk/kernels/ctc.py,
// which #defines ELEMENT_T / ACC_T / CTC_THREADS and sizes the grids from them.
//
// Layout: logits (N, T, A) batch-major; labels (N, Lmax) int64 (entries past a sample's
// label length are ignored); input_lengths, label_lengths (N,) int64 (checked by the
// launcher: 0 <= input_length <= T, 0 <= label_length <= Lmax, labels in [0, A) and not
// blank). The extended label of a sample is blank, l1, blank, l2, ..., blank: S = 2 Lmax + 1
// states, of which the first 2 L_n + 1 are valid.
#include "common.cuh"

#ifndef ELEMENT_T
#define ELEMENT_T float
#endif
#ifndef ACC_T
#define ACC_T float   // float for __half and float, double for double (the launcher sets it)
#endif
#ifndef CTC_THREADS
#define CTC_THREADS 256
#endif
// Resident blocks per SM promised to ptxas: a budget of 65536 / (3 * CTC_THREADS) = 85 -> 80
// registers per thread. Without a figure this NVRTC's ptxas held the float64 ctc_alpha and
// ctc_beta_grad to 48 / 64 registers on sm_90 and spilled 8-28 bytes around the out-of-line
// slow paths of double log / exp / division; with 4 (64 registers) float64 ctc_beta_grad
// still spills on sm_90. 3 builds every variant without spills (24-80 registers). Alpha and
// beta run one block per sample, so the batch, not the per-SM block count, bounds their
// parallelism; 3 blocks of 8 warps per SM is more than a typical batch fills.
#ifndef CTC_MIN_BLOCKS
#define CTC_MIN_BLOCKS 3
#endif

typedef ELEMENT_T elem_t;
typedef ACC_T acc_t;

__device__ __forceinline__ acc_t ctc_neg_inf() { return acc_t(neg_inf_f()); }
__device__ __forceinline__ bool ctc_finite(acc_t v) { return v == v && v - v == acc_t(0); }

// log(exp(a) + exp(b) + exp(c)) shifted by the max (by 0 when the max is not finite, so
// three -inf give -inf, not NaN), as the NumPy twin computes it.
__device__ __forceinline__ acc_t log_add3(acc_t a, acc_t b, acc_t c) {
    acc_t m = nan_max(nan_max(a, b), c);
    if (!ctc_finite(m)) m = acc_t(0);
    return log(exp(a - m) + exp(b - m) + exp(c - m)) + m;
}
__device__ __forceinline__ acc_t log_add2(acc_t a, acc_t b) { return log_add3(a, b, ctc_neg_inf()); }

// ctc_frame_lse: lse[r] = log(sum_c exp(logits[r, c])) for the N*T frames r.
// Thread mapping: one warp per frame, CTC_THREADS / 32 frames per block, lanes stride
// over the classes with an online max/sum; shuffle merge. No shared memory, no atomics.
extern "C" __global__ void __launch_bounds__(CTC_THREADS, CTC_MIN_BLOCKS)
ctc_frame_lse(const elem_t* __restrict__ logits, acc_t* __restrict__ lse, long long frames, long long classes) {
    const long long warps = blockDim.x >> 5;
    const unsigned lane = threadIdx.x & 31u;
    for (long long r = blockIdx.x * warps + (threadIdx.x >> 5); r < frames; r += gridDim.x * warps) {
        const elem_t* __restrict__ row = logits + r * classes;
        acc_t m = ctc_neg_inf(), s = 0;
        for (long long c = lane; c < classes; c += 32) {
            lse_online_push(m, s, to_acc(row[c]));
        }
#pragma unroll
        for (int offset = 16; offset > 0; offset >>= 1)
            lse_online_merge(m, s, __shfl_xor_sync(GPUK_FULL_MASK, m, offset),
                             __shfl_xor_sync(GPUK_FULL_MASK, s, offset));
        if (lane == 0) lse[r] = ctc_finite(m) ? m + log(s) : m;
    }
}

// A length clamped to [0, upper]: values are checked on the device by the launcher and the
// error raised later (gpuk/kernels/runtime/deferred.py); meanwhile nothing indexes out of bounds.
__device__ __forceinline__ long long clamp_length(long long v, long long upper) { return v < 0 ? 0 : (v > upper ? upper : v); }

// The extended label of sample n, read straight from `labels` (a label outside [0, classes),
// rejected by the launcher's deferred check, reads as the blank).
struct ExtendedLabel {
    const long long* __restrict__ labels;   // this sample's row
    long long length, blank, classes;
    __device__ __forceinline__ long long class_of(long long s) const {
        if (!(s & 1)) return blank;
        const long long c = labels[s >> 1];
        return c >= 0 && c < classes ? c : blank;
    }
    // state s may be entered from s - 2: a label that differs from the previous label
    __device__ __forceinline__ bool skip_into(long long s) const {
        return (s & 1) && s >= 3 && (s >> 1) < length && labels[s >> 1] != labels[(s >> 1) - 1];
    }
};

// ctc_alpha: log_alpha[n, t, s] (emission at t included) and loss[n] = -log P(label | x).
// Thread mapping: one block per sample; threads stride over the S states (any label
// length), one time step after another; the previous step is read back from log_alpha
// in global memory (written by the block before the __syncthreads), so there is no
// shared-memory limit on S. Rows t >= T_n and states s >= 2 L_n + 1 are -inf.
// A label with no alignment gives loss inf. No atomics.
extern "C" __global__ void __launch_bounds__(CTC_THREADS, CTC_MIN_BLOCKS)
ctc_alpha(const elem_t* __restrict__ logits, const acc_t* __restrict__ frame_lse, const long long* __restrict__ labels,
          const long long* __restrict__ input_lengths, const long long* __restrict__ label_lengths,
          acc_t* __restrict__ log_alpha, elem_t* __restrict__ loss, long long steps, long long classes,
          long long width, long long blank) {
    const long long n = blockIdx.x, states = 2 * width + 1;
    const long long t_n = clamp_length(input_lengths[n], steps), l_n = clamp_length(label_lengths[n], width);
    const long long s_n = 2 * l_n + 1;
    const ExtendedLabel ext{labels + n * width, l_n, blank, classes};
    const elem_t* __restrict__ x = logits + n * steps * classes;
    acc_t* __restrict__ alpha = log_alpha + n * steps * states;
    for (long long t = 0; t < steps; ++t) {
        acc_t* __restrict__ row = alpha + t * states;
        const acc_t* __restrict__ prev = row - states;
        const acc_t lse_t = t < t_n ? frame_lse[n * steps + t] : acc_t(0);
        for (long long s = threadIdx.x; s < states; s += blockDim.x) {
            acc_t a = ctc_neg_inf();
            if (t < t_n && s < s_n) {
                const acc_t emit = to_acc(x[t * classes + ext.class_of(s)]) - lse_t;
                if (t == 0) {
                    a = s < 2 ? emit : ctc_neg_inf();
                } else {
                    const acc_t from_prev = s >= 1 ? prev[s - 1] : ctc_neg_inf();
                    const acc_t from_skip = ext.skip_into(s) ? prev[s - 2] : ctc_neg_inf();
                    a = log_add3(prev[s], from_prev, from_skip) + emit;
                }
            }
            row[s] = a;
        }
        __syncthreads();   // row t is read by every thread at t + 1
    }
    if (threadIdx.x == 0) {
        acc_t log_likelihood;
        if (t_n == 0) {
            log_likelihood = l_n == 0 ? acc_t(0) : ctc_neg_inf();
        } else {
            const acc_t* last = alpha + (t_n - 1) * states;
            log_likelihood = log_add2(last[s_n - 1], l_n > 0 ? last[s_n - 2] : ctc_neg_inf());
        }
        loss[n] = ElementTraits<elem_t>::from_acc(acc_t(0) - log_likelihood + acc_t(0));
    }
}

// ctc_beta_grad: dlogits[n, t, c] = (softmax(x_t)[c] - sum_{s: class(s) = c}
//   exp(alpha[t, s] + beta[t, s] + loss)) * dloss[n] for t < T_n and a finite loss; 0 else.
// beta[t, s] is the log-probability of frames t+1 .. T_n-1 given state s at t.
// Thread mapping: one block per sample, time steps from T - 1 down; threads stride over
// the states (beta, occupation), then over the classes (the gradient row).
// Scratch (global, per sample): beta (2, S) double-buffered, occupation (S), and
// chain (2 Lmax): chain[l] is the next label position with the same class (or -1) and
// chain[Lmax + l] is 1 when l is the first position of its class. The gradient row is
// written softmax-first; after a barrier, the first position of each label class (and
// thread 0 for the blank, summed with a block reduction) overwrites its class with the
// occupation summed over the chain: deterministic, no atomics.
extern "C" __global__ void __launch_bounds__(CTC_THREADS, CTC_MIN_BLOCKS)
ctc_beta_grad(const elem_t* __restrict__ logits, const acc_t* __restrict__ frame_lse,
              const long long* __restrict__ labels, const long long* __restrict__ input_lengths,
              const long long* __restrict__ label_lengths, const acc_t* __restrict__ log_alpha,
              const acc_t* __restrict__ loss, const acc_t* __restrict__ dloss, acc_t* __restrict__ beta_scratch,
              acc_t* __restrict__ occupation_scratch, long long* __restrict__ chain_scratch,
              elem_t* __restrict__ dlogits, long long steps, long long classes, long long width, long long blank) {
    __shared__ acc_t reduce_scratch[32];
    const long long n = blockIdx.x, states = 2 * width + 1;
    const long long t_n = clamp_length(input_lengths[n], steps), l_n = clamp_length(label_lengths[n], width);
    const long long s_n = 2 * l_n + 1;
    const ExtendedLabel ext{labels + n * width, l_n, blank, classes};
    const elem_t* __restrict__ x = logits + n * steps * classes;
    elem_t* __restrict__ grad = dlogits + n * steps * classes;
    const acc_t* __restrict__ alpha = log_alpha + n * steps * states;
    acc_t* __restrict__ beta = beta_scratch + n * 2 * states;
    acc_t* __restrict__ occupation = occupation_scratch + n * states;
    long long* __restrict__ chain = chain_scratch + n * 2 * width;
    const acc_t log_p = loss[n], d = dloss[n];
    const bool possible = ctc_finite(log_p);
    const elem_t zero = ElementTraits<elem_t>::from_acc(acc_t(0));

    for (long long l = threadIdx.x; l < l_n; l += blockDim.x) {
        long long next = -1, first = 1;
        for (long long k = 0; k < l_n; ++k) {
            if (ext.labels[k] != ext.labels[l]) continue;
            if (k < l) first = 0;
            if (k > l && next < 0) next = k;
        }
        chain[l] = next;
        chain[width + l] = first;
    }
    for (long long t = steps - 1; t >= 0; --t) {
        elem_t* __restrict__ g_row = grad + t * classes;
        if (t >= t_n || !possible) {   // uniform over the block
            for (long long c = threadIdx.x; c < classes; c += blockDim.x) g_row[c] = zero;
            continue;
        }
        acc_t* __restrict__ beta_t = beta + (t & 1) * states;
        const acc_t* __restrict__ beta_next = beta + ((t + 1) & 1) * states;
        const acc_t lse_next = t + 1 < t_n ? frame_lse[n * steps + t + 1] : acc_t(0);
        acc_t blank_part = 0;
        for (long long s = threadIdx.x; s < states; s += blockDim.x) {
            acc_t b = ctc_neg_inf();
            if (s < s_n) {
                if (t == t_n - 1) {
                    b = (s == s_n - 1 || (l_n > 0 && s == s_n - 2)) ? acc_t(0) : ctc_neg_inf();
                } else {
                    const elem_t* __restrict__ x_next = x + (t + 1) * classes;
                    const acc_t ahead0 = beta_next[s] + (to_acc(x_next[ext.class_of(s)]) - lse_next);
                    const acc_t ahead1 = s + 1 < s_n ? beta_next[s + 1] + (to_acc(x_next[ext.class_of(s + 1)]) - lse_next)
                                                     : ctc_neg_inf();
                    const acc_t ahead2 = (s + 2 < s_n && ext.skip_into(s + 2))
                                             ? beta_next[s + 2] + (to_acc(x_next[ext.class_of(s + 2)]) - lse_next)
                                             : ctc_neg_inf();
                    b = log_add3(ahead0, ahead1, ahead2);
                }
            }
            beta_t[s] = b;
            const acc_t occ = s < s_n ? exp(alpha[t * states + s] + b + log_p) : acc_t(0);
            occupation[s] = occ;
            if (!(s & 1)) blank_part += occ;
        }
        const acc_t blank_occupation = block_reduce_sum(blank_part, reduce_scratch);   // also a barrier
        const acc_t lse_t = frame_lse[n * steps + t];
        for (long long c = threadIdx.x; c < classes; c += blockDim.x) {
            const acc_t p = exp(to_acc(x[t * classes + c]) - lse_t);
            g_row[c] = ElementTraits<elem_t>::from_acc((p - (c == blank ? blank_occupation : acc_t(0))) * d);
        }
        __syncthreads();   // the softmax row is written before label classes overwrite it
        for (long long l = threadIdx.x; l < l_n; l += blockDim.x) {
            if (!chain[width + l]) continue;
            acc_t occ = 0;
            for (long long k = l; k >= 0; k = chain[k]) occ += occupation[2 * k + 1];
            const long long c = ext.class_of(2 * l + 1);
            const acc_t p = exp(to_acc(x[t * classes + c]) - lse_t);
            g_row[c] = ElementTraits<elem_t>::from_acc((p - occ) * d);
        }
        __syncthreads();   // beta_t and occupation are reused by the next step
    }
}
