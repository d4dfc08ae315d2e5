"""Half-precision matrix products on tensor cores through cuBLAS (via CuPy).

Same name and signature as gpuk/cpu_fallback/matmul.py, plus a keyword-only ``runtime``.
On the CUDA runtime, float16 and bfloat16 operands go to ``cublasGemmStridedBatchedEx``
with CUBLAS_COMPUTE_32F (float32 accumulation on tensor cores) and a result in the
operands' dtype. CuPy's own matmul is not used for them: CuPy has no bfloat16 GEMM path
of its own, and calling cuBLAS directly keeps both dtypes on one path with the compute
type stated. float32/float64 and the emulated runtime (cuBLAS cannot be emulated) use
the twin, i.e. NumPy's matmul on the host arrays the emulator works on.

Row-major trick: cuBLAS is column-major, and a row-major (M, N) matrix is a column-major
(N, M) one, so C = A @ B is computed as the column-major C^T = B^T A^T: cuBLAS gets
m=N, n=M, k=K, B first (ld N), then A (ld K), C with ld N, no transposes. Batch dims
broadcast: an operand without batch dims (a Dense layer's kernel) gets stride 0, any
other is broadcast to the common batch shape and made contiguous.
"""
import math

import ml_dtypes
import numpy as np

from gpuk.cpu_fallback import matmul as twin
from .runtime import counters, device_pointer, prepared, resolve

__all__ = list(twin.__all__)

# library_types.h (cudaDataType_t) and cublas_api.h (cublasComputeType_t, cublasGemmAlgo_t)
CUDA_DATA_TYPES = {np.dtype(np.float16): 2, np.dtype(ml_dtypes.bfloat16): 14}   # CUDA_R_16F, CUDA_R_16BF
CUBLAS_OP_N = 0
CUBLAS_COMPUTE_32F = 68
CUBLAS_GEMM_DEFAULT = -1
CUBLAS_POINTER_MODE_HOST = 0
# alpha and beta are read from host memory as float32 (the compute type's scalar type)
_ONE = np.ones(1, np.float32)
_ZERO = np.zeros(1, np.float32)

# MatMul's float32/float64 products (xp.matmul, not this module's matmul) go through a plan
# step's kept runner into its reused output buffers (prepared.StepBuffers), the kernel
# runtimes' arena of plain launches; the twin says False.
FLOAT_PRODUCTS_IN_STEP_BUFFERS = True


def _batched(xp, array, batch):
    """(array with its batch dims flattened and contiguous, batch stride in elements)."""
    rows, cols = array.shape[-2:]
    if all(d == 1 for d in array.shape[:-2]):
        return xp.ascontiguousarray(array.reshape(rows, cols)), 0
    full = xp.broadcast_to(array, batch + (rows, cols))
    return xp.ascontiguousarray(full), rows * cols


def gemm_arguments(a, b, out, xp):
    """The arguments of cublasGemmStridedBatchedEx after the handle for out = a @ b (all
    three C-contiguous after batching; a tuple, with the arrays that must stay alive)."""
    batch = tuple(out.shape[:-2])
    m, k = a.shape[-2:]
    n = b.shape[-1]
    a_rows, stride_a = _batched(xp, a, batch)
    b_rows, stride_b = _batched(xp, b, batch)
    dtype = CUDA_DATA_TYPES[np.dtype(a.dtype)]
    count = math.prod(batch)
    args = (CUBLAS_OP_N, CUBLAS_OP_N, n, m, k, _ONE.ctypes.data,
            device_pointer(b_rows), dtype, n, stride_b,
            device_pointer(a_rows), dtype, k, stride_a,
            _ZERO.ctypes.data, device_pointer(out), dtype, n, m * n,
            count, CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT)
    return args, (a_rows, b_rows)


def contiguous_operand(x, *, runtime=None):
    """``x`` as a C-contiguous array (``x`` itself when it is one): a loop invariant a scan's
    steps multiply by, copied once per loop (the twin's docstring says why); CuPy's (or on
    the emulated runtime NumPy's) own copy."""
    xp = resolve(runtime).xp
    return xp.asarray(x, order='C')


def matmul(a, b, *, runtime=None):
    """``a @ b`` in a's dtype (batch dims broadcast); float16/bfloat16 accumulate in float32."""
    rt = resolve(runtime)
    xp = rt.xp
    # shapes and dtypes checked once per problem signature (runtime/prepared.py)
    batch = prepared.get(rt, 'matmul', (a, b), (), lambda: twin.check_operands('matmul', a, b, xp))
    if rt.kind != 'cuda' or np.dtype(a.dtype) not in CUDA_DATA_TYPES:
        return twin.matmul(a, b) if xp is np else xp.matmul(a, b)
    out = xp.empty(batch + (a.shape[-2], b.shape[-1]), a.dtype)
    if out.size == 0 or a.shape[-1] == 0:
        out[...] = 0
        return out
    from cupy import cuda   # spelled out in full below: test_cupy_conformance checks the chains
    handle = cuda.get_cublas_handle()
    args, _alive = gemm_arguments(a, b, out, xp)
    cuda.cublas.setStream(handle, cuda.get_current_stream().ptr)
    cuda.cublas.setPointerMode(handle, CUBLAS_POINTER_MODE_HOST)
    counters.device_call(cuda.cublas.gemmStridedBatchedEx, handle, *args)
    return out
