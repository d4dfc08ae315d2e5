// D = A B^T through hopper.cuh's wgmma wrappers, for the emulator's wgmma tests, with planted
// misuse. One warpgroup: A is 64 x 64 half (K contiguous), B is 128 x 64 half (K contiguous),
// D is 64 x 128 float. Both operands are staged in dynamic shared memory with the 128-byte
// swizzle (16-byte unit u of row r at u ^ (r % 8)) and multiplied by four m64n128k16 wgmmas.
// mode: 0 correct; 1 no wgmma.fence; 2 thread 0 writes an A byte before the wait; 3 threads
// 96..127 skip the wgmma; 4 B's descriptor points past the shared memory; 5 no wait at all;
// 6 correct, with the operands in the no-swizzle ("interleaved") layout instead: 8-row x
// 16-byte core matrices, LBO = 128 bytes between K neighbours, SBO = 1024 between row groups;
// 7 thread 5 skips the fence.proxy.async after its operand stores; 8 thread 0 writes an A byte
// right after its own wait, before the other threads' waits (PTX allows it; the emulator's
// stricter rule wants the whole warpgroup's waits, then a barrier).
#include "hopper.cuh"

#define WGT_A_BYTES (64 * 128)
#define WGT_B_BYTES (128 * 128)

extern "C" __global__ void __launch_bounds__(128) wgmma_gemm(const __half* __restrict__ a, const __half* __restrict__ b,
                                                             float* __restrict__ d, int mode) {
    extern __shared__ __align__(1024) unsigned char wgt_smem_raw[];
    const unsigned raw = smem_address(wgt_smem_raw);
    unsigned char* smem = wgt_smem_raw + ((1024u - (raw & 1023u)) & 1023u);
    for (int i = threadIdx.x; i < (64 + 128) * 8; i += blockDim.x) {   // one 16-byte unit each
        const int row = i / 8, u = i % 8, r = row < 64 ? row : row - 64;
        const __half* src = row < 64 ? a + row * 64 + u * 8 : b + r * 64 + u * 8;
        unsigned char* base = row < 64 ? smem : smem + WGT_A_BYTES;
        const unsigned at = mode == 6 ? (r / 8) * 1024 + u * 128 + (r % 8) * 16 : r * 128 + ((u ^ (r % 8)) << 4);
        store_uint4(base + at, load_uint4(src));
    }
    if (mode != 7 || threadIdx.x != 5) fence_async_shared();
    __syncthreads();
    float acc[WGMMA_ACC];
    for (int e = 0; e < WGMMA_ACC; ++e) acc[e] = 0.0f;
    if (mode == 3 && threadIdx.x >= 96) return;
    unsigned long long desc_a = wgmma_desc_k_sw128(smem_address(smem), 1024);
    unsigned long long desc_b = wgmma_desc_k_sw128(smem_address(smem + WGT_A_BYTES), 1024);
    if (mode == 4) desc_b += (64 * 1024) >> 4;
    const unsigned long long interleaved = (128ull >> 4) << 16 | (1024ull >> 4) << 32;   // LBO, SBO; swizzle 0
    if (mode == 6) {
        desc_a = (smem_address(smem) >> 4) | interleaved;
        desc_b = (smem_address(smem + WGT_A_BYTES) >> 4) | interleaved;
    }
    const int k_step = mode == 6 ? (2 * 128) >> 4 : 2;   // 16 halves: two core matrices, or 32 bytes of a row
    if (mode != 1) wgmma_fence();
    for (int ks = 0; ks < 4; ++ks) wgmma_m64n128<__half>(acc, desc_a + k_step * ks, desc_b + k_step * ks);
    wgmma_commit();
    if (mode == 2 && threadIdx.x == 0) smem[0] = 0;
    if (mode == 5) return;
    wgmma_wait<0>();
    if (mode == 8 && threadIdx.x == 0) smem[0] = 0;
    const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
    for (int j = 0; j < 16; ++j)
        for (int i = 0; i < 2; ++i)
            for (int c = 0; c < 2; ++c)
                d[(16 * warp + lane / 4 + 8 * i) * 128 + 8 * j + 2 * (lane % 4) + c] = acc[4 * j + 2 * i + c];
}
