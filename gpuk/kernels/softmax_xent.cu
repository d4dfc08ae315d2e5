// softmax_xent.cu: row kernels for softmax / log-softmax and the cross-entropy losses.
// Launched by gpuk/kernels/softmax_xent.py, which moves the class axis last (so a row
// is `cols` contiguous elements), #defines ELEMENT_T and the constants below, and
// computes the grid from the same constants.
//
// Row mapping (every *_rows kernel, see for_each_row; the kernels are written with the
// per-element helpers each_element / row_sum / row_map / row_lse):
//   cols <= SUB_WARP_MAX_COLS: sub-warp groups of 1..32 lanes (the power of two giving each
//     lane one step of 1 or 4 elements), 32 / lanes rows per warp, so a warp moves whole
//     consecutive rows (e.g. 8 rows of 16 floats, 4 lanes each): shuffle reductions inside
//     the group, no shared memory, no __syncthreads;
//   cols <= WARP_ROW_MAX_COLS: one warp per row, ROW_THREADS / 32 rows per block, warp
//     shuffle reductions, no shared memory, no __syncthreads;
//   longer rows: one block per row (grid-stride over rows), block reductions through a
//     32-entry static shared scratch.
// Vector access: when cols % 4 == 0 and every row buffer is aligned to 4 elements
// (16 bytes for float), a thread moves 4 contiguous elements per step (float4, 2 x
// double2, or 8 bytes of __half / __nv_bfloat16); otherwise one element per step.
// Precision: acc_t is float for __half and __nv_bfloat16, the element type otherwise.
// Limits: rows, cols < 2^63 (64-bit offsets). No atomics: results are deterministic.
#include "common.cuh"
#include "element_types.cuh"

#ifndef ROW_THREADS
#define ROW_THREADS 256
#endif
#ifndef WARP_ROW_MAX_COLS
#define WARP_ROW_MAX_COLS 1024
#endif
#ifndef SUB_WARP_MAX_COLS
#define SUB_WARP_MAX_COLS 32
#endif
#ifndef BINARY_THREADS
#define BINARY_THREADS 256
#endif
// Resident blocks per SM promised to ptxas for every kernel here: a budget of
// 65536 / (3 * 256) = 85 -> 80 registers per thread. Without a figure this NVRTC's ptxas
// held the row kernels to 32-64 registers and spilled 8-54 bytes (float64 and
// categorical_xent_probs_rows most); with 4 (64 registers) the float64
// categorical_xent_probs_rows and softmax_xent_rows_bwd still spill. 3 builds every
// variant without spills (24-80 registers), and these bandwidth-bound row loops keep
// >= 24 warps per SM in flight with it.
#ifndef ROW_MIN_BLOCKS
#define ROW_MIN_BLOCKS 3
#endif

// softmax_xent_rows_bwd holds a row's x and t in registers for short rows: its float64
// variant spills 12 bytes on sm_90 within 80 registers, so the launcher gives it 2 (128
// registers) for float64 and ROW_MIN_BLOCKS otherwise.
#ifndef XENT_BWD_MIN_BLOCKS
#define XENT_BWD_MIN_BLOCKS ROW_MIN_BLOCKS
#endif

#define BINARY_LOGITS_FWD 0
#define BINARY_LOGITS_BWD 1
#define BINARY_LOGITS_DTARGET 2
#define BINARY_PROBS_FWD 3
#define BINARY_PROBS_BWD 4
#define BINARY_PROBS_DTARGET 5

__device__ __forceinline__ acc_t acc_neg_inf() { return acc_t(neg_inf_f()); }
__device__ __forceinline__ acc_t acc_nan() { return acc_t(__int_as_float(0x7fc00000)); }
__device__ __forceinline__ bool is_finite_acc(acc_t v) { return v == v && v - v == acc_t(0); }
__device__ __forceinline__ elem_t from_acc(acc_t v) { return ElementTraits<elem_t>::from_acc(v); }
// NaN passes through, like np.clip.
__device__ __forceinline__ acc_t clip(acc_t v, acc_t lo, acc_t hi) { return v < lo ? lo : (v > hi ? hi : v); }

// ---- 1 or 4 contiguous elements ----
struct Width1 { static const int n = 1; };
struct Width4 { static const int n = 4; };
__device__ __forceinline__ void load4(const float* p, float* v) {
    const float4 q = load_float4(p);
    v[0] = q.x; v[1] = q.y; v[2] = q.z; v[3] = q.w;
}
__device__ __forceinline__ void load4(const double* p, double* v) {
    const double2 a = reinterpret_cast<const double2*>(p)[0], b = reinterpret_cast<const double2*>(p)[1];
    v[0] = a.x; v[1] = a.y; v[2] = b.x; v[3] = b.y;
}
// 16-bit elements: 4 of them are one 8-byte uint2, two per 32-bit word, the element at the
// lower address in the low half (little-endian), as pack_half2 / pack_bfloat162 build them.
// bits_to_float's pointer argument only picks the element type.
__device__ __forceinline__ float bits_to_float(unsigned bits, const __half*) {
    return __half2float(__ushort_as_half((unsigned short)bits));
}
__device__ __forceinline__ float bits_to_float(unsigned bits, const __nv_bfloat16*) {
    return __bfloat162float(__ushort_as_bfloat16((unsigned short)bits));
}
template <class T> __device__ __forceinline__ void load4_16bit(const T* p, float* v) {
    const uint2 u = *reinterpret_cast<const uint2*>(p);
    v[0] = bits_to_float(u.x & 0xffffu, p);
    v[1] = bits_to_float(u.x >> 16, p);
    v[2] = bits_to_float(u.y & 0xffffu, p);
    v[3] = bits_to_float(u.y >> 16, p);
}
__device__ __forceinline__ void load4(const __half* p, float* v) { load4_16bit(p, v); }
__device__ __forceinline__ void load4(const __nv_bfloat16* p, float* v) { load4_16bit(p, v); }
__device__ __forceinline__ void store4(float* p, const float* v) { store_float4(p, make_float4(v[0], v[1], v[2], v[3])); }
__device__ __forceinline__ void store4(double* p, const double* v) {
    reinterpret_cast<double2*>(p)[0] = make_double2(v[0], v[1]);
    reinterpret_cast<double2*>(p)[1] = make_double2(v[2], v[3]);
}
__device__ __forceinline__ void store4(__half* p, const float* v) {
    *reinterpret_cast<uint2*>(p) = make_uint2(pack_half2(v[0], v[1]), pack_half2(v[2], v[3]));
}
__device__ __forceinline__ void store4(__nv_bfloat16* p, const float* v) {
    *reinterpret_cast<uint2*>(p) = make_uint2(pack_bfloat162(v[0], v[1]), pack_bfloat162(v[2], v[3]));
}
template <int W> __device__ __forceinline__ void load_n(const elem_t* p, acc_t* v) {
    if (W == 4) load4(p, v);
    else v[0] = to_acc(p[0]);
}
template <int W> __device__ __forceinline__ void store_n(elem_t* p, const acc_t* v) {
    if (W == 4) store4(p, v);
    else p[0] = from_acc(v[0]);
}
__device__ __forceinline__ bool vec_ok(long long cols, const void* p) {
    return (cols & 3) == 0 && is_aligned(p, 4 * sizeof(elem_t));
}

// ---- reduction states and their merge rules ----
struct SumState { acc_t v; };
// Log-sum-exp as (max, sum of exp(x - max)); NaN in m is sticky.
struct LseState { acc_t m, s; };
// Cross-entropy in one pass: lse state plus st = sum(t) and stx = sum(t (x - m)) over
// t != 0, kept relative to the running max so that large logits do not cancel.
struct XentState { acc_t m, s, st, stx; };

__device__ __forceinline__ SumState merge(SumState a, SumState b) { return SumState{a.v + b.v}; }
__device__ __forceinline__ LseState merge(LseState a, LseState b) {
    lse_online_merge(a.m, a.s, b.m, b.s);
    return a;
}
__device__ __forceinline__ XentState merge(XentState a, XentState b) {
    if (a.m != a.m || b.m != b.m) return XentState{a.m + b.m, a.s, a.st + b.st, a.stx + b.stx};
    if (b.m > a.m) { XentState t = a; a = b; b = t; }
    if (b.m == a.m) a.s += b.s;
    else if (b.m != acc_neg_inf()) a.s += b.s * exp(b.m - a.m);
    if (b.st != acc_t(0)) a.stx += b.m == a.m ? b.stx : b.stx - b.st * (a.m - b.m);
    else a.stx += b.stx;
    a.st += b.st;
    return a;
}
__device__ __forceinline__ void lse_push(LseState& st, acc_t x) { lse_online_push(st.m, st.s, x); }
__device__ __forceinline__ void xent_push(XentState& st, acc_t x, acc_t t) {
    if (x > st.m) {
        if (st.st != acc_t(0)) st.stx -= st.st * (x - st.m);
        st.s = st.s * exp(st.m - x) + acc_t(1);
        st.m = x;
    } else if (x != x) {
        st.m = x;
    } else if (x != acc_neg_inf()) {
        st.s += exp(x - st.m);
    }
    if (t != acc_t(0)) {
        st.st += t;
        st.stx += t * (x == acc_neg_inf() ? x : x - st.m);
    }
}
// lse of a finished state: m + log(s), or m itself when m is not finite (NumPy's
// log_sum_exp shifts by 0 then: -inf, inf and NaN maxima give -inf, inf, NaN).
__device__ __forceinline__ acc_t lse_of(acc_t m, acc_t s) { return is_finite_acc(m) ? m + log(s) : m; }

template <class S> __device__ __forceinline__ S shfl_xor(S v, int offset);
template <> __device__ __forceinline__ SumState shfl_xor(SumState v, int o) {
    return SumState{__shfl_xor_sync(GPUK_FULL_MASK, v.v, o)};
}
template <> __device__ __forceinline__ LseState shfl_xor(LseState v, int o) {
    return LseState{__shfl_xor_sync(GPUK_FULL_MASK, v.m, o), __shfl_xor_sync(GPUK_FULL_MASK, v.s, o)};
}
template <> __device__ __forceinline__ XentState shfl_xor(XentState v, int o) {
    return XentState{__shfl_xor_sync(GPUK_FULL_MASK, v.m, o), __shfl_xor_sync(GPUK_FULL_MASK, v.s, o),
                     __shfl_xor_sync(GPUK_FULL_MASK, v.st, o), __shfl_xor_sync(GPUK_FULL_MASK, v.stx, o)};
}
template <class S> __device__ __forceinline__ S warp_merge(S v) {
#pragma unroll
    for (int offset = 16; offset > 0; offset >>= 1) v = merge(v, shfl_xor(v, offset));
    return v;
}

// `width` lanes (a power of two <= 32, aligned within the warp) merge their states; the
// xor offsets stay inside the group, and for width 32 the order is warp_merge's.
template <class S> __device__ __forceinline__ S group_merge(S v, unsigned width) {
    for (unsigned offset = width >> 1; offset > 0; offset >>= 1) v = merge(v, shfl_xor(v, (int)offset));
    return v;
}

// The threads working on one row: `size` lanes of one warp (BLOCK = false: 32 lanes, or
// 1..32 lanes and 32 / size rows per warp for short rows) or the whole block.
template <bool BLOCK> struct RowGroup {
    unsigned rank, size;
    bool active;   // false: a sub-warp group past the last row; it joins the shuffles only
    // the one thread that writes the row's per-row results
    __device__ __forceinline__ bool leader() const { return rank == 0 && active; }
    // Every thread of the group gets the merged state; `identity` pads missing warps.
    template <class S> __device__ __forceinline__ S reduce(S v, S identity) const {
        if constexpr (!BLOCK) {
            return group_merge(v, size);
        } else {
            v = warp_merge(v);
            __shared__ S scratch[32];
            const unsigned lane = threadIdx.x & 31u, warp = threadIdx.x >> 5, nwarps = blockDim.x >> 5;
            if (lane == 0) scratch[warp] = v;
            __syncthreads();
            if (warp == 0) {
                S w = lane < nwarps ? scratch[lane] : identity;
                w = warp_merge(w);
                if (lane == 0) scratch[0] = w;
            }
            __syncthreads();
            const S result = scratch[0];
            __syncthreads();   // scratch is reused by the next reduction
            return result;
        }
    }
    __device__ __forceinline__ acc_t sum(acc_t v) const { return reduce(SumState{v}, SumState{acc_t(0)}).v; }
    __device__ __forceinline__ LseState lse(LseState v) const { return reduce(v, LseState{acc_neg_inf(), acc_t(0)}); }
    // f(j, Width1()/Width4()) for the elements j.. of the row this thread owns.
    template <class F> __device__ __forceinline__ void each(long long cols, bool vec, F f) const {
        if (!active) return;
        if (vec) {
            for (long long j = 4LL * rank; j < cols; j += 4LL * size) f(j, Width4());
        } else {
            for (long long j = rank; j < cols; j += size) f(j, Width1());
        }
    }
    // True when every thread owns at most one step (1 or 4 elements) of the row: the row
    // can be held in registers between a reduction and the pass that uses it.
    __device__ __forceinline__ bool single_step(long long cols, bool vec) const {
        return cols <= (long long)size * (vec ? 4 : 1);
    }
};

// Lanes per row for rows of at most SUB_WARP_MAX_COLS: the power of two that gives every
// lane one step (4 elements with vector access, else 1).
__device__ __forceinline__ unsigned sub_warp_lanes(long long cols, bool vec) {
    const long long steps = vec ? cols / 4 : cols;
    unsigned width = 1;
    while (width < steps && width < 32u) width <<= 1;
    return width;
}

// body(group, row) for every row this group / warp / block owns (uniform per warp or
// block, so every lane of a warp joins each shuffle). Sub-warp groups past the last row
// get active = false and row = rows - 1 (a valid index for per-row reads, never written).
template <class Body>
__device__ __forceinline__ void for_each_row(long long rows, long long cols, bool vec, Body body) {
    const long long warps = blockDim.x >> 5, warp = (long long)blockIdx.x * warps + (threadIdx.x >> 5);
    const unsigned lane = threadIdx.x & 31u;
    if (cols <= SUB_WARP_MAX_COLS) {
        const unsigned width = sub_warp_lanes(cols, vec), per_warp = 32u / width;
        for (long long first = warp * per_warp; first < rows; first += (long long)gridDim.x * warps * per_warp) {
            const long long row = first + lane / width;
            const RowGroup<false> g{lane % width, width, row < rows};
            body(g, row < rows ? row : rows - 1);
        }
    } else if (cols <= WARP_ROW_MAX_COLS) {
        const RowGroup<false> g{lane, 32u, true};
        for (long long row = warp; row < rows; row += gridDim.x * warps) body(g, row);
    } else {
        const RowGroup<true> g{threadIdx.x, blockDim.x, true};
        for (long long row = blockIdx.x; row < rows; row += gridDim.x) body(g, row);
    }
}

// ---- per-element row helpers: every row kernel below is built from these ----
// Each element of a row is visited by exactly one thread of the group, in the same order
// as a hand-written loop, so sums round exactly as they did before the helpers existed.
template <int W> struct Lanes { acc_t v[W]; };
template <int W> __device__ __forceinline__ Lanes<W> load_lanes(const elem_t* p) {
    Lanes<W> l;
    load_n<W>(p, l.v);
    return l;
}
// f(k, lanes[0].v[k], lanes[1].v[k], ...) for k = 0 .. W-1 (k is a constant after unrolling,
// so the lanes stay in registers).
template <int W, class F, class... L> __device__ __forceinline__ void for_lanes(F&& f, const L&... lanes) {
#pragma unroll
    for (int k = 0; k < W; ++k) f(k, lanes.v[k]...);
}
// f(column, x0, x1, ...) for each element of the row this thread owns, xi = rows_i[column]
// as acc_t; `rows` are the row starts of input buffers (all vec_ok when vec).
template <class G, class F, class... Rows>
__device__ __forceinline__ void each_element(const G& g, long long cols, bool vec, F f, Rows... rows) {
    g.each(cols, vec, [&](long long j, auto w) {
        constexpr int W = decltype(w)::n;
        for_lanes<W>([&](int k, auto... x) { f(j + k, x...); }, load_lanes<W>(rows + j)...);
    });
}
// The group's sum of f(column, x0, x1, ...) over the row (every thread gets it).
template <class G, class F, class... Rows>
__device__ __forceinline__ acc_t row_sum(const G& g, long long cols, bool vec, F f, Rows... rows) {
    acc_t partial = 0;
    each_element(g, cols, vec, [&](long long col, auto... x) { partial += f(col, x...); }, rows...);
    return g.sum(partial);
}
// out[column] = f(column, x0, x1, ...) over the row (`out` vec_ok when vec).
template <class G, class F, class... Rows>
__device__ __forceinline__ void row_map(const G& g, long long cols, bool vec, elem_t* out, F f, Rows... rows) {
    g.each(cols, vec, [&](long long j, auto w) {
        constexpr int W = decltype(w)::n;
        acc_t r[W];
        for_lanes<W>([&](int k, auto... x) { r[k] = f(j + k, x...); }, load_lanes<W>(rows + j)...);
        store_n<W>(out + j, r);
    });
}
// The log-sum-exp state of a row, merged over the group.
template <class G> __device__ __forceinline__ LseState row_lse(const G& g, const elem_t* xr, long long cols, bool vec) {
    LseState st{acc_neg_inf(), acc_t(0)};
    each_element(g, cols, vec, [&](long long, acc_t x) { lse_push(st, x); }, xr);
    return g.lse(st);
}

// softmax_rows_fwd: y = softmax(x) (log_output = 0) or log_softmax(x) (1), per row.
// Two reads of x (online max/sum, then the output), one write.
extern "C" __global__ void __launch_bounds__(ROW_THREADS, ROW_MIN_BLOCKS)
softmax_rows_fwd(const elem_t* __restrict__ x, elem_t* __restrict__ y, long long rows, long long cols, int log_output) {
    const bool vec = vec_ok(cols, x) && vec_ok(cols, y);
    for_each_row(rows, cols, vec, [&](const auto& g, long long row) {
        const elem_t* xr = x + row * cols;
        const LseState st = row_lse(g, xr, cols, vec);
        const acc_t lse = lse_of(st.m, st.s);
        // a non-finite max: NumPy computes exp(x) / sum(exp(x)) = exp(x) / exp(max)
        const bool finite = is_finite_acc(st.m);
        const acc_t inv_s = acc_t(1) / st.s, exp_m = exp(st.m);
        row_map(g, cols, vec, y + row * cols, [&](long long, acc_t v) {
            return log_output ? v - lse : (finite ? exp(v - st.m) * inv_s : exp(v) / exp_m);
        }, xr);
    });
}

// softmax_rows_bwd: dx = y (dy - sum(dy y)) (log_input = 0, y the softmax) or
// dx = dy - exp(y) sum(dy) (log_input = 1, y the log-softmax). Two reads, one write.
extern "C" __global__ void __launch_bounds__(ROW_THREADS, ROW_MIN_BLOCKS)
softmax_rows_bwd(const elem_t* __restrict__ y, const elem_t* __restrict__ dy, elem_t* __restrict__ dx, long long rows,
                 long long cols, int log_input) {
    const bool vec = vec_ok(cols, y) && vec_ok(cols, dy) && vec_ok(cols, dx);
    for_each_row(rows, cols, vec, [&](const auto& g, long long row) {
        const elem_t *yr = y + row * cols, *dyr = dy + row * cols;
        const acc_t total = row_sum(g, cols, vec, [&](long long, acc_t a, acc_t b) { return log_input ? b : a * b; },
                                    yr, dyr);
        row_map(g, cols, vec, dx + row * cols, [&](long long, acc_t a, acc_t b) {
            return log_input ? b - exp(a) * total : a * (b - total);
        }, yr, dyr);
    });
}

// softmax_xent_rows_fwd: loss = sum(t (lse - x)) and lse per row, in ONE read of x and t
// (XentState). 0 * (-inf) counts as 0. A row whose max is not finite gives lse = max
// and a NaN loss where the target is nonzero (NumPy: -inf - -inf).
extern "C" __global__ void __launch_bounds__(ROW_THREADS, ROW_MIN_BLOCKS)
softmax_xent_rows_fwd(const elem_t* __restrict__ logits, const elem_t* __restrict__ target, elem_t* __restrict__ loss,
                      acc_t* __restrict__ lse, long long rows, long long cols) {
    const bool vec = vec_ok(cols, logits) && vec_ok(cols, target);
    for_each_row(rows, cols, vec, [&](const auto& g, long long row) {
        XentState st{acc_neg_inf(), acc_t(0), acc_t(0), acc_t(0)};
        each_element(g, cols, vec, [&](long long, acc_t x, acc_t t) { xent_push(st, x, t); },
                     logits + row * cols, target + row * cols);
        st = g.reduce(st, XentState{acc_neg_inf(), acc_t(0), acc_t(0), acc_t(0)});
        if (g.leader()) {
            const bool finite = is_finite_acc(st.m);
            lse[row] = lse_of(st.m, st.s);
            loss[row] = from_acc(finite ? st.st * log(st.s) - st.stx : (st.st != acc_t(0) ? acc_nan() : acc_t(0)));
        }
    });
}

// softmax_xent_rows_bwd: dlogits = (exp(x - lse) sum(t) - t) dloss. Rows that the group
// holds in registers (one step per lane: every sub-warp row, warp rows up to 32 / 128
// classes) read x and t once; longer rows read t twice (sum, then the map), the second time
// from L1 for warp rows on a GPU. One write.
template <int W, class G>
__device__ __forceinline__ void xent_bwd_row_in_registers(const G& g, const elem_t* xr, const elem_t* tr, elem_t* out,
                                                          long long cols, acc_t row_lse, acc_t d) {
    const long long j = (long long)W * g.rank;
    const bool mine = g.active && j < cols;
    Lanes<W> x{}, t{};
    acc_t partial = 0;
    if (mine) {
        x = load_lanes<W>(xr + j);
        t = load_lanes<W>(tr + j);
        for_lanes<W>([&](int, acc_t v) { partial += v; }, t);
    }
    const acc_t total = g.sum(partial);   // every lane joins the shuffles
    if (mine) {   // the result overwrites x in registers (no third array: float64 builds spill-free)
#pragma unroll
        for (int k = 0; k < W; ++k) x.v[k] = (exp(x.v[k] - row_lse) * total - t.v[k]) * d;
        store_n<W>(out + j, x.v);
    }
}

extern "C" __global__ void __launch_bounds__(ROW_THREADS, XENT_BWD_MIN_BLOCKS)
softmax_xent_rows_bwd(const elem_t* __restrict__ logits, const elem_t* __restrict__ target,
                      const acc_t* __restrict__ lse, const acc_t* __restrict__ dloss, elem_t* __restrict__ dlogits,
                      long long rows, long long cols) {
    const bool vec = vec_ok(cols, logits) && vec_ok(cols, target) && vec_ok(cols, dlogits);
    for_each_row(rows, cols, vec, [&](const auto& g, long long row) {
        const elem_t *xr = logits + row * cols, *tr = target + row * cols;
        const acc_t row_lse = lse[row], d = dloss[row];
        if (g.single_step(cols, vec)) {   // uniform per group
            if (vec) xent_bwd_row_in_registers<4>(g, xr, tr, dlogits + row * cols, cols, row_lse, d);
            else xent_bwd_row_in_registers<1>(g, xr, tr, dlogits + row * cols, cols, row_lse, d);
            return;
        }
        const acc_t total = row_sum(g, cols, vec, [](long long, acc_t t) { return t; }, tr);
        row_map(g, cols, vec, dlogits + row * cols, [&](long long, acc_t x, acc_t t) {
            return (exp(x - row_lse) * total - t) * d;
        }, xr, tr);
    });
}

// softmax_xent_rows_dtarget: dtarget = (lse - x) dloss. One read, one write; no reduction.
extern "C" __global__ void __launch_bounds__(ROW_THREADS, ROW_MIN_BLOCKS)
softmax_xent_rows_dtarget(const elem_t* __restrict__ logits, const acc_t* __restrict__ lse,
                          const acc_t* __restrict__ dloss, elem_t* __restrict__ dtarget, long long rows, long long cols) {
    const bool vec = vec_ok(cols, logits) && vec_ok(cols, dtarget);
    for_each_row(rows, cols, vec, [&](const auto& g, long long row) {
        const acc_t row_lse = lse[row], d = dloss[row];
        row_map(g, cols, vec, dtarget + row * cols, [&](long long, acc_t x) { return (row_lse - x) * d; },
                logits + row * cols);
    });
}

// sparse_softmax_xent_rows_fwd: lse per row and loss = lse - x[label], in one read of x:
// the thread that meets the label's column keeps x there and the group sums it with the
// others' zeros (no gather of x[label] afterwards: with several short rows per warp those
// scattered 4-byte reads cost a sector each). Labels are checked in [0, cols) on the device
// by the launcher (an error raised later, gpuk/kernels/runtime/deferred.py); meanwhile a
// label out of range gives a NaN loss and is never used as an index.
extern "C" __global__ void __launch_bounds__(ROW_THREADS, ROW_MIN_BLOCKS)
sparse_softmax_xent_rows_fwd(const elem_t* __restrict__ logits, const long long* __restrict__ labels,
                             elem_t* __restrict__ loss, acc_t* __restrict__ lse, long long rows, long long cols) {
    const bool vec = vec_ok(cols, logits);
    for_each_row(rows, cols, vec, [&](const auto& g, long long row) {
        const long long label = labels[row];
        LseState st{acc_neg_inf(), acc_t(0)};
        acc_t picked = 0;
        each_element(g, cols, vec, [&](long long col, acc_t x) {
            lse_push(st, x);
            if (col == label) picked = x;
        }, logits + row * cols);
        st = g.lse(st);
        picked = g.sum(picked);   // x[label] + zeros: exact, inf and NaN included
        if (g.leader()) {
            const acc_t row_lse = lse_of(st.m, st.s);
            lse[row] = row_lse;
            loss[row] = from_acc(label >= 0 && label < cols ? row_lse - picked : acc_nan());
        }
    });
}

// sparse_softmax_xent_rows_bwd: dlogits = (exp(x - lse) - [j == label]) dloss. One read.
extern "C" __global__ void __launch_bounds__(ROW_THREADS, ROW_MIN_BLOCKS)
sparse_softmax_xent_rows_bwd(const elem_t* __restrict__ logits, const long long* __restrict__ labels,
                             const acc_t* __restrict__ lse, const acc_t* __restrict__ dloss,
                             elem_t* __restrict__ dlogits, long long rows, long long cols) {
    const bool vec = vec_ok(cols, logits) && vec_ok(cols, dlogits);
    for_each_row(rows, cols, vec, [&](const auto& g, long long row) {
        const long long label = labels[row];
        const acc_t row_lse = lse[row], d = dloss[row];
        row_map(g, cols, vec, dlogits + row * cols, [&](long long col, acc_t x) {
            return (exp(x - row_lse) - (col == label ? acc_t(1) : acc_t(0))) * d;
        }, logits + row * cols);
    });
}

// categorical_xent_probs_rows: Keras categorical cross-entropy of probabilities,
// p = probs / sum(probs) clipped to [eps, 1 - eps]:
//   mode 0 (fwd):      loss = -sum(t log clip(p))                       two reads
//   mode 1 (bwd):      g = -t / clip(p) inside the clip range, else 0;
//                      dprobs = (g - sum(g p)) / sum(probs) dloss        three reads
//   mode 2 (dtarget):  dtarget = -log(clip(p)) dloss                     two reads
// epsilon is a 1-element buffer (a double scalar argument cannot be passed: the
// runtime rejects numpy.float64, a float subclass). `target` is unused (pass probs) in mode 2; `out_row` (loss) is written in mode 0 only,
// `out` in modes 1 and 2.
// The divisions by the row total stay divisions (not a multiplication by its reciprocal):
// clip() compares p / total with epsilon, and a 1-ulp change there can move an element
// across the clip boundary, a difference far beyond the tolerance policy.
extern "C" __global__ void __launch_bounds__(ROW_THREADS, ROW_MIN_BLOCKS)
categorical_xent_probs_rows(const elem_t* __restrict__ probs, const elem_t* __restrict__ target,
                            const acc_t* __restrict__ dloss, elem_t* __restrict__ out, elem_t* __restrict__ out_row,
                            long long rows, long long cols, int mode, const acc_t* __restrict__ epsilon_ptr) {
    const acc_t epsilon = *epsilon_ptr;
    const bool vec = vec_ok(cols, probs) && vec_ok(cols, target) && (mode == 0 || vec_ok(cols, out));
    const acc_t hi = acc_t(1) - epsilon;
    for_each_row(rows, cols, vec, [&](const auto& g, long long row) {
        const elem_t *pr = probs + row * cols, *tr = target + row * cols;
        const acc_t total = row_sum(g, cols, vec, [](long long, acc_t p) { return p; }, pr);
        if (mode == 0) {
            const acc_t loss = row_sum(g, cols, vec, [&](long long, acc_t p, acc_t t) {
                return t * log(clip(p / total, epsilon, hi));
            }, pr, tr);
            if (g.leader()) out_row[row] = from_acc(-loss);
            return;
        }
        const acc_t d = dloss[row];
        if (mode == 2) {
            row_map(g, cols, vec, out + row * cols, [&](long long, acc_t p) {
                return -log(clip(p / total, epsilon, hi)) * d;
            }, pr);
            return;
        }
        // mode 1: g(p) and its projection on p (the normalization's Jacobian)
        auto grad_of = [&](acc_t p, acc_t t) {
            const acc_t q = p / total;
            return (q >= epsilon && q <= hi) ? -t / clip(q, epsilon, hi) : acc_t(0);
        };
        const acc_t projection = row_sum(g, cols, vec, [&](long long, acc_t p, acc_t t) {
            return grad_of(p, t) * (p / total);
        }, pr, tr);
        row_map(g, cols, vec, out + row * cols, [&](long long, acc_t p, acc_t t) {
            return (grad_of(p, t) - projection) / total * d;
        }, pr, tr);
    });
}

// binary_xent_elementwise: the elementwise binary cross-entropy family (op codes above).
//   logits: fwd  max(x,0) - x z + log1p(exp(-|x|)) (written so an infinite x with zero
//                weight on its side gives 0), bwd (sigmoid(x) - z) d, dtarget -x d;
//   probs:  q = clip(p, eps, 1 - eps); fwd -(z log q + (1 - z) log(1 - q)),
//           bwd (-z / q + (1 - z) / (1 - q)) d inside the clip range (else 0),
//           dtarget (log(1 - q) - log q) d.
// a is logits/probs; b is target, or dloss for the dtarget ops; c is dloss (bwd ops).
// Thread mapping: 1-D grid-stride loop over n. No shared memory, no atomics.
extern "C" __global__ void __launch_bounds__(BINARY_THREADS, ROW_MIN_BLOCKS)
binary_xent_elementwise(const elem_t* __restrict__ a, const elem_t* __restrict__ b, const elem_t* __restrict__ c,
                        elem_t* __restrict__ out, long long n, int op, const acc_t* __restrict__ epsilon_ptr) {
    const acc_t one = 1, zero = 0, epsilon = *epsilon_ptr;
    GPUK_GRID_STRIDE_LOOP(i, n) {
        const acc_t x = to_acc(a[i]), z = to_acc(b[i]);
        acc_t r;
        switch (op) {
        case BINARY_LOGITS_FWD: {
            const acc_t w = x >= zero ? one - z : z;
            const acc_t linear = w == zero ? zero : w * (x >= zero ? x : -x);
            r = linear + log1p(exp(-fabs(x)));
            break;
        }
        case BINARY_LOGITS_BWD: {
            // sigmoid(x) = exp(-logaddexp(0, -x)): no overflow for x << 0
            const acc_t sig = x >= zero ? one / (one + exp(-x)) : exp(x) / (one + exp(x));
            r = (sig - z) * to_acc(c[i]);
            break;
        }
        case BINARY_LOGITS_DTARGET: r = -x * z; break;
        case BINARY_PROBS_FWD: {
            const acc_t q = clip(x, epsilon, one - epsilon);
            r = -(z * log(q) + (one - z) * log1p(-q));
            break;
        }
        case BINARY_PROBS_BWD: {
            const acc_t q = clip(x, epsilon, one - epsilon);
            r = (x >= epsilon && x <= one - epsilon) ? (-z / q + (one - z) / (one - q)) * to_acc(c[i]) : zero;
            break;
        }
        default: {   // BINARY_PROBS_DTARGET
            const acc_t q = clip(x, epsilon, one - epsilon);
            r = (log1p(-q) - log(q)) * z;
            break;
        }
        }
        out[i] = from_acc(r);
    }
}
