// conv_igemm_pipeline.cuh: conv_igemm.cu's K loop: one K tile's copies (load_tile), the
// CONV_STAGES-deep cp.async pipeline (pipeline_group, pipeline) and the per-block choice of its
// copy path (igemm_mainloop), with the stage ring in static or dynamic shared memory.
// Relies on: the variant macros CONV_BM, CONV_BN, CONV_BK, CONV_MATH, CONV_STAGES,
// CONV_DYNAMIC_SMEM, MODE_*; Loader<MODE> (conv_igemm_loaders.cuh, WG_*), tile_multiply, ACC_COUNT
// and TF32_ROUND_LANDED (conv_igemm_math.cuh), A_STAGE / B_STAGE and TAP_TILES (conv_igemm_layout.cuh).
//
#pragma once

// The shared main loop: accumulates the block's tile over k in [k_begin, k_end) through a
// CONV_STAGES-deep cp.async pipeline (one barrier per K tile; stage indices rotate by compare).
// One K tile's copies: the loader's load<VECTOR>, or wgrad's packed-bounds 16-byte path; FULL (wgrad):
// a tile before the split's last, whose rows need no test against k_end.
// TAP (fwd, dgrad): the tap-tile mapping (TAP_TILES).
template <bool VECTOR, bool PACKED, class L, bool FULL = false, int TAP = 0, int SHARED = 0>
__device__ __forceinline__ void load_tile(L& loader, const ConvGeom& g, const elem_t* __restrict__ a_src,
                                          const elem_t* __restrict__ b_src, elem_t* as, elem_t* bs, int cols) {
    if constexpr (PACKED)   // wgrad's packed path (TAP: its tap groups; SHARED: WG_SHARED_DECODE)
        loader.template load<VECTOR, true, FULL, TAP, SHARED>(g, a_src, b_src, as, bs, cols);
    else if constexpr (FULL && !TAP)   // (the fwd/dgrad tap-tile loads keep their row tests in untested groups)
        loader.template load<VECTOR, false, true>(g, a_src, b_src, as, bs, cols);
    else if constexpr (TAP)   // fwd, dgrad: load<VECTOR, TAP>
        loader.template load<VECTOR, true>(g, a_src, b_src, as, bs, cols);
    else
        loader.template load<VECTOR>(g, a_src, b_src, as, bs, cols);
}

// Whether the tf32 128x128 wgrad runs untested groups (pipeline): on sm_90 and in the emulator,
// which then runs the code sm_90 runs (sm_80 keeps the tested loop).
#if !defined(GPUK_EMULATE) && defined(__CUDA_ARCH__) && __CUDA_ARCH__ < 900
#define TF32_WIDE_UNTESTED false
#else
#define TF32_WIDE_UNTESTED true
#endif
// One group of CONV_STAGES K tiles from tile t0 on, unrolled (every stage index a constant). CHECKED:
// a tile or a prefetch of the group may lie past the last tile (tiles), so each is tested; in 16-bit
// and most tf32 wgrad (UNTESTED_GROUPS) the groups before (where t0 + 2 * CONV_STAGES <= tiles) run
// without those two tests per tile (about 4.5 instructions a tile), and prefetch only tiles before
// the last (the one that may end before BK rows), whose copies skip their row tests against k_end
// (FULL: ~10 instructions a tile).
template <int MODE, bool VECTOR, bool PACKED, bool CHECKED, int TAP = 0>
__device__ __forceinline__ void pipeline_group(Loader<MODE>& loader, elem_t (*as)[A_STAGE], elem_t (*bs)[B_STAGE],
                                               const ConvGeom& g, const elem_t* __restrict__ a_src,
                                               const elem_t* __restrict__ b_src, int cols, int t0, int tiles,
                                               acc_t* acc) {
#pragma unroll
    for (int s = 0; s < CONV_STAGES; ++s) {
        const int t = t0 + s;
        if (CHECKED && t >= tiles) break;
        cp_async_wait<CONV_STAGES - 2>();   // tile t has landed (this thread's copies) ...
        TF32_ROUND_LANDED(as[s], bs[s], TAP);
        __syncthreads();                    // ... everyone's, and stage t-1 is free again
        const int write_stage = (s + CONV_STAGES - 1) % CONV_STAGES;
        // wgrad's packed path in an untested group (every load of it runs): the decode of two tiles' rows
        // shared by the lane pairs (WG_SHARED_DECODE), the first tile of each pair decoding both
        constexpr bool SHARED = MODE == MODE_WGRAD && WG_SHARED_DECODE && PACKED && !CHECKED;
        if constexpr (SHARED) {
            if (s % 2 == 0)
                load_tile<VECTOR, PACKED, Loader<MODE>, true, TAP, 1>(loader, g, a_src, b_src, as[write_stage],
                                                                      bs[write_stage], cols);
            else
                load_tile<VECTOR, PACKED, Loader<MODE>, true, TAP, 2>(loader, g, a_src, b_src, as[write_stage],
                                                                      bs[write_stage], cols);
        } else if (!CHECKED || t + CONV_STAGES - 1 < tiles) {
            load_tile<VECTOR, PACKED, Loader<MODE>, !CHECKED, TAP>(loader, g, a_src, b_src, as[write_stage],
                                                                   bs[write_stage], cols);
        }
        cp_async_commit();
        tile_multiply<MODE>(as[s], bs[s], acc);
    }
}

template <int MODE, bool VECTOR, bool PACKED = false, int TAP = 0>
__device__ __forceinline__ void pipeline(Loader<MODE>& loader, elem_t (*as)[A_STAGE], elem_t (*bs)[B_STAGE],
                                         const ConvGeom& g, const elem_t* __restrict__ a_src,
                                         const elem_t* __restrict__ b_src, int cols, long long depth, acc_t* acc) {
    const int tiles = (int)((depth + CONV_BK - 1) / CONV_BK);
#pragma unroll
    for (int s = 0; s < CONV_STAGES - 1; ++s) {
        if (s < tiles) load_tile<VECTOR, PACKED, Loader<MODE>, false, TAP>(loader, g, a_src, b_src, as[s], bs[s], cols);
        cp_async_commit();   // empty groups keep the count uniform for the wait below
    }
    // Unrolled by the stage count, so that every stage index is a constant: the shared
    // addresses of fragments and copies become register + immediate (no per-tile address math).
    // Not for the per-element path, whose copies cost more than the address math (unrolled,
    // its VEC-times-longer loader spills the 128x128 tiles): it rotates the stage indices.
    if constexpr (!VECTOR) {
        int read_stage = 0, write_stage = CONV_STAGES - 1;
        for (int t = 0; t < tiles; ++t) {
            cp_async_wait<CONV_STAGES - 2>();
            TF32_ROUND_LANDED(as[read_stage], bs[read_stage], 0);
            __syncthreads();
            if (t + CONV_STAGES - 1 < tiles)
                load_tile<VECTOR, PACKED>(loader, g, a_src, b_src, as[write_stage], bs[write_stage], cols);
            cp_async_commit();
            tile_multiply<MODE>(as[read_stage], bs[read_stage], acc);
            read_stage = read_stage == CONV_STAGES - 1 ? 0 : read_stage + 1;
            write_stage = write_stage == CONV_STAGES - 1 ? 0 : write_stage + 1;
        }
    } else {
        // wgrad only (its split K is long): the untested groups are a second copy of the loop. 16-bit
        // and the tf32 64x64 tile take it; the tf32 128x128 wgrad on its packed path on sm_90 only
        // (TF32_WIDE_UNTESTED: 2.08 -> 1.98 other instructions per MMA), as its three-compare path
        // spills with the copy (16 bytes) and on sm_80 the copy costs 22 register moves (3.07 ->
        // 3.16); the tf32 fwd 128x128x32 spilled 420 bytes with it.
        constexpr bool UNTESTED_GROUPS =
            CONV_MATH == 1 || (CONV_MATH == 2 && (CONV_BM * CONV_BN <= 64 * 64 || (PACKED && TF32_WIDE_UNTESTED)));
        // The tap-tile path (fwd, dgrad) takes them too, its copies tested as in the last groups.
        int t0 = 0;
        if constexpr ((MODE == MODE_WGRAD && UNTESTED_GROUPS) || TAP)
            for (; t0 + 2 * CONV_STAGES <= tiles; t0 += CONV_STAGES)   // tiles and prefetches before the last
                pipeline_group<MODE, VECTOR, PACKED, false, TAP>(loader, as, bs, g, a_src, b_src, cols, t0, tiles, acc);
        for (; t0 < tiles; t0 += CONV_STAGES)   // the rest (wgrad: the last one or two groups)
            pipeline_group<MODE, VECTOR, PACKED, true, TAP>(loader, as, bs, g, a_src, b_src, cols, t0, tiles, acc);
    }
    cp_async_wait_all();
}

// Runs the pipeline over `depth` (= k_end - k_begin) K elements with an initialized loader.
// dynamic_smem: the kernel's dynamic shared memory (CONV_DYNAMIC_SMEM), else unused.
template <int MODE>
__device__ __forceinline__ void igemm_mainloop(Loader<MODE>& loader, const ConvGeom& g,
                                               const elem_t* __restrict__ a_src, const elem_t* __restrict__ b_src,
                                               int cols, long long depth, acc_t* acc, unsigned char* dynamic_smem) {
#if CONV_DYNAMIC_SMEM
    elem_t (*as)[A_STAGE] = reinterpret_cast<elem_t (*)[A_STAGE]>(dynamic_smem);
    elem_t (*bs)[B_STAGE] = reinterpret_cast<elem_t (*)[B_STAGE]>(dynamic_smem + CONV_STAGES * A_STAGE * sizeof(elem_t));
#else
    (void)dynamic_smem;
    __shared__ __align__(16) elem_t as[CONV_STAGES][A_STAGE];
    __shared__ __align__(16) elem_t bs[CONV_STAGES][B_STAGE];
#endif
#pragma unroll
    for (int e = 0; e < ACC_COUNT; ++e) acc[e] = acc_t(0);
    // One uniform choice per block, outside the loop: both operands in 16-byte chunks, or every
    // element on its own (unaligned channel counts or pointers, filters too large for tap masks).
    // wgrad's 16-byte path tests its bounds packed where the image fits (WgradPack).
    if constexpr (MODE == MODE_WGRAD && WG_PACKED) {
        if (loader.a_vec && loader.b_vec && loader.a_packed) {
            if constexpr (WG_TAP_GROUPS) {
                // The branch order is ptxas's register allocation on sm_80, not taste: of the orders
                // tried, each gave one of the three untested loops 130-150 register moves (the tap
                // groups' first: halves 848 instructions per 128 MMAs, 136 moves), but this one, where
                // the worst is the per-chunk loop with 55 (827, was 783 when the halves' loop had the
                // moves); whole rows 720, halves 730. On sm_90 (this order against the tap groups' first) the
                // tap loops are the same length and the per-chunk loop 6 shorter (528).
                if (!loader.a_tap) {
                    pipeline<MODE, true, true>(loader, as, bs, g, a_src, b_src, cols, depth, acc);
                    return;
                }
                if (loader.a_tap == 2)
                    pipeline<MODE, true, true, 2>(loader, as, bs, g, a_src, b_src, cols, depth, acc);
                else
                    pipeline<MODE, true, true, 1>(loader, as, bs, g, a_src, b_src, cols, depth, acc);
                return;
            }
            pipeline<MODE, true, true>(loader, as, bs, g, a_src, b_src, cols, depth, acc);
            return;
        }
    }
    if constexpr (MODE != MODE_WGRAD && TAP_TILES) {
        if (loader.a.tap_tiles) {   // implies a_vec && b_vec (GatherA::init)
            pipeline<MODE, true, false, true>(loader, as, bs, g, a_src, b_src, cols, depth, acc);
            return;
        }
    }
    if (loader.a_vec && loader.b_vec)
        pipeline<MODE, true>(loader, as, bs, g, a_src, b_src, cols, depth, acc);
    else
        pipeline<MODE, false>(loader, as, bs, g, a_src, b_src, cols, depth, acc);
}
