// conv_wgmma.cu: the Hopper (sm_90a) implicit-GEMM convolution on warpgroup MMA (wgmma): the
// forward pass, dgrad and wgrad for float16, bfloat16 and float32 under precision 'tf32'.
// Launched by gpuk/kernels/conv/wgmma.py on sm_90 devices (tests force it on the emulator),
// which also decides when it applies (see Limits); every other problem runs conv_igemm.cu.
//
// GEMM views (as conv_igemm.cu; taps = KD*KH*KW; the geometry helpers are conv_common.cuh's):
//   conv_wgmma_fwd:   y[m, n] = sum_k A[m, k] B[k, n], M = N * output pixels, N = C_out,
//       K = taps * C_in; A = im2col(x) gathered on the fly (padding, stride, dilation and tails
//       are zero-filled by the copies), B = w_t, the filter transposed by the launcher to (C_out, K).
//   conv_wgmma_dgrad: one stride phase per grid z, as conv_igemm_dgrad (DgradPhase): input pixels
//       i = r + s*q of phase r get A[(n, q), (tap, co)] = dy[n, q + (r + pad - tap*dil)/s, co]
//       over the phase's taps only (no work on the stride holes), M = N * phase pixels, N = C_in,
//       K = phase taps * C_out; B = w_t = the filter as (C_in, taps, C_out) (the flip is in the
//       taps' offsets). Stride 1 is the single phase r = 0 with every tap.
//   conv_wgmma_wgrad: dw[m, n] = sum_k A[m, k] B[k, n], M = taps * C_in (dw's rows (tap, ci)),
//       N = C_out, K = N * output pixels; A[(tap, ci), (n, o)] = x[n, o*s + tap*dil - pad, ci],
//       B[(n, o), co] = dy[n, o, co]. (M is taps * C_in rather than C_out so that the epilogue
//       writes dw's rows of C_out contiguous channels exactly as fwd writes y's.) Deterministic
//       split-K over grid z: split z covers whole K tiles [z * k_per_split, ...); one split writes
//       dw, more write float32 partials that conv_wgmma_reduce_splits adds in split order (the
//       body of conv_igemm.cu's conv_reduce_splits, reduce_splits_body in conv_common.cuh).
// Shared-memory operands: A and B of every kernel are stored K-major (rows of 128 rows x K), the
//   layout wgmma reads for every type (tf32 has no other). fwd and dgrad gather K-major already
//   (K runs along channels); wgrad's operands are MN-major in global memory (channels contiguous,
//   K = pixels strided), so its producer transposes in registers: it loads VEC x VEC blocks (VEC
//   16-byte units of VEC channels at VEC consecutive k), transposes them (16-bit: one byte
//   permute per output word; tf32: register renaming, with the float_to_tf32 rounding applied there)
//   and stores VEC units along k. wgmma's MN-major descriptor mode (16-bit only) would save the
//   permutes but needs a second layout in the descriptors and the emulator for 16-bit types and
//   this transpose anyway for tf32; one K-major layout keeps one consumer for all three kernels.
// Tiling: a block computes a WG_BM x WG_BN output tile, 128 x 128 or 128 x 64 (the build's WG_BN,
//   picked per problem by conv/wgmma.py's table:
//       tile      wgmma      stage   ring (3 stages)  used for
//       128x128   m64n128    64 KB   193 KB           N > 64 where 128-wide tiles fill the SMs
//       128x64    m64n64     48 KB   145 KB           N <= 64 (C_out 64 layers: no wgmma column on
//                                                     padding), or fwd / dgrad grids of 128x128
//                                                     blocks smaller than one wave of 132 SMs
//   N is C_out (fwd, wgrad) or C_in (dgrad); wgrad's split-K fills the SMs itself, so there only
//   the N rule applies). K advances WG_BK elements per tile (WG_ATOMS = 2 atoms of 128 bytes:
//   128 16-bit or 64 tf32 elements) through a ring of WG_STAGES = 3 stages in dynamic shared
//   memory. A stage holds A (128 rows) and B (WG_BN rows) as WG_ATOMS atoms of rows x 128 bytes
//   each (A's atoms, then B's); each row of an atom is stored
//   with the 128-byte swizzle (16-byte unit u of row r at unit u ^ (r % 8), atoms 1024-byte
//   aligned): what the wgmma descriptors read, and the producer's 16-byte writes of 8 rows'
//   same unit (fwd, dgrad) or of one row's 8 units (wgrad) fall in 8 different bank groups.
// Thread mapping (warp specialization, 2 warpgroups = 256 threads):
//   warpgroup 0, the producer. fwd/dgrad (GatherLoader): thread p copies 16-byte unit p % 8 of
//     rows p / 8 + 16 j (j < 8 for A, j < WG_BN / 16 for B) of every atom of both operands with
//     zero-filling cp.async; its A
//     rows keep their window origin and base offset (divisions once per block), and its K
//     position in each atom is a TapIter advanced by adds (no division in the loop). A 16-byte
//     unit is 8 (or 4) neighbouring channels of one pixel: channels_last with the gathered
//     channel count a multiple of 8 (16-bit) or 4 (tf32) makes them share one padding check.
//     wgrad (WgradLoader): thread p owns unit column p % 8 (VEC consecutive k) of the row groups
//     p / 8 + 16 j (VEC rows each, j < 8 / VEC) of every atom of both operands (B: the groups
//     inside its WG_BN rows; with 64, half of them): per K tile it
//     loads 16-byte units with plain loads into registers (the next tile is fetched right after
//     the previous one is stored, so its loads are in flight across the barrier), transposes
//     and stores them. Its k's (image, output pixel) are PixelCursors: one division per block,
//     then adds with carries.
//   warpgroup 1, the consumer: owns all 128 rows as two m64 halves and issues, per K tile,
//     WG_BK / WG_KSTEP = 8 k steps of two wgmma.mma_async m64nWG_BNk16 (k8 for tf32), one per
//     half, sharing B's descriptor, in pairs of k steps (k, k + 1): half 0 at k, at k + 1, then
//     half 1 at k, at k + 1 (each half still adds its k's in order). ptxas keeps k and k + 1
//     in two uniform register quads of (A, B) descriptors, so every other wgmma changes only
//     A's: 3 descriptor adds per 2 wgmmas, and 16 wgmmas per barrier keep the hot loop at 138
//     instructions for 48 wgmmas, 1.88 other per wgmma, on both tiles (sm_90a, NVRTC 13).
//     (Issued k step by k step, half 0 then half 1, m64n64 made ptxas copy B's descriptor into
//     a second quad at every k step: 2 UMOVs more per 2 wgmmas, 2.81 other per wgmma on 128x64.)
//     Float32 accumulators: 2 x WG_BN / 2 registers per thread (layout in hopper.cuh). Same
//     code in every kernel.
// Pipeline: one __syncthreads per K tile hands stages over. Iteration t: the producer waits
//   for its copies of tile t (cp.async.wait_group WG_STAGES - 3; wgrad's stores are synchronous)
//   and fences them (fence.proxy.async: cp.async and st.shared write through the generic proxy,
//   wgmma reads through the async proxy), all threads meet at the barrier, the producer refills the stage of tile t - 2 with tile
//   t + WG_STAGES - 2 and the consumer issues tile t's wgmmas (tf32 fwd/dgrad: the producer first
//   rounds its landed units of tile t with float_to_tf32, as the mma.sync path does), commits them and
//   waits until one group is left in flight (tile t - 1 retired, so its stage is free for the
//   producer after the next barrier). With 3 stages: one tile landing while one is multiplied.
// Epilogue: after the K loop the consumer writes its accumulators, + bias[c_out] (fwd epilogue
//   1) then relu (2), converted to the output type (elem_t; float32 for wgrad's partials), into
//   the idle stage ring (swizzled, conflict-free); then all 256 threads copy the 128 x WG_BN tile
//   out in 16-byte units (rows of the output matrix; dgrad maps its phase rows to dx rows; one
//   vector store per unit where the channel count is a multiple of 16 bytes, else per element).
// Limits (checked by the launcher): channels_last; the channels read in 16-byte units (fwd C_in,
//   dgrad C_out, wgrad C_in and C_out) multiples of 16 bytes / element; operands 16-byte aligned;
//   M, K and one image's pixels < 2^31 (indices decode in 32 bits; offsets are 64-bit);
//   grid.y = N tiles <= 65535, grid.z = stride phases (dgrad) or splits (wgrad) <= 65535;
//   WG_SMEM_BYTES of dynamic shared memory (opt-in above 48 KB). No atomics.
#include "conv_common.cuh"
#include "hopper.cuh"

#ifndef WG_STAGES
#define WG_STAGES 3
#endif
#ifndef WG_ATOMS
#define WG_ATOMS 2                             // 128-byte K atoms per stage
#endif
#ifndef REDUCE_THREADS
#define REDUCE_THREADS 256
#endif
#define WG_THREADS 256                         // 1 producer + 1 consumer warpgroup
#ifndef WG_BN
#define WG_BN 128                              // output channels per block: the tile table (Tiling)
#endif
#define WG_BM 128                              // output rows per block: 2 m64 halves
#define WG_ACC (WG_BN / 2)                     // float accumulators per consumer thread and m64 half
#define WG_ROW_BYTES 128                       // one K atom of a row: the 128-byte swizzle width
#define WG_ATOM_BYTES (WG_BM * WG_ROW_BYTES)   // one K atom of a 128-row operand tile
#define WG_ATOM_K (WG_ROW_BYTES / (int)sizeof(elem_t))   // K elements per atom
#define WG_BK (WG_ATOMS * WG_ATOM_K)
#define WG_KSTEP (32 / (int)sizeof(elem_t))   // K of one wgmma: k16 (16-bit), k8 (tf32)
#define WG_VEC (16 / (int)sizeof(elem_t))     // elements per 16-byte unit
#define WG_B_ATOM_BYTES (WG_BN * WG_ROW_BYTES)   // one K atom of the WG_BN-row B tile
#define WG_A_BYTES (WG_ATOMS * WG_ATOM_BYTES)
#define WG_B_BYTES (WG_ATOMS * WG_B_ATOM_BYTES)
#define WG_STAGE_BYTES (WG_A_BYTES + WG_B_BYTES)   // A, then B
#define WG_SMEM_BYTES (WG_STAGES * WG_STAGE_BYTES + 1024)   // + alignment slack
#define WG_ROWS_PER_PASS 16                    // 128 producer threads / 8 units per row
#define WG_CHUNKS (WG_BM / WG_ROWS_PER_PASS)   // A units per producer thread per atom
#define WG_B_CHUNKS (WG_BN / WG_ROWS_PER_PASS) // B units per producer thread per atom
#define WG_GROUPS (8 / WG_VEC)                 // wgrad: VEC-row groups of A per producer thread
static_assert(WG_STAGES >= 3, "a tile landing, one being multiplied, one retiring");
static_assert(WG_BK / WG_KSTEP % 2 == 0, "the consumer issues k steps in pairs");
static_assert((WG_BN == 128 || WG_BN == 64) && WG_CHUNKS == 8, "m64n128 or m64n64; A's rows as 8 passes of 16");
static_assert(sizeof(elem_t) == 2 || sizeof(elem_t) == 4, "16-bit or tf32 operands");
static_assert(gpuk_same_type<acc_t, float>::value, "float32 accumulators (and wgrad partials)");

// Byte offset of 16-byte unit `unit` of row `row` in an atom (the 128-byte swizzle).
__device__ __forceinline__ unsigned atom_offset(int row, int unit) {
    return (unsigned)row * WG_ROW_BYTES + (((unsigned)unit ^ ((unsigned)row % 8u)) << 4);
}

// ---- fwd and dgrad: a gathered A and a K-major B, copied with cp.async ----
// A[m, k] = src[n, origin(m) + offset(tap), c] over a (N, sd, sh, sw, channels) source, row
// m = (n, pixel p of the grid gd x gh x gw) with window origin p * mul + add per dim, k = (tap of
// `taps`, c); B[n, k] = w_t[n * b_ld + tap * channels + c] (tap: its index in the whole filter).
struct GatherGemm {
    int sd, sh, sw, channels;                                   // the gathered tensor (x or dy)
    long long src_pix;
    int gd, gh, gw, mul_d, mul_h, mul_w, add_d, add_h, add_w;   // the rows' pixel grid
    TapSeq taps;
    long long rows, depth;                                      // M, K
    int cols;                                                   // N
    long long b_ld;                                             // elements per row of w_t
};

// The producer's copy state: A rows' window origins and bases, B rows' offsets, and one K
// position per K atom of a stage.
struct GatherLoader {
    GatherGemm p;
    const elem_t* src;
    const elem_t* w_t;
    long long a_base[WG_CHUNKS];   // ((image * src_pix) + window origin pixel) * channels
    int a_d[WG_CHUNKS], a_h[WG_CHUNKS], a_w[WG_CHUNKS];
    long long b_base[WG_B_CHUNKS]; // n * b_ld of B row n, or -1 past N
    TapIter pos[WG_ATOMS];         // this thread's k in each atom of the tile
    unsigned dst;                  // byte offset of this thread's first unit in an atom

    __device__ __forceinline__ void init(const GatherGemm& gemm, const elem_t* a_src, const elem_t* b_src) {
        p = gemm;
        src = a_src;
        w_t = b_src;
        const int unit = threadIdx.x % 8, row0 = threadIdx.x / 8;
        const unsigned pixels = (unsigned)p.gd * p.gh * p.gw;
#pragma unroll
        for (int j = 0; j < WG_CHUNKS; ++j) {
            const long long m = (long long)blockIdx.x * WG_BM + row0 + WG_ROWS_PER_PASS * j;
            if (m < p.rows) {
                const unsigned mu = (unsigned)m, n = mu / pixels, q = mu - n * pixels;
                a_w[j] = (int)(q % (unsigned)p.gw) * p.mul_w + p.add_w;
                a_h[j] = (int)((q / (unsigned)p.gw) % (unsigned)p.gh) * p.mul_h + p.add_h;
                a_d[j] = (int)(q / ((unsigned)p.gw * (unsigned)p.gh)) * p.mul_d + p.add_d;
                a_base[j] = ((long long)n * p.src_pix + ((long long)a_d[j] * p.sh + a_h[j]) * p.sw + a_w[j]) *
                            p.channels;
            } else {
                a_d[j] = a_h[j] = a_w[j] = FAR_OUTSIDE;
                a_base[j] = 0;
            }
        }
#pragma unroll
        for (int j = 0; j < WG_B_CHUNKS; ++j) {
            const int col = blockIdx.y * WG_BN + row0 + WG_ROWS_PER_PASS * j;
            b_base[j] = col < p.cols ? (long long)col * p.b_ld : -1;
        }
#pragma unroll
        for (int a = 0; a < WG_ATOMS; ++a) pos[a].start(p.taps, a * WG_ATOM_K + unit * WG_VEC, p.channels);
        dst = atom_offset(row0, unit);   // rows row0 + 16 j share the swizzle
    }

    // Copies the next K tile (every atom) of A and B into the stage at `stage`, then steps on.
    __device__ __forceinline__ void load(unsigned char* stage) {
#pragma unroll
        for (int a = 0; a < WG_ATOMS; ++a) {
            const TapIter& t = pos[a];
            const long long tap_offset = ((long long)(t.od * p.sh + t.oh) * p.sw + t.ow) * p.channels + t.c;
            const long long b_offset = (long long)t.tap(p.taps) * p.channels + t.c;
            const bool k_ok = t.in_filter(p.taps);
            unsigned char* a_dst = stage + a * WG_ATOM_BYTES + dst;
            unsigned char* b_dst = stage + WG_A_BYTES + a * WG_B_ATOM_BYTES + dst;
#pragma unroll
            for (int j = 0; j < WG_CHUNKS; ++j) {
                const bool valid = k_ok && (unsigned)(a_d[j] + t.od) < (unsigned)p.sd &&
                                   (unsigned)(a_h[j] + t.oh) < (unsigned)p.sh &&
                                   (unsigned)(a_w[j] + t.ow) < (unsigned)p.sw;
                cp_async_16_zfill(a_dst + j * WG_ROWS_PER_PASS * WG_ROW_BYTES,
                                  valid ? src + a_base[j] + tap_offset : src, valid);
            }
#pragma unroll
            for (int j = 0; j < WG_B_CHUNKS; ++j) {
                const bool valid = k_ok && b_base[j] >= 0;
                cp_async_16_zfill(b_dst + j * WG_ROWS_PER_PASS * WG_ROW_BYTES,
                                  valid ? w_t + b_base[j] + b_offset : w_t, valid);
            }
        }
#pragma unroll
        for (int a = 0; a < WG_ATOMS; ++a) pos[a].advance(p.taps, WG_BK, p.channels);
    }

    // After this thread's copies of the stage at `stage` landed. tf32: rounds its units to tf32
    // in place (float_to_tf32: cvt.rn, as the mma.sync path): the tensor core would otherwise truncate the
    // float32 bits it reads.
    __device__ __forceinline__ void landed(unsigned char* stage) const {
        if constexpr (sizeof(elem_t) == 4) {
#pragma unroll
            for (int a = 0; a < WG_ATOMS; ++a)
#pragma unroll
                for (int j = 0; j < WG_CHUNKS + WG_B_CHUNKS; ++j) {   // A's units, then B's
                    const int row_bytes = (j % WG_CHUNKS) * WG_ROWS_PER_PASS * WG_ROW_BYTES;
                    unsigned char* unit = stage + dst + row_bytes +
                                          (j >= WG_CHUNKS ? WG_A_BYTES + a * WG_B_ATOM_BYTES : a * WG_ATOM_BYTES);
                    float4 v = *reinterpret_cast<const float4*>(unit);
                    v.x = __uint_as_float(float_to_tf32(v.x));
                    v.y = __uint_as_float(float_to_tf32(v.y));
                    v.z = __uint_as_float(float_to_tf32(v.z));
                    v.w = __uint_as_float(float_to_tf32(v.w));
                    *reinterpret_cast<float4*>(unit) = v;
                }
        }
    }
};

// ---- wgrad: MN-major operands, loaded into registers and transposed ----
// An (image, output pixel) position along wgrad's K: one division per block (start), then
// steps of one pixel (next) or of a K tile (add: a mixed-radix add, one carry compare per
// digit, however many output rows a tile spans).
struct PixelCursor {
    int n, od, oh, ow;
    __device__ __forceinline__ void start(const ConvGeom& g, long long k) {
        const unsigned long long ku = (unsigned long long)k, pix = (unsigned long long)g.out_pix;
        n = (int)(ku / pix);
        const unsigned p = (unsigned)(ku - (unsigned long long)n * pix);
        ow = (int)(p % (unsigned)g.out_w);
        oh = (int)((p / (unsigned)g.out_w) % (unsigned)g.out_h);
        od = (int)(p / ((unsigned)g.out_w * (unsigned)g.out_h));
    }
    __device__ __forceinline__ void next(const ConvGeom& g) {
        if (++ow == g.out_w) {
            ow = 0;
            if (++oh == g.out_h) {
                oh = 0;
                if (++od == g.out_d) {
                    od = 0;
                    ++n;
                }
            }
        }
    }
    __device__ __forceinline__ void add(const PixelCursor& step, const ConvGeom& g) {   // step's digits < radix
        ow += step.ow;
        const int cw = ow >= g.out_w;
        ow -= cw ? g.out_w : 0;
        oh += step.oh + cw;
        const int ch = oh >= g.out_h;
        oh -= ch ? g.out_h : 0;
        od += step.od + ch;
        const int cd = od >= g.out_d;
        od -= cd ? g.out_d : 0;
        n += step.n + cd;
    }
};

// Word i of a 16-byte unit (a constant index after unrolling).
__device__ __forceinline__ unsigned unit_word(const uint4& v, int i) {
    return i == 0 ? v.x : i == 1 ? v.y : i == 2 ? v.z : v.w;
}

// Row r of the transpose of a VEC x VEC block given as VEC units (unit e: VEC channels at k e):
// the VEC k's of channel r, as one 16-byte unit (tf32: rounded with float_to_tf32).
__device__ __forceinline__ uint4 transposed_unit(const uint4 (&in)[WG_VEC], int r) {
    unsigned w[4];
    if constexpr (sizeof(elem_t) == 2) {   // channel r: half r % 2 of word r / 2 of each unit
#pragma unroll
        for (int i = 0; i < 4; ++i) {
            const unsigned lo = unit_word(in[2 * i], r / 2), hi = unit_word(in[2 * i + 1], r / 2);
            w[i] = r % 2 == 0 ? (lo & 0xffffu) | (hi << 16) : (lo >> 16) | (hi & 0xffff0000u);
        }
    } else {
#pragma unroll
        for (int i = 0; i < 4; ++i) w[i] = float_to_tf32(__uint_as_float(unit_word(in[i], r)));
    }
    return make_uint4(w[0], w[1], w[2], w[3]);
}

struct WgradLoader {
    ConvGeom g;
    const elem_t* x;
    const elem_t* dy;
    int a_c[WG_GROUPS], a_d[WG_GROUPS], a_h[WG_GROUPS], a_w[WG_GROUPS];   // A row groups: channel, tap offsets
    int b_c[WG_GROUPS];               // B row groups: first output channel, or -1 past C_out or past WG_BN
    PixelCursor pos[WG_ATOMS];        // k of this thread's first unit in each atom of the next tile
    PixelCursor step;                 // WG_BK as mixed-radix digits
    long long k_tile;                 // k of the next tile's first element
    int left;                         // K elements from k_tile to the split's end
    uint4 a_buf[WG_ATOMS][WG_GROUPS][WG_VEC], b_buf[WG_ATOMS][WG_GROUPS][WG_VEC];   // the fetched tile

    // Whether this thread's row group j lies in B's WG_BN rows (every group does with 128; with
    // 64, the first half of the groups).
    static __device__ __forceinline__ bool in_b(int j) {
        return WG_BN == WG_BM || (int)(threadIdx.x / 8 + WG_ROWS_PER_PASS * j) * WG_VEC < WG_BN;
    }

    __device__ __forceinline__ void init(const ConvGeom& geom, const elem_t* x_src, const elem_t* dy_src,
                                         long long k_begin, long long k_end) {
        g = geom;
        x = x_src;
        dy = dy_src;
        const int kg = threadIdx.x % 8;
        const long long rows = (long long)g.taps * g.c_in;
#pragma unroll
        for (int j = 0; j < WG_GROUPS; ++j) {
            const int group = threadIdx.x / 8 + WG_ROWS_PER_PASS * j;
            const long long m = (long long)blockIdx.x * WG_BM + group * WG_VEC;   // C_in % VEC == 0: one tap
            if (m < rows) {
                const int tap = (int)(m / g.c_in);
                a_c[j] = (int)(m - (long long)tap * g.c_in);
                a_w[j] = (tap % g.k_w) * g.dil_w - g.pad_w;
                a_h[j] = ((tap / g.k_w) % g.k_h) * g.dil_h - g.pad_h;
                a_d[j] = (tap / (g.k_w * g.k_h)) * g.dil_d - g.pad_d;
            } else {
                a_c[j] = 0;
                a_d[j] = a_h[j] = a_w[j] = FAR_OUTSIDE;
            }
            const int co = blockIdx.y * WG_BN + group * WG_VEC;
            b_c[j] = co < g.c_out && in_b(j) ? co : -1;
        }
#pragma unroll
        for (int a = 0; a < WG_ATOMS; ++a) pos[a].start(g, k_begin + a * WG_ATOM_K + kg * WG_VEC);
        step.start(g, WG_BK);
        k_tile = k_begin;
        left = (int)(k_end - k_begin);
        if (left > 0) fetch();
    }

    // Loads the tile at k_tile into the registers (zeros outside x, past the split and past
    // M / N), then steps every position on by WG_BK.
    __device__ __forceinline__ void fetch() {
        const int kg = threadIdx.x % 8;
        const uint4 zero = make_uint4(0u, 0u, 0u, 0u);
#pragma unroll
        for (int a = 0; a < WG_ATOMS; ++a) {
            PixelCursor c = pos[a];
#pragma unroll
            for (int e = 0; e < WG_VEC; ++e) {
                const int kl = a * WG_ATOM_K + kg * WG_VEC + e;   // k - k_tile
                const bool k_ok = kl < left;
                const long long dy_row = (k_tile + kl) * g.c_out;
#pragma unroll
                for (int j = 0; j < WG_GROUPS; ++j) {
                    const int id = c.od * g.s_d + a_d[j], ih = c.oh * g.s_h + a_h[j], iw = c.ow * g.s_w + a_w[j];
                    const bool a_ok = k_ok && (unsigned)id < (unsigned)g.in_d && (unsigned)ih < (unsigned)g.in_h &&
                                      (unsigned)iw < (unsigned)g.in_w;
                    const long long a_off =
                        ((long long)c.n * g.in_pix + (id * g.in_h + ih) * g.in_w + iw) * g.c_in + a_c[j];
                    a_buf[a][j][e] = a_ok ? load_uint4(x + a_off) : zero;
                    const bool b_ok = k_ok && b_c[j] >= 0;
                    b_buf[a][j][e] = b_ok ? load_uint4(dy + dy_row + b_c[j]) : zero;
                }
                c.next(g);
            }
            pos[a].add(step, g);
        }
        k_tile += WG_BK;
        left -= WG_BK;
    }

    // Stores the fetched tile, transposed to K-major, into the stage at `stage`, then fetches the
    // next one (if the split has one), whose loads stay in flight across the next barrier.
    __device__ __forceinline__ void load(unsigned char* stage) {
        const int kg = threadIdx.x % 8;
#pragma unroll
        for (int a = 0; a < WG_ATOMS; ++a)
#pragma unroll
            for (int j = 0; j < WG_GROUPS; ++j)
#pragma unroll
                for (int r = 0; r < WG_VEC; ++r) {
                    const int row = (threadIdx.x / 8 + WG_ROWS_PER_PASS * j) * WG_VEC + r;
                    store_uint4(stage + a * WG_ATOM_BYTES + atom_offset(row, kg), transposed_unit(a_buf[a][j], r));
                    if (in_b(j))
                        store_uint4(stage + WG_A_BYTES + a * WG_B_ATOM_BYTES + atom_offset(row, kg),
                                    transposed_unit(b_buf[a][j], r));
                }
        if (left > 0) fetch();
    }
    __device__ __forceinline__ void landed(unsigned char*) const {}   // plain stores: nothing in flight
};

// ---- the pipeline ----
// The producer warpgroup: fills the stage ring one K tile per barrier (see Pipeline above).
template <class Loader>
__device__ __forceinline__ void produce(Loader& loader, unsigned char* smem, int tiles) {
#pragma unroll
    for (int s = 0; s < WG_STAGES - 2; ++s) {
        if (s < tiles) loader.load(smem + s * WG_STAGE_BYTES);
        cp_async_commit();   // empty groups keep the count uniform for the wait below
    }
    int write_stage = WG_STAGES - 2, read_stage = 0;
    for (int t = 0; t < tiles; ++t) {
        cp_async_wait<WG_STAGES - 3>();   // tile t has landed (this thread's copies) ...
        loader.landed(smem + read_stage * WG_STAGE_BYTES);
        fence_async_shared();             // ... its generic writes are visible to wgmma's async proxy ...
        read_stage = read_stage == WG_STAGES - 1 ? 0 : read_stage + 1;
        __syncthreads();                  // ... everyone's; the consumer retired tile t - 2
        if (t + WG_STAGES - 2 < tiles) loader.load(smem + write_stage * WG_STAGE_BYTES);
        cp_async_commit();
        write_stage = write_stage == WG_STAGES - 1 ? 0 : write_stage + 1;
    }
    cp_async_wait_all();
}

// The consumer's part of one K tile: after the barrier that hands it over, the wgmmas of
// stage `stage` (two m64 halves sharing B per k step; per pair of k steps, half 0's two, then
// half 1's), then a wait until one group is left in flight (the tile before retired: its stage
// may be refilled after the next barrier).
__device__ __forceinline__ void consume_tile(float (&acc)[2][WG_ACC], unsigned long long desc_a0,
                                             unsigned long long desc_b0, int stage) {
    __syncthreads();
    const unsigned long long offset = (unsigned long long)stage * (WG_STAGE_BYTES >> 4);
    const unsigned long long half_a = (64 * WG_ROW_BYTES) >> 4;
    wgmma_fence_operands(acc[0]);
    wgmma_fence_operands(acc[1]);
    wgmma_fence();
#pragma unroll
    for (int kp = 0; kp < WG_BK / WG_KSTEP; kp += 2)   // k steps in pairs (see Thread mapping)
#pragma unroll
        for (int h = 0; h < 2; ++h)
#pragma unroll
            for (int ks = kp; ks < kp + 2; ++ks) {   // k step ks: atom ks / 4, 32 bytes each
                const unsigned long long k_off = (ks / 4) * (WG_ATOM_BYTES >> 4) + (ks % 4) * 2;
                const unsigned long long b = desc_b0 + offset + (ks / 4) * (WG_B_ATOM_BYTES >> 4) + (ks % 4) * 2;
                wgmma_m64n<WG_BN, elem_t>(acc[h], desc_a0 + h * half_a + offset + k_off, b);
            }
    wgmma_commit();
    wgmma_wait<1>();
    wgmma_fence_operands(acc[0]);
    wgmma_fence_operands(acc[1]);
}

// The consumer warpgroup: `tiles` K tiles into the two m64 halves' accumulators.
__device__ __forceinline__ void consume(float (&acc)[2][WG_ACC], unsigned char* smem, int tiles) {
#pragma unroll
    for (int e = 0; e < WG_ACC; ++e) acc[0][e] = acc[1][e] = 0.0f;
    // Descriptors of stage 0, k step 0 (from the shared window address, which the compiler
    // knows to be uniform: they live in uniform registers); a stage is WG_STAGE_BYTES
    // further, a k step 32 bytes, the second m64 half of A 64 rows.
    const unsigned long long desc_a0 = wgmma_desc_k_sw128(smem_address(smem), 8 * WG_ROW_BYTES);
    // (B as an offset of A's descriptor: one loop-invariant base, not one per operand.)
    const unsigned long long desc_b0 = desc_a0 + (WG_A_BYTES >> 4);
    // Tile t reads stage t % WG_STAGES. Whole turns of the ring run unrolled without tail
    // checks (every descriptor is then a base plus an immediate: one uniform add each); the
    // last tiles < WG_STAGES run one at a time. (Counting turns down: no copy of t per turn.)
    unsigned long long desc = desc_a0;
    const int turns = tiles / WG_STAGES;
    int t = turns * WG_STAGES;
    for (int turn = turns; turn > 0; --turn) {
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

// ---- epilogue: accumulators -> shared memory tile -> 16-byte stores ----
// The output tile (128 rows x WG_BN channels of T: elem_t, or float for wgrad's partials) is staged
// in the (then idle) stage ring, rows of 16-byte units, unit u of row r stored at
// u ^ ((r * spread) % 8): a consumer warp's fragment writes (8 rows x 4 lanes per instruction;
// float pairs are 8 bytes, written per half warp: 4 rows x 2 units, hence spread 2) then hit 8
// different bank groups, and every thread of the block copies whole units out.
template <class T> __device__ __forceinline__ unsigned out_offset(int row, int col) {   // byte offset of (row, col)
    constexpr int units = WG_BN * (int)sizeof(T) / 16, spread = sizeof(T) == 4 ? 2 : 1;
    const int byte = col * (int)sizeof(T);
    return row * units * 16 + ((((byte >> 4) ^ ((row * spread) % 8))) << 4) + (byte & 15);
}

// A consumer thread's accumulators of the m64 half `half` (+ bias, relu) into the staged tile
// (layout: hopper.cuh).
template <class T>
__device__ __forceinline__ void stage_accumulators(const float (&acc)[WG_ACC], int half, unsigned char* tile,
                                                   int cols, const elem_t* __restrict__ bias, int epilogue) {
    const int t = threadIdx.x % 128, warp = t / 32, lane = t % 32;
    const int row0 = half * 64 + 16 * warp + lane / 4;
    struct alignas(2 * sizeof(T)) Pair { T v[2]; };
#pragma unroll
    for (int j = 0; j < WG_BN / 8; ++j) {
        const int col = 8 * j + 2 * (lane % 4), channel = blockIdx.y * WG_BN + col;
        float b[2] = {0.0f, 0.0f};
        if (epilogue >= 1) {
            if (channel < cols) b[0] = to_acc(bias[channel]);
            if (channel + 1 < cols) b[1] = to_acc(bias[channel + 1]);
        }
#pragma unroll
        for (int i = 0; i < 2; ++i) {
            Pair p;
#pragma unroll
            for (int q = 0; q < 2; ++q) {
                float v = acc[4 * j + 2 * i + q] + b[q];
                if (epilogue == 2) v = v < 0.0f ? 0.0f : v;   // relu keeps NaN
                if constexpr (gpuk_same_type<T, float>::value) p.v[q] = v;
                else p.v[q] = ElementTraits<T>::from_acc(v);
            }
            *reinterpret_cast<Pair*>(tile + out_offset<T>(row0 + 8 * i, col)) = p;
        }
    }
}

// Every thread: the staged tile's units to out (rows of `cols` channels; GEMM row m is output
// row out_row(m)), 16 bytes at a time where the channel count allows, element by element at
// the tails.
template <class T, class RowMap>
__device__ __forceinline__ void store_tile(const unsigned char* tile, long long rows, int cols, T* __restrict__ out,
                                           const RowMap& out_row) {
    constexpr int vec = 16 / (int)sizeof(T), units = WG_BN / vec;
    const bool vector = cols % vec == 0 && is_aligned(out, 16);
    for (int chunk = threadIdx.x; chunk < WG_BM * units; chunk += WG_THREADS) {
        const int row = chunk / units, col = (chunk % units) * vec;
        const long long m = (long long)blockIdx.x * WG_BM + row;
        const int channel = blockIdx.y * WG_BN + col;
        if (m >= rows || channel >= cols) continue;
        const unsigned char* src = tile + out_offset<T>(row, col);
        T* dst = out + out_row(m) * cols + channel;
        if (vector) {
            store_uint4(dst, load_uint4(src));
        } else {
            const T* values = reinterpret_cast<const T*>(src);
            for (int e = 0; e < vec && channel + e < cols; ++e) dst[e] = values[e];
        }
    }
}

// The end of every kernel: every copy landed and every wgmma retired, so the stage ring is free
// for the staged output tile.
template <class T, class RowMap>
__device__ __forceinline__ void write_output(const float (&acc)[2][WG_ACC], unsigned char* smem, long long rows,
                                             int cols, const elem_t* __restrict__ bias, int epilogue,
                                             T* __restrict__ out, const RowMap& out_row) {
    __syncthreads();
    if (threadIdx.x >= 128) {
        stage_accumulators<T>(acc[0], 0, smem, cols, bias, epilogue);
        stage_accumulators<T>(acc[1], 1, smem, cols, bias, epilogue);
    }
    __syncthreads();
    store_tile<T>(smem, rows, cols, out, out_row);
}

// The stage ring: the dynamic shared memory from its first 1024-byte boundary of the shared
// window (the swizzle pattern's repeat).
__device__ __forceinline__ unsigned char* stage_ring(unsigned char* dynamic_smem) {
    const unsigned raw = smem_address(dynamic_smem);
    return dynamic_smem + ((1024u - (raw & 1023u)) & 1023u);
}

// A gathered GEMM (fwd, one dgrad phase) from the producer's and the consumer's side.
__device__ __forceinline__ void gather_mainloop(const GatherGemm& p, const elem_t* __restrict__ a_src,
                                                const elem_t* __restrict__ w_t, unsigned char* smem,
                                                float (&acc)[2][WG_ACC]) {
    const int tiles = (int)((p.depth + WG_BK - 1) / WG_BK);
    if (threadIdx.x < 128) {
        GatherLoader loader;
        loader.init(p, a_src, w_t);
        produce(loader, smem, tiles);
    } else {
        consume(acc, smem, tiles);
    }
}

// conv_wgmma_fwd: y = conv(x, w) (+ bias, relu), channels_last. w_t is the filter as (C_out, K).
// Grid (M tiles, C_out tiles), WG_THREADS threads, WG_SMEM_BYTES of dynamic shared memory.
extern "C" __global__ void __launch_bounds__(WG_THREADS, 1)
conv_wgmma_fwd(const elem_t* __restrict__ x, const elem_t* __restrict__ w_t, const elem_t* __restrict__ bias,
               elem_t* __restrict__ y, int batch, int c_in, int c_out, int in_d, int in_h, int in_w, int out_d,
               int out_h, int out_w, int k_d, int k_h, int k_w, int s_d, int s_h, int s_w, int dil_d, int dil_h,
               int dil_w, int pad_d, int pad_h, int pad_w, int epilogue) {
    extern __shared__ __align__(1024) unsigned char wgmma_smem[];
    unsigned char* smem = stage_ring(wgmma_smem);
    const ConvGeom g = make_geom(batch, c_in, c_out, in_d, in_h, in_w, out_d, out_h, out_w, k_d, k_h, k_w, s_d, s_h,
                                 s_w, dil_d, dil_h, dil_w, pad_d, pad_h, pad_w);
    const long long depth = (long long)g.taps * c_in;
    const GatherGemm p{in_d, in_h, in_w, c_in, g.in_pix, out_d, out_h, out_w, s_d, s_h, s_w, -pad_d, -pad_h, -pad_w,
                       dense_taps(g, 0, 0, 0), (long long)batch * g.out_pix, depth, c_out, depth};
    float acc[2][WG_ACC];   // the consumer's two m64 halves
    gather_mainloop(p, x, w_t, smem, acc);
    write_output<elem_t>(acc, smem, p.rows, c_out, bias, epilogue, y, [](long long m) { return m; });
}

// conv_wgmma_dgrad: dx = dgrad(dy, w), channels_last, as stride-phase sub-convolutions
// (DgradPhase). w_t is the filter as (C_in, taps, C_out). Grid (tiles of the largest phase's
// rows, C_in tiles, s_d*s_h*s_w phases), WG_THREADS threads, WG_SMEM_BYTES of dynamic shared
// memory; a block past its phase's rows exits at once (the whole block: no barrier is skipped).
extern "C" __global__ void __launch_bounds__(WG_THREADS, 1)
conv_wgmma_dgrad(const elem_t* __restrict__ dy, const elem_t* __restrict__ w_t, elem_t* __restrict__ dx,
                 int batch, int c_in, int c_out, int in_d, int in_h, int in_w, int out_d, int out_h, int out_w,
                 int k_d, int k_h, int k_w, int s_d, int s_h, int s_w, int dil_d, int dil_h, int dil_w, int pad_d,
                 int pad_h, int pad_w) {
    extern __shared__ __align__(1024) unsigned char wgmma_smem[];
    unsigned char* smem = stage_ring(wgmma_smem);
    const ConvGeom g = make_geom(batch, c_in, c_out, in_d, in_h, in_w, out_d, out_h, out_w, k_d, k_h, k_w, s_d, s_h,
                                 s_w, dil_d, dil_h, dil_w, pad_d, pad_h, pad_w);
    DgradPhase phase;
    phase.init(g, blockIdx.z);
    if ((long long)blockIdx.x * WG_BM >= phase.rows) return;
    const GatherGemm p{out_d, out_h, out_w, c_out, g.out_pix, phase.q_d, phase.q_h, phase.q_w, 1, 1, 1, 0, 0, 0,
                       phase.taps, phase.rows, phase.depth, c_in, (long long)g.taps * c_out};
    float acc[2][WG_ACC];
    gather_mainloop(p, dy, w_t, smem, acc);
    write_output<elem_t>(acc, smem, p.rows, c_in, nullptr, 0, dx,
                         [&](long long m) { return phase.out_row(g, m); });
}

// conv_wgmma_wgrad: dw (Keras layout (*k, C_in, C_out), i.e. row-major (taps*C_in, C_out)),
// channels_last x and dy. Grid (taps*C_in tiles, C_out tiles, splits), WG_THREADS threads,
// WG_SMEM_BYTES of dynamic shared memory; split z covers k in [z*k_per_split, ...) (k_per_split
// a multiple of WG_BK). One split: writes dw; more: writes partial[z] (float, M x C_out) for
// conv_wgmma_reduce_splits.
extern "C" __global__ void __launch_bounds__(WG_THREADS, 1)
conv_wgmma_wgrad(const elem_t* __restrict__ x, const elem_t* __restrict__ dy, elem_t* __restrict__ dw,
                 float* __restrict__ partial, int batch, int c_in, int c_out, int in_d, int in_h, int in_w,
                 int out_d, int out_h, int out_w, int k_d, int k_h, int k_w, int s_d, int s_h, int s_w, int dil_d,
                 int dil_h, int dil_w, int pad_d, int pad_h, int pad_w, long long k_per_split) {
    extern __shared__ __align__(1024) unsigned char wgmma_smem[];
    unsigned char* smem = stage_ring(wgmma_smem);
    const ConvGeom g = make_geom(batch, c_in, c_out, in_d, in_h, in_w, out_d, out_h, out_w, k_d, k_h, k_w, s_d, s_h,
                                 s_w, dil_d, dil_h, dil_w, pad_d, pad_h, pad_w);
    const long long rows = (long long)g.taps * c_in, depth = (long long)batch * g.out_pix;
    const long long k_begin = (long long)blockIdx.z * k_per_split;
    const long long k_end = k_begin + k_per_split < depth ? k_begin + k_per_split : depth;
    const int tiles = (int)((k_end - k_begin + WG_BK - 1) / WG_BK);
    float acc[2][WG_ACC];
    if (threadIdx.x < 128) {
        WgradLoader loader;
        loader.init(g, x, dy, k_begin, k_end);
        produce(loader, smem, tiles);
    } else {
        consume(acc, smem, tiles);
    }
    const auto same_row = [](long long m) { return m; };
    if (gridDim.z == 1)
        write_output<elem_t>(acc, smem, rows, c_out, nullptr, 0, dw, same_row);
    else
        write_output<float>(acc, smem, rows, c_out, nullptr, 0, partial + (long long)blockIdx.z * rows * c_out,
                            same_row);
}

// conv_wgmma_reduce_splits: dw[i] = sum over splits of partial[s][i], in split order (conv_igemm.cu's
// conv_reduce_splits, built here so that wgrad needs no implicit-GEMM module).
// 1-D grid-stride loop; no shared memory, no atomics.
extern "C" __global__ void __launch_bounds__(REDUCE_THREADS)
conv_wgmma_reduce_splits(const acc_t* __restrict__ partial, elem_t* __restrict__ out, long long count, int splits) {
    reduce_splits_body(partial, out, count, splits);
}
