"""K functions behave as Keras 2.3.1's TensorFlow backend does where Keras code relies on it
(issue 17): each test is a call that once gave a different answer on gpuk."""
import numpy as np
import pytest
import scipy.sparse

from gpuk import backend as K


@pytest.mark.parametrize('make, expected', [
    (lambda v: K.update_add(v, np.array([1., 2.])), [2., 3.]),
    (lambda v: K.update_sub(v, np.array([1., 2.])), [0., -1.]),
    (lambda v: K.update(v, np.array([5., 6.])), [5., 6.]),
])
def test_evaluating_an_update_applies_it(make, expected):
    v = K.variable(np.ones(2))
    np.testing.assert_array_equal(K.eval(make(v)), expected)  # the new value, as tf.assign_add
    np.testing.assert_array_equal(K.get_value(v), expected)


def test_repeat_elements_sets_keras_shape():
    x = K.placeholder((None, 3))
    y = K.repeat_elements(x, 2, axis=1)
    assert y._keras_shape == (None, 6) == K.int_shape(y)
    assert K.repeat_elements(x, 2, axis=0)._keras_shape == (None, 3)


def test_concatenate_of_sparse_tensors_is_sparse():
    a = scipy.sparse.random(3, 4, density=0.5, format='csr', random_state=0)
    b = scipy.sparse.random(3, 5, density=0.5, format='csr', random_state=1)
    joined = K.concatenate([K.variable(a), K.variable(b)])
    assert K.is_sparse(joined)
    np.testing.assert_allclose(K.eval(joined), np.hstack([a.toarray(), b.toarray()]), rtol=1e-6)
    pa, pb = K.placeholder((None, 4), sparse=True), K.placeholder((None, 5), sparse=True)
    joined = K.concatenate([pa, pb])
    assert K.is_sparse(joined)
    assert K.function([pa, pb], [joined])([a, b])[0].shape == (3, 9)
    assert not K.is_sparse(K.concatenate([pa, K.placeholder((None, 5))]))


def test_concatenate_refuses_mixed_dtypes_instead_of_promoting():
    with pytest.raises(TypeError, match=r'concatenate: .*float32, int32'):
        K.concatenate([K.variable(np.ones((2, 2))), K.variable(np.ones((2, 2)), dtype='int32')])


def test_reshape_to_batch_and_minus_one_infers_the_rest():
    x = K.placeholder((None, 3, 4))
    flat = K.reshape(x, (K.shape(x)[0], -1))
    assert K.int_shape(flat) == (None, 12)
    assert K.function([x], [flat])([np.ones((2, 3, 4))])[0].shape == (2, 12)
    assert K.int_shape(K.reshape(x, (-1, K.shape(x)[0]))) == (12, None)
    # an unknown dim that is not the reshaped tensor's own stays unknown
    other = K.placeholder((None, 2))
    assert K.int_shape(K.reshape(x, (K.shape(other)[0], -1))) == (None, None)
    y = K.placeholder((None, None, 4))
    assert K.int_shape(K.reshape(y, (K.shape(y)[0], -1))) == (None, None)
    assert K.int_shape(K.reshape(y, (K.shape(y)[0], K.shape(y)[1], 2, -1))) == (None, None, 2, 2)


def test_in_top_k_counts_ties_at_the_kth_value_like_tensorflow():
    """tf.nn.in_top_k: a target is in the top k when fewer than k predictions of its row are
    strictly greater (ties at the boundary all count); non-finite rows and out-of-range
    targets are False."""
    rng = np.random.RandomState(0)
    predictions = rng.rand(20, 10).astype('float32')
    for i in range(20):
        predictions[i, rng.choice(10, 5, replace=False)] = predictions[i, 0]
    targets = rng.randint(10, size=20).astype('int32')
    greater = (predictions > predictions[np.arange(20), targets][:, None]).sum(axis=1)
    for k in range(1, 11):
        got = K.eval(K.in_top_k(K.variable(predictions), K.variable(targets, dtype='int32'), k))
        np.testing.assert_array_equal(got, greater < k)
    bad = np.array([[0.1, np.nan, 0.2], [0.3, 0.2, 0.1]], 'float32')
    np.testing.assert_array_equal(
        K.eval(K.in_top_k(K.constant(bad), K.constant([2, 5], dtype='int32'), 3)), [False, False])


def test_ctc_labels_at_or_past_the_blank_end_the_label_sequence():
    """TensorFlow reads a label >= classes - 1 as the end of that sample's labels (Keras's
    OCR example feeds blank images labelled [blank], length 1), and refuses a class after it
    within label_length ("Saw a non-null label (index >= num_classes - 1) following a null
    label", TensorFlow's ctc_loss_calculator)."""
    rng = np.random.RandomState(0)
    y_pred = K.variable(rng.dirichlet(np.ones(4), size=(3, 6)).astype('float32'))
    input_length = K.constant([[6], [6], [5]], dtype='int32')

    def cost_and_grad(labels, lengths):
        loss = K.ctc_batch_cost(K.constant(labels, dtype='int32'), y_pred, input_length,
                                K.constant(lengths, dtype='int32'))
        return K.eval(loss), K.eval(K.gradients(K.sum(loss), [y_pred])[0])

    blanks = cost_and_grad([[1, 3, 3], [3, 0, 0], [2, 0, 5]], [[3], [1], [3]])
    cut = cost_and_grad([[1, 0, 0], [0, 0, 0], [2, 0, 0]], [[1], [0], [2]])
    np.testing.assert_allclose(blanks[0], cut[0], rtol=1e-6)
    np.testing.assert_allclose(blanks[1], cut[1], rtol=1e-6, atol=1e-7)
    assert np.all(np.isfinite(blanks[0]))
    with pytest.raises(ValueError, match='ctc_batch_cost: y_true'):
        K.ctc_batch_cost(K.constant([[-1]], dtype='int32'), y_pred[:1], input_length[:1],
                         K.constant([[1]], dtype='int32'))
    with pytest.raises(ValueError, match='ctc_batch_cost: y_true holds class 0 after the blank 3'):
        cost_and_grad([[1, 3, 0], [3, 0, 0], [2, 0, 5]], [[3], [1], [3]])
