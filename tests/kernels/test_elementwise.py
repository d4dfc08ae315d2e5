"""elementwise kernels against their NumPy twins, on every kernel runtime."""
import numpy as np
import pytest

from gpuk.cpu_fallback import elementwise as twin
from gpuk.kernels import elementwise
from gpuk.kernels.testing import assert_matches_twin, to_device, to_host

DTYPES = [np.float16, np.float32, np.float64]


@pytest.mark.parametrize('dtype', DTYPES)
@pytest.mark.parametrize('shape, axis', [((3, 5, 7), 0), ((3, 5, 7), 1), ((3, 5, 7), -1), ((1031,), 0),
                                         ((2, 3, 33, 17), 1)])
@pytest.mark.parametrize('activation', ['linear', 'relu'])
def test_bias_act_fwd_matches_twin(kernel_runtime, dtype, shape, axis, activation):
    rng = np.random.default_rng(hash((shape, axis)) % 2**32)
    x = rng.standard_normal(shape).astype(dtype)
    bias = rng.standard_normal(shape[axis]).astype(dtype)
    out = assert_matches_twin(elementwise.bias_act_fwd, twin.bias_act_fwd, (x, bias, axis, activation),
                              kernel_runtime)
    # float32/float64 compute exactly what NumPy computes; float16 rounds once from float32.
    np.testing.assert_array_equal(out, twin.bias_act_fwd(x, bias, axis, activation))


def test_bias_act_fwd_relu_keeps_nan_and_inf(kernel_runtime):
    x = np.array([[np.nan, -np.inf, np.inf, -1.0]], np.float32)
    bias = np.zeros(4, np.float32)
    out = to_host(elementwise.bias_act_fwd(to_device(kernel_runtime, x), to_device(kernel_runtime, bias), 1,
                                           'relu', runtime=kernel_runtime))
    np.testing.assert_array_equal(out, [[np.nan, 0.0, np.inf, 0.0]])


def test_bias_act_fwd_empty(kernel_runtime):
    x = np.zeros((0, 4), np.float32)
    out = elementwise.bias_act_fwd(to_device(kernel_runtime, x), to_device(kernel_runtime, np.ones(4, np.float32)),
                                   1, runtime=kernel_runtime)
    assert out.shape == (0, 4)


@pytest.mark.parametrize('fn', [elementwise.bias_act_fwd, twin.bias_act_fwd])
def test_bias_act_fwd_rejects_bad_input(fn):
    kw = {'runtime': 'emulate'} if fn is elementwise.bias_act_fwd else {}
    x, b = np.zeros((2, 3), np.float32), np.zeros(3, np.float32)
    with pytest.raises(ValueError, match=r"bias_act_fwd: activation must be one of \('linear', 'relu'\), got 'tanh'"):
        fn(x, b, 1, 'tanh', **kw)
    with pytest.raises(ValueError, match=r"bias_act_fwd: bias must have shape \(2,\).*got \(3,\)"):
        fn(x, b, 0, **kw)
    with pytest.raises(ValueError, match=r"bias_act_fwd: axis must be an int in \[-2, 2\).*got 2"):
        fn(x, b, 2, **kw)
    with pytest.raises(TypeError, match=r"bias_act_fwd: bias.dtype must equal x.dtype \(float32\), got float64"):
        fn(x, b.astype(np.float64), 1, **kw)
    with pytest.raises(TypeError, match=r"bias_act_fwd: x.dtype must be float16, float32 or float64, got int32"):
        fn(x.astype(np.int32), b.astype(np.int32), 1, **kw)


@pytest.mark.parametrize('nbytes', [0, 1, 15, 16, 17, 4096 + 7, 100003])
def test_copy_is_exact(kernel_runtime, nbytes):
    x = np.random.default_rng(nbytes).integers(0, 256, nbytes, dtype=np.uint8)
    y = to_host(elementwise.copy(to_device(kernel_runtime, x), runtime=kernel_runtime))
    np.testing.assert_array_equal(y, twin.copy(x))


def test_copy_of_views_and_dtypes(kernel_runtime):
    base = np.arange(4 * 37, dtype=np.float64).reshape(4, 37)
    for x in (base[:, 1:], base.T, base.astype(np.float16), base[1:]):
        y = to_host(elementwise.copy(to_device(kernel_runtime, x), runtime=kernel_runtime))
        assert y.dtype == x.dtype and y.flags.c_contiguous
        np.testing.assert_array_equal(y, twin.copy(x))


def test_launchers_use_the_current_runtime():
    from gpuk.kernels import runtime
    previous = runtime.set_current('emulate')
    try:
        x = np.arange(5, dtype=np.float32)
        np.testing.assert_array_equal(elementwise.copy(x), x)
    finally:
        runtime.set_current(previous)
