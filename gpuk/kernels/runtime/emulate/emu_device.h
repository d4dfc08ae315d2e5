// Emulated CUDA device-side API: qualifiers, built-in indices, barriers, warp
// collectives, atomics and math intrinsics. The scheduler behind the blocking calls
// lives in emu_host.h (included once, at the end of the generated translation unit).
#pragma once
#include <cmath>
#include <cstdint>
#include <cstring>
#include <type_traits>
#include "emu_types.h"

#define __global__
#define __device__
#define __host__
#define __forceinline__ inline __attribute__((always_inline))
#define __noinline__ __attribute__((noinline))
#define __launch_bounds__(...)
#define __align__(n) __attribute__((aligned(n)))
// The fibers of one block run on one host thread, so a thread_local is exactly one
// copy per block in flight. `extern __shared__` is rewritten by the runtime (see
// emulated_runtime.py) into a pointer to the launch's dynamic shared memory.
#define __shared__ static thread_local
#define __constant__ static
static constexpr int warpSize = 32;
// CUDA device code calls exp(x) etc. unqualified with float arguments: bring the float
// overloads into the global namespace so they do not silently promote to double.
using std::exp; using std::log; using std::sqrt; using std::fabs; using std::pow; using std::tanh;
using std::floor; using std::ceil; using std::fmax; using std::fmin; using std::log1p; using std::expm1;
using std::isnan; using std::isinf; using std::isfinite; using std::abs;

namespace gpuk_emu {

struct Fiber;      // one emulated CUDA thread
struct WarpOp {    // one lane's part in a warp collective
    int op;
    unsigned mask;
    uint64_t value;
    int arg;
    int width;
    uint64_t result;
    void* data;
};
enum WarpOpKind {
    OP_SYNC, OP_SHFL_IDX, OP_SHFL_UP, OP_SHFL_DOWN, OP_SHFL_XOR, OP_BALLOT, OP_ANY, OP_ALL,
    OP_REDUCE_ADD, OP_REDUCE_MIN_I, OP_REDUCE_MAX_I, OP_REDUCE_MIN_U, OP_REDUCE_MAX_U,
    OP_MMA_TF32, OP_MMA_F16, OP_MMA_BF16, OP_LDMATRIX, OP_WGMMA,
};
struct MmaOperands { const uint32_t* a; const uint32_t* b; const float* c; float* d; };
// ldmatrix: each lane's 16-byte row (already read by that lane) and where its registers go.
struct LdmatrixOperands { uint32_t row[4]; uint32_t* out; int num, trans; };

struct ThreadState { uint3 tid; unsigned lane, warp; };
inline thread_local ThreadState* t_thread = nullptr;
inline thread_local uint3 t_block_idx;
inline thread_local dim3 t_block_dim;
inline thread_local dim3 t_grid_dim;

void sync_block_impl(int predicate, int* count);
uint64_t warp_op(WarpOp& op);
unsigned active_mask();
[[noreturn]] void trap(const char* what);
void* dynamic_shared_base();
// cp.async (common.cuh's wrappers): immediate copies, or with the sanitizer the copy lands
// at the issuing thread's wait (emu_host.h). src_bytes < bytes zero-fills the rest.
void cp_async(void* dst, const void* src, unsigned bytes, unsigned src_bytes);
void cp_async_commit();
void cp_async_wait(int pending_groups);   // -1: wait for every copy, committed or not
// wgmma (hopper.cuh's wrappers): a warpgroup (128-thread) collective; the product is queued
// at the issue and computed at the first wait of a thread of the warpgroup that retires its
// group (emu_host.h, which says what the sanitizer checks).
enum WgmmaKind { WGMMA_F16, WGMMA_BF16, WGMMA_TF32 };
struct WgmmaOperands { int kind, n; uint64_t desc_a, desc_b; int scale_d; float* d; };
unsigned shared_window_address(const void* p);   // offset in the launch's dynamic shared memory
void wgmma_fence();
void proxy_fence_async();   // fence.proxy.async.shared::cta: generic writes visible to the async proxy
void wgmma_mma_async(WgmmaOperands& op);
void wgmma_commit();
void wgmma_wait(int pending_groups);

template <class T> inline T shfl(int kind, unsigned mask, T var, int arg, int width) {
    static_assert(sizeof(T) <= 8 && std::is_trivially_copyable<T>::value, "shuffle of a type > 8 bytes");
    WarpOp op{kind, mask, 0, arg, width, 0, nullptr};
    std::memcpy(&op.value, &var, sizeof(T));
    warp_op(op);
    T r;
    std::memcpy(&r, &op.result, sizeof(T));
    return r;
}
inline uint64_t vote(int kind, unsigned mask, uint64_t v) {
    WarpOp op{kind, mask, v, 0, 32, 0, nullptr};
    return warp_op(op);
}

// Lock-free read-modify-write on the bit pattern (also correct with several host threads).
template <class T, class F> inline T atomic_update(T* address, F f) {
    using U = typename std::conditional<sizeof(T) == 8, uint64_t,
              typename std::conditional<sizeof(T) == 4, uint32_t, uint16_t>::type>::type;
    U* u = reinterpret_cast<U*>(address);
    U old = __atomic_load_n(u, __ATOMIC_RELAXED);
    for (;;) {
        T old_value, new_value;
        std::memcpy(&old_value, &old, sizeof(T));
        new_value = f(old_value);
        U desired;
        std::memcpy(&desired, &new_value, sizeof(T));
        if (__atomic_compare_exchange_n(u, &old, desired, false, __ATOMIC_SEQ_CST, __ATOMIC_RELAXED))
            return old_value;
    }
}
template <class T> inline T cmin(T a, T b) { return b < a ? b : a; }
template <class T> inline T cmax(T a, T b) { return a < b ? b : a; }

}  // namespace gpuk_emu

#define threadIdx (::gpuk_emu::t_thread->tid)
#define blockIdx (::gpuk_emu::t_block_idx)
#define blockDim (::gpuk_emu::t_block_dim)
#define gridDim (::gpuk_emu::t_grid_dim)
#define GPUK_EMULATE 1

// ---- barriers and warp collectives ----
inline void __syncthreads() { ::gpuk_emu::sync_block_impl(0, nullptr); }
inline int __syncthreads_count(int p) { int c; ::gpuk_emu::sync_block_impl(p, &c); return c; }
inline int __syncthreads_and(int p) { int c; ::gpuk_emu::sync_block_impl(p, &c); return c == int(blockDim.x * blockDim.y * blockDim.z); }
inline int __syncthreads_or(int p) { int c; ::gpuk_emu::sync_block_impl(p, &c); return c != 0; }
inline void __syncwarp(unsigned mask = 0xffffffffu) { ::gpuk_emu::vote(::gpuk_emu::OP_SYNC, mask, 0); }
inline unsigned __activemask() { return ::gpuk_emu::active_mask(); }
template <class T> inline T __shfl_sync(unsigned m, T v, int src, int w = 32) { return ::gpuk_emu::shfl(::gpuk_emu::OP_SHFL_IDX, m, v, src, w); }
template <class T> inline T __shfl_up_sync(unsigned m, T v, unsigned d, int w = 32) { return ::gpuk_emu::shfl(::gpuk_emu::OP_SHFL_UP, m, v, int(d), w); }
template <class T> inline T __shfl_down_sync(unsigned m, T v, unsigned d, int w = 32) { return ::gpuk_emu::shfl(::gpuk_emu::OP_SHFL_DOWN, m, v, int(d), w); }
template <class T> inline T __shfl_xor_sync(unsigned m, T v, int lm, int w = 32) { return ::gpuk_emu::shfl(::gpuk_emu::OP_SHFL_XOR, m, v, lm, w); }
inline unsigned __ballot_sync(unsigned m, int p) { return unsigned(::gpuk_emu::vote(::gpuk_emu::OP_BALLOT, m, p != 0)); }
inline int __any_sync(unsigned m, int p) { return int(::gpuk_emu::vote(::gpuk_emu::OP_ANY, m, p != 0)); }
inline int __all_sync(unsigned m, int p) { return int(::gpuk_emu::vote(::gpuk_emu::OP_ALL, m, p != 0)); }
inline unsigned __reduce_add_sync(unsigned m, unsigned v) { return unsigned(::gpuk_emu::vote(::gpuk_emu::OP_REDUCE_ADD, m, v)); }
inline int __reduce_add_sync(unsigned m, int v) { return int(::gpuk_emu::vote(::gpuk_emu::OP_REDUCE_ADD, m, unsigned(v))); }
inline unsigned __reduce_min_sync(unsigned m, unsigned v) { return unsigned(::gpuk_emu::vote(::gpuk_emu::OP_REDUCE_MIN_U, m, v)); }
inline unsigned __reduce_max_sync(unsigned m, unsigned v) { return unsigned(::gpuk_emu::vote(::gpuk_emu::OP_REDUCE_MAX_U, m, v)); }
inline int __reduce_min_sync(unsigned m, int v) { return int(::gpuk_emu::vote(::gpuk_emu::OP_REDUCE_MIN_I, m, uint32_t(v))); }
inline int __reduce_max_sync(unsigned m, int v) { return int(::gpuk_emu::vote(::gpuk_emu::OP_REDUCE_MAX_I, m, uint32_t(v))); }
inline void __threadfence() { __atomic_thread_fence(__ATOMIC_SEQ_CST); }
inline void __threadfence_block() { __atomic_thread_fence(__ATOMIC_SEQ_CST); }
inline void __threadfence_system() { __atomic_thread_fence(__ATOMIC_SEQ_CST); }
[[noreturn]] inline void __trap() { ::gpuk_emu::trap("__trap() called"); }
[[noreturn]] inline void __brkpt() { ::gpuk_emu::trap("__brkpt() called"); }
inline void __nanosleep(unsigned) {}
inline long long clock64() {
#if defined(__x86_64__)
    return (long long)__builtin_ia32_rdtsc();
#else
    return 0;
#endif
}

// ---- atomics (int, unsigned, unsigned long long, float, double) ----
#define GPUK_EMU_ATOMIC_INT(T)                                                                         \
    inline T atomicAdd(T* a, T v) { return __atomic_fetch_add(a, v, __ATOMIC_SEQ_CST); }              \
    inline T atomicSub(T* a, T v) { return __atomic_fetch_sub(a, v, __ATOMIC_SEQ_CST); }              \
    inline T atomicAnd(T* a, T v) { return __atomic_fetch_and(a, v, __ATOMIC_SEQ_CST); }              \
    inline T atomicOr(T* a, T v) { return __atomic_fetch_or(a, v, __ATOMIC_SEQ_CST); }                \
    inline T atomicXor(T* a, T v) { return __atomic_fetch_xor(a, v, __ATOMIC_SEQ_CST); }              \
    inline T atomicExch(T* a, T v) { return __atomic_exchange_n(a, v, __ATOMIC_SEQ_CST); }            \
    inline T atomicMax(T* a, T v) { return ::gpuk_emu::atomic_update(a, [v](T o) { return ::gpuk_emu::cmax(o, v); }); } \
    inline T atomicMin(T* a, T v) { return ::gpuk_emu::atomic_update(a, [v](T o) { return ::gpuk_emu::cmin(o, v); }); } \
    inline T atomicCAS(T* a, T cmp, T v) {                                                             \
        __atomic_compare_exchange_n(a, &cmp, v, false, __ATOMIC_SEQ_CST, __ATOMIC_SEQ_CST);            \
        return cmp;                                                                                    \
    }
GPUK_EMU_ATOMIC_INT(int)
GPUK_EMU_ATOMIC_INT(unsigned)
GPUK_EMU_ATOMIC_INT(unsigned long long)
GPUK_EMU_ATOMIC_INT(long long)
#undef GPUK_EMU_ATOMIC_INT
inline unsigned short atomicCAS(unsigned short* a, unsigned short cmp, unsigned short v) {
    __atomic_compare_exchange_n(a, &cmp, v, false, __ATOMIC_SEQ_CST, __ATOMIC_SEQ_CST);
    return cmp;
}
inline float atomicAdd(float* a, float v) { return ::gpuk_emu::atomic_update(a, [v](float o) { return o + v; }); }
inline double atomicAdd(double* a, double v) { return ::gpuk_emu::atomic_update(a, [v](double o) { return o + v; }); }
inline float atomicExch(float* a, float v) { return ::gpuk_emu::atomic_update(a, [v](float) { return v; }); }
inline unsigned atomicInc(unsigned* a, unsigned lim) { return ::gpuk_emu::atomic_update(a, [lim](unsigned o) { return o >= lim ? 0u : o + 1u; }); }
inline unsigned atomicDec(unsigned* a, unsigned lim) { return ::gpuk_emu::atomic_update(a, [lim](unsigned o) { return (o == 0u || o > lim) ? lim : o - 1u; }); }

// ---- math intrinsics: the emulation computes them at full IEEE precision ----
inline float __expf(float x) { return expf(x); }
inline float __exp10f(float x) { return powf(10.0f, x); }
inline float __logf(float x) { return logf(x); }
inline float __log2f(float x) { return log2f(x); }
inline float __log10f(float x) { return log10f(x); }
inline float __sinf(float x) { return sinf(x); }
inline float __cosf(float x) { return cosf(x); }
inline float __tanf(float x) { return tanf(x); }
inline void __sincosf(float x, float* s, float* c) { *s = sinf(x); *c = cosf(x); }
inline float __powf(float x, float y) { return powf(x, y); }
inline float __fdividef(float a, float b) { return a / b; }
inline float __frcp_rn(float x) { return 1.0f / x; }
inline float __fsqrt_rn(float x) { return sqrtf(x); }
inline float rsqrtf(float x) { return 1.0f / sqrtf(x); }
inline double rsqrt(double x) { return 1.0 / sqrt(x); }
inline float __saturatef(float x) { return x >= 1.0f ? 1.0f : (x > 0.0f ? x : 0.0f); }
inline float __fmaf_rn(float a, float b, float c) { return fmaf(a, b, c); }
inline float __fadd_rn(float a, float b) { return a + b; }
inline float __fsub_rn(float a, float b) { return a - b; }
inline float __fmul_rn(float a, float b) { return a * b; }
inline float __fdiv_rn(float a, float b) { return a / b; }
inline double __fma_rn(double a, double b, double c) { return fma(a, b, c); }
inline double __dadd_rn(double a, double b) { return a + b; }
inline double __dmul_rn(double a, double b) { return a * b; }
inline int __float_as_int(float f) { int i; std::memcpy(&i, &f, 4); return i; }
inline float __int_as_float(int i) { float f; std::memcpy(&f, &i, 4); return f; }
inline unsigned __float_as_uint(float f) { unsigned i; std::memcpy(&i, &f, 4); return i; }
inline float __uint_as_float(unsigned i) { float f; std::memcpy(&f, &i, 4); return f; }
inline long long __double_as_longlong(double d) { long long i; std::memcpy(&i, &d, 8); return i; }
inline double __longlong_as_double(long long i) { double d; std::memcpy(&d, &i, 8); return d; }
inline int __float2int_rn(float x) { return int(nearbyintf(x)); }
inline int __float2int_rz(float x) { return int(truncf(x)); }
inline int __float2int_rd(float x) { return int(floorf(x)); }
inline int __float2int_ru(float x) { return int(ceilf(x)); }
inline unsigned __float2uint_rn(float x) { return unsigned(nearbyintf(x)); }
inline long long __float2ll_rn(float x) { return (long long)nearbyintf(x); }
inline float __int2float_rn(int i) { return float(i); }
inline int __popc(unsigned x) { return __builtin_popcount(x); }
inline int __popcll(unsigned long long x) { return __builtin_popcountll(x); }
// PRMT in its default mode: byte i of the result is byte (s >> 4i) & 7 of y:x (x bytes 0-3, y 4-7).
inline unsigned __byte_perm(unsigned x, unsigned y, unsigned s) {
    const unsigned long long both = (unsigned long long)y << 32 | x;
    unsigned r = 0;
    for (int i = 0; i < 4; ++i) r |= unsigned(both >> (8 * ((s >> (4 * i)) & 7u)) & 0xffu) << (8 * i);
    return r;
}
inline int __clz(int x) { return x ? __builtin_clz(unsigned(x)) : 32; }
inline int __clzll(long long x) { return x ? __builtin_clzll((unsigned long long)x) : 64; }
inline int __ffs(int x) { return __builtin_ffs(x); }
inline int __ffsll(long long x) { return __builtin_ffsll(x); }
inline unsigned __brev(unsigned x) {
    x = ((x >> 1) & 0x55555555u) | ((x & 0x55555555u) << 1);
    x = ((x >> 2) & 0x33333333u) | ((x & 0x33333333u) << 2);
    x = ((x >> 4) & 0x0f0f0f0fu) | ((x & 0x0f0f0f0fu) << 4);
    return __builtin_bswap32(x);
}
inline unsigned __umulhi(unsigned a, unsigned b) { return unsigned((uint64_t(a) * b) >> 32); }
inline int __mulhi(int a, int b) { return int((int64_t(a) * b) >> 32); }
inline unsigned long long __umul64hi(unsigned long long a, unsigned long long b) {
    return (unsigned long long)(((unsigned __int128)a * b) >> 64);
}
inline int __mul24(int a, int b) { return a * b; }
inline unsigned __umul24(unsigned a, unsigned b) { return a * b; }
template <class T> inline T __ldg(const T* p) { return *p; }

// CUDA's global min/max overloads; floating point follows fminf/fmaxf (NaN-ignoring).
template <class A, class B, class = typename std::enable_if<std::is_arithmetic<A>::value && std::is_arithmetic<B>::value>::type>
inline typename std::common_type<A, B>::type max(A a, B b) {
    using C = typename std::common_type<A, B>::type;
    if constexpr (std::is_floating_point<C>::value) return fmax(C(a), C(b));
    else return C(a) < C(b) ? C(b) : C(a);
}
template <class A, class B, class = typename std::enable_if<std::is_arithmetic<A>::value && std::is_arithmetic<B>::value>::type>
inline typename std::common_type<A, B>::type min(A a, B b) {
    using C = typename std::common_type<A, B>::type;
    if constexpr (std::is_floating_point<C>::value) return fmin(C(a), C(b));
    else return C(b) < C(a) ? C(b) : C(a);
}
