// conv_igemm_index.cuh: conv_igemm.cu's integer helpers: 32 x 32 -> 64-bit multiplies and a
// select as single PTX instructions (index_wide, mul_wide, select_u32), division by a
// block-uniform divisor as multiply-shift (FastDiv), and wgrad's K-position decode built on it
// (PixDecode, PixLinear, WgradDecode), whose constants the launcher computes
// (conv/geometry.py fast_div, wgrad_decode_args).
// Relies on: ConvGeom (conv_common.cuh); no variant macro (GPUK_EMULATE picks the plain C++ forms).
//
#pragma once

// 32 x 32 -> 64-bit multiply(-add)s as single PTX instructions (mad.wide / mul.wide). Written
// in C++, the wgrad loader's chunk addresses (a per-chunk pointer fixed for the block plus the
// row's pixel times the pixel's size) get folded into 64-bit index arithmetic (3-4 instructions
// per chunk; as mad.wide.u32, ptxas computes the row's product once, one IMAD.WIDE.U32, and adds
// it to each chunk's pointer, 2 instructions), and a u64 product of two u32 gets an extra add of
// a zero high word. The emulator computes the same in plain C++.
template <class T> __device__ __forceinline__ const T* index_wide(const T* p, unsigned i, unsigned stride) {
    // p + i * stride elements (i * stride < 2^64: no overflow)
#if !defined(GPUK_EMULATE) && defined(__CUDA_ARCH__)
    const T* r;
    asm("mad.wide.u32 %0, %1, %2, %3;" : "=l"(r) : "r"(i), "r"(stride * (unsigned)sizeof(T)), "l"(p));
    return r;
#else
    return p + (unsigned long long)i * stride;
#endif
}
__device__ __forceinline__ unsigned long long mul_wide(unsigned a, unsigned b) {
#if !defined(GPUK_EMULATE) && defined(__CUDA_ARCH__)
    unsigned long long r;
    asm("mul.wide.u32 %0, %1, %2;" : "=l"(r) : "r"(a), "r"(b));
    return r;
#else
    return (unsigned long long)a * b;
#endif
}

// c ? a : b as one SEL: written in C++, the compiler may branch around the computation of a.
__device__ __forceinline__ unsigned select_u32(bool c, unsigned a, unsigned b) {
#if !defined(GPUK_EMULATE) && defined(__CUDA_ARCH__)
    unsigned r;
    asm("{ .reg .pred p; setp.ne.u32 p, %1, 0; selp.b32 %0, %2, %3, p; }" : "=r"(r) : "r"((unsigned)c), "r"(a), "r"(b));
    return r;
#else
    return c ? a : b;
#endif
}

// Division of numerators n < 2^31 by a block-uniform divisor d >= 1 as one 32 x 32 -> 64-bit
// multiply and a shift (IMAD.WIDE.U32, SHF): with l = ceil(log2 d), s = 31 + l and
// mul = ceil(2^s / d) < 2^32, n * mul / 2^s = n / d + e with 0 <= e < n / 2^s < 2^-l <= 1/d, which
// keeps floor exact. The launcher computes (mul, s) (conv/geometry.py fast_div) and passes them
// as kernel parameters.
struct FastDiv {
    unsigned mul;
    int shift;
    __device__ __forceinline__ int operator()(unsigned n) const {
        return (int)(mul_wide(n, mul) >> shift);
    }
};

// An (image, output pixel) position along K (wgrad), k = ((n * out_d + od) * out_h + oh) * out_w + ow,
// and its quotients: rows = k / out_w, planes = rows / out_h, n = planes / out_d.
struct PixPos { unsigned n; int od, oh, ow; };
struct PixQuot { unsigned k, rows, planes, n; };
// K position -> quotients, decoded afresh for every K tile by three FastDivs (by out_w, out_h,
// out_d; multipliers from the launcher): 6 instructions without a branch, where an iterator carried across tiles needs its wrap branches (pixel -> row ->
// plane -> image, each step of CONV_BK: ~20 instructions per row and tile, counted statically).
// position() adds the three remainders (the bounds-checking paths that need the coordinates).
// k < 2^31 (K < 2^31, checked by the launcher); rows past K decode to garbage no copy reads.
struct PixDecode {
    FastDiv by_w, by_h, by_d;
    __device__ __forceinline__ PixQuot operator()(unsigned k) const {
        PixQuot q;
        q.k = k;
        q.rows = (unsigned)by_w(k);
        q.planes = (unsigned)by_h(q.rows);
        q.n = (unsigned)by_d(q.planes);
        return q;
    }
    __device__ __forceinline__ static PixPos position(const ConvGeom& g, const PixQuot& q) {
        return PixPos{q.n, (int)(q.planes - q.n * (unsigned)g.out_d), (int)(q.rows - q.planes * (unsigned)g.out_h),
                      (int)(q.k - q.rows * (unsigned)g.out_w)};
    }
};
// A value linear in a K position's coordinates, v = n c_n + od c_d + oh c_h + ow s_w (mod 2^32),
// computed from the quotients alone: with ow = k - rows out_w, oh = rows - planes out_h and
// od = planes - n out_d, v = k s_w + rows (c_h - out_w s_w) + planes (c_d - out_h c_h) +
// n (c_n - out_d c_d): four IMADs, none of the remainders (3 more) nor the coordinates' own
// products. The wgrad loader's window origin (its pixel index in x) and packed origin (WgradPack)
// are two such values, both with ow's factor s_w (the stride), so they share the IMAD of k s_w;
// the launcher computes the other three factors (conv/geometry.py wgrad_decode_args).
struct PixLinear {
    unsigned by_rows, by_planes, by_n;
    __device__ __forceinline__ unsigned operator()(const PixQuot& q, unsigned k_term) const {
        return k_term + q.rows * by_rows + q.planes * by_planes + q.n * by_n;
    }
};
// conv_igemm_wgrad's K-position decode: the three divisions and the two linear forms, computed
// per problem by the launcher (conv/geometry.py wgrad_decode_args) and passed as kernel
// parameters, so that the K loop reads them as constant-bank operands: computed by the kernel,
// in registers, ptxas recomputed them in every K tile (uniform IMADs) instead.
struct WgradDecode {
    PixDecode divide;
    unsigned s_w;       // ow's factor in both forms
    PixLinear pixel;    // the window origin of (n, od, oh, ow): pixel ((n in_d + od s_d) in_h + oh s_h) in_w + ow s_w of x
    PixLinear packed;   // the origin's coordinates (od s_d, oh s_h, ow s_w) packed (WgradPack::pack)
    // both forms of a K position
    __device__ __forceinline__ void origin(unsigned k, unsigned& pixel_index, unsigned& packed_origin) const {
        const PixQuot q = divide(k);
        const unsigned k_term = q.k * s_w;
        pixel_index = pixel(q, k_term);
        packed_origin = packed(q, k_term);
    }
};
