// Emulated CUDA value types: dim3/uint3, vector types, __half and __nv_bfloat16.
// Layouts and alignments follow CUDA's vector_types.h so that kernels reinterpreting
// buffers (float4 loads, packed half2 registers) see the same bytes as on a GPU.
#pragma once
#include <cstdint>
#include <cstring>

struct uint3 { unsigned x, y, z; };
struct dim3 {
    unsigned x, y, z;
    constexpr dim3(unsigned vx = 1, unsigned vy = 1, unsigned vz = 1) : x(vx), y(vy), z(vz) {}
    constexpr dim3(uint3 v) : x(v.x), y(v.y), z(v.z) {}
    constexpr operator uint3() const { return uint3{x, y, z}; }
};

#define GPUK_EMU_VEC2(T, N, A) struct alignas(A) N##2 { T x, y; }; \
    inline N##2 make_##N##2(T x, T y) { return N##2{x, y}; }
#define GPUK_EMU_VEC4(T, N, A) struct alignas(A) N##4 { T x, y, z, w; }; \
    inline N##4 make_##N##4(T x, T y, T z, T w) { return N##4{x, y, z, w}; }

GPUK_EMU_VEC2(float, float, 8)
GPUK_EMU_VEC4(float, float, 16)
GPUK_EMU_VEC2(double, double, 16)
GPUK_EMU_VEC2(int, int, 8)
GPUK_EMU_VEC4(int, int, 16)
GPUK_EMU_VEC2(unsigned, uint, 8)
GPUK_EMU_VEC4(unsigned, uint, 16)
GPUK_EMU_VEC2(long long, longlong, 16)
GPUK_EMU_VEC2(unsigned long long, ulonglong, 16)
GPUK_EMU_VEC2(short, short, 4)
GPUK_EMU_VEC4(short, short, 8)
GPUK_EMU_VEC4(signed char, char, 4)
GPUK_EMU_VEC4(unsigned char, uchar, 4)
#undef GPUK_EMU_VEC2
#undef GPUK_EMU_VEC4

struct float3 { float x, y, z; };
struct int3 { int x, y, z; };
inline float3 make_float3(float x, float y, float z) { return float3{x, y, z}; }
inline int3 make_int3(int x, int y, int z) { return int3{x, y, z}; }
inline uint3 make_uint3(unsigned x, unsigned y, unsigned z) { return uint3{x, y, z}; }

namespace gpuk_emu {

inline uint32_t float_bits(float f) { uint32_t u; std::memcpy(&u, &f, 4); return u; }
inline float bits_float(uint32_t u) { float f; std::memcpy(&f, &u, 4); return f; }

// float -> binary16, round to nearest even; NaN becomes the canonical 0x7fff as cvt.rn.f16.f32 does.
inline uint16_t float_to_half_bits(float f) {
    const uint32_t x = float_bits(f);
    const uint32_t sign = (x >> 16) & 0x8000u;
    const uint32_t ax = x & 0x7fffffffu;
    if (ax > 0x7f800000u) return 0x7fffu;
    if (ax >= 0x477ff000u) return uint16_t(sign | 0x7c00u);          // >= 65520 rounds to inf
    if (ax >= 0x38800000u) {                                           // normal half
        const uint32_t rounded = ax + 0xfffu + ((ax >> 13) & 1u);
        return uint16_t(sign | ((rounded - 0x38000000u) >> 13));
    }
    if (ax < 0x33000000u) return uint16_t(sign);                       // <= 2^-25 rounds to zero
    const uint32_t e = ax >> 23;
    const uint32_t m = (ax & 0x7fffffu) | 0x800000u;
    const uint32_t shift = 126u - e;                                   // 14..24
    uint32_t r = m >> shift;
    const uint32_t rem = m & ((1u << shift) - 1u), halfway = 1u << (shift - 1u);
    if (rem > halfway || (rem == halfway && (r & 1u))) ++r;
    return uint16_t(sign | r);
}

inline float half_bits_to_float(uint16_t h) {
    const uint32_t sign = uint32_t(h & 0x8000u) << 16;
    const uint32_t e = (h >> 10) & 0x1fu, m = h & 0x3ffu;
    if (e == 0x1fu) return bits_float(sign | 0x7f800000u | (m << 13));
    if (e == 0) {
        const float v = float(m) * 5.9604644775390625e-8f;             // m * 2^-24, exact
        return sign ? -v : v;
    }
    return bits_float(sign | ((e + 112u) << 23) | (m << 13));
}

// float -> bfloat16, round to nearest even; NaN becomes the canonical 0x7fff.
inline uint16_t float_to_bf16_bits(float f) {
    const uint32_t x = float_bits(f);
    if ((x & 0x7fffffffu) > 0x7f800000u) return 0x7fffu;
    return uint16_t((x + 0x7fffu + ((x >> 16) & 1u)) >> 16);
}
inline float bf16_bits_to_float(uint16_t b) { return bits_float(uint32_t(b) << 16); }

}  // namespace gpuk_emu

// The bits start at 0 (a default member initializer) so that `__shared__ __half a[N]`, i.e.
// `static thread_local __half a[N]` in the emulator, is constant-initialized: with only a
// defaulted constructor g++ gives such an array a one-byte initialization guard in the TLS
// block, which every thread reads and the first writes, and which the counters and the
// sanitizer then took for shared-memory accesses (thread 0's extra writes shifted its
// requests against its warp's: phantom bank conflicts in conv_igemm_wgrad's first block).
struct __half {
    unsigned short __x = 0;
    __half() = default;
    __half(float f) : __x(gpuk_emu::float_to_half_bits(f)) {}
    __half(double d) : __x(gpuk_emu::float_to_half_bits(float(d))) {}
    operator float() const { return gpuk_emu::half_bits_to_float(__x); }
};
struct __nv_bfloat16 {   // bits start at 0: see __half
    unsigned short __x = 0;
    __nv_bfloat16() = default;
    __nv_bfloat16(float f) : __x(gpuk_emu::float_to_bf16_bits(f)) {}
    __nv_bfloat16(double d) : __x(gpuk_emu::float_to_bf16_bits(float(d))) {}
    operator float() const { return gpuk_emu::bf16_bits_to_float(__x); }
};
typedef __half half;
typedef __nv_bfloat16 nv_bfloat16;
struct alignas(4) __half2 { __half x, y; };
struct alignas(4) __nv_bfloat162 { __nv_bfloat16 x, y; };

inline __half __float2half(float f) { return __half(f); }
inline __half __float2half_rn(float f) { return __half(f); }
inline float __half2float(__half h) { return float(h); }
inline __half __ushort_as_half(unsigned short u) { __half h; h.__x = u; return h; }
inline unsigned short __half_as_ushort(__half h) { return h.__x; }
inline __half __int2half_rn(int i) { return __half(float(i)); }
inline __nv_bfloat16 __float2bfloat16(float f) { return __nv_bfloat16(f); }
inline __nv_bfloat16 __float2bfloat16_rn(float f) { return __nv_bfloat16(f); }
inline float __bfloat162float(__nv_bfloat16 b) { return float(b); }
inline __nv_bfloat16 __ushort_as_bfloat16(unsigned short u) { __nv_bfloat16 b; b.__x = u; return b; }
inline unsigned short __bfloat16_as_ushort(__nv_bfloat16 b) { return b.__x; }
inline __half2 __floats2half2_rn(float a, float b) { return __half2{__half(a), __half(b)}; }
inline __half2 __halves2half2(__half a, __half b) { return __half2{a, b}; }
inline float2 __half22float2(__half2 h) { return float2{float(h.x), float(h.y)}; }
inline float __low2float(__half2 h) { return float(h.x); }
inline float __high2float(__half2 h) { return float(h.y); }
inline __nv_bfloat162 __floats2bfloat162_rn(float a, float b) { return __nv_bfloat162{__nv_bfloat16(a), __nv_bfloat16(b)}; }
inline float2 __bfloat1622float2(__nv_bfloat162 h) { return float2{float(h.x), float(h.y)}; }

// Arithmetic: computed in float and rounded once. For + - * / this equals native
// half/bfloat16 arithmetic (float carries > 2p+2 bits); __hfma may differ by double rounding.
#define GPUK_EMU_LOWP_OPS(T, P)                                                              \
    inline T operator+(T a, T b) { return T(float(a) + float(b)); }                         \
    inline T operator-(T a, T b) { return T(float(a) - float(b)); }                         \
    inline T operator*(T a, T b) { return T(float(a) * float(b)); }                         \
    inline T operator/(T a, T b) { return T(float(a) / float(b)); }                         \
    inline T operator-(T a) { T r = a; r.__x ^= 0x8000u; return r; }                        \
    inline T& operator+=(T& a, T b) { return a = a + b; }                                   \
    inline T& operator-=(T& a, T b) { return a = a - b; }                                   \
    inline T& operator*=(T& a, T b) { return a = a * b; }                                   \
    inline bool operator==(T a, T b) { return float(a) == float(b); }                       \
    inline bool operator!=(T a, T b) { return float(a) != float(b); }                       \
    inline bool operator<(T a, T b) { return float(a) < float(b); }                         \
    inline bool operator>(T a, T b) { return float(a) > float(b); }                         \
    inline bool operator<=(T a, T b) { return float(a) <= float(b); }                       \
    inline bool operator>=(T a, T b) { return float(a) >= float(b); }                       \
    inline T P##add(T a, T b) { return a + b; }                                             \
    inline T P##sub(T a, T b) { return a - b; }                                             \
    inline T P##mul(T a, T b) { return a * b; }                                             \
    inline T P##div(T a, T b) { return a / b; }                                             \
    inline T P##neg(T a) { return -a; }                                                     \
    inline T P##abs(T a) { T r = a; r.__x &= 0x7fffu; return r; }                          \
    inline T P##fma(T a, T b, T c) { return T(float(a) * float(b) + float(c)); }            \
    inline T P##max(T a, T b) { return T(__builtin_fmaxf(float(a), float(b))); }            \
    inline T P##min(T a, T b) { return T(__builtin_fminf(float(a), float(b))); }            \
    inline bool P##eq(T a, T b) { return a == b; }                                          \
    inline bool P##lt(T a, T b) { return a < b; }                                           \
    inline bool P##gt(T a, T b) { return a > b; }                                           \
    inline bool P##le(T a, T b) { return a <= b; }                                          \
    inline bool P##ge(T a, T b) { return a >= b; }                                          \
    inline bool P##isnan(T a) { return float(a) != float(a); }
GPUK_EMU_LOWP_OPS(__half, __h)
GPUK_EMU_LOWP_OPS(__nv_bfloat16, __h)
#undef GPUK_EMU_LOWP_OPS
