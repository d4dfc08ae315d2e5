// conv_common.cuh: geometry shared by the convolution kernels (conv_igemm.cu,
// conv_depthwise.cu, conv_local.cu). Every problem is lifted to 3 spatial dims
// (D, H, W; missing dims have size 1, stride 1, no padding), so one kernel serves
// conv1d, conv2d and conv3d.
//
// Layouts: both data formats run through the same index math. A pixel index `pix`
// flattens (d, h, w); channels_last stores (n, pix, c), channels_first (n, c, pix).
#pragma once
#include "common.cuh"

#ifndef ELEMENT_T
#define ELEMENT_T float
#endif
#ifndef ACC_T
#define ACC_T float
#endif
typedef ELEMENT_T elem_t;
typedef ACC_T acc_t;

// Offset of element (n, c, pix) of a (N, pixels, channels) tensor in either layout.
__device__ __forceinline__ long long tensor_offset(long long n, long long c, long long pix, long long channels,
                                                   long long pixels, int channels_last) {
    return channels_last ? (n * pixels + pix) * channels + c : (n * channels + c) * pixels + pix;
}

// Deterministic second pass of a split reduction: out[i] = sum over s (in order) of
// partial[s * count + i]. 1-D grid-stride loop, one output per thread and step.
__device__ __forceinline__ void reduce_splits_body(const acc_t* __restrict__ partial, elem_t* __restrict__ out,
                                                   long long count, int splits) {
    GPUK_GRID_STRIDE_LOOP(i, count) {
        acc_t sum = acc_t(0);
        for (int s = 0; s < splits; ++s) sum += partial[(long long)s * count + i];
        out[i] = ElementTraits<elem_t>::from_acc(sum);
    }
}
