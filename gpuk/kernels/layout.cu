// layout.cu: the batched 2-D transpose behind the convolutions' channels_first path
// (N, C, spatial) <-> (N, spatial, C). Launched by gpuk/kernels/layout.py, which #defines
// ELEMENT_T (an unsigned integer of the element's size: the kernel only moves bytes, so one
// build serves every dtype of that size), LAYOUT_TILE and LAYOUT_THREADS, and computes the
// grid from the same constants.
#include "common.cuh"

#ifndef ELEMENT_T
#define ELEMENT_T unsigned
#endif
#ifndef LAYOUT_TILE
#define LAYOUT_TILE 32
#endif
#ifndef LAYOUT_THREADS
#define LAYOUT_THREADS 64
#endif
// Scalar path: one word of padding per tile row (two 2-byte elements, one 4- or 8-byte one).
// The pitch is then an odd number of 4-byte banks (2-, 4-byte elements) or 2 mod 4 banks
// (8-byte), so a column of 32 (16 for 8-byte accesses) rows falls on distinct banks.
#ifndef LAYOUT_PAD
#define LAYOUT_PAD 1
#endif

typedef ELEMENT_T word_t;

#define LAYOUT_VEC ((int)(16 / sizeof(word_t)))     // elements per 16-byte chunk
#define LAYOUT_CHUNKS (LAYOUT_TILE / LAYOUT_VEC)    // 16-byte chunks per tile row

static_assert(LAYOUT_TILE * sizeof(word_t) == 128, "a tile row is one 128-byte line");
static_assert(LAYOUT_CHUNKS == 8, "the vector path's swizzle permutes the 8 chunks of a row");
static_assert(LAYOUT_THREADS == LAYOUT_CHUNKS * LAYOUT_CHUNKS, "the vector path: one VEC x VEC block per thread");
static_assert(LAYOUT_TILE * LAYOUT_TILE % LAYOUT_THREADS == 0, "the scalar path: equal work per thread");
static_assert(LAYOUT_PAD * sizeof(word_t) == (sizeof(word_t) == 2 ? 4 : sizeof(word_t)), "one word of padding");

union LayoutTile {
    uint4 chunks[LAYOUT_TILE * LAYOUT_CHUNKS];                 // vector path, swizzled
    word_t words[LAYOUT_TILE][LAYOUT_TILE + LAYOUT_PAD];       // scalar path, padded
};

__device__ __forceinline__ unsigned word_of(const uint4& v, int i) {
    return i == 0 ? v.x : i == 1 ? v.y : i == 2 ? v.z : v.w;   // i is a constant: a register
}

// Chunk F of the transpose of a VEC x VEC block held as VEC chunks (rows): element e of the
// result is element F of in[e]. Built from 32-bit words so that 2-byte elements are paired
// with shifts and masks (PRMT); F and every index are constants, so all stays in registers.
template <int F> __device__ __forceinline__ uint4 transposed_chunk(const uint4 (&in)[LAYOUT_VEC]) {
    unsigned o[4];
    if (sizeof(word_t) == 2) {   // word m of the result: elements 2m, 2m + 1 = in[2m], in[2m + 1] at F
        constexpr int SHIFT = 16 * (F & 1);
#pragma unroll
        for (int m = 0; m < 4; ++m)
            o[m] = ((word_of(in[2 * m], F >> 1) >> SHIFT) & 0xffffu) |
                   (((word_of(in[2 * m + 1], F >> 1) >> SHIFT) & 0xffffu) << 16);
    } else {                     // whole words: element F of in[e] is words F * W .. F * W + W - 1
        constexpr int W = (int)(sizeof(word_t) / 4);
#pragma unroll
        for (int e = 0; e < LAYOUT_VEC; ++e)
#pragma unroll
            for (int w = 0; w < W; ++w) o[e * W + w] = word_of(in[e], F * W + w);
    }
    return make_uint4(o[0], o[1], o[2], o[3]);
}

// Stores chunks F.. of the transposed block, chunk f at p + f * rows (dst row gc + f).
template <int F> struct StoreTransposed {
    static __device__ __forceinline__ void run(const uint4 (&in)[LAYOUT_VEC], word_t* __restrict__ p, int rows) {
        store_uint4(p + (long long)F * rows, transposed_chunk<F>(in));
        StoreTransposed<F + 1>::run(in, p, rows);
    }
};
template <> struct StoreTransposed<LAYOUT_VEC> {
    static __device__ __forceinline__ void run(const uint4 (&)[LAYOUT_VEC], word_t* __restrict__, int) {}
};

// Vector path (rows and cols multiples of LAYOUT_VEC, both bases 16-byte aligned): 16-byte
// accesses everywhere. Loads: thread q copies chunk q % 8 of tile row q / 8 (8 lanes per
// 128-byte src line) into shared memory. Stores: thread (k = tid % 8, chunk column j = tid / 8)
// reads the VEC x VEC block of src rows VEC*k.., columns VEC*j.. as VEC 16-byte chunks,
// transposes it in registers and writes VEC 16-byte chunks, one per dst row (8 lanes per
// 128-byte dst line). Chunk c of row r sits at c ^ ((r / VEC) & 7): the loads' 8 lanes hit
// 8 chunks of one row and the stores' 8 lanes 8 rows of distinct chunks, all 32 banks each.
__device__ __forceinline__ void transpose_tile_vec(const word_t* __restrict__ src, word_t* __restrict__ dst,
                                                   int rows, int cols, int r0, int c0, LayoutTile& tile) {
#pragma unroll
    for (int i = 0; i < LAYOUT_TILE * LAYOUT_CHUNKS / LAYOUT_THREADS; ++i) {
        const int q = i * LAYOUT_THREADS + threadIdx.x;
        const int r = q / LAYOUT_CHUNKS, c = q % LAYOUT_CHUNKS;
        const int gr = r0 + r, gc = c0 + c * LAYOUT_VEC;
        if (gr < rows && gc < cols)   // cols % VEC == 0: a chunk is all in or all out
            tile.chunks[r * LAYOUT_CHUNKS + (c ^ ((r / LAYOUT_VEC) & 7))] = load_uint4(src + (long long)gr * cols + gc);
    }
    __syncthreads();
    const int k = threadIdx.x % LAYOUT_CHUNKS, j = threadIdx.x / LAYOUT_CHUNKS;
    const int gr = r0 + k * LAYOUT_VEC, gc = c0 + j * LAYOUT_VEC;
    if (gr >= rows || gc >= cols) return;   // a whole block out (rows % VEC == 0, cols % VEC == 0)
    uint4 in[LAYOUT_VEC];   // in[e]: src row VEC*k + e, columns VEC*j..
#pragma unroll
    for (int e = 0; e < LAYOUT_VEC; ++e) in[e] = tile.chunks[(k * LAYOUT_VEC + e) * LAYOUT_CHUNKS + (j ^ (k & 7))];
    StoreTransposed<0>::run(in, dst + (long long)gc * rows + gr, rows);   // dst row gc + f: element f of each in[e]
}

// Scalar path (any rows, cols, alignment): one element per access, consecutive lanes on
// consecutive addresses on both sides (loads along src rows, stores along dst rows), through
// the padded tile.
__device__ __forceinline__ void transpose_tile_scalar(const word_t* __restrict__ src, word_t* __restrict__ dst,
                                                      int rows, int cols, int r0, int c0, LayoutTile& tile) {
    constexpr int PASSES = LAYOUT_TILE * LAYOUT_TILE / LAYOUT_THREADS;
#pragma unroll 4
    for (int i = 0; i < PASSES; ++i) {
        const int q = i * LAYOUT_THREADS + threadIdx.x;
        const int r = q / LAYOUT_TILE, c = q % LAYOUT_TILE;
        if (r0 + r < rows && c0 + c < cols) tile.words[r][c] = src[(long long)(r0 + r) * cols + c0 + c];
    }
    __syncthreads();
#pragma unroll 4
    for (int i = 0; i < PASSES; ++i) {
        const int q = i * LAYOUT_THREADS + threadIdx.x;
        const int c = q / LAYOUT_TILE, r = q % LAYOUT_TILE;   // dst row c0 + c, dst column r0 + r
        if (r0 + r < rows && c0 + c < cols) dst[(long long)(c0 + c) * rows + r0 + r] = tile.words[r][c];
    }
}

// Two 2-byte elements as one 4-byte word (little endian: the lower address in the low half).
__device__ __forceinline__ unsigned pack_pair(word_t lo, word_t hi) {
    return (unsigned)lo | ((unsigned)hi << 16);
}

// transpose_planes_thin: transpose_planes for planes with a short side (fewer rows or columns
// than a tile) whose sizes the vector path cannot take, e.g. C = 3 images either way (the
// launcher's choice; few_rows: the rows are the short side, else the columns).
// Thread mapping: one tile of the whole short side x tile_len of the long side (as many as the
//   scalar tile's shared memory holds, layout.py thin_tile_len) per block of LAYOUT_THREADS
//   threads; blockIdx.x = plane * tiles + tile. The tile is kept short side fastest, element
//   (short s, long l) at l * stride + s (layout.py thin_stride). The side whose rows run along
//   the long dimension (src for few rows, dst for few columns) is read or written lane by lane
//   along it, one short index at a time; the other side's tile is one contiguous run (its rows
//   are whole), moved lane by lane.
// Banks: on the run side 32 lanes read or write 32 consecutive tile positions; on the long side
//   lane k takes long index k (pairs = 0) or the pair 2k, 2k + 1 as one 4-byte global access
//   (pairs = 1: 2-byte elements, launcher: long side and tile_len even; the kernel also checks
//   the long-side pointer's 4-byte alignment and otherwise moves the pair as two elements).
//   stride is an odd number of 4-byte words (pairs = 0, 2-byte) or of elements, so the long
//   side's lanes hit distinct banks; with pairs the 2-byte tile is packed (odd elements per
//   long index: lane k's word k * stride + s / 2), so the run side's 32 elements span at most
//   32 words too (a padded 2-byte tile spread them over 33: a 2-way conflict).
// A kernel of its own: its division loops, inlined beside the vector path, pushed that path
//   into spills on sm_90 (NVRTC 13.5). Tail guards: the last tile. No atomics.
extern "C" __global__ void __launch_bounds__(LAYOUT_THREADS)
transpose_planes_thin(const word_t* __restrict__ src, word_t* __restrict__ dst, int rows, int cols, int tiles,
                      int tile_len, int stride, int few_rows, int pairs) {
    __shared__ __align__(16) LayoutTile shared_tile;
    word_t* tile = &shared_tile.words[0][0];
    const unsigned plane = blockIdx.x / (unsigned)tiles;
    const int l0 = (int)(blockIdx.x % (unsigned)tiles) * tile_len;
    const long long plane_offset = (long long)plane * rows * cols;
    src += plane_offset;
    dst += plane_offset;
    const int short_len = few_rows ? rows : cols;
    const int width = min(tile_len, (few_rows ? cols : rows) - l0);
    // uniform per block: the long-side rows start 4-byte aligned (long side and l0 even)
    const bool paired = sizeof(word_t) == 2 && pairs && is_aligned(few_rows ? src : dst, 4);
    if (few_rows) {   // src row s, lanes along its columns l0..
        for (int s = 0; s < rows; ++s) {
            const word_t* __restrict__ row = src + (long long)s * cols + l0;
            if (paired) {
                for (int l = 2 * threadIdx.x; l < width; l += 2 * LAYOUT_THREADS) {
                    if (l + 1 < width) {
                        const unsigned two = *reinterpret_cast<const unsigned*>(row + l);
                        tile[l * stride + s] = (word_t)(two & 0xffffu);
                        tile[(l + 1) * stride + s] = (word_t)(two >> 16);
                    } else {
                        tile[l * stride + s] = row[l];
                    }
                }
            } else {
                for (int l = threadIdx.x; l < width; l += LAYOUT_THREADS) tile[l * stride + s] = row[l];
            }
        }
    } else {          // src rows l0.. are one run
        const word_t* __restrict__ run = src + (long long)l0 * cols;
        for (int q = threadIdx.x; q < width * cols; q += LAYOUT_THREADS) {
            const int l = q / cols;
            tile[l * stride + (q - l * cols)] = run[q];
        }
    }
    __syncthreads();
    if (few_rows) {   // dst rows l0.. are one run
        word_t* __restrict__ run = dst + (long long)l0 * rows;
        for (int q = threadIdx.x; q < width * short_len; q += LAYOUT_THREADS) {
            const int l = q / short_len;
            run[q] = tile[l * stride + (q - l * short_len)];
        }
    } else {          // dst row s, lanes along its columns l0..
        for (int s = 0; s < cols; ++s) {
            word_t* __restrict__ row = dst + (long long)s * rows + l0;
            if (paired) {
                for (int l = 2 * threadIdx.x; l < width; l += 2 * LAYOUT_THREADS) {
                    if (l + 1 < width)
                        *reinterpret_cast<unsigned*>(row + l) =
                            pack_pair(tile[l * stride + s], tile[(l + 1) * stride + s]);
                    else
                        row[l] = tile[l * stride + s];
                }
            } else {
                for (int l = threadIdx.x; l < width; l += LAYOUT_THREADS) row[l] = tile[l * stride + s];
            }
        }
    }
}

// transpose_planes: dst[b] = src[b].T for every plane b of rows x cols elements
// (src (planes, rows, cols) -> dst (planes, cols, rows), both C-contiguous).
// Thread mapping: one LAYOUT_TILE x LAYOUT_TILE tile (128-byte rows) per block of
//   LAYOUT_THREADS threads; blockIdx.x = (plane * row_tiles + row tile) * col_tiles + col tile
//   (one 1-D grid: no 65535 limit on any factor). Loads run along src rows and stores along
//   dst rows, so both sides coalesce; shared memory is swizzled (vector path) or padded
//   (scalar path) against bank conflicts.
// Path: 16-byte vectors when rows and cols are multiples of LAYOUT_VEC and both bases are
//   16-byte aligned, else scalar; uniform per launch.
// Tail guards: partial tiles at the right and bottom edges (any rows, cols >= 1).
// Limits: rows, cols, blocks < 2^31 (the launcher checks); offsets are 64-bit. No atomics.
extern "C" __global__ void __launch_bounds__(LAYOUT_THREADS)
transpose_planes(const word_t* __restrict__ src, word_t* __restrict__ dst, int rows, int cols, int row_tiles,
                 int col_tiles) {
    __shared__ __align__(16) LayoutTile tile;
    const unsigned tiles_per_plane = (unsigned)row_tiles * (unsigned)col_tiles;
    const unsigned plane = blockIdx.x / tiles_per_plane, in_plane = blockIdx.x % tiles_per_plane;
    const int r0 = (int)(in_plane / (unsigned)col_tiles) * LAYOUT_TILE;
    const int c0 = (int)(in_plane % (unsigned)col_tiles) * LAYOUT_TILE;
    const long long plane_offset = (long long)plane * rows * cols;
    src += plane_offset;
    dst += plane_offset;
    if (rows % LAYOUT_VEC == 0 && cols % LAYOUT_VEC == 0 && is_aligned(src, 16) && is_aligned(dst, 16))
        transpose_tile_vec(src, dst, rows, cols, r0, c0, tile);
    else
        transpose_tile_scalar(src, dst, rows, cols, r0, c0, tile);
}
