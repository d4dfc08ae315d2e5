// ctc_check.cu: the value check of a CTC loss's labels and lengths (Keras's ctc_batch_cost
// convention: the blank is the last class and ends a label), and their conversion to the int64
// arrays the loss kernels read, in one launch. Launched by gpuk/kernels/ctc.py
// (ctc_check_loss_values), which #defines CTC_CHECK_THREADS; the NumPy twin is
// gpuk/cpu_fallback/ctc.py's ctc_check_loss_values.
//
// It replaces about 40 array operations per call (a CuPy kernel launch and a temporary each
// on a GPU). The flag it writes is read after the step (gpuk/kernels/runtime/deferred.py), where a
// set flag runs the host check that raises the error message; the converted arrays are safe to
// index with meanwhile (lengths clamped, a bad label written as -1, which the loss kernels read
// as the blank).
//
// Inputs come as Keras feeds them: labels (N, L), input_lengths (N,), label_lengths (N,), each
// of any integer or float16/32/64 dtype (a CheckType code per array), contiguous. Outputs:
//   label_lengths_out[n]  the label length clamped to [0, L], cut at its first label >= A - 1;
//   input_lengths_out[n]  the input length clamped to [0, T] (NaN: 0);
//   labels_out[n, k]      the label as int64 for k < label_lengths_out[n] when it is whole and
//                         >= 0, -1 otherwise (past the cut, or a bad label);
//   bad[0]                1 when a value is not allowed: a length not whole or outside [0, T] /
//                         [0, L], a label within the cut length not whole or negative, a label
//                         past the cut but within the length that is not >= A - 1 (TensorFlow:
//                         "a non-null label following a null label"); else 0.
//
// Thread mapping: ONE block (the flag is one value, written by one thread after a block-wide
// OR; a multi-block grid would need a zeroed flag, another operation). First a warp per
// sample (warps stride over the batch): the lengths, and the cut found by a ballot over 32
// label positions at a time (reads within a row are coalesced), the rest of the row up to its
// length read on to check that only blanks follow the cut. Then the threads stride over
// the N x L labels, reads and writes coalesced. One __syncthreads between the two passes (the
// cut lengths), one __syncthreads_or at the end. No atomics, no shared memory. Limits: sizes
// up to 2^63 (64-bit offsets); one block does O(N L / CTC_CHECK_THREADS) work per thread,
// microseconds for a training batch's labels.
#include "common.cuh"

#ifndef CTC_CHECK_THREADS
#define CTC_CHECK_THREADS 256
#endif

// The element type of a raw input: the launcher's CHECK_TYPE_CODES lists the same order.
enum CheckType {
    CHECK_INT8, CHECK_INT16, CHECK_INT32, CHECK_INT64, CHECK_UINT8, CHECK_UINT16, CHECK_UINT32,
    CHECK_UINT64, CHECK_FLOAT16, CHECK_FLOAT32, CHECK_FLOAT64
};

// Element i as a double: exact for every float and for integers up to 2^53; a larger integer
// rounds, which keeps every comparison with a length bound or a class count right.
__device__ __forceinline__ double load_as_double(const void* values, int type, long long i) {
    switch (type) {
    case CHECK_INT8: return static_cast<const signed char*>(values)[i];
    case CHECK_INT16: return static_cast<const short*>(values)[i];
    case CHECK_INT32: return static_cast<const int*>(values)[i];
    case CHECK_INT64: return (double)static_cast<const long long*>(values)[i];
    case CHECK_UINT8: return static_cast<const unsigned char*>(values)[i];
    case CHECK_UINT16: return static_cast<const unsigned short*>(values)[i];
    case CHECK_UINT32: return static_cast<const unsigned*>(values)[i];
    case CHECK_UINT64: return (double)static_cast<const unsigned long long*>(values)[i];
    case CHECK_FLOAT16: return __half2float(static_cast<const __half*>(values)[i]);
    case CHECK_FLOAT32: return static_cast<const float*>(values)[i];
    default: return static_cast<const double*>(values)[i];
    }
}

// Finite and a whole number (NaN and inf are not: v - v is NaN for them).
__device__ __forceinline__ bool is_whole(double v) { return v - v == 0.0 && floor(v) == v; }

__device__ __forceinline__ bool length_allowed(double v, long long upper) {
    return is_whole(v) && v >= 0.0 && v <= (double)upper;
}

// A length clamped to [0, upper] and truncated (NaN: 0): what the kernels index with.
__device__ __forceinline__ long long clamped_length(double v, long long upper) {
    if (!(v > 0.0)) return 0;
    return v >= (double)upper ? upper : (long long)v;
}

extern "C" __global__ void __launch_bounds__(CTC_CHECK_THREADS)
ctc_check_inputs(const void* __restrict__ labels, int labels_type, const void* __restrict__ input_lengths,
                 int input_lengths_type, const void* __restrict__ label_lengths, int label_lengths_type,
                 long long* __restrict__ labels_out, long long* __restrict__ input_lengths_out,
                 long long* __restrict__ label_lengths_out, long long* __restrict__ bad, long long batch,
                 long long width, long long steps, long long classes) {
    const long long warps = blockDim.x >> 5;
    const unsigned lane = threadIdx.x & 31u;
    const double label_end = (double)(classes - 1);   // the blank, or beyond: ends a label
    int found_bad = 0;
    for (long long n = threadIdx.x >> 5; n < batch; n += warps) {   // uniform per warp
        const double t = load_as_double(input_lengths, input_lengths_type, n);
        const double l = load_as_double(label_lengths, label_lengths_type, n);
        const long long l_n = clamped_length(l, width);
        long long cut = l_n;
        for (long long base = 0; base < l_n; base += 32) {   // uniform per warp (cut, the ballot)
            const long long k = base + lane;
            const bool ends = k < l_n && load_as_double(labels, labels_type, n * width + k) >= label_end;
            if (cut == l_n) {
                const unsigned hits = __ballot_sync(GPUK_FULL_MASK, ends);
                if (hits) cut = base + __ffs((int)hits) - 1;
            }
            // past the cut, within the length, every label must end one too (NaN does not)
            found_bad |= k > cut && k < l_n && !ends;
        }
        if (lane == 0) {
            input_lengths_out[n] = clamped_length(t, steps);
            label_lengths_out[n] = cut;
            found_bad |= !length_allowed(t, steps) || !length_allowed(l, width);
        }
    }
    __syncthreads();   // every cut length is written before the labels pass reads it
    const long long count = batch * width;
    for (long long i = threadIdx.x; i < count; i += blockDim.x) {
        const long long n = i / width, k = i - n * width;
        long long out = -1;
        if (k < label_lengths_out[n]) {
            const double v = load_as_double(labels, labels_type, i);
            if (is_whole(v) && v >= 0.0) out = (long long)v;   // < A - 1 here: below the cut
            else found_bad = 1;
        }
        labels_out[i] = out;
    }
    found_bad = __syncthreads_or(found_bad);
    if (threadIdx.x == 0) bad[0] = found_bad;
}
