"""NumPy batch-normalization twins against loop definitions and finite differences."""
import itertools

import numpy as np
import pytest

from gpuk.cpu_fallback import batchnorm as bn
from tests.gradcheck import numeric_gradient

DTYPES = [np.float16, np.float32, np.float64]
TOLERANCE = {np.float16: 1e-2, np.float32: 1e-5, np.float64: 1e-12}

# (x shape, reduction axes): channels last, channels first (both fast paths),
# a middle channel axis, two kept axes, a single reduced axis, rank 2.
CASES = [
    ((4, 3, 5), (0, 1)),
    ((3, 4, 2, 3), (0, 2, 3)),
    ((3, 4, 5), (0, 2)),
    ((2, 3, 4), (1,)),
    ((3, 2, 4), (0,)),
    ((6, 3), (0,)),
    ((2, 3, 2, 3), (0, 3)),
]


def _slow_moments(x, axes):
    """Mean and biased variance per kept index, with explicit loops."""
    kept = [i for i in range(x.ndim) if i not in axes]
    kept_shape = tuple(x.shape[i] for i in kept)
    mean = np.zeros(kept_shape)
    var = np.zeros(kept_shape)
    for k in np.ndindex(*kept_shape):
        values = []
        for r in itertools.product(*(range(x.shape[i]) for i in axes)):
            index = [0] * x.ndim
            for axis, value in zip(kept, k):
                index[axis] = value
            for axis, value in zip(axes, r):
                index[axis] = value
            values.append(float(x[tuple(index)]))
        m = sum(values) / len(values)
        mean[k] = m
        var[k] = sum((v - m) ** 2 for v in values) / len(values)
    return mean, var


def _bcast(stat, shape, axes):
    return stat.reshape(tuple(1 if i in axes else n for i, n in enumerate(shape)))


@pytest.mark.parametrize('dtype', DTYPES)
@pytest.mark.parametrize('shape,axes', CASES)
def test_train_fwd_matches_loops(rng, shape, axes, dtype):
    x = (rng.standard_normal(shape) * 2 + 0.5).astype(dtype)
    kept_shape = tuple(n for i, n in enumerate(shape) if i not in axes)
    gamma = rng.uniform(0.5, 1.5, kept_shape).astype(dtype)
    beta = rng.standard_normal(kept_shape).astype(dtype)
    y, mean, var, inv_std = bn.bn_train_fwd(x, gamma, beta, axes, 1e-3)

    ref_mean, ref_var = _slow_moments(x.astype(np.float64), axes)
    ref_y = ((x.astype(np.float64) - _bcast(ref_mean, shape, axes))
             / np.sqrt(_bcast(ref_var, shape, axes) + 1e-3)
             * _bcast(gamma.astype(np.float64), shape, axes) + _bcast(beta, shape, axes))
    stats_dtype = np.float32 if dtype == np.float16 else dtype
    assert y.dtype == dtype and y.shape == shape
    assert mean.dtype == var.dtype == inv_std.dtype == stats_dtype
    assert mean.shape == var.shape == inv_std.shape == kept_shape
    tol = TOLERANCE[dtype]
    stat_tol = 1e-5 if dtype == np.float16 else tol   # float16 stats are float32 sums
    np.testing.assert_allclose(mean, ref_mean, rtol=stat_tol, atol=stat_tol)
    np.testing.assert_allclose(var, ref_var, rtol=stat_tol, atol=stat_tol)
    np.testing.assert_allclose(inv_std, 1 / np.sqrt(ref_var + 1e-3), rtol=stat_tol)
    np.testing.assert_allclose(y.astype(np.float64), ref_y, rtol=tol, atol=tol * 4)


def test_train_fwd_without_gamma_beta_and_flat_params(rng):
    x = rng.standard_normal((5, 2, 3))
    y, mean, var, _ = bn.bn_train_fwd(x, None, None, (0, 2), 1e-3)
    np.testing.assert_allclose(y, (x - mean[:, None]) / np.sqrt(var[:, None] + 1e-3), rtol=1e-12)
    # two kept axes: gamma given flat (size 6) is reshaped, as Keras does
    gamma = rng.uniform(0.5, 2, 6)
    y2 = bn.bn_train_fwd(x, gamma, None, (0,), 1e-3)[0]
    y3 = bn.bn_train_fwd(x, gamma.reshape(2, 3), None, [0], 1e-3)[0]
    np.testing.assert_array_equal(y2, y3)


def test_train_fwd_statistics_survive_a_large_offset(rng):
    # one-pass E[x^2] - E[x]^2 loses every digit here in float32
    noise = rng.standard_normal((512, 3))
    x = (1e4 + noise).astype(np.float32)
    _, mean, var, _ = bn.bn_train_fwd(x, None, None, (0,), 1e-3)
    ref = x.astype(np.float64)
    np.testing.assert_allclose(mean, ref.mean(0), rtol=1e-6)
    np.testing.assert_allclose(var, ref.var(0), rtol=1e-3)


@pytest.mark.parametrize('with_stat_grads', [False, True])
@pytest.mark.parametrize('shape,axes', [CASES[0], CASES[2], CASES[3], CASES[6]])
def test_bwd_matches_finite_differences(rng, shape, axes, with_stat_grads):
    x = rng.standard_normal(shape)
    kept_shape = tuple(n for i, n in enumerate(shape) if i not in axes)
    gamma = rng.uniform(0.5, 1.5, kept_shape)
    beta = rng.standard_normal(kept_shape)
    w_y = rng.standard_normal(shape)
    w_mean = rng.standard_normal(kept_shape) if with_stat_grads else np.zeros(kept_shape)
    w_var = rng.standard_normal(kept_shape) if with_stat_grads else np.zeros(kept_shape)

    def objective():
        y, mean, var, _ = bn.bn_train_fwd(x, gamma, beta, axes, 1e-3)
        return np.sum(y * w_y) + np.sum(mean * w_mean) + np.sum(var * w_var)

    _, mean, _, inv_std = bn.bn_train_fwd(x, gamma, beta, axes, 1e-3)
    dx, dgamma, dbeta = bn.bn_bwd(w_y, x, gamma, mean, inv_std, axes,
                                  dmean=w_mean if with_stat_grads else None,
                                  dvar=w_var if with_stat_grads else None)
    np.testing.assert_allclose(dx, numeric_gradient(objective, x), rtol=1e-6, atol=1e-8)
    np.testing.assert_allclose(dgamma, numeric_gradient(objective, gamma), rtol=1e-6, atol=1e-8)
    np.testing.assert_allclose(dbeta, numeric_gradient(objective, beta), rtol=1e-6, atol=1e-8)


def test_bwd_without_gamma_is_unit_scale(rng):
    x = rng.standard_normal((4, 3))
    dy = rng.standard_normal((4, 3))
    _, mean, _, inv_std = bn.bn_train_fwd(x, None, None, (0,), 1e-3)
    with_none = bn.bn_bwd(dy, x, None, mean, inv_std, (0,))
    with_ones = bn.bn_bwd(dy, x, np.ones(3), mean, inv_std, (0,))
    for a, b in zip(with_none, with_ones):
        np.testing.assert_allclose(a, b, rtol=1e-14)


@pytest.mark.parametrize('dtype', [np.float16, np.float32])
def test_bwd_low_precision_matches_float64(rng, dtype):
    shape, axes = (6, 4, 5), (0, 2)
    x = rng.standard_normal(shape)
    dy = rng.standard_normal(shape)
    gamma = rng.uniform(0.5, 1.5, 4)
    dmean, dvar = rng.standard_normal(4), rng.standard_normal(4)
    _, mean, _, inv_std = bn.bn_train_fwd(x, gamma, None, axes, 1e-3)
    ref = bn.bn_bwd(dy, x, gamma, mean, inv_std, axes, dmean, dvar)
    xl, dyl = x.astype(dtype), dy.astype(dtype)
    _, mean_l, _, inv_l = bn.bn_train_fwd(xl, gamma.astype(dtype), None, axes, 1e-3)
    got = bn.bn_bwd(dyl, xl, gamma.astype(dtype), mean_l, inv_l, axes, dmean, dvar)
    assert got[0].dtype == dtype
    tol = TOLERANCE[dtype] * 3
    for a, b in zip(got, ref):
        np.testing.assert_allclose(a.astype(np.float64), b, rtol=tol, atol=tol)


@pytest.mark.parametrize('dtype', DTYPES)
def test_infer_fwd_on_a_channel_axis(rng, dtype):
    x = rng.standard_normal((2, 3, 4, 2)).astype(dtype)
    mean, beta = rng.standard_normal(3), rng.standard_normal(3)
    var, gamma = rng.uniform(0.5, 2, 3), rng.uniform(0.5, 2, 3)
    y = bn.bn_infer_fwd(x, mean, var, gamma, beta, 1e-3, 1)
    ref = np.zeros(x.shape)
    for n, c, h, w in np.ndindex(*x.shape):
        ref[n, c, h, w] = ((float(x[n, c, h, w]) - mean[c]) / np.sqrt(var[c] + 1e-3)
                           * gamma[c] + beta[c])
    assert y.dtype == dtype
    np.testing.assert_allclose(y.astype(np.float64), ref, rtol=TOLERANCE[dtype],
                               atol=TOLERANCE[dtype] * 4)


def test_infer_fwd_broadcast_shapes_and_none(rng):
    x = rng.standard_normal((3, 4, 5))
    mean = rng.standard_normal((1, 4, 1))
    var = rng.uniform(0.5, 2, (1, 4, 1))
    y = bn.bn_infer_fwd(x, mean, var, None, None, 1e-3, 1)
    np.testing.assert_allclose(y, (x - mean) / np.sqrt(var + 1e-3), rtol=1e-12)
    # train and infer agree when fed the batch statistics (last axis)
    y_train, m, v, _ = bn.bn_train_fwd(x, None, None, (0, 1), 1e-3)
    np.testing.assert_allclose(bn.bn_infer_fwd(x, m, v, None, None, 1e-3, -1), y_train,
                               rtol=1e-12)


@pytest.mark.parametrize('call,message', [
    (lambda x: bn.bn_train_fwd(x, None, None, (0, 3), 1e-3), 'bn_train_fwd: axes'),
    (lambda x: bn.bn_train_fwd(x, None, None, (0, 0), 1e-3), 'bn_train_fwd: axes'),
    (lambda x: bn.bn_train_fwd(x, np.ones(4), None, (0, 1), 1e-3), 'bn_train_fwd: gamma'),
    (lambda x: bn.bn_train_fwd(x, None, None, (0,), -1.0), 'bn_train_fwd: epsilon'),
    (lambda x: bn.bn_bwd(x[:1], x, None, np.zeros(5), np.ones(5), (0, 1)), 'bn_bwd: dy'),
    (lambda x: bn.bn_bwd(x, x, None, np.zeros(4), np.ones(5), (0, 1)), 'bn_bwd: mean'),
    (lambda x: bn.bn_infer_fwd(x, np.zeros(4), np.ones(5), None, None, 1e-3, -1),
     'bn_infer_fwd: mean'),
    (lambda x: bn.bn_infer_fwd(x, np.zeros(5), np.ones(5), None, None, 1e-3, 3),
     'bn_infer_fwd: axis'),
])
def test_bad_arguments_name_the_function(call, message):
    with pytest.raises(ValueError, match=message):
        call(np.zeros((2, 3, 5)))


def test_integer_input_is_a_type_error():
    with pytest.raises(TypeError, match='bn_train_fwd: x'):
        bn.bn_train_fwd(np.zeros((2, 3), dtype=np.int32), None, None, (0,), 1e-3)
    with pytest.raises(TypeError, match='bn_train_fwd: axes'):
        bn.bn_train_fwd(np.zeros((2, 3)), None, None, (0.5,), 1e-3)


# ---------------------------------------------------------------- fusions

def _plain_reference(x, gamma, beta, axes, epsilon):
    """float64 normalize / scale / shift written out with keepdims reductions."""
    x = x.astype(np.float64)
    mean = x.mean(axis=axes, keepdims=True)
    var = ((x - mean) ** 2).mean(axis=axes, keepdims=True)
    shape = mean.shape
    return (x - mean) / np.sqrt(var + epsilon) * gamma.astype(np.float64).reshape(shape) \
        + beta.astype(np.float64).reshape(shape), mean, var


@pytest.mark.parametrize('dtype', DTYPES)
@pytest.mark.parametrize('shape, axes', CASES)
def test_relu_epilogue_and_moving_averages_against_reference(dtype, shape, axes):
    rng = np.random.default_rng(sum(shape))
    kept = tuple(s for i, s in enumerate(shape) if i not in axes)
    x = rng.standard_normal(shape).astype(dtype)
    gamma, beta = rng.uniform(0.5, 1.5, kept).astype(dtype), rng.standard_normal(kept).astype(dtype)
    moving_mean, moving_var = rng.standard_normal(kept), rng.uniform(0.5, 2, kept)
    y, mean, var, _, next_mean, next_var = bn.bn_train_fwd(x, gamma, beta, axes, 1e-3, 'relu', moving_mean,
                                                          moving_var, 0.1, 0.2, 1.5)
    pre, ref_mean, ref_var = _plain_reference(x, gamma, beta, axes, 1e-3)
    tol = TOLERANCE[dtype]
    np.testing.assert_allclose(y, np.maximum(pre, 0), rtol=tol, atol=tol)
    np.testing.assert_allclose(next_mean, moving_mean - (moving_mean - ref_mean.reshape(kept)) * 0.1,
                               rtol=tol, atol=tol)
    np.testing.assert_allclose(next_var, moving_var - (moving_var - ref_var.reshape(kept) * 1.5) * 0.2,
                               rtol=tol, atol=tol)

    # the relu backward is the plain backward of dy masked by the fused output
    dy = rng.standard_normal(shape).astype(dtype)
    _, mean, _, inv_std = bn.bn_train_fwd(x, gamma, beta, axes)
    got = bn.bn_bwd(dy, x, gamma, mean, inv_std, axes, activation='relu', y=y)
    want = bn.bn_bwd(np.where(y > 0, dy, 0).astype(dtype), x, gamma, mean, inv_std, axes)
    for a, b in zip(got, want):
        np.testing.assert_array_equal(a, b)


def test_relu_infer_against_reference():
    rng = np.random.default_rng(0)
    x = rng.standard_normal((3, 4, 5))
    mean, var, gamma, beta = rng.standard_normal(4), rng.uniform(0.5, 2, 4), rng.uniform(0.5, 1.5, 4), \
        rng.standard_normal(4)
    shape = (1, 4, 1)
    want = np.maximum((x - mean.reshape(shape)) / np.sqrt(var.reshape(shape) + 1e-3) * gamma.reshape(shape)
                      + beta.reshape(shape), 0)
    np.testing.assert_allclose(bn.bn_infer_fwd(x, mean, var, gamma, beta, 1e-3, 1, 'relu'), want, rtol=1e-13)
