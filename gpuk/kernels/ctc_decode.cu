// ctc_decode.cu: CTC greedy (best path) decoding and prefix beam search on the GPU.
// Launched by gpuk/kernels/ctc.py (#defines ELEMENT_T / ACC_T / CTC_DECODE_THREADS).
// Both follow the NumPy twins in gpuk/cpu_fallback/ctc.py rule for rule.
#include "common.cuh"

#ifndef ELEMENT_T
#define ELEMENT_T float
#endif
#ifndef ACC_T
#define ACC_T float
#endif
#ifndef CTC_DECODE_THREADS
#define CTC_DECODE_THREADS 256
#endif

typedef ELEMENT_T elem_t;
typedef ACC_T acc_t;

// Prefix hashes: polynomial modulo two primes, exactly the twin's (_P1, _B1, _P2, _B2).
#define HASH_P1 2147483647LL
#define HASH_B1 1000003LL
#define HASH_P2 1000000007LL
#define HASH_B2 911382323LL

__device__ __forceinline__ acc_t dec_neg_inf() { return acc_t(neg_inf_f()); }
__device__ __forceinline__ bool dec_finite(acc_t v) { return v == v && v - v == acc_t(0); }

// numpy.logaddexp, branch for branch (so ties and -inf behave the same).
__device__ __forceinline__ acc_t log_add_exp(acc_t x, acc_t y) {
    if (x == y) return x + acc_t(0.6931471805599453);
    const acc_t d = x - y;
    if (d > 0) return x + log1p(exp(-d));
    if (d <= 0) return y + log1p(exp(d));
    return d;   // NaN
}

// Block-wide exclusive prefix count of `flag` (blockDim.x a multiple of 32); *total gets
// the block's count. `warp_counts` is shared scratch of 33 ints.
__device__ __forceinline__ int block_exclusive_count(bool flag, int* warp_counts, int* total) {
    const unsigned lane = threadIdx.x & 31u, warp = threadIdx.x >> 5, nwarps = blockDim.x >> 5;
    const unsigned ballot = __ballot_sync(GPUK_FULL_MASK, flag);
    if (lane == 0) warp_counts[warp] = __popc(ballot);
    __syncthreads();
    if (threadIdx.x == 0) {
        int running = 0;
        for (unsigned w = 0; w < nwarps; ++w) { const int c = warp_counts[w]; warp_counts[w] = running; running += c; }
        warp_counts[32] = running;
    }
    __syncthreads();
    const int result = warp_counts[warp] + __popc(ballot & ((1u << lane) - 1u));
    *total = warp_counts[32];
    __syncthreads();   // warp_counts is reused by the next call
    return result;
}

// (v, c) beats (best, best_c) for numpy.argmax: NaN first, then larger, then lower class.
__device__ __forceinline__ bool beats(acc_t v, long long c, acc_t best, long long best_c) {
    if (c < 0) return false;
    if (best_c < 0) return true;
    const bool v_nan = v != v, best_nan = best != best;
    if (v_nan != best_nan) return v_nan;
    if (v_nan) return c < best_c;
    return v > best || (v == best && c < best_c);
}

// ctc_greedy_decode: per frame t < T_n the argmax class (ties: lowest class, NaN wins
// like numpy.argmax), merge equal neighbours (merge_repeated), drop blanks, compact to
// the front of decoded[n] with -1 padding; neg_sum[n] = -sum_t max_c log_probs[n, t, c].
// Thread mapping: one block per sample. Phase 1: a warp per frame (lanes stride over the
// classes, shuffle arg-max) writes the frame's class into decoded[n, t]. Phase 2: chunks
// of blockDim.x frames are compacted in place with a ballot prefix count (every write
// lands at or before the frames already read). No atomics.
extern "C" __global__ void __launch_bounds__(CTC_DECODE_THREADS)
ctc_greedy_decode(const elem_t* __restrict__ log_probs, const long long* __restrict__ input_lengths,
                  long long* __restrict__ decoded, elem_t* __restrict__ neg_sum, long long steps, long long classes,
                  long long blank, int merge_repeated) {
    __shared__ acc_t sum_scratch[32];
    __shared__ int counts[33];
    __shared__ long long carry;
    const long long n = blockIdx.x, t_n = input_lengths[n];
    const unsigned lane = threadIdx.x & 31u, warp = threadIdx.x >> 5, nwarps = blockDim.x >> 5;
    long long* __restrict__ out = decoded + n * steps;
    acc_t partial = 0;
    for (long long t = warp; t < steps; t += nwarps) {
        const elem_t* __restrict__ row = log_probs + (n * steps + t) * classes;
        acc_t best = dec_neg_inf();
        long long best_c = -1;
        for (long long c = lane; c < classes; c += 32) {
            const acc_t v = to_acc(row[c]);
            if (beats(v, c, best, best_c)) { best = v; best_c = c; }
        }
#pragma unroll
        for (int offset = 16; offset > 0; offset >>= 1) {
            const acc_t v = __shfl_xor_sync(GPUK_FULL_MASK, best, offset);
            const long long c = __shfl_xor_sync(GPUK_FULL_MASK, best_c, offset);
            if (beats(v, c, best, best_c)) { best = v; best_c = c; }
        }
        if (lane == 0) {
            out[t] = best_c;
            if (t < t_n) partial += best;
        }
    }
    const acc_t total = block_reduce_sum(partial, sum_scratch);   // also orders phase 1 before phase 2
    if (threadIdx.x == 0) {
        neg_sum[n] = ElementTraits<elem_t>::from_acc(acc_t(0) - total + acc_t(0));
        carry = -1;
    }
    __syncthreads();
    long long count = 0;
    for (long long base = 0; base < steps; base += blockDim.x) {
        const long long t = base + threadIdx.x;
        const long long label = t < steps ? out[t] : -1;
        const long long previous = threadIdx.x == 0 ? carry : (t < steps ? out[t - 1] : -1);
        const bool keep = t < t_n && label != blank && !(merge_repeated && label == previous);
        int chunk_total;
        const int position = block_exclusive_count(keep, counts, &chunk_total);   // barrier: all reads done
        // One writer: the chunk's last element (two threads wrote it in the last chunk: a race).
        if (t == min(base + (long long)blockDim.x, steps) - 1) carry = label;
        if (keep) out[count + position] = label;
        count += chunk_total;
        __syncthreads();
    }
    for (long long t = count + threadIdx.x; t < steps; t += blockDim.x) out[t] = -1;
}

// ---- prefix beam search ----

// Order-preserving unsigned image of a float or double (larger value, larger image).
__device__ __forceinline__ unsigned long long ordered_bits(float v) {
    const unsigned u = __float_as_uint(v);
    return (unsigned long long)((u & 0x80000000u) ? ~u : (u | 0x80000000u));
}
__device__ __forceinline__ unsigned long long ordered_bits(double v) {
    const unsigned long long u = (unsigned long long)__double_as_longlong(v);
    return (u >> 63) ? ~u : (u | 0x8000000000000000ull);
}

// One sample's beam state at one time step (slots 0 .. W-1, best first).
struct Beams {
    acc_t* p_blank; acc_t* p_label; long long* hash1; long long* hash2; int* last;
};

// The per-step context every candidate is computed from.
struct StepContext {
    Beams cur;
    const elem_t* frame;     // log_probs[n, t, :]
    acc_t frame_lse;         // frames are log-softmax normalized first, like the twin
    const int* merge_from;   // stay w merges with the extension of merge_from[w] (or -1)
    long long width, extend, blank;
    __device__ __forceinline__ acc_t lp(long long c) const { return to_acc(frame[c]) - frame_lse; }
    __device__ __forceinline__ acc_t total(long long w) const { return log_add_exp(cur.p_blank[w], cur.p_label[w]); }
    __device__ __forceinline__ long long ext_class(long long e) const { return e < blank ? e : e + 1; }
    __device__ __forceinline__ acc_t ext_label(long long w, long long c) const {
        return (cur.last[w] == c ? cur.p_blank[w] : total(w)) + lp(c);
    }
    // candidate i: (p_blank, p_label) after the merge; stays are 0 .. W-1, then beam b
    // extended by the e-th non-blank class at W + b * extend + e (the twin's order).
    __device__ __forceinline__ void value(long long i, acc_t& pb, acc_t& pl) const {
        if (i < width) {
            const acc_t tot = total(i);
            if (!dec_finite(tot)) { pb = pl = dec_neg_inf(); return; }
            pb = tot + lp(blank);
            pl = cur.last[i] >= 0 ? cur.p_label[i] + lp(cur.last[i]) : dec_neg_inf();
            if (merge_from[i] >= 0) pl = log_add_exp(pl, ext_label(merge_from[i], cur.last[i]));
            return;
        }
        const long long b = (i - width) / extend, c = ext_class((i - width) % extend);
        pb = dec_neg_inf();
        pl = dec_finite(total(b)) ? ext_label(b, c) : dec_neg_inf();
    }
    __device__ __forceinline__ void key(long long i, long long& h1, long long& h2) const {
        if (i < width) { h1 = cur.hash1[i]; h2 = cur.hash2[i]; return; }
        const long long b = (i - width) / extend, c = ext_class((i - width) % extend);
        h1 = (cur.hash1[b] * HASH_B1 + c + 1) % HASH_P1;
        h2 = (cur.hash2[b] * HASH_B2 + c + 1) % HASH_P2;
    }
    __device__ __forceinline__ long long key(long long i) const {
        long long h1, h2;
        key(i, h1, h2);
        return h1 * HASH_P2 + h2;
    }
};

// ctc_beam_search_decode: TensorFlow-style prefix beam search, the twin's rules.
// Per active step (t < T_n): candidates are every live beam staying (blank, or its last
// label repeated) and every live beam extended by every non-blank class; a stay and the
// extension that spells the same prefix merge (log-add), found by comparing prefix hashes
// of every beam pair; the best W candidates by (total desc, hash key asc) become the new
// beams in that order (dead slots: -inf, hash 0, last -1). Steps past T_n keep the beams.
// Selection: an 8-bit radix select over the ordered bits of the candidate totals (shared
// 256-bin histogram, shared-memory atomicAdd on counts only, so the result does not
// depend on their order), ties at the threshold ranked by key, then the (at most W)
// winners ranked pairwise. Backtracking through parents / emitted gives the top_paths.
// Thread mapping: one block per sample, threads stride over candidates / beams / pairs.
// Scratch (global, per sample): beams (2 x W each), merge_from (W), cand_total (C),
// ties (C), selected (W), parents / emitted (T, W); C = W * (1 + A - 1).
extern "C" __global__ void __launch_bounds__(CTC_DECODE_THREADS)
ctc_beam_search(const elem_t* __restrict__ log_probs, const long long* __restrict__ input_lengths,
                acc_t* __restrict__ beam_p, long long* __restrict__ beam_hash, int* __restrict__ beam_last,
                int* __restrict__ merge_scratch, acc_t* __restrict__ cand_scratch, int* __restrict__ tie_scratch,
                int* __restrict__ selected_scratch, int* __restrict__ parents_scratch, int* __restrict__ emitted_scratch,
                long long* __restrict__ paths, elem_t* __restrict__ scores, long long steps, long long classes,
                long long width, long long top_paths, long long blank, int merge_repeated) {
    __shared__ acc_t lse_m[32], lse_s[32];
    __shared__ int hist[256];
    __shared__ int counts[33];
    __shared__ int n_above, n_ties, select_needed;
    __shared__ unsigned long long select_prefix, select_mask;
    const long long n = blockIdx.x, t_n = input_lengths[n], extend = classes - 1;
    const long long n_cand = width * (1 + extend);
    const unsigned lane = threadIdx.x & 31u, warp = threadIdx.x >> 5, nwarps = blockDim.x >> 5;
    Beams beams[2];
    for (int k = 0; k < 2; ++k) {
        const long long off = (n * 2 + k) * width;
        beams[k] = Beams{beam_p + 2 * off, beam_p + 2 * off + width, beam_hash + 2 * off, beam_hash + 2 * off + width,
                         beam_last + off};
    }
    int* __restrict__ merge_from = merge_scratch + n * width;
    acc_t* __restrict__ cand = cand_scratch + n * n_cand;
    int* __restrict__ ties = tie_scratch + n * n_cand;
    int* __restrict__ selected = selected_scratch + n * width;
    int* __restrict__ parents = parents_scratch + n * steps * width;
    int* __restrict__ emitted = emitted_scratch + n * steps * width;
    for (long long w = threadIdx.x; w < width; w += blockDim.x) {
        beams[0].p_blank[w] = w == 0 ? acc_t(0) : dec_neg_inf();
        beams[0].p_label[w] = dec_neg_inf();
        beams[0].hash1[w] = beams[0].hash2[w] = 0;
        beams[0].last[w] = -1;
    }
    __syncthreads();
    int cur = 0;
    for (long long t = 0; t < steps; ++t) {
        if (t >= t_n) {   // uniform: the beams stay, backtracking passes straight through
            for (long long w = threadIdx.x; w < width; w += blockDim.x) {
                parents[t * width + w] = (int)w;
                emitted[t * width + w] = -1;
            }
            continue;
        }
        const Beams now = beams[cur], next = beams[cur ^ 1];
        const elem_t* __restrict__ frame = log_probs + (n * steps + t) * classes;
        // the frame's log-sum-exp (block merge of per-thread online max/sum)
        acc_t m = dec_neg_inf(), s = 0;
        for (long long c = threadIdx.x; c < classes; c += blockDim.x) {
            lse_online_push(m, s, to_acc(frame[c]));
        }
#pragma unroll
        for (int offset = 16; offset > 0; offset >>= 1)
            lse_online_merge(m, s, __shfl_xor_sync(GPUK_FULL_MASK, m, offset),
                             __shfl_xor_sync(GPUK_FULL_MASK, s, offset));
        if (lane == 0) { lse_m[warp] = m; lse_s[warp] = s; }
        for (long long w = threadIdx.x; w < width; w += blockDim.x) merge_from[w] = -1;
        __syncthreads();
        if (threadIdx.x == 0) {
            acc_t mm = lse_m[0], ss = lse_s[0];
            for (unsigned k = 1; k < nwarps; ++k) lse_online_merge(mm, ss, lse_m[k], lse_s[k]);
            lse_m[0] = dec_finite(mm) ? mm + log(ss) : mm;
        }
        // merges: stay w2 (last label c) equals beam w1 extended by c
        for (long long pair = threadIdx.x; pair < width * width; pair += blockDim.x) {
            const long long w2 = pair / width, w1 = pair % width;
            const int c = now.last[w2];
            if (c < 0 || w1 == w2) continue;
            if (!dec_finite(log_add_exp(now.p_blank[w1], now.p_label[w1]))) continue;
            if (!dec_finite(log_add_exp(now.p_blank[w2], now.p_label[w2]))) continue;
            if ((now.hash1[w1] * HASH_B1 + c + 1) % HASH_P1 == now.hash1[w2] &&
                (now.hash2[w1] * HASH_B2 + c + 1) % HASH_P2 == now.hash2[w2])
                merge_from[w2] = (int)w1;
        }
        __syncthreads();
        const StepContext ctx{now, frame, lse_m[0], merge_from, width, extend, blank};
        // candidate totals; then the extensions absorbed by a merge drop out (-inf)
        for (long long i = threadIdx.x; i < n_cand; i += blockDim.x) {
            acc_t pb, pl;
            ctx.value(i, pb, pl);
            cand[i] = log_add_exp(pb, pl);
        }
        __syncthreads();
        for (long long w = threadIdx.x; w < width; w += blockDim.x) {
            const int b = merge_from[w];
            if (b >= 0) cand[width + b * extend + (now.last[w] < blank ? now.last[w] : now.last[w] - 1)] = dec_neg_inf();
        }
        __syncthreads();
        int live = 0;
        for (long long i = threadIdx.x; i < n_cand; i += blockDim.x) live += dec_finite(cand[i]);
        for (int offset = 16; offset > 0; offset >>= 1) live += __shfl_xor_sync(GPUK_FULL_MASK, live, offset);
        if (lane == 0) counts[warp] = live;
        if (threadIdx.x == 0) { select_prefix = 0; select_mask = 0; n_above = 0; n_ties = 0; }
        __syncthreads();
        if (threadIdx.x == 0) {
            int total_live = 0;
            for (unsigned k = 0; k < nwarps; ++k) total_live += counts[k];
            select_needed = (int)(total_live < width ? total_live : width);
            counts[32] = select_needed;
        }
        __syncthreads();
        const int keep = counts[32];
        // radix select of the keep-th largest total (its ordered bits end in select_prefix)
        for (int shift = 8 * (int)sizeof(acc_t) - 8; keep > 0 && shift >= 0; shift -= 8) {
            for (int b = threadIdx.x; b < 256; b += blockDim.x) hist[b] = 0;
            __syncthreads();
            const unsigned long long prefix = select_prefix, mask = select_mask;
            for (long long i = threadIdx.x; i < n_cand; i += blockDim.x) {
                const acc_t v = cand[i];
                if (!dec_finite(v)) continue;
                const unsigned long long u = ordered_bits(v);
                if ((u & mask) == prefix) atomicAdd(&hist[(u >> shift) & 255ull], 1);
            }
            __syncthreads();
            if (threadIdx.x == 0) {
                int need = select_needed, b = 255;
                for (; b > 0 && hist[b] < need; --b) need -= hist[b];
                select_needed = need;
                select_prefix = prefix | ((unsigned long long)b << shift);
                select_mask = mask | (255ull << shift);
            }
            __syncthreads();
        }
        const unsigned long long threshold = select_prefix;
        for (long long i = threadIdx.x; keep > 0 && i < n_cand; i += blockDim.x) {
            const acc_t v = cand[i];
            if (!dec_finite(v)) continue;
            const unsigned long long u = ordered_bits(v);
            if (u > threshold) selected[atomicAdd(&n_above, 1)] = (int)i;
            else if (u == threshold) ties[atomicAdd(&n_ties, 1)] = (int)i;
        }
        __syncthreads();
        const int above = n_above, tied = n_ties, from_ties = keep - above;
        for (int j = threadIdx.x; j < tied; j += blockDim.x) {
            const long long key = ctx.key(ties[j]);
            int rank = 0;
            for (int k = 0; k < tied; ++k) rank += ctx.key(ties[k]) < key;
            if (rank < from_ties) selected[above + rank] = ties[j];
        }
        __syncthreads();
        // rank the winners by (total desc, key asc) and write them to their slots
        for (int j = threadIdx.x; j < keep; j += blockDim.x) {
            const long long i = selected[j], key = ctx.key(i);
            const acc_t v = cand[i];
            int rank = 0;
            for (int k = 0; k < keep; ++k) {
                const acc_t v2 = cand[selected[k]];
                rank += v2 > v || (v2 == v && ctx.key(selected[k]) < key);
            }
            acc_t pb, pl;
            ctx.value(i, pb, pl);
            long long h1, h2;
            ctx.key(i, h1, h2);
            next.p_blank[rank] = pb;
            next.p_label[rank] = pl;
            next.hash1[rank] = h1;
            next.hash2[rank] = h2;
            const bool stay = i < width;
            const long long b = stay ? i : (i - width) / extend;
            const int c = stay ? now.last[i] : (int)ctx.ext_class((i - width) % extend);
            next.last[rank] = c;
            parents[t * width + rank] = (int)b;
            emitted[t * width + rank] = stay ? -1 : c;
        }
        for (long long w = keep + threadIdx.x; w < width; w += blockDim.x) {
            next.p_blank[w] = next.p_label[w] = dec_neg_inf();
            next.hash1[w] = next.hash2[w] = 0;
            next.last[w] = -1;
            parents[t * width + w] = 0;
            emitted[t * width + w] = -1;
        }
        __syncthreads();
        cur ^= 1;
    }
    // final ranking of the slots (stable: ties keep slot order), then backtracking
    const Beams fin = beams[cur];
    for (long long w = threadIdx.x; w < width; w += blockDim.x) {
        const acc_t v = log_add_exp(fin.p_blank[w], fin.p_label[w]);
        long long rank = 0;
        for (long long k = 0; k < width; ++k) {
            const acc_t v2 = log_add_exp(fin.p_blank[k], fin.p_label[k]);
            rank += v2 > v || (v2 == v && k < w) || (v2 == v2 && v != v);
        }
        if (rank < top_paths) selected[rank] = (int)w;
    }
    __syncthreads();
    for (long long p = threadIdx.x; p < top_paths; p += blockDim.x) {
        const int slot0 = selected[p];
        const acc_t score = log_add_exp(fin.p_blank[slot0], fin.p_label[slot0]);
        scores[n * top_paths + p] = ElementTraits<elem_t>::from_acc(score);
        long long* __restrict__ path = paths + (n * top_paths + p) * steps;
        long long count = 0;
        if (dec_finite(score)) {
            // walking back, a label starts a new run when it differs from the later one
            long long later = -1;
            int slot = slot0;
            for (long long t = steps - 1; t >= 0; --t) {
                const int e = emitted[t * width + slot];
                slot = parents[t * width + slot];
                if (e < 0) continue;
                if (!merge_repeated || e != later) ++count;
                later = e;
            }
            long long position = count - 1;
            later = -1;
            slot = slot0;
            for (long long t = steps - 1; t >= 0; --t) {
                const int e = emitted[t * width + slot];
                slot = parents[t * width + slot];
                if (e < 0) continue;
                if (!merge_repeated || e != later) path[position--] = e;
                later = e;
            }
        }
        for (long long t = count; t < steps; ++t) path[t] = -1;
    }
}
