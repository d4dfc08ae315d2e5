"""Variables, constants, placeholders and the static-information K functions."""
import numpy as np
import pytest
import scipy.sparse

from gpuk import backend as K


def test_variable_values_dtypes_and_keras_attributes(on_device):
    v = K.variable([[1, 2], [3, 4]])
    assert K.dtype(v) == 'float32' and K.int_shape(v) == (2, 2) and v._keras_shape == (2, 2)
    assert K.is_variable(v) and K.is_tensor(v) and not K.is_keras_tensor(v)
    assert v._uses_learning_phase is False and v.constraint is None
    i = K.variable(np.arange(3), dtype='int32')
    b = K.variable(np.array([True, False]), dtype='bool')
    assert K.get_value(i).dtype == np.int32 and K.get_value(b).dtype == np.bool_
    np.testing.assert_array_equal(K.eval(i * 2), [0, 2, 4])
    constraint = object()
    assert K.variable(1.0, constraint=constraint).constraint is constraint


def test_variable_names_are_unique_and_scoped():
    a = K.variable(0.0, name='kernel')
    b = K.variable(0.0, name='kernel')
    with K.name_scope('dense_1') as scope:
        c = K.variable(0.0, name='kernel')
        with K.name_scope('inner'):
            d = K.variable(0.0, name='bias')
    assert scope == 'dense_1/'
    assert a.name == 'kernel' and b.name == 'kernel_1'
    assert c.name == 'dense_1/kernel' and d.name == 'dense_1/inner/bias'
    with pytest.raises(TypeError, match='name_scope: name must be a string'):
        with K.name_scope(3):
            pass


def test_set_value_and_batch_set_value_are_checked(on_device):
    v = K.variable(np.zeros((2, 2)))
    w = K.variable(np.zeros(3))
    K.set_value(v, np.ones((2, 2)))
    np.testing.assert_array_equal(K.get_value(v), np.ones((2, 2)))
    assert K.get_value(v).dtype == np.float32
    with pytest.raises(ValueError, match=r'set_value: value of shape \(3,\) does not fit variable .* \(2, 2\)'):
        K.set_value(v, np.ones(3))
    with pytest.raises(ValueError, match='batch_set_value'):
        K.batch_set_value([(w, np.ones(3)), (v, np.ones(5))])
    np.testing.assert_array_equal(K.get_value(w), np.zeros(3))  # nothing changed
    K.batch_set_value([(w, [1, 2, 3]), (v, np.full((2, 2), 2))])
    assert K.batch_get_value([w, v])[0].tolist() == [1, 2, 3]
    with pytest.raises(TypeError, match='set_value: expected a variable'):
        K.set_value(K.constant(1.0), 2.0)


def test_constants_placeholders_and_fills():
    c = K.constant(2.0, shape=(2, 3))
    assert K.int_shape(c) == (2, 3) and K.dtype(c) == 'float32'
    np.testing.assert_array_equal(K.eval(c), np.full((2, 3), 2.0))
    assert K.dtype(K.constant([1, 2], dtype='int64')) == 'int64'
    p = K.placeholder(ndim=3)
    assert K.int_shape(p) == (None, None, None) and K.is_placeholder(p) and K.ndim(p) == 3
    with pytest.raises(ValueError, match='placeholder: give shape or ndim'):
        K.placeholder()
    with pytest.raises(ValueError, match='placeholder: shape entries must be'):
        K.placeholder((2, -1))
    assert K.eval(K.zeros((2, 3))).shape == (2, 3) and K.is_variable(K.ones((2,)))
    np.testing.assert_array_equal(K.eval(K.eye(3)), np.eye(3))
    np.testing.assert_array_equal(K.eval(K.eye((2, 3))), np.eye(2, 3))
    np.testing.assert_array_equal(K.eval(K.zeros_like(c)), np.zeros((2, 3)))
    assert K.count_params(K.zeros((4, 5))) == 20
    with pytest.raises(ValueError, match='count_params'):
        K.count_params(p)


def test_is_checks_on_plain_objects():
    assert not K.is_tensor(np.ones(2)) and not K.is_variable(np.ones(2)) and not K.is_variable('x')
    with pytest.raises(ValueError, match='is_keras_tensor: expected a symbolic tensor'):
        K.is_keras_tensor(np.ones(2))
    assert K.int_shape(np.ones((2, 3))) == (2, 3)
    assert K.dtype(np.ones(2, dtype=np.int8)) == 'int8'


def test_sparse_inputs_compute_densely():
    matrix = scipy.sparse.random(4, 3, density=0.5, random_state=0, format='csr')
    v = K.variable(matrix)
    assert K.is_sparse(v) and K.int_shape(v) == (4, 3)
    np.testing.assert_allclose(K.eval(K.to_dense(v)), matrix.toarray(), rtol=1e-6)
    p = K.placeholder((None, 3), sparse=True)
    assert K.is_sparse(p) and not K.is_sparse(K.placeholder((2,)))
    np.testing.assert_allclose(K.function([p], [p * 2])([matrix])[0], matrix.toarray() * 2, rtol=1e-6)


def test_uids_and_backend_name():
    assert K.get_uid('dense') == 1 and K.get_uid('dense') == 2 and K.get_uid('conv') == 1
    K.reset_uids()
    assert K.get_uid('dense') == 1
    assert K.backend() == 'gpuk.backend'
    with K.control_dependencies([]):
        pass
    assert K.symbolic(len) is len and K.eager(len) is len
    assert K.get_session() is None
    K.manual_variable_initialization(True)
    K.set_session(None)
