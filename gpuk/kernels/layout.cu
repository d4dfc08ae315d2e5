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

typedef ELEMENT_T word_t;

#define LAYOUT_VEC ((int)(16 / sizeof(word_t)))     // elements per 16-byte chunk
#define LAYOUT_CHUNKS (LAYOUT_TILE / LAYOUT_VEC)    // 16-byte chunks per tile row
// Scalar path: one word of padding per tile row (two 2-byte elements, one 4- or 8-byte one).
// The pitch is then an odd number of 4-byte banks (2-, 4-byte elements) or 2 mod 4 banks
// (8-byte), so a column of 32 (16 for 8-byte accesses) rows falls on distinct banks.
#define LAYOUT_PAD ((int)(sizeof(word_t) == 2 ? 2 : 1))

static_assert(LAYOUT_TILE * sizeof(word_t) == 128, "a tile row is one 128-byte line");
static_assert(LAYOUT_CHUNKS == 8, "the vector path's swizzle permutes the 8 chunks of a row");
static_assert(LAYOUT_THREADS == LAYOUT_CHUNKS * LAYOUT_CHUNKS, "the vector path: one VEC x VEC block per thread");
static_assert(LAYOUT_TILE * LAYOUT_TILE % LAYOUT_THREADS == 0, "the scalar path: equal work per thread");

union LayoutTile {
    uint4 chunks[LAYOUT_TILE * LAYOUT_CHUNKS];                 // vector path, swizzled
    word_t words[LAYOUT_TILE][LAYOUT_TILE + LAYOUT_PAD];       // scalar path, padded
};

// Chunk f of the transpose of a VEC x VEC block held as VEC chunks (rows): element e of the
// result is element f of in[e]. Built from 32-bit words so that 2-byte elements are paired
// with shifts and masks (PRMT) instead of unpacked into one register each.
__device__ __forceinline__ uint4 transposed_chunk(const uint4 (&in)[LAYOUT_VEC], int f) {
    uint4 out;
    unsigned* o = reinterpret_cast<unsigned*>(&out);
    if (sizeof(word_t) == 2) {   // word m of the result: elements 2m, 2m + 1 = in[2m], in[2m + 1] at f
        const int shift = 16 * (f & 1);
#pragma unroll
        for (int m = 0; m < 4; ++m) {
            const unsigned lo = reinterpret_cast<const unsigned*>(&in[2 * m])[f >> 1];
            const unsigned hi = reinterpret_cast<const unsigned*>(&in[2 * m + 1])[f >> 1];
            o[m] = ((lo >> shift) & 0xffffu) | (((hi >> shift) & 0xffffu) << 16);
        }
    } else {                     // whole words: element f of in[e] is words f * W .. f * W + W - 1
        constexpr int W = (int)(sizeof(word_t) / 4);
#pragma unroll
        for (int e = 0; e < LAYOUT_VEC; ++e)
#pragma unroll
            for (int w = 0; w < W; ++w) o[e * W + w] = reinterpret_cast<const unsigned*>(&in[e])[f * W + w];
    }
    return out;
}

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
#pragma unroll
    for (int f = 0; f < LAYOUT_VEC; ++f)   // dst row gc + f holds element f of every in[e]
        store_uint4(dst + (long long)(gc + f) * rows + gr, transposed_chunk(in, f));
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
