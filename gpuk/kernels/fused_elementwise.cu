// fused_elementwise.cu: the template of every fused elementwise kernel (gpuk/fusion_elementwise.py
// groups a plan's elementwise steps; gpuk/kernels/fused_elementwise.py launches them).
// The launcher #defines the program: FUSED_N_IN inputs and FUSED_N_OUT outputs with their
// element types IN<k>_T / OUT<k>_T, the output rank FUSED_RANK, and FUSED_BODY, the
// statements computing one element: `v<j>` locals, one per op, each the op's own C
// expression (UNARY_C / BINARY_C next to the ops in gpuk/ops) in its compute type, read
// from LOAD(k) and written with STORE(k, value). Unused pointer slots get 1-element dummies.
//
// Thread mapping: 1-D grid-stride loop over the n elements of the (common) output shape
//   dims[0..FUSED_RANK); each thread unravels its index and adds, per input, coordinate times
//   that input's element stride (0 along broadcast dims): strides[k * FUSED_RANK + d]. The
//   launcher merges dims every input walks contiguously, so same-shape inputs and scalars
//   give FUSED_RANK 1: offset = i * stride, no division.
// Precision: each op's operands are promoted as NumPy promotes them and computed in float
//   (float16/float32) or double (float64); a float16 result is rounded to half right away,
//   as NumPy rounds each op. Values are bool or float16/32/64.
// Inputs read in place (FUSED_OFFSETS defined: views such as a GRU's gate slices of its matrix
//   products, passed as one contiguous span of their memory each, shared by the views of one
//   array): each input's first element sits at element strides[FUSED_N_IN * FUSED_RANK + k]
//   of its pointer, and its strides are the view's. Without FUSED_OFFSETS every input starts
//   at its pointer (the kernel compiles as before).
// Limits: FUSED_MAX_IN inputs, FUSED_MAX_OUT outputs, rank <= FUSED_MAX_RANK; 64-bit
//   offsets. No shared memory, no atomics; outputs are C-contiguous and never alias inputs.
#include "common.cuh"

#define FUSED_MAX_IN 16
#define FUSED_MAX_OUT 4
#define FUSED_MAX_RANK 8
#ifndef FUSED_THREADS
#define FUSED_THREADS 256
#endif
#ifndef FUSED_N_IN
#define FUSED_N_IN 1
#endif
#ifndef FUSED_N_OUT
#define FUSED_N_OUT 1
#endif
#ifndef FUSED_RANK
#define FUSED_RANK 1
#endif
#ifndef FUSED_BODY
#define FUSED_BODY STORE(0, LOAD(0));
#endif
#ifndef IN0_T
#define IN0_T float
#endif
#ifndef IN1_T
#define IN1_T float
#endif
#ifndef IN2_T
#define IN2_T float
#endif
#ifndef IN3_T
#define IN3_T float
#endif
#ifndef IN4_T
#define IN4_T float
#endif
#ifndef IN5_T
#define IN5_T float
#endif
#ifndef IN6_T
#define IN6_T float
#endif
#ifndef IN7_T
#define IN7_T float
#endif
#ifndef IN8_T
#define IN8_T float
#endif
#ifndef IN9_T
#define IN9_T float
#endif
#ifndef IN10_T
#define IN10_T float
#endif
#ifndef IN11_T
#define IN11_T float
#endif
#ifndef IN12_T
#define IN12_T float
#endif
#ifndef IN13_T
#define IN13_T float
#endif
#ifndef IN14_T
#define IN14_T float
#endif
#ifndef IN15_T
#define IN15_T float
#endif
#ifndef OUT0_T
#define OUT0_T float
#endif
#ifndef OUT1_T
#define OUT1_T float
#endif
#ifndef OUT2_T
#define OUT2_T float
#endif
#ifndef OUT3_T
#define OUT3_T float
#endif

typedef IN0_T in0_t;
typedef IN1_T in1_t;
typedef IN2_T in2_t;
typedef IN3_T in3_t;
typedef IN4_T in4_t;
typedef IN5_T in5_t;
typedef IN6_T in6_t;
typedef IN7_T in7_t;
typedef IN8_T in8_t;
typedef IN9_T in9_t;
typedef IN10_T in10_t;
typedef IN11_T in11_t;
typedef IN12_T in12_t;
typedef IN13_T in13_t;
typedef IN14_T in14_t;
typedef IN15_T in15_t;
typedef OUT0_T out0_t;
typedef OUT1_T out1_t;
typedef OUT2_T out2_t;
typedef OUT3_T out3_t;

// bool values (comparisons, where's condition) load, compute and store as themselves.
__device__ __forceinline__ bool to_acc(bool x) { return x; }
template <> struct ElementTraits<bool> {
    typedef bool acc;
    __device__ __forceinline__ static bool from_acc(bool x) { return x; }
};

// A value of type T rounded to element type E and back (float16 results of float ops).
template <class E, class T> __device__ __forceinline__ T round_to(T v) {
    return (T)to_acc(ElementTraits<E>::from_acc(v));
}

// the element offset of input k's first element in its pointer (see FUSED_OFFSETS above)
#ifdef FUSED_OFFSETS
#define FUSED_FIRST(k) strides[FUSED_N_IN * FUSED_RANK + (k)]
#else
#define FUSED_FIRST(k) 0
#endif
#define LOAD(k) to_acc(in##k[offset[k]])
#define STORE(k, value) out##k[i] = ElementTraits<out##k##_t>::from_acc(value)

extern "C" __global__ void __launch_bounds__(FUSED_THREADS)
fused_elementwise(const in0_t* __restrict__ in0, const in1_t* __restrict__ in1,
                  const in2_t* __restrict__ in2, const in3_t* __restrict__ in3,
                  const in4_t* __restrict__ in4, const in5_t* __restrict__ in5,
                  const in6_t* __restrict__ in6, const in7_t* __restrict__ in7,
                  const in8_t* __restrict__ in8, const in9_t* __restrict__ in9,
                  const in10_t* __restrict__ in10, const in11_t* __restrict__ in11,
                  const in12_t* __restrict__ in12, const in13_t* __restrict__ in13,
                  const in14_t* __restrict__ in14, const in15_t* __restrict__ in15,
                  out0_t* __restrict__ out0, out1_t* __restrict__ out1,
                  out2_t* __restrict__ out2, out3_t* __restrict__ out3,
                  const long long* __restrict__ dims, const long long* __restrict__ strides,
                  long long n) {
    GPUK_GRID_STRIDE_LOOP(i, n) {
        long long offset[FUSED_N_IN];
#if FUSED_RANK == 1
        // one (collapsed) dim: no division; stride 1 (same shape as the output) or 0 (a scalar)
#pragma unroll
        for (int k = 0; k < FUSED_N_IN; ++k) offset[k] = FUSED_FIRST(k) + i * strides[k];
#else
#pragma unroll
        for (int k = 0; k < FUSED_N_IN; ++k) offset[k] = FUSED_FIRST(k);
        long long rest = i;
#pragma unroll
        for (int d = FUSED_RANK - 1; d >= 0; --d) {
            const long long extent = dims[d];
            const long long coordinate = rest % extent;
            rest /= extent;
#pragma unroll
            for (int k = 0; k < FUSED_N_IN; ++k) offset[k] += coordinate * strides[k * FUSED_RANK + d];
        }
#endif
        FUSED_BODY
    }
}
