"""NumPy softmax / cross-entropy twins against loop definitions, the Keras 2.3.1
formulas and finite differences."""
import math

import ml_dtypes
import numpy as np
import pytest

from gpuk.cpu_fallback import softmax_xent as sx
from gpuk.contracts.dtypes import accumulation_dtype
from tests.gradcheck import numeric_gradient

DTYPES = [np.float16, ml_dtypes.bfloat16, np.float32, np.float64]
# 16-bit: a few units of the output's one rounding (float16 2^-11, bfloat16 2^-8)
TOLERANCE = {np.float16: 1e-2, ml_dtypes.bfloat16: 2e-2, np.float32: 1e-5, np.float64: 1e-12}
SHAPE = (3, 4, 5)


def _rows(shape, axis):
    """Every row along axis as an index list: slow loops over the other axes."""
    others = [n for i, n in enumerate(shape) if i != axis]
    for rest in np.ndindex(*others):
        yield [tuple(rest[:axis]) + (c,) + tuple(rest[axis:]) for c in range(shape[axis])]


def _slow_softmax(x, axis):
    out = np.zeros(x.shape)
    for row in _rows(x.shape, axis):
        values = [float(x[i]) for i in row]
        m = max(values)
        total = sum(math.exp(v - m) for v in values)
        for i, v in zip(row, values):
            out[i] = math.exp(v - m) / total
    return out


def _slow_xent(logits, target, axis):
    reduced = tuple(n for i, n in enumerate(logits.shape) if i != axis)
    loss = np.zeros(reduced)
    lse = np.zeros(reduced)
    for k, row in enumerate(_rows(logits.shape, axis)):
        values = [float(logits[i]) for i in row]
        m = max(values)
        row_lse = m + math.log(sum(math.exp(v - m) for v in values))
        index = np.unravel_index(k, reduced)
        lse[index] = row_lse
        loss[index] = -sum(float(target[i]) * (v - row_lse) for i, v in zip(row, values))
    return loss, lse


def _check(got, ref, dtype, scale=1):
    assert got.dtype == dtype
    tol = TOLERANCE[dtype] * scale
    np.testing.assert_allclose(got.astype(np.float64), ref, rtol=tol, atol=tol)


# ---------------------------------------------------------------- softmax

@pytest.mark.parametrize('dtype', DTYPES)
@pytest.mark.parametrize('axis', [0, 1, -1])
def test_softmax_and_log_softmax_match_loops(rng, axis, dtype):
    x = (rng.standard_normal(SHAPE) * 3).astype(dtype)
    ref = _slow_softmax(x, axis % 3)
    _check(sx.softmax_fwd(x, axis), ref, dtype)
    _check(sx.log_softmax_fwd(x, axis), np.log(ref), dtype, scale=3)


@pytest.mark.parametrize('axis', [0, 2])
def test_softmax_and_log_softmax_bwd_match_finite_differences(rng, axis):
    x = rng.standard_normal(SHAPE)
    w = rng.standard_normal(SHAPE)
    y = sx.softmax_fwd(x, axis)
    numeric = numeric_gradient(lambda: np.sum(sx.softmax_fwd(x, axis) * w), x)
    np.testing.assert_allclose(sx.softmax_bwd(y, w, axis), numeric, rtol=1e-6, atol=1e-9)
    log_y = sx.log_softmax_fwd(x, axis)
    numeric = numeric_gradient(lambda: np.sum(sx.log_softmax_fwd(x, axis) * w), x)
    np.testing.assert_allclose(sx.log_softmax_bwd(log_y, w, axis), numeric, rtol=1e-6, atol=1e-9)


def test_softmax_extreme_logits():
    x = np.array([[1e4, -1e4, 0.0], [-np.inf, 3.0, 1e4], [-np.inf, -np.inf, 2.0]], np.float32)
    y = sx.softmax_fwd(x)
    np.testing.assert_allclose(y, [[1, 0, 0], [0, 0, 1], [0, 0, 1]], atol=1e-30)
    log_y = sx.log_softmax_fwd(x)
    assert log_y[0, 0] == 0 and log_y[0, 1] == -2e4 and log_y[1, 0] == -np.inf
    # a row of -inf has no softmax: NaN, as in NumPy
    assert np.all(np.isnan(sx.softmax_fwd(np.full((1, 3), -np.inf))))


# ---------------------------------------------------------------- cross-entropy from logits

@pytest.mark.parametrize('dtype', DTYPES)
@pytest.mark.parametrize('axis', [1, -1])
def test_softmax_xent_fwd_matches_loops(rng, axis, dtype):
    logits = (rng.standard_normal(SHAPE) * 2).astype(dtype)
    target = rng.uniform(0, 1, SHAPE).astype(dtype)      # rows do not sum to 1
    loss, lse = sx.softmax_xent_fwd(logits, target, axis)
    ref_loss, ref_lse = _slow_xent(logits, target, axis % 3)
    _check(loss, ref_loss, dtype, scale=3)
    assert lse.dtype == accumulation_dtype(dtype)
    np.testing.assert_allclose(lse, ref_lse, rtol=1e-5 if dtype != np.float64 else 1e-12)


@pytest.mark.parametrize('axis', [0, -1])
def test_softmax_xent_grads_match_finite_differences(rng, axis):
    logits = rng.standard_normal(SHAPE)
    target = rng.uniform(0, 1, SHAPE)
    reduced = tuple(n for i, n in enumerate(SHAPE) if i != axis % 3)
    w = rng.standard_normal(reduced)

    def objective():
        return np.sum(sx.softmax_xent_fwd(logits, target, axis)[0] * w)

    _, lse = sx.softmax_xent_fwd(logits, target, axis)
    np.testing.assert_allclose(sx.softmax_xent_bwd(logits, target, lse, w, axis),
                               numeric_gradient(objective, logits), rtol=1e-6, atol=1e-9)
    np.testing.assert_allclose(sx.softmax_xent_dtarget(logits, lse, w, axis),
                               numeric_gradient(objective, target), rtol=1e-6, atol=1e-9)


def test_softmax_xent_extreme_logits_stay_finite():
    logits = np.array([[1e4, -1e4, 0.0], [-np.inf, 2.0, 1.0], [1e4, 1e4, -np.inf]])
    target = np.array([[1.0, 0.0, 0.0], [0.0, 0.3, 0.7], [0.5, 0.5, 0.0]])
    loss, lse = sx.softmax_xent_fwd(logits, target)
    ref = [0.0, -(0.3 * (2 - np.logaddexp(2, 1)) + 0.7 * (1 - np.logaddexp(2, 1))), math.log(2)]
    np.testing.assert_allclose(loss, ref, rtol=1e-12, atol=1e-12)
    grad = sx.softmax_xent_bwd(logits, target, lse, np.ones(3))
    assert np.all(np.isfinite(grad))
    np.testing.assert_allclose(grad[0], [0, 0, 0], atol=1e-30)
    np.testing.assert_allclose(grad[2], [0, 0, 0], atol=1e-12)   # 1e4 + log 2 rounds
    # a -inf logit of a class with nonzero target: the loss is inf, not NaN
    assert sx.softmax_xent_fwd(np.array([[-np.inf, 0.0]]), np.array([[0.5, 0.5]]))[0][0] == np.inf


@pytest.mark.parametrize('dtype', DTYPES)
def test_sparse_xent_matches_dense_one_hot(rng, dtype):
    logits = rng.standard_normal((2, 5, 3)).astype(dtype)
    labels = rng.integers(0, 5, (2, 3))
    one_hot = np.moveaxis(np.eye(5)[labels], -1, 1)
    loss, lse = sx.sparse_softmax_xent_fwd(logits, labels, axis=1)
    ref_loss, ref_lse = _slow_xent(logits, one_hot, 1)
    _check(loss, ref_loss, dtype, scale=3)
    dloss = rng.standard_normal((2, 3))
    grad = sx.sparse_softmax_xent_bwd(logits, labels, lse, dloss, axis=1)
    ref_grad = sx.softmax_xent_bwd(logits.astype(np.float64), one_hot, ref_lse, dloss, axis=1)
    _check(grad, ref_grad, dtype, scale=3)


def test_sparse_xent_grad_matches_finite_differences(rng):
    logits = rng.standard_normal((4, 6))
    labels = np.array([0, 5, 2, 2], dtype=np.int32)
    w = rng.standard_normal(4)
    _, lse = sx.sparse_softmax_xent_fwd(logits, labels)
    numeric = numeric_gradient(lambda: np.sum(sx.sparse_softmax_xent_fwd(logits, labels)[0] * w),
                            logits)
    np.testing.assert_allclose(sx.sparse_softmax_xent_bwd(logits, labels, lse, w), numeric,
                               rtol=1e-6, atol=1e-9)


def test_sparse_xent_bad_labels():
    logits = np.zeros((2, 3))
    with pytest.raises(ValueError, match=r'sparse_softmax_xent_fwd: labels must lie in \[0, 3\)'):
        sx.sparse_softmax_xent_fwd(logits, np.array([0, 3]))
    with pytest.raises(ValueError, match=r'sparse_softmax_xent_bwd: labels .*got values in \[-1'):
        sx.sparse_softmax_xent_bwd(logits, np.array([-1, 0]), np.zeros(2), np.ones(2))
    with pytest.raises(ValueError, match='sparse_softmax_xent_fwd: labels must have shape'):
        sx.sparse_softmax_xent_fwd(logits, np.array([0, 1, 2]))
    with pytest.raises(TypeError, match='sparse_softmax_xent_fwd: labels must be an integer'):
        sx.sparse_softmax_xent_fwd(logits, np.array([0.0, 1.0]))


# ---------------------------------------------------------------- cross-entropy from probabilities

def _clip_in(dtype, values, epsilon):
    """Keras clips in the tensor's dtype (float32 for our 16-bit floats): 1 - 1e-7
    rounds to 1 - 2**-23 there, a visible change in log(1 - p)."""
    acc = accumulation_dtype(dtype).type
    clipped = np.clip(values.astype(acc), acc(epsilon), acc(1 - epsilon))
    return clipped.astype(np.float64)


def _keras_categorical(probs, target, axis, epsilon):
    """keras/backend/numpy_backend.py 2.3.1 categorical_crossentropy, along `axis`."""
    output = probs / probs.sum(axis=axis, keepdims=True)
    output = _clip_in(probs.dtype, output, epsilon)
    return np.sum(target * -np.log(output), axis=axis)


def _keras_binary(probs, target, epsilon):
    """keras/backend/numpy_backend.py 2.3.1 binary_crossentropy (from probabilities)."""
    output = _clip_in(probs.dtype, probs, epsilon)
    output = np.log(output / (1 - output))
    sigmoid = 1 / (1 + np.exp(-output))
    return target * -np.log(sigmoid) + (1 - target) * -np.log(1 - sigmoid)


@pytest.mark.parametrize('dtype', DTYPES)
def test_categorical_probs_matches_keras(rng, dtype):
    probs = rng.uniform(0.05, 1, SHAPE)
    probs[0, 0, 0] = 1e-12                 # clipped below
    probs[1, :, 2] = [1e-9, 1e-9, 1.0, 1e-9]  # normalized entry clipped above
    probs = probs.astype(dtype)
    target = rng.uniform(0, 1, SHAPE).astype(dtype)
    got = sx.categorical_xent_probs_fwd(probs, target, axis=1, epsilon=1e-7)
    ref = _keras_categorical(probs, target.astype(np.float64), 1, 1e-7)
    _check(got, ref, dtype, scale=3)


def test_categorical_probs_grads_match_finite_differences(rng):
    probs = rng.uniform(0.05, 1, SHAPE)
    probs[0, 0, 0] = 1e-12                 # inside the clip: flat, only the sum moves
    target = rng.uniform(0, 1, SHAPE)
    w = rng.standard_normal((3, 5))

    def objective():
        return np.sum(sx.categorical_xent_probs_fwd(probs, target, 1, 1e-7) * w)

    np.testing.assert_allclose(sx.categorical_xent_probs_bwd(probs, target, w, 1, 1e-7),
                               numeric_gradient(objective, probs, eps=1e-8), rtol=1e-5, atol=1e-7)
    np.testing.assert_allclose(sx.categorical_xent_probs_dtarget(probs, w, 1, 1e-7),
                               numeric_gradient(objective, target), rtol=1e-6, atol=1e-9)


@pytest.mark.parametrize('dtype', DTYPES)
def test_binary_logits_matches_definition(rng, dtype):
    x = (rng.standard_normal(SHAPE) * 4).astype(dtype)
    z = rng.uniform(0, 1, SHAPE).astype(dtype)
    xd, zd = x.astype(np.float64), z.astype(np.float64)
    sigmoid = 1 / (1 + np.exp(-xd))
    ref = -(zd * np.log(sigmoid) + (1 - zd) * np.log(1 - sigmoid))
    _check(sx.binary_xent_logits_fwd(x, z), ref, dtype, scale=3)


def test_binary_logits_grads_and_extremes(rng):
    x = rng.standard_normal(SHAPE) * 3
    z = rng.uniform(0, 1, SHAPE)
    w = rng.standard_normal(SHAPE)

    def objective():
        return np.sum(sx.binary_xent_logits_fwd(x, z) * w)

    np.testing.assert_allclose(sx.binary_xent_logits_bwd(x, z, w), numeric_gradient(objective, x),
                               rtol=1e-6, atol=1e-9)
    np.testing.assert_allclose(sx.binary_xent_logits_dtarget(x, w), numeric_gradient(objective, z),
                               rtol=1e-6, atol=1e-9)
    extreme = np.array([1e4, 1e4, -1e4, -np.inf, np.inf, -np.inf], np.float32)
    target = np.array([0.0, 1.0, 0.0, 0.0, 1.0, 1.0], np.float32)
    loss = sx.binary_xent_logits_fwd(extreme, target)
    np.testing.assert_allclose(loss, [1e4, 0, 0, 0, 0, np.inf])
    grad = sx.binary_xent_logits_bwd(extreme, target, np.ones(6, np.float32))
    np.testing.assert_array_equal(grad, [1, 0, 0, 0, 0, -1])


@pytest.mark.parametrize('dtype', DTYPES)
def test_binary_probs_matches_keras(rng, dtype):
    p = rng.uniform(0, 1, SHAPE)
    p[0, 0, :3] = [0.0, 1.0, 1e-9]
    p = p.astype(dtype)
    z = rng.uniform(0, 1, SHAPE).astype(dtype)
    got = sx.binary_xent_probs_fwd(p, z, 1e-7)
    ref = _keras_binary(p, z.astype(np.float64), 1e-7)
    # the reference's log(p / (1 - p)) -> sigmoid round trip itself loses ~1e-10 near 1
    _check(got, ref, dtype, scale=3 if dtype != np.float64 else 1000)


def test_binary_probs_grads_match_finite_differences(rng):
    p = rng.uniform(0.05, 0.95, SHAPE)
    p[0, 0, 0] = 1e-12                     # clipped: zero gradient
    z = rng.uniform(0, 1, SHAPE)
    w = rng.standard_normal(SHAPE)

    def objective():
        return np.sum(sx.binary_xent_probs_fwd(p, z, 1e-7) * w)

    dp = sx.binary_xent_probs_bwd(p, z, w, 1e-7)
    assert dp[0, 0, 0] == 0
    np.testing.assert_allclose(dp, numeric_gradient(objective, p, eps=1e-8), rtol=1e-5, atol=1e-7)
    np.testing.assert_allclose(sx.binary_xent_probs_dtarget(p, w, 1e-7),
                               numeric_gradient(objective, z), rtol=1e-6, atol=1e-9)


@pytest.mark.parametrize('call,error,message', [
    (lambda: sx.softmax_fwd(np.zeros((2, 3)), 2), ValueError, r'softmax_fwd: axis must lie in'),
    (lambda: sx.softmax_fwd(np.zeros((2, 3), np.int64)), TypeError,
     'softmax_fwd: x must be a float16, bfloat16, float32 or float64 array, got dtype int64'),
    (lambda: sx.softmax_bwd(np.zeros((2, 3)), np.zeros((3, 2))), ValueError,
     'softmax_bwd: y and dy'),
    (lambda: sx.softmax_xent_fwd(np.zeros((2, 3)), np.zeros((2, 4))), ValueError,
     'softmax_xent_fwd: logits and target'),
    (lambda: sx.softmax_xent_bwd(np.zeros((2, 3)), np.zeros((2, 3)), np.zeros(3), np.zeros(2)),
     ValueError, r'softmax_xent_bwd: lse must have shape \(2,\)'),
    (lambda: sx.categorical_xent_probs_fwd(np.ones((2, 3)), np.ones((2, 3)), -1, 0.7),
     ValueError, 'categorical_xent_probs_fwd: epsilon'),
    (lambda: sx.binary_xent_probs_bwd(np.ones(3), np.ones(3), np.ones(2)), ValueError,
     'binary_xent_probs_bwd: probs and dloss'),
])
def test_bad_arguments_name_the_function(call, error, message):
    with pytest.raises(error, match=message):
        call()
