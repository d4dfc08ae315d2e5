// Self-test kernels for the emulated CUDA runtime (tests/kernels/test_emulator.py).
#include "common.cuh"

#ifndef TILE
#define TILE 16
#endif

// One sum per block through warp shuffles + shared memory (block_reduce_sum).
extern "C" __global__ void block_sums(const float* __restrict__ x, float* __restrict__ out, long long n) {
    __shared__ float scratch[32];
    const long long i = global_thread_index();
    const float s = block_reduce_sum(i < n ? x[i] : 0.0f, scratch);
    if (threadIdx.x == 0) out[blockIdx.x] = s;
}

// Every shuffle flavour on one warp: out[k * 32 + lane] for k = idx, up, down, xor.
extern "C" __global__ void shuffles(const int* __restrict__ in, int* __restrict__ out, int src, int delta, int width) {
    const int lane = threadIdx.x;
    const int v = in[lane];
    out[lane] = __shfl_sync(GPUK_FULL_MASK, v, src, width);
    out[32 + lane] = __shfl_up_sync(GPUK_FULL_MASK, v, delta, width);
    out[64 + lane] = __shfl_down_sync(GPUK_FULL_MASK, v, delta, width);
    out[96 + lane] = __shfl_xor_sync(GPUK_FULL_MASK, v, delta, width);
}

// out[i] = __byte_perm(x[i], y[i], s[i]) for i < n (one element per thread).
extern "C" __global__ void byte_perms(const unsigned* __restrict__ x, const unsigned* __restrict__ y,
                                      const unsigned* __restrict__ s, unsigned* __restrict__ out, int n) {
    const long long i = global_thread_index();
    if (i < n) out[i] = __byte_perm(x[i], y[i], s[i]);
}

// C = A @ B with TILE x TILE shared-memory tiles and __syncthreads; tail guards.
extern "C" __global__ void tiled_matmul(const float* __restrict__ a, const float* __restrict__ b,
                                        float* __restrict__ c, int m, int n, int k) {
    __shared__ float ta[TILE][TILE];
    __shared__ float tb[TILE][TILE + 1];
    const int row = blockIdx.y * TILE + threadIdx.y, col = blockIdx.x * TILE + threadIdx.x;
    float acc = 0.0f;
    for (int k0 = 0; k0 < k; k0 += TILE) {
        ta[threadIdx.y][threadIdx.x] = (row < m && k0 + (int)threadIdx.x < k) ? a[(long long)row * k + k0 + threadIdx.x] : 0.0f;
        tb[threadIdx.y][threadIdx.x] = (col < n && k0 + (int)threadIdx.y < k) ? b[(long long)(k0 + threadIdx.y) * n + col] : 0.0f;
        __syncthreads();
        for (int kk = 0; kk < TILE; ++kk) acc += ta[threadIdx.y][kk] * tb[kk][threadIdx.x];
        __syncthreads();
    }
    if (row < m && col < n) c[(long long)row * n + col] = acc;
}

// Atomics on int, unsigned, float and double from every thread of the grid.
// totals: [0] float sum  ints: [0] int sum, [1] int max, [2] CAS-loop sum, [3] exch count
extern "C" __global__ void atomics(const int* __restrict__ values, float* fsum, double* dsum, int* ints,
                                   unsigned* umin, long long n) {
    const long long i = global_thread_index();
    if (i >= n) return;
    const int v = values[i];
    atomicAdd(fsum, (float)v);
    atomicAdd(dsum, (double)v * 0.5);
    atomicAdd(&ints[0], v);
    atomicMax(&ints[1], v);
    atomicMin(umin, (unsigned)v);
    int old = ints[2], assumed;
    do { assumed = old; old = atomicCAS(&ints[2], assumed, assumed + v); } while (old != assumed);
    if (atomicExch(&ints[3], 1) == 0) atomicAdd(&ints[4], 1);   // exactly one thread sees 0
}

// Votes per warp: ballot, any, all of pred[i] != 0.
extern "C" __global__ void votes(const int* __restrict__ pred, unsigned* __restrict__ ballot, int* __restrict__ any_all) {
    const int i = blockIdx.x * blockDim.x + threadIdx.x, warp = i >> 5;
    const unsigned b = __ballot_sync(GPUK_FULL_MASK, pred[i]);
    const int any = __any_sync(GPUK_FULL_MASK, pred[i]), all = __all_sync(GPUK_FULL_MASK, pred[i]);
    if ((threadIdx.x & 31) == 0) { ballot[warp] = b; any_all[2 * warp] = any; any_all[2 * warp + 1] = all; }
}

// Reverses each block's chunk through dynamic shared memory.
extern "C" __global__ void reverse_blocks(const float* __restrict__ x, float* __restrict__ y) {
    extern __shared__ float buf[];
    const int t = threadIdx.x, base = blockIdx.x * blockDim.x;
    buf[t] = x[base + t];
    __syncthreads();
    y[base + t] = buf[blockDim.x - 1 - t];
}

// half / bfloat16 round trips.
extern "C" __global__ void convert_lowp(const float* __restrict__ x, __half* __restrict__ h, __nv_bfloat16* __restrict__ b,
                                        float* __restrict__ h_back, float* __restrict__ b_back, long long n) {
    GPUK_GRID_STRIDE_LOOP(i, n) {
        h[i] = __float2half(x[i]);
        b[i] = __float2bfloat16(x[i]);
        h_back[i] = __half2float(h[i]);
        b_back[i] = __bfloat162float(b[i]);
    }
}

// Deliberate bugs the emulator must report.
extern "C" __global__ void barrier_after_exit(float* y) {
    if (threadIdx.x >= 32) return;   // the second warp leaves; the first waits forever
    __syncthreads();
    y[threadIdx.x] = 1.0f;
}
extern "C" __global__ void shuffle_missing_lane(int* y) {
    if (threadIdx.x == 5) return;
    y[threadIdx.x] = __shfl_xor_sync(GPUK_FULL_MASK, (int)threadIdx.x, 1);
}
extern "C" __global__ void write_past_end(float* y, long long n) {
    const long long i = global_thread_index();
    if (i <= n) y[i] = 1.0f;   // off by one: i == n is out of bounds
}
extern "C" __global__ void read_past_end(const float* __restrict__ x, float* __restrict__ y, long long n) {
    const long long i = global_thread_index();
    if (i < n) y[i] = x[i + 1];
}
extern "C" __global__ void write_before_start(float* y, long long offset) {
    if (threadIdx.x == 0 && blockIdx.x == 0) y[-offset] = 1.0f;
}
extern "C" __global__ void shared_overflow(float* y) {
    extern __shared__ float buf[];
    buf[1024 + threadIdx.x] = 1.0f;   // shared_mem is 4096 bytes: every thread is past the end
    y[threadIdx.x] = buf[0];
}
extern "C" __global__ void huge_locals(float* y, int n) {
    volatile float big[64 * 1024];   // 256 KB of locals: more than an emulated thread's stack
    for (int i = 0; i < n; ++i) big[i] = (float)i;
    y[threadIdx.x] = big[n - 1];
}

// One warp: the log-sum-exp of 32 values per row (lse_add then warp_lse_reduce), scaled by `scale`.
extern "C" __global__ void warp_logsumexp(const float* __restrict__ x, float* __restrict__ out, double scale) {
    float m = neg_inf_f(), s = 0.f;
    lse_add(m, s, x[blockIdx.x * 32 + threadIdx.x]);
    warp_lse_reduce(m, s);
    if (threadIdx.x == 0) out[blockIdx.x] = (float)((m + logf(s)) * scale);
}
