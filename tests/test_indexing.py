"""Indexing against NumPy: tensor[...] (static and symbolic indices), K.slice, K.gather,
K.one_hot and K.arange, with static shapes checked against evaluated ones, gradients
(scatter-add with repeated indices included), and bad arguments."""
import numpy as np
import pytest

from gpuk import backend as K
from tests.gradcheck import check_gradients
from tests.test_shapes import evaluate, runtime_int, second_order, unknown

RNG = np.random.default_rng(5)
A = RNG.standard_normal((3, 4, 5)).astype(np.float32)


# --- tensor[...] ------------------------------------------------------------------------------

def test_getitem_static_keys(on_device):
    x = unknown(A, (1, 2))
    outs = [x[:, 1], x[..., ::-1], x[None], x[-1], x[1:, None, ::2, 3], x[:, -3:-1], x[..., 2, :]]
    assert K.int_shape(outs[0]) == (None, 5) and K.int_shape(outs[1]) == (None, 4, 5)
    assert K.int_shape(outs[2]) == (1, None, 4, 5) and K.int_shape(outs[4]) == (None, 1, 2)
    assert K.int_shape(outs[5]) == (None, 2, 5) and K.int_shape(outs[6]) == (None, 5)
    got = evaluate(outs, {x: A})
    wants = [A[:, 1], A[..., ::-1], A[None], A[-1], A[1:, None, ::2, 3], A[:, -3:-1], A[..., 2, :]]
    for g, want in zip(got, wants):
        np.testing.assert_array_equal(g, want)


def test_getitem_symbolic_keys(on_device):
    x = unknown(A, (2,))
    i, j = K.shape(x)[1] - 3, K.shape(x)[1] - 1
    last, window, stepped = x[K.shape(x)[0] - 1], x[:, i:j], x[:, ::runtime_int(2, x)]
    assert K.int_shape(last) == (None, 5) and K.int_shape(window) == (None, None, 5)
    got = evaluate([last, window, stepped, x[runtime_int(1, x), :, runtime_int(-1, x)]], {x: A})
    for g, want in zip(got, [A[2], A[:, 1:3], A[:, ::2], A[1, :, -1]]):
        np.testing.assert_array_equal(g, want)
    static = K.placeholder(A.shape)
    assert K.int_shape(static[:, K.shape(static)[1] - 3:]) == (3, 3, 5)  # known statically


def test_getitem_of_ints_and_bools(on_device):
    ints = np.arange(12, dtype=np.int32).reshape(3, 4)
    x = unknown(ints)
    got = evaluate([x[:, 1], x[::-1] > 5], {x: ints})
    np.testing.assert_array_equal(got[0], ints[:, 1])
    assert got[1].dtype == np.bool_ and np.array_equal(got[1], ints[::-1] > 5)


def test_getitem_gradients():
    check_gradients(lambda x: x[:, 1] * x[..., ::-1][:, 2], A)
    check_gradients(lambda x: x[None, 1:, ::2] + 1, A)
    check_gradients(lambda x: x[K.shape(x)[0] - 1] * x[runtime_int(0, x)], A)
    check_gradients(lambda x: x[:, runtime_int(1, x):runtime_int(3, x)], A)
    check_gradients(second_order(lambda x: x[:, runtime_int(1, x):, ::-2]), A)


# --- slice -----------------------------------------------------------------------------------

def test_slice_with_lists_tensors_and_to_the_end(on_device):
    x = unknown(A, (1,))
    by_ints = K.slice(x, [1, 0, 2], [2, 3, -1])
    by_mixed = K.slice(x, [0, K.shape(x)[1] - 2, 1], [-1, 2, runtime_int(3, x)])
    by_tensors = K.slice(x, K.constant([1, 1, 1], dtype='int32'), K.stack([runtime_int(1, x), 3, -1]))
    assert K.int_shape(by_ints) == (2, 3, None) and K.int_shape(by_mixed) == (None, 2, None)
    assert K.int_shape(by_tensors) == (None, None, None)
    got = evaluate([by_ints, by_mixed, by_tensors], {x: A})
    for g, want in zip(got, [A[1:3, 0:3, 2:], A[:, 2:4, 1:4], A[1:2, 1:4, 1:]]):
        np.testing.assert_array_equal(g, want)
    static = K.placeholder(A.shape)
    assert K.int_shape(K.slice(static, (1, 0, 2), (2, -1, -1))) == (2, 4, 3)


def test_slice_out_of_range_at_run_time(on_device):
    x = unknown(A)
    with pytest.raises(ValueError, match='slice: begin 2 with size 3 is out of range for axis 0'):
        evaluate(K.slice(x, [2, 0, 0], [3, 1, 1]), {x: A})


def test_slice_gradients():
    check_gradients(lambda x: K.slice(x, [1, 0, 2], [2, 3, -1]), A)
    check_gradients(lambda x: K.slice(x, [runtime_int(1, x), 1, 0], [1, runtime_int(2, x), -1]), A)
    check_gradients(second_order(lambda x: K.slice(x, [runtime_int(1, x), 1, 0], [-1, 2, 3])), A)


# --- gather ----------------------------------------------------------------------------------

def test_gather_rows(on_device):
    reference = RNG.standard_normal((6, 3)).astype(np.float32)
    r = unknown(reference, (1,))
    idx_vector = np.array([4, 0, 4, 5], dtype=np.int32)
    idx_matrix = np.array([[1, 1], [2, 0], [5, 3]], dtype=np.int64)
    i, j = unknown(idx_vector), unknown(idx_matrix)
    by_vector, by_matrix = K.gather(r, i), K.gather(r, j)
    by_list = K.gather(r, [3, 3])
    assert K.int_shape(by_vector) == (None, 3) and K.int_shape(by_matrix) == (None, None, 3)
    assert K.int_shape(by_list) == (2, 3)
    got = evaluate([by_vector, by_matrix, by_list], {r: reference, i: idx_vector, j: idx_matrix})
    for g, want in zip(got, [reference[idx_vector], reference[idx_matrix], reference[[3, 3]]]):
        np.testing.assert_array_equal(g, want)
    ints = np.arange(10, dtype=np.int32).reshape(5, 2)
    z = unknown(ints)
    np.testing.assert_array_equal(evaluate(K.gather(z, K.constant(2, dtype='int32')), {z: ints}), ints[2])


def test_gather_gradient_adds_repeated_rows(on_device):
    reference = RNG.standard_normal((5, 2))
    r = K.placeholder(reference.shape, dtype='float64')
    indices = np.array([[1, 3], [1, 1]], dtype=np.int32)
    grad = K.gradients(K.sum(K.gather(r, indices)), [r])[0]
    want = np.zeros((5, 2))
    np.add.at(want, indices.reshape(-1), 1.0)
    np.testing.assert_array_equal(evaluate(grad, {r: reference}), want)  # row 1 counted three times


def test_gather_float16_gradient_accumulates_in_float32(on_device):
    reference = np.zeros((2, 1), dtype=np.float16)
    r = K.placeholder(reference.shape, dtype='float16')
    indices = np.zeros(4096, dtype=np.int32)  # 4096 * 0.1 overflows float16's precision step by step
    grad = K.gradients(K.sum(K.gather(r, indices) * K.constant(0.1, dtype='float16')), [r])[0]
    got = evaluate(grad, {r: reference})
    assert got.dtype == np.float16
    np.testing.assert_allclose(got[0, 0], np.float16(4096 * np.float32(np.float16(0.1))), rtol=1e-3)


def test_gather_gradients():
    reference = RNG.standard_normal((4, 3))
    check_gradients(lambda r: K.gather(r, np.array([[0, 2], [2, 2]], dtype=np.int32)) ** 2, reference)
    check_gradients(second_order(lambda r: K.gather(r, np.array([3, 0, 3], dtype=np.int64))), reference)


def test_gather_out_of_range_at_run_time(on_device):
    r = K.placeholder((3, 2))
    i = K.placeholder((None,), dtype='int32')
    for bad in ([0, 3], [-1, 0]):
        with pytest.raises(ValueError, match=r'gather: indices must lie in \[0, 3\)'):
            evaluate(K.gather(r, i), {r: np.zeros((3, 2), np.float32), i: np.array(bad, np.int32)})


# --- one_hot and arange ----------------------------------------------------------------------

def test_one_hot(on_device):
    labels = np.array([[0, 2], [3, 1], [-1, 4]], dtype=np.int32)  # -1 and 4 are outside [0, 4)
    x = unknown(labels, (1,))
    encoded, by_tensor = K.one_hot(x, 4), K.one_hot(x, K.shape(x)[0] + 1)
    assert K.int_shape(encoded) == (None, 2, 4) and K.dtype(encoded) == 'float32'
    got = evaluate([encoded, by_tensor], {x: labels})
    want = (labels[..., None] == np.arange(4)).astype(np.float32)
    np.testing.assert_array_equal(got[0], want)
    np.testing.assert_array_equal(got[1], want)
    assert K.int_shape(K.one_hot(K.constant([1, 2], dtype='int64'), K.constant(3, dtype='int32'))) == (2, 3)


def test_arange(on_device):
    cases = [((5,), {}), ((2, 9, 3), {}), ((-3,), {}), ((-3,), {'step': -1}), ((5, 1, -2), {}),
             ((0, 1, 0.25), {'dtype': 'float32'}), ((3,), {'dtype': 'int64'}), ((1, 1), {})]
    for args, kwargs in cases:
        out = K.arange(*args, **kwargs)
        value = K.eval(out)
        start, stop = (0, max(args[0], 0)) if len(args) == 1 else args[:2]
        want = np.arange(start, stop, args[2] if len(args) > 2 else kwargs.get('step', 1))
        np.testing.assert_array_equal(value, want.astype(kwargs.get('dtype', 'int32')))
        assert value.dtype == np.dtype(kwargs.get('dtype', 'int32')) and K.int_shape(out) == value.shape
    x = unknown(A)
    symbolic = K.arange(K.shape(x)[0])
    stepped = K.arange(1, K.shape(x)[2], runtime_int(2, x))
    assert K.int_shape(symbolic) == (None,)
    got = evaluate([symbolic, stepped], {x: A})
    np.testing.assert_array_equal(got[0], np.arange(3))
    np.testing.assert_array_equal(got[1], np.arange(1, 5, 2))
    static = K.placeholder((7, 2))
    assert K.int_shape(K.arange(K.shape(static)[0])) == (7,)


# --- bad arguments -----------------------------------------------------------------------------

X = K.placeholder((None, 4, 5))
BAD_CALLS = [
    (lambda: X[0, 0, 0, 0], ValueError, 'getitem: too many indices'),
    (lambda: X[..., 1, ...], ValueError, 'getitem: at most one Ellipsis'),
    (lambda: X[:, 4], ValueError, 'getitem: index 4 is out of range for axis 1'),
    (lambda: X[:, ::0], ValueError, 'getitem: slice step cannot be zero'),
    (lambda: X[True], TypeError, 'getitem: boolean indices'),
    (lambda: X[1.5], TypeError, 'getitem: index entries must be'),
    (lambda: X[K.constant([0, 1], dtype='int32')], TypeError, 'getitem: tensor indices must be int scalars'),
    (lambda: X[K.constant(1.0)], TypeError, 'getitem: tensor indices must be int scalars'),
    (lambda: K.slice(X, [0, 0], [1, 1]), ValueError, 'slice: start and size need one entry per axis'),
    (lambda: K.slice(X, [0, 2, 0], [1, 3, 1]), ValueError, 'slice: start 2 with size 3 is out of range for axis 1'),
    (lambda: K.slice(X, [0, -1, 0], [1, 1, 1]), ValueError, 'slice: start -1'),
    (lambda: K.slice(X, [0, 0, 0], [1, -2, 1]), ValueError, 'slice: start 0 with size -2'),
    (lambda: K.slice(X, [0, 0.5, 0], [1, 1, 1]), TypeError, 'slice: start entries must be ints'),
    (lambda: K.slice(X, 0, [1, 1, 1]), TypeError, 'slice: start must be a list'),
    (lambda: K.gather(X, K.constant([0.0])), TypeError, 'gather: indices must have an int dtype'),
    (lambda: K.gather(K.constant(1.0), [0]), ValueError, 'gather: reference must have at least one axis'),
    (lambda: K.gather('abc', [0]), TypeError, 'gather: reference must be a tensor'),
    (lambda: K.one_hot(X, 3), TypeError, 'one_hot: indices must have an int dtype'),
    (lambda: K.one_hot(K.constant([1], dtype='int32'), 0), ValueError, 'one_hot: num_classes must be >= 1'),
    (lambda: K.one_hot(K.constant([1], dtype='int32'), 2.0), TypeError, 'one_hot: num_classes must be an int'),
    (lambda: K.arange(0, 5, 0), ValueError, 'arange: step must not be zero'),
    (lambda: K.arange('a'), TypeError, 'arange: start must be a number'),
    (lambda: K.arange(0, X), TypeError, 'arange: stop must be a number or a scalar tensor'),
    (lambda: K.arange(3, dtype='float128'), TypeError, 'dtype'),
]


@pytest.mark.parametrize('call, error, match', BAD_CALLS, ids=[m.split(':')[0] + str(i) for i, (_, _, m) in
                                                              enumerate(BAD_CALLS)])
def test_bad_arguments(call, error, match):
    with pytest.raises(error, match=match):
        call()
