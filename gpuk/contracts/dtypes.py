"""The dtype policy of the kernel families, one place for each rule.

- ``ELEMENT_TYPES``: the C type a kernel's ELEMENT_T / ACC_T is for each float dtype;
  ``bfloat16`` is ``ml_dtypes.bfloat16``, the NumPy dtype CuPy 14 adopted.
- ``accumulation_dtype``: what a sum, a statistic or a by-product (log-sum-exp, batch mean,
  CTC alphas) of a dtype is computed and kept in: 16-bit floats in float32, every other
  dtype in itself. The graph ops, the twins and the launchers all ask this function.
"""
import ml_dtypes
import numpy as np

__all__ = ['BFLOAT16', 'ELEMENT_TYPES', 'FLOAT_DTYPES', 'FLOAT_DTYPES_NO_BFLOAT16', 'accumulation_dtype',
           'is_float_dtype', 'c_types']

BFLOAT16 = np.dtype(ml_dtypes.bfloat16)
ELEMENT_TYPES = {np.dtype(np.float16): '__half', BFLOAT16: '__nv_bfloat16',
                 np.dtype(np.float32): 'float', np.dtype(np.float64): 'double'}
FLOAT_DTYPES = tuple(ELEMENT_TYPES)
# pooling, batch norm, CTC and the bias epilogue have no bfloat16 kernels; their twins refuse it too
FLOAT_DTYPES_NO_BFLOAT16 = tuple(d for d in FLOAT_DTYPES if d != BFLOAT16)
_SIXTEEN_BIT_FLOATS = (np.dtype(np.float16), BFLOAT16)


def accumulation_dtype(dtype):
    """16-bit floats (float16, bfloat16) accumulate in float32; every other dtype in itself."""
    dtype = np.dtype(dtype)
    return np.dtype(np.float32) if dtype in _SIXTEEN_BIT_FLOATS else dtype


def is_float_dtype(dtype):
    """A NumPy float or ml_dtypes.bfloat16 (whose dtype kind is 'V', not 'f')."""
    return np.issubdtype(dtype, np.floating) or dtype == BFLOAT16


def c_types(dtype):
    """(ELEMENT_T, ACC_T): the C element and accumulation types of a kernel variant."""
    dtype = np.dtype(dtype)
    return ELEMENT_TYPES[dtype], ELEMENT_TYPES[accumulation_dtype(dtype)]
