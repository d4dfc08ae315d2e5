"""relu (leaky, capped, thresholded), elu, hard_sigmoid, l2_normalize and in_top_k with
TensorFlow's semantics, against NumPy, with gradients."""
import numpy as np
import pytest

from gpuk import backend as K
from tests.evaluation import assert_close, evaluate
from tests.gradcheck import check_gradients

DTYPES = ['float16', 'float32', 'float64']


def grid(dtype):
    """Values from -8 to 8 including the kinks used below (0, +-0.5, 1, 2.5, 5, 6)."""
    x = np.concatenate([np.linspace(-8, 8, 65), [0.3, -0.7, 5.5, 6.5]])
    return x.reshape(3, -1).astype(dtype)


# --- relu ---------------------------------------------------------------------------------

def reference_relu(x, alpha=0., max_value=None, threshold=0.):
    """Keras 2.3.1 tensorflow_backend.relu, step by step in NumPy (float64)."""
    if alpha != 0 and max_value is None and threshold == 0:
        return np.where(x > 0, x, alpha * x)
    negative_part = np.maximum(threshold - x, 0)
    out = np.where(x > threshold, x, 0) if threshold != 0 else np.maximum(x, 0)
    if max_value is not None:
        out = np.clip(out, 0, max_value)
    return out - alpha * negative_part


RELU_PARAMS = [dict(), dict(alpha=0.1), dict(alpha=1.5), dict(max_value=6.), dict(max_value=2.5),
               dict(threshold=0.5), dict(threshold=-0.5), dict(alpha=0.2, max_value=5., threshold=1.),
               dict(alpha=0.3, threshold=-0.5, max_value=2.5), dict(alpha=0.1, max_value=6.)]


@pytest.mark.parametrize('dtype', DTYPES)
@pytest.mark.parametrize('params', RELU_PARAMS, ids=str)
def test_relu_matches_keras_formula(on_device, dtype, params):
    x = grid(dtype)
    got = evaluate(lambda t: K.relu(t, **params), x, unknown=(0,))
    assert_close(got, reference_relu(x.astype(np.float64), **params), dtype)


def test_relu_documented_pieces():
    # max_value for x >= max_value, x for threshold <= x < max_value, alpha * (x - threshold) below.
    x = np.array([-3., 0.9, 1., 2., 4., 5., 7.], dtype=np.float32)
    got = evaluate(lambda t: K.relu(t, alpha=0.5, max_value=5., threshold=1.), x)
    np.testing.assert_allclose(got, [-2., -0.05, 0., 2., 4., 5., 5.], rtol=1e-6)
    np.testing.assert_array_equal(evaluate(K.relu, np.array([-2, 0, 3], np.int32)), [0, 0, 3])


@pytest.mark.parametrize('params', RELU_PARAMS, ids=str)
def test_relu_gradients(params):
    x = grid('float64')
    x = x[np.all(np.abs(x[..., None] - np.array([0, 0.5, -0.5, 1, 2.5, 5, 6])) > 1e-3, axis=-1)]  # off the kinks
    check_gradients(lambda t: K.relu(t, **params), x)


def test_relu_gradient_at_kinks_follows_tensorflow():
    x = K.placeholder((4,), dtype='float64')
    values = np.array([0., 6., 5., 1.])

    def grad(**params):
        return K.function([x], K.gradients(K.sum(K.relu(x, **params)), [x]))([values])[0]
    np.testing.assert_array_equal(grad(), [0, 1, 1, 1])                    # relu: x > 0
    np.testing.assert_array_equal(grad(max_value=6.), [0, 0, 1, 1])        # relu6: 0 < x < 6
    np.testing.assert_array_equal(grad(max_value=5.), [0, 0, 1, 1])        # clip at 5: ends included
    np.testing.assert_array_equal(grad(threshold=1.), [0, 1, 1, 0])        # x > threshold
    np.testing.assert_allclose(grad(alpha=0.1), [0.1, 1, 1, 1])            # leaky: x > 0


@pytest.mark.parametrize('dtype', DTYPES)
def test_plain_relu_gradient_keeps_the_dtype_and_multiplies_by_the_mask(on_device, dtype):
    """g * (x > 0) in g's dtype; a NaN in g stays NaN where the mask is 0 (as g * 0)."""
    x = K.placeholder((5,), dtype=dtype)
    g = K.placeholder((5,), dtype=dtype)
    dx, = K.gradients(K.sum(K.relu(x) * g), [x])
    assert dx.dtype == dtype
    x_values = np.array([-1., 0., 2., -3., 4.], dtype)
    g_values = np.array([5., 6., np.nan, np.nan, 7.], dtype)
    got = K.function([x, g], [dx])([x_values, g_values])[0]
    assert got.dtype == dtype
    np.testing.assert_array_equal(got, g_values * (x_values > 0))


def test_relu_second_derivative_flows_through_the_gradient(rng):
    x = rng.standard_normal((2, 5)) + 0.05
    check_gradients(lambda t: K.gradients(K.sum(K.square(K.relu(t, alpha=0.2)) * 0.5), [t])[0], x)


def test_relu_accepts_floatx_arrays_and_rejects_tensors():
    x = K.placeholder((3,))
    y = K.relu(x, alpha=K.cast_to_floatx(0.1), max_value=K.cast_to_floatx(6.), threshold=np.float32(0))
    got = K.function([x], [y])([np.array([-1., 3., 9.])])[0]
    np.testing.assert_allclose(got, [-0.1, 3., 6.], rtol=1e-6)
    with pytest.raises(TypeError, match='relu: alpha must be a number'):
        K.relu(x, alpha=K.constant(0.1))
    with pytest.raises(TypeError, match='relu: max_value must be a number'):
        K.relu(x, max_value='6')


# --- elu, hard_sigmoid ----------------------------------------------------------------------

@pytest.mark.parametrize('dtype', DTYPES)
@pytest.mark.parametrize('alpha', [1., 0.5])
def test_elu_matches_numpy(on_device, dtype, alpha):
    x = grid(dtype)
    with np.errstate(over='raise'):  # the discarded branch must not overflow
        got = evaluate(lambda t: K.elu(t, alpha), np.concatenate([x, np.full((3, 1), 1e4, dtype)], 1))
    wide = x.astype(np.float64)
    assert_close(got[:, :-1], np.where(wide > 0, wide, alpha * np.expm1(wide)), dtype)
    assert_close(got[:, -1], 1e4, dtype)


@pytest.mark.parametrize('alpha', [1., 0.5])
def test_elu_gradients(rng, alpha):
    x = rng.standard_normal((3, 4))
    check_gradients(lambda t: K.elu(t, alpha), x)
    check_gradients(lambda t: K.gradients(K.sum(K.elu(t, alpha) ** 2), [t])[0], x)


@pytest.mark.parametrize('dtype', DTYPES)
def test_hard_sigmoid_matches_numpy(on_device, dtype):
    x = grid(dtype)
    got = evaluate(K.hard_sigmoid, x, unknown=(0,))
    assert_close(got, np.clip(0.2 * x.astype(np.float64) + 0.5, 0, 1), dtype)


def test_hard_sigmoid_gradients():
    x = grid('float64')
    x = x[np.abs(np.abs(x) - 2.5) > 1e-3]
    check_gradients(K.hard_sigmoid, x)
    t = K.placeholder((3,), dtype='float64')
    g = K.function([t], K.gradients(K.sum(K.hard_sigmoid(t)), [t]))([np.array([-2.5, 2.5, 3.])])[0]
    np.testing.assert_allclose(g, [0.2, 0.2, 0.])  # TF's clip gradient includes both ends


def test_elu_and_hard_sigmoid_need_floats():
    with pytest.raises(TypeError, match='elu: x must be a float tensor, got dtype int32'):
        K.elu(K.placeholder((2,), dtype='int32'))
    with pytest.raises(TypeError, match='hard_sigmoid: x must be a float tensor'):
        K.hard_sigmoid(K.placeholder((2,), dtype='int64'))
    with pytest.raises(TypeError, match='elu: alpha must be a number'):
        K.elu(K.placeholder((2,)), alpha=None)


# --- l2_normalize ---------------------------------------------------------------------------

@pytest.mark.parametrize('dtype', DTYPES)
@pytest.mark.parametrize('axis', [None, 0, -1, 1, [0, 2]])
def test_l2_normalize_matches_numpy(on_device, rng, dtype, axis):
    x = rng.standard_normal((3, 4, 5)).astype(dtype)
    x[1] = 0  # a zero slice gives zeros, not NaN
    x[2, 0] = 1e-8 if dtype != 'float16' else 0
    wide = x.astype(np.float64)
    numpy_axis = tuple(axis) if isinstance(axis, list) else axis
    want = wide / np.sqrt(np.maximum(np.sum(wide ** 2, axis=numpy_axis, keepdims=True), 1e-12))
    got = evaluate(lambda t: K.l2_normalize(t, axis=axis), x)
    assert not np.isnan(got).any()
    assert_close(got, want, dtype)


def test_l2_normalize_gradients(rng):
    x = rng.standard_normal((3, 4))
    check_gradients(lambda t: K.l2_normalize(t, axis=-1), x)
    check_gradients(lambda t: K.l2_normalize(t), x)
    with pytest.raises(TypeError, match='l2_normalize: x must be a float tensor'):
        K.l2_normalize(K.placeholder((2,), dtype='int32'))
    with pytest.raises(ValueError, match='l2_normalize: axis 2 is out of range'):
        K.l2_normalize(K.placeholder((2, 3)), axis=2)


# --- in_top_k -------------------------------------------------------------------------------

def reference_in_top_k(predictions, targets, k):
    """TF: fewer than k strictly greater predictions; False for bad targets or non-finite rows."""
    out = []
    for row, t in zip(predictions, targets):
        if not (0 <= t < len(row)) or not np.all(np.isfinite(row)):
            out.append(False)
        else:
            out.append(int(np.sum(row > row[t])) < k)
    return np.array(out)


@pytest.mark.parametrize('targets_dtype', ['int32', 'int64'])
@pytest.mark.parametrize('k', [0, 1, 3, 8])
def test_in_top_k_matches_tensorflow_semantics(on_device, rng, targets_dtype, k):
    predictions = rng.integers(0, 4, size=(40, 8)).astype(np.float32)  # many ties
    predictions[0] = 1.0                                              # a whole row tied
    predictions[1, 3] = np.nan
    predictions[2, 5] = np.inf
    targets = rng.integers(0, 8, size=40).astype(targets_dtype)
    targets[3], targets[4] = -1, 8                                    # out of range
    got = evaluate(lambda p, t: K.in_top_k(p, t, k), predictions, targets, unknown=(0,))
    assert got.dtype == np.bool_
    np.testing.assert_array_equal(got, reference_in_top_k(predictions, targets, k))
    assert got[0] == (k >= 1) and not got[1] and not got[2] and not got[3] and not got[4]


def test_in_top_k_counts_ties_at_the_kth_value(on_device):
    predictions = np.array([[0.1, 0.5, 0.5, 0.3], [0.9, 0.5, 0.5, 0.3]], dtype=np.float32)
    targets = np.array([2, 2], dtype=np.int32)
    np.testing.assert_array_equal(evaluate(lambda p, t: K.in_top_k(p, t, 1), predictions, targets), [True, False])
    np.testing.assert_array_equal(evaluate(lambda p, t: K.in_top_k(p, t, 2), predictions, targets), [True, True])
    k = K.placeholder((), dtype='int32')
    p, t = K.placeholder((2, 4)), K.placeholder((2,), dtype='int32')
    got = K.function([p, t, k], [K.in_top_k(p, t, k)])([predictions, targets, np.int32(2)])[0]
    np.testing.assert_array_equal(got, [True, True])


def test_in_top_k_bad_arguments():
    p = K.placeholder((None, 5))
    with pytest.raises(TypeError, match='in_top_k: targets must be an int tensor, got dtype float32'):
        K.in_top_k(p, K.placeholder((None,)), 1)
    with pytest.raises(TypeError, match='in_top_k: k must be an int'):
        K.in_top_k(p, K.placeholder((None,), dtype='int32'), 1.5)
    with pytest.raises(ValueError, match='in_top_k: predictions must be 2-D'):
        K.in_top_k(K.placeholder((5,)), K.placeholder((5,), dtype='int32'), 1)
    with pytest.raises(ValueError, match='in_top_k: predictions of shape .* differ in batch size'):
        K.in_top_k(K.placeholder((3, 5)), K.placeholder((4,), dtype='int32'), 1)
    with pytest.raises(ValueError, match='in_top_k: targets must be 1-D'):
        K.in_top_k(p, K.placeholder((None, 1), dtype='int32'), 1)
