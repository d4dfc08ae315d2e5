"""Batch-normalization K functions: values against NumPy and Keras 2.3.1's NumPy backend,
channel-first/last and non-channel reduction axes, dtypes, errors, and finite-difference
gradients of every output (mean and var included) and of the backward node itself."""
import numpy as np
import pytest

from gpuk import backend as K
from tests.gradcheck import check_gradients
from tests.keras_reference import numpy_backend

# Every test here runs on each implementation (tests/conftest.py: on_device), the CUDA kernels included.
pytestmark = pytest.mark.usefixtures('on_device')

TOL = {'float16': dict(rtol=2e-2, atol=2e-2), 'float32': dict(rtol=1e-5, atol=1e-5),
       'float64': dict(rtol=1e-10, atol=1e-12)}

# (x shape, reduction axes): channels last, channels first, non-channel reductions
LAYOUTS = [((4, 3, 2, 5), (0, 1, 2)), ((4, 5, 3, 2), (0, 2, 3)), ((6, 3, 4), (0,)),
           ((3, 4, 5), (1,)), ((5, 7), (0,))]


def _reference(x, gamma, beta, axes, epsilon):
    x = x.astype(np.float64)
    mean = x.mean(axis=axes)
    var = x.var(axis=axes)
    shape = [1 if i in axes else d for i, d in enumerate(x.shape)]
    normed = (x - mean.reshape(shape)) / np.sqrt(var.reshape(shape) + epsilon)
    return normed * gamma.reshape(shape) + beta.reshape(shape), mean, var


@pytest.mark.parametrize('dtype', ['float16', 'float32', 'float64'])
@pytest.mark.parametrize('shape,axes', LAYOUTS)
def test_normalize_batch_in_training(on_device, rng, dtype, shape, axes):
    x = (rng.standard_normal(shape) * 3 + 10).astype(dtype)
    kept = tuple(d for i, d in enumerate(shape) if i not in axes)
    gamma = rng.uniform(0.5, 2, kept).astype(dtype)
    beta = rng.standard_normal(kept).astype(dtype)
    xp, gp, bp = (K.placeholder(a.shape, dtype=dtype) for a in (x, gamma, beta))
    outs = K.normalize_batch_in_training(xp, gp, bp, list(axes), epsilon=1e-3)
    assert [K.int_shape(o) for o in outs] == [shape, kept, kept]
    normed, mean, var = K.function([xp, gp, bp], list(outs))([x, gamma, beta])
    assert normed.dtype == mean.dtype == var.dtype == dtype
    ref_y, ref_mean, ref_var = _reference(x, gamma.astype(np.float64), beta.astype(np.float64), axes, 1e-3)
    np.testing.assert_allclose(normed, ref_y, **TOL[dtype])
    np.testing.assert_allclose(mean, ref_mean, **TOL[dtype])
    np.testing.assert_allclose(var, ref_var, rtol=TOL[dtype]['rtol'], atol=TOL[dtype]['atol'] * 10)


def test_normalize_batch_without_gamma_beta(on_device, rng):
    x = rng.standard_normal((5, 3)).astype(np.float32)
    xp = K.placeholder((5, 3))
    normed, mean, var = K.function([xp], list(K.normalize_batch_in_training(xp, None, None, [0])))([x])
    ref, _, _ = _reference(x, np.ones(3), np.zeros(3), (0,), 1e-3)
    np.testing.assert_allclose(normed, ref, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize('dtype', ['float16', 'float32', 'float64'])
@pytest.mark.parametrize('axis', [1, -1])
def test_batch_normalization_matches_keras(on_device, rng, dtype, axis):
    x = rng.standard_normal((3, 4, 2, 5)).astype(dtype)
    channels = x.shape[axis]
    mean, beta = (rng.standard_normal(channels).astype(dtype) for _ in range(2))
    var, gamma = (rng.uniform(0.5, 2, channels).astype(dtype) for _ in range(2))
    placeholders = [K.placeholder(a.shape, dtype=dtype) for a in (x, mean, var, beta, gamma)]
    y, = K.function(placeholders, [K.batch_normalization(*placeholders, axis=axis)])([x, mean, var, beta, gamma])
    assert y.dtype == dtype
    shape = [1] * 4
    shape[axis] = channels
    broadcast = [a.astype(np.float64).reshape(shape) for a in (mean, var, beta, gamma)]
    expected = numpy_backend().batch_normalization(x.astype(np.float64), *broadcast, axis=axis)
    np.testing.assert_allclose(y, expected, **TOL[dtype])


def test_batch_normalization_broadcast_params_and_none(on_device, rng):
    x = rng.standard_normal((3, 5, 4)).astype(np.float32)
    mean = rng.standard_normal((1, 5, 1)).astype(np.float32)
    var = rng.uniform(0.5, 2, (1, 5, 1)).astype(np.float32)
    xp, mp, vp = K.placeholder(x.shape), K.placeholder(mean.shape), K.placeholder(var.shape)
    y, = K.function([xp, mp, vp], [K.batch_normalization(xp, mp, vp, None, None, axis=1)])([x, mean, var])
    np.testing.assert_allclose(y, (x - mean) / np.sqrt(var + 1e-3), rtol=1e-5, atol=1e-6)


def test_errors():
    x = K.placeholder((4, 3))
    with pytest.raises(ValueError, match='normalize_batch_in_training: reduction_axes must lie'):
        K.normalize_batch_in_training(x, None, None, [2])
    with pytest.raises(ValueError, match='normalize_batch_in_training: gamma must have shape'):
        K.normalize_batch_in_training(x, K.placeholder((4,)), None, [0])
    with pytest.raises(ValueError, match='normalize_batch_in_training: reduction_axes must not repeat'):
        K.normalize_batch_in_training(x, None, None, [0, -2])
    with pytest.raises(TypeError, match='normalize_batch_in_training: x must be a float'):
        K.normalize_batch_in_training(K.placeholder((4, 3), dtype='int32'), None, None, [0])
    with pytest.raises(ValueError, match='batch_normalization: mean of shape'):
        K.batch_normalization(x, K.placeholder((4, 3, 2)), K.placeholder((3,)), None, None)
    with pytest.raises(ValueError, match='batch_normalization: epsilon'):
        K.batch_normalization(x, K.placeholder((3,)), K.placeholder((3,)), None, None, epsilon=-1)


# --- gradients -----------------------------------------------------------------------------------

@pytest.mark.parametrize('shape,axes', [((3, 2, 2), (0, 1)), ((3, 2, 2), (0, 2)), ((4, 3), (1,))])
def test_gradients_of_every_output(rng, shape, axes):
    x = rng.standard_normal(shape)
    kept = tuple(d for i, d in enumerate(shape) if i not in axes)
    gamma, beta = rng.uniform(0.5, 2, kept), rng.standard_normal(kept)
    for pick in range(3):  # normed, mean, var, one at a time
        check_gradients(lambda a, g, b: K.normalize_batch_in_training(a, g, b, axes)[pick],
                        x, gamma, beta, rtol=1e-5, atol=1e-8)

    def everything(a, g, b):
        normed, mean, var = K.normalize_batch_in_training(a, g, b, axes)
        return K.sum(normed * normed) + K.sum(mean * var) + K.sum(K.sqrt(var))
    check_gradients(everything, x, gamma, beta)


def test_gradients_batch_normalization(rng):
    x = rng.standard_normal((3, 2, 4))
    mean, beta = rng.standard_normal(2), rng.standard_normal(2)
    var, gamma = rng.uniform(0.5, 2, 2), rng.uniform(0.5, 2, 2)
    check_gradients(lambda *a: K.batch_normalization(*a, axis=1), x, mean, var, beta, gamma)


def test_second_derivatives(rng):
    """The backward node differentiates again (gradient penalties through batch norm)."""
    x = rng.standard_normal((4, 3))
    gamma = rng.uniform(0.5, 2, 3)
    weights = K.constant(rng.standard_normal((4, 3)), dtype='float64')

    def gradient_norm(a, g):
        normed, mean, var = K.normalize_batch_in_training(a, g, None, [0])
        loss = K.sum(K.square(normed * weights)) + K.sum(mean * var)
        grad_x, grad_g = K.gradients(loss, [a, g])
        return K.sum(grad_x * grad_x) + K.sum(grad_g * weights[0])
    check_gradients(gradient_norm, x, gamma, rtol=1e-4, atol=1e-7)
    mean, var = rng.standard_normal(3), rng.uniform(0.5, 2, 3)

    def inference_gradient(a, m, v):
        y = K.batch_normalization(a, m, v, None, None)
        return K.gradients(K.sum(K.square(y * weights)), [a])[0]
    check_gradients(inference_gradient, x, mean, var, rtol=1e-4, atol=1e-7)
