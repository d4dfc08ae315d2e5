// hopper.cuh: Hopper (sm_90a) warpgroup MMA (wgmma) helpers: shared-memory matrix
// descriptors, wgmma.fence / commit_group / wait_group and wgmma.mma_async m64n128 and m64n64
// (wgmma_m64n<N>: N / 2 float accumulators per thread) with float32 accumulators for f16,
// bf16 (k16) and tf32 (k8), both operands from shared memory,
// K-major (imm-trans-a/b = 0), scale-a = scale-b = 1.
//
// Compiles to PTX only for sm_90a (wgmma needs the architecture-specific target); under the
// emulated runtime (GPUK_EMULATE) every call goes to the emulator's warpgroup collective
// (emulate/emu_host.h), which follows the PTX ISA (9.7.15) and checks its use: all 128
// threads of the warpgroup, a wgmma.fence since the last wait, descriptors inside dynamic
// shared memory, no write to an operand before the wait that retires it, and a
// fence.proxy.async (fence_async_shared) by each thread that wrote an operand byte.
//
// Accumulator layout (PTX ISA, "WGMMA .m64nNk16 / .m64nNk8 register fragment layout for
// accumulator matrix D"): thread t of the warpgroup, warp w = t / 32, lane l = t % 32;
// register d[4j + 2i + c] holds D[16w + l/4 + 8i][8j + 2(l%4) + c] (i, c in {0, 1}; j < N/8).
//
// Shared-memory descriptor (PTX ISA, "Matrix Descriptor Format"): bits 0-13 start address
// >> 4, 16-29 leading byte offset >> 4, 32-45 stride byte offset >> 4, 49-51 base offset,
// 62-63 swizzle (0 none, 1 128B, 2 64B, 3 32B). The swizzles XOR byte-address bits 4.. with
// bits 7.. (128B: bits 4-6 ^= 7-9), so a tile whose swizzle pattern starts on a 1024-byte
// boundary stores 16-byte unit u of row r at unit u ^ (r % 8) (base offset 0).
#pragma once
#include "common.cuh"

#define WGMMA_N 128               // columns of D per wgmma_m64n128
#define WGMMA_ACC (WGMMA_N / 2)   // float accumulators per thread of wgmma_m64n128
#define WGMMA_SWIZZLE_128B 1ull

// Shared-window address of a shared-memory pointer (what a descriptor encodes).
__device__ __forceinline__ unsigned smem_address(const void* p) {
#if defined(GPUK_EMULATE)
    return ::gpuk_emu::shared_window_address(p);
#else
    return (unsigned)__cvta_generic_to_shared(p);
#endif
}

// A K-major operand with 128-byte swizzle: rows of 128 bytes, 8-row atoms SBO bytes apart.
__device__ __forceinline__ unsigned long long wgmma_desc_k_sw128(unsigned address, unsigned sbo_bytes) {
    return (unsigned long long)((address & 0x3FFFF) >> 4) | (1ull << 16) /* LBO: unused, 1 by convention */ |
           ((unsigned long long)((sbo_bytes & 0x3FFFF) >> 4) << 32) | (WGMMA_SWIZZLE_128B << 62);
}

// wgmma reads shared memory through the async proxy: a thread's generic writes of an operand
// (st.shared, and cp.async's non-bulk copies once waited for) reach it only after that thread's
// fence.proxy.async (PTX ISA 9.7.15.4), then the barrier that hands the tile over.
#if defined(GPUK_EMULATE)
__device__ __forceinline__ void fence_async_shared() { ::gpuk_emu::proxy_fence_async(); }
__device__ __forceinline__ void wgmma_fence() { ::gpuk_emu::wgmma_fence(); }
__device__ __forceinline__ void wgmma_commit() { ::gpuk_emu::wgmma_commit(); }
template <int N> __device__ __forceinline__ void wgmma_wait() { ::gpuk_emu::wgmma_wait(N); }
// Keeps the compiler from moving accumulator reads or writes across a wgmma (no-op here).
template <int ACC> __device__ __forceinline__ void wgmma_fence_operands(float (&)[ACC]) {}
template <int N, class T>
__device__ __forceinline__ void wgmma_m64n(float (&d)[N / 2], unsigned long long desc_a, unsigned long long desc_b) {
    static_assert(N == 64 || N == 128, "m64n64 or m64n128");
    constexpr int kind = sizeof(T) == 4 ? ::gpuk_emu::WGMMA_TF32
                         : gpuk_same_type<T, __half>::value ? ::gpuk_emu::WGMMA_F16 : ::gpuk_emu::WGMMA_BF16;
    ::gpuk_emu::WgmmaOperands op{kind, N, desc_a, desc_b, 1, d};
    ::gpuk_emu::wgmma_mma_async(op);
}
#elif defined(__CUDA_ARCH__) && defined(__CUDA_ARCH_FEAT_SM90_ALL)
__device__ __forceinline__ void fence_async_shared() { asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory"); }
__device__ __forceinline__ void wgmma_fence() { asm volatile("wgmma.fence.sync.aligned;\n" ::: "memory"); }
__device__ __forceinline__ void wgmma_commit() { asm volatile("wgmma.commit_group.sync.aligned;\n" ::: "memory"); }
template <int N> __device__ __forceinline__ void wgmma_wait() {
    asm volatile("wgmma.wait_group.sync.aligned %0;\n" ::"n"(N) : "memory");
}
template <int ACC> __device__ __forceinline__ void wgmma_fence_operands(float (&d)[ACC]) {
#pragma unroll
    for (int i = 0; i < ACC; ++i) asm volatile("" : "+f"(d[i])::"memory");
}
#define GPUK_WGMMA_N64_ASM(SHAPE_TYPES, TAIL)                                                                            \
    asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, %34, 0;\n"                                                            \
                 "wgmma.mma_async.sync.aligned." SHAPE_TYPES " {"                                                          \
                 "%0, %1, %2, %3, %4, %5, %6, %7, "                                                                        \
                 "%8, %9, %10, %11, %12, %13, %14, %15, "                                                                  \
                 "%16, %17, %18, %19, %20, %21, %22, %23, "                                                                \
                 "%24, %25, %26, %27, %28, %29, %30, %31 "                                                                 \
                 "}, %32, %33, p, 1, 1" TAIL ";\n}\n"                                                                      \
                 : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]),         \
                   "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15]),   \
                   "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), "+f"(d[21]), "+f"(d[22]), "+f"(d[23]), \
                   "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), "+f"(d[28]), "+f"(d[29]), "+f"(d[30]), "+f"(d[31])  \
                 : "l"(desc_a), "l"(desc_b), "r"(1))
#define GPUK_WGMMA_N128_ASM(SHAPE_TYPES, TAIL)                                                                             \
    asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, %66, 0;\n"                                                              \
                 "wgmma.mma_async.sync.aligned." SHAPE_TYPES " {"                                                          \
                 "%0, %1, %2, %3, %4, %5, %6, %7, "                                                                        \
                 "%8, %9, %10, %11, %12, %13, %14, %15, "                                                                  \
                 "%16, %17, %18, %19, %20, %21, %22, %23, "                                                                \
                 "%24, %25, %26, %27, %28, %29, %30, %31, "                                                                \
                 "%32, %33, %34, %35, %36, %37, %38, %39, "                                                                \
                 "%40, %41, %42, %43, %44, %45, %46, %47, "                                                                \
                 "%48, %49, %50, %51, %52, %53, %54, %55, "                                                                \
                 "%56, %57, %58, %59, %60, %61, %62, %63 "                                                                 \
                 "}, %64, %65, p, 1, 1" TAIL ";\n}\n"                                                                      \
                 : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]),         \
                   "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15]),   \
                   "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), "+f"(d[21]), "+f"(d[22]), "+f"(d[23]), \
                   "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), "+f"(d[28]), "+f"(d[29]), "+f"(d[30]), "+f"(d[31]), \
                   "+f"(d[32]), "+f"(d[33]), "+f"(d[34]), "+f"(d[35]), "+f"(d[36]), "+f"(d[37]), "+f"(d[38]), "+f"(d[39]), \
                   "+f"(d[40]), "+f"(d[41]), "+f"(d[42]), "+f"(d[43]), "+f"(d[44]), "+f"(d[45]), "+f"(d[46]), "+f"(d[47]), \
                   "+f"(d[48]), "+f"(d[49]), "+f"(d[50]), "+f"(d[51]), "+f"(d[52]), "+f"(d[53]), "+f"(d[54]), "+f"(d[55]), \
                   "+f"(d[56]), "+f"(d[57]), "+f"(d[58]), "+f"(d[59]), "+f"(d[60]), "+f"(d[61]), "+f"(d[62]), "+f"(d[63])  \
                 : "l"(desc_a), "l"(desc_b), "r"(1))
template <int N, class T>
__device__ __forceinline__ void wgmma_m64n(float (&d)[N / 2], unsigned long long desc_a, unsigned long long desc_b) {
    static_assert(N == 64 || N == 128, "m64n64 or m64n128");
    if constexpr (N == 64) {
        if constexpr (sizeof(T) == 4) GPUK_WGMMA_N64_ASM("m64n64k8.f32.tf32.tf32", "");
        else if constexpr (gpuk_same_type<T, __half>::value) GPUK_WGMMA_N64_ASM("m64n64k16.f32.f16.f16", ", 0, 0");
        else GPUK_WGMMA_N64_ASM("m64n64k16.f32.bf16.bf16", ", 0, 0");
    } else {
        if constexpr (sizeof(T) == 4) GPUK_WGMMA_N128_ASM("m64n128k8.f32.tf32.tf32", "");
        else if constexpr (gpuk_same_type<T, __half>::value) GPUK_WGMMA_N128_ASM("m64n128k16.f32.f16.f16", ", 0, 0");
        else GPUK_WGMMA_N128_ASM("m64n128k16.f32.bf16.bf16", ", 0, 0");
    }
}
#undef GPUK_WGMMA_N64_ASM
#undef GPUK_WGMMA_N128_ASM
#else
#error "hopper.cuh: wgmma needs an sm_90a target (--gpu-architecture=sm_90a) or the emulator"
#endif

template <class T>
__device__ __forceinline__ void wgmma_m64n128(float (&d)[WGMMA_ACC], unsigned long long desc_a,
                                              unsigned long long desc_b) {
    wgmma_m64n<WGMMA_N, T>(d, desc_a, desc_b);
}
