// conv_wgmma.cu: the Hopper (sm_90a) implicit-GEMM convolution forward pass on warpgroup MMA
// (wgmma), for float16, bfloat16 and float32 under precision 'tf32'. Launched by
// gpuk/kernels/conv/wgmma.py on sm_90 devices (tests force it on the emulator), which also
// decides when it applies (see Limits); every other problem runs conv_igemm.cu.
//
// GEMM view (as conv_igemm_fwd): y[m, n] = sum_k A[m, k] B[k, n], M = N * output pixels,
//   N = C_out, K = taps * C_in; A = im2col(x) gathered on the fly (padding, stride, dilation
//   and tails are zero-filled by the copies), B = w_t, the filter transposed by the launcher to
//   (C_out, K) so that both operands are K-major in shared memory (wgmma's only layout for
//   tf32; for 16-bit types it keeps one code path).
// Tiling: a block computes a 128 x 128 output tile (WG_BM x WG_BN); K advances WG_BK elements
//   per tile (WG_ATOMS = 2 atoms of 128 bytes: 128 16-bit or 64 tf32 elements) through a
//   ring of WG_STAGES = 3 stages of 64 KB in dynamic shared memory. A stage holds A and B
//   (128 rows each) as WG_ATOMS atoms of 128 rows x 128 bytes; each row of an atom is stored
//   with the 128-byte swizzle (16-byte unit u of row r at unit u ^ (r % 8), atoms 1024-byte
//   aligned): what the wgmma descriptors read, and the producer's 16-byte writes of 8 rows'
//   same unit fall in 8 different bank groups.
// Thread mapping (warp specialization, 2 warpgroups = 256 threads):
//   warpgroup 0, the producer: thread p copies 16-byte unit p % 8 of rows p / 8 + 16 j
//     (j < 8) of every atom of both operands with zero-filling cp.async; its A rows keep their
//     window origin and base offset (divisions once per block), and its K position in each
//     atom is a (tap, channel) iterator advanced by adds (no division in the loop). A 16-byte
//     unit is 8 (or 4) neighbouring channels of one pixel: channels_last with C_in a multiple
//     of 8 (16-bit) or 4 (tf32) makes them share one padding check.
//   warpgroup 1, the consumer: owns all 128 rows as two m64 halves and issues, per K tile and
//     k step (WG_BK / WG_KSTEP = 8 of them), two wgmma.mma_async m64n128k16 (k8 for tf32)
//     sharing B's descriptor: 3 descriptor adds per 2 wgmmas, and 16 wgmmas per barrier keep
//     the hot loop at 1.9 other instructions per wgmma (sm_90a, NVRTC 13). Float32
//     accumulators: 2 x 64 registers per thread (layout in hopper.cuh).
// Pipeline: one __syncthreads per K tile hands stages over. Iteration t: the producer waits
//   for its copies of tile t (cp.async.wait_group WG_STAGES - 3), all threads meet at the
//   barrier, the producer refills the stage of tile t - 2 with tile t + WG_STAGES - 2 and the
//   consumer issues tile t's wgmmas (tf32: the producer first rounds its landed units of tile t
//   with cvt.rna, as the mma.sync path does), commits them and waits until one group is left in flight
//   (tile t - 1 retired, so its stage is free for the producer after the next barrier). With
//   3 stages: one tile landing (64 KB of copies in flight) while one is multiplied.
// Epilogue: after the K loop the consumer writes its accumulators, + bias[c_out] (epilogue
//   1) then relu (2), converted to elem_t, into the idle stage ring (swizzled, conflict-free);
//   then all 256 threads copy the 128 x 128 tile out in 16-byte units (channels_last rows; one
//   vector store per unit where C_out is a multiple of 8 (16-bit) or 4 (tf32), else per element).
// Limits (checked by the launcher): channels_last; C_in a multiple of 16 bytes / element; x and
//   w_t 16-byte aligned; M, K < 2^31 (indices decode in 32 bits; offsets are 64-bit);
//   grid.y = C_out tiles <= 65535; WG_SMEM_BYTES of dynamic shared memory (opt-in above
//   48 KB). No atomics. conv_dgrad with every stride 1 runs here too, as the forward
//   convolution of dy with the flipped, transposed filter (wgmma.py); strided dgrad and wgrad
//   run conv_igemm.cu.
#include "conv_common.cuh"
#include "hopper.cuh"

#ifndef WG_STAGES
#define WG_STAGES 3
#endif
#ifndef WG_ATOMS
#define WG_ATOMS 2                             // 128-byte K atoms per stage
#endif
#define WG_THREADS 256                         // 1 producer + 1 consumer warpgroup
#define WG_BM 128                              // output rows per block: 2 m64 halves
#define WG_BN WGMMA_N                          // output channels per block
#define WG_ROW_BYTES 128                       // one K atom of a row: the 128-byte swizzle width
#define WG_ATOM_BYTES (WG_BM * WG_ROW_BYTES)   // one K atom of a 128-row operand tile
#define WG_BK (WG_ATOMS * WG_ROW_BYTES / (int)sizeof(elem_t))
#define WG_KSTEP (32 / (int)sizeof(elem_t))   // K of one wgmma: k16 (16-bit), k8 (tf32)
#define WG_VEC (16 / (int)sizeof(elem_t))     // elements per 16-byte unit
#define WG_A_BYTES (WG_ATOMS * WG_ATOM_BYTES)
#define WG_STAGE_BYTES (2 * WG_A_BYTES)       // A, then B (WG_BN == WG_BM rows)
#define WG_SMEM_BYTES (WG_STAGES * WG_STAGE_BYTES + 1024)   // + alignment slack
#define WG_ROWS_PER_PASS 16                    // 128 producer threads / 8 units per row
#define WG_CHUNKS (WG_BM / WG_ROWS_PER_PASS)   // A (and B) units per producer thread per tile
#define WG_FAR_OUTSIDE (-(1 << 29))            // a window origin that fails every bounds check
static_assert(WG_STAGES >= 3, "a tile landing, one being multiplied, one retiring");
static_assert(WG_BN == WG_BM && WG_CHUNKS == 8, "the producer maps A and B rows alike");
static_assert(sizeof(elem_t) == 2 || sizeof(elem_t) == 4, "16-bit or tf32 operands");

// A K position (tap, channel) of the producer, advanced by adds and compares only.
struct WgmmaKPos {
    int k, c, kw, kh, kd, ow, oh, od;   // k = (tap, c); the tap's offsets k*dil

    __device__ __forceinline__ void start(int k0, int c_in, int k_h, int k_w, int dil_d, int dil_h, int dil_w) {
        k = k0;
        const int tap = k / c_in;
        c = k - tap * c_in;
        kw = tap % k_w;
        kh = (tap / k_w) % k_h;
        kd = tap / (k_w * k_h);
        ow = kw * dil_w;
        oh = kh * dil_h;
        od = kd * dil_d;
    }
    __device__ __forceinline__ void advance(int step, int c_in, int k_h, int k_w, int dil_d, int dil_h, int dil_w) {
        k += step;
        c += step;
        while (c >= c_in) {   // next tap(s)
            c -= c_in;
            ow += dil_w;
            if (++kw == k_w) {
                kw = 0;
                ow = 0;
                oh += dil_h;
                if (++kh == k_h) {
                    kh = 0;
                    oh = 0;
                    od += dil_d;
                    ++kd;
                }
            }
        }
    }
};

// The producer's copy state: A rows' window origins and bases, B rows' offsets, and one K
// position per K atom of a stage.
struct WgmmaLoader {
    long long a_base[WG_CHUNKS];   // ((image * in_pix) + window origin pixel) * C_in
    int a_d[WG_CHUNKS], a_h[WG_CHUNKS], a_w[WG_CHUNKS];
    long long b_base[WG_CHUNKS];   // n * K of B row n, or -1 past C_out
    WgmmaKPos pos[WG_ATOMS];       // this thread's k in each atom of the tile
    unsigned dst;                  // byte offset of this thread's first unit in a stage

    __device__ __forceinline__ void init(int batch, int c_in, int c_out, int in_d, int in_h, int in_w, int out_d,
                                         int out_h, int out_w, int k_d, int k_h, int k_w, int s_d, int s_h, int s_w,
                                         int dil_d, int dil_h, int dil_w, int pad_d, int pad_h, int pad_w) {
        const int unit = threadIdx.x % 8, row0 = threadIdx.x / 8;
        const unsigned out_pix = (unsigned)out_d * out_h * out_w;
        const long long rows = (long long)batch * out_pix, in_pix = (long long)in_d * in_h * in_w;
        const long long depth = (long long)k_d * k_h * k_w * c_in;   // K: the length of a B row
#pragma unroll
        for (int j = 0; j < WG_CHUNKS; ++j) {
            const long long m = (long long)blockIdx.x * WG_BM + row0 + WG_ROWS_PER_PASS * j;
            if (m < rows) {
                const unsigned mu = (unsigned)m, n = mu / out_pix, p = mu - n * out_pix;
                a_w[j] = (int)(p % (unsigned)out_w) * s_w - pad_w;
                a_h[j] = (int)((p / (unsigned)out_w) % (unsigned)out_h) * s_h - pad_h;
                a_d[j] = (int)(p / ((unsigned)out_w * (unsigned)out_h)) * s_d - pad_d;
                a_base[j] = ((long long)n * in_pix + ((long long)a_d[j] * in_h + a_h[j]) * in_w + a_w[j]) * c_in;
            } else {
                a_d[j] = a_h[j] = a_w[j] = WG_FAR_OUTSIDE;
                a_base[j] = 0;
            }
            const int col = blockIdx.y * WG_BN + row0 + WG_ROWS_PER_PASS * j;
            b_base[j] = col < c_out ? (long long)col * depth : -1;
        }
#pragma unroll
        for (int a = 0; a < WG_ATOMS; ++a)
            pos[a].start(a * (WG_ROW_BYTES / (int)sizeof(elem_t)) + unit * WG_VEC, c_in, k_h, k_w, dil_d, dil_h, dil_w);
        dst = row0 * WG_ROW_BYTES + ((unit ^ (row0 % 8)) << 4);   // rows row0 + 16 j share the swizzle
    }

    // Copies the next K tile (every atom) of A and B into the stage at `stage`, then steps on.
    __device__ __forceinline__ void load(const elem_t* __restrict__ x, const elem_t* __restrict__ w_t,
                                         unsigned char* stage, int c_in, int in_d, int in_h, int in_w, int k_d,
                                         int k_h, int k_w, int dil_d, int dil_h, int dil_w, long long depth) {
#pragma unroll
        for (int a = 0; a < WG_ATOMS; ++a) {
            const WgmmaKPos& p = pos[a];
            const long long tap_offset = ((long long)(p.od * in_h + p.oh) * in_w + p.ow) * c_in + p.c;
            const bool k_ok = p.kd < k_d;
            unsigned char* a_dst = stage + a * WG_ATOM_BYTES + dst;
#pragma unroll
            for (int j = 0; j < WG_CHUNKS; ++j) {
                const bool valid = k_ok && (unsigned)(a_d[j] + p.od) < (unsigned)in_d &&
                                   (unsigned)(a_h[j] + p.oh) < (unsigned)in_h &&
                                   (unsigned)(a_w[j] + p.ow) < (unsigned)in_w;
                cp_async_16_zfill(a_dst + j * WG_ROWS_PER_PASS * WG_ROW_BYTES, valid ? x + a_base[j] + tap_offset : x,
                                  valid);
            }
#pragma unroll
            for (int j = 0; j < WG_CHUNKS; ++j) {
                const bool valid = b_base[j] >= 0 && p.k < depth;
                cp_async_16_zfill(a_dst + WG_A_BYTES + j * WG_ROWS_PER_PASS * WG_ROW_BYTES,
                                  valid ? w_t + b_base[j] + p.k : w_t, valid);
            }
        }
#pragma unroll
        for (int a = 0; a < WG_ATOMS; ++a) pos[a].advance(WG_BK, c_in, k_h, k_w, dil_d, dil_h, dil_w);
    }

    // tf32: rounds this thread's landed units of the stage at `stage` to tf32 in place (cvt.rna,
    // as the mma.sync path): the tensor core would otherwise truncate the float32 bits it reads.
    __device__ __forceinline__ void round_tf32(unsigned char* stage) const {
#pragma unroll
        for (int a = 0; a < WG_ATOMS; ++a)
#pragma unroll
            for (int j = 0; j < 2 * WG_CHUNKS; ++j) {   // A's units, then B's
                unsigned char* unit = stage + (j >= WG_CHUNKS ? WG_A_BYTES : 0) + a * WG_ATOM_BYTES + dst +
                                      (j % WG_CHUNKS) * WG_ROWS_PER_PASS * WG_ROW_BYTES;
                float4 v = *reinterpret_cast<const float4*>(unit);
                v.x = __uint_as_float(float_to_tf32(v.x));
                v.y = __uint_as_float(float_to_tf32(v.y));
                v.z = __uint_as_float(float_to_tf32(v.z));
                v.w = __uint_as_float(float_to_tf32(v.w));
                *reinterpret_cast<float4*>(unit) = v;
            }
    }
};

// ---- epilogue: accumulators -> shared memory tile -> 16-byte stores ----
// The output tile (128 rows x 128 channels of elem_t) is staged in the (then idle) stage ring,
// rows of WG_OUT_UNITS 16-byte units, unit u of row r stored at u ^ (r % 8): a consumer warp's
// fragment writes (8 rows x 4 lanes per instruction) then hit 8 different bank groups, and
// every thread of the block copies whole units out (one 16-byte store each).
#define WG_OUT_UNITS (WG_BN * (int)sizeof(elem_t) / 16)
__device__ __forceinline__ unsigned out_offset(int row, int col) {   // byte offset of element (row, col)
    const int byte = col * (int)sizeof(elem_t);
    return row * WG_OUT_UNITS * 16 + ((((byte >> 4) ^ (row % 8))) << 4) + (byte & 15);
}

// A consumer thread's accumulators of the m64 half `half` (+ bias, relu) into the staged tile
// (layout: hopper.cuh).
__device__ __forceinline__ void stage_accumulators(const float (&acc)[WGMMA_ACC], int half, unsigned char* tile,
                                                   int c_out, const elem_t* __restrict__ bias, int epilogue) {
    const int t = threadIdx.x % 128, warp = t / 32, lane = t % 32;
    const int row0 = half * 64 + 16 * warp + lane / 4;
    struct alignas(2 * sizeof(elem_t)) Pair { elem_t v[2]; };
#pragma unroll
    for (int j = 0; j < WGMMA_N / 8; ++j) {
        const int col = 8 * j + 2 * (lane % 4), channel = blockIdx.y * WG_BN + col;
        float b[2] = {0.0f, 0.0f};
        if (epilogue >= 1) {
            if (channel < c_out) b[0] = to_acc(bias[channel]);
            if (channel + 1 < c_out) b[1] = to_acc(bias[channel + 1]);
        }
#pragma unroll
        for (int i = 0; i < 2; ++i) {
            Pair p;
#pragma unroll
            for (int q = 0; q < 2; ++q) {
                float v = acc[4 * j + 2 * i + q] + b[q];
                if (epilogue == 2) v = v < 0.0f ? 0.0f : v;   // relu keeps NaN
                p.v[q] = ElementTraits<elem_t>::from_acc(v);
            }
            *reinterpret_cast<Pair*>(tile + out_offset(row0 + 8 * i, col)) = p;
        }
    }
}

// Every thread: the staged tile's units to y (channels_last rows of c_out), 16 bytes at a time
// where the channel count allows, element by element at the tails.
__device__ __forceinline__ void store_tile(const unsigned char* tile, long long rows, int c_out,
                                           elem_t* __restrict__ y) {
    const bool vector = c_out % WG_VEC == 0 && is_aligned(y, 16);
    for (int chunk = threadIdx.x; chunk < WG_BM * WG_OUT_UNITS; chunk += WG_THREADS) {
        const int row = chunk / WG_OUT_UNITS, col = (chunk % WG_OUT_UNITS) * WG_VEC;
        const long long m = (long long)blockIdx.x * WG_BM + row;
        const int channel = blockIdx.y * WG_BN + col;
        if (m >= rows || channel >= c_out) continue;
        const unsigned char* src = tile + out_offset(row, col);
        elem_t* dst = y + m * c_out + channel;
        if (vector) {
            store_uint4(dst, load_uint4(src));
        } else {
            const elem_t* values = reinterpret_cast<const elem_t*>(src);
            for (int e = 0; e < WG_VEC && channel + e < c_out; ++e) dst[e] = values[e];
        }
    }
}

// The consumer's part of one K tile: after the barrier that hands it over, the wgmmas of
// stage `stage` (two m64 halves sharing B per k step), then a wait until one group is left in
// flight (the tile before retired: its stage may be refilled after the next barrier).
__device__ __forceinline__ void consume_tile(float (&acc)[2][WGMMA_ACC], unsigned long long desc_a0,
                                             unsigned long long desc_b0, int stage) {
    __syncthreads();
    const unsigned long long offset = (unsigned long long)stage * (WG_STAGE_BYTES >> 4);
    const unsigned long long half_a = (64 * WG_ROW_BYTES) >> 4;
    wgmma_fence_operands(acc[0]);
    wgmma_fence_operands(acc[1]);
    wgmma_fence();
#pragma unroll
    for (int ks = 0; ks < WG_BK / WG_KSTEP; ++ks) {   // k step ks: atom ks / 4, 32 bytes each
        const unsigned long long k_off = (ks / 4) * (WG_ATOM_BYTES >> 4) + (ks % 4) * 2;
        const unsigned long long b = desc_b0 + offset + k_off;
        wgmma_m64n128<elem_t>(acc[0], desc_a0 + offset + k_off, b);
        wgmma_m64n128<elem_t>(acc[1], desc_a0 + half_a + offset + k_off, b);
    }
    wgmma_commit();
    wgmma_wait<1>();
    wgmma_fence_operands(acc[0]);
    wgmma_fence_operands(acc[1]);
}

// conv_wgmma_fwd: y = conv(x, w) (+ bias, relu), channels_last. w_t is the filter as (C_out, K).
// Grid (M tiles, C_out tiles), WG_THREADS threads, WG_SMEM_BYTES of dynamic shared memory.
extern "C" __global__ void __launch_bounds__(WG_THREADS, 1)
conv_wgmma_fwd(const elem_t* __restrict__ x, const elem_t* __restrict__ w_t, const elem_t* __restrict__ bias,
               elem_t* __restrict__ y, int batch, int c_in, int c_out, int in_d, int in_h, int in_w, int out_d,
               int out_h, int out_w, int k_d, int k_h, int k_w, int s_d, int s_h, int s_w, int dil_d, int dil_h,
               int dil_w, int pad_d, int pad_h, int pad_w, int epilogue) {
    extern __shared__ __align__(1024) unsigned char wgmma_smem[];
    // Stages start on a 1024-byte boundary of the shared window: the swizzle pattern's repeat.
    const unsigned raw = smem_address(wgmma_smem);
    unsigned char* smem = wgmma_smem + ((1024u - (raw & 1023u)) & 1023u);
    const long long rows = (long long)batch * out_d * out_h * out_w;
    const long long depth = (long long)k_d * k_h * k_w * c_in;
    const int tiles = (int)((depth + WG_BK - 1) / WG_BK);
    float acc[2][WGMMA_ACC];   // the consumer's two m64 halves

    if (threadIdx.x < 128) {   // ---- producer warpgroup ----
        WgmmaLoader loader;
        loader.init(batch, c_in, c_out, in_d, in_h, in_w, out_d, out_h, out_w, k_d, k_h, k_w, s_d, s_h, s_w, dil_d,
                    dil_h, dil_w, pad_d, pad_h, pad_w);
#pragma unroll
        for (int s = 0; s < WG_STAGES - 2; ++s) {
            if (s < tiles)
                loader.load(x, w_t, smem + s * WG_STAGE_BYTES, c_in, in_d, in_h, in_w, k_d, k_h, k_w, dil_d, dil_h,
                            dil_w, depth);
            cp_async_commit();   // empty groups keep the count uniform for the wait below
        }
        int write_stage = WG_STAGES - 2, read_stage = 0;
        for (int t = 0; t < tiles; ++t) {
            cp_async_wait<WG_STAGES - 3>();   // tile t has landed (this thread's copies) ...
            if constexpr (sizeof(elem_t) == 4) loader.round_tf32(smem + read_stage * WG_STAGE_BYTES);
            read_stage = read_stage == WG_STAGES - 1 ? 0 : read_stage + 1;
            __syncthreads();                  // ... everyone's; the consumer retired tile t - 2
            if (t + WG_STAGES - 2 < tiles)
                loader.load(x, w_t, smem + write_stage * WG_STAGE_BYTES, c_in, in_d, in_h, in_w, k_d, k_h, k_w,
                            dil_d, dil_h, dil_w, depth);
            cp_async_commit();
            write_stage = write_stage == WG_STAGES - 1 ? 0 : write_stage + 1;
        }
        cp_async_wait_all();
    } else {   // ---- consumer warpgroup ----
#pragma unroll
        for (int e = 0; e < WGMMA_ACC; ++e) acc[0][e] = acc[1][e] = 0.0f;
        // Descriptors of stage 0, k step 0 (from the shared window address, which the compiler
        // knows to be uniform: they live in uniform registers); a stage is WG_STAGE_BYTES
        // further, a k step 32 bytes, the second m64 half of A 64 rows.
        const unsigned long long desc_a0 = wgmma_desc_k_sw128(smem_address(smem), 8 * WG_ROW_BYTES);
        // (B as an offset of A's descriptor: one loop-invariant base, not one per operand.)
        const unsigned long long desc_b0 = desc_a0 + (WG_A_BYTES >> 4);
        // Tile t reads stage t % WG_STAGES. Whole turns of the ring run unrolled without tail
        // checks (every descriptor is then a base plus an immediate: one uniform add each); the
        // last tiles < WG_STAGES run one at a time.
        int t = 0;
        unsigned long long desc = desc_a0;
        for (; t + WG_STAGES <= tiles; t += WG_STAGES) {
            // An opaque copy per turn: ptxas then moves one base into uniform registers per turn
            // instead of keeping every stage-0 descriptor in ordinary registers (12 R2UR a turn).
            asm volatile("" : "+l"(desc));
#pragma unroll
            for (int s = 0; s < WG_STAGES; ++s) consume_tile(acc, desc, desc + (WG_A_BYTES >> 4), s);
        }
        for (int s = 0; t < tiles; ++t, ++s) consume_tile(acc, desc_a0, desc_b0, s);
        wgmma_wait<0>();
        wgmma_fence_operands(acc[0]);
        wgmma_fence_operands(acc[1]);
    }
    __syncthreads();   // every copy landed and every wgmma retired: the stage ring is free
    if (threadIdx.x >= 128) {
        stage_accumulators(acc[0], 0, smem, c_out, bias, epilogue);
        stage_accumulators(acc[1], 1, smem, c_out, bias, epilogue);
    }
    __syncthreads();
    store_tile(smem, rows, c_out, y);
}
