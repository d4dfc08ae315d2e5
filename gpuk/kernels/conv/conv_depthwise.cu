// conv_depthwise.cu: tiled depthwise convolution (forward, data and filter gradients) with a
// depth multiplier M: output channel j = c * M + m reads input channel c only; w is
// (*k, C_in, M), i.e. w[tap * C_out + j]. Launched by gpuk/kernels/conv/direct.py, which
// picks the tile (pixel rows x segments, kernel-row chunk) and owns the constants below.
// Problems are lifted to 3 spatial dims (conv_common.cuh).
//
// Layout is a compile-time parameter (DW_CHANNELS_LAST); the shared tiles always hold
// [pixel][lane] (lane = one of DW_CHANNELS channels), so the math is layout-free:
//   channels_last : a warp loads/stores 32 consecutive channels of one pixel (coalesced);
//                   shared pitch DW_CHANNELS words, conflict-free.
//   channels_first: a warp loads up to 32 consecutive pixels of one tile row of one channel
//                   (coalesced); shared pitch DW_CHANNELS + 1 words so those pixels hit
//                   distinct banks; results are staged through shared memory so that a
//                   warp stores along W as well. (Not [lane][pixel] with 16-byte stores: the
//                   32 lanes' reads of one pixel would share a word phase, 4-way conflicts;
//                   docs/kernels.md, depthwise.) wgrad instead transposes its 16-byte loads
//                   in registers (shuffles among the threads holding the same columns of
//                   neighbouring lanes) and stores one pixel's lanes with 16-byte shared
//                   stores, pitch DW_TRANSPOSED_PITCH (load_tile_transposed), or, for its
//                   channel quads, into planes of 4 lanes (planar_pixels).
//
// Block: DW_CHANNELS x DW_ROWS threads. The block's output tile is tile_rows x
// (segs * DW_PIX) pixels of one (sample, output plane) x DW_CHANNELS channels; thread
// (lane, ty) owns row ty / segs, segment ty % segs: DW_PIX consecutive output pixels along
// W in registers (threads with row >= tile_rows only help with loads; strided dgrad
// interleaves s_w segments, see tile_correlation).
// fwd / dgrad read the filter from shared memory, staged per tile next to the input tile
// (stage_weights: correlation order, widened, 16-byte reads). A whole 3x3 / 5x5 filter at
// stride 1 (one plane, no stride holes, one multiplier group; 4-byte accumulators) runs
// tile_rows_window: 4 / 2 output rows per thread, each input row's window read once for all
// the thread's rows it lies under. Otherwise, per kernel row: 3 and 5 wide at strides 1 and 2
// a register window (row_window); other widths at stride 1 and dilation 1 a rolling window
// over the taps (row_roll: 1 shared load and 1/4 of a 16-byte filter read per 8 FFMA; float64
// keeps the loop below, rolling spilled); the rest one shared load per multiply-add
// (row_generic, row_live_taps).
// Figures (inspect, static SASS; no GPU measured), 4-byte accumulators, sm_90 [sm_80]: the
// report's fwd / dgrad hot loop is row_roll's, 78 instructions per 64 FFMA (82%); the rest is
// straight-line code: tile_rows_window's math block 3x3 369 [365] instructions per 288 FFMA
// (78% [79%]), 5x5 500 [496] per 400 (80% [81%]); per-row windows (float32, sm_90) 3x3 s1 35 /
// 24, 3x3 s2 43 / 24, 5x5 s1 55 / 40, 5x5 s2 62 / 40 (dgrad 3x3 36 / 24).
// wgrad: 4-byte accumulators at stride 1 run channel quads on the strip tiles (channels_first: see below)
// (wgrad_quad: a thread sums 4 channels of one output row of 8 pixels, dy in registers, 16-byte
// shared loads), whose report's hot loop is the 4-pixel loop of wgrad_quad_row (dy loads, x
// loads, FFMA; 160 FFMA): float32 194 [194] instructions (82%), 16-bit 207 [207] (77%: the dy
// widening, one instruction per dy element and 10 FFMA: with the 16 x loads and 4 dy loads 196
// before any address or loop instruction, and 4 pixels a trip need at least 9 more (4 dy
// addresses, the second kernel row's address, 2 pointer steps, compare, back edge: 205, 78%),
// so not 80% within 128 registers; docs/kernels.md, k14-dw16);
// per thread and tile, x copies and walk included (inspect's 56 x 56 layer, 8 x 32 tile,
// estimated from the static bodies), 3x3 float32 about 2.2 instructions per FFMA (the row
// strips: about 2.8); docs/kernels.md. channels_first with 4-byte accumulators and transposable,
// 32-byte aligned sources runs the same quads on the same strip tiles, both tiles copied by
// load_tile_transposed into planes of 4 lanes (planar_pixels: 16 bytes a pixel, an odd pixel count
// a plane, no bank conflicts; x + dy within DW_WG_CF_MAX_SHARED = 82,944 bytes, opt-in dynamic shared
// memory above 48 KB, 2 blocks per SM on sm_80 and sm_90) and dy read from its tile
// (wgrad_quad_row_tile): hot loop 187 instructions per 160 FFMA (86%) in every 4-byte dtype,
// before 372-420 per 120 (29-32%); per thread and tile (3x3, 56 x 56, estimated) float32 about 18.5
// -> 10.7 instructions per FFMA, 16-bit 24.4 -> 7.5, the transposing loader most of it.
// float64 NHWC (5x5 rows, both loaders) 286 [277] per 120 DFMA, NCHW 354: their loaders, not
// their math, hold most of it. channels_last
// copies through load_tile_vec_walk (fwd and stride-1 dgrad too), 13-14 instructions a 16-byte
// copy in float32 / float64 (cp.async; + 3 never-executed `@!PT LDS` the compiler pads LDGSTS
// with), 34-36 in 16-bit (widening, two stores), against 38-42 / 57-65 in load_tile_vec (sm_90).
// 0 spills, no stack (`python -m gpuk.kernels.build --check`).
//
// Tile loads: 16-byte global loads where the layout allows (load_tile_vec: channels_last,
// DW_VEC channels of a pixel; load_tile_vec_cf: channels_first, DW_VEC pixels along W, 4-byte
// tile words, warp y on lane group y % DW_VEC_GROUPS for the whole call; load_tile_transposed:
// channels_first wgrad, every dtype, planes that are whole vectors), else one element per lane
// (load_tile); one loader of each kind per layout (#if DW_CHANNELS_LAST); channels_last tiles
// without stride holes (wgrad, fwd, stride-1 dgrad) go through load_tile_vec_walk instead (steps
// precomputed per block or tile, cp.async where the tile holds the loaded type). Positions
// advance by adds from tile_start's (the divisions, once per tile shape: wgrad computes them
// before its tile loop, which then holds no division). wgrad's tile loop is instantiated per
// math path and loader (wgrad_tiles), chosen per block.
//
// Address math: a 64-bit base per sample (n * C * pixels); offsets inside a sample are
// 32-bit (the launcher keeps C * pixels < 2^31), tile offsets are 32-bit shared indices.
#include "conv_common.cuh"

#ifndef DW_CHANNELS
#define DW_CHANNELS 32       // threadIdx.x: a lane = one channel of the block's channel tile
#endif
#ifndef DW_ROWS
#define DW_ROWS 8            // threadIdx.y: (tile row, segment) pairs
#endif
#ifndef DW_PIX
#define DW_PIX 8             // register blocking: consecutive output pixels along W per thread
#endif
#ifndef DW_CHANNELS_LAST
#define DW_CHANNELS_LAST 1   // 1: (N, *spatial, C); 0: (N, C, *spatial)
#endif
#ifndef DW_WG_TAPS
#define DW_WG_TAPS 15        // wgrad: most taps a block reduces at once (one register sum each)
#endif
#define DW_THREADS (DW_CHANNELS * DW_ROWS)
#define DW_PITCH (DW_CHANNELS_LAST ? DW_CHANNELS : DW_CHANNELS + 1)
// channels_first wgrad's tiles copied by load_tile_transposed (16-byte shared stores): a pixel
// padded by 16 bytes (36 words, or 34 float64), so that 8 consecutive pixels (a quarter warp's
// stores) start on 8 distinct 4-bank groups while one pixel's lanes stay in distinct banks.
#define DW_TRANSPOSED_PITCH (DW_CHANNELS + 16 / (int)sizeof(acc_t))
// 16 bytes of lanes (4 float32, 2 float64): load_tile_transposed's unit of storage
#define DW_CHUNK (16 / (int)sizeof(acc_t))
// 2 blocks of 256 threads per SM leave up to 128 registers per thread (no spills, see
// `python -m gpuk.kernels.build --check`); 16 warps still hide the shared-memory latency.
// The forward kernel asks for 3 (at most 80 registers) where it accumulates in float32: left at
// 2 the compiler spends 95-96 (the 16-bit channels_last build on sm_80 went from 80 to 96 with
// the wave-6 16-byte loaders), so 16 warps per SM instead of 24; at 80 no path spills and no
// hot loop gets longer. Shared memory (13 KB a block at the usual tiles) is not the limit.
constexpr int DW_FWD_BLOCKS = sizeof(acc_t) == 4 ? 3 : 2;

// Element (ch, pix) of one sample of a tensor with `pixels` pixels and `channels` channels.
__device__ __forceinline__ unsigned sample_offset(unsigned ch, unsigned pix, unsigned channels, unsigned pixels) {
#if DW_CHANNELS_LAST
    (void)pixels;
    return pix * channels + ch;
#else
    (void)channels;
    return ch * pixels + pix;
#endif
}

// Where a tile of source pixels comes from. A source coordinate v is "virtual": it reads
// src[v / up] when v is a multiple of `up` inside the source and 0 otherwise (forward and
// wgrad: up = 1, zero padding only; dgrad: up = stride, i.e. dy with the stride holes
// filled by zeros, so dgrad runs as a stride-1 correlation with the flipped filter).
struct DwSource {
    const elem_t* __restrict__ sample;   // this sample's first element (64-bit base)
    unsigned channels, pixels;           // of the real source
    int h, w, up_h, up_w;
    int ch_div, ch_mul, ch_add;          // source channel of tile lane j: (j / div) * mul + add
    int lanes;                           // channels j0 + lane < lanes exist
};

// Virtual coordinate v of a source dimension of n real elements, zero-stuffed by `up`
// (HOLES: up may exceed 1): the real index, or -1 for padding / a stride hole.
template <bool HOLES>
__device__ __forceinline__ int real_index(int v, int up, int n) {
    if (HOLES && up > 1) {
        const int r = v / up;
        return v >= 0 && r * up == v && r < n ? r : -1;
    }
    return v >= 0 && v < n ? v : -1;
}

// The same, clamped into the source (a neighbour of v); `inside` is cleared when v is not real.
template <bool HOLES>
__device__ __forceinline__ int clamped_index(int v, int up, int n, bool& inside) {
    const int c = max(v, 0);
    const bool holes = HOLES && up > 1;
    const int r = holes ? c / up : c;
    inside = inside && v >= 0 && (!holes || r * up == c) && r < n;
    return min(r, n - 1);
}

// Source channel of tile lane j (one division only with a depth multiplier).
__device__ __forceinline__ unsigned source_channel(const DwSource& s, int j) {
    return (unsigned)((s.ch_div == 1 ? j : j / s.ch_div) * s.ch_mul + s.ch_add);
}

// tile[row][col][lane] = source element (virtual row vh0 + row, column vw0 + col) of tile lane
// `lane`, or 0. Lanes whose element is padding, a stride hole or past the last channel read a
// clamped in-bounds element and keep 0, so every lane of a warp issues the load (one request);
// `load` = false (uniform per warp: padding rows, planes outside) skips the read.
template <bool HOLES>
__device__ __forceinline__ void load_element(acc_t* tile, const DwSource& s, int sd, int vh0, int vw0, int row,
                                             int col, int cols, int lane, int j0, bool load) {
    acc_t v = acc_t(0);
    if (load) {
        bool inside = j0 + lane < s.lanes;
        const int sh = clamped_index<HOLES>(vh0 + row, s.up_h, s.h, inside);
        const int sw = clamped_index<HOLES>(vw0 + col, s.up_w, s.w, inside);
        const unsigned ch = source_channel(s, min(j0 + lane, s.lanes - 1));
        const unsigned pix = ((unsigned)sd * s.h + sh) * s.w + sw;
        const acc_t loaded = to_acc(s.sample[sample_offset(ch, pix, s.channels, s.pixels)]);
        v = inside ? loaded : acc_t(0);
    }
    tile[(row * cols + col) * DW_PITCH + lane] = v;
}

// channels_last, 16-byte loads: DW_VEC neighbouring channels of a pixel per global load
// (4 float32, 8 float16/bfloat16, 2 float64), converted once and stored as DW_VEC acc_t words.
constexpr int DW_VEC = 16 / (int)sizeof(elem_t);
constexpr int DW_VECS_PER_PIXEL = DW_CHANNELS / DW_VEC;
constexpr int DW_VEC_PIXEL_STEP = DW_THREADS / DW_VECS_PER_PIXEL;   // pixels one pass of the block copies

// The DW_VEC elements of a 16-byte load `raw` widened to acc_t and stored at dst (16-byte
// aligned shared memory); the first argument picks the element type. float32 / float64 store
// the bits as loaded. 16-bit sources make 32 bytes, two 16-byte stores: `b_first` says whether
// the load's second 8 bytes go first (bank spreading, see load_tile_vec); the halves are
// swapped as raw words (4 selects) before they are widened, not after (8).
__device__ __forceinline__ void store_widened(const float*, float* dst, uint4 raw, bool) { store_uint4(dst, raw); }
__device__ __forceinline__ void store_widened(const double*, double* dst, uint4 raw, bool) { store_uint4(dst, raw); }
__device__ __forceinline__ float half_bits(unsigned bits) { return __half2float(__ushort_as_half((unsigned short)bits)); }
__device__ __forceinline__ float4 widen4(const __half*, uint2 w) {
    return make_float4(half_bits(w.x & 0xffffu), half_bits(w.x >> 16), half_bits(w.y & 0xffffu), half_bits(w.y >> 16));
}
// bfloat16 -> float32: the 16 bits become the high half of the float's bits
__device__ __forceinline__ float4 widen4(const __nv_bfloat16*, uint2 w) {
    return make_float4(__uint_as_float(w.x << 16), __uint_as_float(w.x & 0xffff0000u), __uint_as_float(w.y << 16),
                       __uint_as_float(w.y & 0xffff0000u));
}
template <class Half>   // __half, __nv_bfloat16
__device__ __forceinline__ void store_widened(const Half* type, float* dst, uint4 raw, bool b_first) {
    const uint2 first = b_first ? make_uint2(raw.z, raw.w) : make_uint2(raw.x, raw.y);
    const uint2 second = b_first ? make_uint2(raw.x, raw.y) : make_uint2(raw.z, raw.w);
    store_float4(dst + (b_first ? 4 : 0), widen4(type, first));
    store_float4(dst + (b_first ? 0 : 4), widen4(type, second));
}
// The same with `planes` 16-byte units from one 16-byte chunk of lanes to the next (the 16-bit
// sources' 8 lanes are two chunks): 1 where a pixel's lanes are contiguous (load_tile_transposed's
// pixel-major tiles), a plane of the tile where they are not (its planar tiles). (In 16-byte units,
// so that the compiler keeps the second store one STS.128: an element offset it cannot prove
// aligned splits it into four.)
__device__ __forceinline__ void store_widened_planes(const float*, float* dst, uint4 raw, int) { store_uint4(dst, raw); }
__device__ __forceinline__ void store_widened_planes(const double*, double* dst, uint4 raw, int) { store_uint4(dst, raw); }
template <class Half>   // __half, __nv_bfloat16
__device__ __forceinline__ void store_widened_planes(const Half* type, float* dst, uint4 raw, int planes) {
    float4* chunk = reinterpret_cast<float4*>(dst);
    chunk[0] = widen4(type, make_uint2(raw.x, raw.y));
    chunk[planes] = widen4(type, make_uint2(raw.z, raw.w));
}

// Whether a tile of `s` can be copied with 16-byte loads (uniform per block):
//   channels_last: tile lane j reads source channel j (no depth multiplier between them), whole
//     aligned vectors of DW_VEC channels;
//   channels_first: DW_VEC pixels along W of one channel per load; 4-byte tile words (not
//     float64), no stride holes along W, every sample 32-byte aligned (whole sectors).
__device__ __forceinline__ bool vector_source(const DwSource& s) {
#if DW_CHANNELS_LAST
    return s.ch_div == 1 && s.ch_mul == 1 && s.ch_add == 0 && s.channels % DW_VEC == 0 && is_aligned(s.sample, 16);
#else
    return sizeof(acc_t) == 4 && s.up_w == 1 && s.channels * s.pixels % (2 * DW_VEC) == 0 && is_aligned(s.sample, 32);
#endif
}
// Whether this build has load_tile's 16-byte loader (channels_first: 4-byte tile words, so not
// float64); fwd / dgrad and channels_first wgrad on sources that are not transposable_source.
constexpr bool DW_VEC_LOADS = DW_CHANNELS_LAST || sizeof(acc_t) == 4;

// The DW_VEC elements of a 16-byte load widened to acc_t in registers (channels_first).
__device__ __forceinline__ void widen(const float*, uint4 raw, acc_t (&v)[DW_VEC]) {
    const unsigned words[4] = {raw.x, raw.y, raw.z, raw.w};
#pragma unroll
    for (int i = 0; i < DW_VEC && i < 4; ++i) v[i] = __uint_as_float(words[i]);
}
__device__ __forceinline__ void widen(const double*, uint4, acc_t (&)[DW_VEC]) {}   // never called (no f64 vectors)
__device__ __forceinline__ void widen(const __half*, uint4 raw, acc_t (&v)[DW_VEC]) {
    const unsigned words[4] = {raw.x, raw.y, raw.z, raw.w};
#pragma unroll
    for (int i = 0; i < DW_VEC / 2 && i < 4; ++i) {
        v[2 * i] = half_bits(words[i] & 0xffffu);
        v[2 * i + 1] = half_bits(words[i] >> 16);
    }
}
__device__ __forceinline__ void widen(const __nv_bfloat16*, uint4 raw, acc_t (&v)[DW_VEC]) {
    const unsigned words[4] = {raw.x, raw.y, raw.z, raw.w};
#pragma unroll
    for (int i = 0; i < DW_VEC / 2 && i < 4; ++i) {
        v[2 * i] = __uint_as_float(words[i] << 16);
        v[2 * i + 1] = __uint_as_float(words[i] & 0xffff0000u);
    }
}

// v[m] <- v[(m + r) % DW_VEC] for a run-time r (selects, no indexed registers).
__device__ __forceinline__ void rotate(acc_t (&v)[DW_VEC], int r) {
#pragma unroll
    for (int b = 1; b < DW_VEC; b <<= 1) {
        acc_t t[DW_VEC];
#pragma unroll
        for (int m = 0; m < DW_VEC; ++m) t[m] = (r & b) ? v[(m + b) % DW_VEC] : v[m];
#pragma unroll
        for (int m = 0; m < DW_VEC; ++m) v[m] = t[m];
    }
}

// The channels_first loaders' task (outer, row, k) = threadIdx.y, + DW_ROWS, ... as digits of
// task = k + chunks * (row + rows * outer) (outer: a lane, or a group of DW_VEC lanes): the
// divisions once per tile shape (tile_start), then DW_ROWS's digits added with one carry each (d_k < chunks and
// d_row < rows, so a digit passes its base at most once; outer takes the rest).
struct ChunkTasks {
    int outer, row, k;
    int d_outer, d_row, d_k, rows, chunks;
    __device__ __forceinline__ ChunkTasks(int rows_, int chunks_) : rows(rows_), chunks(chunks_) {
        const int per_outer = rows * chunks, task = threadIdx.y;
        outer = task / per_outer, row = task % per_outer / chunks, k = task % per_outer % chunks;
        d_outer = DW_ROWS / per_outer, d_row = DW_ROWS % per_outer / chunks, d_k = DW_ROWS % per_outer % chunks;
    }
    __device__ __forceinline__ void advance() {
        k += d_k;
        if (k >= chunks) {
            k -= chunks;
            ++row;
        }
        row += d_row;
        if (row >= rows) {
            row -= rows;
            ++outer;
        }
        outer += d_outer;
    }
};

// Where this thread's walk over a rows x cols tile starts: the loaders' divisions, done once
// per tile shape (wgrad computes both of its tiles' starts before its tile loop). vec: the
// 16-byte loader will run (vector_source); up_w: the source's stride holes along W.
#if DW_CHANNELS_LAST
struct DwTileStart { int row, col; };   // of the thread's first pixel
__device__ __forceinline__ DwTileStart tile_start(int rows, int cols, bool vec, int up_w) {
    (void)rows; (void)up_w;
    if (!vec) return {0, (int)threadIdx.y};   // pixel threadIdx.y: cols >= DW_PIX >= DW_ROWS
    const int pix = (threadIdx.y * DW_CHANNELS + threadIdx.x) / DW_VECS_PER_PIXEL, row = pix / cols;
    return {row, pix - row * cols};
}
#else
// chunks of 32 columns per tile row: aligned on the source row's 32-element boundaries (one
// more chunk) unless the row has stride holes
struct DwTileStart { ChunkTasks tasks; };
__device__ __forceinline__ DwTileStart tile_start(int rows, int cols, bool vec, int up_w) {
    (void)vec;
    return {ChunkTasks(rows, (cols + (up_w == 1 ? 2 * DW_CHANNELS - 2 : DW_CHANNELS - 1)) / DW_CHANNELS)};
}
#endif

// What load_tile_transposed's thread (channels_first) copies of a source, the same for every
// tile: its lane's plane start and whether that lane exists, and `lead`, the columns from the
// start of its vector's 32-byte sector to the vector (a sector starts a vector early in the
// odd-numbered planes when a plane is an odd number of vectors). Computed once per block (one
// division with a depth multiplier), not per tile.
struct DwGroupLanes {
    unsigned plane_start;
    int lead;
    bool loads;
};

#if DW_CHANNELS_LAST
// load_tile for vector_source(s): thread tid copies the DW_VEC channels (tid % DW_VECS_PER_PIXEL)
// * DW_VEC.. of pixels tid / DW_VECS_PER_PIXEL, + DW_VEC_PIXEL_STEP, ...: a quarter warp moves
// 128 contiguous bytes of one pixel (coalesced), and its 16-byte shared stores hit distinct
// banks (16-bit sources: each thread writes its two 16-byte halves in an order that alternates
// with the pixel, so the two pixels a quarter warp covers use different banks). Row and column
// advance by adds from tile_start's position: no division per call or element. Channels past `lanes` are zeros
// (lanes is a multiple of DW_VEC, so a vector is wholly inside or outside).
template <bool HOLES>
__device__ __forceinline__ void load_tile_vec(acc_t* tile, const DwSource& s, int sd, int vh0, int vw0, int rows,
                                              int cols, int j0, DwTileStart at) {
    const int tid = threadIdx.y * DW_CHANNELS + threadIdx.x;
    const int lane0 = tid % DW_VECS_PER_PIXEL * DW_VEC;
    const bool half_order = (tid / DW_VECS_PER_PIXEL) & 1;
    const bool load = sd >= 0 && j0 + lane0 < s.lanes;
    const elem_t* __restrict__ src = s.sample + (unsigned)max(sd, 0) * s.h * s.w * s.channels + j0 + lane0;
    int pix = tid / DW_VECS_PER_PIXEL, row = at.row, col = at.col;
    for (const int total = rows * cols; pix < total; pix += DW_VEC_PIXEL_STEP) {
        const int sh = real_index<HOLES>(vh0 + row, s.up_h, s.h), sw = real_index<HOLES>(vw0 + col, s.up_w, s.w);
        uint4 raw = make_uint4(0u, 0u, 0u, 0u);
        if (load && sh >= 0 && sw >= 0) raw = load_uint4(src + ((unsigned)sh * s.w + sw) * s.channels);
        store_widened(static_cast<const elem_t*>(nullptr), tile + pix * DW_PITCH + lane0, raw, half_order);
        col += DW_VEC_PIXEL_STEP;
        while (col >= cols) {
            col -= cols;
            ++row;
        }
    }
    __syncwarp();   // the last pass may leave some threads of a warp out
}

// The same copy of a rows x cols tile without stride holes, its walk precomputed (wgrad: once
// per block; fwd and stride-1 dgrad: per tile): the pixels and channels of load_tile_vec, but
// what is the same for every tile is computed once (DwVecWalk: the thread's first pixel, the step of
// DW_VEC_PIXEL_STEP pixels as columns and as a source offset, the carry's extra offset). A copy
// tracks its source column c and offset off = (row * w + c) * C only: the pixel is inside iff
// c < w and off < h * w * C (unsigned; c inside, the offset's range is the row's), so a copy is
// two compares, one 64-bit address (IMAD.WIDE from a base the compiler may not re-derive), the
// load, the store and a step of adds with one carry.
struct DwVecWalk {
    int row, col, d_col, total, step, carry, lane0;
    bool load, half_order;
};
__device__ __forceinline__ DwVecWalk vec_walk(const DwSource& s, int rows, int cols, int j0) {
    const int tid = threadIdx.y * DW_CHANNELS + threadIdx.x, pix = tid / DW_VECS_PER_PIXEL;
    const int d_row = DW_VEC_PIXEL_STEP / cols;
    DwVecWalk v;
    v.row = pix / cols;
    v.col = pix - v.row * cols;
    v.d_col = DW_VEC_PIXEL_STEP - d_row * cols;
    v.total = rows * cols;
    v.step = (d_row * s.w + v.d_col) * (int)s.channels;
    v.carry = (s.w - cols) * (int)s.channels;
    v.lane0 = tid % DW_VECS_PER_PIXEL * DW_VEC;
    v.load = j0 + v.lane0 < s.lanes;
    v.half_order = pix & 1;
    return v;
}
// The pointer as the compiler must take it (no re-association of the copies' 64-bit address
// math with the kernel parameter; the emulator builds it as plain C++). The loads through it
// say __ldg, as the parameter's const __restrict__ no longer reaches them.
__device__ __forceinline__ const elem_t* opaque_pointer(const elem_t* p) {
#if !defined(GPUK_EMULATE) && defined(__CUDA_ARCH__)
    asm("" : "+l"(p));
#endif
    return p;
}
// src: the source's sample base at plane sd plus j0 + lane0; plane: sd is inside (else zeros).
__device__ __forceinline__ void load_tile_vec_walk(acc_t* tile, const DwSource& s, const elem_t* src, bool plane,
                                                   int vh0, int vw0, int cols, const DwVecWalk& v) {
    src = opaque_pointer(src);
    int c = vw0 + v.col, off = ((vh0 + v.row) * s.w + c) * (int)s.channels;
    const int c_end = vw0 + cols;
    const unsigned w = (unsigned)s.w, limit = (unsigned)s.h * s.w * s.channels;
    const bool load = plane && v.load;
    acc_t* dst = tile + (threadIdx.y * DW_CHANNELS + threadIdx.x) / DW_VECS_PER_PIXEL * DW_PITCH + v.lane0;
    acc_t* const end = tile + v.total * DW_PITCH;
#pragma unroll 1
    for (; dst < end; dst += DW_VEC_PIXEL_STEP * DW_PITCH) {
        const bool inside = load && (unsigned)c < w && (unsigned)off < limit;
        if constexpr (sizeof(elem_t) == sizeof(acc_t)) {   // stored as loaded: cp.async, zeros outside
            cp_async_16_zfill(dst, src + off, inside);
        } else {
            uint4 raw = make_uint4(0u, 0u, 0u, 0u);
            if (inside) raw = __ldg(reinterpret_cast<const uint4*>(src + off));
            store_widened(static_cast<const elem_t*>(nullptr), dst, raw, v.half_order);
        }
        c += v.d_col;
        off += v.step;
        if (c >= c_end) {
            c -= cols;
            off += v.carry;
        }
    }
}

#else
// load_tile for vector_source(s), channels_first: warp y copies the DW_VEC lanes (channels)
// (y % DW_VEC_GROUPS) * DW_VEC.. of every tile row, in chunks of 32 source columns that start
// on a 32-element boundary of the source row (as in the element loader: whole sectors); its
// (row, chunk) tasks are y / DW_VEC_GROUPS, + DW_ROWS / DW_VEC_GROUPS, ... (row-major), so a
// thread's lane, source channel and channel base stay put for the whole call (one division at
// most, with a depth multiplier). Thread (c, t) of the warp loads columns t * DW_VEC.. of lane c
// with one 16-byte load (zeros for its elements outside the row) and stores them one word at a
// time, rotated by the chunk's alignment so that the 32 threads of each store hit 32 distinct
// banks (pitch DW_CHANNELS + 1).
constexpr int DW_VEC_GROUPS = DW_CHANNELS / DW_VEC;   // lane groups; also threads per (lane, row, chunk)
template <bool HOLES>
__device__ __forceinline__ void load_tile_vec_cf(acc_t* tile, const DwSource& s, int sd, int vh0, int vw0, int rows,
                                                 int cols, int j0) {
    static_assert(!DW_VEC_LOADS || DW_ROWS % DW_VEC_GROUPS == 0, "whole warps per lane group");
    constexpr int WARPS_PER_GROUP = DW_ROWS / DW_VEC_GROUPS;   // 1 (float32) or 2 (16-bit)
    const int c = threadIdx.x / DW_VEC_GROUPS, t = threadIdx.x % DW_VEC_GROUPS;
    const int lane = threadIdx.y % DW_VEC_GROUPS * DW_VEC + c;
    const bool lane_loads = sd >= 0 && j0 + lane < s.lanes;
    const unsigned plane_start = source_channel(s, min(j0 + lane, s.lanes - 1)) * s.pixels
                                 + (unsigned)max(sd, 0) * s.h * s.w;
    const int chunks = (cols + 2 * DW_CHANNELS - 2) / DW_CHANNELS;   // >= 2 >= WARPS_PER_GROUP: one carry
    acc_t* dst = tile + lane;
    for (int row = 0, k = threadIdx.y / DW_VEC_GROUPS; row < rows; ) {   // uniform per warp
        const int sh = real_index<HOLES>(vh0 + row, s.up_h, s.h);
        const unsigned row_start = plane_start + (unsigned)max(sh, 0) * s.w;
        const int shift = (int)((row_start + vw0) % DW_CHANNELS);   // (unsigned wrap-around: exact modulo 32)
        const int c0 = k * DW_CHANNELS + t * DW_VEC - shift, sw0 = vw0 + c0;   // first element's tile / source column
        // Whole 32-byte sectors (two vectors: threads t and t ^ 1) are loaded when the sector
        // holds a column of the tile and of the row: a request then moves no sector it only
        // partly uses. The tensor is 32-byte aligned and a multiple of 2 * DW_VEC elements long,
        // so such a sector lies inside it; elements outside the row (padding: the neighbouring
        // row's) are set to 0.
        const int s0 = c0 - (t & 1) * DW_VEC, sw_s0 = vw0 + s0;   // the sector's first column
        uint4 raw = make_uint4(0u, 0u, 0u, 0u);
        // (unsigned compares: -2 * DW_VEC < s0 < cols, and the same for sw_s0 and the row)
        if (lane_loads && sh >= 0 && (unsigned)(s0 + 2 * DW_VEC - 1) < (unsigned)(cols + 2 * DW_VEC - 1) &&
            (unsigned)(sw_s0 + 2 * DW_VEC - 1) < (unsigned)(s.w + 2 * DW_VEC - 1))
            raw = load_uint4(s.sample + ((int)row_start + sw0));
        acc_t v[DW_VEC];
        widen(static_cast<const elem_t*>(nullptr), raw, v);
#pragma unroll
        for (int i = 0; i < DW_VEC; ++i)
            if ((unsigned)(sw0 + i) >= (unsigned)s.w) v[i] = acc_t(0);
        const int r = shift & (DW_VEC - 1);
        rotate(v, r);
        acc_t* dst_row = dst + row * cols * DW_PITCH;
#pragma unroll
        for (int m = 0; m < DW_VEC; ++m) {
            const int col = c0 + ((m + r) & (DW_VEC - 1));
            if ((unsigned)col < (unsigned)cols) dst_row[col * DW_PITCH] = v[m];
            __syncwarp();   // threads skip different stores; this keeps each store one warp request
        }
        k += WARPS_PER_GROUP;
        if (k >= chunks) {
            k -= chunks;
            ++row;
        }
    }
}

// One butterfly stage of transpose_group on whole words: the threads that differ in bit `mask`
// of threadIdx.x swap word i + d of the lower one with word i of the upper one (i & d == 0),
// i.e. that thread bit trades places with bit d of the word index. One shuffle per pair.
__device__ __forceinline__ void swap_words(unsigned (&w)[4], int d, int mask) {
    const bool upper = threadIdx.x & mask;
#pragma unroll
    for (int i = 0; i < 4; ++i) {
        if (i & d) continue;
        const unsigned r = __shfl_xor_sync(0xffffffffu, upper ? w[i] : w[i + d], mask);
        w[i] = upper ? r : w[i];
        w[i + d] = upper ? w[i + d] : r;
    }
}

// The same for the 16-bit halves of each word (thread bit 0 against the half index): the
// partner's halves travel two words to a shuffle, packed and unpacked by byte permutes.
__device__ __forceinline__ void swap_halves(unsigned (&w)[4]) {
    const bool upper = threadIdx.x & 1;
    // the upper thread keeps the high halves and sends the low ones; the lower one the reverse
    const unsigned send = upper ? 0x5410u : 0x7632u, keep0 = upper ? 0x3254u : 0x5410u,
                   keep1 = upper ? 0x3276u : 0x7610u;
#pragma unroll
    for (int i = 0; i < 4; i += 2) {
        const unsigned r = __shfl_xor_sync(0xffffffffu, __byte_perm(w[i], w[i + 1], send), 1);
        w[i] = __byte_perm(w[i], r, keep0);
        w[i + 1] = __byte_perm(w[i + 1], r, keep1);
    }
}

// Transposes DW_VEC x DW_VEC elements (4 words: 8 16-bit values, 4 float32 or 2 float64) among
// the DW_VEC threads whose threadIdx.x differ in the bits below DW_VEC: thread c's element m
// moves to thread m's element c. log2(DW_VEC) shuffle stages, 2 shuffles each.
__device__ __forceinline__ void transpose_group(unsigned (&w)[4]) {
    if (DW_VEC == 8) swap_halves(w);
    if (DW_VEC >= 4) swap_words(w, 1, DW_VEC / 4);   // (float64: words 2i, 2i + 1 are element i)
    swap_words(w, 2, DW_VEC / 2);
}

// load_tile_transposed's warp: DW_T_LANES lanes (whole transpose groups, and at least
// DW_CHANNELS / DW_ROWS so that the warps hold every lane) x DW_T_COLS columns per pass, one
// 16-byte vector per thread; DW_T_GROUPS such lane groups.
constexpr int DW_T_LANES = DW_VEC > DW_CHANNELS / DW_ROWS ? DW_VEC : DW_CHANNELS / DW_ROWS;
constexpr int DW_T_COLS = 32 * DW_VEC / DW_T_LANES;
constexpr int DW_T_GROUPS = DW_CHANNELS / DW_T_LANES;

// Whether the tiles of `s` can be copied by load_tile_transposed (uniform per launch): no stride
// holes along W, planes that are whole vectors (the DW_VEC lanes of a transpose group share
// their column alignment), and whole 32-byte sectors (as vector_source). The launcher sizes
// wgrad's tiles at DW_TRANSPOSED_PITCH only where its twin says the sources may pass
// (direct.py wgrad_transposable, all but the alignment): keep the two in step, as a pass here
// that the launcher did not foresee writes past the tiles.
__device__ __forceinline__ bool transposable_source(const DwSource& s) {
    return s.up_w == 1 && s.pixels % DW_VEC == 0 && s.channels * s.pixels % (2 * DW_VEC) == 0 &&
           is_aligned(s.sample, 32);
}

// The first lane of thread (c, v, sub)'s transpose group in the tile: threadIdx.x =
// (sub * DW_T_COLS / DW_VEC + v) * DW_VEC + c.
__device__ __forceinline__ int transposed_lane0() {
    return threadIdx.y % DW_T_GROUPS * DW_T_LANES + (int)threadIdx.x / DW_T_COLS * DW_VEC;
}

// (see DwGroupLanes)
__device__ __forceinline__ DwGroupLanes group_lanes(const DwSource& s, int j0) {
    const int lane = transposed_lane0() + threadIdx.x % DW_VEC, v = threadIdx.x % DW_T_COLS / DW_VEC;
    const unsigned plane_start = source_channel(s, min(j0 + lane, s.lanes - 1)) * s.pixels;
    return {plane_start, (int)((plane_start / DW_VEC + v) & 1) * DW_VEC, j0 + lane < s.lanes};
}

// load_tile for transposable_source(s) (wgrad): warp y copies lane group y % DW_T_GROUPS
// (DW_T_LANES lanes) of every tile row in chunks of DW_T_COLS columns, its (row, chunk) tasks
// y / DW_T_GROUPS, + DW_ROWS / DW_T_GROUPS, ... Thread (c, v, sub) (transposed_lane0) loads
// columns v * DW_VEC.. of lane sub * DW_VEC + c with one 16-byte load; chunks start on 32-byte
// sector boundaries of the row inside its plane, the same columns for every lane (planes are
// whole vectors). The DW_VEC threads of one (v, sub) then transpose their vectors in registers
// (transpose_group), so that thread (c, v, sub) holds column v * DW_VEC + c of lanes
// sub * DW_VEC.., and store them with 16-byte shared stores (a quarter warp stores 8 consecutive
// pixels of one 16-byte chunk of lanes, no bank conflicts: `pitch` DW_TRANSPOSED_PITCH elements a
// pixel and `planes` 1 (16-byte units from one chunk of lanes to the next), pixel-major; or pitch
// DW_CHUNK and `planes` an odd number of pixels, the channel quads' planar tiles, see
// planar_pixels). Whole 32-byte sectors are loaded as in
// load_tile_vec_cf (lanes.lead). A column outside the source row (a loaded vector may hold the
// neighbouring row's elements) is one pixel, all lanes: it is stored as zeros by its own
// predicated store, not by a select per element.
__device__ __forceinline__ void load_tile_transposed(acc_t* tile, const DwSource& s, int sd, int vh0, int vw0,
                                                     int rows, int cols, int j0, const DwGroupLanes& lanes,
                                                     int pitch, int planes) {
    constexpr int WARPS_PER_GROUP = DW_ROWS / DW_T_GROUPS;
    const int c = threadIdx.x % DW_VEC, v = threadIdx.x % DW_T_COLS / DW_VEC;
    const bool loads = sd >= 0 && lanes.loads;
    const int depth_start = max(sd, 0) * s.h;
    // chunks start on the 32-byte sectors of the row, not on 32 elements as in load_tile_vec_cf:
    // a 34-column tile row takes 2 chunks of 32, not 3 (at least WARPS_PER_GROUP: one carry per pass)
    const int chunks = max(WARPS_PER_GROUP, (cols + 2 * DW_VEC - 1 + DW_T_COLS - 1) / DW_T_COLS);
    acc_t* dst_row = tile + transposed_lane0() / DW_CHUNK * planes * DW_CHUNK;
    // The trip count depends on kernel arguments only, so the compiler sees the loop (and its
    // shuffles) run by whole warps; the second warp of a 16-bit group may idle its last pass.
    const int passes = (rows * chunks + WARPS_PER_GROUP - 1) / WARPS_PER_GROUP;
    int row = 0, k = threadIdx.y / DW_T_GROUPS;
    for (int pass = 0; pass < passes; ++pass) {
        const bool live = WARPS_PER_GROUP == 1 || row < rows;
        const int sh = vh0 + row;
        const bool row_real = (unsigned)sh < (unsigned)s.h;   // (not padding)
        const unsigned row_start = (unsigned)(depth_start + (row_real ? sh : 0)) * s.w;   // inside the plane
        const int shift = (int)((row_start + vw0) % (2 * DW_VEC));   // (unsigned wrap-around: an exact modulo)
        const int c0 = k * DW_T_COLS + v * DW_VEC - shift, sw0 = vw0 + c0;   // the vector's first tile / source column
        const int s0 = c0 - lanes.lead, sw_s0 = vw0 + s0;                       // its sector's
        uint4 raw = make_uint4(0u, 0u, 0u, 0u);
        // (unsigned compares: -2 * DW_VEC < s0 < cols, and the same for sw_s0 against the row width)
        if (live && loads && row_real && (unsigned)(s0 + 2 * DW_VEC - 1) < (unsigned)(cols + 2 * DW_VEC - 1) &&
            (unsigned)(sw_s0 + 2 * DW_VEC - 1) < (unsigned)(s.w + 2 * DW_VEC - 1))
            raw = load_uint4(s.sample + (int)(lanes.plane_start + row_start + sw0));
        unsigned w[4] = {raw.x, raw.y, raw.z, raw.w};
        transpose_group(w);
        const int col = c0 + c;
        if (live && (unsigned)col < (unsigned)cols) {
            acc_t* dst = dst_row + col * pitch;
            const elem_t* type = nullptr;
            if ((unsigned)(sw0 + c) < (unsigned)s.w)
                store_widened_planes(type, dst, make_uint4(w[0], w[1], w[2], w[3]), planes);
            else
                store_widened_planes(type, dst, make_uint4(0u, 0u, 0u, 0u), planes);
        }
        k += WARPS_PER_GROUP;
        if (k >= chunks) {
            k -= chunks;
            ++row;
            dst_row += cols * pitch;
        }
    }
}

#endif

// Loads plane `sd` (real index; < 0 = outside, zeros) rows vh0 .. vh0 + rows - 1 and columns
// vw0 .. vw0 + cols - 1 (virtual) of the channel tile starting at j0 into tile[pixel][lane].
// vec: vector_source(s) (the caller's compile-time or block-uniform choice); HOLES: whether
// the source may be zero-stuffed (dgrad); at: tile_start(rows, cols, vec, s.up_w). Positions
// advance by adds with carries: no division per element.
template <bool HOLES>
__device__ __forceinline__ void load_tile(acc_t* tile, const DwSource& s, int sd, int vh0, int vw0, int rows,
                                          int cols, int j0, bool vec, const DwTileStart& at) {
#if DW_CHANNELS_LAST
    if (vec) {
        load_tile_vec<HOLES>(tile, s, sd, vh0, vw0, rows, cols, j0, at);
        return;
    }
    // a warp = the 32 lanes of one pixel; thread (lane, ty) copies pixels ty, ty + DW_ROWS, ...
    // (cols >= DW_PIX >= DW_ROWS: one carry per step at most)
    const int lane = threadIdx.x;
    int pix = threadIdx.y, row = at.row, col = at.col;
    for (const int total = rows * cols; pix < total; pix += DW_ROWS) {
        const bool pixel = real_index<HOLES>(vh0 + row, s.up_h, s.h) >= 0 &&
                           real_index<HOLES>(vw0 + col, s.up_w, s.w) >= 0;
        load_element<HOLES>(tile, s, sd, vh0, vw0, row, col, cols, lane, j0, sd >= 0 && pixel);
        col += DW_ROWS;
        if (col >= cols) {
            col -= cols;
            ++row;
        }
    }
#else
    if constexpr (DW_VEC_LOADS) {   // (not float64: 4-byte tile words)
        if (vec) {
            load_tile_vec_cf<HOLES>(tile, s, sd, vh0, vw0, rows, cols, j0);
            return;
        }
    }
    // A warp = up to 32 columns of one (lane, row). Chunks start on 32-element boundaries of
    // the source row (without stride holes) so a request touches whole sectors; __syncwarp
    // closes each chunk (cheap on the GPU; it also keeps the emulator's per-warp request
    // grouping exact although lanes outside the tile skip). Task = k + chunks * (row + rows *
    // lane), advanced by DW_ROWS with carries.
    const bool align = s.up_w == 1;   // (tile_start counts the chunks the same way)
    const int tasks = rows * at.tasks.chunks * DW_CHANNELS;
    ChunkTasks at_lane = at.tasks;   // outer: the lane
#pragma unroll 1   // (unrolled, its copies would only lengthen the loops that hold it)
    for (int task = threadIdx.y; task < tasks; task += DW_ROWS, at_lane.advance()) {
        const int lane = at_lane.outer, row = at_lane.row, k = at_lane.k;
        const int sh = real_index<HOLES>(vh0 + row, s.up_h, s.h);
        const bool load = sd >= 0 && sh >= 0;
        int shift = 0;
        if (align && load) {   // (unsigned wrap-around keeps the value modulo 32 when vw0 < 0)
            const unsigned ch = source_channel(s, min(j0 + lane, s.lanes - 1));
            const unsigned first = ch * s.pixels + ((unsigned)sd * s.h + sh) * s.w + vw0;
            shift = (int)(first % DW_CHANNELS);
        }
        const int col = k * DW_CHANNELS - shift + (int)threadIdx.x;
        if (col >= 0 && col < cols) load_element<HOLES>(tile, s, sd, vh0, vw0, row, col, cols, lane, j0, load);
        __syncwarp();
    }
#endif
}

// Stores tile_rows x cols results of the channel tile starting at j0 at output rows
// oh0.. / columns ow0.. of plane od of one sample; `acc` is this thread's R runs of DW_PIX
// (tile rows row.. row + R - 1, columns cbase + q * step). channels_last stores straight from
// registers (a warp = 32 channels of a pixel); channels_first stages them in `stage` (the
// caller's tile, after a barrier) so a warp stores 32 pixels along W.
template <int R>
__device__ __forceinline__ void store_tile(elem_t* __restrict__ out_sample, acc_t* stage, const acc_t (&acc)[R][DW_PIX],
                                           int row, int cbase, int step, int tile_rows, int cols, int od, int oh0,
                                           int ow0, int out_h, int out_w, unsigned channels, unsigned pixels, int j0,
                                           int lanes) {
    const int lane = threadIdx.x;
#if DW_CHANNELS_LAST
    (void)stage; (void)cols;
    const int j = j0 + lane;
    if (j >= lanes) return;
#pragma unroll
    for (int r = 0; r < R; ++r) {
        const int oh = oh0 + row + r;
        if (row + r >= tile_rows || oh >= out_h) return;
#pragma unroll
        for (int q = 0; q < DW_PIX; ++q) {
            const int ow = ow0 + cbase + q * step;
            if (ow < out_w)
                out_sample[sample_offset(j, ((unsigned)od * out_h + oh) * out_w + ow, channels, pixels)] =
                    ElementTraits<elem_t>::from_acc(acc[r][q]);
        }
    }
#else
#pragma unroll
    for (int r = 0; r < R; ++r) {
        if (row + r < tile_rows) {
#pragma unroll
            for (int q = 0; q < DW_PIX; ++q)
                stage[((row + r) * cols + cbase + q * step) * DW_PITCH + lane] = acc[r][q];
        }
    }
    __syncthreads();
    // a warp = up to 32 columns of one (lane, row), chunks aligned as in load_tile
    const int chunks = (cols + 2 * DW_CHANNELS - 2) / DW_CHANNELS, tasks = tile_rows * chunks * DW_CHANNELS;
    for (int task = threadIdx.y; task < tasks; task += DW_ROWS) {
        const int k = task % chunks, r = task / chunks % tile_rows, l = task / (chunks * tile_rows);
        const int oh = oh0 + r, j = j0 + l;
        if (oh < out_h && j < lanes) {   // uniform per warp
            const unsigned first = j * pixels + ((unsigned)od * out_h + oh) * out_w + ow0;
            const int col = k * DW_CHANNELS - (int)(first % DW_CHANNELS) + (int)threadIdx.x, ow = ow0 + col;
            if (col >= 0 && col < cols && ow < out_w)
                out_sample[sample_offset(j, ((unsigned)od * out_h + oh) * out_w + ow, channels, pixels)] =
                    ElementTraits<elem_t>::from_acc(stage[(r * cols + col) * DW_PITCH + l]);
        }
        __syncwarp();
    }
#endif
}

// The filter in shared memory (forward, dgrad): the block's lanes' taps of the kernel rows of
// one tile (a plane, a chunk of kernel rows), staged next to the input tile in correlation order
// (dgrad's flip done while staging) and widened to acc_t, as [lane][row][kw]: a kernel row is
// dw_weight_row(k_w) slots (k_w rounded up to DW_PIX, zeros past k_w), so that the math reads a
// row's filter values as whole 16-byte vectors from immediate offsets (2 loads per DW_PIX taps
// in float32) instead of one 64-bit addressed global load per tap.
constexpr int DW_ACC_VEC = 16 / (int)sizeof(acc_t);   // acc_t values per 16-byte shared access

__host__ __device__ constexpr int dw_weight_row(int k_w) { return (k_w + DW_PIX - 1) / DW_PIX * DW_PIX; }

// A lane's slots: `rows` kernel rows plus one 16-byte vector, an odd number of vectors, so
// that the 8 lanes of a quarter warp's 16-byte accesses fall on 8 distinct 4-bank groups.
// (direct.py _dw_weight_bytes mirrors it.)
__host__ __device__ constexpr int dw_weight_pitch(int k_w, int rows) {
    return dw_weight_row(k_w) * rows + DW_ACC_VEC;
}

__device__ __forceinline__ void store_vec(float* p, const float (&v)[4]) {
    store_float4(p, make_float4(v[0], v[1], v[2], v[3]));
}
__device__ __forceinline__ void store_vec(double* p, const double (&v)[2]) {
    *reinterpret_cast<double2*>(p) = make_double2(v[0], v[1]);
}
__device__ __forceinline__ void load_vec(const float* p, float* v) {
    const float4 f = load_float4(p);
    v[0] = f.x, v[1] = f.y, v[2] = f.z, v[3] = f.w;
}
__device__ __forceinline__ void load_vec(const double* p, double* v) {
    const double2 d = *reinterpret_cast<const double2*>(p);
    v[0] = d.x, v[1] = d.y;
}

// N filter values of a row from wr (16-byte aligned, N a multiple of DW_ACC_VEC).
template <int N>
__device__ __forceinline__ void load_weights(const acc_t* wr, acc_t (&v)[N]) {
    static_assert(N % DW_ACC_VEC == 0, "whole vectors");
#pragma unroll
    for (int i = 0; i < N; i += DW_ACC_VEC) load_vec(wr + i, v + i);
}

// One kernel row of a thread's DW_PIX outputs: acc[q] += sum_kw x[q * S + kw] * wr[kw], x read
// from the tile row `x` (pitch DW_PITCH), wr the row's staged filter values. KW and S
// compile-time (dilation 1): the (DW_PIX - 1) * S + KW inputs are loaded once into a register
// window and each feeds up to KW multiply-adds.
template <int KW, int S>
__device__ __forceinline__ void row_window(const acc_t* x, const acc_t* wr, acc_t acc[DW_PIX]) {
    acc_t wk[(KW + DW_ACC_VEC - 1) / DW_ACC_VEC * DW_ACC_VEC], xv[(DW_PIX - 1) * S + KW];
    load_weights(wr, wk);
#pragma unroll
    for (int i = 0; i < (DW_PIX - 1) * S + KW; ++i) xv[i] = x[i * DW_PITCH];
#pragma unroll
    for (int q = 0; q < DW_PIX; ++q)
#pragma unroll
        for (int kw = 0; kw < KW; ++kw) acc[q] += xv[q * S + kw] * wk[kw];
}

// DW_PIX taps of a rolling window (row_roll): x and wr at the first of them (a multiple of
// DW_PIX), win[i % DW_PIX] holding input i of the run. Tap t reads slots (t + q) % DW_PIX;
// once it is done, slot t takes input t + DW_PIX, the one the next tap needs that is not yet
// loaded. TAIL: only the first `live` taps exist (1..DW_PIX), and the loads stop at the last
// input they need.
template <bool TAIL>
__device__ __forceinline__ void roll_taps(const acc_t* x, const acc_t* wr, int live, acc_t win[DW_PIX],
                                          acc_t acc[DW_PIX]) {
    acc_t wv[DW_PIX];
#pragma unroll
    for (int t = 0; t < DW_PIX; ++t) {
        if (TAIL && t >= live) break;
        // one 16-byte vector of filter values at a time (float64: 4 loads, not all 8 values live at once)
        if (t % DW_ACC_VEC == 0) load_vec(wr + t, wv + t);
#pragma unroll
        for (int q = 0; q < DW_PIX; ++q) acc[q] += win[(t + q) % DW_PIX] * wv[t];
        if (!TAIL || t + 1 < live) win[t] = x[(t + DW_PIX) * DW_PITCH];
    }
}

// float64 keeps row_generic for the rows below: rolling spilled 8 bytes in sm_90 channels_first dgrad
constexpr bool DW_ROLL = sizeof(acc_t) == 4;

// Stride 1, dilation 1, any width: a rolling register window. Output q of tap kw reads input
// kw + q, so consecutive taps share DW_PIX - 1 inputs: per tap one shared load, DW_PIX
// multiply-adds and a filter value (16-byte loads, DW_ACC_VEC taps each). The tap loop is
// unrolled DW_PIX deep so that the slot indices are compile-time (the window rotates by
// register renaming, no moves). The loop runs (k_w - 1) / DW_PIX times, i.e. while
// kw + DW_PIX < k_w, so its loads end at input k_w + DW_PIX - 2, the last one needed; the last
// 1..DW_PIX taps run the guarded body. (The loop steps the two pointers only and ends on the
// tile pointer: a tap counter would cost an add and a move per trip.)
__device__ __forceinline__ void row_roll(const acc_t* x, const acc_t* wr, int k_w, acc_t acc[DW_PIX]) {
    acc_t win[DW_PIX];
#pragma unroll
    for (int i = 0; i < DW_PIX; ++i) win[i] = x[i * DW_PITCH];
    const int trips = (k_w - 1) / DW_PIX;
    const acc_t* const x_end = x + trips * DW_PIX * DW_PITCH;
#pragma unroll 1
    for (; x != x_end; x += DW_PIX * DW_PITCH, wr += DW_PIX) roll_taps<false>(x, wr, DW_PIX, win, acc);
    roll_taps<true>(x, wr, k_w - trips * DW_PIX, win, acc);
}

// The generic rows' tap loops are unrolled this deep: 8 taps (4 in float64, which has no
// registers to spare) of loads in flight at once before their multiply-adds.
constexpr int DW_GENERIC_UNROLL = sizeof(acc_t) == 8 ? 4 : 8;

// Any width, stride and dilation: one shared load per multiply-add. S > 0: compile-time
// stride along W (immediate shared offsets), S = 0: s_w at run time. The filter and tile
// pointers step by adds.
template <int S>
__device__ __forceinline__ void row_generic(const acc_t* x, const acc_t* wr, int k_w, int s_w, int dil_w,
                                            acc_t acc[DW_PIX]) {
    const int step = (S > 0 ? S : s_w) * DW_PITCH, x_step = dil_w * DW_PITCH;
#pragma unroll DW_GENERIC_UNROLL
    for (int kw = 0; kw < k_w; ++kw, ++wr, x += x_step) {
        const acc_t wv = *wr;
#pragma unroll
        for (int q = 0; q < DW_PIX; ++q) acc[q] += x[q * step] * wv;
    }
}

// dgrad, stride U > 1 along W: the thread's outputs are U apart, so a tap either meets a
// stride hole for all of them or for none. Taps kw = f, f + 2, ... (U = 2, dilation 1) are
// the live ones; their inputs are consecutive real dy values, U apart in the tile: a register
// window of DW_PIX + NV - 1 values feeds DW_PIX * NV multiply-adds. wr: tap f's filter value.
template <int NV>
__device__ __forceinline__ void row_live_taps2(const acc_t* x, const acc_t* wr, acc_t acc[DW_PIX]) {
    acc_t wk[NV], xv[DW_PIX + NV - 1];
#pragma unroll
    for (int m = 0; m < NV; ++m) wk[m] = wr[2 * m];
#pragma unroll
    for (int i = 0; i < DW_PIX + NV - 1; ++i) xv[i] = x[i * 2 * DW_PITCH];
#pragma unroll
    for (int q = 0; q < DW_PIX; ++q)
#pragma unroll
        for (int m = 0; m < NV; ++m) acc[q] += xv[q + m] * wk[m];
}

// Any width and dilation: the live taps are kw0, kw0 + period, ... (period = U / gcd(U, dil_w)),
// found once per row; each costs one shared load per multiply-add. UC > 0: U at compile time
// (immediate shared offsets), UC = 0: at run time.
template <int UC>
__device__ __forceinline__ void row_live_taps(const acc_t* x, const acc_t* wr, int k_w, int dil_w, int U, int phase,
                                              acc_t acc[DW_PIX]) {
    if (UC > 0) U = UC;
    int kw = 0, period = 1;
    while (kw < k_w && (phase + kw * dil_w) % U != 0) ++kw;
    while ((period * dil_w) % U != 0) ++period;
    const int step = U * DW_PITCH, x_step = period * dil_w * DW_PITCH;
    wr += kw;
    x += kw * dil_w * DW_PITCH;
#pragma unroll DW_GENERIC_UNROLL
    for (; kw < k_w; kw += period, wr += period, x += x_step) {
        const acc_t wv = *wr;
#pragma unroll
        for (int q = 0; q < DW_PIX; ++q) acc[q] += x[q * step] * wv;
    }
}

// phase: the virtual dy column of the thread's first output at kw = 0, modulo U.
__device__ __forceinline__ void conv_row_holes(const acc_t* x, const acc_t* wr, int k_w, int dil_w, int U, int phase,
                                               acc_t acc[DW_PIX]) {
    if (U == 2 && dil_w == 1 && (k_w == 3 || k_w == 5)) {
        const int f = phase;   // first live tap: (phase + f) % 2 == 0
        const int live = (k_w - f + 1) / 2;
        const acc_t* xf = x + f * DW_PITCH;
        if (live == 1) row_live_taps2<1>(xf, wr + f, acc);
        else if (live == 2) row_live_taps2<2>(xf, wr + f, acc);
        else row_live_taps2<3>(xf, wr + f, acc);
        return;
    }
    if (U == 2) row_live_taps<2>(x, wr, k_w, dil_w, U, phase, acc);
    else row_live_taps<0>(x, wr, k_w, dil_w, U, phase, acc);
}

__device__ __forceinline__ void conv_row(const acc_t* x, const acc_t* wr, int k_w, int s_w, int dil_w,
                                         acc_t acc[DW_PIX]) {
    if (dil_w == 1 && k_w == 3 && s_w == 1) row_window<3, 1>(x, wr, acc);
    else if (dil_w == 1 && k_w == 3 && s_w == 2) row_window<3, 2>(x, wr, acc);
    else if (dil_w == 1 && k_w == 5 && s_w == 1) row_window<5, 1>(x, wr, acc);
    else if (dil_w == 1 && k_w == 5 && s_w == 2) row_window<5, 2>(x, wr, acc);
    else if (DW_ROLL && dil_w == 1 && s_w == 1) row_roll(x, wr, k_w, acc);
    else if (s_w == 1) row_generic<1>(x, wr, k_w, s_w, dil_w, acc);
    else if (s_w == 2) row_generic<2>(x, wr, k_w, s_w, dil_w, acc);
    else row_generic<0>(x, wr, k_w, s_w, dil_w, acc);
}

// Stages the filter values of kernel rows kh0 .. kh0 + khc - 1 of plane kd (correlation
// order; `flip`: dgrad's flipped filter) for the block's lanes at wt (see dw_weight_pitch).
// Thread (lane, ty) writes 16-byte vectors ty, ty + DW_ROWS, ... of its lane (a warp: one
// vector of 32 lanes, its global loads coalesced along the filter's channels); lanes that are
// not `live` and slots past k_w get zeros. w_col: the lane's filter column, w_cols apart per
// tap; pitch: dw_weight_pitch of the tile's largest chunk.
__device__ __forceinline__ void stage_weights(acc_t* wt, const elem_t* __restrict__ w, int k_h, int k_w, bool flip,
                                              int kd_filter, int kh0, int khc, int pitch, int w_cols, int w_col,
                                              bool live) {
    const int lane = threadIdx.x, row = dw_weight_row(k_w), vecs = row / DW_ACC_VEC;
    acc_t* dst = wt + lane * pitch;
    for (int i = threadIdx.y; i < khc * vecs; i += DW_ROWS) {
        const int r = i / vecs, kw0 = (i - r * vecs) * DW_ACC_VEC, kh = kh0 + r;
        const int fh = flip ? k_h - 1 - kh : kh;
        acc_t v[DW_ACC_VEC];
#pragma unroll
        for (int e = 0; e < DW_ACC_VEC; ++e) {
            const int kw = kw0 + e, fw = flip ? k_w - 1 - kw : kw;
            v[e] = live && kw < k_w ? to_acc(w[((kd_filter * k_h + fh) * k_w + fw) * w_cols + w_col]) : acc_t(0);
        }
        store_vec(dst + r * row + kw0, v);
    }
}

// The geometry both tiled correlations (forward, dgrad) share: out[o] = sum_t
// src_virtual[o * s - pad + t * dil] * w[tap(t)], tap(t) = t or the flipped tap.
struct DwCorrelation {
    int k_d, k_h, k_w, s_d, s_h, s_w, dil_d, dil_h, dil_w, pad_d, pad_h, pad_w;
    int src_d, up_d;         // source depth (real) and its zero-stuffing factor
    int out_d, out_h, out_w;
    int flip;                // dgrad: the filter flipped in every spatial dim
    int tile_rows, segs, kh_chunk;
    int rows_per_thread;     // 1, or the whole-filter windows' R (rows_window)
};

// Where block blockIdx.x's output tile lies: sample n, plane od, first row oh0 and column ow0.
struct DwBlockTile { int n, od, oh0, ow0; };
__device__ __forceinline__ DwBlockTile block_tile(const DwCorrelation& g) {
    const int cols = g.segs * DW_PIX;
    const int tiles_w = (g.out_w + cols - 1) / cols, tiles_h = (g.out_h + g.tile_rows - 1) / g.tile_rows;
    unsigned b = blockIdx.x;
    const int tw = b % tiles_w; b /= tiles_w;
    const int th = b % tiles_h; b /= tiles_h;
    return {(int)(b / g.out_d), (int)(b % g.out_d), th * g.tile_rows, tw * cols};
}

// Thread mapping, tiling: see the file header. For each input plane kd (skipped when it
// lies in the padding or a stride hole: uniform per block) and each chunk of kh_chunk
// kernel rows, the block loads the input tile (rows (tile_rows-1)*s_h + (kh_chunk-1)*dil_h + 1,
// columns (segs*DW_PIX-1)*s_w + (k_w-1)*dil_w + 1) between two barriers, then every thread
// runs conv_row for its run. `groups` > 1 (dgrad, M > 1) repeats this per multiplier m
// with its own source channel and filter column. No atomics.
__device__ __forceinline__ void tile_correlation(DwSource src, const elem_t* __restrict__ w, elem_t* __restrict__ out,
                                                 const DwCorrelation& g, unsigned out_channels,
                                                 int groups, int w_cols, int w_col_mul) {
    extern __shared__ unsigned char dw_shared_raw[];
    // the staged filter (DW_CHANNELS lanes x w_pitch, whole 16-byte vectors), then the input tile
    acc_t* wt = reinterpret_cast<acc_t*>(dw_shared_raw);
    const int w_pitch = dw_weight_pitch(g.k_w, g.kh_chunk);
    acc_t* tile = wt + DW_CHANNELS * w_pitch;
    const int cols = g.segs * DW_PIX;
    const DwBlockTile bt = block_tile(g);
    const int n = bt.n, od = bt.od, oh0 = bt.oh0, ow0 = bt.ow0;
    const int j0 = blockIdx.y * DW_CHANNELS, lane = threadIdx.x, j = j0 + lane;
    const int row = threadIdx.y / g.segs, seg = threadIdx.y % g.segs;
    // A thread's DW_PIX outputs: columns cbase + q * U of the tile. U = 1 (consecutive) except
    // for dgrad with stride s_w dividing segs: U = s_w interleaves U segments, so that stride
    // holes along W are skipped per tap (conv_row_holes).
    const int U = src.up_w > 1 && g.segs % src.up_w == 0 ? src.up_w : 1;
    const int cbase = (seg / U) * DW_PIX * U + seg % U;
    const int cols_in = (cols - 1) * g.s_w + (g.k_w - 1) * g.dil_w + 1;
    src.sample += (long long)n * src.channels * src.pixels;
    const unsigned out_pixels = (unsigned)g.out_d * g.out_h * g.out_w;
    const bool active = row < g.tile_rows && j < src.lanes;
    const acc_t* w_lane = wt + lane * w_pitch;
    acc_t acc[1][DW_PIX];
#pragma unroll
    for (int q = 0; q < DW_PIX; ++q) acc[0][q] = acc_t(0);
    const bool holes = src.up_h > 1 || src.up_w > 1;
    for (int m = 0; m < groups; ++m) {
        src.ch_add = m;
        const bool vec = vector_source(src);
        // filter column of this thread's channel; rows of taps are w_cols apart
        const bool lane_live = j < src.lanes;   // (threads past the tile's rows stage filter values too)
        const int w_col = lane_live ? j * w_col_mul + m : 0;
        for (int kd = 0; kd < g.k_d; ++kd) {
            const int vd = od * g.s_d - g.pad_d + kd * g.dil_d;
            const int sd = vd / g.up_d;
            if (vd < 0 || sd * g.up_d != vd || sd >= g.src_d) continue;   // uniform per block
            for (int kh0 = 0; kh0 < g.k_h; kh0 += g.kh_chunk) {
                const int khc = min(g.kh_chunk, g.k_h - kh0);
                const int rows_in = (g.tile_rows - 1) * g.s_h + (khc - 1) * g.dil_h + 1;
                __syncthreads();   // the previous tile is no longer read
                const int vh0 = oh0 * g.s_h - g.pad_h + kh0 * g.dil_h, vw0 = ow0 * g.s_w - g.pad_w;
                const DwTileStart at = tile_start(rows_in, cols_in, vec, src.up_w);
                if (holes) {
                    load_tile<true>(tile, src, sd, vh0, vw0, rows_in, cols_in, j0, vec, at);
                } else {
#if DW_CHANNELS_LAST
                    if (vec) {
                        const DwVecWalk walk = vec_walk(src, rows_in, cols_in, j0);
                        load_tile_vec_walk(tile, src, src.sample + (unsigned)sd * src.h * src.w * src.channels + j0 +
                                           walk.lane0, true, vh0, vw0, cols_in, walk);
                        if constexpr (sizeof(elem_t) == sizeof(acc_t)) cp_async_wait_all();
                    } else
#endif
                    load_tile<false>(tile, src, sd, vh0, vw0, rows_in, cols_in, j0, vec, at);
                }
                stage_weights(wt, w, g.k_h, g.k_w, g.flip, g.flip ? g.k_d - 1 - kd : kd, kh0, khc, w_pitch, w_cols,
                              w_col, lane_live);
                __syncthreads();
                if (!active) continue;
                for (int kh = kh0; kh < kh0 + khc; ++kh) {
                    // dgrad: a kernel row that lands on a stride-hole row of dy adds only zeros
                    // (uniform per thread row, hence per warp)
                    if (src.up_h > 1 && (oh0 + row - g.pad_h + kh * g.dil_h) % src.up_h != 0) continue;
                    const acc_t* x = tile + ((row * g.s_h + (kh - kh0) * g.dil_h) * cols_in + cbase * g.s_w)
                                     * DW_PITCH + lane;
                    const acc_t* w_row = w_lane + (kh - kh0) * dw_weight_row(g.k_w);
                    if (U > 1)
                        conv_row_holes(x, w_row, g.k_w, g.dil_w, U, ((ow0 + cbase - g.pad_w) % U + U) % U,
                                       acc[0]);
                    else
                        conv_row(x, w_row, g.k_w, g.s_w, g.dil_w, acc[0]);
                }
            }
        }
    }
#if !DW_CHANNELS_LAST
    __syncthreads();   // the tile becomes the staging buffer of the stores
#endif
    store_tile(out + (long long)n * out_channels * out_pixels, tile, acc, row, cbase, U, g.tile_rows, cols, od, oh0,
               ow0, g.out_h, g.out_w, out_channels, out_pixels, j0, src.lanes);
}

// A whole K x K filter at stride 1, dilation 1 (the launcher's depthwise_tile chooses it):
// the thread owns R consecutive output rows of DW_PIX pixels, and each input row's window of
// DW_PIX + K - 1 values, read once from the tile (x: the thread's first input row, row_step
// apart), feeds every one of its output rows that it lies under (output row r takes input row
// i with kernel row i - r). Per thread R + K - 1 rows of loads for R * K * K * DW_PIX
// multiply-adds, where one row per thread (row_window) loads K rows per K * K * DW_PIX. The
// filter (K rows of wl, dw_weight_row(K) apart) is held in registers. Sums run over kernel
// rows, then columns, as in the per-row paths.
template <int K, int R>
__device__ __forceinline__ void rows_window(const acc_t* x, int row_step, const acc_t* wl, acc_t (&acc)[R][DW_PIX]) {
    acc_t wk[K][(K + DW_ACC_VEC - 1) / DW_ACC_VEC * DW_ACC_VEC];
#pragma unroll
    for (int kh = 0; kh < K; ++kh) load_weights(wl + kh * dw_weight_row(K), wk[kh]);
#pragma unroll
    for (int i = 0; i < R + K - 1; ++i) {
        acc_t xv[DW_PIX + K - 1];
#pragma unroll
        for (int c = 0; c < DW_PIX + K - 1; ++c) xv[c] = x[i * row_step + c * DW_PITCH];
#pragma unroll
        for (int r = 0; r < R; ++r) {
            const int kh = i - r;
            if (kh < 0 || kh >= K) continue;
#pragma unroll
            for (int q = 0; q < DW_PIX; ++q)
#pragma unroll
                for (int kw = 0; kw < K; ++kw) acc[r][q] += xv[q + kw] * wk[kh][kw];
        }
    }
}

// tile_correlation for a K x K filter of one plane (k_d = 1) at stride 1 and dilation 1, with
// no stride holes (dgrad: a forward stride of 1) and one multiplier group: the tile (tile_rows =
// R x the thread rows) and the whole filter are loaded once, then each thread runs rows_window
// for its R rows. Straight-line code: the launcher sends nothing else here.
template <int K, int R>
__device__ __forceinline__ void tile_rows_window(DwSource src, const elem_t* __restrict__ w, elem_t* __restrict__ out,
                                                 const DwCorrelation& g, unsigned out_channels, int w_cols,
                                                 int w_col_mul) {
    extern __shared__ unsigned char dw_shared_raw[];
    acc_t* wt = reinterpret_cast<acc_t*>(dw_shared_raw);
    constexpr int W_PITCH = dw_weight_pitch(K, K);
    acc_t* tile = wt + DW_CHANNELS * W_PITCH;
    const int cols = g.segs * DW_PIX, cols_in = cols + K - 1, rows_in = g.tile_rows + K - 1;
    const DwBlockTile bt = block_tile(g);
    const int j0 = blockIdx.y * DW_CHANNELS, lane = threadIdx.x, j = j0 + lane;
    const int row = threadIdx.y / g.segs * R, seg = threadIdx.y % g.segs;   // the thread's first row
    src.sample += (long long)bt.n * src.channels * src.pixels;
    src.ch_add = 0;
    const bool lane_live = j < src.lanes;
    acc_t acc[R][DW_PIX];
#pragma unroll
    for (int r = 0; r < R; ++r)
#pragma unroll
        for (int q = 0; q < DW_PIX; ++q) acc[r][q] = acc_t(0);
    const int sd = bt.od * g.s_d - g.pad_d;   // (k_d = 1, no holes)
    if (sd >= 0 && sd < g.src_d) {   // uniform per block
        const bool vec = vector_source(src);
        const int vh0 = bt.oh0 - g.pad_h, vw0 = bt.ow0 - g.pad_w;
        load_tile<false>(tile, src, sd, vh0, vw0, rows_in, cols_in, j0, vec, tile_start(rows_in, cols_in, vec, 1));
        stage_weights(wt, w, K, K, g.flip, 0, 0, K, W_PITCH, w_cols, lane_live ? j * w_col_mul : 0, lane_live);
        __syncthreads();
        if (lane_live)
            rows_window<K, R>(tile + (row * cols_in + seg * DW_PIX) * DW_PITCH + lane, cols_in * DW_PITCH,
                              wt + lane * W_PITCH, acc);
    }
#if !DW_CHANNELS_LAST
    __syncthreads();   // the tile becomes the staging buffer of the stores
#endif
    const unsigned out_pixels = (unsigned)g.out_d * g.out_h * g.out_w;
    store_tile(out + (long long)bt.n * out_channels * out_pixels, tile, acc, row, seg * DW_PIX, 1, g.tile_rows, cols,
               bt.od, bt.oh0, bt.ow0, g.out_h, g.out_w, out_channels, out_pixels, j0, src.lanes);
}

// The forward and dgrad bodies: the whole-filter windows where the launcher chose them
// (g.rows_per_thread > 1: 3x3 with 4 rows per thread, 5x5 with 2), else tile_correlation.
// Not built for float64: its tiles for them do not fit 48 KB (direct.py _rows_window_tile).
constexpr bool DW_ROWS_WINDOWS = sizeof(acc_t) == 4;
__device__ __forceinline__ void correlate(const DwSource& src, const elem_t* __restrict__ w, elem_t* __restrict__ out,
                                          const DwCorrelation& g, unsigned out_channels, int groups, int w_cols,
                                          int w_col_mul) {
    if constexpr (DW_ROWS_WINDOWS) {
        if (g.rows_per_thread == 4 && g.k_w == 3) {
            tile_rows_window<3, 4>(src, w, out, g, out_channels, w_cols, w_col_mul);
            return;
        }
        if (g.rows_per_thread == 2 && g.k_w == 5) {
            tile_rows_window<5, 2>(src, w, out, g, out_channels, w_cols, w_col_mul);
            return;
        }
    }
    tile_correlation(src, w, out, g, out_channels, groups, w_cols, w_col_mul);
}

// depthwise_fwd: y[n, o, j] = sum_tap x[n, o*s - pad + tap*dil, j / M] * w[tap, j].
// Grid: (N * out_d * row tiles * column tiles, C_out / DW_CHANNELS tiles); see tile_correlation.
// Limits: C * pixels per sample < 2^31, grid.y <= 65535 (launcher checks). No atomics.
extern "C" __global__ void __launch_bounds__(DW_THREADS, DW_FWD_BLOCKS)
depthwise_fwd(const elem_t* __restrict__ x, const elem_t* __restrict__ w, elem_t* __restrict__ y, int batch,
              int c_in, int mult, int in_d, int in_h, int in_w, int out_d, int out_h, int out_w, int k_d, int k_h,
              int k_w, int s_d, int s_h, int s_w, int dil_d, int dil_h, int dil_w, int pad_d, int pad_h, int pad_w,
              int tile_rows, int segs, int kh_chunk, int rows_per_thread) {
    const DwSource src = {x, (unsigned)c_in, (unsigned)in_d * in_h * in_w, in_h, in_w, 1, 1, mult, 1, 0, c_in * mult};
    const DwCorrelation g = {k_d, k_h, k_w, s_d, s_h, s_w, dil_d, dil_h, dil_w, pad_d, pad_h, pad_w, in_d, 1,
                             out_d, out_h, out_w, 0, tile_rows, segs, kh_chunk, rows_per_thread};
    correlate(src, w, y, g, (unsigned)(c_in * mult), 1, c_in * mult, 1);
}

// depthwise_dgrad: dx[n, i, c] = sum_m sum_tap w[tap, c*M + m] * dy[n, o, c*M + m] where
//   o*s - pad + tap*dil == i: the stride-1 correlation of dy with its stride holes filled
//   by zeros (in the tile only) with the flipped filter and padding (k-1)*dil - pad.
//   Hole planes and rows are skipped (uniform per block / warp); along W, when s_w divides
//   the tile's segments, a thread's outputs are s_w apart and it skips the taps that meet
//   holes (conv_row_holes); otherwise (s_w = 3, 5, ...) it multiplies the zeros.
// Grid: (N * in_d * row tiles * column tiles, C_in / DW_CHANNELS tiles). No atomics.
extern "C" __global__ void __launch_bounds__(DW_THREADS, 2)
depthwise_dgrad(const elem_t* __restrict__ dy, const elem_t* __restrict__ w, elem_t* __restrict__ dx, int batch,
                int c_in, int mult, int in_d, int in_h, int in_w, int out_d, int out_h, int out_w, int k_d, int k_h,
                int k_w, int s_d, int s_h, int s_w, int dil_d, int dil_h, int dil_w, int pad_d, int pad_h,
                int pad_w, int tile_rows, int segs, int kh_chunk, int rows_per_thread) {
    const DwSource src = {dy, (unsigned)(c_in * mult), (unsigned)out_d * out_h * out_w, out_h, out_w, s_h, s_w,
                          1, mult, 0, c_in};
    const DwCorrelation g = {k_d, k_h, k_w, 1, 1, 1, dil_d, dil_h, dil_w,
                             (k_d - 1) * dil_d - pad_d, (k_h - 1) * dil_h - pad_h, (k_w - 1) * dil_w - pad_w,
                             out_d, s_d, in_d, in_h, in_w, 1, tile_rows, segs, kh_chunk, rows_per_thread};
    correlate(src, w, dx, g, (unsigned)c_in, mult, c_in * mult, mult);
}

// wgrad: one tile's sums for the block's taps, any kernel width and dilation, stride S along
// W (1 or 2). x: the thread's input run for tap 0 of the group; tap_off[t]: shared offset of
// tap t; dyv: the thread's DW_PIX output gradients. Offsets q * S are immediates. P: the tiles'
// pitch (wgrad_pitch).
template <int S, int P>
__device__ __forceinline__ void wgrad_run(const acc_t* x, const int tap_off[DW_WG_TAPS], int taps,
                                          const acc_t dyv[DW_PIX], acc_t acc[DW_WG_TAPS]) {
#pragma unroll
    for (int t = 0; t < DW_WG_TAPS; ++t) {
        if (t < taps) {
            const acc_t* p = x + tap_off[t];
#pragma unroll
            for (int q = 0; q < DW_PIX; ++q) acc[t] += p[q * S * P] * dyv[q];
        }
    }
}

// The same for a runtime stride (3 and more): a loop over the thread's pixels (each reads its
// dy value from the tile), taps unrolled inside, so that no tap x pixel address table is
// hoisted out of the tile loop into registers (it would spill).
template <int P>
__device__ __forceinline__ void wgrad_run_strided(const acc_t* x, const acc_t* dy, const int tap_off[DW_WG_TAPS],
                                                  int taps, int step, acc_t acc[DW_WG_TAPS]) {
#pragma unroll 1
    for (int q = 0; q < DW_PIX; ++q) {
        const acc_t* p = x + q * step;
        const acc_t d = dy[q * P];
#pragma unroll
        for (int t = 0; t < DW_WG_TAPS; ++t)
            if (t < taps) acc[t] += p[tap_off[t]] * d;
    }
}

// The same with whole kernel rows of compile-time width KW (dilation 1) and stride S: per
// row the (DW_PIX - 1) * S + KW inputs are read once into a register window and feed
// KW * DW_PIX multiply-adds. Row r's taps are r * KW .. r * KW + KW - 1.
template <int KW, int S, int P>
__device__ __forceinline__ void wgrad_rows(const acc_t* x, const int tap_off[DW_WG_TAPS], int taps,
                                           const acc_t dyv[DW_PIX], acc_t acc[DW_WG_TAPS]) {
#pragma unroll
    for (int r = 0; r < DW_WG_TAPS / KW; ++r) {
        if (r * KW < taps) {
            const acc_t* p = x + tap_off[r * KW];
            acc_t xv[(DW_PIX - 1) * S + KW];
#pragma unroll
            for (int i = 0; i < (DW_PIX - 1) * S + KW; ++i) xv[i] = p[i * P];
#pragma unroll
            for (int kw = 0; kw < KW; ++kw)
#pragma unroll
                for (int q = 0; q < DW_PIX; ++q) acc[r * KW + kw] += xv[q * S + kw] * dyv[q];
        }
    }
}

// wgrad's channel quads (channels_last, 4-byte accumulators, stride 1, dilation 1, k_d = 1, 3- or
// 5-wide kernel rows: the strip tiles of depthwise_wgrad_tile, 32 output rows of DW_PIX pixels,
// groups of at most DW_WG_QTAPS taps): the block's 256 threads are 8 channel quads x 32 workers,
// thread (threadIdx.y, threadIdx.x) = quad threadIdx.x % 8 of worker threadIdx.y * 4 +
// threadIdx.x / 8; a worker owns one output row of DW_PIX pixels, a thread its 4 channels
// (DW_WG_QTAPS x 4 register sums). Per tile a thread reads its row's dy values straight from
// global memory, DW_WG_QPIX pixels at a time (wgrad_quad_row: one 16-byte load in float32, 8-byte
// in 16-bit, per pixel; element loads where the sources are not vector_source), and per kernel
// row of the group the DW_WG_QPIX - 1 + KW input pixels under them as 16-byte shared loads (4
// lanes of one pixel), each feeding up to KW x 4 x DW_WG_QPIX FFMA: per DW_WG_QPIX pixels a
// 2-row 5-wide group 160 FFMA per 16 LDS.128 + 4 dy loads, 3x3 144 per 18 + 4 (wgrad_strip, the
// row strips it replaced: per 4 x 8 pixels of one channel, 3x3 288 FFMA per 60 LDS + 32 dy loads
// with their address and bound work). Why 10 taps, 4 pixels at a time and the pixel loop not
// unrolled: 15-tap groups (60 sums) or a whole row of dy in registers spilled (8-200 bytes at the
// 128 registers of 2 blocks per SM). A quarter warp's shared loads are the 8 quads of one pixel
// (128 contiguous bytes: no bank conflict); its dy loads one pixel's 32 channels (coalesced).
// x: the worker's input run for tap 0 of the group; row_pitch: one tile row, in elements;
// kh_rows: the group's kernel rows.
#ifndef DW_WG_QPIX
#define DW_WG_QPIX 4   // pixels of a worker's row whose dy values are in registers at once
#endif
#ifndef DW_WG_QTAPS
#define DW_WG_QTAPS 10   // most taps a quads block reduces at once (4 register sums each)
#endif
__device__ __forceinline__ float4 load_quad16(const float* p) { return __ldg(reinterpret_cast<const float4*>(p)); }
template <class Half>   // __half, __nv_bfloat16: 4 channels in 8 bytes, widened
__device__ __forceinline__ float4 load_quad16(const Half* p) { return widen4(p, __ldg(reinterpret_cast<const uint2*>(p))); }
// VEC: one vector load (the source is vector_source); else the first `lanes` (1-4) channels one
// by one, the others 0
template <bool VEC>
__device__ __forceinline__ float4 load_quad(const elem_t* p, int lanes) {
    if constexpr (VEC) {
        (void)lanes;
        return load_quad16(p);
    } else {
        float v[4];
#pragma unroll
        for (int i = 0; i < 4; ++i) v[i] = i < lanes ? static_cast<float>(__ldg(p + i)) : 0.f;
        return make_float4(v[0], v[1], v[2], v[3]);
    }
}

// 4 lanes of one tile pixel, one LDS.128 (the quads' pixels are 16-byte aligned: channels_last
// DW_PITCH, channels_first DW_CHUNK of a plane, planar_pixels)
template <int P>
__device__ __forceinline__ float4 load_tile_quad(const float* p) {
    static_assert(P % 4 == 0, "channel quads: 16-byte aligned tile pixels");
    return load_float4(p);
}

template <int KW, int P>
__device__ __forceinline__ void wgrad_quad(const float* x, int row_pitch, int kh_rows, const float4 (&dyv)[DW_WG_QPIX],
                                           float* acc) {
    constexpr int KH = DW_WG_QTAPS / KW;
#pragma unroll
    for (int kh = 0; kh < KH; ++kh) {
        if (kh == 0 || kh < kh_rows) {
            const float* p = x + kh * row_pitch;
#pragma unroll
            for (int c = 0; c < DW_WG_QPIX - 1 + KW; ++c) {
                const float4 v = load_tile_quad<P>(p + c * P);
#pragma unroll
                for (int kw = 0; kw < KW; ++kw) {
                    const int q = c - kw;
                    if (q >= 0 && q < DW_WG_QPIX) {
                        float* a = acc + (kh * KW + kw) * 4;
                        a[0] += v.x * dyv[q].x;
                        a[1] += v.y * dyv[q].y;
                        a[2] += v.z * dyv[q].z;
                        a[3] += v.w * dyv[q].w;
                    }
                }
            }
        }
    }
}

// One worker's row: its DW_PIX dy pixels (this thread's 4 channels of each) from global memory,
// DW_WG_QPIX at a time (a loop, not unrolled: the registers), each group feeding wgrad_quad.
// d + off: the row's first pixel (d: the block's channel tile in the dy plane, the same in every
// thread; off: the pixel and the quad's channels), c: the pixel step; BOUNDS: only the first nq
// pixels exist (the others read as 0).
// Without bounds (most rows; the report's hot loop) the loop ends on the running offset (no
// counter), and in 16-bit each pixel q of a group has its own base d + q * c, fixed for the row,
// so that each dy address is one IMAD.WIDE of the offset (4 a group, not 4 + 4 adds): per 160 FFMA
// 16-bit 211 -> 207 instructions, float32 195 -> 194; the same loads and FFMA in the same order.
// (float32 keeps the add chain: its 3 more 64-bit bases spilled on sm_80; so did 16-bit's with d
// still holding the quad's channels, or beside a copy of the loop without the kernel-row tests for
// whole groups, 205.)
#if DW_CHANNELS_LAST   // (channels_first reads dy from its tile: wgrad_quad_row_tile)
template <int KW, int P, bool VEC, bool BOUNDS>
__device__ __forceinline__ void wgrad_quad_row(const float* x, int row_pitch, int kh_rows, const elem_t* d,
                                               unsigned off, unsigned c, int nq, int q_lanes, float* acc) {
    if constexpr (!BOUNDS) {
        constexpr bool BASES = sizeof(elem_t) == 2;   // (a base per pixel: 16-bit)
        const elem_t* dq[DW_WG_QPIX];
#pragma unroll
        for (int q = 0; q < DW_WG_QPIX; ++q) dq[q] = BASES ? opaque_pointer(d + q * c) : d;
        static_assert(DW_PIX % DW_WG_QPIX == 0, "whole groups a row: the loop ends on off == off_end");
        const unsigned off_end = off + DW_PIX * c;
#pragma unroll 1
        do {
            float4 dyv[DW_WG_QPIX];
#pragma unroll
            for (int q = 0; q < DW_WG_QPIX; ++q) dyv[q] = load_quad<VEC>(dq[q] + (BASES ? off : off + q * c), q_lanes);
            wgrad_quad<KW, P>(x, row_pitch, kh_rows, dyv, acc);
            x += DW_WG_QPIX * P;
            off += DW_WG_QPIX * c;
        } while (off != off_end);
    } else {
#pragma unroll 1
        for (int h = 0; h < DW_PIX; h += DW_WG_QPIX) {
            float4 dyv[DW_WG_QPIX];
#pragma unroll
            for (int q = 0; q < DW_WG_QPIX; ++q) {
                dyv[q] = h + q < nq ? load_quad<VEC>(d + off, q_lanes) : make_float4(0.f, 0.f, 0.f, 0.f);
                off += c;
            }
            wgrad_quad<KW, P>(x, row_pitch, kh_rows, dyv, acc);
            x += DW_WG_QPIX * P;
        }
    }
}
#endif

// The same for channels_first (where the sources are wgrad_vector_source): the worker's dy pixels from the dy tile, which
// load_tile_transposed has stored in planes of 4 lanes like x (planar_pixels; zeros outside dy),
// DW_WG_QPIX pixels at a time as 16-byte shared loads at constant offsets (a quarter warp: the 8
// quads of one pixel, one in each plane, 8 distinct 4-bank groups); no bounds, no widening (the tile
// holds floats).
template <int KW, int P>
__device__ __forceinline__ void wgrad_quad_row_tile(const float* x, int row_pitch, int kh_rows, const float* dy,
                                                    float* acc) {
#pragma unroll 1
    for (int h = 0; h < DW_PIX; h += DW_WG_QPIX) {
        float4 dyv[DW_WG_QPIX];
#pragma unroll
        for (int q = 0; q < DW_WG_QPIX; ++q) dyv[q] = load_tile_quad<P>(dy + q * P);
        wgrad_quad<KW, P>(x, row_pitch, kh_rows, dyv, acc);
        x += DW_WG_QPIX * P;
        dy += DW_WG_QPIX * P;
    }
}

// The per-block constants of depthwise_wgrad's walk over its pixel tiles.
struct DwWgradWalk {
    DwSource xs, ds;                      // x and dy, sample 0
    int in_d, out_d, s_d, s_h, s_w, pad_d, pad_h, pad_w, dil_d, dil_h;
    int kd_lo, kh_lo, planes_in, rows_in, cols_in, plane_size;
    int tile_rows, cols, tiles_w, tiles_h, first, last, taps, row, seg;
    bool active;
};

// wgrad's tiles: the shared pitch of a tile pixel and the loader for VEC (both sources are
// wgrad_vector_source): channels_first copies them with load_tile_transposed, at its pitch,
// channels_last with load_tile_vec_walk (in wgrad_tiles); otherwise with load_tile, whose 16-byte loader (`vec`: vector_source(s)) stores word by word
// in channels_first, e.g. 16-bit planes that are not whole vectors (14 x 14).
// channels_first's channel quads (QUAD) store their two tiles as planes of 4 lanes (planar_tile): a
// pixel is DW_CHUNK elements of a plane.
template <bool VEC, bool QUAD = false>
__host__ __device__ constexpr int wgrad_pitch() {
    return !DW_CHANNELS_LAST && VEC ? (QUAD ? DW_CHUNK : DW_TRANSPOSED_PITCH) : DW_PITCH;
}

// channels_first's channel quads (4-byte accumulators, VEC): each tile is DW_CHANNELS / 4 planes of
// 4 lanes, a pixel 16 bytes of its plane, a plane planar_pixels(pixels) pixels; odd, so that the 8
// planes of one pixel start on 8 distinct 4-bank groups (a quarter warp of wgrad_quad reads the 8
// quads of one pixel) and so do 8 consecutive pixels of one plane (load_tile_transposed's quarter
// warp stores): no bank conflicts at 16 bytes a pixel and one pad pixel a plane, against the
// pixel-major tiles' 20 bytes a pixel (DW_TRANSPOSED_PITCH), and the worker's loads stay at constant
// offsets (a swizzled 32-word pitch would need an address per dy pixel). The launcher's twin:
// direct._planar_pixels.
__host__ __device__ constexpr int planar_pixels(int pixels) { return pixels | 1; }

__device__ __forceinline__ bool wgrad_vector_source(const DwSource& s) {
#if DW_CHANNELS_LAST
    return vector_source(s);
#else
    return transposable_source(s);
#endif
}

// QUAD (channels_first, VEC): the planar tiles of the channel quads, `plane` pixels a plane.
template <bool VEC, bool QUAD = false>
__device__ __forceinline__ void wgrad_load_tile(acc_t* tile, const DwSource& s, int sd, int vh0, int vw0, int rows,
                                                int cols, int j0, const DwTileStart& at, const DwGroupLanes& lanes,
                                                bool vec, int plane = 0) {
#if DW_CHANNELS_LAST
    // (VEC runs load_tile_vec_walk in wgrad_tiles; here both tiles take the element loader, as
    // `at` was computed for it)
    static_assert(!VEC, "channels_last wgrad: 16-byte tiles through load_tile_vec_walk");
    (void)lanes; (void)vec; (void)plane;
    load_tile<false>(tile, s, sd, vh0, vw0, rows, cols, j0, false, at);
#else
    if constexpr (VEC)
        load_tile_transposed(tile, s, sd, vh0, vw0, rows, cols, j0, lanes, wgrad_pitch<VEC, QUAD>(),
                             QUAD ? plane : 1);
    else load_tile<false>(tile, s, sd, vh0, vw0, rows, cols, j0, vec, at);
#endif
}

// The tile loop of depthwise_wgrad for one math path, chosen once per block: KW > 0: whole
// kernel rows of width KW (dilation 1) and stride S through wgrad_rows; KW = 0: wgrad_run
// with stride S = 1, 2, or wgrad_run_strided (S = 0: any stride). VEC: the tiles are copied
// with 16-byte loads (wgrad_load_tile). The tile index advances by adds (one division per
// block, before the loop).
template <int KW, int S, bool VEC, bool QUAD = false>
__device__ __forceinline__ void wgrad_tiles(const DwWgradWalk& g, acc_t* x_tile, acc_t* dy_tile,
                                         const int tap_off[DW_WG_TAPS], acc_t* acc) {
    constexpr int P = wgrad_pitch<VEC, QUAD>();
    const int lane = threadIdx.x, j0 = blockIdx.x * DW_CHANNELS;
    unsigned b = g.first;
    int tw = b % g.tiles_w; b /= g.tiles_w;
    int th = b % g.tiles_h; b /= g.tiles_h;
    int od = b % g.out_d, n = b / g.out_d;
    const acc_t* dy_run = dy_tile + (g.row * g.cols + g.seg * DW_PIX) * P + lane;
    const acc_t* x_run = x_tile + (g.row * g.s_h * g.cols_in + g.seg * DW_PIX * g.s_w) * P + lane;
    const DwTileStart x_at = tile_start(g.rows_in, g.cols_in, VEC, 1), dy_at = tile_start(g.tile_rows, g.cols, VEC, 1);
#if DW_CHANNELS_LAST
    const DwGroupLanes x_lanes = {}, dy_lanes = {};
#else
    const DwGroupLanes x_lanes = group_lanes(g.xs, j0), dy_lanes = group_lanes(g.ds, j0);
#endif
    const bool x_vec = vector_source(g.xs), dy_vec = vector_source(g.ds);   // (samples keep sample 0's alignment)
#if DW_CHANNELS_LAST
    const DwVecWalk x_walk = vec_walk(g.xs, g.rows_in, g.cols_in, j0), dy_walk = vec_walk(g.ds, g.tile_rows, g.cols, j0);
    // the 16-byte copies' sample bases (+ j0 + lane0), stepped with n
    const unsigned x_plane = (unsigned)g.xs.h * g.xs.w * g.xs.channels, dy_plane = (unsigned)g.ds.h * g.ds.w * g.ds.channels;
    const elem_t* x_base = g.xs.sample + (long long)n * g.xs.channels * g.xs.pixels + j0 + x_walk.lane0;
    const elem_t* dy_base = g.ds.sample + (long long)n * g.ds.channels * g.ds.pixels + j0 + dy_walk.lane0;
#endif
    // channel quads (see wgrad_quad): this thread's quad, its worker's output row and segment,
    // its input run, how many of its 4 channels exist (4 or none with 16-byte sources)
    const int quad = threadIdx.x % 8, worker = threadIdx.y * (DW_CHANNELS / 8) + threadIdx.x / 8;
    const int wrow = QUAD ? worker / (g.cols / DW_PIX) : 0, wseg = QUAD ? worker % (g.cols / DW_PIX) : 0;
    const acc_t* x_quad = x_tile + (wrow * g.cols_in + wseg * DW_PIX) * P + quad * 4 + tap_off[0];
    const int q_lanes = min(4, g.ds.lanes - (j0 + quad * 4));
    // channels_first QUAD && VEC: the planes of the planar tiles (see planar_pixels), in pixels
    const int x_tplane = planar_pixels(g.rows_in * g.cols_in), dy_tplane = planar_pixels(g.tile_rows * g.cols);
#if !DW_CHANNELS_LAST
    const acc_t* dy_quad = dy_tile + (wrow * g.cols + wseg * DW_PIX) * P + quad * dy_tplane * DW_CHUNK;
    if constexpr (QUAD && VEC) x_quad += quad * (x_tplane * DW_CHUNK - 4);
#endif
    for (int tile = g.first; tile < g.last; ++tile) {
        const int oh0 = th * g.tile_rows, ow0 = tw * g.cols;
        DwSource xn = g.xs, dn = g.ds;
        xn.sample += (long long)n * g.xs.channels * g.xs.pixels;
        dn.sample += (long long)n * g.ds.channels * g.ds.pixels;
        __syncthreads();   // the previous tile is no longer read
#if DW_CHANNELS_LAST
        if constexpr (VEC) {
            if constexpr (QUAD) {   // (the strip tiles: strides and dilations 1, k_d = 1, so one plane)
                const int id = od - g.pad_d;
                const bool inside = id >= 0 && id < g.in_d;
                load_tile_vec_walk(x_tile, g.xs, x_base + (inside ? (unsigned)id * x_plane : 0u), inside,
                                   oh0 - g.pad_h + g.kh_lo, ow0 - g.pad_w, g.cols_in, x_walk);
            } else {
                const int vh0 = oh0 * g.s_h - g.pad_h + g.kh_lo * g.dil_h, vw0 = ow0 * g.s_w - g.pad_w;
                for (int p = 0; p < g.planes_in; ++p) {
                    const int id = od * g.s_d - g.pad_d + g.kd_lo * g.dil_d + p;
                    const bool inside = id >= 0 && id < g.in_d;
                    load_tile_vec_walk(x_tile + p * g.plane_size, g.xs,
                                       x_base + (inside ? (unsigned)id * x_plane : 0u), inside, vh0, vw0, g.cols_in,
                                       x_walk);
                }
            }
            if constexpr (!QUAD)
                load_tile_vec_walk(dy_tile, g.ds, dy_base + (unsigned)od * dy_plane, true, oh0, ow0, g.cols, dy_walk);
            if constexpr (sizeof(elem_t) == sizeof(acc_t)) cp_async_wait_all();   // (this thread's copies)
        } else
#endif
        {
        for (int p = 0; p < g.planes_in; ++p) {
            const int id = od * g.s_d - g.pad_d + g.kd_lo * g.dil_d + p;
            wgrad_load_tile<VEC, QUAD>(x_tile + p * g.plane_size, xn, id >= 0 && id < g.in_d ? id : -1,
                                       oh0 * g.s_h - g.pad_h + g.kh_lo * g.dil_h, ow0 * g.s_w - g.pad_w, g.rows_in,
                                       g.cols_in, j0, x_at, x_lanes, x_vec, x_tplane);
        }
        if constexpr (!QUAD || !DW_CHANNELS_LAST)   // (channels_first quads read dy from its tile too)
            wgrad_load_tile<VEC, QUAD>(dy_tile, dn, od, oh0, ow0, g.tile_rows, g.cols, j0, dy_at, dy_lanes, dy_vec,
                                       dy_tplane);
        }
        __syncthreads();
#if DW_CHANNELS_LAST
        if constexpr (QUAD) {
            // the worker's DW_PIX dy pixels, this thread's 4 channels of each, from global memory
            // (32-bit offsets from one base, the same in every thread: the quad's channels are in
            // the offset; with them in the base, 16-bit's per-pixel bases spilled), zero outside dy
            const elem_t* d = opaque_pointer(dn.sample + (unsigned)od * dy_plane + j0);
            const int oh1 = oh0 + wrow, ow1 = ow0 + wseg * DW_PIX;
            const int nq = q_lanes > 0 && oh1 < g.ds.h ? g.ds.w - ow1 : 0;
            const unsigned c = g.ds.channels, off = (unsigned)(oh1 * g.ds.w + ow1) * c + quad * 4;
            if (nq >= DW_PIX) {   // the worker's whole row inside dy: no bounds (most rows)
                wgrad_quad_row<KW, P, VEC, false>(x_quad, g.cols_in * P, g.taps / KW, d, off, c, nq, q_lanes, acc);
            } else if (nq > 0) {   // the right edge of dy (a row or channel quad outside it: no work)
                wgrad_quad_row<KW, P, VEC, true>(x_quad, g.cols_in * P, g.taps / KW, d, off, c, nq, q_lanes, acc);
            }
        } else
#else
        if constexpr (QUAD) {
            // (rows and channel quads outside dy add zeros: their dy tile values are zeros; a test
            // to skip them kept registers live across the tile loop, which spilled on sm_80)
            wgrad_quad_row_tile<KW, P>(x_quad, g.cols_in * P, g.taps / KW, dy_quad, acc);
        } else
#endif
        if (g.active) {
            if constexpr (S == 0) {
                wgrad_run_strided<P>(x_run, dy_run, tap_off, g.taps, g.s_w * P, acc);
            } else {
                acc_t dyv[DW_PIX];
#pragma unroll
                for (int q = 0; q < DW_PIX; ++q) dyv[q] = dy_run[q * P];
                if constexpr (KW > 0) wgrad_rows<KW, S, P>(x_run, tap_off, g.taps, dyv, acc);
                else wgrad_run<S, P>(x_run, tap_off, g.taps, dyv, acc);
            }
        }
        if (++tw == g.tiles_w) {
            tw = 0;
            if (++th == g.tiles_h) {
                th = 0;
                if (++od == g.out_d) {
                    od = 0;
                    ++n;
#if DW_CHANNELS_LAST
                    x_base += g.xs.channels * g.xs.pixels;
                    dy_base += g.ds.channels * g.ds.pixels;
#endif
                }
            }
        }
    }
}

// The channel quads' sums into depthwise_wgrad's reduction buffer (its layout: DW_ROWS x
// DW_WG_TAPS x DW_CHANNELS): a warp's 4 workers first (lanes 8 and 16 apart, one butterfly, so
// the same sums in the same order in every lane), then its 8 quads store the warp's row.
__device__ __forceinline__ void wgrad_quad_sums(acc_t* sums, acc_t (&acc)[DW_WG_QTAPS * 4]) {
    __syncthreads();   // the tiles are no longer read
#pragma unroll
    for (int t = 0; t < DW_WG_QTAPS * 4; ++t) {
        acc[t] += __shfl_xor_sync(0xffffffffu, acc[t], 8);
        acc[t] += __shfl_xor_sync(0xffffffffu, acc[t], 16);
    }
    if (threadIdx.x < 8) {
#pragma unroll
        for (int t = 0; t < DW_WG_QTAPS * 4; ++t)
            sums[(threadIdx.y * DW_WG_TAPS + t / 4) * DW_CHANNELS + threadIdx.x * 4 + t % 4] = acc[t];
    }
}

// wgrad_tiles for the block's math path (see there) and loader; VEC: the sources are vector_source.
template <bool VEC>
__device__ __forceinline__ void wgrad_paths(const DwWgradWalk& g, acc_t* x_tile, acc_t* dy_tile,
                                            const int tap_off[DW_WG_TAPS], int k_w, int dil_w, int group_taps,
                                            acc_t* acc) {
    const bool rows = dil_w == 1 && group_taps % k_w == 0;
    // channel quads on the strip tiles (4 x DW_ROWS rows of DW_PIX pixels; the launcher's
    // depthwise_wgrad_tile picks them for 3- and 5-wide rows at stride 1, dilation 1, k_d = 1, and
    // groups of at most DW_WG_QTAPS taps), which write their sums here
    // channels_first: only with the transposing loader (VEC; the launcher gives strip tiles only to
    // sources it can take, and to views not 32-byte aligned the tile without quads: direct.py)
    if constexpr (sizeof(acc_t) == 4 && (DW_CHANNELS_LAST || VEC)) {
        if (g.tile_rows * (g.cols / DW_PIX) > DW_ROWS) {   // (wgrad_quads)
            acc_t qacc[DW_WG_QTAPS * 4];   // [tap][channel of the quad]
#pragma unroll
            for (int t = 0; t < DW_WG_QTAPS * 4; ++t) qacc[t] = acc_t(0);
            if (k_w == 3) wgrad_tiles<3, 1, VEC, true>(g, x_tile, dy_tile, tap_off, qacc);
            else wgrad_tiles<5, 1, VEC, true>(g, x_tile, dy_tile, tap_off, qacc);
            wgrad_quad_sums(x_tile, qacc);
            return;
        }
    }
    if (rows && k_w == 3 && g.s_w == 1) wgrad_tiles<3, 1, VEC>(g, x_tile, dy_tile, tap_off, acc);
    else if (rows && k_w == 3 && g.s_w == 2) wgrad_tiles<3, 2, VEC>(g, x_tile, dy_tile, tap_off, acc);
    else if (rows && k_w == 5 && g.s_w == 1) wgrad_tiles<5, 1, VEC>(g, x_tile, dy_tile, tap_off, acc);
    else if (rows && k_w == 5 && g.s_w == 2) wgrad_tiles<5, 2, VEC>(g, x_tile, dy_tile, tap_off, acc);
    else if (g.s_w == 1) wgrad_tiles<0, 1, VEC>(g, x_tile, dy_tile, tap_off, acc);
    else if (g.s_w == 2) wgrad_tiles<0, 2, VEC>(g, x_tile, dy_tile, tap_off, acc);
    else wgrad_tiles<0, 0, VEC>(g, x_tile, dy_tile, tap_off, acc);
}

// Whether depthwise_wgrad ran the channel quads (wgrad_quad), which have stored their sums: 4-byte
// accumulators on the launcher's strip tile (depthwise_wgrad_tile; direct.depthwise_wgrad_math says
// the same). In channels_first the launcher gives strip tiles only to sources the transposing
// loader takes (wgrad_paths' VEC; not testing `vec` here keeps it from living to the end, which
// spilled 16 bytes in 16-bit on sm_80).
__device__ __forceinline__ bool wgrad_quads(const DwWgradWalk& g) {
    return sizeof(acc_t) == 4 && g.tile_rows * (g.cols / DW_PIX) > DW_ROWS;
}

// depthwise_wgrad: dw[tap, j] = sum over (n, o) of x[n, o*s - pad + tap*dil, j / M] * dy[n, o, j].
// Grid: (C_out / DW_CHANNELS tiles, tap groups, splits); a group is `group_taps` (<= DW_WG_TAPS)
// consecutive taps, whole kernel rows when k_w <= DW_WG_TAPS. A block walks the
// output-pixel tiles [split * tiles_per_split, ...) (tile: tile_rows x segs*DW_PIX pixels
// of one (sample, plane)); per tile it loads the input tile (every plane and kernel row the
// group's taps touch, all kernel columns) and the dy tile into shared memory between two
// barriers (channels_last: 16-byte loads when both are vector_source; channels_first: the
// transposing loader when both are wgrad_vector_source, else each source's own 16-byte word
// loader or element loader); each thread then adds, for every tap of the group, its DW_PIX
// pixels into one register sum per tap (dy run held in registers; whole rows of width 3 or 5,
// stride 1 or 2, dilation 1 go through wgrad_rows' register window; channels_last with 4-byte
// accumulators at stride 1 through the channel quads, wgrad_quad, where the launcher's tile is a
// strip tile: there a thread sums 4 channels, dy from global memory, no dy tile). The math path and the
// loader are chosen once per block (wgrad_tiles), so the tile loop holds one of each. At the
// end the DW_ROWS threads of a lane add their sums in shared memory in a fixed order; with one
// split the block writes dw, else partial[split] and depthwise_reduce_splits adds the splits in
// order. Deterministic, no atomics.
extern "C" __global__ void __launch_bounds__(DW_THREADS, 2)
depthwise_wgrad(const elem_t* __restrict__ x, const elem_t* __restrict__ dy, elem_t* __restrict__ dw,
                acc_t* __restrict__ partial, int batch, int c_in, int mult, int in_d, int in_h, int in_w,
                int out_d, int out_h, int out_w, int k_d, int k_h, int k_w, int s_d, int s_h, int s_w, int dil_d,
                int dil_h, int dil_w, int pad_d, int pad_h, int pad_w, int tile_rows, int segs,
                int group_taps, int tiles_per_split) {
    extern __shared__ unsigned char dw_shared_raw[];
    acc_t* x_tile = reinterpret_cast<acc_t*>(dw_shared_raw);
    const int c_out = c_in * mult, lane = threadIdx.x, j = blockIdx.x * DW_CHANNELS + lane;
    const int row = threadIdx.y / segs, seg = threadIdx.y % segs, cols = segs * DW_PIX;
    // the group's taps [t_lo, t_hi) and the planes / kernel rows they touch
    const int taps = k_d * k_h * k_w, plane_taps = k_h * k_w;
    const int t_lo = blockIdx.y * group_taps, t_hi = min(taps, t_lo + group_taps);
    const int kd_lo = t_lo / plane_taps, kd_hi = (t_hi - 1) / plane_taps;
    const bool one_plane = kd_lo == kd_hi;
    const int kh_lo = one_plane ? (t_lo / k_w) % k_h : 0, kh_hi = one_plane ? ((t_hi - 1) / k_w) % k_h : k_h - 1;
    const int planes_in = (kd_hi - kd_lo) * dil_d + 1;
    const int rows_in = (tile_rows - 1) * s_h + (kh_hi - kh_lo) * dil_h + 1;
    const int cols_in = (cols - 1) * s_w + (k_w - 1) * dil_w + 1;
    const unsigned in_pixels = (unsigned)in_d * in_h * in_w, out_pixels = (unsigned)out_d * out_h * out_w;
    const DwSource xs = {x, (unsigned)c_in, in_pixels, in_h, in_w, 1, 1, mult, 1, 0, c_out};
    const DwSource ds = {dy, (unsigned)c_out, out_pixels, out_h, out_w, 1, 1, 1, 1, 0, c_out};
    // every sample's base keeps the alignment of sample 0 (vector_source: C times a sample's
    // pixels is a multiple of the vector)
    const bool vec = wgrad_vector_source(xs) && wgrad_vector_source(ds);
    // channels_first's channel quads: planar tiles (planar_pixels), a pixel DW_CHUNK elements of
    // its plane, the x tile DW_CHANNELS / 4 planes (one kernel plane: k_d = 1)
    const bool planar = !DW_CHANNELS_LAST && sizeof(acc_t) == 4 && vec && tile_rows * segs > DW_ROWS;
    const int pitch = planar ? wgrad_pitch<true, true>() : vec ? wgrad_pitch<true>() : wgrad_pitch<false>();
    const int plane_size = planar ? DW_CHANNELS / 4 * planar_pixels(rows_in * cols_in) * DW_CHUNK
                                  : rows_in * cols_in * pitch;
    acc_t* dy_tile = x_tile + planes_in * plane_size;
    int tap_off[DW_WG_TAPS];
#pragma unroll
    for (int t = 0; t < DW_WG_TAPS; ++t) {
        const int tt = min(t_lo + t, t_hi - 1), kd = tt / plane_taps, kh = (tt / k_w) % k_h, kw = tt % k_w;
        tap_off[t] = (kd - kd_lo) * dil_d * plane_size + ((kh - kh_lo) * dil_h * cols_in + kw * dil_w) * pitch;
    }
    const int tiles_w = (out_w + cols - 1) / cols, tiles_h = (out_h + tile_rows - 1) / tile_rows;
    const int tiles = batch * out_d * tiles_h * tiles_w;
    const int first = blockIdx.z * tiles_per_split;
    const DwWgradWalk g = {xs, ds, in_d, out_d, s_d, s_h, s_w, pad_d, pad_h, pad_w, dil_d, dil_h,
                           kd_lo, kh_lo, planes_in, rows_in, cols_in, plane_size,
                           tile_rows, cols, tiles_w, tiles_h, first, min(tiles, first + tiles_per_split),
                           t_hi - t_lo, row, seg, row < tile_rows && j < c_out};
    acc_t acc[DW_WG_TAPS];
#pragma unroll
    for (int t = 0; t < DW_WG_TAPS; ++t) acc[t] = acc_t(0);
    if (vec) wgrad_paths<true>(g, x_tile, dy_tile, tap_off, k_w, dil_w, group_taps, acc);
    else wgrad_paths<false>(g, x_tile, dy_tile, tap_off, k_w, dil_w, group_taps, acc);

    // fixed-order reduction over the DW_ROWS threads of each lane
    acc_t* sums = x_tile;   // DW_ROWS x DW_WG_TAPS x DW_CHANNELS (the launcher sizes the buffer)
    if (!wgrad_quads(g)) {   // (the quads have stored theirs)
        __syncthreads();
#pragma unroll
        for (int t = 0; t < DW_WG_TAPS; ++t) sums[(threadIdx.y * DW_WG_TAPS + t) * DW_CHANNELS + lane] = acc[t];
    }
    __syncthreads();
    for (int t = threadIdx.y; t < t_hi - t_lo; t += DW_ROWS) {
        if (j >= c_out) break;
        acc_t sum = acc_t(0);
        for (int r = 0; r < DW_ROWS; ++r) sum += sums[(r * DW_WG_TAPS + t) * DW_CHANNELS + lane];
        const long long out = (long long)(t_lo + t) * c_out + j;
        if (gridDim.z == 1)
            dw[out] = ElementTraits<elem_t>::from_acc(sum);
        else
            partial[(long long)blockIdx.z * taps * c_out + out] = sum;
    }
}

// depthwise_reduce_splits: out[i] = sum over splits of partial[s][i], in split order.
extern "C" __global__ void __launch_bounds__(DW_THREADS, 2)
depthwise_reduce_splits(const acc_t* __restrict__ partial, elem_t* __restrict__ out, long long count, int splits) {
    reduce_splits_body(partial, out, count, splits);
}
