// conv_igemm_loaders.cuh: conv_igemm.cu's per-mode operand loaders, Loader<MODE_FWD>,
// Loader<MODE_DGRAD> and Loader<MODE_WGRAD> (with wgrad's A mapping, WG_*, and its packed bounds
// test, WgradPack): built once per block, then load() issues one K tile's copies.
// Relies on: the variant macros CONV_MATH, CONV_BM, CONV_BN, CONV_BK, CONV_STAGES, CONV_THREADS,
// CONV_WARPS_N, MODE_*; conv_igemm_layout.cuh, conv_igemm_index.cuh (WgradDecode),
// conv_igemm_gather.cuh (GatherA, RowStream, the copies); ConvGeom, DgradPhase (conv_common.cuh).
//
// Loads (Loader<MODE>): fwd/dgrad decode their indices (divisions) once per block: each thread
// keeps, per A row it loads, a pointer to the row's window origin, and one (tap, channel)
// position for all its chunks (they share k; a TapCursor on the 16-byte path, a TapIter on the
// per-element one), advanced every K tile by adds and a wrap compare (the cursor's tap wrap:
// shifts and selects, no nested branches). wgrad keeps, per chunk column, the fixed (tap,
// channel) as a source pointer for the window origin at pixel 0, and decodes the K position of
// each k row it loads (1 or 2) afresh every K tile by multiply-shift divisions into its window
// origin's pixel index and packed coordinates, linear forms of the quotients (PixDecode,
// PixLinear: constants the launcher computes, read from the constant bank): no state carried
// across tiles, no branch. Row-major operands
// (fwd w, wgrad dy) are a pointer plus a count of K rows left (RowStream). Rows past the end get a far-outside origin
// (or an empty tap mask), so one bounds check covers padding and tails; zero-filled chunks
// pass their address unread. No thread returns early (dgrad blocks past their phase's rows
// exit whole).
// Vector path (channel counts that are multiples of VEC = 16 bytes / element, 16-byte-aligned
// pointers, tap offsets within 32 bits): one 16-byte zero-filling cp.async per VEC neighbouring
// channels, which share one padding check; fwd/dgrad test it with the row's tap mask (one LOP3
// per chunk, see tap_masks_fit) and address the chunk as row pointer + one 32-bit tap offset
// shared by the thread's chunks; dgrad's filter chunks step a 32-bit offset with the cursor;
// wgrad packs the pixel's window origin and each chunk's tap offsets into 32-bit words with
// guard bits (WgradPack: two adds and a LOP3 per chunk) where the image fits the fields (d <
// 2^7, h < 2^10, w < 2^12 coordinates, pads included; checked per block, else three compares:
// pipeline<MODE, true, PACKED>). Otherwise each element is copied on its own
// (cp.async of 4/8 bytes; 16-bit elements synchronously; copy_tap_run), the K loop rotating
// its stages instead of unrolling them. The choice is made once per block, outside the K loop
// (pipeline<MODE, VECTOR>).
// Tap tiles (TAP_TILES: the tf32 64x64x32 and 128x128x16 tiles; pipeline<MODE, true, false, true>):
// where the gathered channel count (fwd C_in, dgrad C_out) is a multiple of CONV_BK, each K tile lies
// in one tap, so a thread copies TAP_UNITS chunks (4 at BK = 32, 2 at BK = 16) of each of 2 rows (row
// address + immediates, one tap-mask test per row), fwd's filter rows whole by TAP_LANES lanes (2 on
// 64x64x32, 8 on 128x128x16) where the block's columns all lie before C_out (RowStream::load_tap:
// one address step and row test per K tile), dgrad's filter rows through pointers stepped with the
// cursor; the cursor wraps at most once per tile, and the untested groups run. Other instructions
// per MMA (inspect, no GPU), 64x64x32: 2.75 -> 1.95 fwd, 2.36 -> 1.85 dgrad on sm_90 (3.71 -> 2.92,
// 3.54 -> 2.81 on sm_80, where A's rounding alone is 1.5); 128x128x16 (A rounded in shared memory
// along the mapping): sm_80 2.21 -> 1.89 fwd, 2.16 -> 1.93 dgrad (sm_90 1.75 -> 1.41, 1.73 -> 1.55);
// other channel counts keep the chunk mapping (64x64x32: 2.56 / 2.39 sm_90; 128x128x16: 2.21 / 2.16
// sm_80, 1.75 / 1.86 sm_90). wgrad's tap groups (WG_TAP_GROUPS, the same
// tile; pipeline<MODE_WGRAD, true, true, TAP>): where C_in is a multiple of 32, each half of a
// thread's 8 A chunks (units lane % 2 + 2j of its k row) lies in one tap (TAP 1), where it is a
// multiple of 64 the whole row (TAP 2), so a half (a row) takes one address and one packed bounds
// test for its 4 (8) chunks; in the untested groups the two lanes of a row decode two tiles' K
// positions, one each, and swap them by shuffles (WG_SHARED_DECODE); dy's chunks are copied in
// unit pairs, one address per row for two chunks (RowStream<true>::UNIT_PAIRS). Other
// instructions per MMA (inspect, no GPU): 3.16 -> 2.69 -> 2.49 on sm_90 (532 -> 472 -> 447
// instructions per 128 MMAs; C_in a multiple of 32 only: 459, 2.59), 5.38 -> 4.62 on sm_80 (its
// tap loop had 136 register moves while placed first, see igemm_mainloop). Still above 2, and not
// reachable on this design: both wgrad operands are activations, rounded in the loop at one
// conversion per element, which on a 64x64 tile is 1.0 per MMA (32 (BM + BN) / (BM BN) elements
// per MMA, whatever the warps), and the copies (0.25), A's 8-byte fragment reads (0.25), B's
// ldmatrix fragments (0.25) and its transposing pass (ldmatrix + store: 0.25) add 1.0 more before
// any address, index or pipeline instruction (docs/kernels.md, "The tf32 64x64 wgrad's floor").

#pragma once

// The per-thread loader state of one operand tile stream. Built once per block (the only
// divisions), then load() issues one K tile and steps every iterator by CONV_BK.
template <int MODE> struct Loader;

// fwd: A = im2col(x) [m = (n, output pixel)][k = (tap, c_in)]; B = w as (taps*C_in, C_out).
template <> struct Loader<MODE_FWD> {
    GatherA a;
    RowStream<false> b;
    bool a_vec, b_vec;

    __device__ __forceinline__ static Source source(const ConvGeom& g) {
        return Source{g.in_d, g.in_h, g.in_w, g.c_in, g.in_pix};
    }
    __device__ __forceinline__ void init(const ConvGeom& g, const elem_t* x, const elem_t* w, long long rows,
                                         long long k_begin, long long k_end) {
        const RowGrid grid{g.out_d, g.out_h, g.out_w, g.s_d, g.s_h, g.s_w, -g.pad_d, -g.pad_h, -g.pad_w};
        // (the conditions in this order, the tap-tile one folded away where TAP_TILES is 0: computing
        // b_vec ahead of a.init moved the 16-bit builds' registers, +6 instructions in one loop)
        // (tap tiles: where the block's columns all lie before C_out, RowStream::load_tap)
        a.init(source(g), grid, dense_taps(g, 0, 0, 0), x, rows, k_begin,
               TAP_TILES && x_vec(g, x) && w_vec(g, w) && (int)(blockIdx.y + 1) * CONV_BN <= g.c_out);
        b.init(w, k_begin, k_end, g.c_out, a.tap_tiles);
        a_vec = a.fast && x_vec(g, x);
        b_vec = w_vec(g, w);
    }
    __device__ __forceinline__ static bool x_vec(const ConvGeom& g, const elem_t* x) {
        return g.c_in % VEC == 0 && is_aligned(x, 16);
    }
    __device__ __forceinline__ static bool w_vec(const ConvGeom& g, const elem_t* w) {
        return g.c_out % VEC == 0 && is_aligned(w, 16) && RowStream<false>::fits(g.c_out);
    }
    template <bool VECTOR, bool TAP = false>
    __device__ __forceinline__ void load(const ConvGeom& g, const elem_t* __restrict__ x,
                                         const elem_t* __restrict__ w, elem_t* as, elem_t* bs, int cols) {
        const TapSeq taps = dense_taps(g, 0, 0, 0);
        a.load<VECTOR, TAP>(source(g), taps, x, as);
        if constexpr (VECTOR) a.at.advance<TAP>(taps, g.c_in, [](bool, bool) {});
        else a.k.advance(taps, CONV_BK, g.c_in);
        if constexpr (TAP) b.load_tap(bs, g.c_out);
        else b.load<VECTOR>(bs, g.c_out, cols);
    }
};

// dgrad, one stride phase (DgradPhase): A[(n, q), (tap, co)] = dy[n, q + offset(tap), co];
// B[(tap, co), ci] = w[tap, ci, co], stored [n=ci][k]. A and B chunks of a thread sit at the
// same k, so A's TapIter also steps B.
template <> struct Loader<MODE_DGRAD> {
    GatherA a;
    TapSeq taps;
    int b_ci;   // this thread's chunk-0 input channel
    // 16-byte path: w at (k's tap, ci, k's c_out channel) as an offset from w + b_ci * C_out,
    // stepped with A's cursor: CONV_BK per tile, and at each tap wrap one of three steps
    unsigned b_off, b_step_w, b_step_h, b_step_d;
    // tap tiles: each of the thread's B rows (input channels) at the K tile's (tap, c_out), stepped
    // as b_off (steps >= 0): one 64-bit add per row and tile, where b_off's sign extension, add to
    // the row's 64-bit offset and scaling took about 5
    const elem_t* b_row[TAP_TILES ? TAP_ROWS(CONV_BN) : 1];
    bool a_vec, b_vec;

    __device__ __forceinline__ static Source source(const ConvGeom& g) {
        return Source{g.out_d, g.out_h, g.out_w, g.c_out, g.out_pix};
    }
    __device__ __forceinline__ void init(const ConvGeom& g, const DgradPhase& phase, const elem_t* dy,
                                         const elem_t* w) {
        taps = phase.taps;
        const RowGrid grid{phase.q_d, phase.q_h, phase.q_w, 1, 1, 1, 0, 0, 0};
        a.init(source(g), grid, taps, dy, phase.rows, 0, TAP_TILES && dy_vec(g, dy) && w_vec(g, w));   // (as fwd's)
        b_ci = blockIdx.y * CONV_BN + (TAP_TILES && a.tap_tiles ? tap_row(0) : chunk_row(0, CONV_BK));
        a_vec = a.fast && dy_vec(g, dy);
        b_vec = w_vec(g, w);
        if (a_vec && b_vec) {
            const unsigned cico = (unsigned)g.c_in * (unsigned)g.c_out, co = (unsigned)g.c_out;
            const unsigned tw = (unsigned)taps.w.kstep, th = (unsigned)(taps.h.kstep * taps.size_w),
                           td = (unsigned)(taps.d.kstep * taps.size_h * taps.size_w);
            const unsigned back_w = (unsigned)(taps.w.count - 1) * tw, back_h = (unsigned)(taps.h.count - 1) * th;
            b_step_w = tw * cico - co;
            b_step_h = (th - back_w) * cico - co;
            b_step_d = (td - back_h - back_w) * cico - co;
            b_off = (unsigned)a.k.tap(taps) * cico + (unsigned)a.k.c;
        }
        if constexpr (TAP_TILES) {
#pragma unroll
            for (int r = 0; r < TAP_ROWS(CONV_BN); ++r)
                b_row[r] = w + (long long)(b_ci + r * TAP_ROWS_PER_PASS) * g.c_out + b_off;
        }
    }
    __device__ __forceinline__ static bool dy_vec(const ConvGeom& g, const elem_t* dy) {
        return g.c_out % VEC == 0 && is_aligned(dy, 16);
    }
    // the filter offsets of the 16-byte path fit 32 bits (past the filter they may wrap: unread)
    __device__ __forceinline__ static bool w_vec(const ConvGeom& g, const elem_t* w) {
        return g.c_out % VEC == 0 && is_aligned(w, 16) && ((long long)g.taps + 1) * g.c_in * g.c_out < (1ll << 31);
    }
    template <bool VECTOR, bool TAP = false>
    __device__ __forceinline__ void load(const ConvGeom& g, const elem_t* __restrict__ dy,
                                         const elem_t* __restrict__ w, elem_t* as, elem_t* bs, int cols) {
        a.load<VECTOR, TAP>(source(g), taps, dy, as);
        const int kc = chunk_pos(CONV_BK);
        if constexpr (TAP) {   // B as A: TAP_ROWS input channels per thread, TAP_UNITS chunks each
            const bool in_filter = a.at.in_filter(taps);
#pragma unroll
            for (int r = 0; r < TAP_ROWS(CONV_BN); ++r) {
                const elem_t* src_row = b_row[r];   // at unit tap_unit(0)
                const bool valid = in_filter && b_ci + r * TAP_ROWS_PER_PASS < cols;
#pragma unroll
                for (int i = 0; i < TAP_UNITS; ++i)
                    copy_chunk(bs + tile_index<true, CONV_BN>(tap_row(r), tap_unit(i) * VEC), src_row + 2 * i * VEC, valid);
            }
            unsigned step = CONV_BK;
            a.at.advance<true>(taps, g.c_out, [&](bool w_end, bool h_end) {
                step += w_end ? (h_end ? b_step_d : b_step_h) : b_step_w;
            });
#pragma unroll
            for (int r = 0; r < TAP_ROWS(CONV_BN); ++r) b_row[r] += step;
        } else if constexpr (VECTOR) {
            const int filter_pass = ROWS_PER_PASS(CONV_BK) * g.c_out;   // < 2^31: b_vec
            const elem_t* tap_w = w + (long long)b_ci * g.c_out + (int)b_off;
            const bool in_filter = a.at.in_filter(taps);
#pragma unroll
            for (int j = 0; j < B_CHUNKS_PER_THREAD; ++j)
                copy_chunk(bs + tile_index<true, CONV_BN>(chunk_row(j, CONV_BK), kc), tap_w + j * filter_pass,
                           in_filter && b_ci + j * ROWS_PER_PASS(CONV_BK) < cols);
            b_off += CONV_BK;
            a.at.advance(taps, g.c_out, [&](bool w_end, bool h_end) {
                b_off += w_end ? (h_end ? b_step_d : b_step_h) : b_step_w;
            });
        } else {
#pragma unroll
            for (int j = 0; j < B_CHUNKS_PER_THREAD; ++j) {
                const int ci = b_ci + j * ROWS_PER_PASS(CONV_BK);
                copy_tap_run(bs + tile_index<true, CONV_BN>(chunk_row(j, CONV_BK), kc), w, taps, a.k, g.c_out,
                             ci < cols, [&](const TapIter& t, const elem_t*& at) {
                                 at = w + ((long long)t.tap(taps) * g.c_in + ci) * g.c_out + t.c;
                                 return t.in_filter(taps);
                             });
            }
            a.k.advance(taps, CONV_BK, g.c_out);
        }
    }
};

// wgrad: A[(tap, ci), (n, output pixel)] = x[n, o*s + tap*dil - pad, ci], stored [k][m];
// B = dy as (N*OP, C_out), stored [k][n] (a RowStream).
// A's chunks: WG_LANES threads share each k row (one output pixel), so that a warp's copies
// read whole 32-byte sectors (neighbouring lanes, neighbouring 16-byte units of one pixel);
// each thread copies WG_ROWS k rows (2 where the block has as many threads as K rows, the
// f16 64x64x64 tile; else 1), THREADS / WG_LANES rows apart, and WG_CHUNKS chunks along m in
// each (wgrad_a_unit). Each K tile decodes each row's pixel once for its chunks (PixDecode; two
// lanes sharing two rows decode one each and swap, WG_PAIRED), and each chunk column keeps its
// fixed (tap, channel) as a 32-bit offset from the pixel's window origin plus the tap's spatial
// offsets for the bounds check (shared by the thread's rows).
#define WG_LANES (CONV_THREADS / CONV_BK >= 2 ? CONV_THREADS / CONV_BK : 2)
#define WG_ROWS (CONV_BK * WG_LANES / CONV_THREADS)
#define WG_CHUNKS (A_CHUNKS_PER_THREAD / WG_ROWS)
static_assert(WG_ROWS * CONV_THREADS == CONV_BK * WG_LANES && WG_LANES * WG_CHUNKS * VEC == CONV_BM &&
              (WG_CHUNKS & (WG_CHUNKS - 1)) == 0 && (CONV_THREADS / WG_LANES) % WG_CHUNKS == 0,
              "wgrad A: whole k rows per thread, 2^n chunks per row");
// Packed path: the two lanes that share a thread's two k rows decode one each (Loader::load).
#define WG_PAIRED (WG_ROWS == 2 && WG_LANES % 2 == 0)
// tf32 wgrad's A, where rounded in shared memory (CONV_WARPS_N > 1) and copied one k row per 8 lanes
// (lane 8i + g of warp w: row 4w + i, units g + 8j): a warp holds whole 4 x 4 blocks, which its
// rounding pass stores transposed like B's (TF32_B_TRANSPOSED, K4Transposed), and ldmatrix reads
// the MMA's A fragments in the plain row order (not Tf32Order's paired rows).
#define TF32_A_TRANSPOSED (CONV_MATH == 2 && CONV_WARPS_N > 1 && WG_LANES == 8 && WG_ROWS == 1)
__device__ __forceinline__ int wgrad_a_row(int r) { return threadIdx.x / WG_LANES + r * (CONV_THREADS / WG_LANES); }
// The row a thread decodes first: its own (lane & 1) of the pair's two where WG_PAIRED, else its row 0.
__device__ __forceinline__ int wgrad_decoded_row() { return wgrad_a_row(WG_PAIRED ? threadIdx.x & 1 : 0); }
// The 16-byte unit of chunk j along m: a row's units are dealt to its lanes in turn and
// in swizzled tiles permuted per row (j ^ row; a thread's rows share the low bits), so that the
// 8 chunks a quarter warp writes at once land in 8 distinct bank groups. tf32's padded k-major
// rows (a stride of 2 mod 8 units, see SMEM_PAD_K) need no permutation: there j ^ row would put
// rows 0 and 2 of the 64x64 tile (2 threads per row) on the same groups.
__device__ __forceinline__ int wgrad_a_unit(int j) {
    const int permute = SMEM_PAD_K ? 0 : wgrad_a_row(0) & (WG_CHUNKS - 1);
    return threadIdx.x % WG_LANES + WG_LANES * (j ^ permute);
}
// WgradPack: the wgrad 16-byte path's bounds test, "0 <= origin + tap < size on d, h and w",
// in one add per side and one AND. A coordinate v of an axis of size S gets a W-bit field
// (d: 8, h: 11, w: 13 bits; half = 2^(W-1)) in two 32-bit words: up = v + half - S and
// lo = half - 1 - v. While every reachable v lies in [S - half, half - 1] (fits(), per block)
// both stay in [0, 2^W), so the fields never carry into each other, and a field's top (guard)
// bit is set exactly when v >= S (up) or v < 0 (lo). The words are linear in v: up = origin +
// (tap + up_bias), the tap term fixed per chunk column, the origin packed once per row and tile,
// and lo = bounds - up (bounds = up_bias + lo_bias, per block; lo = lo_bias - tap - origin), so a
// chunk column keeps one word (a register each; two words were recomputed every K tile instead). Rows past k_end take fake_origin() (w = -1 - last tap)
// and chunks past the filter far_tap() (w = -1 - the largest origin), both outside on w.
// Larger images (or pads) keep the three compares (Loader<MODE_WGRAD>::load<true, false>), and so do
// tiles with fewer than 4 chunks per row (f64): there the per-tile packing and biases cost more
// than the 3 instructions a chunk saves.
#define WG_PACKED (WG_CHUNKS >= 4)
// Tap groups (the tf32 64x64 tile, TAP_TILES): a thread's WG_CHUNKS = 8 chunks of its k row are units
// lane % 2 + 2j; chunks 0-3 lie in the row's first WG_TAP_SPAN elements along m, 4-7 in its second.
// Where C_in is a multiple of that span (and the block's m0 of it: CONV_BM = 2 spans), each group lies
// in one tap: one address (the 64-bit add of the row's pixel offset) and one packed bounds test per
// group and K tile instead of one per chunk (Loader<MODE_WGRAD>::load<..., TAP = 1>); where C_in is a
// multiple of CONV_BM, the whole row lies in one tap: one address and one test per row and K tile
// (TAP = 2; Loader::a_tap says which, per block). Per 128 MMAs (with the shared decode and dy's unit
// pairs below): halves 459 instructions on sm_90, 730 on sm_80; whole rows 447 / 720.
#define WG_TAP_GROUPS (TAP_TILES && WG_LANES == 2 && WG_ROWS == 1 && WG_CHUNKS == 8 && WG_PACKED)
#define WG_TAP_CHUNKS 4
// Shared decode (the tf32 64x64 wgrad's packed path, tap groups and per chunk, in the untested
// pipeline groups of an even stage count): the two lanes of a k row (WG_LANES = 2) decoded the same K
// position, so each decodes one of two tiles' (its pair's row in this tile, lane & 1 == 0, or in the
// next one) and the pair swaps them by shuffles: per two tiles one decode and 4 SHFL per thread
// instead of two decodes (Loader<MODE_WGRAD>::load, SHARED; sm_90: halves 472 -> 463, per chunk
// 528 -> 517 instructions per 128 MMAs).
#define WG_SHARED_DECODE (WG_TAP_GROUPS && CONV_STAGES % 2 == 0)
#define WG_TAP_SPAN (CONV_BM / 2)
static_assert(!WG_TAP_GROUPS || (WG_TAP_SPAN == WG_LANES * WG_TAP_CHUNKS * VEC && CONV_BM == 2 * WG_TAP_SPAN),
              "tap groups: two halves of the row");
struct WgradPack {
    static constexpr int W_BITS = 13, H_BITS = 11, D_BITS = 8;
    static constexpr int H_SHIFT = W_BITS, D_SHIFT = W_BITS + H_BITS;   // also in conv/geometry.py (WGRAD_PACK_*)
    static_assert(D_SHIFT + D_BITS == 32, "three fields fill 32 bits");
    static constexpr unsigned GUARD = (1u << (W_BITS - 1)) | (1u << (H_SHIFT + H_BITS - 1)) | (1u << 31);
    __device__ __forceinline__ static unsigned pack(int d, int h, int w) {   // mod 2^32: exact once added up
        return ((unsigned)d << D_SHIFT) + ((unsigned)h << H_SHIFT) + (unsigned)w;
    }
    __device__ __forceinline__ static unsigned up_bias(const ConvGeom& g) {
        return pack((1 << (D_BITS - 1)) - g.in_d, (1 << (H_BITS - 1)) - g.in_h, (1 << (W_BITS - 1)) - g.in_w);
    }
    __device__ __forceinline__ static unsigned lo_bias() {
        return pack((1 << (D_BITS - 1)) - 1, (1 << (H_BITS - 1)) - 1, (1 << (W_BITS - 1)) - 1);
    }
    __device__ __forceinline__ static unsigned bounds(const ConvGeom& g) { return up_bias(g) + lo_bias(); }
    __device__ __forceinline__ static bool inside(unsigned up, unsigned bounds) { return ((up | (bounds - up)) & GUARD) == 0; }
    __device__ __forceinline__ static long long first(const TapDim& t) { return t.o0; }
    __device__ __forceinline__ static long long last(const TapDim& t) { return t.o0 + (long long)(t.count - 1) * t.ostep; }
    __device__ __forceinline__ static long long lesser(long long a, long long b) { return a < b ? a : b; }
    __device__ __forceinline__ static long long greater(long long a, long long b) { return a > b ? a : b; }
    __device__ __forceinline__ static long long tap_min(const TapDim& t) { return lesser(first(t), last(t)); }
    __device__ __forceinline__ static long long tap_max(const TapDim& t) { return greater(first(t), last(t)); }
    __device__ __forceinline__ static int fake_w(const ConvGeom& g, const TapSeq& taps) { return (int)(-1 - tap_max(taps.w)); }
    __device__ __forceinline__ static unsigned fake_origin(const ConvGeom& g) {
        return pack(0, 0, fake_w(g, dense_taps(g, -g.pad_d, -g.pad_h, -g.pad_w)));
    }
    __device__ __forceinline__ static int far_tap(const ConvGeom& g, const TapSeq& taps) {
        return (int)(-1 - greater((long long)(g.out_w - 1) * g.s_w, fake_w(g, taps)));
    }
    // every reachable coordinate v of the axis within [size - half, half - 1]
    __device__ __forceinline__ static bool axis_fits(long long vmin, long long vmax, long long size, int bits) {
        const long long half = 1ll << (bits - 1);
        return vmin >= size - half && vmax <= half - 1;
    }
    __device__ __forceinline__ static bool fits(const ConvGeom& g, const TapSeq& taps) {
        const long long od = (long long)(g.out_d - 1) * g.s_d, oh = (long long)(g.out_h - 1) * g.s_h;
        const long long ow = (long long)(g.out_w - 1) * g.s_w, fake = fake_w(g, taps), far = far_tap(g, taps);
        // d, h: origins [0, o], taps [min, max] (the far chunks use the first tap, the fake origin 0);
        // w: origins [0, ow] and the fake one, taps [min, max] and the far one
        return axis_fits(tap_min(taps.d), od + tap_max(taps.d), g.in_d, D_BITS) &&
               axis_fits(tap_min(taps.h), oh + tap_max(taps.h), g.in_h, H_BITS) &&
               axis_fits(lesser(0, fake) + lesser(tap_min(taps.w), far), greater(ow, fake) + greater(tap_max(taps.w), far),
                         g.in_w, W_BITS);
    }
};

template <> struct Loader<MODE_WGRAD> {
    WgradDecode decode;                   // K position -> quotients -> window origin (pixel, packed)
    unsigned k_row;                       // K position of wgrad_decoded_row() in the next tile (< 2^32)
    TapIter a_m[WG_CHUNKS];               // chunk j's (tap, ci) column, fixed for the block (per-element path)
    const elem_t* a_base[WG_CHUNKS];      // 16-byte path: chunk j's source for the window origin at pixel 0
    int a_td[WG_CHUNKS], a_th[WG_CHUNKS], a_tw[WG_CHUNKS];   // its tap's offsets
    unsigned a_up[WG_CHUNKS];             // packed path: its tap + WgradPack::up_bias
    RowStream<TF32_B_TRANSPOSED> b;       // b.row_before_end: whether a k row of the next tile is before k_end
    bool a_vec, b_vec, a_packed;          // a_packed: the image fits WgradPack (16-byte path only)
    int a_tap;                            // tap groups (WG_TAP_GROUPS): 2 where C_in is a multiple of the whole
                                          // row's span (CONV_BM), 1 of a half's (WG_TAP_SPAN), else 0
    unsigned shared_pixel, shared_at;     // WG_SHARED_DECODE: this lane's decoded row (its tile: lane & 1)

    __device__ __forceinline__ void init(const ConvGeom& g, const WgradDecode& wgrad_decode, const elem_t* x,
                                         const elem_t* dy, long long k_begin, long long k_end) {
        const TapSeq taps = dense_taps(g, -g.pad_d, -g.pad_h, -g.pad_w);
        decode = wgrad_decode;
        k_row = (unsigned)k_begin + (unsigned)wgrad_decoded_row();
        // 16-byte path: x's pixels (all images) fit 32 bits, and so does every row's window origin
        // as a pixel index (PixLinear computes it mod 2^32; padding can put origins past x's
        // pixels), so a chunk's address is its a_base plus that index times C_in (one IMAD.WIDE.U32)
        const long long last_origin =
            ((((long long)g.batch - 1) * g.in_d + (long long)(g.out_d - 1) * g.s_d) * g.in_h +
             (long long)(g.out_h - 1) * g.s_h) * g.in_w + (long long)(g.out_w - 1) * g.s_w;
        const bool fits = (long long)g.batch * g.in_pix < (1ll << 31) && last_origin < (1ll << 32);
#pragma unroll
        for (int j = 0; j < WG_CHUNKS; ++j) {
            TapIter& t = a_m[j];
            t.start(taps, blockIdx.x * CONV_BM + wgrad_a_unit(j) * VEC, g.c_in);
            const bool inside = t.in_filter(taps);   // false past the last (tap, ci) column
            a_td[j] = inside ? t.od : FAR_OUTSIDE;
            a_th[j] = t.oh;
            a_tw[j] = t.ow;
            // (an address for the zero-filled chunks past the filter too; a_base itself may lie before x)
            a_base[j] = x + (inside ? ((long long)(t.od * g.in_h + t.oh) * g.in_w + t.ow) * g.c_in + t.c : 0);
            // past the filter: a w offset that puts every origin (the rows' and the fake) left of 0
            const unsigned tap = WgradPack::pack(inside ? t.od : taps.d.o0, inside ? t.oh : taps.h.o0,
                                                 inside ? t.ow : WgradPack::far_tap(g, taps));
            a_up[j] = tap + WgradPack::up_bias(g);
        }
        a_packed = WG_PACKED && WgradPack::fits(g, taps);
        a_tap = !WG_TAP_GROUPS ? 0 : g.c_in % CONV_BM == 0 ? 2 : g.c_in % WG_TAP_SPAN == 0 ? 1 : 0;
        b.init(dy, k_begin, k_end, g.c_out);
        a_vec = fits && g.c_in % VEC == 0 && is_aligned(x, 16);
        b_vec = g.c_out % VEC == 0 && is_aligned(dy, 16) && RowStream<TF32_B_TRANSPOSED>::fits(g.c_out);
    }

    // x's element (tap, channel t; image and output pixel p): its offset and whether it is inside.
    __device__ __forceinline__ bool a_element(const ConvGeom& g, const TapSeq& taps, const TapIter& t,
                                              const PixPos& p, long long& offset) const {
        const int id = p.od * g.s_d + t.od, ih = p.oh * g.s_h + t.oh, iw = p.ow * g.s_w + t.ow;
        const int ipix = (id * g.in_h + ih) * g.in_w + iw;   // within one image: < 2^31 (launcher)
        offset = p.n * (g.in_pix * g.c_in) + ((long long)ipix * g.c_in + t.c);
        return t.in_filter(taps) && (unsigned)id < (unsigned)g.in_d && (unsigned)ih < (unsigned)g.in_h &&
               (unsigned)iw < (unsigned)g.in_w;
    }

    // The K position of k row `row` in the next tile.
    __device__ __forceinline__ unsigned row_k(int row) const { return k_row + (unsigned)(row - wgrad_decoded_row()); }
    // The packed path's view of k row `row`: its window origin's pixel index in x and the origin
    // packed (WgradPack), the fake origin for rows past k_end.
    template <bool FULL>
    __device__ __forceinline__ void row_origin(const ConvGeom& g, int row, unsigned& pixel, unsigned& at) const {
        unsigned packed;
        decode.origin(row_k(row), pixel, packed);
        at = FULL ? packed : select_u32(b.row_before_end(row), packed, WgradPack::fake_origin(g));
    }

    // One K tile: this thread's chunks of each of its k rows, then B (RowStream).
    //   16-byte path (VECTOR): a chunk's address is its a_base plus the row's origin pixel times
    //     C_in; its bounds test is packed (PACKED: two adds and a LOP3, WgradPack) or three compares.
    //     Packed, where a thread has two rows and shares them with its neighbour lane (WG_PAIRED),
    //     each lane decodes one (wgrad_decoded_row: row lane & 1) and the pair swaps them by
    //     shuffles (4 instead of ~16 instructions). Both lanes copy the same row at once (their
    //     units of one pixel fill whole sectors): handing a lane its own row first (2 shuffles)
    //     dropped the emulated coalescing to 0.74-0.83.
    //   Per-element path: copy_tap_run over each chunk's VEC (tap, channel) positions.
    // Rows past k_end copy nothing (k_ok; packed: the fake origin). FULL: every row of the tile lies
    // before k_end (the tiles before a split's last: k_per_split is whole K tiles), no row test.
    //   TAP (tap groups, WG_TAP_GROUPS; packed path, a_tap): the WG_TAP_CHUNKS chunks of a group (TAP 1)
    //     or the row's WG_CHUNKS (TAP 2) lie in one tap, so the group's first chunk column gives the
    //     address (its a_base, the others immediates apart) and the bounds test of all of them.
    //   SHARED (WG_SHARED_DECODE; untested groups, FULL): 1 in a group's even tiles, where each lane
    //     decodes its pair's row of this tile (lane & 1 == 0) or of the next (1) and both lanes take
    //     the first by a shuffle; 2 in the odd tiles, which take the second (no decode).
    template <bool VECTOR, bool PACKED = false, bool FULL = false, int TAP = 0, int SHARED = 0>
    __device__ __forceinline__ void load(const ConvGeom& g, const elem_t* __restrict__ x,
                                         const elem_t* __restrict__ dy, elem_t* as, elem_t* bs, int cols) {
        static_assert(VECTOR || !PACKED, "packed bounds: 16-byte path only");
        static_assert(!TAP || (PACKED && WG_TAP_GROUPS), "tap groups: packed 16-byte path of WG_TAP_GROUPS builds");
        static_assert(!SHARED || (PACKED && FULL && WG_SHARED_DECODE && WG_ROWS == 1), "shared decode: packed, untested");
        constexpr bool PAIRED = PACKED && WG_PAIRED;
        unsigned own_pixel = 0, own_at = 0;   // PAIRED: this lane's row (lane & 1), decoded once
        if constexpr (PAIRED) row_origin<FULL>(g, wgrad_decoded_row(), own_pixel, own_at);
#pragma unroll
        for (int r = 0; r < WG_ROWS; ++r) {
            const int row = wgrad_a_row(r);
            const bool k_ok = FULL || b.row_before_end(row);
            unsigned pixel = 0;   // 16-byte path: the window origin's pixel index in x
            unsigned at = 0;      // packed path
            PixPos p{};           // three compares and per-element path
            if constexpr (SHARED) {
                // SHARED 1: this tile and the next one's row of the pair, decoded by lanes 0 and 1 of it;
                // 2: the next one's, decoded then
                if constexpr (SHARED == 1)
                    decode.origin(row_k(row) + (threadIdx.x & 1) * (unsigned)CONV_BK, shared_pixel, shared_at);
                const int lane = (threadIdx.x & 31 & ~1) | (SHARED - 1);
                pixel = __shfl_sync(0xffffffffu, shared_pixel, lane);
                at = __shfl_sync(0xffffffffu, shared_at, lane);
            } else if constexpr (PAIRED) {
                const int lane = (threadIdx.x & 31 & ~1) | r;   // the lane that decoded row r
                pixel = __shfl_sync(0xffffffffu, own_pixel, lane);
                at = __shfl_sync(0xffffffffu, own_at, lane);
            } else if constexpr (PACKED) {
                row_origin<FULL>(g, row, pixel, at);
            } else {
                const PixQuot q = decode.divide(row_k(row));
                p = PixDecode::position(g, q);
                if constexpr (VECTOR) pixel = decode.pixel(q, q.k * decode.s_w);
            }
            if constexpr (TAP) {
                constexpr int GROUP = TAP == 2 ? WG_CHUNKS : WG_TAP_CHUNKS;   // chunks in one tap
#pragma unroll
                for (int h = 0; h < WG_CHUNKS / GROUP; ++h) {
                    const int j0 = h * GROUP;
                    const elem_t* const src = index_wide(a_base[j0], pixel, (unsigned)g.c_in);
                    const bool inside = WgradPack::inside(at + a_up[j0], WgradPack::bounds(g));
#pragma unroll
                    for (int i = 0; i < GROUP; ++i)
                        copy_chunk(as + tile_index<false, CONV_BM>(wgrad_a_unit(j0 + i) * VEC, row),
                                   src + (wgrad_a_unit(j0 + i) - wgrad_a_unit(j0)) * VEC, inside);
                }
                continue;
            }
#pragma unroll
            for (int j = 0; j < WG_CHUNKS; ++j) {
                elem_t* dst = as + tile_index<false, CONV_BM>(wgrad_a_unit(j) * VEC, row);
                if constexpr (PACKED) {
                    copy_chunk(dst, index_wide(a_base[j], pixel, (unsigned)g.c_in),
                               WgradPack::inside(at + a_up[j], WgradPack::bounds(g)));
                } else if constexpr (VECTOR) {
                    // & rather than &&: no branches around the compares
                    copy_chunk(dst, index_wide(a_base[j], pixel, (unsigned)g.c_in),
                               k_ok & ((unsigned)(p.od * g.s_d + a_td[j]) < (unsigned)g.in_d) &
                                   ((unsigned)(p.oh * g.s_h + a_th[j]) < (unsigned)g.in_h) &
                                   ((unsigned)(p.ow * g.s_w + a_tw[j]) < (unsigned)g.in_w));
                } else {
                    const TapSeq taps = dense_taps(g, -g.pad_d, -g.pad_h, -g.pad_w);
                    copy_tap_run(dst, x, taps, a_m[j], g.c_in, k_ok, [&](const TapIter& t, const elem_t*& src) {
                        long long offset;
                        const bool inside = a_element(g, taps, t, p, offset);
                        src = x + offset;
                        return inside;
                    });
                }
            }
        }
        k_row += CONV_BK;
        b.load<VECTOR, FULL>(bs, g.c_out, cols);
    }
};
