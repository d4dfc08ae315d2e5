// Kernels for the emulator's sanitizer and counters (tests/kernels/test_sanitizer.py):
// planted bugs it must report, and their correct twins it must pass.
#include "common.cuh"

#ifndef THREADS
#define THREADS 64
#endif

// Reverses each block's chunk through static shared memory. `sync` = 0 drops the barrier
// between the writes and the reads of other threads' elements: a read-after-write race.
extern "C" __global__ void reverse_shared(const float* __restrict__ x, float* __restrict__ y, int sync) {
    __shared__ float tile[THREADS];
    const int t = threadIdx.x, base = blockIdx.x * THREADS;
    tile[t] = x[base + t];
    if (sync) __syncthreads();
    y[base + t] = tile[THREADS - 1 - t];
}

// Each block sums its chunk with one warp's lanes exchanging through shared memory;
// `sync` = 0 drops the __syncwarp between a lane's write and its neighbour's read.
extern "C" __global__ void warp_exchange(const float* __restrict__ x, float* __restrict__ y, int sync) {
    __shared__ float lanes[32];
    const int lane = threadIdx.x;
    lanes[lane] = x[blockIdx.x * 32 + lane];
    if (sync) __syncwarp();
    y[blockIdx.x * 32 + lane] = lanes[lane] + lanes[(lane + 1) & 31];
}

// Copies 16-byte chunks into shared memory with cp.async and reads them back. `early` = 1
// reads the destination after the commit but before cp_async_wait.
extern "C" __global__ void cp_async_stage(const float4* __restrict__ x, float4* __restrict__ y, int early) {
    __shared__ float4 stage[THREADS];
    const int t = threadIdx.x, i = blockIdx.x * THREADS + t;
    cp_async_16(&stage[t], &x[i]);
    cp_async_commit();
    float4 v = make_float4(0.f, 0.f, 0.f, 0.f);
    if (early) v = stage[t];
    cp_async_wait<0>();
    __syncthreads();
    const float4 w = stage[THREADS - 1 - t];
    y[i] = make_float4(w.x + v.x, w.y + v.y, w.z + v.z, w.w + v.w);
}

// Sums neighbours from shared memory; `count` < THREADS leaves the tail of the tile unwritten.
extern "C" __global__ void neighbour_sum(const float* __restrict__ x, float* __restrict__ y, int count) {
    __shared__ float tile[THREADS + 1];
    const int t = threadIdx.x;
    if (t < count) tile[t] = x[blockIdx.x * THREADS + t];
    if (t == 0) tile[THREADS] = 0.f;
    __syncthreads();
    y[blockIdx.x * THREADS + t] = tile[t] + tile[t + 1];
}

// A warp sum in the first half of each warp: `mask` must name exactly lanes 0-15.
extern "C" __global__ void half_warp_sum(const int* __restrict__ x, int* __restrict__ y, unsigned mask) {
    const int lane = threadIdx.x & 31;
    int v = x[blockIdx.x * blockDim.x + threadIdx.x];
    if (lane < 16) {
        for (int offset = 8; offset > 0; offset >>= 1) v += __shfl_xor_sync(mask, v, offset);
        if (lane == 0) y[(blockIdx.x * blockDim.x + threadIdx.x) / 32] = v;
    }
}

// y[i] += x[i]: reads y, so y must hold values before the launch.
extern "C" __global__ void accumulate(const float* __restrict__ x, float* __restrict__ y, long long n) {
    GPUK_GRID_STRIDE_LOOP(i, n) y[i] += x[i];
}

// Histogram in shared memory with atomics, then a barrier and a plain read: no race.
extern "C" __global__ void shared_histogram(const int* __restrict__ x, int* __restrict__ counts, long long n) {
    __shared__ int bins[16];
    if (threadIdx.x < 16) bins[threadIdx.x] = 0;
    __syncthreads();
    GPUK_GRID_STRIDE_LOOP(i, n) atomicAdd(&bins[x[i] & 15], 1);
    __syncthreads();
    if (threadIdx.x < 16) atomicAdd(&counts[threadIdx.x], bins[threadIdx.x]);
}

// Copies rows: coalesced (thread i reads element i) or strided (thread i reads element
// i * stride of a transposed view): the strided copy moves a 32-byte sector per element.
extern "C" __global__ void copy_coalesced(const float* __restrict__ x, float* __restrict__ y, long long n) {
    GPUK_GRID_STRIDE_LOOP(i, n) y[i] = x[i];
}
extern "C" __global__ void copy_strided(const float* __restrict__ x, float* __restrict__ y, int rows, int cols) {
    const long long n = (long long)rows * cols;
    GPUK_GRID_STRIDE_LOOP(i, n) {
        const long long r = i % rows, c = i / rows;   // consecutive threads walk down a column of x
        y[c * rows + r] = x[r * cols + c];
    }
}

// Transposes 32x32 tiles through shared memory; `pad` = 0 makes the column reads hit one
// bank 32 times (31 extra wavefronts per request), `pad` = 1 spreads them over all banks.
extern "C" __global__ void transpose_tile(const float* __restrict__ x, float* __restrict__ y, int pad) {
    __shared__ float tile[32 * 33];
    const int stride = 32 + pad, tx = threadIdx.x, ty = threadIdx.y;
    const int base = blockIdx.x * 1024;
    tile[ty * stride + tx] = x[base + ty * 32 + tx];
    __syncthreads();
    y[base + ty * 32 + tx] = tile[tx * stride + ty];
}

// 16-byte vector copy (g++ splits the float4 into scalars; the counters rejoin them).
extern "C" __global__ void copy_float4(const float* __restrict__ x, float* __restrict__ y, long long n4) {
    GPUK_GRID_STRIDE_LOOP(i, n4) store_float4(y + 4 * i, load_float4(x + 4 * i));
}

// Two 16-byte cp.async copies per thread, one row of THREADS float4 each; `skip_pairs` = 1
// zero-fills the first copy of lanes 2, 3, 6, 7, ... (source size 0: they read nothing; the
// others still read whole 32-byte sectors, a pair of lanes each). The second
// copies are coalesced whatever the first ones did.
extern "C" __global__ void cp_async_zfill_rows(const float4* __restrict__ x, float4* __restrict__ y, int skip_pairs) {
    __shared__ float4 stage[2 * THREADS];
    const int t = threadIdx.x;
    cp_async_16_zfill(&stage[t], &x[t], !(skip_pairs && (t & 2)));
    cp_async_16(&stage[THREADS + t], &x[THREADS + t]);
    cp_async_commit();
    cp_async_wait<0>();
    __syncthreads();
    y[t] = stage[t];
    y[THREADS + t] = stage[THREADS + t];
}
