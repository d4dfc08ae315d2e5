"""Test helpers for kernels: moving arrays to a runtime, the tolerance policy, the twin's errors.

Policy: a kernel's result is compared with a float64 reference (the NumPy twin run on
inputs cast to float64) by the norm-wise relative error max|out - ref| / max|ref|,
which must stay under TOLERANCE[dtype of the kernel's inputs]. NaN must match NaN.

The 16-bit entries are about four units of the output's one rounding, the error that
dominates when products and sums run in float32: float16 rounds to 11 significant bits
(2^-11 = 4.9e-4, tolerance 2e-3), bfloat16 to 8 (2^-8 = 3.9e-3, tolerance 1.5e-2).
Casting 16-bit inputs to float64 is exact, so the reference sees the rounded inputs the
kernel sees. A wrong fragment, tap or tile edge gives errors of order 1e-1 and above.
"""
import ml_dtypes
import numpy as np

from gpuk.contracts.dtypes import is_float_dtype
from gpuk.kernels.runtime import deferred

TOLERANCE = {np.dtype(np.float16): 2e-3, np.dtype(ml_dtypes.bfloat16): 1.5e-2, np.dtype(np.float32): 1e-5,
             np.dtype(np.float64): 1e-12}


def to_device(rt, a):
    """`a` (NumPy) as an array of the runtime's xp."""
    return rt.xp.asarray(a) if isinstance(a, np.ndarray) else a


def to_host(a):
    """A NumPy array from a NumPy or CuPy array."""
    return a.get() if hasattr(a, 'get') and not isinstance(a, np.ndarray) else np.asarray(a)


def relative_error(actual, reference):
    actual = to_host(actual).astype(np.float64)
    reference = np.asarray(reference, dtype=np.float64)
    if actual.shape != reference.shape:
        raise ValueError(f"relative_error: shapes differ: {actual.shape} vs {reference.shape}")
    nan_a, nan_r = np.isnan(actual), np.isnan(reference)
    if not np.array_equal(nan_a, nan_r):
        return np.inf
    finite = ~nan_r
    if not finite.any():
        return 0.0
    a, r = actual[finite], reference[finite]
    inf_r = np.isinf(r)
    if not np.array_equal(a[inf_r], r[inf_r]):
        return np.inf
    a, r = a[~inf_r], r[~inf_r]
    if a.size == 0:
        return 0.0
    return float(np.max(np.abs(a - r)) / max(float(np.max(np.abs(r))), np.finfo(np.float64).tiny))


def round_tf32(a):
    """float32 -> the tf32 value a tensor core multiplies for it in gpuk's kernels (float_to_tf32
    in common.cuh): rounded to 10 mantissa bits, to nearest with ties to even; inf and NaN kept
    (a NaN whose payload lies only in the 13 dropped bits reads as inf, as on sm_80 and in the
    emulator; sm_90's cvt.rn.tf32.f32 keeps it a NaN)."""
    a = np.ascontiguousarray(a, np.float32)
    bits = a.view(np.uint32)
    rounded = ((bits + np.uint32(0xfff) + ((bits >> np.uint32(13)) & np.uint32(1))) & np.uint32(0xffffe000))
    kept = bits & np.uint32(0xffffe000)
    return np.where(np.isfinite(a), rounded, kept).view(np.float32)


def assert_close(actual, reference, dtype, what='result'):
    """Assert the policy for inputs of `dtype`; the message names the error and tolerance."""
    tol = TOLERANCE[np.dtype(dtype)]
    err = relative_error(actual, reference)
    if not err <= tol:
        raise AssertionError(f"{what}: relative error {err:.3g} exceeds {tol:.1g} for {np.dtype(dtype)} inputs")


def assert_matches_twin(kernel_fn, twin_fn, args, rt, kwargs=None):
    """Run kernel_fn on `rt` and twin_fn on float64 copies of the float inputs; compare.

    args are NumPy arrays or plain values; each output's dtype and shape must equal the
    twin's on the original dtypes. Returns the kernel output as NumPy (a tuple of them when
    the function returns a tuple)."""
    kwargs = kwargs or {}
    floats = [a for a in args if isinstance(a, np.ndarray) and is_float_dtype(a.dtype)]
    dtype = floats[0].dtype if floats else np.dtype(np.float64)
    out = kernel_fn(*[to_device(rt, a) for a in args], runtime=rt, **kwargs)
    expected = twin_fn(*args, **kwargs)
    ref = twin_fn(*[a.astype(np.float64) if isinstance(a, np.ndarray) and is_float_dtype(a.dtype) else a
                    for a in args], **kwargs)
    several = isinstance(out, tuple)
    outs, expected, ref = [v if several else (v,) for v in (out, expected, ref)]
    results = []
    for o, e, r in zip(outs, expected, ref):
        o = to_host(o)
        if o.dtype != e.dtype or o.shape != e.shape:
            raise AssertionError(f"{kernel_fn.__name__}: dtype {o.dtype} shape {o.shape}, "
                                 f"twin gives {e.dtype} {e.shape}")
        assert_close(o, r, dtype, kernel_fn.__name__)
        results.append(o)
    return tuple(results) if several else results[0]


def assert_same_error(kernel_fn, twin_fn, args, kwargs=None):
    """twin_fn raises a ValueError or TypeError on ``args``, and kernel_fn on the emulated runtime
    raises the same type with the same message: at the call, or where its results are read when
    the launcher checks the values on the device (runtime/deferred.py); no check is left pending."""
    kwargs = kwargs or {}
    try:
        twin_fn(*args, **kwargs)
    except (ValueError, TypeError) as error:
        expected = error
    else:
        raise AssertionError(f"{twin_fn.__name__}: raised no ValueError or TypeError")
    try:
        kernel_fn(*args, runtime='emulate', **kwargs)
        deferred.raise_pending()   # value checks run on the device and raise where results are read
    except type(expected) as error:
        if str(error) != str(expected):
            raise AssertionError(f"{kernel_fn.__name__} raised {error!r}, the twin {expected!r}") from error
    else:
        raise AssertionError(f"{kernel_fn.__name__}: raised nothing, the twin {expected!r}")
    if deferred.pending_count():
        raise AssertionError(f"{kernel_fn.__name__}: {deferred.pending_count()} value checks left pending")


def assert_same_steps(reused, fresh):
    """Training runs that must agree bit for bit (each a list of steps, each a list of values:
    with the plan steps' reused buffers and with fresh ones), and whose steps did differ (the
    first value of the first two steps), so that agreeing is not agreeing on a constant."""
    for step, (got_values, want_values) in enumerate(zip(reused, fresh)):
        for k, (got, want) in enumerate(zip(got_values, want_values)):
            if not np.array_equal(got, want):
                raise AssertionError(f"step {step}, value {k}: reused buffers gave other numbers than fresh ones")
    if np.array_equal(reused[0][0], reused[1][0]):
        raise AssertionError("the first two steps gave the same first value: agreeing proves nothing")
