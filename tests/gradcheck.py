"""Finite-difference gradient checks in float64 for graph-built functions."""
import numpy as np

from gpuk import backend as K


def check_gradients(build, *arrays, eps=1e-6, rtol=1e-5, atol=1e-8, wrt=None, seed=0):
    """Checks K.gradients of ``build`` against central differences.

    ``build(*tensors)`` gets one float64 placeholder per array and returns a tensor y.
    The scalar checked is sum(y * W) for a fixed random W, so every entry of the
    Jacobian takes part. ``wrt`` lists the argument indices to check (default: all).
    """
    arrays = [np.asarray(a, dtype=np.float64) for a in arrays]
    wrt = range(len(arrays)) if wrt is None else wrt
    placeholders = [K.placeholder(shape=a.shape, dtype='float64') for a in arrays]
    y = build(*placeholders)
    y_shape = K.function(placeholders, [y])(arrays)[0].shape
    weights = np.random.default_rng(seed).standard_normal(y_shape)
    loss = K.sum(y * K.constant(weights, dtype='float64'))
    grads = K.gradients(loss, [placeholders[i] for i in wrt])
    evaluate_loss = K.function(placeholders, [loss])
    evaluate_grads = K.function(placeholders, [g if g is not None else K.zeros_like(placeholders[i])
                                               for i, g in zip(wrt, grads)])
    analytic = evaluate_grads(arrays)
    for position, i in enumerate(wrt):
        numeric = np.zeros_like(arrays[i])
        flat = numeric.reshape(-1)
        for k in range(arrays[i].size):
            shifted = [a.copy() for a in arrays]
            shifted[i].reshape(-1)[k] += eps
            up = evaluate_loss(shifted)[0]
            shifted[i].reshape(-1)[k] -= 2 * eps
            down = evaluate_loss(shifted)[0]
            flat[k] = (up - down) / (2 * eps)
        np.testing.assert_allclose(analytic[position], numeric, rtol=rtol, atol=atol,
                                   err_msg='gradient of argument %d' % i)
    return analytic


def numeric_gradient(f, array, eps=1e-6):
    """Central differences of the scalar ``f()`` with respect to each entry of ``array``
    (perturbed in place and restored)."""
    grad = np.zeros_like(array)
    for k in np.ndindex(*array.shape):
        saved = array[k]
        array[k] = saved + eps
        up = f()
        array[k] = saved - eps
        down = f()
        array[k] = saved
        grad[k] = (up - down) / (2 * eps)
    return grad
