// Copy kernels for the inspect report's coalescing check (tests/kernels/test_inspect.py).
#ifndef COPY_THREADS
#define COPY_THREADS 256
#endif

// dst[i] = src[i]: a warp reads and writes 128 consecutive bytes, 4 sectors per request.
extern "C" __global__ void __launch_bounds__(COPY_THREADS)
coalesced_copy(const float* __restrict__ src, float* __restrict__ dst, long long n) {
    const long long i = blockIdx.x * (long long)blockDim.x + threadIdx.x;
    if (i < n) dst[i] = src[i];
}

// Deliberately uncoalesced: src is read as the transpose of a (stride x n/stride) matrix, so
// consecutive lanes read elements n/stride apart, each in its own 32-byte sector; the writes
// stay coalesced. n must be a multiple of stride.
extern "C" __global__ void __launch_bounds__(COPY_THREADS)
strided_copy(const float* __restrict__ src, float* __restrict__ dst, long long n, long long stride) {
    const long long i = blockIdx.x * (long long)blockDim.x + threadIdx.x;
    if (i < n) dst[i] = src[(i % stride) * (n / stride) + i / stride];
}
