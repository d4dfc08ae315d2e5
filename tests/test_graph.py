"""Tensors as Keras uses them: operators, identity hashing, attributes, static shapes."""
import numpy as np
import pytest

from gpuk import backend as K
from tests.gradcheck import check_gradients


def test_python_operators_and_reflected_forms(on_device):
    x = K.placeholder((None, 3))
    a = np.array([[1., -2., 3.], [4., 5., -6.]], dtype=np.float32)
    outputs = [x + 1, 1 + x, x - 2, 2 - x, x * 3, 3 * x, x / 4, 4 / x, x ** 2, 2 ** x, -x, abs(x),
               x // 2, x % 3, a + x, x @ K.constant(np.eye(3))]
    expected = [a + 1, 1 + a, a - 2, 2 - a, a * 3, 3 * a, a / 4, 4 / a, a ** 2, 2 ** a, -a, abs(a),
                a // 2, a % 3, a + a, a]
    values = K.function([x], outputs)([a])
    for got, want in zip(values, expected):
        np.testing.assert_allclose(got, want, rtol=1e-6)
        assert got.dtype == np.float32


def test_comparisons_return_tensors_but_equality_is_identity():
    x = K.placeholder((2,))
    y = K.placeholder((2,))
    f = K.function([x, y], [x < y, x <= y, x > y, x >= y])
    lt, le, gt, ge = f([np.array([1., 2.]), np.array([2., 2.])])
    np.testing.assert_array_equal(lt, [True, False])
    np.testing.assert_array_equal(le, [True, True])
    np.testing.assert_array_equal(gt, [False, False])
    np.testing.assert_array_equal(ge, [False, True])
    assert (x == y) is False and (x == x) is True and (x != y) is True
    table = {x: 'x', y: 'y'}
    assert table[x] == 'x' and len({x, y, x}) == 2


def test_tensors_take_arbitrary_attributes():
    x = K.placeholder((None, 4))
    x._keras_shape = (None, 4)
    x._keras_history = ('layer', 0, 0)
    x._uses_learning_phase = True
    assert K.is_keras_tensor(x) and x._uses_learning_phase
    assert K.int_shape(x) == (None, 4)


def test_tensors_refuse_truth_iteration_and_len():
    x = K.placeholder((3,))
    with pytest.raises(TypeError, match='truth value'):
        bool(x)
    with pytest.raises(TypeError, match='not iterable'):
        list(x)
    with pytest.raises(TypeError, match='len'):
        len(x)


def test_static_shape_inference_and_build_time_errors():
    x = K.placeholder((None, 3))
    y = K.placeholder((4, 3))
    assert K.int_shape(x + y) == (4, 3)
    assert K.int_shape(x * K.placeholder((None, 1))) == (None, 3)
    with pytest.raises(ValueError, match=r'add: shapes .*\(None, 3\).* and .*\(1, 5\).* cannot be broadcast'):
        x + K.placeholder((1, 5))
    with pytest.raises(ValueError, match='reshape: cannot reshape a tensor of shape'):
        K.reshape(y, (5, 2))


def test_symbolic_shape_mixes_with_ints():
    x = K.placeholder((None, 6))
    batch = K.shape(x)[0]
    reshaped = K.reshape(x, (batch, 2, 3))
    zeros = K.zeros((batch, 3))
    assert K.int_shape(reshaped) == (None, 2, 3)
    assert K.int_shape(zeros) == (None, 3)
    f = K.function([x], [reshaped, zeros, K.shape(x), batch * 2])
    r, z, s, b2 = f([np.ones((5, 6))])
    assert r.shape == (5, 2, 3) and z.shape == (5, 3) and not z.any()
    np.testing.assert_array_equal(s, [5, 6])
    assert b2 == 10


def test_static_shapes_fold_into_static_results():
    y = K.placeholder((4, 6))
    n = K.shape(y)[0] * 3
    assert K.int_shape(K.reshape(y, (n, 2))) == (12, 2)
    assert K.int_shape(K.ones((K.shape(y)[1], 2))) == (6, 2)


def test_getitem_forms_and_gradient(on_device):
    x = K.placeholder((None, 4, 5))
    a = np.arange(3 * 4 * 5, dtype=np.float32).reshape(3, 4, 5)
    i = K.shape(x)[0] - 1
    outputs = [x[0], x[:, 1], x[..., ::-1], x[None], x[i], x[:, 1:3, ::2], x[..., 2], x[1:, None, -1]]
    expected = [a[0], a[:, 1], a[..., ::-1], a[None], a[2], a[:, 1:3, ::2], a[..., 2], a[1:, None, -1]]
    for out, want, got in zip(outputs, expected, K.function([x], outputs)([a])):
        np.testing.assert_array_equal(got, want)
        assert all(s is None or s == g for s, g in zip(K.int_shape(out), got.shape))
    check_gradients(lambda t: t[1:, ::-1] * t[0] + t[K.shape(t)[0] - 1], np.random.rand(3, 4))


def test_getitem_rejects_bad_indices():
    x = K.placeholder((2, 3))
    with pytest.raises(ValueError, match='getitem: too many indices'):
        x[0, 1, 2]
    with pytest.raises(TypeError, match='getitem: index entries'):
        x['a']
    with pytest.raises(ValueError, match='getitem: index 5 is out of range'):
        x[5]


def test_binary_ops_convert_python_and_numpy_operands_to_the_tensor_dtype():
    x = K.placeholder((2,), dtype='float32')
    assert (x + np.float64(1.5)).dtype == 'float32'
    assert (x * np.ones(2, dtype=np.float64)).dtype == 'float32'
    i = K.placeholder((2,), dtype='int32')
    assert (i + 1).dtype == 'int32'
    assert (i * 0.5).dtype == K.floatx()
    assert (i / 2).dtype == K.floatx()
    got = K.function([i], [i / 2, i // 2])([np.array([3, 4])])
    np.testing.assert_allclose(got[0], [1.5, 2.0])
    np.testing.assert_array_equal(got[1], [1, 2])


def test_lists_mixing_tensors_and_numbers_are_stacked():
    x = K.placeholder((None, 3))
    size = K.prod([K.shape(x)[0], 3, K.shape(x)[1]])
    assert K.function([x], [size])([np.ones((2, 3))])[0] == 18


def test_control_dependencies_read_updated_variables():
    total = K.variable(1.0)
    update = K.update_add(total, 2.0)
    with K.control_dependencies([update]):
        after = total * 10
    before = total * 10
    f = K.function([], [after, before], updates=[update])
    assert f([]) == [30.0, 10.0]
    assert K.get_value(total) == 3.0
    with pytest.raises(TypeError, match='control_dependencies: control_inputs must be'):
        with K.control_dependencies('update'):
            pass
