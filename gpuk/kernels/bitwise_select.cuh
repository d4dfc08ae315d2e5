// bitwise_select.cuh: v where keep, else +0.0, by masking v's bits (pooling.cu, batchnorm.cu).
// No branch: a compiler may sink a load used only under a condition into that condition's
// branch (g++ does, for the emulator; nvcc may predicate it), and then lanes whose condition
// fails skip the load: the warp moves the same sectors for fewer bytes, and in the emulator
// its requests fall apart into per-lane ones. With the mask the load is always made and
// used. +0.0 where keep is false, whatever v is (inf and NaN included).
#pragma once

__device__ __forceinline__ float keep_or_zero(float v, bool keep) {
    return __uint_as_float(__float_as_uint(v) & (0u - (unsigned)keep));
}
__device__ __forceinline__ double keep_or_zero(double v, bool keep) {
    return __longlong_as_double(__double_as_longlong(v) & (0LL - (long long)keep));
}
