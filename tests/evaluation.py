"""Shared helpers of the K-level tests: evaluate a graph on arrays (checking its static
shape and dtype), the tolerance policy, and data layouts."""
import numpy as np

from gpuk import backend as K

# Relative error allowed against a float64 reference, per result dtype.
TOLERANCE = {'float16': 2e-3, 'float32': 1e-5, 'float64': 1e-12}


def evaluate(build, *arrays, unknown=()):
    """``build(*placeholders)`` evaluated on ``arrays``; the axes listed in ``unknown`` are None
    in every placeholder. Checks the static shape and dtype against the evaluated result."""
    placeholders = [K.placeholder(shape=tuple(None if i in unknown else d for i, d in enumerate(a.shape)),
                                  dtype=a.dtype.name) for a in arrays]
    out = build(*placeholders)
    value = K.function(placeholders, [out])(list(arrays))[0]
    static = K.int_shape(out)
    assert len(static) == value.ndim and all(s in (None, v) for s, v in zip(static, value.shape)), \
        (static, value.shape)
    assert K.dtype(out) == value.dtype.name
    return value


def assert_close(got, want, dtype):
    """``got`` within the tolerance of ``dtype`` (exact for integer and bool results)."""
    tol = TOLERANCE.get(np.dtype(dtype).name, 0)
    np.testing.assert_allclose(np.asarray(got, np.float64), np.asarray(want, np.float64), rtol=tol, atol=tol)


def assert_close_to_scale(got, ref, dtype, tol):
    """``got`` of ``dtype`` and ref's shape, within ``tol`` of the float64 ``ref`` relatively and
    relative to ref's largest magnitude (so near-zero elements of a sum pass)."""
    assert got.dtype == dtype
    assert got.shape == ref.shape
    scale = max(np.abs(ref).max(), 1e-30)
    np.testing.assert_allclose(got.astype(np.float64), ref, rtol=tol, atol=tol * scale)


def layout(n, spatial, channels, data_format):
    """The shape of a batch of ``spatial`` images with ``channels`` in ``data_format``."""
    if data_format == 'channels_first':
        return (n, channels) + tuple(spatial)
    return (n,) + tuple(spatial) + (channels,)


def to_cl(a, data_format):
    """``a`` (batch first) with its channels last."""
    return np.moveaxis(a, 1, -1) if data_format == 'channels_first' else a


def from_cl(a, data_format):
    """A channels-last ``a`` in ``data_format``."""
    return np.moveaxis(a, -1, 1) if data_format == 'channels_first' else a


def plan_ops(f):
    """The ops of a compiled K.function's plan, in run order (after fusion)."""
    return [forward.__self__ for forward, _, _, _ in f._plan.steps]


def compiled_with_fusion(monkeypatch, fusion, inputs, outputs, updates=None):
    """K.function(inputs, outputs, updates) compiled with plan-time fusion on or off."""
    monkeypatch.setenv('GPUK_FUSION', '1' if fusion else '0')
    f = K.function(inputs, outputs, updates=updates)
    f._compiled()
    return f

