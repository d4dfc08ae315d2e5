// common.cuh: helpers shared by every gpuk kernel.
// Compiles under nvcc, NVRTC (no standard headers needed) and the emulated runtime
// (GPUK_EMULATE, see emulate/cuda_emu.h). Keep it free of kernel-specific constants.
#pragma once

#if !defined(GPUK_EMULATE) && defined(__CUDACC__)
#include <cuda_fp16.h>
#include <cuda_bf16.h>
#endif

#define GPUK_FULL_MASK 0xffffffffu

// ---- indexing: 64-bit so that sizes past 2^31 elements stay correct ----
__device__ __forceinline__ long long global_thread_index() {
    return (long long)blockIdx.x * blockDim.x + threadIdx.x;
}
__device__ __forceinline__ long long grid_stride() { return (long long)gridDim.x * blockDim.x; }
#define GPUK_GRID_STRIDE_LOOP(i, n) \
    for (long long i = global_thread_index(); i < (long long)(n); i += grid_stride())

__device__ __forceinline__ bool is_aligned(const void* p, unsigned bytes) {
    return ((unsigned long long)p & (unsigned long long)(bytes - 1)) == 0;
}

// ---- element type <-> accumulation type (half/bfloat16 accumulate in float) ----
__device__ __forceinline__ float to_acc(float x) { return x; }
__device__ __forceinline__ double to_acc(double x) { return x; }
__device__ __forceinline__ float to_acc(__half x) { return __half2float(x); }
__device__ __forceinline__ float to_acc(__nv_bfloat16 x) { return __bfloat162float(x); }
template <class T> struct ElementTraits;
template <> struct ElementTraits<float> {
    typedef float acc;
    __device__ __forceinline__ static float from_acc(float x) { return x; }
};
template <> struct ElementTraits<double> {
    typedef double acc;
    __device__ __forceinline__ static double from_acc(double x) { return x; }
};
template <> struct ElementTraits<__half> {
    typedef float acc;
    __device__ __forceinline__ static __half from_acc(float x) { return __float2half_rn(x); }
};
template <> struct ElementTraits<__nv_bfloat16> {
    typedef float acc;
    __device__ __forceinline__ static __nv_bfloat16 from_acc(float x) { return __float2bfloat16_rn(x); }
};

// NaN-propagating max, like NumPy (fmaxf would drop the NaN).
template <class T> __device__ __forceinline__ T nan_max(T a, T b) { return (a > b || a != a) ? a : b; }
__device__ __forceinline__ float neg_inf_f() { return __int_as_float(0xff800000); }
template <class A, class B> struct gpuk_same_type { static const bool value = false; };
template <class A> struct gpuk_same_type<A, A> { static const bool value = true; };

// ---- grid-wide barrier: only for grids whose blocks are all resident at once ----
// (the launcher proves it from the occupancy, else it must not launch: a block waiting here
// for one that cannot start waits forever). state[0] counts arrivals; the last block to
// arrive resets it to 0 and then bumps state[1], the generation the others wait on, so the
// state is left as found for the next barrier or launch (zeroed once when allocated).
// Thread 0 of each block arrives and waits; __threadfence orders the block's writes before
// its arrival and the other blocks' writes before what follows the barrier.
__device__ __forceinline__ void grid_barrier(unsigned* state) {
    __syncthreads();
    if (threadIdx.x == 0 && threadIdx.y == 0 && threadIdx.z == 0) {
        volatile unsigned* generation = state + 1;
        const unsigned seen = *generation;   // read before arriving: the last arrival bumps it
        __threadfence();
        const unsigned blocks = gridDim.x * gridDim.y * gridDim.z;
        if (atomicAdd(state, 1u) == blocks - 1u) {
            atomicExch(state, 0u);
            __threadfence();
            atomicAdd(state + 1, 1u);
        } else {
            while (*generation == seen) __nanosleep(32);
        }
        __threadfence();
    }
    __syncthreads();
}

// ---- warp and block reductions (1-D blocks, blockDim.x a multiple of 32) ----
template <class T> __device__ __forceinline__ T warp_reduce_sum(T v) {
#pragma unroll
    for (int offset = 16; offset > 0; offset >>= 1) v += __shfl_xor_sync(GPUK_FULL_MASK, v, offset);
    return v;
}
template <class T> __device__ __forceinline__ T warp_reduce_max(T v) {
#pragma unroll
    for (int offset = 16; offset > 0; offset >>= 1) v = nan_max(v, __shfl_xor_sync(GPUK_FULL_MASK, v, offset));
    return v;
}
// `scratch` holds >= 32 values in shared memory. Every thread gets the result.
template <class T> __device__ __forceinline__ T block_reduce_sum(T v, T* scratch) {
    const unsigned lane = threadIdx.x & 31u, warp = threadIdx.x >> 5, nwarps = blockDim.x >> 5;
    v = warp_reduce_sum(v);
    if (lane == 0) scratch[warp] = v;
    __syncthreads();
    if (warp == 0) {
        T w = lane < nwarps ? scratch[lane] : T(0);
        w = warp_reduce_sum(w);
        if (lane == 0) scratch[0] = w;
    }
    __syncthreads();
    const T result = scratch[0];
    __syncthreads();   // scratch may be reused right after
    return result;
}
template <class T> __device__ __forceinline__ T block_reduce_max(T v, T* scratch, T identity) {
    const unsigned lane = threadIdx.x & 31u, warp = threadIdx.x >> 5, nwarps = blockDim.x >> 5;
    v = warp_reduce_max(v);
    if (lane == 0) scratch[warp] = v;
    __syncthreads();
    if (warp == 0) {
        T w = lane < nwarps ? scratch[lane] : identity;
        w = warp_reduce_max(w);
        if (lane == 0) scratch[0] = w;
    }
    __syncthreads();
    const T result = scratch[0];
    __syncthreads();
    return result;
}

// ---- stable log-sum-exp: (m, s) stands for m + log(s); combine two partial states ----
template <class T> __device__ __forceinline__ void lse_combine(T& m, T& s, T m2, T s2) {
    if (m2 > m) {
        s = s * exp(m - m2) + s2;   // m may be -inf with s == 0: exp(-inf) == 0
        m = m2;
    } else if (m2 - m2 == T(0) && s2 != T(0)) {
        s += s2 * exp(m2 - m);      // only finite m2: -inf adds nothing, and skipping avoids inf - inf
    } else if (m2 != m2) {
        m = m2;                     // NaN propagates
    }
}
template <class T> __device__ __forceinline__ void lse_add(T& m, T& s, T x) { lse_combine(m, s, x, T(1)); }
// Online (m, s) log-sum-exp with the NumPy twins' edge rules (ctc, ctc_decode, softmax_xent): a NaN
// max stays NaN (m + m2), a -inf part adds nothing, equal maxima add s without exp.
template <class T> __device__ __forceinline__ void lse_online_push(T& m, T& s, T x) {
    if (x > m) { s = s * exp(m - x) + T(1); m = x; }
    else if (x != x) m = x;
    else if (x != T(neg_inf_f())) s += exp(x - m);
}
template <class T> __device__ __forceinline__ void lse_online_merge(T& m, T& s, T m2, T s2) {
    if (m != m || m2 != m2) m = m + m2;
    else if (m2 > m) { s = s2 + (m == T(neg_inf_f()) ? T(0) : s * exp(m - m2)); m = m2; }
    else if (m2 == m) s += s2;
    else if (m2 != T(neg_inf_f())) s += s2 * exp(m2 - m);
}
template <class T> __device__ __forceinline__ void warp_lse_reduce(T& m, T& s) {
#pragma unroll
    for (int offset = 16; offset > 0; offset >>= 1) {
        const T m2 = __shfl_xor_sync(GPUK_FULL_MASK, m, offset);
        const T s2 = __shfl_xor_sync(GPUK_FULL_MASK, s, offset);
        lse_combine(m, s, m2, s2);
    }
}

// ---- atomics helpers ----
// float max through the integer ordering of IEEE bits (valid for non-NaN values).
__device__ __forceinline__ float atomic_max_float(float* address, float v) {
    return v >= 0.0f ? __int_as_float(atomicMax((int*)address, __float_as_int(v)))
                     : __uint_as_float(atomicMin((unsigned*)address, __float_as_uint(v)));
}
__device__ __forceinline__ double atomic_add_double(double* address, double v) { return atomicAdd(address, v); }

// ---- vectorized memory access (callers check is_aligned(p, 16) first) ----
__device__ __forceinline__ float4 load_float4(const float* p) { return *reinterpret_cast<const float4*>(p); }
__device__ __forceinline__ void store_float4(float* p, float4 v) { *reinterpret_cast<float4*>(p) = v; }
__device__ __forceinline__ uint4 load_uint4(const void* p) { return *reinterpret_cast<const uint4*>(p); }
__device__ __forceinline__ void store_uint4(void* p, uint4 v) { *reinterpret_cast<uint4*>(p) = v; }

// ---- tensor-core MMA (warp-wide; all 32 lanes call with their fragments) ----
// Fragment layouts (PTX ISA, mma.m16n8k8 .tf32 and mma.m16n8k16 .f16/.bf16), with
// g = lane / 4 and t = lane % 4:
//   tf32 A (16x8):  a0 (g, t)  a1 (g+8, t)  a2 (g, t+4)  a3 (g+8, t+4)
//   tf32 B (8x8):   b0 (k=t, n=g)  b1 (k=t+4, n=g)
//   f16 A (16x16):  a0 (g, 2t..2t+1)  a1 (g+8, 2t..)  a2 (g, 2t+8..)  a3 (g+8, 2t+8..)
//   f16 B (16x8):   b0 (k=2t..2t+1, n=g)  b1 (k=2t+8..2t+9, n=g)
//   C/D (16x8 f32): c0 (g, 2t)  c1 (g, 2t+1)  c2 (g+8, 2t)  c3 (g+8, 2t+1)
// A packed register holds the lower-indexed element in its low 16 bits.
// float32 -> tf32 MMA operand: rounded to nearest, ties to even (the IEEE default), to the 19
// bits (sign, 8 exponent, 10 mantissa) the tensor core reads; inf stays inf (a finite value past
// the largest tf32 rounds to inf, as a float rounds). The low 13 bits of the register are not
// cleared on every path (the tensor core ignores them), so on sm_80 and in the emulator a NaN is
// passed as it came and the MMA reads its top 19 bits: NaN for every NaN arithmetic makes (CUDA's
// 0x7fffffff, NumPy's 0x7fc00000), inf for a hand-made one whose payload lies only in the 13
// dropped bits (sm_90's cvt gives NaN there; not worth 2 instructions per element on sm_80). sm_90 has
// cvt.rn.tf32.f32 (one F2FP.TF32 instruction). sm_80 has only cvt.rna (ties away from zero,
// lowered to 3 instructions), so there, as in the emulator, the rounding is done on the bits:
// + 0xfff plus the lowest kept bit (bit 13), so that a tie carries into the kept bits only when
// that bit is odd; skipped for inf and NaN (a NaN's mantissa could carry into the sign). On sm_80
// the bit comes as a carry: (u << 18) + 2^31 carries out exactly when bit 13 is set (mad.lo.cc,
// a LEA setting the carry), then addc adds 0xfff and the carry: 3 instructions with the finite
// test (FSETP, LEA, IADD3.X), as cheap as cvt.rna. One rounding on every path and architecture,
// so the NumPy references model one thing (gpuk.kernels.testing.round_tf32).
__device__ __forceinline__ unsigned float_to_tf32(float x) {
#if !defined(GPUK_EMULATE) && defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
    unsigned r;
    asm("cvt.rn.tf32.f32 %0, %1;\n" : "=r"(r) : "f"(x));
    return r;
#else
    unsigned u = __float_as_uint(x);
    if (fabsf(x) < __int_as_float(0x7f800000)) {
#if !defined(GPUK_EMULATE) && defined(__CUDA_ARCH__)
        asm("{\n .reg .u32 d;\n mad.lo.cc.u32 d, %0, 0x40000, 0x80000000;\n addc.u32 %0, %0, 0xfff;\n}\n" : "+r"(u));
#else
        u += 0xfffu + ((u >> 13) & 1u);
#endif
    }
    return u;
#endif
}
__device__ __forceinline__ unsigned pack_half2(float lo, float hi) {
    return (unsigned)__half_as_ushort(__float2half_rn(lo)) | ((unsigned)__half_as_ushort(__float2half_rn(hi)) << 16);
}
__device__ __forceinline__ unsigned pack_bfloat162(float lo, float hi) {
    return (unsigned)__bfloat16_as_ushort(__float2bfloat16_rn(lo)) |
           ((unsigned)__bfloat16_as_ushort(__float2bfloat16_rn(hi)) << 16);
}

#if defined(GPUK_EMULATE) && !defined(GPUK_MMA_VIA_SHUFFLES)
#define GPUK_EMU_MMA(NAME, KIND)                                                                       \
    __device__ __forceinline__ void NAME(float d[4], const unsigned a[4], const unsigned b[2], const float c[4]) { \
        ::gpuk_emu::MmaOperands ops{a, b, c, d};                                                       \
        ::gpuk_emu::WarpOp op{::gpuk_emu::KIND, GPUK_FULL_MASK, 0, 0, 32, 0, &ops};                    \
        ::gpuk_emu::warp_op(op);                                                                       \
    }
GPUK_EMU_MMA(mma_m16n8k8_tf32, OP_MMA_TF32)
GPUK_EMU_MMA(mma_m16n8k16_f16, OP_MMA_F16)
GPUK_EMU_MMA(mma_m16n8k16_bf16, OP_MMA_BF16)
#undef GPUK_EMU_MMA
#elif !defined(GPUK_EMULATE) && defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800 && !defined(GPUK_MMA_VIA_SHUFFLES)
// SHAPE_TYPES is the instruction's "shape.row.col.types" suffix; the operand list is shared.
#define GPUK_PTX_MMA(NAME, SHAPE_TYPES)                                                                \
    __device__ __forceinline__ void NAME(float d[4], const unsigned a[4], const unsigned b[2], const float c[4]) { \
        asm volatile("mma.sync.aligned." SHAPE_TYPES " "                                               \
                     "{%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, {%10,%11,%12,%13};\n"                     \
                     : "=f"(d[0]), "=f"(d[1]), "=f"(d[2]), "=f"(d[3])                                  \
                     : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]), "r"(b[1]),               \
                       "f"(c[0]), "f"(c[1]), "f"(c[2]), "f"(c[3]));                                    \
    }
GPUK_PTX_MMA(mma_m16n8k8_tf32, "m16n8k8.row.col.f32.tf32.tf32.f32")
GPUK_PTX_MMA(mma_m16n8k16_f16, "m16n8k16.row.col.f32.f16.f16.f32")
GPUK_PTX_MMA(mma_m16n8k16_bf16, "m16n8k16.row.col.f32.bf16.bf16.f32")
#undef GPUK_PTX_MMA
#else
// Pre-sm_80 devices (and the emulator with GPUK_MMA_VIA_SHUFFLES): the same fragment
// contract computed with warp shuffles. Slow, but exact in layout.
__device__ __forceinline__ float tf32_value(unsigned r) { return __uint_as_float(r & 0xffffe000u); }
__device__ __forceinline__ float lowp_value(unsigned bits, bool bf16) {
    return bf16 ? __bfloat162float(__ushort_as_bfloat16((unsigned short)bits))
                : __half2float(__ushort_as_half((unsigned short)bits));
}
__device__ __forceinline__ void mma_via_shuffles(float d[4], const unsigned a[4], const unsigned b[2], const float c[4],
                                                 int k_pairs, bool tf32, bool bf16) {
    const int lane = threadIdx.x & 31, g = lane >> 2, t = lane & 3;
    float acc0 = c[0], acc1 = c[1], acc2 = c[2], acc3 = c[3];
    for (int kp = 0; kp < k_pairs; ++kp) {   // tf32: kp is k (8 steps); f16: a pair of k
        const int hi = kp >= 4, src = kp & 3;
        const unsigned ra0 = __shfl_sync(GPUK_FULL_MASK, hi ? a[2] : a[0], g * 4 + src);
        const unsigned ra1 = __shfl_sync(GPUK_FULL_MASK, hi ? a[3] : a[1], g * 4 + src);
        const unsigned rb0 = __shfl_sync(GPUK_FULL_MASK, hi ? b[1] : b[0], (2 * t) * 4 + src);
        const unsigned rb1 = __shfl_sync(GPUK_FULL_MASK, hi ? b[1] : b[0], (2 * t + 1) * 4 + src);
        if (tf32) {
            const float x0 = tf32_value(ra0), x1 = tf32_value(ra1), y0 = tf32_value(rb0), y1 = tf32_value(rb1);
            acc0 += x0 * y0; acc1 += x0 * y1; acc2 += x1 * y0; acc3 += x1 * y1;
        } else {
            for (int h = 0; h < 2; ++h) {
                const int sh = 16 * h;
                const float x0 = lowp_value((ra0 >> sh) & 0xffffu, bf16), x1 = lowp_value((ra1 >> sh) & 0xffffu, bf16);
                const float y0 = lowp_value((rb0 >> sh) & 0xffffu, bf16), y1 = lowp_value((rb1 >> sh) & 0xffffu, bf16);
                acc0 += x0 * y0; acc1 += x0 * y1; acc2 += x1 * y0; acc3 += x1 * y1;
            }
        }
    }
    d[0] = acc0; d[1] = acc1; d[2] = acc2; d[3] = acc3;
}
__device__ __forceinline__ void mma_m16n8k8_tf32(float d[4], const unsigned a[4], const unsigned b[2], const float c[4]) {
    mma_via_shuffles(d, a, b, c, 8, true, false);
}
__device__ __forceinline__ void mma_m16n8k16_f16(float d[4], const unsigned a[4], const unsigned b[2], const float c[4]) {
    mma_via_shuffles(d, a, b, c, 8, false, false);
}
__device__ __forceinline__ void mma_m16n8k16_bf16(float d[4], const unsigned a[4], const unsigned b[2], const float c[4]) {
    mma_via_shuffles(d, a, b, c, 8, false, true);
}
#endif

// ---- ldmatrix: 8x8 matrices of 16-bit elements, shared memory -> MMA fragments (warp-wide) ----
// ldmatrix<NUM, TRANS>(r, row): lanes 8i..8i+7 pass the addresses of rows 0..7 of matrix i
// (16 bytes each, 16-byte aligned; lanes >= 8*NUM pass any pointer, unread). Register r[i] of
// lane l = 4g + t gets matrix i's (row g, cols 2t, 2t+1); with TRANS (rows 2t, 2t+1, col g);
// the lower index in the low half (PTX ISA, ldmatrix). A 32-bit element counts as two 16-bit
// columns, so the non-transposed form also loads tf32 fragments (lane gets (row g, col t)).
#if !defined(GPUK_EMULATE) && defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800 && !defined(GPUK_MMA_VIA_SHUFFLES)
template <int NUM, bool TRANS> __device__ __forceinline__ void ldmatrix(unsigned (&r)[NUM], const void* row) {
    const unsigned s = (unsigned)__cvta_generic_to_shared(row);
    if (NUM == 4 && !TRANS)
        asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0,%1,%2,%3}, [%4];\n"
                     : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3]) : "r"(s));
    else if (NUM == 4)
        asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0,%1,%2,%3}, [%4];\n"
                     : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3]) : "r"(s));
    else if (NUM == 2 && !TRANS)
        asm volatile("ldmatrix.sync.aligned.m8n8.x2.shared.b16 {%0,%1}, [%2];\n" : "=r"(r[0]), "=r"(r[1]) : "r"(s));
    else if (NUM == 2)
        asm volatile("ldmatrix.sync.aligned.m8n8.x2.trans.shared.b16 {%0,%1}, [%2];\n" : "=r"(r[0]), "=r"(r[1]) : "r"(s));
    else if (!TRANS)
        asm volatile("ldmatrix.sync.aligned.m8n8.x1.shared.b16 {%0}, [%1];\n" : "=r"(r[0]) : "r"(s));
    else
        asm volatile("ldmatrix.sync.aligned.m8n8.x1.trans.shared.b16 {%0}, [%1];\n" : "=r"(r[0]) : "r"(s));
}
#elif defined(GPUK_EMULATE) && !defined(GPUK_MMA_VIA_SHUFFLES)
template <int NUM, bool TRANS> __device__ __forceinline__ void ldmatrix(unsigned (&r)[NUM], const void* row) {
    static_assert(NUM == 1 || NUM == 2 || NUM == 4, "ldmatrix loads 1, 2 or 4 matrices");
    ::gpuk_emu::LdmatrixOperands ops{{0u, 0u, 0u, 0u}, r, NUM, TRANS};
    if ((int)(threadIdx.x & 31) < 8 * NUM) {   // this lane's row: a checked shared-memory read
        const uint4 v = *reinterpret_cast<const uint4*>(row);
        ops.row[0] = v.x; ops.row[1] = v.y; ops.row[2] = v.z; ops.row[3] = v.w;
    }
    ::gpuk_emu::WarpOp op{::gpuk_emu::OP_LDMATRIX, GPUK_FULL_MASK, 0, 0, 32, 0, &ops};
    ::gpuk_emu::warp_op(op);
}
#else
// Without the instruction (and in the emulator with GPUK_MMA_VIA_SHUFFLES): each lane reads
// its row, shuffles deliver the words.
template <int NUM, bool TRANS> __device__ __forceinline__ void ldmatrix(unsigned (&r)[NUM], const void* row) {
    const int lane = threadIdx.x & 31, g = lane >> 2, t = lane & 3;
    uint4 v = make_uint4(0u, 0u, 0u, 0u);
    if (lane < 8 * NUM) v = *reinterpret_cast<const uint4*>(row);
    const unsigned words[4] = {v.x, v.y, v.z, v.w};
    for (int i = 0; i < NUM; ++i) {
        if (!TRANS) {
            unsigned got = 0;
            for (int w = 0; w < 4; ++w) {
                const unsigned x = __shfl_sync(GPUK_FULL_MASK, words[w], i * 8 + g);
                if (w == t) got = x;
            }
            r[i] = got;
        } else {
            unsigned halves[2];
            for (int h = 0; h < 2; ++h) {
                unsigned got = 0;
                for (int w = 0; w < 4; ++w) {
                    const unsigned x = __shfl_sync(GPUK_FULL_MASK, words[w], i * 8 + 2 * t + h);
                    if (w == (g >> 1)) got = x;
                }
                halves[h] = (got >> (16 * (g & 1))) & 0xffffu;
            }
            r[i] = halves[0] | (halves[1] << 16);
        }
    }
}
#endif

// ---- cp.async: asynchronous global->shared copies (sm_80+); plain copies elsewhere ----
#if !defined(GPUK_EMULATE) && defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
#define GPUK_HAS_CP_ASYNC 1
__device__ __forceinline__ void cp_async_16(void* smem_dst, const void* gmem_src) {
    const unsigned s = (unsigned)__cvta_generic_to_shared(smem_dst);
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16;\n" ::"r"(s), "l"(gmem_src));
}
// Copies 16 bytes when `valid`, else zero-fills the destination without reading gmem_src.
__device__ __forceinline__ void cp_async_16_zfill(void* smem_dst, const void* gmem_src, bool valid) {
    const unsigned s = (unsigned)__cvta_generic_to_shared(smem_dst);
    const int src_bytes = valid ? 16 : 0;
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(s), "l"(gmem_src), "r"(src_bytes));
}
__device__ __forceinline__ void cp_async_4(void* smem_dst, const void* gmem_src) {
    const unsigned s = (unsigned)__cvta_generic_to_shared(smem_dst);
    asm volatile("cp.async.ca.shared.global [%0], [%1], 4;\n" ::"r"(s), "l"(gmem_src));
}
// 4-, 8- or 16-byte copy, zero-filling the destination (without reading gmem_src) when !valid.
template <int BYTES> __device__ __forceinline__ void cp_async_zfill(void* smem_dst, const void* gmem_src, bool valid) {
    static_assert(BYTES == 4 || BYTES == 8 || BYTES == 16, "cp.async copies 4, 8 or 16 bytes");
    const unsigned s = (unsigned)__cvta_generic_to_shared(smem_dst);
    const int src_bytes = valid ? BYTES : 0;
    if (BYTES == 16)
        asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(s), "l"(gmem_src), "r"(src_bytes));
    else
        asm volatile("cp.async.ca.shared.global [%0], [%1], %2, %3;\n" ::"r"(s), "l"(gmem_src), "n"(BYTES), "r"(src_bytes));
}
__device__ __forceinline__ void cp_async_commit() { asm volatile("cp.async.commit_group;\n" ::); }
template <int N> __device__ __forceinline__ void cp_async_wait() { asm volatile("cp.async.wait_group %0;\n" ::"n"(N)); }
__device__ __forceinline__ void cp_async_wait_all() { asm volatile("cp.async.wait_all;\n" ::); }
#elif defined(GPUK_EMULATE)
// The emulator's cp.async: with GPUK_EMU_SANITIZE the data lands only at the wait (emu_host.h).
__device__ __forceinline__ void cp_async_16(void* smem_dst, const void* gmem_src) { ::gpuk_emu::cp_async(smem_dst, gmem_src, 16, 16); }
__device__ __forceinline__ void cp_async_16_zfill(void* smem_dst, const void* gmem_src, bool valid) {
    ::gpuk_emu::cp_async(smem_dst, gmem_src, 16, valid ? 16 : 0);
}
__device__ __forceinline__ void cp_async_4(void* smem_dst, const void* gmem_src) { ::gpuk_emu::cp_async(smem_dst, gmem_src, 4, 4); }
template <int BYTES> __device__ __forceinline__ void cp_async_zfill(void* smem_dst, const void* gmem_src, bool valid) {
    static_assert(BYTES == 4 || BYTES == 8 || BYTES == 16, "cp.async copies 4, 8 or 16 bytes");
    ::gpuk_emu::cp_async(smem_dst, gmem_src, BYTES, valid ? BYTES : 0);
}
__device__ __forceinline__ void cp_async_commit() { ::gpuk_emu::cp_async_commit(); }
template <int N> __device__ __forceinline__ void cp_async_wait() { ::gpuk_emu::cp_async_wait(N); }
__device__ __forceinline__ void cp_async_wait_all() { ::gpuk_emu::cp_async_wait(-1); }
#else
__device__ __forceinline__ void cp_async_16(void* smem_dst, const void* gmem_src) { store_uint4(smem_dst, load_uint4(gmem_src)); }
__device__ __forceinline__ void cp_async_16_zfill(void* smem_dst, const void* gmem_src, bool valid) {
    store_uint4(smem_dst, valid ? load_uint4(gmem_src) : make_uint4(0u, 0u, 0u, 0u));
}
__device__ __forceinline__ void cp_async_4(void* smem_dst, const void* gmem_src) {
    *reinterpret_cast<unsigned*>(smem_dst) = *reinterpret_cast<const unsigned*>(gmem_src);
}
template <int BYTES> __device__ __forceinline__ void cp_async_zfill(void* smem_dst, const void* gmem_src, bool valid) {
    static_assert(BYTES == 4 || BYTES == 8 || BYTES == 16, "cp.async copies 4, 8 or 16 bytes");
    unsigned char* d = static_cast<unsigned char*>(smem_dst);
    const unsigned char* src = static_cast<const unsigned char*>(gmem_src);
    for (int i = 0; i < BYTES; ++i) d[i] = valid ? src[i] : 0;
}
__device__ __forceinline__ void cp_async_commit() {}
template <int N> __device__ __forceinline__ void cp_async_wait() {}
__device__ __forceinline__ void cp_async_wait_all() {}
#endif
