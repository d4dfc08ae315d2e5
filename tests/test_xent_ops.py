"""Softmax and cross-entropy K functions: values against NumPy and Keras 2.3.1's NumPy
backend, dtypes, axes, extreme logits, the softmax / sigmoid graph rewrites, errors, and
finite-difference gradients (second derivatives included)."""
import numpy as np
import pytest

from gpuk import backend as K
from gpuk.graph import apply
from gpuk.ops import softmax_xent as xent_ops
from tests.gradcheck import check_gradients
from tests.keras_reference import numpy_backend

# Every test here runs on each implementation (tests/conftest.py: on_device), the CUDA kernels included.
pytestmark = pytest.mark.usefixtures('on_device')

TOL = {'float16': dict(rtol=2e-2, atol=2e-2), 'float32': dict(rtol=1e-5, atol=1e-6),
       'float64': dict(rtol=1e-10, atol=1e-12)}


def _log_softmax(x, axis):
    x = np.asarray(x, np.float64)
    m = x.max(axis, keepdims=True)
    return x - m - np.log(np.exp(x - m).sum(axis, keepdims=True))


def _run(build, *arrays, dtypes=None):
    dtypes = dtypes or [a.dtype.name for a in arrays]
    ps = [K.placeholder(shape=a.shape, dtype=d) for a, d in zip(arrays, dtypes)]
    outs = build(*ps)
    outs = outs if isinstance(outs, (list, tuple)) else [outs]
    return K.function(ps, list(outs))(list(arrays))


def _one_hot(labels, classes, axis):
    return np.moveaxis(np.eye(classes)[labels], -1, axis)


@pytest.mark.parametrize('dtype', ['float16', 'float32', 'float64'])
@pytest.mark.parametrize('axis', [0, 1, -1])
def test_softmax_matches_numpy_and_keras(on_device, rng, dtype, axis):
    x = (rng.standard_normal((3, 4, 5)) * 3).astype(dtype)
    y, = _run(lambda p: K.softmax(p, axis=axis), x)
    assert y.dtype == dtype
    expected = np.exp(_log_softmax(x, axis))
    np.testing.assert_allclose(y.astype(np.float64), expected, **TOL[dtype])
    np.testing.assert_allclose(y.astype(np.float64), numpy_backend().softmax(x.astype(np.float64), axis),
                               **TOL[dtype])


def test_softmax_extreme_logits_and_errors(on_device):
    x = np.array([[1e4, -1e4, 0.0], [-1e4, -1e4, -1e4]], dtype=np.float32)
    y, = _run(K.softmax, x)
    np.testing.assert_allclose(y, [[1, 0, 0], [1 / 3, 1 / 3, 1 / 3]], rtol=1e-6)
    with pytest.raises(ValueError, match='softmax: axis'):
        K.softmax(K.placeholder((2, 3)), axis=2)
    with pytest.raises(TypeError, match='softmax: x must be a float'):
        K.softmax(K.placeholder((2, 3), dtype='int32'))


@pytest.mark.parametrize('dtype', ['float16', 'float32', 'float64'])
@pytest.mark.parametrize('axis', [1, -1])
def test_categorical_crossentropy_probs_and_logits(on_device, rng, dtype, axis):
    logits = rng.standard_normal((3, 4, 5)).astype(dtype)
    target = rng.random((3, 4, 5)).astype(dtype)
    probs = np.exp(_log_softmax(logits, axis)).astype(dtype)
    from_probs, from_logits = _run(
        lambda t, p, x: [K.categorical_crossentropy(t, p, axis=axis),
                         K.categorical_crossentropy(t, x, from_logits=True, axis=axis)],
        target, probs, logits)
    assert from_probs.dtype == dtype and from_logits.dtype == dtype
    p64 = probs.astype(np.float64)
    clipped = np.clip(p64 / p64.sum(axis, keepdims=True), 1e-7, 1 - 1e-7)
    np.testing.assert_allclose(from_probs, -(target * np.log(clipped)).sum(axis), **TOL[dtype])
    np.testing.assert_allclose(from_logits, -(target * _log_softmax(logits, axis)).sum(axis), **TOL[dtype])
    if axis == -1:
        keras = numpy_backend().categorical_crossentropy(target.astype(np.float64), p64.copy())
        np.testing.assert_allclose(from_probs, keras, **TOL[dtype])


def test_cross_entropy_steps_give_the_same_results_run_after_run_on_strided_inputs(on_device, rng):
    """A plan step's cross-entropy variant passes the inputs that are contiguous rows already as
    they are and converts the others (a transposed target, a broadcast gradient seed), tested
    once on the kept layouts: the same loss and gradient on every run."""
    logits = rng.standard_normal((4, 3, 5)).astype(np.float32)
    target = rng.random((3, 4, 5)).astype(np.float32)
    x, t = K.placeholder((4, 3, 5)), K.placeholder((3, 4, 5))
    loss = K.categorical_crossentropy(K.permute_dimensions(t, (1, 0, 2)), x, from_logits=True)
    f = K.function([x, t], [loss, K.gradients(K.sum(loss), [x])[0]])
    moved = np.transpose(target, (1, 0, 2))
    want_loss = -(moved * _log_softmax(logits, -1)).sum(-1)
    want_grad = np.exp(_log_softmax(logits, -1)) * moved.sum(-1, keepdims=True) - moved
    for _ in range(4):
        got_loss, got_grad = f([logits, target])
        np.testing.assert_allclose(got_loss, want_loss, **TOL['float32'])
        np.testing.assert_allclose(got_grad, want_grad, **TOL['float32'])


@pytest.mark.parametrize('dtype', ['float16', 'float32', 'float64'])
def test_softmax_rewrite_is_stable(on_device, dtype):
    """softmax probabilities underflow to 0; the loss of the softmax node stays finite and
    its gradient is softmax - target (TensorFlow's rewrite)."""
    logits = np.array([[1e4, -1e4, 0.0], [0.0, 1e4, -1e4]], dtype=dtype)
    target = np.array([[0, 1, 0], [0.25, 0, 0.75]], dtype=dtype)
    x, t = K.placeholder((2, 3), dtype=dtype), K.placeholder((2, 3), dtype=dtype)
    loss = K.categorical_crossentropy(t, K.softmax(x))
    grad = K.gradients(K.sum(loss), [x])[0]
    value, g = K.function([x, t], [loss, grad])([logits, target])
    assert isinstance(loss.node.op, xent_ops.SoftmaxXent)
    assert np.all(np.isfinite(value))
    expected = -(target * _log_softmax(logits, -1)).sum(-1)
    np.testing.assert_allclose(value.astype(np.float64), expected, rtol=1e-3)
    np.testing.assert_allclose(g.astype(np.float64), np.exp(_log_softmax(logits, -1)) - target, atol=1e-6)


def test_keras_spelled_softmax_is_rewritten(on_device, rng):
    """keras.activations.softmax spells rank > 2 softmax as exp(x - max) / sum."""
    x = K.placeholder((2, 3, 4))
    e = K.exp(x - K.max(x, axis=-1, keepdims=True))
    probs = e / K.sum(e, axis=-1, keepdims=True)
    t = K.placeholder((2, 3, 4))
    loss = K.categorical_crossentropy(t, probs)
    assert isinstance(loss.node.op, xent_ops.SoftmaxXent)
    other_axis = K.categorical_crossentropy(t, probs, axis=1)
    assert isinstance(other_axis.node.op, xent_ops.CategoricalXentProbs)
    logits = (rng.standard_normal((2, 3, 4)) * 50).astype(np.float32)
    target = _one_hot(rng.integers(0, 4, (2, 3)), 4, -1).astype(np.float32)
    value, = K.function([x, t], [loss])([logits, target])
    np.testing.assert_allclose(value, -(target * _log_softmax(logits, -1)).sum(-1), rtol=1e-5)


@pytest.mark.parametrize('dtype', ['float16', 'float32', 'float64'])
@pytest.mark.parametrize('target_form', ['int', 'float_trailing_1'])
@pytest.mark.parametrize('axis', [1, -1])
def test_sparse_categorical_crossentropy(on_device, rng, dtype, target_form, axis):
    logits = (rng.standard_normal((3, 5, 4)) * 4).astype(dtype)
    classes = logits.shape[axis]
    labels = rng.integers(0, classes, (3, 4) if axis == 1 else (3, 5))
    target = labels if target_form == 'int' else labels[..., None].astype(dtype)
    probs = np.exp(_log_softmax(logits, axis)).astype(dtype)
    from_logits, from_probs, from_softmax = _run(
        lambda t, x, p: [K.sparse_categorical_crossentropy(t, x, from_logits=True, axis=axis),
                         K.sparse_categorical_crossentropy(t, p, axis=axis),
                         K.sparse_categorical_crossentropy(t, K.softmax(x, axis=axis), axis=axis)],
        target, logits, probs)
    picked = np.take_along_axis(_log_softmax(logits, axis), np.expand_dims(labels, axis), axis)
    expected = -np.squeeze(picked, axis)
    np.testing.assert_allclose(from_logits, expected, **TOL[dtype])
    np.testing.assert_allclose(from_softmax, expected, **TOL[dtype])
    # TensorFlow's probability path: log of the clipped probabilities, renormalized
    log_clipped = np.log(np.clip(probs.astype(np.float64), 1e-7, 1 - 1e-7))
    tf_expected = -np.squeeze(np.take_along_axis(_log_softmax(log_clipped, axis),
                                                 np.expand_dims(labels, axis), axis), axis)
    np.testing.assert_allclose(from_probs, tf_expected, **TOL[dtype])
    keras = numpy_backend().categorical_crossentropy(
        _one_hot(labels, classes, -1), np.moveaxis(probs.astype(np.float64), axis, -1).copy())
    # Keras's NumPy backend normalizes before clipping: equal up to the clipped tails
    np.testing.assert_allclose(from_probs, keras, rtol=max(TOL[dtype]['rtol'], 1e-6), atol=TOL[dtype]['atol'])


def test_sparse_categorical_errors(on_device):
    out = K.placeholder((2, 3))
    with pytest.raises(ValueError, match=r'sparse_categorical_crossentropy: target must lie in \[0, 3\)'):
        K.sparse_categorical_crossentropy(K.constant([[0], [3]], dtype='int32'), out)
    with pytest.raises(ValueError, match='sparse_categorical_crossentropy: target must have the shape'):
        K.sparse_categorical_crossentropy(K.placeholder((2, 3, 2)), out)
    t = K.placeholder((2, 1))
    f = K.function([t, out], [K.sparse_categorical_crossentropy(t, out)])
    probs = np.full((2, 3), 1 / 3, dtype=np.float32)
    with pytest.raises(ValueError, match='sparse_categorical_crossentropy: target must hold integer'):
        f([np.array([[0.5], [1]]), probs])
    with pytest.raises(ValueError, match=r'sparse_categorical_crossentropy: target must lie in \[0, 3\).*-1'):
        f([np.array([[-1], [1]]), probs])
    with pytest.raises(ValueError, match='categorical_crossentropy: target and output must have the same shape'):
        K.categorical_crossentropy(K.placeholder((2, 4)), out)


@pytest.mark.usefixtures('deferred_checks')
def test_bad_label_in_a_training_step_changes_no_variable_and_syncs_once(on_device):
    """The label range is checked on the device (gpuk/kernels/runtime/deferred.py): the call
    raises the eager check's message and applies no update; a good call copies no flag to the
    host per op, only the one read of the pending flags."""
    from gpuk.kernels import runtime
    w = K.variable(np.ones((3, 4), np.float32))
    x, t = K.placeholder((2, 3)), K.placeholder((2,), dtype='int32')
    loss = K.mean(K.sparse_categorical_crossentropy(t, K.dot(x, w), from_logits=True))
    step = K.function([x, t], [loss], updates=[K.update_sub(w, 0.1 * K.gradients(loss, [w])[0])])
    inputs = np.ones((2, 3), np.float32)
    with pytest.raises(ValueError, match=r'sparse_categorical_crossentropy: target must lie in \[0, 4\) '
                                         r'\(the number of classes\), got values in \[1, 7\]'):
        step([inputs, np.array([1, 7], np.int32)])
    np.testing.assert_array_equal(K.get_value(w), np.ones((3, 4), np.float32))
    if on_device == 'emulate':
        rt = runtime.get_runtime('emulate')
        before = rt.host_syncs = getattr(rt, 'host_syncs', 0)
        step([inputs, np.array([1, 3], np.int32)])
        assert rt.host_syncs - before == 1   # the pending flags, read once per call
    else:
        step([inputs, np.array([1, 3], np.int32)])
    assert not np.array_equal(K.get_value(w), np.ones((3, 4), np.float32))


@pytest.mark.parametrize('dtype', ['float16', 'float32', 'float64'])
def test_binary_crossentropy(on_device, rng, dtype):
    logits = (rng.standard_normal((4, 3)) * 4).astype(dtype)
    target = rng.random((4, 3)).astype(dtype)
    probs = (1 / (1 + np.exp(-logits.astype(np.float64)))).astype(dtype)
    from_probs, from_logits = _run(
        lambda t, p, x: [K.binary_crossentropy(t, p), K.binary_crossentropy(t, x, from_logits=True)],
        target, probs, logits)
    z, x = target.astype(np.float64), logits.astype(np.float64)
    np.testing.assert_allclose(from_logits, np.maximum(x, 0) - x * z + np.log1p(np.exp(-np.abs(x))), **TOL[dtype])
    keras = numpy_backend().binary_crossentropy(z, probs.astype(np.float64))
    np.testing.assert_allclose(from_probs, keras, **TOL[dtype])


def test_sigmoid_rewrite_is_stable(on_device):
    logits = np.array([1e4, -1e4, 0.0, 30.0], dtype=np.float32)
    target = np.array([0.0, 1.0, 0.5, 1.0], dtype=np.float32)
    x, t = K.placeholder((4,)), K.placeholder((4,))
    loss = K.binary_crossentropy(t, K.sigmoid(x))
    assert isinstance(loss.node.op, xent_ops.BinaryXentLogits)
    value, g = K.function([x, t], [loss, K.gradients(K.sum(loss), [x])[0]])([logits, target])
    np.testing.assert_allclose(value, [1e4, 1e4, np.log(2), np.log1p(np.exp(-30.0))], rtol=1e-6)
    np.testing.assert_allclose(g, [1, -1, 0, 1 / (1 + np.exp(-30.0)) - 1], atol=1e-7)


# --- finite-difference gradients ---------------------------------------------------------------

def test_gradients_softmax_and_log_softmax(rng):
    x = rng.standard_normal((2, 3, 4))
    check_gradients(lambda p: K.softmax(p, axis=1), x)
    check_gradients(lambda p: xent_ops.log_softmax(p, axis=-1), x)


def test_gradients_fused_crossentropies(rng):
    logits, target = rng.standard_normal((3, 4)), rng.random((3, 4))
    check_gradients(lambda x, t: K.categorical_crossentropy(t, x, from_logits=True, axis=0), logits, target)
    check_gradients(lambda x, t: K.categorical_crossentropy(t, K.softmax(x)), logits, target)
    check_gradients(lambda x, t: K.binary_crossentropy(t, x, from_logits=True), logits, target)
    labels = K.constant([[2], [0], [3]], dtype='int32')
    check_gradients(lambda x: K.sparse_categorical_crossentropy(labels, x, from_logits=True), logits)


def test_gradients_probability_crossentropies(rng):
    probs = rng.uniform(0.1, 0.9, (3, 4))
    target = rng.random((3, 4))
    check_gradients(lambda p, t: K.categorical_crossentropy(t, p), probs, target)
    check_gradients(lambda p, t: K.binary_crossentropy(t, p), probs, target)
    labels = K.constant([1, 0, 3], dtype='float32')
    check_gradients(lambda p: K.sparse_categorical_crossentropy(labels, p), probs)


def test_gradient_of_lse_by_product(rng):
    """The log-sum-exp output of the fused node has its own exact gradient."""
    logits, target = rng.standard_normal((2, 5)), rng.random((2, 5))

    def build(x, t):
        loss, lse = apply(xent_ops.SoftmaxXent(1), x, t)
        return loss * 2 + lse * lse
    check_gradients(build, logits, target)


def test_second_derivatives(rng):
    logits, target = rng.standard_normal((2, 4)), rng.random((2, 4))
    weights = K.constant(rng.standard_normal((2, 4)), dtype='float64')

    def gradient_of(loss_fn):
        def build(x, t):
            loss = loss_fn(x, t)
            loss = K.sum(loss, axis=-1) if loss.ndim == 2 else loss
            return K.gradients(K.sum(loss * K.sum(weights * x, axis=-1)), [x])[0]
        return build
    check_gradients(gradient_of(lambda x, t: K.categorical_crossentropy(t, x, from_logits=True)),
                    logits, target, rtol=1e-4)
    check_gradients(gradient_of(lambda x, t: K.binary_crossentropy(t, x, from_logits=True)),
                    logits, target, rtol=1e-4)
    check_gradients(lambda x: K.gradients(K.sum(K.softmax(x) * weights), [x])[0], logits, rtol=1e-4)
    probs = rng.uniform(0.1, 0.9, (2, 4))
    check_gradients(gradient_of(lambda p, t: K.categorical_crossentropy(t, p)), probs, target, rtol=1e-4)
    check_gradients(gradient_of(lambda p, t: K.binary_crossentropy(t, p)), probs, target, rtol=1e-4)


def test_a_failed_run_leaves_no_check_pending(on_device):
    """device.run_checked (K.function's plan runner): when the run itself fails, a failed
    deferred check is raised instead, a passing one is dropped, and the next call starts clean."""
    from gpuk import device
    from gpuk.kernels.runtime import deferred
    impl = device.impl()

    def failing_run(bad):
        impl.check_later(impl.xp.asarray(bad), lambda: (_ for _ in ()).throw(ValueError('f: labels are bad')))
        raise RuntimeError('a later op failed')

    with pytest.raises(RuntimeError, match='a later op failed'):
        device.run_checked(failing_run, False)
    if on_device != 'cpu':   # on the NumPy device the check ran at once
        assert deferred.pending_count() == 0
    with pytest.raises(ValueError, match='f: labels are bad'):
        device.run_checked(failing_run, True)
    assert device.run_checked(lambda: 7) == 7
