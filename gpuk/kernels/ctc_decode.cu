// ctc_decode.cu: CTC greedy (best path) decoding and prefix beam search on the GPU.
// Launched by gpuk/kernels/ctc.py (#defines ELEMENT_T / ACC_T / CTC_DECODE_THREADS).
// Both follow the NumPy twins in gpuk/cpu_fallback/ctc.py rule for rule.
#include "common.cuh"
#include "element_types.cuh"

#ifndef CTC_DECODE_THREADS
#define CTC_DECODE_THREADS 256
#endif
// ctc_beam_search keeps a frame's log-probabilities in shared memory up to this many classes
// (8 KB for float, 16 KB for double); wider frames are read from global memory each time.
#ifndef BEAM_SHARED_CLASSES
#define BEAM_SHARED_CLASSES 2048
#endif

// ctc_beam_search's per-sample scratch arrays (and the per-beam arrays inside them) start on
// a multiple of this many elements: 32 bytes for int / float, 64 for long long / double, so
// with W + W^2 candidates (110 at W = 10) a warp's run of them still moves whole sectors.
// The launcher allocates with the same padding (beam_pitch).
#ifndef BEAM_PITCH_ELEMENTS
#define BEAM_PITCH_ELEMENTS 8
#endif

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
    const int* ext_list;     // (W, W): [k][b] = beam b's k-th best extension class (-1: none)
    const acc_t* lp_cache;   // the frame's log-probabilities in shared memory, or nullptr
    long long width, extend, blank;
    __device__ __forceinline__ acc_t lp(long long c) const {
        return lp_cache != nullptr ? lp_cache[c] : to_acc(frame[c]) - frame_lse;
    }
    __device__ __forceinline__ acc_t total(long long w) const { return log_add_exp(cur.p_blank[w], cur.p_label[w]); }
    __device__ __forceinline__ long long ext_class(long long e) const { return e < blank ? e : e + 1; }
    __device__ __forceinline__ acc_t ext_label(long long w, long long c) const {
        return (cur.last[w] == c ? cur.p_blank[w] : total(w)) + lp(c);
    }
    // The hash key of beam b's prefix extended by class c (the twin's tie-break: lower first).
    __device__ __forceinline__ long long ext_key(long long b, long long c) const {
        return ((cur.hash1[b] * HASH_B1 + c + 1) % HASH_P1) * HASH_P2 + (cur.hash2[b] * HASH_B2 + c + 1) % HASH_P2;
    }
    // candidate i: stays are 0 .. W-1, then beam b's k-th best extension at W + k W + b (rank
    // major: the winners, mostly the first extensions of the beams, sit close together)
    __device__ __forceinline__ long long cand_beam(long long i) const { return i < width ? i : (i - width) % width; }
    __device__ __forceinline__ int cand_class(long long i) const {
        return i < width ? cur.last[i] : ext_list[i - width];
    }
    // (p_blank, p_label) of candidate i after the merge
    __device__ __forceinline__ void value(long long i, acc_t& pb, acc_t& pl) const {
        if (i < width) {
            const acc_t tot = total(i);
            if (!dec_finite(tot)) { pb = pl = dec_neg_inf(); return; }
            pb = tot + lp(blank);
            pl = cur.last[i] >= 0 ? cur.p_label[i] + lp(cur.last[i]) : dec_neg_inf();
            if (merge_from[i] >= 0) pl = log_add_exp(pl, ext_label(merge_from[i], cur.last[i]));
            return;
        }
        const int c = cand_class(i);
        pb = dec_neg_inf();
        pl = c >= 0 ? ext_label(cand_beam(i), c) : dec_neg_inf();
    }
    __device__ __forceinline__ void key(long long i, long long& h1, long long& h2) const {
        if (i < width) { h1 = cur.hash1[i]; h2 = cur.hash2[i]; return; }
        const long long b = cand_beam(i), c = cand_class(i);
        h1 = (cur.hash1[b] * HASH_B1 + c + 1) % HASH_P1;
        h2 = (cur.hash2[b] * HASH_B2 + c + 1) % HASH_P2;
    }
    __device__ __forceinline__ long long key(long long i) const {
        long long h1, h2;
        key(i, h1, h2);
        return h1 * HASH_P2 + h2;
    }
};

// The candidates' total order: larger total first, then lower prefix key, then lower class
// (equal keys mean a hash collision; the class makes the order total anyway).
__device__ __forceinline__ bool ranks_before(acc_t v1, long long k1, long long c1,
                                             acc_t v2, long long k2, long long c2) {
    return v1 > v2 || (v1 == v2 && (k1 < k2 || (k1 == k2 && c1 < c2)));
}

// Beam b's best `width` extension classes under ranks_before, the k-th into list[k * width]
// (-1 past its live extensions; ext_list is rank major). Called by a whole warp (the result
// is uniform over it): width rounds, each the warp's best among the classes ranked after the
// previous round's winner (lanes stride over the classes, then a shuffle butterfly under the
// same total order).
// An extension absorbed by a merge (stay w, merge_from[w] == b, class last[w]) is skipped:
// absorbed_head / absorbed_next list those stays per beam.
// Not inlined: inside ctc_beam_search its 64-bit keys and shuffles made ptxas spill 80-320
// bytes at 64-80 registers; as a call the kernel builds spill-free (114-124 registers).
__device__ __noinline__ void best_extensions(const StepContext& ctx, long long b, const int* absorbed_head,
                                                const int* absorbed_next, int* list) {
    const unsigned lane = threadIdx.x & 31u;
    long long k = 0;
    // the beam's state, read once (the class loop below only reads the frame)
    const acc_t total_b = ctx.total(b), blank_b = ctx.cur.p_blank[b];
    const long long last_b = ctx.cur.last[b], h1_b = ctx.cur.hash1[b], h2_b = ctx.cur.hash2[b];
    const int head_b = absorbed_head[b];
    if (dec_finite(total_b)) {
        bool have_prev = false;
        acc_t pv = 0;
        long long pk = 0, pc = 0;
        for (; k < ctx.width; ++k) {
            acc_t bv = dec_neg_inf();
            long long bk = 0, bc = -1;
            for (long long e = lane; e < ctx.extend; e += 32) {
                const long long c = ctx.ext_class(e);
                bool absorbed = false;
                for (int w = head_b; w >= 0 && !absorbed; w = absorbed_next[w]) absorbed = ctx.cur.last[w] == c;
                if (absorbed) continue;
                const acc_t v = (c == last_b ? blank_b : total_b) + ctx.lp(c);   // ext_label(b, c)
                if (!dec_finite(v)) continue;
                const long long key = ((h1_b * HASH_B1 + c + 1) % HASH_P1) * HASH_P2
                                      + (h2_b * HASH_B2 + c + 1) % HASH_P2;   // ext_key(b, c)
                if (have_prev && !ranks_before(pv, pk, pc, v, key, c)) continue;
                if (bc < 0 || ranks_before(v, key, c, bv, bk, bc)) { bv = v; bk = key; bc = c; }
            }
#pragma unroll
            for (int offset = 16; offset > 0; offset >>= 1) {
                const acc_t ov = __shfl_xor_sync(GPUK_FULL_MASK, bv, offset);
                const long long ok = __shfl_xor_sync(GPUK_FULL_MASK, bk, offset);
                const long long oc = __shfl_xor_sync(GPUK_FULL_MASK, bc, offset);
                if (oc >= 0 && (bc < 0 || ranks_before(ov, ok, oc, bv, bk, bc))) { bv = ov; bk = ok; bc = oc; }
            }
            if (bc < 0) break;   // uniform: every lane holds the same winner
            if (lane == 0) list[k * ctx.width] = (int)bc;
            have_prev = true;
            pv = bv; pk = bk; pc = bc;
        }
    }
    for (long long j = k + lane; j < ctx.width; j += 32) list[j * ctx.width] = -1;
}

// ctc_beam_search_decode: TensorFlow-style prefix beam search, the twin's rules.
// Per active step (t < T_n): candidates are every live beam staying (blank, or its last
// label repeated) and every live beam extended by a non-blank class; a stay and the
// extension that spells the same prefix merge (log-add), found by comparing prefix hashes
// of every beam pair; the best W candidates under one total order (total desc, hash key
// asc, class asc: ranks_before) become the new beams in that order (dead slots: -inf,
// hash 0, last -1). Steps past T_n keep the beams.
// Only each beam's best W extensions can be among the best W overall, so a warp per beam
// first keeps those (best_extensions): W + W^2 candidates per step, not W A.
// Selection: an 8-bit radix select over the ordered bits of the candidate totals (shared
// 256-bin histogram, shared-memory atomicAdd on counts only, so the result does not
// depend on their order), then, among the candidates tied at the threshold total, a
// second radix select over their keys (linear in the ties); the (at most W) winners are
// ranked pairwise. Backtracking through parents / emitted gives the top_paths.
// Thread mapping: one block per sample, threads stride over candidates / beams / pairs.
// Scratch (global, per sample): beams (2 x W each), merge_from / absorbed head / next
// (3 W), ext_list (W^2), cand_total (C), ties (C), selected (W), parents / emitted (T, W);
// C = W + W^2; each array padded to beam_pitch elements (BEAM_PITCH_ELEMENTS above).
__device__ __forceinline__ long long beam_pitch(long long count) {
    return (count + BEAM_PITCH_ELEMENTS - 1) / BEAM_PITCH_ELEMENTS * BEAM_PITCH_ELEMENTS;
}

extern "C" __global__ void __launch_bounds__(CTC_DECODE_THREADS)
ctc_beam_search(const elem_t* __restrict__ log_probs, const long long* __restrict__ input_lengths,
                acc_t* __restrict__ beam_p, long long* __restrict__ beam_hash, int* __restrict__ beam_last,
                int* __restrict__ merge_scratch, int* __restrict__ ext_scratch, acc_t* __restrict__ cand_scratch,
                int* __restrict__ tie_scratch,
                int* __restrict__ selected_scratch, int* __restrict__ parents_scratch, int* __restrict__ emitted_scratch,
                long long* __restrict__ paths, elem_t* __restrict__ scores, long long steps, long long classes,
                long long width, long long top_paths, long long blank, int merge_repeated) {
    __shared__ acc_t lse_m[32], lse_s[32];
    __shared__ acc_t frame_lp[BEAM_SHARED_CLASSES];
    __shared__ int hist[256];
    __shared__ int counts[33];
    __shared__ int n_above, n_ties, n_tie_winners, select_needed;
    __shared__ unsigned long long select_prefix, select_mask;
    const long long n = blockIdx.x, t_n = input_lengths[n], extend = classes - 1;
    const long long n_cand = width * (1 + width);
    const unsigned lane = threadIdx.x & 31u, warp = threadIdx.x >> 5, nwarps = blockDim.x >> 5;
    const long long w_pitch = beam_pitch(width), cand_pitch = beam_pitch(n_cand);
    Beams beams[2];
    for (int k = 0; k < 2; ++k) {
        const long long off = (n * 2 + k) * w_pitch;
        beams[k] = Beams{beam_p + 2 * off, beam_p + 2 * off + w_pitch, beam_hash + 2 * off,
                         beam_hash + 2 * off + w_pitch, beam_last + off};
    }
    int* __restrict__ merge_from = merge_scratch + n * 3 * w_pitch;
    int* __restrict__ absorbed_head = merge_from + w_pitch;
    int* __restrict__ absorbed_next = merge_from + 2 * w_pitch;
    int* __restrict__ ext_list = ext_scratch + n * beam_pitch(width * width);
    acc_t* __restrict__ cand = cand_scratch + n * cand_pitch;
    int* __restrict__ ties = tie_scratch + n * cand_pitch;
    int* __restrict__ selected = selected_scratch + n * w_pitch;
    int* __restrict__ parents = parents_scratch + n * beam_pitch(steps * width);
    int* __restrict__ emitted = emitted_scratch + n * beam_pitch(steps * width);
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
        const bool cache_frame = classes <= BEAM_SHARED_CLASSES;   // uniform
        for (long long c = threadIdx.x; cache_frame && c < classes; c += blockDim.x)
            frame_lp[c] = to_acc(frame[c]) - lse_m[0];
        if (threadIdx.x == 0) {   // the stays each beam's extensions merge into, as short lists
            for (long long w = 0; w < width; ++w) absorbed_head[w] = -1;
            for (long long w = 0; w < width; ++w) {
                const int b = merge_from[w];
                absorbed_next[w] = b >= 0 ? absorbed_head[b] : -1;
                if (b >= 0) absorbed_head[b] = (int)w;
            }
        }
        __syncthreads();
        const StepContext ctx{now, frame, lse_m[0], merge_from, ext_list, cache_frame ? frame_lp : nullptr,
                              width, extend, blank};
        for (long long b = warp; b < width; b += nwarps)   // uniform per warp
            best_extensions(ctx, b, absorbed_head, absorbed_next, ext_list + b);
        __syncthreads();
        for (long long i = threadIdx.x; i < n_cand; i += blockDim.x) {
            acc_t pb, pl;
            ctx.value(i, pb, pl);
            cand[i] = log_add_exp(pb, pl);
        }
        __syncthreads();
        int live = 0;
        for (long long i = threadIdx.x; i < n_cand; i += blockDim.x) live += dec_finite(cand[i]);
        for (int offset = 16; offset > 0; offset >>= 1) live += __shfl_xor_sync(GPUK_FULL_MASK, live, offset);
        if (lane == 0) counts[warp] = live;
        if (threadIdx.x == 0) { select_prefix = 0; select_mask = 0; n_above = 0; n_ties = 0; n_tie_winners = 0; }
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
        // the from_ties lowest (key, class) among the ties: a radix select over the keys
        if (from_ties > 0 && from_ties < tied) {
            if (threadIdx.x == 0) { select_prefix = 0; select_mask = 0; select_needed = from_ties; }
            for (int shift = 56; shift >= 0; shift -= 8) {
                for (int b = threadIdx.x; b < 256; b += blockDim.x) hist[b] = 0;
                __syncthreads();
                const unsigned long long prefix = select_prefix, mask = select_mask;
                for (int j = threadIdx.x; j < tied; j += blockDim.x) {
                    const unsigned long long u = (unsigned long long)ctx.key(ties[j]);
                    if ((u & mask) == prefix) atomicAdd(&hist[(u >> shift) & 255ull], 1);
                }
                __syncthreads();
                if (threadIdx.x == 0) {
                    int need = select_needed, b = 0;
                    for (; b < 255 && hist[b] < need; ++b) need -= hist[b];
                    select_needed = need;
                    select_prefix = prefix | ((unsigned long long)b << shift);
                    select_mask = mask | (255ull << shift);
                }
                __syncthreads();
            }
            // keys below the threshold key all win; at it (a hash collision) the lowest classes
            const unsigned long long key_threshold = select_prefix;
            const int at_threshold = select_needed;
            for (int j = threadIdx.x; j < tied; j += blockDim.x) {
                const int i = ties[j];
                const unsigned long long u = (unsigned long long)ctx.key(i);
                bool wins = u < key_threshold;
                if (u == key_threshold) {
                    int before = 0;   // rank among the (rare) equal keys by class
                    for (int k = 0; k < tied; ++k)
                        before += (unsigned long long)ctx.key(ties[k]) == u && ctx.cand_class(ties[k]) < ctx.cand_class(i);
                    wins = before < at_threshold;
                }
                if (wins) selected[above + atomicAdd(&n_tie_winners, 1)] = i;
            }
        } else if (from_ties > 0) {
            for (int j = threadIdx.x; j < tied; j += blockDim.x) selected[above + j] = ties[j];
        }
        __syncthreads();
        // rank the winners by ranks_before and write them to their slots
        for (int j = threadIdx.x; j < keep; j += blockDim.x) {
            const long long i = selected[j], key = ctx.key(i), c = ctx.cand_class(i);
            const acc_t v = cand[i];
            int rank = 0;
            for (int k = 0; k < keep; ++k) {
                const long long i2 = selected[k];
                rank += ranks_before(cand[i2], ctx.key(i2), ctx.cand_class(i2), v, key, c);
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
            next.last[rank] = (int)c;
            parents[t * width + rank] = (int)ctx.cand_beam(i);
            emitted[t * width + rank] = stay ? -1 : (int)c;
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
