// conv_igemm_math.cuh: conv_igemm.cu's multiply of one K tile per math path (CONV_MATH):
// FFMA micro-tiles (0), mma.sync m16n8k16 on 16-bit inputs (1, Mma16), mma.sync m16n8k8 tf32 (2:
// Tf32Rounding, K4Transposed, Tf32Order, and the rounding of landed stages, round_landed_tf32 /
// TF32_ROUND_LANDED); and where each accumulator lands (ACC_COUNT, ThreadRows, acc_position,
// slot_row), which the epilogue reads.
// Relies on: the variant macros CONV_MATH, CONV_BM, CONV_BN, CONV_BK, CONV_TM, CONV_TN,
// CONV_WARPS_M, CONV_WARPS_N, MODE_*; conv_igemm_layout.cuh (Layout, tile_index, k_rows_apart) and
// the loaders' chunk mapping that the tf32 rounding follows (conv_igemm_gather.cuh RowStream<true>,
// conv_igemm_loaders.cuh wgrad_a_row / wgrad_a_unit, WG_CHUNKS, TF32_*_TRANSPOSED).
//
#pragma once

// ---- the multiply of one K-tile, per math path ----
#if CONV_MATH == 0
#define ACC_COUNT (CONV_TM * CONV_TN)
static_assert(CONV_TM % 4 == 0 && CONV_TN % 4 == 0, "FFMA micro-tile: runs of 4");
// Micro-tile mapping: a thread's TM rows are runs of 4 consecutive rows, BM / (TM/4) apart
// (likewise for columns), so 8 neighbouring threads read 8 consecutive 16-byte pieces of a
// k-major tile: no bank conflicts, one LDS.128 per run. The 8 threads of a quarter warp share
// ty, so [m][k] A tiles are broadcast reads (stored unswizzled). An [n][k] B tile (dgrad) is read along k by
// neighbouring tx: there the columns are strided (tx, tx + BN/TN, ...), so the 8 threads read
// 8 consecutive rows, which the swizzle puts in 8 distinct 16-byte bank groups.
__device__ __forceinline__ int micro_row(int i) {
    const int ty = threadIdx.x / (CONV_BN / CONV_TN);
    return (i / 4) * (CONV_BM / (CONV_TM / 4)) + ty * 4 + i % 4;
}
template <int MODE>
__device__ __forceinline__ int micro_col(int j) {
    const int tx = threadIdx.x % (CONV_BN / CONV_TN);
    if (Layout<MODE>::b_nk) return j * (CONV_BN / CONV_TN) + tx;
    return (j / 4) * (CONV_BN / (CONV_TN / 4)) + tx * 4 + j % 4;
}
// Four consecutive elements of a tile row (rows of LEN elements), from a column that is a
// multiple of 4: explicit 16-byte shared reads (one float4 or two double2), whose address
// the swizzle computes once per unit.
static_assert(sizeof(elem_t) == 4 || sizeof(elem_t) == 8, "FFMA: float or double");
template <int LEN, bool SWIZZLED = true>
__device__ __forceinline__ void read_run4(const elem_t* __restrict__ tile, int row, int col, acc_t (&out)[4]) {
    if constexpr (sizeof(elem_t) == 4) {
        const float4 v = *reinterpret_cast<const float4*>(tile + tile_offset<LEN, 0, SWIZZLED>(row, col));
        out[0] = v.x; out[1] = v.y; out[2] = v.z; out[3] = v.w;
    } else {
        const double2 lo = *reinterpret_cast<const double2*>(tile + tile_offset<LEN, 0, SWIZZLED>(row, col));
        const double2 hi = *reinterpret_cast<const double2*>(tile + tile_offset<LEN, 0, SWIZZLED>(row, col + 2));
        out[0] = lo.x; out[1] = lo.y; out[2] = hi.x; out[3] = hi.y;
    }
}
// Four k at a time: an [m][k] tile gives each row's 4 k in one run, a k-major tile each run
// of 4 rows per k.
template <int MODE>
__device__ __forceinline__ void tile_multiply(const elem_t* __restrict__ as, const elem_t* __restrict__ bs,
                                              acc_t* acc) {
#pragma unroll
    for (int k0 = 0; k0 < CONV_BK; k0 += 4) {
        acc_t a[CONV_TM][4], b[CONV_TN][4];
        if (Layout<MODE>::a_mk) {
#pragma unroll
            for (int i = 0; i < CONV_TM; ++i) read_run4<CONV_BK, A_MK_SWIZZLED>(as, micro_row(i), k0, a[i]);
        } else {
#pragma unroll
            for (int kk = 0; kk < 4; ++kk)
#pragma unroll
                for (int i0 = 0; i0 < CONV_TM; i0 += 4) {
                    acc_t run[4];
                    read_run4<CONV_BM>(as, k0 + kk, micro_row(i0), run);
#pragma unroll
                    for (int q = 0; q < 4; ++q) a[i0 + q][kk] = run[q];
                }
        }
        if (Layout<MODE>::b_nk) {
#pragma unroll
            for (int j = 0; j < CONV_TN; ++j) read_run4<CONV_BK>(bs, micro_col<MODE>(j), k0, b[j]);
        } else {
#pragma unroll
            for (int kk = 0; kk < 4; ++kk)
#pragma unroll
                for (int j0 = 0; j0 < CONV_TN; j0 += 4) {
                    acc_t run[4];
                    read_run4<CONV_BN>(bs, k0 + kk, micro_col<MODE>(j0), run);
#pragma unroll
                    for (int q = 0; q < 4; ++q) b[j0 + q][kk] = run[q];
                }
        }
#pragma unroll
        for (int kk = 0; kk < 4; ++kk)
#pragma unroll
            for (int i = 0; i < CONV_TM; ++i)
#pragma unroll
                for (int j = 0; j < CONV_TN; ++j)
                    acc[i * CONV_TN + j] = fma(a[i][kk], b[j][kk], acc[i * CONV_TN + j]);
    }
}
// Accumulator e lies in the thread's row slot `slot` (of ThreadRows<MODE>::count) and at column
// `col` of the block tile; slot s is block-tile row slot_row(s).
template <int MODE> struct ThreadRows { static constexpr int count = CONV_TM; };
template <int MODE>
__device__ __forceinline__ void acc_position(int e, int& slot, int& col) {
    slot = e / CONV_TN;
    col = micro_col<MODE>(e % CONV_TN);
}
template <int MODE>
__device__ __forceinline__ int slot_row(int slot) { return micro_row(slot); }
#else
#define WARP_TILE_M (CONV_BM / CONV_WARPS_M)
#define WARP_TILE_N (CONV_BN / CONV_WARPS_N)
#define MMA_M_TILES (WARP_TILE_M / 16)
#define MMA_N_TILES (WARP_TILE_N / 8)
#define ACC_COUNT (MMA_M_TILES * MMA_N_TILES * 4)
#if CONV_MATH == 1
// The m16n8k16 MMA whose operands are elem_t: same fragment layout for f16 and bf16.
template <class T> struct Mma16;
template <> struct Mma16<__half> {
    __device__ __forceinline__ static void run(float* c, const unsigned a[4], const unsigned b[2]) {
        mma_m16n8k16_f16(c, a, b, c);
    }
};
template <> struct Mma16<__nv_bfloat16> {
    __device__ __forceinline__ static void run(float* c, const unsigned a[4], const unsigned b[2]) {
        mma_m16n8k16_bf16(c, a, b, c);
    }
};
#endif
#if CONV_MATH == 2
// tf32 fragments. ldmatrix moves 16-bit columns, so it serves only [mn][k] tiles (a 32-bit
// element is two columns; .trans would split each word); a k-major tile (A [k][m] in wgrad,
// B [k][n] in fwd and wgrad) is read with plain shared loads. Each lane's two k (t, t + 4) lie in
// two rows there, so the MMA rows (or columns) are ordered to make a lane's other fragment
// elements shared-memory neighbours, and k-major rows are padded to a stride of 2 mod 8 units
// (SMEM_PAD_K) so those reads are conflict-free. Reordering the output rows or columns is exact
// (each output is still one row of A times one column of B); position() says where accumulator e
// lands. Per K step of 8, per warp:
//   dgrad (A [m][k], B [n][k]): ldmatrix for both, the plain order.
//   wgrad 128x128 (A [k][m], B [k][n]): both stored in transposed 4 x 4 blocks by their rounding
//     pass (TF32_A_TRANSPOSED, TF32_B_TRANSPOSED, K4Transposed) and read by ldmatrix, plain order.
//   wgrad 64x64 (2 x 1 warps): B as on 128x128 (TF32_B_TRANSPOSED); A, which each warp reads
//     alone and rounds in its registers: row g + 8h of 16-row MMA tile mi is warp-tile row
//     16 mi + 2g + h, so a lane's (a0, a1) (k = t) and (a2, a3) (k = t + 4) are one 8-byte read
//     each, straight into the MMA's register quad (Tf32Order's paired rows).
//   fwd (A [m][k], B [k][n]): the transposed product D^T = B^T A^T, so that the k-major B is the
//     MMA's A operand (8-byte reads as in wgrad, 16-row tiles along n) and A is the MMA's B
//     operand (ldmatrix, 8-column tiles along m). Lane (g, t) then holds output rows m = 2t, 2t+1
//     of each 8-row m tile at the channel pair n = 2g, 2g + 1 of each 16-channel n tile: acc keeps
//     each pair together, one 8-byte store (EpilogueRun 2), 4 rows x 64 contiguous bytes per warp.
// Rounding (float_to_tf32, to nearest even): fwd's and dgrad's B is the filter, which every block
// reads: the launcher rounds it once per call (conv_round_tf32), so those kernels never round B.
// Any other operand whose elements are read by several warps (A by CONV_WARPS_N, wgrad's B by
// CONV_WARPS_M) is rounded once per element in shared memory, by the thread that copied it
// (round_landed_tf32: the rounding, 1 instruction on sm_90 and 3 on sm_80, plus its share of a
// 16-byte load and store), otherwise in the fragment registers of its one reader (the rounding
// per register): 128x128 rounds A (and wgrad's B) in shared memory; 64x64 (2 x 1 warps: each
// warp reads its own rows of A, 0.5 elements per MMA against 0.75 for the shared pass with its
// load and store) A in registers and wgrad's B in shared memory. Every tf32 tile has several
// warps along M, so wgrad's B is always rounded (and transposed) in shared memory.
// Why round at all: the tensor core reads the top 19 bits of each 32-bit word, i.e. it
// truncates. Truncation would be free (measured: 1.91 / 1.94 / 2.56 other instructions
// per MMA for 128x128x16 fwd / dgrad / wgrad on sm_90, 2.5-3.6 on 64x64) but doubles the
// worst input error (2^-10 instead of 2^-11 relative) and biases every product toward zero,
// an error that adds up along K instead of averaging out (triton-lang/triton#4574: a
// truncating tf32 dot measured far less accurate than one rounding with cvt.rna). Ties go
// to even, not away from zero (cvt.rna, the only rounding sm_80 has): no bias on ties
// either (they are frequent in data with few significant bits), one instruction on sm_90,
// and the one rounding of every tf32 path (the wgmma path too), which the tests model
// (gpuk.kernels.testing.round_tf32, then float32 tolerance). tf32 is opt-in; float32
// strict runs the FFMA path.
template <int MODE> struct Tf32Rounding {
    static constexpr bool b_prerounded = MODE != MODE_WGRAD;   // B = w: conv_round_tf32
    static constexpr bool a_shared = CONV_WARPS_N > 1, b_shared = !b_prerounded;
    static constexpr bool a_registers = !a_shared;
    static_assert(!b_shared || TF32_B_TRANSPOSED, "wgrad's B: read by several warps, rounded where transposed");
    static_assert(!a_shared || MODE != MODE_WGRAD || TF32_A_TRANSPOSED,
                  "wgrad's A: rounded in shared memory where transposed");
};
// A k-major tile of MN columns as TF32_A_TRANSPOSED / TF32_B_TRANSPOSED store it: each 4 x 4 block
// (k rows 4q..4q+3, one unit of 4 columns) transposed in place, so that the 16 bytes at row 4q + j
// of unit u hold column 4u + j at k = 4q..4q+3: a lane's fragment element at k = t (or t + 4) of
// column (MMA row) g is word t of one 16-byte row, and ldmatrix (plain: lane (g, t) takes word t
// of row g) loads an MMA A quad, or the B fragments of two 8-column tiles, at once. The 8 rows of
// a phase (4 rows x 2 units) hit 8 bank groups (the padded stride, 2 mod 8 units).
template <int MN> struct K4Transposed {
    // The 16-byte row of column n4 + r (n4 a multiple of 4, r < 4) at k = k4..k4+3 (k4 a multiple
    // of 4). The caller passes n4 and r apart, so that index is linear in k4 and n4 and the offsets
    // between a thread's rows are immediates (computed from n, they took a register each).
    __device__ __forceinline__ static int row(int k4, int n4, int r) { return (k4 + r) * (MN + SMEM_PAD_K) + n4; }
};
// float_to_tf32 (common.cuh): round to nearest even, as the MMA reads it.
__device__ __forceinline__ float tf32_round_for_mma(float x) { return __uint_as_float(float_to_tf32(x)); }
// Rounds fragment registers where their operand is rounded there (Tf32Rounding::a_registers: wgrad's B
// is always rounded in shared memory).
template <bool ROUND, int N> __device__ __forceinline__ void round_fragment(unsigned (&r)[N]) {
    if constexpr (ROUND) {
#pragma unroll
        for (int i = 0; i < N; ++i) r[i] = __float_as_uint(tf32_round_for_mma(__uint_as_float(r[i])));
    }
}
template <int MODE> struct Tf32Order {
    static constexpr bool swapped = MODE == MODE_FWD;          // D^T = B^T A^T
    static constexpr bool paired_rows = !Layout<MODE>::a_mk && !TF32_A_TRANSPOSED;   // wgrad's A rows 16 mi + 2g + h
    static constexpr int M8 = WARP_TILE_M / 8;                 // swapped: 8-row m tiles
    static_assert(WARP_TILE_M % 16 == 0 && WARP_TILE_N % 16 == 0, "tf32 warp tile: 16-row and 16-column tiles");
    // swapped: accumulator index of (n tile ni, m tile mj, part c0..c3): pairs (c0, c2), (c1, c3)
    __device__ __forceinline__ static constexpr int acc_swapped(int ni, int mj, int part) {
        return (ni * M8 + mj) * 4 + (part & 1) * 2 + (part >> 1);
    }
    // Accumulator e's row slot (swapped: 2 per 8 rows of the warp tile, else 2 per 16) and column
    // within the warp tile, for lane (g, t); slot_row: the slot's row within the warp tile.
    static constexpr int thread_rows = swapped ? 2 * M8 : 2 * MMA_M_TILES;
    __device__ __forceinline__ static void position(int e, int g, int t, int& slot, int& col) {
        const int tile = e >> 2, q = e & 3;
        if (swapped) {
            slot = (tile % M8) * 2 + (q >> 1);
            col = (tile / M8) * 16 + 2 * g + (q & 1);
        } else {
            slot = (tile / MMA_N_TILES) * 2 + (q >> 1);
            col = (tile % MMA_N_TILES) * 8 + 2 * t + (q & 1);
        }
    }
    __device__ __forceinline__ static int slot_row(int slot, int g, int t) {
        const int tile = slot >> 1, h = slot & 1;
        if (swapped) return tile * 8 + 2 * t + h;
        return paired_rows ? tile * 16 + 2 * g + h : tile * 16 + g + 8 * h;
    }
};
// An MMA A fragment from a k-major tile whose paired rows r, r + 1 (a0, a1 at k; a2, a3 at k + 4)
// are neighbours: two 8-byte reads.
__device__ __forceinline__ void load_paired_a(unsigned (&a)[4], const elem_t* at_k, const elem_t* at_k4) {
    const float2 lo = *reinterpret_cast<const float2*>(at_k), hi = *reinterpret_cast<const float2*>(at_k4);
    a[0] = __float_as_uint(lo.x); a[1] = __float_as_uint(lo.y);
    a[2] = __float_as_uint(hi.x); a[3] = __float_as_uint(hi.y);
}
#endif
// Fragments come from ldmatrix (common.cuh) wherever the stored layout allows it:
//   16-bit A: [m][k] plain, [k][m] .trans;  16-bit B: [n][k] plain, [k][n] .trans;
//   tf32 (a 32-bit element is two 16-bit columns, so only the plain form applies): [m][k] and
//   [n][k] tiles and wgrad's transposed blocks (K4Transposed) by ldmatrix, the other k-major
//   ones by 8-byte shared loads (paired rows), see Tf32Order.
// Swizzled rows keep every ldmatrix phase (8 rows of 16 bytes) on 8 distinct 16-byte bank groups.
static_assert(MMA_N_TILES % 2 == 0, "B fragments load two 8-column tiles per ldmatrix.x4");
#define AS(k, m) as[tile_index<Layout<MODE>::a_mk, CONV_BM>((m), (k))]
#define BS(k, n) bs[tile_index<Layout<MODE>::b_nk, CONV_BN>((n), (k))]
template <int MODE>
__device__ __forceinline__ void tile_multiply(const elem_t* __restrict__ as, const elem_t* __restrict__ bs,
                                              acc_t* acc) {
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, gr = lane >> 2, t = lane & 3;
    const int row0 = (warp / CONV_WARPS_N) * WARP_TILE_M, col0 = (warp % CONV_WARPS_N) * WARP_TILE_N;
    const int mat = lane >> 3, mrow = lane & 7;   // the ldmatrix matrix and row this lane addresses
#if CONV_MATH == 1
#pragma unroll
    for (int ks = 0; ks < CONV_BK; ks += 16) {
        unsigned b[MMA_N_TILES][2];
#pragma unroll
        for (int ni = 0; ni < MMA_N_TILES; ni += 2) {
            // matrices: (k 0-7, tile ni), (k 8-15, ni), (k 0-7, ni+1), (k 8-15, ni+1)
            const int n = col0 + (ni + (mat >> 1)) * 8, k = ks + (mat & 1) * 8;
            unsigned r[4];
            if (Layout<MODE>::b_nk) ldmatrix<4, false>(r, &BS(k, n + mrow));
            else ldmatrix<4, true>(r, &BS(k + mrow, n));
            b[ni][0] = r[0]; b[ni][1] = r[1]; b[ni + 1][0] = r[2]; b[ni + 1][1] = r[3];
        }
#pragma unroll
        for (int mi = 0; mi < MMA_M_TILES; ++mi) {
            // matrices: (m 0-7, k 0-7), (m 8-15, k 0-7), (m 0-7, k 8-15), (m 8-15, k 8-15) = a0..a3
            const int m = row0 + mi * 16 + (mat & 1) * 8, k = ks + (mat >> 1) * 8;
            unsigned a[4];
            if (Layout<MODE>::a_mk) ldmatrix<4, false>(a, &AS(k, m + mrow));
            else ldmatrix<4, true>(a, &AS(k + mrow, m));
#pragma unroll
            for (int ni = 0; ni < MMA_N_TILES; ++ni) {
                float* c = acc + (mi * MMA_N_TILES + ni) * 4;
                Mma16<elem_t>::run(c, a, b[ni]);
            }
        }
    }
#else
#pragma unroll
    for (int ks = 0; ks < CONV_BK; ks += 8) {
        if constexpr (Tf32Order<MODE>::swapped) {   // fwd: MMA A = B^T (k-major, paired), MMA B = A^T (ldmatrix)
            constexpr int M8 = Tf32Order<MODE>::M8;
            unsigned b[M8][2];
#pragma unroll
            for (int mj = 0; mj < M8; mj += 2) {   // matrices: (k 0-3, mj), (k 4-7, mj), (k 0-3, mj+1), (k 4-7, mj+1)
                unsigned r[4];
                ldmatrix<4, false>(r, &AS(ks + (mat & 1) * 4, row0 + (mj + (mat >> 1)) * 8 + mrow));
                b[mj][0] = r[0]; b[mj][1] = r[1]; b[mj + 1][0] = r[2]; b[mj + 1][1] = r[3];
            }
#pragma unroll
            for (int mj = 0; mj < M8; ++mj) round_fragment<Tf32Rounding<MODE>::a_registers>(b[mj]);
#pragma unroll
            for (int ni = 0; ni < WARP_TILE_N / 16; ++ni) {
                unsigned a[4];
                const int n = col0 + ni * 16 + 2 * gr;
                load_paired_a(a, &BS(ks + t, n), &BS(ks + t + 4, n));
#pragma unroll
                for (int mj = 0; mj < M8; ++mj) {
                    float c[4];
#pragma unroll
                    for (int part = 0; part < 4; ++part) c[part] = acc[Tf32Order<MODE>::acc_swapped(ni, mj, part)];
                    mma_m16n8k8_tf32(c, a, b[mj], c);
#pragma unroll
                    for (int part = 0; part < 4; ++part) acc[Tf32Order<MODE>::acc_swapped(ni, mj, part)] = c[part];
                }
            }
        } else {
            static_assert(Layout<MODE>::b_nk || TF32_B_TRANSPOSED, "tf32 B fragments by ldmatrix");
            unsigned b[MMA_N_TILES][2];
#pragma unroll
            for (int ni = 0; ni < MMA_N_TILES; ni += 2) {
                // matrices: (k 0-3, ni), (k 4-7, ni), (k 0-3, ni+1), (k 4-7, ni+1)
                const int k = ks + (mat & 1) * 4, n8 = col0 + (ni + (mat >> 1)) * 8;
                unsigned r[4];
                ldmatrix<4, false>(r, Layout<MODE>::b_nk ? &BS(k, n8 + mrow)
                                                         : bs + K4Transposed<CONV_BN>::row(k, n8 + (mrow & 4), mrow & 3));
                b[ni][0] = r[0]; b[ni][1] = r[1]; b[ni + 1][0] = r[2]; b[ni + 1][1] = r[3];
            }
#pragma unroll
            for (int mi = 0; mi < MMA_M_TILES; ++mi) {
                unsigned a[4];
                if (Layout<MODE>::a_mk || TF32_A_TRANSPOSED) {
                    // matrices: (m 0-7, k 0-3), (m 8-15, k 0-3), (m 0-7, k 4-7), (m 8-15, k 4-7)
                    const int k = ks + (mat >> 1) * 4, m8 = row0 + mi * 16 + (mat & 1) * 8;
                    ldmatrix<4, false>(a, Layout<MODE>::a_mk ? &AS(k, m8 + mrow)
                                                             : as + K4Transposed<CONV_BM>::row(k, m8 + (mrow & 4), mrow & 3));
                } else {   // paired rows (Tf32Order)
                    const int m = row0 + mi * 16 + 2 * gr;
                    load_paired_a(a, &AS(ks + t, m), &AS(ks + t + 4, m));
                }
                round_fragment<Tf32Rounding<MODE>::a_registers>(a);
#pragma unroll
                for (int ni = 0; ni < MMA_N_TILES; ++ni) {
                    float* c = acc + (mi * MMA_N_TILES + ni) * 4;
                    mma_m16n8k8_tf32(c, a, b[ni], c);
                }
            }
        }
    }
#endif
}
#undef AS
#undef BS
#if CONV_MATH == 2
// tf32 rounding in shared memory (Tf32Rounding's *_shared): after its cp_async_wait,
// each thread rounds (float_to_tf32, in place) the 16-byte chunks of the landed stage that it copied
// itself, before the barrier that publishes the stage, so no other thread's copy is read before
// it landed and no barrier is added (the transposed blocks: each lane reads only its own chunk,
// and its store into another lane's follows the warp's ldmatrix, round_transposed_tf32). These
// offsets must follow the loaders' chunk mapping (GatherA: chunk_row / chunk_pos of a [mn][k]
// tile; RowStream<true> (wgrad's B): row / pos; wgrad A: wgrad_a_row / wgrad_a_unit); the
// emulator's racecheck flags a chunk rounded by a thread other than its copier, and a lane that
// hands ldmatrix another lane's chunk (tried: it does).
__device__ __forceinline__ float4 rounded_tf32(float4 v) {
    v.x = tf32_round_for_mma(v.x);
    v.y = tf32_round_for_mma(v.y);
    v.z = tf32_round_for_mma(v.z);
    v.w = tf32_round_for_mma(v.w);
    return v;
}
__device__ __forceinline__ void round_chunk_tf32(elem_t* p) {
    *reinterpret_cast<float4*>(p) = rounded_tf32(*reinterpret_cast<const float4*>(p));
}
// A warp's 8 landed 4 x 4 blocks of a k-major tile (8 units at rows k0..k0+3), rounded and stored
// transposed (K4Transposed): `own` is the chunk this lane copied, row lane / 8 of block lane % 8;
// `column` is where the column this lane receives goes (column lane % 4 of block lane / 4: its
// K4Transposed row). Each lane hands ldmatrix its own chunk (so every shared read of landed data is
// its copier's), rounds the column it receives (k = k0..k0+3) and stores it as one 16-byte row; the
// ldmatrix, a warp collective, orders those stores after every lane's read. 1 ldmatrix + 4 cvt +
// 1 store per 4 elements, no register moves (a transpose of 16-byte loads took one per element off
// the diagonal: sm_90's cvt.rn rounds in place).
__device__ __forceinline__ void round_transposed_tf32(const elem_t* own, elem_t* column) {
    unsigned r[4];
    ldmatrix<4, false>(r, own);
    *reinterpret_cast<float4*>(column) = rounded_tf32(make_float4(__uint_as_float(r[0]), __uint_as_float(r[1]),
                                                                  __uint_as_float(r[2]), __uint_as_float(r[3])));
}
// TAP: the block copies A by tap tiles (TAP_TILES; the 128x128x16 tile's A, read by its 2 warps along
// N): the thread's chunks are units tap_unit(i) of rows tap_row(r).
template <int MODE, int TAP = 0> __device__ __forceinline__ void round_landed_tf32(elem_t* as, elem_t* bs) {
    // round_transposed_tf32: the warp's blocks lie in 8 neighbouring units; this lane receives
    // column lane % 4 of unit lane / 4 of them
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, unit = lane >> 2, in_unit = lane & 3;
    if constexpr (Tf32Rounding<MODE>::a_shared) {
        if constexpr (MODE == MODE_WGRAD) {   // warp w: rows 4w..4w+3, units g + 8j
            elem_t* const column = as + K4Transposed<CONV_BM>::row(4 * warp, VEC * unit, in_unit);
#pragma unroll
            for (int j = 0; j < WG_CHUNKS; ++j)
                round_transposed_tf32(as + tile_index<false, CONV_BM>(wgrad_a_unit(j) * VEC, wgrad_a_row(0)),
                                      column + 8 * VEC * j);
        } else if constexpr (TAP_TILES && TAP) {
#pragma unroll
            for (int r = 0; r < TAP_ROWS(CONV_BM); ++r)
#pragma unroll
                for (int i = 0; i < TAP_UNITS; ++i)
                    round_chunk_tf32(as + tile_index<true, CONV_BM, A_MK_SWIZZLED>(tap_row(r), tap_unit(i) * VEC));
        } else {
#pragma unroll
            for (int j = 0; j < A_CHUNKS_PER_THREAD; ++j)
                round_chunk_tf32(as + tile_index<true, CONV_BM, A_MK_SWIZZLED>(chunk_row(j, CONV_BK), chunk_pos(CONV_BK)));
        }
    }
    if constexpr (Tf32Rounding<MODE>::b_shared && RowStream<true>::UNIT_PAIRS) {
        // warp w: block rows w + 2q (rows 4w + 8q ..), units g + 8h (RowStream<true>::UNIT_PAIRS)
        elem_t* const column = bs + K4Transposed<CONV_BN>::row(4 * warp, VEC * unit, in_unit);
#pragma unroll
        for (int j = 0; j < B_CHUNKS_PER_THREAD; ++j)
            round_transposed_tf32(bs + tile_index<false, CONV_BN>(RowStream<true>::pos() + RowStream<true>::unit_offset(j),
                                                                  RowStream<true>::row(j)),
                                  column + k_rows_apart<CONV_BN>((j >> 1) * RowStream<true>::PAIR_STEP) +
                                      RowStream<true>::unit_offset(j));
    } else if constexpr (Tf32Rounding<MODE>::b_shared) {   // wgrad's dy (RowStream<true>), warp w: rows 4j..4j+3, units 8w + g
        elem_t* const column = bs + K4Transposed<CONV_BN>::row(0, VEC * (8 * warp + unit), in_unit);
#pragma unroll
        for (int j = 0; j < B_CHUNKS_PER_THREAD; ++j)
            round_transposed_tf32(bs + tile_index<false, CONV_BN>(RowStream<true>::pos(), RowStream<true>::row(j)),
                                  column + k_rows_apart<CONV_BN>(4 * j));
    }
}
#define TF32_ROUND_LANDED(as_stage, bs_stage, tap) round_landed_tf32<MODE, tap>(as_stage, bs_stage)
#endif
// Accumulator e lies in the thread's row slot `slot` (of ThreadRows<MODE>::count: two per 16 rows
// of its warp tile, tf32 fwd two per 8) and at column `col` of the block tile; slot s is
// block-tile row slot_row(s).
#if CONV_MATH == 1
template <int MODE> struct ThreadRows { static constexpr int count = 2 * MMA_M_TILES; };
template <int MODE>
__device__ __forceinline__ void acc_position(int e, int& slot, int& col) {
    const int warp = threadIdx.x >> 5, t = threadIdx.x & 3;
    const int tile = e >> 2, part = e & 3;
    slot = (tile / MMA_N_TILES) * 2 + (part >> 1);
    col = (warp % CONV_WARPS_N) * WARP_TILE_N + (tile % MMA_N_TILES) * 8 + 2 * t + (part & 1);
}
template <int MODE>
__device__ __forceinline__ int slot_row(int slot) {   // slot 2 mi + h: row 16 mi + g + 8 h of the warp tile
    const int warp = threadIdx.x >> 5, gr = (threadIdx.x & 31) >> 2;
    return (warp / CONV_WARPS_N) * WARP_TILE_M + (slot >> 1) * 16 + gr + 8 * (slot & 1);
}
#else
template <int MODE> struct ThreadRows { static constexpr int count = Tf32Order<MODE>::thread_rows; };
template <int MODE>
__device__ __forceinline__ void acc_position(int e, int& slot, int& col) {
    const int warp = threadIdx.x >> 5, gr = (threadIdx.x & 31) >> 2, t = threadIdx.x & 3;
    Tf32Order<MODE>::position(e, gr, t, slot, col);
    col += (warp % CONV_WARPS_N) * WARP_TILE_N;
}
template <int MODE>
__device__ __forceinline__ int slot_row(int slot) {
    const int warp = threadIdx.x >> 5, gr = (threadIdx.x & 31) >> 2, t = threadIdx.x & 3;
    return (warp / CONV_WARPS_N) * WARP_TILE_M + Tf32Order<MODE>::slot_row(slot, gr, t);
}
#endif
#endif

// TF32_ROUND_LANDED(as, bs): the tf32 path's per-stage rounding (round_landed_tf32), between a
// thread's cp_async_wait and the barrier that publishes the stage; nothing on the other paths.
#ifndef TF32_ROUND_LANDED
#define TF32_ROUND_LANDED(as_stage, bs_stage, tap) ((void)0)
#endif
