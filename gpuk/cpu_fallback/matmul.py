"""NumPy twin of gpuk/kernels/matmul.py: half-precision matrix products.

float16 and bfloat16 (ml_dtypes.bfloat16) operands are multiplied and summed in float32,
the way tensor cores do (cuBLAS with CUBLAS_COMPUTE_32F): the product of two such numbers
is exact in float32, so only the float32 sums and the final rounding to the operands'
dtype differ from the GPU's, by float32 rounding. float32/float64 go to NumPy's matmul.
"""
import ml_dtypes
import numpy as np

from gpuk.cpu_fallback.layout import compute_dtype

__all__ = ['matmul', 'contiguous_operand']

HALF_DTYPES = (np.dtype(np.float16), np.dtype(ml_dtypes.bfloat16))
_FLOAT_NAMES = 'float16, bfloat16, float32 or float64'

# MatMul's float32/float64 products on the NumPy device are np.matmul's own new arrays: the
# reused step buffers are the kernel runtimes' arena (gpuk/kernels/matmul.py says True).
FLOAT_PRODUCTS_IN_STEP_BUFFERS = False


def check_operands(fn, a, b, xp):
    """The shared checks of twin and launcher: two arrays of one float dtype, rank >= 2,
    matching inner dims and broadcastable batch dims."""
    for name, value in (('a', a), ('b', b)):
        if not isinstance(value, xp.ndarray):
            raise TypeError('%s: %s must be a %s.ndarray, got %s' % (fn, name, xp.__name__, type(value).__name__))
        if not (np.issubdtype(value.dtype, np.floating) or value.dtype == ml_dtypes.bfloat16):
            raise TypeError('%s: %s must be a %s array, got dtype %s' % (fn, name, _FLOAT_NAMES, value.dtype))
        if value.ndim < 2:
            raise ValueError('%s: %s needs rank >= 2, got shape %s' % (fn, name, tuple(value.shape)))
    if a.dtype != b.dtype:
        raise TypeError('%s: a and b must have the same dtype, got %s and %s' % (fn, a.dtype, b.dtype))
    if a.shape[-1] != b.shape[-2]:
        raise ValueError('%s: inner dimensions differ: shapes %s and %s' % (fn, tuple(a.shape), tuple(b.shape)))
    try:
        batch = np.broadcast_shapes(a.shape[:-2], b.shape[:-2])
    except ValueError:
        raise ValueError('%s: batch dimensions do not broadcast: shapes %s and %s'
                         % (fn, tuple(a.shape), tuple(b.shape))) from None
    return tuple(batch)


def matmul(a, b):
    """``a @ b`` (np.matmul semantics for rank >= 2; batch dims broadcast) in a's dtype;
    float16/bfloat16 accumulate in float32."""
    check_operands('matmul', a, b, np)
    compute = compute_dtype(a.dtype)
    if compute == a.dtype:
        return np.matmul(a, b)
    return np.matmul(a.astype(compute), b.astype(compute)).astype(a.dtype)


# contiguous_operand's blocked transposing copy: columns per block (one 64-byte cache line of
# each destination row), and the fewest rows for which a block's copy outweighs its Python call
# (measured on the benchmark VM: (512, 128) and (384, 128) views of float32 gain, (128, 512),
# (32, 512) and (64, 64) ones lose to NumPy's own copy).
_TRANSPOSE_BLOCK_BYTES = 64
_TRANSPOSE_BLOCKED_MIN_ROWS = 256


def contiguous_operand(x):
    """``x`` as a C-contiguous array (``x`` itself when it is one): a loop invariant a scan's
    steps multiply by, copied once per loop because a strided GEMM operand is slower (a
    recurrent kernel's transpose: dz @ U.T 90 us against 53 us contiguous, per time step).
    A tall transposed matrix (2-D, F-contiguous, at least _TRANSPOSE_BLOCKED_MIN_ROWS rows and
    two blocks of columns) is copied in column blocks of one cache line: NumPy's own
    transposing copy of the LSTM(128)'s (512, 128) float32 U.T takes 152 us on the benchmark
    VM (its source rows 2 KiB apart), blocked 33 us, once per training step. The values are
    the same, only the order of the copy differs."""
    x = np.asarray(x)
    block = max(1, _TRANSPOSE_BLOCK_BYTES // x.itemsize)
    if (x.ndim != 2 or x.flags.c_contiguous or not x.flags.f_contiguous
            or x.shape[0] < _TRANSPOSE_BLOCKED_MIN_ROWS or x.shape[1] < 2 * block):
        return np.asarray(x, order='C')   # (a 0-d value stays 0-d, as ascontiguousarray's would not)
    out = np.empty(x.shape, x.dtype)
    for start in range(0, x.shape[1], block):
        out[:, start:start + block] = x[:, start:start + block]
    return out
