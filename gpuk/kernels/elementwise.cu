// elementwise.cu: the bandwidth-calibration copy and the fused bias + activation.
// Launched by gpuk/kernels/elementwise.py, which #defines ELEMENT_T and the thread
// counts below and computes the grid from the same constants.
#include "common.cuh"

#ifndef ELEMENT_T
#define ELEMENT_T float
#endif
#ifndef COPY_THREADS
#define COPY_THREADS 256
#endif
#ifndef BIAS_ACT_THREADS
#define BIAS_ACT_THREADS 256
#endif
#define ACTIVATION_LINEAR 0
#define ACTIVATION_RELU 1

typedef ELEMENT_T elem_t;
typedef ElementTraits<elem_t>::acc acc_t;

// copy_bytes: dst[0:nbytes] = src[0:nbytes]; the kernel the benchmarks calibrate
// achieved bandwidth with.
// Thread mapping: 1-D grid-stride loop, one 16-byte uint4 per thread and step.
// Alignment: when src and dst agree modulo 16, the first (16 - src % 16) % 16 bytes and
//   the last < 16 bytes are copied bytewise by the first threads and the rest as uint4;
//   otherwise everything goes bytewise (correct, slow; never the case for fresh buffers).
// Limits: none (64-bit offsets). No shared memory, no atomics.
extern "C" __global__ void __launch_bounds__(COPY_THREADS)
copy_bytes(const unsigned char* __restrict__ src, unsigned char* __restrict__ dst, long long nbytes) {
    const unsigned long long s = (unsigned long long)src, d = (unsigned long long)dst;
    if (((s ^ d) & 15ull) != 0) {
        GPUK_GRID_STRIDE_LOOP(i, nbytes) dst[i] = src[i];
        return;
    }
    const long long head_bytes = (long long)((16ull - (s & 15ull)) & 15ull);
    const long long head = head_bytes < nbytes ? head_bytes : nbytes;
    const long long nvec = (nbytes - head) >> 4;
    const uint4* __restrict__ src4 = reinterpret_cast<const uint4*>(src + head);
    uint4* __restrict__ dst4 = reinterpret_cast<uint4*>(dst + head);
    GPUK_GRID_STRIDE_LOOP(v, nvec) dst4[v] = src4[v];
    const long long t = global_thread_index();
    const long long tail_start = head + (nvec << 4);
    if (t < head) dst[t] = src[t];
    if (t < nbytes - tail_start) dst[tail_start + t] = src[tail_start + t];
}

// bias_act_fwd: y = act(x + bias[c]) with x viewed as (outer, channels, inner) and
// c = (i / inner) % channels; act is identity (ACTIVATION_LINEAR) or relu.
// Thread mapping: 1-D grid-stride loop over the n elements of x.
// Index math runs in 32 bits when n < 2^31 (64-bit division is slow on the GPU) and in
// 64 bits otherwise; the branch is uniform across the grid.
// Precision: computes in acc_t (float for half, double for double); relu keeps NaN.
// No shared memory, no atomics.
template <class I>
__device__ __forceinline__ void bias_act_body(const elem_t* __restrict__ x, const elem_t* __restrict__ bias,
                                              elem_t* __restrict__ y, I n, I channels, I inner, int activation) {
    const I stride = (I)gridDim.x * (I)blockDim.x;
    for (I i = (I)blockIdx.x * (I)blockDim.x + (I)threadIdx.x; i < n; i += stride) {
        const I c = (i / inner) % channels;
        acc_t v = to_acc(x[i]) + to_acc(bias[c]);
        if (activation == ACTIVATION_RELU) v = v < acc_t(0) ? acc_t(0) : v;
        y[i] = ElementTraits<elem_t>::from_acc(v);
    }
}

extern "C" __global__ void __launch_bounds__(BIAS_ACT_THREADS)
bias_act_fwd(const elem_t* __restrict__ x, const elem_t* __restrict__ bias, elem_t* __restrict__ y,
             long long n, long long channels, long long inner, int activation) {
    if (n < 0x7fffffffLL)
        bias_act_body<unsigned>(x, bias, y, (unsigned)n, (unsigned)channels, (unsigned)inner, activation);
    else
        bias_act_body<unsigned long long>(x, bias, y, (unsigned long long)n, (unsigned long long)channels,
                                          (unsigned long long)inner, activation);
}
