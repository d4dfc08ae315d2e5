// conv_igemm_gather.cuh: conv_igemm.cu's global -> shared copies: 16-byte and per-element
// chunk copies (copy_chunk, copy_scalar, copy_tap_run), the fwd/dgrad gathered A operand's tap
// masks and TapCursor (its 16-byte path) and GatherA, and the row-major operand streams
// (RowStream: fwd's w, wgrad's dy).
// Relies on: the variant macros CONV_MATH, CONV_BM, CONV_BN, CONV_BK, CONV_THREADS, CONV_WARPS_M;
// conv_igemm_layout.cuh (VEC, tile_index, chunk_row / chunk_pos, the TAP_* mapping);
// conv_igemm_index.cuh (index_wide, select_u32); TapSeq, TapIter, FAR_OUTSIDE (conv_common.cuh).
//
#pragma once

// ---- global -> shared copies ----
// A 16-byte chunk, zero-filled when !valid: then the source is not read (cp.async with a
// source size of 0), so the address of an out-of-range element may be passed as it is.
__device__ __forceinline__ void copy_chunk(elem_t* dst, const elem_t* src, bool valid) {
    cp_async_16_zfill(dst, src, valid);
}
// Two 16-byte chunks OFFSET elements apart in both shared and global memory from one source
// address, the second's offset inside its cp.async's address (RowStream<true>::UNIT_PAIRS): written
// as two copies, ptxas reassociated the second source (src + OFFSET) + row step and gave it a 64-bit
// address of its own in every row but the first (10 instructions for a tile's 4 row pairs, not 5).
template <int OFFSET>
__device__ __forceinline__ void copy_chunk_pair(elem_t* dst, const elem_t* src, bool valid0, bool valid1) {
#if !defined(GPUK_EMULATE) && defined(__CUDA_ARCH__)
    const unsigned s = (unsigned)__cvta_generic_to_shared(dst);
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n"
                 "cp.async.cg.shared.global [%0+%4], [%1+%4], 16, %3;\n"
                 ::"r"(s), "l"(src), "r"(valid0 ? 16 : 0), "r"(valid1 ? 16 : 0), "n"(OFFSET * (int)sizeof(elem_t)));
#else
    copy_chunk(dst, src, valid0);
    copy_chunk(dst + OFFSET, src + OFFSET, valid1);
#endif
}
// One element, for chunks whose neighbours do not share a padding check (unaligned channel
// counts, unaligned pointers, filters too large for tap masks): cp.async for 4- and 8-byte
// elements, a synchronous copy for 16-bit ones (below cp.async's 4-byte minimum).
__device__ __forceinline__ void copy_scalar(elem_t* dst, const elem_t* src, bool valid) {
    if constexpr (sizeof(elem_t) >= 4) {
        cp_async_zfill<sizeof(elem_t)>(dst, src, valid);
    } else {
        *dst = valid ? *src : ElementTraits<elem_t>::from_acc(0.0f);
    }
}

// Tile rows one block-wide pass of chunks covers (chunk j of a thread is row chunk_row(0) + j * this).
#define ROWS_PER_PASS(len) (CONV_THREADS / ((len) / VEC))
// tf32 wgrad's B (dy) where it is rounded in shared memory (several warps read it: CONV_WARPS_M > 1,
// Tf32Rounding): each warp copies whole 4 x 4 blocks (RowStream<true>) and its rounding pass stores
// them transposed, so ldmatrix reads the MMA's B fragments (K4Transposed).
#define TF32_B_TRANSPOSED (CONV_MATH == 2 && CONV_WARPS_M > 1)

// VEC consecutive positions of a (tap, channel) iterator copied one element at a time (the
// per-element path of every gathered operand): element(t, src) gives position t's source
// element and whether it is inside; `ok` covers what does not depend on t (K or N tails).
// 16-bit elements: not unrolled. There the fallback copies synchronously, which costs far more
// than the loop's branch, and unrolled 8 times inside every chunk loop it tripled the NVRTC time
// of the 16-bit variants (15 -> 5 CPU-s for f16 128x128 on sm_90) without changing the vector
// path's loop. Nor for the float32 FFMA tiles: a branch per element against a cp.async and its
// bounds test, and unrolled it was a fifth of their NVRTC time; their registers do not grow.
// float64 and tf32 stay unrolled: rolled, registers grow there (the tf32 128x128x32 forward
// spills on sm_90).
constexpr int COPY_RUN_UNROLL = sizeof(elem_t) == 2 || (sizeof(elem_t) == 4 && CONV_MATH == 0) ? 1 : VEC;
template <class Element>
__device__ __forceinline__ void copy_tap_run(elem_t* dst, const elem_t* __restrict__ data, const TapSeq& taps,
                                             TapIter t, int channels, bool ok, const Element& element) {
#pragma unroll COPY_RUN_UNROLL
    for (int e = 0; e < VEC; ++e) {
        const elem_t* src;
        const bool valid = ok && element(t, src);
        copy_scalar(dst + e, valid ? src : data, valid);   // an invalid element passes a readable address
        t.advance(taps, 1, channels);
    }
}

// ---- tap masks and the tap cursor (the 16-byte path of the gathered A operand) ----
// A tap is a bit per spatial dim, by its index in the sequence (TapSeq): index iw at bit iw, ih
// at bit cw + ih, id at bit cw + ch + id (cw, ch, cd: the sequence's tap counts). A row's mask
// holds the bits of the indices that keep its window inside the source, so the tap is inside
// for that row iff its bits are all in the mask: one LOP3 (need & ~mask, to a predicate) per
// chunk in the K loop instead of three adds and three compares. Past the filter the d index
// runs on to cd and beyond, bits no mask holds: the same test refuses those taps. Needs
// cw + ch + cd plus the taps one K tile can step past the filter (CONV_BK / VEC) <= 31
// (tap_masks_fit); larger filters take the per-element path.
__device__ __forceinline__ bool tap_masks_fit(const TapSeq& s) {
    return s.w.count + s.h.count + s.d.count + CONV_BK / VEC <= 31;
}
__device__ __forceinline__ unsigned dim_mask(const TapDim& t, int size, int origin, int extent, int shift) {
    unsigned bits = 0;
    for (int i = 0; i < t.count; ++i) {
        const int coord = t.k0 + i * t.kstep;
        if (coord < size && (unsigned)(origin + t.o0 + i * t.ostep) < (unsigned)extent) bits |= 1u << (shift + i);
    }
    return bits;
}
// The 16-byte path's K position (fwd/dgrad): (tap, channel c) as the copies use it, the tap's
// offset from a row's window origin plus c (32-bit: GatherA::fast) and its one-hot index bits
// per dim. A K tile adds CONV_BK to c and the offset; each step into the next tap (the wrap,
// c >= channels) shifts the bits and adds one of three precomputed offset steps (next w index;
// w wraps, next h; h wraps too, next d), all by selects: no divisions, no nested branches, so
// the K loop stays short. wrapped(w_end, h_end) lets the dgrad loader step its filter offset.
struct TapCursor {
    int c;
    unsigned off;                 // offset of (tap, c) from a row's window origin (wraps past the filter, unread)
    unsigned wbit, hbit, dbit;    // the tap's index bits (see tap_masks_fit)
    unsigned step_w, step_h, step_d;   // offset steps into the next tap, less `channels` (c wraps)

    __device__ __forceinline__ unsigned need() const { return wbit | hbit | dbit; }
    __device__ __forceinline__ bool in_filter(const TapSeq& s) const {
        return dbit < 1u << (s.w.count + s.h.count + s.d.count);
    }
    __device__ __forceinline__ void start(const TapSeq& s, int k, int channels, int sh, int sw) {
        const int i = k / channels, iw = i % s.w.count, ih = (i / s.w.count) % s.h.count;
        const int id = i / (s.w.count * s.h.count);
        c = k - i * channels;
        wbit = 1u << iw;
        hbit = 1u << (s.w.count + ih);
        dbit = 1u << (s.w.count + s.h.count + id);   // id <= cd + CONV_BK / VEC: tap_masks_fit
        const unsigned C = (unsigned)channels, dw = (unsigned)s.w.ostep * C, dh = (unsigned)(s.h.ostep * sw) * C,
                       dd = (unsigned)(s.d.ostep * sh * sw) * C;
        const unsigned back_w = (unsigned)(s.w.count - 1) * dw, back_h = (unsigned)(s.h.count - 1) * dh;
        step_w = dw - C;
        step_h = dh - back_w - C;
        step_d = dd - back_h - back_w - C;
        off = (((unsigned)(s.d.o0 + id * s.d.ostep) * (unsigned)sh + (unsigned)(s.h.o0 + ih * s.h.ostep)) * (unsigned)sw +
               (unsigned)(s.w.o0 + iw * s.w.ostep)) * C + (unsigned)c;
    }
    // AT_MOST_ONE_WRAP: channels >= CONV_BK (the tap tiles: a multiple of it), so one K tile steps
    // into the next tap at most once (an `if`: no loop and its branch per tile).
    template <bool AT_MOST_ONE_WRAP = false, class Wrapped>
    __device__ __forceinline__ void advance(const TapSeq& s, int channels, const Wrapped& wrapped) {
        c += CONV_BK;
        off += CONV_BK;
        if constexpr (AT_MOST_ONE_WRAP) {
            if (c >= channels) next_tap(s, channels, wrapped);
        } else {
            while (c >= channels) next_tap(s, channels, wrapped);
        }
    }
    template <class Wrapped>
    __device__ __forceinline__ void next_tap(const TapSeq& s, int channels, const Wrapped& wrapped) {
        c -= channels;
        wbit <<= 1;
        const bool w_end = wbit == 1u << s.w.count;
        wbit = w_end ? 1u : wbit;
        const unsigned h = w_end ? hbit << 1 : hbit;
        const bool h_end = h == 1u << (s.w.count + s.h.count);
        hbit = h_end ? 1u << s.w.count : h;
        dbit = h_end ? dbit << 1 : dbit;
        off += w_end ? (h_end ? step_d : step_h) : step_w;
        wrapped(w_end, h_end);
    }
};
// Largest |offset| a dim's taps add to a window origin.
__device__ __forceinline__ long long dim_reach(const TapDim& t) {
    const long long first = t.o0, last = t.o0 + (long long)(t.count - 1) * t.ostep;
    return first < 0 ? (last < 0 ? (-first > -last ? -first : -last) : (-first > last ? -first : last))
                     : (last < 0 ? (first > -last ? first : -last) : (first > last ? first : last));
}

// The gathered A operand of fwd and dgrad: A[m][k] = src[n, origin(m) + offset(tap), c] over a
// channels_last (N, sd, sh, sw, C) source (fwd: x; dgrad: dy), k = (tap of `taps`, c). Row m =
// (n, p) with p a pixel of the grid (gd, gh, gw); its window origin is p * mul + add per dim. A
// thread's chunks share one k (its position along the tile's K), so one TapIter serves them
// all; each chunk keeps its row's base offset, and its window origin (per-element path) or tap
// mask (16-byte path).
struct Source { int sd, sh, sw, channels; long long pix; };
struct RowGrid { int gd, gh, gw, mul_d, mul_h, mul_w, add_d, add_h, add_w; };
struct GatherA {
    const elem_t* row[A_CHUNKS_PER_THREAD];                 // the source at (n, window origin) of row j
    int o_d[A_CHUNKS_PER_THREAD], o_h[A_CHUNKS_PER_THREAD], o_w[A_CHUNKS_PER_THREAD];   // window origin
    unsigned mask[A_CHUNKS_PER_THREAD];                     // taps inside the source for row j
    TapIter k;                                              // this thread's k within the tile (per-element path)
    TapCursor at;                                           // the same k, for the 16-byte path
    bool fast;                                              // 16-byte path allowed (masks, 32-bit tap offsets)
    bool tap_tiles;                                         // the tap-tile mapping (TAP_TILES): row j = tap_row(j)

    // vector: both operands may take 16-byte copies (the loader's other conditions); then TAP_TILES
    // builds take the tap-tile mapping where the channel count allows it.
    __device__ __forceinline__ void init(const Source& src, const RowGrid& grid, const TapSeq& taps,
                                         const elem_t* data, long long rows, long long k_begin, bool vector) {
        const long long row0 = (long long)blockIdx.x * CONV_BM;
        // Tap offsets fit 32 bits, so a chunk's address is its row's pointer plus one 32-bit offset.
        const long long reach = ((dim_reach(taps.d) * src.sh + dim_reach(taps.h)) * src.sw + dim_reach(taps.w) + 1) *
                                src.channels;
        fast = tap_masks_fit(taps) && reach < (1ll << 31);
        // (every use also tests TAP_TILES: the member alone was not folded away where it is 0, and
        // moved the registers of other builds)
        tap_tiles = TAP_TILES && vector && fast && src.channels % CONV_BK == 0 && k_begin % CONV_BK == 0;
#pragma unroll
        for (int j = 0; j < A_CHUNKS_PER_THREAD; ++j) {   // (tap tiles: rows past TAP_ROWS(CONV_BM) unused)
            const long long m = row0 + (TAP_TILES && tap_tiles ? tap_row(j) : chunk_row(j, CONV_BK));
            if (m < rows) {
                const unsigned mu = (unsigned)m, pixels = (unsigned)grid.gd * grid.gh * grid.gw;
                const unsigned n = mu / pixels, p = mu - n * pixels;
                const int pw = (int)(p % (unsigned)grid.gw), ph = (int)((p / (unsigned)grid.gw) % (unsigned)grid.gh);
                const int pd = (int)(p / ((unsigned)grid.gw * (unsigned)grid.gh));
                o_d[j] = pd * grid.mul_d + grid.add_d;
                o_h[j] = ph * grid.mul_h + grid.add_h;
                o_w[j] = pw * grid.mul_w + grid.add_w;
                const long long origin = ((long long)o_d[j] * src.sh + o_h[j]) * src.sw + o_w[j];
                row[j] = data + ((long long)n * src.pix + origin) * src.channels;
            } else {
                o_d[j] = o_h[j] = o_w[j] = FAR_OUTSIDE;
                row[j] = data;
            }
            mask[j] = 0;
            if (fast)   // one region of bits per dim: the test needs each of the tap's three bits
                mask[j] = dim_mask(taps.w, taps.size_w, o_w[j], src.sw, 0) |
                          dim_mask(taps.h, taps.size_h, o_h[j], src.sh, taps.w.count) |
                          dim_mask(taps.d, taps.size_d, o_d[j], src.sd, taps.w.count + taps.h.count);
        }
        // tap tiles: the k of the thread's first unit, in the tile's tap (the others: + 2 * VEC each)
        const int k0 = (int)k_begin + (TAP_TILES && tap_tiles ? tap_unit(0) * VEC : chunk_pos(CONV_BK));
        k.start(taps, k0, src.channels);
        if (fast) at.start(taps, k0, src.channels, src.sh, src.sw);
    }
    // Issues this thread's chunks of one K tile into `as` ([m][k]); does not advance k or `at`.
    // TAP: the tap-tile mapping (tap_tiles; 16-byte path only).
    template <bool VECTOR, bool TAP = false>
    __device__ __forceinline__ void load(const Source& src, const TapSeq& taps, const elem_t* __restrict__ data,
                                         elem_t* as) const {
        static_assert(!TAP || (VECTOR && TAP_TILES), "tap tiles: 16-byte path of TAP_TILES builds");
        const int kc = chunk_pos(CONV_BK);
        if constexpr (TAP) {
            const unsigned need = at.need();
#pragma unroll
            for (int r = 0; r < TAP_ROWS(CONV_BM); ++r) {
                const elem_t* src_row = row[r] + (int)at.off;   // at unit tap_unit(0)
                const bool inside = (need & ~mask[r]) == 0u;
#pragma unroll
                for (int i = 0; i < TAP_UNITS; ++i)
                    copy_chunk(as + tile_index<true, CONV_BM, A_MK_SWIZZLED>(tap_row(r), tap_unit(i) * VEC),
                               src_row + 2 * i * VEC, inside);
            }
        } else if constexpr (VECTOR) {
            const unsigned need = at.need();
#pragma unroll
            for (int j = 0; j < A_CHUNKS_PER_THREAD; ++j)
                copy_chunk(as + tile_index<true, CONV_BM, A_MK_SWIZZLED>(chunk_row(j, CONV_BK), kc),
                           row[j] + (int)at.off, (need & ~mask[j]) == 0u);
        } else {
#pragma unroll
            for (int j = 0; j < A_CHUNKS_PER_THREAD; ++j)
                copy_tap_run(as + tile_index<true, CONV_BM, A_MK_SWIZZLED>(chunk_row(j, CONV_BK), kc), data, taps, k,
                             src.channels, true, [&](const TapIter& t, const elem_t*& at) {
                                 at = row[j] + ((long long)(t.od * src.sh + t.oh) * src.sw + t.ow) * src.channels + t.c;
                                 return t.in_filter(taps) && (unsigned)(o_d[j] + t.od) < (unsigned)src.sd &&
                                        (unsigned)(o_h[j] + t.oh) < (unsigned)src.sh &&
                                        (unsigned)(o_w[j] + t.ow) < (unsigned)src.sw;
                             });
        }
    }
};

// A row-major (K, ld) operand streamed by whole rows (fwd B = w as (taps*C_in, C_out); wgrad
// B = dy as (N*OP, C_out) in channels_last): one pointer per thread, advanced by CONV_BK rows per
// tile, and the count of K rows from the thread's first chunk to k_end, so the per-chunk check is
// one compare with an immediate (the chunk's row offset). A thread's chunks lie in one column of
// units, one block-wide pass (ROWS_PER_PASS) apart. Which thread takes which: chunk_row /
// chunk_pos (a warp's copies fill whole tile rows), or, WARP_BLOCKS (tf32 wgrad's B), lane
// 8i + g of warp w takes unit 8w + g at rows 4j + i: lanes g, g + 8, g + 16, g + 24 copy the 4 rows
// of one 4 x 4 block, which the warp transposes with one ldmatrix per j (round_transposed_tf32),
// and a warp's copies fill 4 rows x 128 bytes.
template <bool WARP_BLOCKS> struct RowStream {
    static constexpr int STEP = ROWS_PER_PASS(CONV_BN);   // rows between a thread's chunks
    static_assert(!WARP_BLOCKS || (STEP == 4 && CONV_BN / VEC == 8 * (CONV_THREADS / 32)),
                  "warp blocks: each warp copies 8 units of 4 x 4 blocks");
    // UNIT_PAIRS (warp blocks of a 16-unit tile, 2 warps: the tf32 64x64 wgrad): lane 8i + g of warp w
    // takes units g and g + 8 at rows 4p + i, p = w, w + 2, w + 4, w + 6 (the warp's blocks are 4 block
    // rows x all 16 units, not 8 block rows x its 8 units), so a thread's chunks are 4 rows x 2 units
    // 32 elements apart: one address per row and tile (the second chunk an immediate further), where
    // 8 rows took one each. A warp's copies still fill 4 rows x 128 bytes per instruction. The second
    // unit of a thread whose first lies before ld but the second not is zero-filled (hi_ok: a
    // thread-constant predicate; it would read past the row, and at dy's last row past dy).
    static constexpr bool UNIT_PAIRS = WARP_BLOCKS && CONV_BN / VEC == 16;
    static constexpr int PAIR_STEP = 8;                  // UNIT_PAIRS: rows between a thread's chunk pairs
    static constexpr int PAIR_UNITS = 8;                 // UNIT_PAIRS: units between a pair's two chunks
    // The tile row of this thread's chunk j, and its position along the row (UNIT_PAIRS: chunk j's
    // is pos() + unit_offset(j)).
    __device__ __forceinline__ static int row(int j) {
        if (UNIT_PAIRS) return ((int)(threadIdx.x & 31) >> 3) + 4 * (int)(threadIdx.x >> 5) + (j >> 1) * PAIR_STEP;
        return (WARP_BLOCKS ? (int)(threadIdx.x & 31) >> 3 : chunk_row(0, CONV_BN)) + j * STEP;
    }
    __device__ __forceinline__ static int pos() {
        if (UNIT_PAIRS) return VEC * (int)(threadIdx.x & 7);
        return WARP_BLOCKS ? VEC * (8 * (int)(threadIdx.x >> 5) + (int)(threadIdx.x & 7)) : chunk_pos(CONV_BN);
    }
    __device__ __forceinline__ static constexpr int unit_offset(int j) { return UNIT_PAIRS ? (j & 1) * PAIR_UNITS * VEC : 0; }
    const elem_t* ptr;   // this thread's chunk 0 of the next tile
    int ahead;           // K rows from this thread's chunk 0 of the next tile to k_end
    int col;             // this thread's first column
    bool hi_ok;          // UNIT_PAIRS: the second unit of each pair lies before ld
    // ld: the operand's columns (its row length). A thread whose columns lie past them (the N tail)
    // points at column 0 instead: its 16-byte copies then read real data into tile columns that
    // only feed accumulator columns the epilogue does not store, so they need no column test
    // (the per-element path tests every column: its copies past ld read nothing).
    // TAP: the tap-tile mapping (fwd's B where TAP_TILES: load_tap), else the one above.
    __device__ __forceinline__ void init(const elem_t* data, long long k_begin, long long k_end, int ld,
                                         bool tap = false) {
        if (TAP_TILES && tap) {
            col = blockIdx.y * CONV_BN + tap_pos();
            ptr = data + (k_begin + tap_k_row()) * ld + col;   // (tap: col < ld)
            ahead = (int)(k_end - k_begin) - tap_k_row();
            return;
        }
        col = blockIdx.y * CONV_BN + pos();
        ptr = data + (k_begin + row(0)) * ld + (col < ld ? col : 0);
        ahead = (int)(k_end - k_begin) - row(0);
        hi_ok = col + PAIR_UNITS * VEC < ld;
    }
    // Tap tiles (TAP_TILES; the block's columns all before ld): thread t copies k row t / 2 whole,
    // units t % 2, t % 2 + 2, ... (a lane pair's copies fill 32-byte sectors; a quarter warp's 4 rows
    // x 2 unit parities hit 8 bank groups at the padded stride of 2 mod 8 units): one address step
    // and one row test per K tile for all of its chunks, immediates apart, where the mapping above
    // takes an address and a row test per chunk (chunks a pass of rows apart).
    // TAP_LANES threads per k row (64x64x32: 2; 128x128x16: 8, a quarter warp's 8 neighbouring units,
    // 128 bytes, on 8 bank groups), chunk i of a thread TAP_LANES units after chunk i - 1.
    static constexpr int TAP_LANES = CONV_THREADS / CONV_BK;
    static constexpr int TAP_CHUNKS = CONV_BN / VEC / TAP_LANES;
    __device__ __forceinline__ static int tap_k_row() { return (int)(threadIdx.x / TAP_LANES); }
    __device__ __forceinline__ static int tap_pos() { return (int)(threadIdx.x % TAP_LANES) * VEC; }
    __device__ __forceinline__ void load_tap(elem_t* bs, int ld) {
        static_assert(!TAP_TILES || (CONV_THREADS % CONV_BK == 0 && TAP_CHUNKS * TAP_LANES * VEC == CONV_BN &&
                                     TAP_CHUNKS == B_CHUNKS_PER_THREAD),
                      "tap tiles: one k row per TAP_LANES threads");
        elem_t* const dst = bs + tile_index<false, CONV_BN>(tap_pos(), tap_k_row());
        const bool k_ok = 0 < ahead;
#pragma unroll
        for (int i = 0; i < TAP_CHUNKS; ++i)
            copy_chunk(dst + TAP_LANES * i * VEC, ptr + TAP_LANES * i * VEC, k_ok);
        ptr += (long long)CONV_BK * ld;
        ahead -= CONV_BK;
    }
    // Whether row `r` of the next tile lies before k_end (another operand's rows, e.g. wgrad A's).
    __device__ __forceinline__ bool row_before_end(int r) const { return r - row(0) < ahead; }
    // The 16-byte path offsets a thread's chunks from `ptr` in 32 bits (one IMAD.WIDE each).
    __device__ __forceinline__ static bool fits(int ld) { return (long long)CONV_BK * ld < (1ll << 31); }
    // FULL: the tile lies before k_end (no row test).
    template <bool VECTOR, bool FULL = false>
    __device__ __forceinline__ void load(elem_t* bs, int ld, int cols) {
        if constexpr (UNIT_PAIRS) {
            elem_t* const dst0 = bs + tile_index<false, CONV_BN>(pos(), row(0));
            const int pair_pass = PAIR_STEP * ld;
#pragma unroll
            for (int q = 0; q < B_CHUNKS_PER_THREAD / 2; ++q) {
                elem_t* const dst = dst0 + k_rows_apart<CONV_BN>(q * PAIR_STEP);
                const elem_t* const src = ptr + q * pair_pass;   // q * pair_pass < CONV_BK * ld: fits()
                const bool k_ok = FULL || q * PAIR_STEP < ahead;   // row(2q) before k_end
                if constexpr (VECTOR) {
                    copy_chunk_pair<PAIR_UNITS * VEC>(dst, src, k_ok, k_ok && hi_ok);
                } else {
#pragma unroll
                    for (int h = 0; h < 2; ++h)
#pragma unroll
                        for (int e = 0; e < VEC; ++e) {
                            const int c = h * PAIR_UNITS * VEC + e;
                            const bool valid = k_ok && col + c < cols;
                            copy_scalar(dst + c, valid ? src + c : ptr, valid);
                        }
                }
            }
            ptr += (long long)CONV_BK * ld;
            ahead -= CONV_BK;
            return;
        }
        const int nc = pos();
        const long long pass = (long long)STEP * ld;
        elem_t* const dst0 = bs + tile_index<false, CONV_BN>(nc, row(0));
#pragma unroll
        for (int j = 0; j < B_CHUNKS_PER_THREAD; ++j) {
            elem_t* dst = k_rows_linear(STEP) ? dst0 + k_rows_apart<CONV_BN>(j * STEP)
                                              : bs + tile_index<false, CONV_BN>(nc, row(j));
            const elem_t* src = ptr + j * pass;
            const bool k_ok = FULL || j * STEP < ahead;   // row(j) before k_end
            if constexpr (VECTOR) {
                copy_chunk(dst, ptr + j * (int)pass, k_ok);   // j * pass < CONV_BK * ld: fits()
            } else {
#pragma unroll
                for (int e = 0; e < VEC; ++e) {
                    const bool valid = k_ok && col + e < cols;
                    copy_scalar(dst + e, valid ? src + e : ptr, valid);
                }
            }
        }
        ptr += (long long)CONV_BK * ld;
        ahead -= CONV_BK;
    }
};
