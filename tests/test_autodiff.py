import numpy as np
import pytest

from gpuk import backend as K
from tests.gradcheck import check_gradients


def test_fan_out_accumulates():
    check_gradients(lambda x: x * x + K.exp(x) * x - K.sin(x), np.random.rand(3, 2))


def test_broadcasting_gradients_reduce_to_input_shapes():
    check_gradients(lambda a, b, c: a * b + c, np.random.rand(4, 3), np.random.rand(3), np.random.rand(4, 1))


def test_broadcasting_with_unknown_dims():
    a = K.placeholder((None, 3), dtype='float64')
    b = K.variable(np.ones(3), dtype='float64')
    g = K.gradients(K.sum(a * b), [b])[0]
    assert K.int_shape(g) == (3,)
    np.testing.assert_allclose(K.function([a], [g])([np.full((5, 3), 2.0)])[0], [10.0] * 3)


def test_unary_ops_gradients():
    x = np.random.default_rng(0).uniform(0.2, 2.0, size=(2, 3))
    check_gradients(lambda t: K.tanh(t) + K.sigmoid(t) + K.softplus(t) + K.softsign(t) + K.log(t)
                    + K.sqrt(t) + K.square(t) + K.abs(t) + K.cos(t) + K.exp(t), x)


def test_binary_ops_gradients():
    rng = np.random.default_rng(1)
    a, b = rng.uniform(0.5, 2.0, (3, 2)), rng.uniform(0.5, 2.0, (3, 2))
    check_gradients(lambda x, y: x / y + K.pow(x, y) + K.maximum(x, y) * K.minimum(x, 2 * y) + (x - y) % 0.7, a, b)


def test_stop_gradient_and_disconnected_inputs():
    x = K.placeholder((2,), dtype='float64')
    y = K.placeholder((2,), dtype='float64')
    loss = K.sum(x * K.stop_gradient(x)) + K.sum(K.stop_gradient(y))
    gx, gy = K.gradients(loss, [x, y])
    assert gy is None
    np.testing.assert_allclose(K.function([x], [gx])([np.array([1.0, 3.0])])[0], [1.0, 3.0])
    z = K.placeholder((2,), dtype='float64')
    assert K.gradients(K.sum(x), [z]) == [None]


def test_integer_paths_give_no_gradient():
    x = K.placeholder((2,), dtype='float64')
    assert K.gradients(K.sum(K.cast(K.cast(x, 'int32'), 'float64') + 0 * x), [x])[0] is not None
    assert K.gradients(K.sum(K.cast(x > 0, 'float64')), [x]) == [None]


def test_second_derivatives():
    x = K.placeholder((3,), dtype='float64')
    y = K.sum(x ** 3)
    (g,) = K.gradients(y, [x])
    (h,) = K.gradients(K.sum(g), [x])
    value = np.array([1.0, -2.0, 0.5])
    np.testing.assert_allclose(K.function([x], [h])([value])[0], 6 * value)


def test_gradients_of_a_vector_loss_sum_it():
    x = K.placeholder((3,), dtype='float64')
    (g,) = K.gradients(x * 2, [x])
    np.testing.assert_allclose(K.function([x], [g])([np.zeros(3)])[0], [2.0] * 3)


def test_gradients_validate_arguments():
    with pytest.raises(TypeError, match='gradients: loss must be a tensor'):
        K.gradients(1.0, [K.placeholder((1,))])
    with pytest.raises(TypeError, match='gradients: variables must be tensors'):
        K.gradients(K.sum(K.placeholder((1,))), [np.ones(1)])
