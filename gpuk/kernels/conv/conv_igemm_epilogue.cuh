// conv_igemm_epilogue.cuh: conv_igemm.cu's epilogue: the block's accumulators to the output
// (store_tile; 16-bit MMA outputs regrouped first, store_tile_16bit), with fwd's bias / relu.
// Relies on: the variant macros CONV_MATH, CONV_BM, CONV_BN, CONV_WARPS_N, MODE_*; ACC_COUNT,
// ThreadRows, acc_position, slot_row (conv_igemm_math.cuh); Layout (conv_igemm_layout.cuh);
// DgradPhase (conv_common.cuh).
//
// Epilogue (fwd only): 0 none, 1 + bias[c_out], 2 + bias then relu (relu keeps NaN). Stores
// go out in runs of consecutive channels (store_tile), each output row out_row(m) mapped once
// per row a thread owns, before the stores (dgrad's phase rows divide); 16-bit MMA outputs are
// regrouped in each quad by shuffles into 8-byte runs (store_tile_16bit), so a warp's stores
// fill whole 32-byte sectors.

#pragma once

// ---- epilogue ----
// Accumulators come in runs of EpilogueRun consecutive columns of one row: FFMA micro-tile
// runs of 4 (1 where dgrad's B columns are strided), MMA pairs (c0, c1) and (c2, c3). A run is
// one vector store where the channel count is a multiple of the run (rows then start aligned);
// elsewhere one store per element. A thread's accumulators lie in a few rows (ThreadRows, the
// slots of acc_position); each one's output row out_row(m) is computed once, before the stores
// (thread_out_rows): dgrad's PhaseRows divides, and its FFMA runs are single elements.
// 16-bit MMA outputs are regrouped first (store_tile_16bit): a pair is only 4 bytes, and the 8
// rows x 4 lanes of one store would fill half of each 32-byte sector.
#if CONV_MATH == 0
template <int MODE> struct EpilogueRun { static constexpr int len = Layout<MODE>::b_nk ? 1 : 4; };
#else
template <int MODE> struct EpilogueRun { static constexpr int len = 2; };
#endif
template <class T, int LEN> struct alignas(LEN * sizeof(T)) ValueRun { T v[LEN]; };
template <class T> __device__ __forceinline__ T out_value(acc_t v) {
    if constexpr (gpuk_same_type<T, acc_t>::value) return v;
    else return ElementTraits<T>::from_acc(v);
}
// v + bias[channel] (epilogue >= 1), then relu (epilogue 2; NaN is kept); channel < channels.
__device__ __forceinline__ acc_t epilogue_value(acc_t v, const elem_t* __restrict__ bias, int channel, int epilogue) {
    if (epilogue >= 1) v += to_acc(bias[channel]);
    if (epilogue == 2) v = v < acc_t(0) ? acc_t(0) : v;
    return v;
}

// GEMM row -> row of the output matrix: the identity except for dgrad's stride phases.
struct SameRows {
    __device__ __forceinline__ long long operator()(long long m) const { return m; }
};
struct PhaseRows {
    const ConvGeom& g;
    const DgradPhase& phase;
    __device__ __forceinline__ long long operator()(long long m) const { return phase.out_row(g, m); }
};
// row[s]: the output row out_row(m) of this thread's row slot s (GEMM row m), -1 where m >= rows.
// 32-bit (output rows < 2^31, checked by the launcher: check_gemm): 64-bit offsets cost the
// tiles with the most rows per thread a spill. out_row runs for every slot, then the select: no
// branch, so the divisions' reciprocals (one per divisor) are shared by all rows.
template <int MODE, class RowMap>
__device__ __forceinline__ void thread_out_rows(int (&row)[ThreadRows<MODE>::count], long long rows,
                                                const RowMap& out_row) {
#pragma unroll
    for (int s = 0; s < ThreadRows<MODE>::count; ++s) {
        const long long m = (long long)blockIdx.x * CONV_BM + slot_row<MODE>(s);
        const int mapped = (int)out_row(m);
        row[s] = m < rows ? mapped : -1;
    }
}
// The element offset of (row, channel) in a (rows, channels) matrix, row >= 0: unsigned, so the
// 64-bit product needs no sign extension (one wide multiply-add).
__device__ __forceinline__ unsigned long long out_offset(int row, int channels, int channel) {
    return (unsigned long long)(unsigned)row * (unsigned)channels + (unsigned)channel;
}

#if CONV_MATH != 0
// Two 16-bit outputs in one 32-bit word (low: the first).
__device__ __forceinline__ unsigned pack_out2(float lo, float hi) {
    if constexpr (gpuk_same_type<elem_t, __half>::value) return pack_half2(lo, hi);
    else return pack_bfloat162(lo, hi);
}
// The 16-bit MMA epilogue. A lane holds columns (2t, 2t+1) of two neighbouring 8-column MMA
// tiles (t = lane % 4), per row gr and gr + 8. Within each quad the 16 columns are regrouped by
// 4 shuffles so that lane t holds columns 4t..4t+3: one 8-byte store per lane, and the 8 rows x 32
// bytes of a warp's store are whole sectors.
template <int MODE, class RowMap>
__device__ __forceinline__ void store_tile_16bit(const acc_t (&acc)[ACC_COUNT], long long rows, int channels,
                                                 const elem_t* __restrict__ bias, int epilogue,
                                                 elem_t* __restrict__ out, const RowMap& out_row) {
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, t = lane & 3;
    const bool vector = channels % 4 == 0 && is_aligned(out, 8);
    const int src = (lane & ~3) | ((t & 1) << 1);   // the lane holding columns 4t, 4t+1 of its tile
    int out_rows[ThreadRows<MODE>::count];
    thread_out_rows<MODE>(out_rows, rows, out_row);
#pragma unroll
    for (int mi = 0; mi < MMA_M_TILES; ++mi)
#pragma unroll
        for (int ni = 0; ni < MMA_N_TILES; ni += 2)
#pragma unroll
            for (int h = 0; h < 2; ++h) {
                const int first = blockIdx.y * CONV_BN + (warp % CONV_WARPS_N) * WARP_TILE_N + ni * 8;
                unsigned word[2];
#pragma unroll
                for (int u = 0; u < 2; ++u) {
                    const int e = ((mi * MMA_N_TILES + ni + u) * 2 + h) * 2, channel = first + u * 8 + 2 * t;
                    const acc_t v0 = channel < channels ? epilogue_value(acc[e], bias, channel, epilogue) : acc_t(0);
                    const acc_t v1 =
                        channel + 1 < channels ? epilogue_value(acc[e + 1], bias, channel + 1, epilogue) : acc_t(0);
                    word[u] = pack_out2(v0, v1);
                }
                const unsigned a0 = __shfl_sync(0xffffffffu, word[0], src), a1 = __shfl_sync(0xffffffffu, word[1], src);
                const unsigned b0 = __shfl_sync(0xffffffffu, word[0], src + 1);
                const unsigned b1 = __shfl_sync(0xffffffffu, word[1], src + 1);
                const unsigned lo = t >= 2 ? a1 : a0, hi = t >= 2 ? b1 : b0;   // columns 4t, 4t+1 and 4t+2, 4t+3
                const int row = out_rows[2 * mi + h];   // the slot of row 16 mi + gr + 8 h (acc_position)
                const int channel = first + 4 * t;
                if (row < 0 || channel >= channels) continue;
                unsigned short* dst = reinterpret_cast<unsigned short*>(out + out_offset(row, channels, channel));
                if (vector) {
                    *reinterpret_cast<uint2*>(dst) = make_uint2(lo, hi);
                } else {
                    const unsigned short bits[4] = {(unsigned short)lo, (unsigned short)(lo >> 16),
                                                    (unsigned short)hi, (unsigned short)(hi >> 16)};
#pragma unroll
                    for (int q = 0; q < 4; ++q)
                        if (channel + q < channels) dst[q] = bits[q];
                }
            }
}
#endif

// Writes this block's accumulator tile (rows GEMM rows, `channels` GEMM columns) to a
// (rows, channels) row-major matrix (a channels_last activation, dw, split partials), GEMM row
// m going to output row out_row(m), with the epilogue: 0 none, 1 + bias[c], 2 + bias[c] then relu.
template <int MODE, class T, class RowMap>
__device__ __forceinline__ void store_tile(const acc_t (&acc)[ACC_COUNT], long long rows, int channels,
                                           const elem_t* __restrict__ bias, int epilogue, T* __restrict__ out,
                                           const RowMap& out_row) {
#if CONV_MATH != 0
    if constexpr (sizeof(T) == 2) {
        store_tile_16bit<MODE>(acc, rows, channels, bias, epilogue, out, out_row);
        return;
    }
#endif
    constexpr int LEN = EpilogueRun<MODE>::len;
    const bool vector = channels % LEN == 0 && is_aligned(out, LEN * sizeof(T));
    int out_rows[ThreadRows<MODE>::count];
    thread_out_rows<MODE>(out_rows, rows, out_row);
#pragma unroll
    for (int e = 0; e < ACC_COUNT; e += LEN) {
        int slot, c;
        acc_position<MODE>(e, slot, c);
        const int row = out_rows[slot];
        const int channel = blockIdx.y * CONV_BN + c;
        if (row < 0 || channel >= channels) continue;
        T* dst = out + out_offset(row, channels, channel);
        if (vector) {
            ValueRun<T, LEN> run;
#pragma unroll
            for (int q = 0; q < LEN; ++q) run.v[q] = out_value<T>(epilogue_value(acc[e + q], bias, channel + q, epilogue));
            *reinterpret_cast<ValueRun<T, LEN>*>(dst) = run;
        } else {
#pragma unroll
            for (int q = 0; q < LEN; ++q)
                if (channel + q < channels) dst[q] = out_value<T>(epilogue_value(acc[e + q], bias, channel + q, epilogue));
        }
    }
}
