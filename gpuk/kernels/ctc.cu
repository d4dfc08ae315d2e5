// ctc.cu: CTC loss in log space, warp-ctc style. Launched by gpuk/kernels/ctc.py, which
// #defines ELEMENT_T / ACC_T / CTC_THREADS / CTC_SHARED_STATES and sizes the grids from them.
//
// Layout: logits (N, T, A) batch-major; labels (N, Lmax) int64 (entries past a sample's
// label length are ignored); input_lengths, label_lengths (N,) int64. Their values are
// checked on the device by the launcher (or, for Keras's ctc_batch_cost, by ctc_check.cu,
// which also converts them) and a bad one raised later (runtime/deferred.py);
// meanwhile the kernels clamp lengths and read a label outside [0, A) as the blank, so
// nothing indexes out of bounds. The extended label of a sample is blank, l1, blank, l2,
// ..., blank: S = 2 Lmax + 1 states, of which the first 2 L_n + 1 are valid. The (N, T, S)
// state arrays (log_alpha, the emissions / occupations) are stored with a row pitch P >= S
// rounded up to 32 bytes (the launcher's state_pitch; log_alpha is returned as the [..., :S]
// view): every row then starts on a sector, and a warp's run of states moves whole sectors.
//
// Forward:  ctc_emissions (a warp per frame: the frame's log-sum-exp, kept as a forward
//           output, and the emissions of the S states, gathered in parallel into log_alpha)
//           -> ctc_alpha (a block per sample; alpha in place over the emissions, the
//           previous step in shared memory, one barrier per step).
// Backward: ctc_emissions (the forward's log-sum-exp read, not recomputed) into a scratch
//           -> ctc_label_map (per sample: the first label position of each class and the
//           next position with the same class) -> ctc_beta_occupation (a block per sample;
//           beta + emission in shared memory, one barrier per step; the state occupations
//           in place over the emissions) -> ctc_grad (a warp per frame: softmax minus the
//           occupations of each class, one write per element). No atomics anywhere.
#include "common.cuh"
#include "element_types.cuh"

#ifndef CTC_THREADS
#define CTC_THREADS 256
#endif
// States held in shared memory by ctc_alpha / ctc_beta_occupation (two rows of acc_t: 16 KB
// for float, 32 KB for double). Longer extended labels keep the previous step in global
// memory instead (log_alpha itself, or a (N, 2, S) scratch for beta), same code otherwise.
#ifndef CTC_SHARED_STATES
#define CTC_SHARED_STATES 2049
#endif
// Resident blocks per SM promised to ptxas: a budget of 65536 / (3 * CTC_THREADS) = 85 -> 80
// registers per thread (the float64 variants spill with less, around the out-of-line slow
// paths of double log / exp). The per-sample kernels run one block per sample, so the batch,
// not the per-SM block count, bounds their parallelism.
#ifndef CTC_MIN_BLOCKS
#define CTC_MIN_BLOCKS 3
#endif
// Per-thread skip flags are a 64-bit mask over the states a thread owns (s = tid + k blockDim,
// k < 64); states past that (S > 64 CTC_THREADS) read the flag from the labels each step.
#define CTC_SKIP_BITS 64
// ctc_emissions / ctc_grad stage rows in dynamic shared memory when the launcher passes
// stage = 1 (the rows fit its CTC_STAGE_BYTES, 48 KB): a frame's logits row (read once,
// contiguous; the states' class gathers then hit shared memory), or a frame's occupation
// and next_same rows (the classes' label-position gathers); see the kernels.

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

// A length clamped to [0, upper]: values are checked on the device by the launcher and the
// error raised later (gpuk/kernels/runtime/deferred.py); meanwhile nothing indexes out of bounds.
__device__ __forceinline__ long long clamp_length(long long v, long long upper) {
    return v < 0 ? 0 : (v > upper ? upper : v);
}

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

// Bit k of the mask: skip_into(tid + k blockDim + offset), for the states this thread owns.
__device__ __forceinline__ unsigned long long skip_mask(const ExtendedLabel& ext, long long states, long long offset) {
    unsigned long long bits = 0;
    int k = 0;
    for (long long s = threadIdx.x; s < states && k < CTC_SKIP_BITS; s += blockDim.x, ++k)
        if (ext.skip_into(s + offset)) bits |= 1ull << k;
    return bits;
}
__device__ __forceinline__ bool skip_at(unsigned long long bits, int k, const ExtendedLabel& ext, long long s) {
    return k < CTC_SKIP_BITS ? ((bits >> k) & 1ull) != 0 : ext.skip_into(s);
}

// ctc_emissions: the pre-pass. One warp per frame r = n T + t, CTC_THREADS / 32 frames per
// block, grid-stride. compute_lse = 1: the lanes stride over the classes with an online
// max/sum (shuffle merge) and write frame_lse[r]; 0: frame_lse[r] is read (the forward's).
// Then emissions[r, s] = x[r, class(s)] - lse for t < T_n and s < 2 L_n + 1, -inf elsewhere:
// coalesced row writes (pitch P). With stage = 1 (launcher: warps x A acc_t fit
// CTC_STAGE_BYTES) the lanes keep the row they read in the warp's slice of dynamic shared
// memory and the class gathers read it there; without the lse pass the row is read whole
// only where that moves fewer sectors than gathering (A elements <= 32 bytes x (L_n + 1)).
extern "C" __global__ void __launch_bounds__(CTC_THREADS, CTC_MIN_BLOCKS)
ctc_emissions(const elem_t* __restrict__ logits, const long long* __restrict__ labels,
              const long long* __restrict__ input_lengths, const long long* __restrict__ label_lengths,
              acc_t* __restrict__ frame_lse, acc_t* __restrict__ emissions, long long batch, long long steps,
              long long classes, long long width, long long pitch, long long blank, int compute_lse, int stage) {
    extern __shared__ __align__(16) unsigned char ctc_stage_bytes[];
    const long long warps = blockDim.x >> 5, states = 2 * width + 1, frames = batch * steps;
    const unsigned lane = threadIdx.x & 31u;
    acc_t* const staged = reinterpret_cast<acc_t*>(ctc_stage_bytes) + (threadIdx.x >> 5) * classes;
    for (long long r = blockIdx.x * warps + (threadIdx.x >> 5); r < frames; r += gridDim.x * warps) {
        const long long n = r / steps, t = r - n * steps;
        const elem_t* __restrict__ row = logits + r * classes;
        const long long t_n = clamp_length(input_lengths[n], steps), l_n = clamp_length(label_lengths[n], width);
        // uniform per warp: read the row whole (into the stage) or gather from it below
        const bool staged_row = stage && (compute_lse || classes * (long long)sizeof(elem_t) <= 32 * (l_n + 1));
        __syncwarp();   // the previous frame's gathers from the stage are done
        acc_t lse;
        if (compute_lse) {
            acc_t m = ctc_neg_inf(), sum = 0;
            for (long long c = lane; c < classes; c += 32) {
                const acc_t x = to_acc(row[c]);
                if (staged_row) staged[c] = x;
                lse_online_push(m, sum, x);
            }
#pragma unroll
            for (int offset = 16; offset > 0; offset >>= 1)
                lse_online_merge(m, sum, __shfl_xor_sync(GPUK_FULL_MASK, m, offset),
                                 __shfl_xor_sync(GPUK_FULL_MASK, sum, offset));
            lse = ctc_finite(m) ? m + log(sum) : m;
            if (lane == 0) frame_lse[r] = lse;
        } else {
            lse = frame_lse[r];
            if (staged_row)
                for (long long c = lane; c < classes; c += 32) staged[c] = to_acc(row[c]);
        }
        __syncwarp();   // the staged row is whole before any lane gathers from it
        const long long s_n = t < t_n ? 2 * l_n + 1 : 0;
        const ExtendedLabel ext{labels + n * width, l_n, blank, classes};
        acc_t* __restrict__ out = emissions + r * pitch;
        for (long long base = 0; base < states; base += 32) {   // uniform per warp (__syncwarp inside)
            const long long s = base + lane;
            acc_t e = ctc_neg_inf();
            if (s < s_n) {
                const long long c = ext.class_of(s);
                e = (staged_row ? staged[c] : to_acc(row[c])) - lse;
            }
            __syncwarp();   // converged after the label reads: one coalesced store of the row
            if (s < states) out[s] = e;
        }
    }
}

// ctc_alpha: log_alpha[n, t, s] (emission at t included) in place over the emissions
// ctc_emissions wrote there, and loss[n] = -log P(label | x).
// Thread mapping: one block per sample; threads stride over the S states, one time step
// after another up to T_n (rows past T_n keep the pre-pass's -inf). The previous step is
// read from a shared double buffer (S <= CTC_SHARED_STATES; else from log_alpha's previous
// row in global memory): one __syncthreads per step. A label with no alignment gives
// loss inf. No atomics.
extern "C" __global__ void __launch_bounds__(CTC_THREADS, CTC_MIN_BLOCKS)
ctc_alpha(const long long* __restrict__ labels, const long long* __restrict__ input_lengths,
          const long long* __restrict__ label_lengths, acc_t* __restrict__ log_alpha, elem_t* __restrict__ loss,
          long long steps, long long classes, long long width, long long pitch, long long blank) {
    __shared__ acc_t shared_rows[2][CTC_SHARED_STATES];
    const long long n = blockIdx.x, states = 2 * width + 1;
    const long long t_n = clamp_length(input_lengths[n], steps), l_n = clamp_length(label_lengths[n], width);
    const long long s_n = 2 * l_n + 1;
    const bool in_shared = states <= CTC_SHARED_STATES;
    const ExtendedLabel ext{labels + n * width, l_n, blank, classes};
    const unsigned long long skips = skip_mask(ext, states, 0);
    acc_t* __restrict__ alpha = log_alpha + n * steps * pitch;
    for (long long t = 0; t < t_n; ++t) {
        acc_t* __restrict__ row = alpha + t * pitch;
        acc_t* cur = shared_rows[t & 1];
        const acc_t* prev = in_shared ? shared_rows[(t + 1) & 1] : row - pitch;
        int k = 0;
        for (long long s = threadIdx.x; s < states; s += blockDim.x, ++k) {
            const acc_t emit = row[s];
            acc_t a = ctc_neg_inf();
            if (s < s_n) {
                if (t == 0) {
                    a = s < 2 ? emit : ctc_neg_inf();
                } else {
                    const acc_t from_prev = s >= 1 ? prev[s - 1] : ctc_neg_inf();
                    const acc_t from_skip = skip_at(skips, k, ext, s) ? prev[s - 2] : ctc_neg_inf();
                    a = log_add3(prev[s], from_prev, from_skip) + emit;
                }
            }
            row[s] = a;
            if (in_shared) cur[s] = a;
        }
        __syncthreads();   // step t is read by every thread at t + 1 (double buffer: one barrier)
    }
    if (threadIdx.x == 0) {
        acc_t log_likelihood;
        if (t_n == 0) {
            log_likelihood = l_n == 0 ? acc_t(0) : ctc_neg_inf();
        } else {
            const acc_t* last = in_shared ? shared_rows[(t_n - 1) & 1] : alpha + (t_n - 1) * pitch;
            log_likelihood = log_add2(last[s_n - 1], l_n > 0 ? last[s_n - 2] : ctc_neg_inf());
        }
        loss[n] = ElementTraits<elem_t>::from_acc(acc_t(0) - log_likelihood + acc_t(0));
    }
}

// ctc_label_map: per sample, first_of_class[n, c] = the first label position l < L_n with
// class c (-1 where none, and for the blank) and next_same[n, l] = the next position after l
// with the same class (-1 at the last, and for a label outside [0, A) or the blank: rejected
// by the deferred check). Rows of class_pitch / label_pitch ints (multiples of 8: every row
// starts on a sector). Thread mapping: one block per sample; threads over the classes, each
// scanning the L_n labels (every lane reads the same label: broadcasts) and writing its
// class's entry (one coalesced store per class, no fill-then-scatter); then threads over the
// label positions (O(L_n) each). No barriers, no atomics.
extern "C" __global__ void __launch_bounds__(CTC_THREADS, CTC_MIN_BLOCKS)
ctc_label_map(const long long* __restrict__ labels, const long long* __restrict__ label_lengths,
              int* __restrict__ first_of_class, int* __restrict__ next_same, long long classes, long long width,
              long long class_pitch, long long label_pitch, long long blank) {
    const long long n = blockIdx.x, l_n = clamp_length(label_lengths[n], width);
    const long long* __restrict__ lab = labels + n * width;
    int* __restrict__ first = first_of_class + n * class_pitch;
    for (long long c = threadIdx.x; c < classes; c += blockDim.x) {
        long long at = -1;
#pragma unroll 1
        for (long long k = 0; k < l_n; ++k) {
            const long long label = lab[k];
            if (at < 0 && label == c) at = k;
        }
        first[c] = c == blank ? -1 : (int)at;
    }
    for (long long l = threadIdx.x; l < l_n; l += blockDim.x) {
        const long long c = lab[l];
        const bool has_class = c >= 0 && c < classes && c != blank;
        long long next = -1;
#pragma unroll 1
        for (long long k = l + 1; k < l_n; ++k) {
            const long long other = lab[k];
            if (next < 0 && other == c) next = k;
        }
        next_same[n * label_pitch + l] = has_class ? (int)next : -1;
    }
}

// ctc_beta_occupation: occupation[n, t, s] = exp(alpha[t, s] + beta[t, s] + loss) in place
// over the emissions in `work`, for t < T_n and a finite loss (other rows are left as they
// are: ctc_grad never reads them). beta[t, s] is the log-probability of frames t+1 .. T_n-1
// given state s at t; the recursion carries gamma[t, s] = beta[t, s] + emission[t, s].
// Thread mapping: one block per sample, time steps from T_n - 1 down, threads over the
// states; gamma of step t + 1 in a shared double buffer (S <= CTC_SHARED_STATES; else in
// gamma_scratch (N, 2, P) in global memory): one __syncthreads per step. No atomics.
extern "C" __global__ void __launch_bounds__(CTC_THREADS, CTC_MIN_BLOCKS)
ctc_beta_occupation(const long long* __restrict__ labels, const long long* __restrict__ input_lengths,
                    const long long* __restrict__ label_lengths, const acc_t* __restrict__ log_alpha,
                    const acc_t* __restrict__ loss, acc_t* __restrict__ work, acc_t* __restrict__ gamma_scratch,
                    long long steps, long long classes, long long width, long long pitch, long long blank) {
    __shared__ acc_t shared_rows[2][CTC_SHARED_STATES];
    const long long n = blockIdx.x, states = 2 * width + 1;
    const long long t_n = clamp_length(input_lengths[n], steps), l_n = clamp_length(label_lengths[n], width);
    const long long s_n = 2 * l_n + 1;
    const acc_t log_p = loss[n];
    if (!ctc_finite(log_p)) return;   // uniform: an impossible label has a zero gradient
    const bool in_shared = states <= CTC_SHARED_STATES;
    acc_t* const row0 = in_shared ? shared_rows[0] : gamma_scratch + n * 2 * pitch;
    acc_t* const row1 = in_shared ? shared_rows[1] : gamma_scratch + n * 2 * pitch + pitch;
    const ExtendedLabel ext{labels + n * width, l_n, blank, classes};
    const unsigned long long skips = skip_mask(ext, states, 2);   // skip_into(s + 2)
    const acc_t* __restrict__ alpha = log_alpha + n * steps * pitch;
    acc_t* __restrict__ sample = work + n * steps * pitch;   // emissions in, occupations out
    for (long long t = t_n - 1; t >= 0; --t) {
        acc_t* cur = (t & 1) ? row1 : row0;
        const acc_t* next = (t & 1) ? row0 : row1;
        int k = 0;
        for (long long s = threadIdx.x; s < states; s += blockDim.x, ++k) {
            acc_t b = ctc_neg_inf();
            if (s < s_n) {
                if (t == t_n - 1) {
                    b = (s == s_n - 1 || (l_n > 0 && s == s_n - 2)) ? acc_t(0) : ctc_neg_inf();
                } else {
                    const acc_t ahead1 = s + 1 < s_n ? next[s + 1] : ctc_neg_inf();
                    const acc_t ahead2 = (s + 2 < s_n && skip_at(skips, k, ext, s + 2)) ? next[s + 2] : ctc_neg_inf();
                    b = log_add3(next[s], ahead1, ahead2);
                }
            }
            const long long at = t * pitch + s;
            cur[s] = b + sample[at];   // gamma: the emission at t is still here
            sample[at] = s < s_n ? exp(alpha[at] + b + log_p) : acc_t(0);
        }
        __syncthreads();   // step t is read by every thread at t - 1 (double buffer: one barrier)
    }
}

// ctc_grad: dlogits[n, t, c] = (softmax(x_t)[c] - sum_{s: class(s) = c} occupation[t, s])
// * dloss[n] for t < T_n and a finite loss; 0 elsewhere. Thread mapping: one warp per frame,
// CTC_THREADS / 32 frames per block, grid-stride: the occupation row read whole (the
// blank's share, the even states, by a warp sum), then lanes over the classes, each adding
// its class's label positions along next_same: one coalesced write per element,
// deterministic, no atomics. With stage = 1 (launcher: warps x (P acc_t + the next_same row)
// fit CTC_STAGE_BYTES) the occupation row's label states (packed: position l at l) and the
// sample's next_same row are kept in the warp's slice of dynamic shared memory and the
// label-position chains read them there instead of scattered 4-byte reads of global memory
// (packed, lanes gathering positions l and l + 16 no longer share a bank). With stage_rows
// = 1 (launcher: those rows plus warps x A elements fit CTC_STAGE_BYTES) a block's frames
// (consecutive: f0 .. f0 + warps - 1) move as one span: their logits are read into shared
// memory from the span's first sector on, the gradients written there in place, and the
// span written out the same way, so rows of A elements that start mid-sector (A = 29 floats:
// 7 rows in 8) cost whole sectors only at the span's two ends. Two barriers per span.
extern "C" __global__ void __launch_bounds__(CTC_THREADS, CTC_MIN_BLOCKS)
ctc_grad(const elem_t* __restrict__ logits, const acc_t* __restrict__ frame_lse,
         const long long* __restrict__ input_lengths, const long long* __restrict__ label_lengths,
         const acc_t* __restrict__ occupation, const int* __restrict__ first_of_class,
         const int* __restrict__ next_same, const acc_t* __restrict__ loss, const acc_t* __restrict__ dloss,
         elem_t* __restrict__ dlogits, long long batch, long long steps, long long classes, long long width,
         long long pitch, long long class_pitch, long long label_pitch, long long blank, int stage,
         int stage_rows) {
    extern __shared__ __align__(16) unsigned char ctc_stage_bytes[];
    const long long warps = blockDim.x >> 5, frames = batch * steps, warp = threadIdx.x >> 5;
    const unsigned lane = threadIdx.x & 31u;
    // stage: each warp's occupation label states (a slice of pitch acc_t), then each warp's next_same row
    // (label_pitch ints); stage_rows: then the block's frames' logits, later their gradients
    acc_t* const staged = reinterpret_cast<acc_t*>(ctc_stage_bytes) + warp * pitch;
    int* const staged_next_rows = reinterpret_cast<int*>(reinterpret_cast<acc_t*>(ctc_stage_bytes) + warps * pitch);
    int* const staged_next = staged_next_rows + warp * label_pitch;
    elem_t* const rows = reinterpret_cast<elem_t*>(stage ? staged_next_rows + warps * label_pitch
                                                         : reinterpret_cast<int*>(ctc_stage_bytes));
    const long long sector = 32 / (long long)sizeof(elem_t);
    for (long long f0 = blockIdx.x * warps; f0 < frames; f0 += gridDim.x * warps) {   // uniform per block
        const long long f1 = f0 + warps < frames ? f0 + warps : frames;
        const long long lo = f0 * classes, hi = f1 * classes;
        if (stage_rows) {   // the span [lo, hi) of logits, read from its first sector on: whole sectors
            for (long long i = lo - lo % sector + threadIdx.x; i < hi; i += blockDim.x)
                if (i >= lo) rows[i - lo] = logits[i];
        }
        __syncthreads();   // the span is in shared memory before any warp reads its row
        const long long r = f0 + warp;
        if (r < frames) {   // uniform per warp
            const long long n = r / steps, t = r - n * steps;
            const elem_t* __restrict__ x = stage_rows ? rows + (r - f0) * classes : logits + r * classes;
            elem_t* __restrict__ g_row = stage_rows ? rows + (r - f0) * classes : dlogits + r * classes;
            const long long t_n = clamp_length(input_lengths[n], steps);
            if (t >= t_n || !ctc_finite(loss[n])) {   // uniform per warp
                for (long long c = lane; c < classes; c += 32) g_row[c] = ElementTraits<elem_t>::from_acc(acc_t(0));
            } else {
                const long long l_n = clamp_length(label_lengths[n], width), s_n = 2 * l_n + 1;
                const acc_t* __restrict__ occ_row = occupation + r * pitch;
                const int* __restrict__ next_row = next_same + n * label_pitch;
                acc_t blank_part = 0;
                __syncwarp();   // the previous frame's gathers from the stage are done
                for (long long s = lane; s < s_n; s += 32) {
                    const acc_t o = occ_row[s];
                    if (stage && (s & 1)) staged[s >> 1] = o;   // label position l = s / 2, packed
                    if (!(s & 1)) blank_part += o;
                }
                if (stage)
                    for (long long l = lane; l < l_n; l += 32) staged_next[l] = next_row[l];
                __syncwarp();   // the staged rows are whole before any lane gathers from them
                // label position l's occupation (state 2 l + 1) is occ[(l << occ_shift) + occ_shift]:
                // packed in the stage, so lanes gathering different positions hit different banks
                // (a stride of 2 put positions l and l + 16 on one bank)
                const acc_t* occ = stage ? staged : occ_row;
                const int occ_shift = stage ? 0 : 1;
                const int* next = stage ? staged_next : next_row;
#pragma unroll
                for (int offset = 16; offset > 0; offset >>= 1)
                    blank_part += __shfl_xor_sync(GPUK_FULL_MASK, blank_part, offset);
                const acc_t lse = frame_lse[r], d = dloss[n];
                const int* __restrict__ first = first_of_class + n * class_pitch;
                for (long long base = 0; base < classes; base += 32) {   // uniform per warp (__syncwarp inside)
                    const long long c = base + lane;
                    acc_t g = 0;
                    if (c < classes) {
                        const acc_t xc = to_acc(x[c]);
                        int l = first[c];   // -1 for the blank (ctc_label_map gives it no position)
                        acc_t o = c == blank ? blank_part : acc_t(0);
                        for (; l >= 0; l = next[l]) o += occ[((long long)l << occ_shift) + occ_shift];
                        g = (exp(xc - lse) - o) * d;
                    }
                    __syncwarp();   // converged after the label-position chains: one coalesced store
                    if (c < classes) g_row[c] = ElementTraits<elem_t>::from_acc(g);   // in place when staged
                }
            }
        }
        __syncthreads();   // every gradient row is in shared memory
        if (stage_rows) {   // the span of dlogits, written from its first sector on
            for (long long i = lo - lo % sector + threadIdx.x; i < hi; i += blockDim.x)
                if (i >= lo) dlogits[i] = rows[i - lo];
        }
        __syncthreads();   // written out before the next span overwrites the stage
    }
}
