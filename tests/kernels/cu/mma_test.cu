// D = A @ B + C through the MMA wrappers of common.cuh; one warp per 16x8 tile of D.
// A is M x K row-major, B is K x N row-major, C and D are M x N float; M % 16 == 0,
// N % 8 == 0, K % 8 (tf32) or K % 16 (f16/bf16) == 0. Fragments follow the PTX layouts.
#include "common.cuh"

// This warp's 16x8 tile of D starts at (row0, col0); lane (g, t) holds its C/D fragment
// c0..c3 at off[0..3]: (g, 2t) (g, 2t+1) (g+8, 2t) (g+8, 2t+1), and acc starts as those of C.
__device__ __forceinline__ void tile_begin(const float* __restrict__ c, int n, int g, int t, int& row0, int& col0,
                                           int off[4], float acc[4]) {
    const int tiles_n = n / 8;
    row0 = (blockIdx.x / tiles_n) * 16;
    col0 = (blockIdx.x % tiles_n) * 8;
    for (int r = 0; r < 4; ++r) off[r] = (row0 + g + 8 * (r >> 1)) * n + col0 + 2 * t + (r & 1);
    for (int r = 0; r < 4; ++r) acc[r] = c[off[r]];
}

extern "C" __global__ void mma_tf32_matmul(const float* __restrict__ a, const float* __restrict__ b,
                                           const float* __restrict__ c, float* __restrict__ d, int m, int n, int k) {
    const int lane = threadIdx.x, g = lane >> 2, t = lane & 3;
    int row0, col0, off[4];
    float acc[4];
    tile_begin(c, n, g, t, row0, col0, off, acc);
    for (int k0 = 0; k0 < k; k0 += 8) {
        unsigned fa[4], fb[2];
        fa[0] = float_to_tf32(a[(row0 + g) * k + k0 + t]);
        fa[1] = float_to_tf32(a[(row0 + g + 8) * k + k0 + t]);
        fa[2] = float_to_tf32(a[(row0 + g) * k + k0 + t + 4]);
        fa[3] = float_to_tf32(a[(row0 + g + 8) * k + k0 + t + 4]);
        fb[0] = float_to_tf32(b[(k0 + t) * n + col0 + g]);
        fb[1] = float_to_tf32(b[(k0 + t + 4) * n + col0 + g]);
        mma_m16n8k8_tf32(acc, fa, fb, acc);
    }
    for (int r = 0; r < 4; ++r) d[off[r]] = acc[r];
}

// use_bf16 selects mma_m16n8k16_bf16 (inputs rounded to bfloat16) over the f16 one.
extern "C" __global__ void mma_lowp_matmul(const float* __restrict__ a, const float* __restrict__ b,
                                           const float* __restrict__ c, float* __restrict__ d,
                                           int m, int n, int k, int use_bf16) {
    const int lane = threadIdx.x, g = lane >> 2, t = lane & 3;
    int row0, col0, off[4];
    float acc[4];
    tile_begin(c, n, g, t, row0, col0, off, acc);
    for (int k0 = 0; k0 < k; k0 += 16) {
        unsigned fa[4], fb[2];
        for (int r = 0; r < 4; ++r) {
            const int row = row0 + g + 8 * (r & 1), col = k0 + 2 * t + 8 * (r >> 1);
            const float lo = a[row * k + col], hi = a[row * k + col + 1];
            fa[r] = use_bf16 ? pack_bfloat162(lo, hi) : pack_half2(lo, hi);
        }
        for (int r = 0; r < 2; ++r) {
            const int kk = k0 + 2 * t + 8 * r;
            const float lo = b[kk * n + col0 + g], hi = b[(kk + 1) * n + col0 + g];
            fb[r] = use_bf16 ? pack_bfloat162(lo, hi) : pack_half2(lo, hi);
        }
        if (use_bf16) mma_m16n8k16_bf16(acc, fa, fb, acc);
        else mma_m16n8k16_f16(acc, fa, fb, acc);
    }
    for (int r = 0; r < 4; ++r) d[off[r]] = acc[r];
}

// out[lane * 4 + i] = register i of ldmatrix<num, trans> (0 past num) over a 16x16 tile of
// 16-bit values stored in shared memory with a padded row (24 elements); lanes 8i..8i+7 give
// the rows of matrix i = tile rows 8(i&1).., columns 8(i>>1)...
extern "C" __global__ void ldmatrix_probe(const unsigned short* __restrict__ tile, unsigned* __restrict__ out,
                                          int num, int trans) {
    __shared__ __align__(16) unsigned short s[16 * 24];
    const int lane = threadIdx.x;
    for (int i = lane; i < 256; i += 32) s[(i / 16) * 24 + i % 16] = tile[i];
    __syncthreads();
    const int m = lane >> 3, r = lane & 7;
    const unsigned short* row = &s[((m & 1) * 8 + r) * 24 + (m >> 1) * 8];
    unsigned regs[4] = {0u, 0u, 0u, 0u};
    if (num == 4) {
        unsigned x[4];
        if (trans) ldmatrix<4, true>(x, row); else ldmatrix<4, false>(x, row);
        for (int i = 0; i < 4; ++i) regs[i] = x[i];
    } else if (num == 2) {
        unsigned x[2];
        if (trans) ldmatrix<2, true>(x, row); else ldmatrix<2, false>(x, row);
        for (int i = 0; i < 2; ++i) regs[i] = x[i];
    } else {
        unsigned x[1];
        if (trans) ldmatrix<1, true>(x, row); else ldmatrix<1, false>(x, row);
        regs[0] = x[0];
    }
    for (int i = 0; i < 4; ++i) out[lane * 4 + i] = regs[i];
}
