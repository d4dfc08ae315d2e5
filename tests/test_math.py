"""K's elementwise math, reductions (incl. var, std, logsumexp), cumulative sums/products
and arg-reductions against NumPy (float64 references), with gradients."""
import numpy as np
import pytest
import scipy.special

from gpuk import backend as K
from gpuk.graph import apply
from gpuk.ops.reduction import Cumulative
from tests.evaluation import assert_close, evaluate
from tests.gradcheck import check_gradients


def sample(rng, shape, dtype):
    if dtype == 'bool':
        return rng.random(shape) < 0.5
    if np.dtype(dtype).kind in 'iu':
        return rng.integers(-5, 6, size=shape).astype(dtype)
    return rng.standard_normal(shape).astype(dtype)


# --- reductions ---------------------------------------------------------------------------

AXES = [None, 0, -1, [0, 2], (1,), [-1, 0]]


def reference_reduce(kind, x, axis, keepdims):
    axis = tuple(axis) if isinstance(axis, (list, tuple)) else axis
    if kind in ('any', 'all'):
        return getattr(np, kind)(x, axis=axis, keepdims=keepdims)
    if x.dtype == bool:
        x = x.astype(np.float32 if kind == 'mean' else np.int64)
    wide = x.astype(np.float64)
    out = getattr(np, kind)(wide, axis=axis, keepdims=keepdims)
    if kind == 'mean' and x.dtype.kind in 'iu':
        out = np.trunc(out)  # TensorFlow's integer mean truncates
    return out.astype(x.dtype)


@pytest.mark.parametrize('kind', ['sum', 'mean', 'max', 'min', 'prod', 'any', 'all'])
@pytest.mark.parametrize('dtype', ['float16', 'float32', 'float64', 'int32', 'bool'])
def test_reductions_match_numpy(on_device, rng, kind, dtype):
    x = sample(rng, (3, 4, 5), dtype)
    if kind == 'prod' and dtype.startswith('float'):
        x = (1 + 0.1 * x).astype(dtype)  # keep products well scaled
    for axis in AXES:
        for keepdims in (False, True):
            got = evaluate(lambda t: getattr(K, kind)(t, axis=axis, keepdims=keepdims), x, unknown=(0,))
            want = reference_reduce(kind, x, axis, keepdims)
            assert got.dtype == want.dtype, (kind, dtype, got.dtype, want.dtype)
            assert got.shape == want.shape
            assert_close(got, want, got.dtype)


def test_float16_sum_accumulates_in_float32(on_device):
    x = np.full((8192,), 0.1, dtype=np.float16)
    got = evaluate(lambda t: K.sum(t), x)
    # A float16 running sum stalls at 256 (its spacing there is 0.25 > 0.1).
    assert got.dtype == np.float16
    np.testing.assert_allclose(float(got), float(np.float16(x.astype(np.float64).sum())), rtol=1e-3)
    got_mean = evaluate(lambda t: K.mean(t), x)
    np.testing.assert_allclose(float(got_mean), 0.1, rtol=1e-3)


@pytest.mark.parametrize('kind', ['sum', 'mean', 'max', 'min', 'prod'])
@pytest.mark.parametrize('axis,keepdims', [(None, False), (1, True), ([0, -1], False), (-2, False)])
def test_reduction_gradients(rng, kind, axis, keepdims):
    x = rng.permutation(24).reshape(2, 3, 4) / 7.0 + 0.5  # distinct values: no max ties
    check_gradients(lambda t: getattr(K, kind)(t, axis=axis, keepdims=keepdims), x)


def test_max_gradient_splits_ties_and_prod_gradient_handles_zeros():
    x = K.placeholder((2, 3), dtype='float64')
    g_max, = K.gradients(K.sum(K.max(x, axis=1)), [x])
    g_prod, = K.gradients(K.sum(K.prod(x, axis=1)), [x])
    values = np.array([[1., 3., 3.], [0., 2., 5.]])
    got_max, got_prod = K.function([x], [g_max, g_prod])([values])
    np.testing.assert_allclose(got_max, [[0, .5, .5], [0, 0, 1]])
    np.testing.assert_allclose(got_prod, [[9, 3, 3], [10, 0, 0]])


def test_reduction_bad_arguments():
    x = K.placeholder((2, 3))
    with pytest.raises(ValueError, match='sum: axis 2 is out of range'):
        K.sum(x, axis=2)
    with pytest.raises(TypeError, match='mean: axis must be an int'):
        K.mean(x, axis='rows')
    with pytest.raises(ValueError, match='var: axis -3 is out of range'):
        K.var(x, axis=[0, -3])
    with pytest.raises(TypeError, match='logsumexp: x must be a float tensor, got dtype int32'):
        K.logsumexp(K.placeholder((2,), dtype='int32'))


# --- var / std ----------------------------------------------------------------------------

@pytest.mark.parametrize('dtype', ['float16', 'float32', 'float64'])
def test_var_std_match_numpy(on_device, rng, dtype):
    x = sample(rng, (4, 3, 5), dtype)
    for axis in AXES:
        for keepdims in (False, True):
            numpy_axis = tuple(axis) if isinstance(axis, (list, tuple)) else axis
            wide = x.astype(np.float64)
            for name in ('var', 'std'):
                got = evaluate(lambda t: getattr(K, name)(t, axis=axis, keepdims=keepdims), x, unknown=(0,))
                want = getattr(np, name)(wide, axis=numpy_axis, keepdims=keepdims)
                assert got.dtype == np.dtype(dtype) and got.shape == want.shape
                assert_close(got, want, dtype)


def test_var_is_stable_for_large_means(on_device, rng):
    # E[x^2] - E[x]^2 in float32 would lose everything here (x^2 ~ 1e8, var ~ 1).
    x = (1e4 + rng.standard_normal((1000,))).astype(np.float32)
    got = evaluate(lambda t: K.var(t), x)
    np.testing.assert_allclose(got, np.var(x.astype(np.float64)), rtol=1e-4)


def test_var_of_int_and_bool_is_floatx(on_device):
    ints = np.array([[1, 2], [3, 7]], dtype=np.int32)
    flags = np.array([True, False, False, False])
    got_int = evaluate(lambda t: K.var(t, axis=1), ints)
    got_bool = evaluate(lambda t: K.std(t), flags)
    assert got_int.dtype == np.float32 and got_bool.dtype == np.float32
    np.testing.assert_allclose(got_int, [0.25, 4.0])
    np.testing.assert_allclose(got_bool, np.std([1., 0., 0., 0.]), rtol=1e-6)


@pytest.mark.parametrize('name', ['var', 'std'])
def test_var_std_gradients(rng, name):
    x = rng.standard_normal((3, 4))
    check_gradients(lambda t: getattr(K, name)(t, axis=[0, 1]), x)
    check_gradients(lambda t: getattr(K, name)(t, axis=-1, keepdims=True), x)


# --- logsumexp ------------------------------------------------------------------------------

@pytest.mark.parametrize('dtype', ['float16', 'float32', 'float64'])
def test_logsumexp_matches_scipy(on_device, rng, dtype):
    x = (3 * rng.standard_normal((3, 4, 5))).astype(dtype)
    for axis in AXES:
        for keepdims in (False, True):
            numpy_axis = tuple(axis) if isinstance(axis, (list, tuple)) else axis
            got = evaluate(lambda t: K.logsumexp(t, axis=axis, keepdims=keepdims), x, unknown=(0,))
            want = scipy.special.logsumexp(x.astype(np.float64), axis=numpy_axis, keepdims=keepdims)
            assert got.dtype == np.dtype(dtype) and got.shape == want.shape
            assert_close(got, want, dtype)


def test_logsumexp_does_not_overflow_or_underflow(on_device):
    x = np.array([[1000., 1000.], [-1000., -1001.], [-np.inf, -np.inf], [-np.inf, 0.]], dtype=np.float32)
    with np.errstate(divide='ignore'):  # log(0) for the all -inf row, as in NumPy
        got = evaluate(lambda t: K.logsumexp(t, axis=1), x)
    want = [1000 + np.log(2), -1000 + np.log1p(np.exp(-1)), -np.inf, 0.]
    np.testing.assert_allclose(got, want, rtol=1e-6)


def test_logsumexp_gradient_and_second_derivative(rng):
    x = rng.standard_normal((3, 4))
    check_gradients(lambda t: K.logsumexp(t, axis=1), x)
    check_gradients(lambda t: K.logsumexp(t, axis=[0, 1], keepdims=True), x)
    # The gradient (a softmax) is itself differentiable.
    check_gradients(lambda t: K.gradients(K.sum(K.logsumexp(t, axis=0) * K.constant([1., 2., 3., 4.], 'float64')),
                                          [t])[0], x)


# --- cumsum / cumprod -----------------------------------------------------------------------

@pytest.mark.parametrize('name', ['cumsum', 'cumprod'])
@pytest.mark.parametrize('dtype', ['float16', 'float32', 'float64', 'int32', 'bool'])
def test_cumulative_matches_numpy(on_device, rng, name, dtype):
    x = sample(rng, (3, 4, 5), dtype)
    if name == 'cumprod' and dtype.startswith('float'):
        x = (1 + 0.2 * x).astype(dtype)
    for axis in (0, 1, -1):
        got = evaluate(lambda t: getattr(K, name)(t, axis=axis), x, unknown=(0,))
        want = getattr(np, name)(x.astype(np.float64), axis=axis)
        want_dtype = np.int64 if dtype == 'bool' else np.dtype(dtype)
        assert got.dtype == want_dtype and got.shape == x.shape
        assert_close(got, want, want_dtype)
    assert_close(evaluate(lambda t: getattr(K, name)(t), x), getattr(np, name)(x.astype(np.float64), axis=0),
                 want_dtype)  # Keras's default axis is 0


def test_cumulative_float16_accumulates_in_float32(on_device):
    x = np.full((4096,), 0.1, dtype=np.float16)
    got = evaluate(lambda t: K.cumsum(t), x)
    np.testing.assert_allclose(got[-1].astype(np.float64), 0.1 * 4096, rtol=2e-3)


@pytest.mark.parametrize('axis', [0, 1, -1])
def test_cumulative_gradients(rng, axis):
    x = 1 + 0.3 * rng.standard_normal((3, 4))
    check_gradients(lambda t: K.cumsum(t, axis=axis), x)
    check_gradients(lambda t: K.cumprod(t, axis=axis), x)


def test_cumprod_gradient_is_exact_with_zeros(rng):
    x = 1 + 0.3 * rng.standard_normal((4, 6))
    x[0, 2] = 0.              # one zero
    x[1, 1] = x[1, 4] = 0.    # two zeros in a row
    x[2, 0] = 0.              # a leading zero
    x[3, 5] = 0.              # a trailing zero
    # Central differences are exact for cumprod (it is linear in each single entry).
    check_gradients(lambda t: K.cumprod(t, axis=1), x)
    check_gradients(lambda t: K.cumprod(t, axis=0), x.T.copy())
    # Second derivatives through the zero-aware rule (exact with at most one zero per line;
    # with several zeros the masks of the rule are treated as constants).
    x[1, 4] = 0.5
    w = K.constant(rng.standard_normal((4, 6)), 'float64')
    check_gradients(lambda t: K.gradients(K.sum(K.cumprod(t, axis=1) * w), [t])[0], x)


@pytest.mark.parametrize('kind', ['sum', 'prod'])
def test_reverse_cumulative_op_and_its_gradient(rng, kind):
    # Gradients use reverse scans; the op supports them in both directions.
    x = 1 + 0.3 * rng.standard_normal((3, 5))
    x[0, 1] = x[2, 4] = 0.

    def build(t):
        return apply(Cumulative(kind, 1, reverse=True), t)
    want = np.flip(getattr(np, 'cum' + kind)(np.flip(x, 1), axis=1), 1)
    np.testing.assert_allclose(evaluate(build, x), want, rtol=1e-12)
    check_gradients(build, x)


def test_cumulative_bad_arguments():
    with pytest.raises(ValueError, match='cumsum: axis 2 is out of range'):
        K.cumsum(K.placeholder((2, 3)), axis=2)
    with pytest.raises(TypeError, match='cumprod: axis must be an int'):
        K.cumprod(K.placeholder((2, 3)), axis=[0])
    with pytest.raises(ValueError, match='cumsum: x must have rank >= 1'):
        K.cumsum(K.constant(1.0))


# --- argmax / argmin -------------------------------------------------------------------------

@pytest.mark.parametrize('name', ['argmax', 'argmin'])
@pytest.mark.parametrize('dtype', ['float16', 'float32', 'int32', 'bool'])
def test_arg_reductions_match_numpy(on_device, rng, name, dtype):
    x = sample(rng, (3, 4, 5), dtype)  # small ints and bools: plenty of ties (first index wins)
    for axis in (0, 1, -1):
        got = evaluate(lambda t: getattr(K, name)(t, axis=axis), x, unknown=(0,))
        assert got.dtype == np.int64
        np.testing.assert_array_equal(got, getattr(np, name)(x, axis=axis))
    np.testing.assert_array_equal(evaluate(lambda t: getattr(K, name)(t), x), getattr(np, name)(x, axis=-1))


def test_arg_reductions_bad_arguments_and_no_gradient():
    x = K.placeholder((2, 3))
    with pytest.raises(ValueError, match='argmax: axis 2 is out of range'):
        K.argmax(x, axis=2)
    with pytest.raises(TypeError, match='argmin: axis must be an int'):
        K.argmin(x, axis=None)
    assert K.gradients(K.sum(K.cast(K.argmax(x), 'float32')), [x]) == [None]


# --- pow, sqrt, clip ------------------------------------------------------------------------

@pytest.mark.parametrize('dtype', ['float16', 'float32', 'float64'])
def test_pow_sqrt_clip_match_numpy(on_device, rng, dtype):
    x = (2 * rng.standard_normal((4, 5))).astype(dtype)
    wide = x.astype(np.float64)
    assert_close(evaluate(lambda t: K.pow(t, 2), x), wide ** 2, dtype)
    assert_close(evaluate(lambda t: K.pow(t, 3), x), wide ** 3, dtype)
    assert_close(evaluate(lambda t: K.pow(K.abs(t), 0.5), x), np.abs(wide) ** 0.5, dtype)
    assert_close(evaluate(lambda t: K.sqrt(t), x), np.sqrt(np.maximum(wide, 0)), dtype)
    assert_close(evaluate(lambda t: K.clip(t, -1, 0.5), x), np.clip(wide, -1, 0.5), dtype)
    assert_close(evaluate(lambda t: K.clip(t, None, 0.5), x), np.minimum(wide, 0.5), dtype)
    assert_close(evaluate(lambda t: K.clip(t, 1, None), x), np.maximum(wide, 1), dtype)
    assert_close(evaluate(lambda t: K.clip(t, 1, -1), x), np.ones_like(wide), dtype)  # max < min: min wins
    bounds = np.array([-0.5, 0, 0.5, 1, 2], dtype=dtype)
    got = evaluate(lambda t, low: K.clip(t, low, low + 1), x, bounds)
    assert_close(got, np.clip(wide, bounds, bounds + 1), dtype)
    assert_close(evaluate(lambda t: K.clip(t, np.float32(-1), np.array(1.0, np.float32)), x),
                 np.clip(wide, -1, 1), dtype)  # K.cast_to_floatx values as bounds


def test_pow_and_clip_on_ints(on_device):
    x = np.array([-3, -1, 0, 2, 5], dtype=np.int32)
    got = evaluate(lambda t: K.pow(t, 2), x)
    assert got.dtype == np.int32
    np.testing.assert_array_equal(got, x ** 2)
    got = evaluate(lambda t: K.clip(t, -1, 3), x)
    assert got.dtype == np.int32
    np.testing.assert_array_equal(got, np.clip(x, -1, 3))


def test_pow_sqrt_clip_gradients(rng):
    x = rng.uniform(0.5, 2.0, size=(3, 4)) * np.sign(rng.standard_normal((3, 4)))
    check_gradients(lambda t: K.pow(t, 3), x)
    check_gradients(lambda t: K.pow(K.abs(t), 1.5), x)
    check_gradients(lambda t: K.sqrt(K.abs(t)), x)
    check_gradients(lambda t: K.clip(t, -1.2, 1.1), x)
    bounds = rng.uniform(-1.0, 0.0, size=(4,))
    check_gradients(lambda t, low: K.clip(t, low, 1.1), x, bounds)


def test_sqrt_of_negative_is_zero_with_zero_gradient():
    x = K.placeholder((3,), dtype='float64')
    g, = K.gradients(K.sum(K.sqrt(x)), [x])
    with np.errstate(divide='ignore'):  # 0.5 / sqrt(0) in the branch that is discarded
        value, grad = K.function([x], [K.sqrt(x), g])([np.array([-4., 4., -1.])])
    np.testing.assert_array_equal(value, [0., 2., 0.])
    np.testing.assert_array_equal(grad, [0., 0.25, 0.])  # TF clips before sqrt: no NaN


def test_clip_bad_arguments():
    with pytest.raises(TypeError, match='clip: min_value and max_value must be numbers'):
        K.clip(K.placeholder((2,)), 'low', 1.0)
