"""matmul (the ``@`` operator), K.dot and K.batch_dot against NumPy, with Keras 2.3.1's
shape rules, gradients and precision checks."""
import numpy as np
import pytest

from gpuk import backend as K
from gpuk import device
from gpuk.ops.linalg import matmul
from tests.evaluation import assert_close, evaluate
from tests.gradcheck import check_gradients


def sample(rng, shape, dtype):
    if np.dtype(dtype).kind in 'iu':
        return rng.integers(-4, 5, size=shape).astype(dtype)
    return rng.standard_normal(shape).astype(dtype)


# --- matmul -------------------------------------------------------------------------------

MATMUL_SHAPES = [((3, 4), (4, 5)), ((2, 3, 4), (2, 4, 5)), ((2, 1, 3, 4), (5, 4, 6)),
                 ((3, 4), (2, 4, 5)), ((4,), (4, 5)), ((2, 3, 4), (4,)), ((4,), (4,))]


@pytest.mark.parametrize('dtype', ['float16', 'float32', 'float64', 'int32'])
@pytest.mark.parametrize('a_shape,b_shape', MATMUL_SHAPES)
def test_matmul_matches_numpy(on_device, rng, dtype, a_shape, b_shape):
    a, b = sample(rng, a_shape, dtype), sample(rng, b_shape, dtype)
    want = np.matmul(a.astype(np.float64), b.astype(np.float64))
    got = evaluate(lambda x, y: x @ y, a, b)
    assert got.dtype == np.dtype(dtype) and got.shape == want.shape
    assert_close(got, want, dtype)


@pytest.mark.parametrize('dtype', ['float16', 'float32', 'float64', 'int32'])
@pytest.mark.parametrize('shape', [(128, 512), (32, 300), (40, 257), (33, 17), (1, 7), (7, 1), (0, 4), (3,), ()])
def test_contiguous_operand_copies_every_layout_to_c_order_unchanged(on_device, rng, dtype, shape):
    """The loop invariants a scan's steps multiply by (a transposed recurrent kernel) are
    copied once per loop by the matmul family; the twin's blocked transposing copy must give
    NumPy's values, dtype and shape (a 0-d value stays 0-d) for every layout."""
    impl = device.impl()
    a = sample(rng, shape, dtype)
    views = [a]
    if a.ndim == 2:
        views += [a.T, np.asfortranarray(a), a[:, ::2], a[::2]]
    for view in views:
        got = device.to_host(impl.matmul.contiguous_operand(device.to_device(view)))
        assert got.flags.c_contiguous and got.dtype == view.dtype and got.shape == view.shape
        np.testing.assert_array_equal(got, view)


def test_matmul_with_unknown_dims_and_static_shapes(on_device, rng):
    a, b = rng.standard_normal((2, 1, 3, 4)), rng.standard_normal((5, 4, 6))
    got = evaluate(lambda x, y: matmul(x, y), a, b, unknown=(0, 2))
    np.testing.assert_allclose(got, np.matmul(a, b), rtol=1e-12)
    x, y = K.placeholder((None, 1, 3, 4)), K.placeholder((5, 4, 6))
    assert K.int_shape(x @ y) == (None, 5, 3, 6)
    assert K.int_shape(K.placeholder((4,)) @ K.placeholder((None, 4, 7))) == (None, 7)


def test_matmul_float32_uses_full_precision(on_device, rng):
    # TF32 or float16 accumulation would be off by ~1e-3 relative to sum(|a||b|).
    a = rng.standard_normal((64, 1024)).astype(np.float32)
    b = rng.standard_normal((1024, 48)).astype(np.float32)
    got = evaluate(lambda x, y: K.dot(x, y), a, b).astype(np.float64)
    a64, b64 = a.astype(np.float64), b.astype(np.float64)
    scale = np.abs(a64) @ np.abs(b64)
    assert np.all(np.abs(got - a64 @ b64) <= 1e-5 * scale)


def test_matmul_float16_accumulates_in_float32(on_device, rng):
    a = rng.uniform(0, 1, (8, 4096)).astype(np.float16)
    b = rng.uniform(0, 1, (4096, 8)).astype(np.float16)
    got = evaluate(lambda x, y: x @ y, a, b)
    assert got.dtype == np.float16
    # Rounding the float64 result to float16 is the best possible; float16 accumulation
    # (spacing 1 above 1024) would be off by far more than 2e-3.
    np.testing.assert_allclose(got.astype(np.float64), a.astype(np.float64) @ b.astype(np.float64), rtol=2e-3)


@pytest.mark.parametrize('a_shape,b_shape', MATMUL_SHAPES)
def test_matmul_gradients(rng, a_shape, b_shape):
    a, b = rng.standard_normal(a_shape), rng.standard_normal(b_shape)
    check_gradients(lambda x, y: x @ y, a, b)


def test_matmul_second_derivative(rng):
    a, b = rng.standard_normal((3, 4)), rng.standard_normal((4, 2))

    def gradient_of_square(x, y):
        return K.gradients(K.sum(K.square(x @ y)), [x])[0]
    check_gradients(gradient_of_square, a, b)


def test_matmul_bad_arguments():
    with pytest.raises(ValueError, match=r'matmul: inner dimensions differ: shapes \(2, 3\) and \(4, 5\)'):
        K.placeholder((2, 3)) @ K.placeholder((4, 5))
    with pytest.raises(ValueError, match='matmul: shapes .* cannot be broadcast'):
        K.placeholder((2, 3, 4)) @ K.placeholder((3, 4, 5))
    with pytest.raises(TypeError, match='matmul: x and y must have the same dtype, got float32 and float64'):
        K.placeholder((2, 3)) @ K.placeholder((3, 4), dtype='float64')
    with pytest.raises(TypeError, match='matmul: bool tensors'):
        K.placeholder((2, 3), dtype='bool') @ K.placeholder((3, 4), dtype='bool')
    with pytest.raises(ValueError, match='matmul: operands need rank >= 1'):
        matmul(K.placeholder(()), K.placeholder((3,)))


def test_matmul_with_numpy_operand_takes_tensor_dtype(rng):
    b = rng.standard_normal((4, 2))  # float64 array next to a float32 tensor
    x = K.placeholder((3, 4))
    y = x @ b
    assert K.dtype(y) == 'float32'
    a = rng.standard_normal((3, 4)).astype(np.float32)
    np.testing.assert_allclose(K.function([x], [y])([a])[0], a @ b, rtol=1e-5, atol=1e-6)


# --- dot ------------------------------------------------------------------------------------

DOT_CASES = [
    ((2, 3), (3, 4), (2, 4)),              # Keras docstring examples
    ((32, 28, 3), (3, 4), (32, 28, 4)),
    ((2, 3), (4, 3, 5), (2, 4, 5)),        # Theano-like
    ((2, 3, 4), (5, 4, 6), (2, 3, 5, 6)),
    ((3,), (2, 3, 4), (2, 4)),
    ((2, 3, 4), (4,), (2, 3)),
    ((2, 3, 4), (6, 5, 4, 3), (2, 3, 6, 5, 3)),
]


@pytest.mark.parametrize('dtype', ['float16', 'float32', 'float64', 'int32'])
@pytest.mark.parametrize('x_shape,y_shape,out_shape', DOT_CASES)
def test_dot_matches_numpy_dot(on_device, rng, dtype, x_shape, y_shape, out_shape):
    x, y = sample(rng, x_shape, dtype), sample(rng, y_shape, dtype)
    assert K.int_shape(K.dot(K.placeholder(x_shape, dtype=dtype), K.placeholder(y_shape, dtype=dtype))) == out_shape
    want = np.dot(x.astype(np.float64), y.astype(np.float64))
    got = evaluate(K.dot, x, y)
    assert got.shape == out_shape == want.shape and got.dtype == np.dtype(dtype)
    assert_close(got, want, dtype)


@pytest.mark.parametrize('x_shape,y_shape,out_shape', DOT_CASES)
def test_dot_with_unknown_dims(on_device, rng, x_shape, y_shape, out_shape):
    x, y = rng.standard_normal(x_shape), rng.standard_normal(y_shape)
    got = evaluate(K.dot, x, y, unknown=(0, 1))
    np.testing.assert_allclose(got, np.dot(x, y), rtol=1e-12, atol=1e-12)


def test_dot_static_shape_keeps_known_dims():
    x, y = K.placeholder((None, 28, 3)), K.placeholder((3, None))
    assert K.int_shape(K.dot(x, y)) == (None, 28, None)
    x, y = K.placeholder((2, 3)), K.ones((4, 3, 5))
    assert K.int_shape(K.dot(x, y)) == (2, 4, 5)


@pytest.mark.parametrize('x_shape,y_shape,out_shape', DOT_CASES)
def test_dot_gradients(rng, x_shape, y_shape, out_shape):
    check_gradients(K.dot, rng.standard_normal(x_shape), rng.standard_normal(y_shape))


def test_dot_bad_arguments():
    with pytest.raises(ValueError, match=r'dot: the last axis of x and the second-to-last of y differ: '
                                         r'shapes \(2, 3\) and \(4, 2, 5\)'):
        K.dot(K.placeholder((2, 3)), K.placeholder((4, 2, 5)))
    with pytest.raises(ValueError, match='dot: the last axis'):
        K.dot(K.placeholder((2, 3, 4)), K.placeholder((5, 6)))
    with pytest.raises(ValueError, match='dot: x and y need rank >= 1'):
        K.dot(K.placeholder(()), K.placeholder((3, 4)))
    with pytest.raises(TypeError, match='dot: x and y must have the same dtype'):
        K.dot(K.placeholder((2, 3), dtype='int32'), K.placeholder((3, 4)))


# --- batch_dot ------------------------------------------------------------------------------

def reference_batch_dot(x, y, axes):
    """Per sample, a tensordot of x[b] and y[b] over the given axes; (batch, 1) when the
    result would be 1-D (the Keras rule for two 2-D inputs)."""
    if axes is None:
        axes = (x.ndim - 1, y.ndim - 1 if y.ndim == 2 else y.ndim - 2)
    elif isinstance(axes, int):
        axes = (axes, axes)
    a0, a1 = axes[0] % x.ndim, axes[1] % y.ndim
    out = np.stack([np.tensordot(xb, yb, axes=(a0 - 1, a1 - 1)) for xb, yb in zip(x, y)])
    return out.reshape(len(x), 1) if out.ndim == 1 else out


BATCH_DOT_CASES = [
    ((4, 5), (4, 5), None, (4, 1)),
    ((4, 5), (4, 5), 1, (4, 1)),
    ((4, 5), (4, 5, 6), None, (4, 6)),
    ((4, 5), (4, 6, 5), (1, 2), (4, 6)),
    ((4, 3, 5), (4, 5), None, (4, 3)),
    ((4, 3, 5), (4, 3), (1, 1), (4, 5)),
    ((4, 3, 5), (4, 5, 6), None, (4, 3, 6)),
    ((4, 3, 5), (4, 6, 5), (2, 2), (4, 3, 6)),
    ((4, 3, 5), (4, 3, 6), (1, 1), (4, 5, 6)),
    ((4, 2, 1), (4, 3, 2), (1, 2), (4, 1, 3)),
    ((4, 3, 5, 2), (4, 2, 6), None, (4, 3, 5, 6)),
    ((4, 3, 5, 2), (4, 6, 2, 7), (3, 2), (4, 3, 5, 6, 7)),
    ((4, 5, 3), (4, 3, 5, 2), (-1, 1), (4, 5, 5, 2)),
    ((4, 2, 3, 5), (4, 6, 3, 7), (2, 2), (4, 2, 5, 6, 7)),
]


@pytest.mark.parametrize('dtype', ['float32', 'float64', 'int32'])
@pytest.mark.parametrize('x_shape,y_shape,axes,out_shape', BATCH_DOT_CASES)
def test_batch_dot_matches_reference(on_device, rng, dtype, x_shape, y_shape, axes, out_shape):
    x, y = sample(rng, x_shape, dtype), sample(rng, y_shape, dtype)
    want = reference_batch_dot(x.astype(np.float64), y.astype(np.float64), axes)
    assert want.shape == out_shape
    got = evaluate(lambda a, b: K.batch_dot(a, b, axes=axes), x, y)
    assert got.shape == out_shape and got.dtype == np.dtype(dtype)
    assert_close(got, want, dtype)
    got = evaluate(lambda a, b: K.batch_dot(a, b, axes=axes), x, y, unknown=(0, 2))
    assert_close(got, want, dtype)


@pytest.mark.parametrize('x_shape,y_shape,axes,out_shape', BATCH_DOT_CASES)
def test_batch_dot_and_dot_match_keras_numpy_backend(rng, x_shape, y_shape, axes, out_shape):
    from tests.keras_reference import numpy_backend
    reference = numpy_backend()
    x, y = rng.standard_normal(x_shape), rng.standard_normal(y_shape)
    got = evaluate(lambda a, b: K.batch_dot(a, b, axes=axes), x, y)
    np.testing.assert_allclose(got, reference.batch_dot(x, y, axes=axes), rtol=1e-12, atol=1e-12)
    z = rng.standard_normal((2, x_shape[-1], 3))
    np.testing.assert_allclose(evaluate(K.dot, x, z), reference.dot(x, z), rtol=1e-12, atol=1e-12)


def test_batch_dot_docstring_examples(on_device):
    x, y = K.ones(shape=(32, 20, 1)), K.ones(shape=(32, 30, 20))
    assert K.int_shape(K.batch_dot(x, y, axes=(1, 2))) == (32, 1, 30)
    assert K.int_shape(K.batch_dot(K.placeholder((100, 20)), K.placeholder((100, 30, 20)), axes=(1, 2))) == (100, 30)
    got = K.eval(K.batch_dot(K.constant([[1, 2], [3, 4]]), K.constant([[5, 6], [7, 8]]), axes=1))
    np.testing.assert_array_equal(got, [[17], [53]])


def test_batch_dot_static_shapes_with_unknown_batch():
    x, y = K.placeholder((None, 3, 5, 2)), K.placeholder((None, 2, 6))
    assert K.int_shape(K.batch_dot(x, y)) == (None, 3, 5, 6)
    assert K.int_shape(K.batch_dot(K.placeholder((None, 5)), K.placeholder((None, 5)))) == (None, 1)


@pytest.mark.parametrize('x_shape,y_shape,axes,out_shape', BATCH_DOT_CASES[::2])
def test_batch_dot_gradients(rng, x_shape, y_shape, axes, out_shape):
    check_gradients(lambda a, b: K.batch_dot(a, b, axes=axes),
                    rng.standard_normal(x_shape), rng.standard_normal(y_shape))


def test_batch_dot_bad_arguments():
    x, y = K.placeholder((4, 3, 5)), K.placeholder((4, 5, 6))
    with pytest.raises(ValueError, match='batch_dot: inputs need rank >= 2'):
        K.batch_dot(K.placeholder((4,)), y)
    with pytest.raises(ValueError, match='batch_dot: inputs have different batch sizes'):
        K.batch_dot(x, K.placeholder((3, 5, 6)))
    with pytest.raises(ValueError, match='batch_dot: cannot reduce over the batch axis 0'):
        K.batch_dot(x, y, axes=(0, 1))
    with pytest.raises(ValueError, match=r'batch_dot: cannot contract .* x.shape\[1\] != y.shape\[1\] \(3 != 5\)'):
        K.batch_dot(x, y, axes=1)
    with pytest.raises(ValueError, match='batch_dot: multiple target dimensions are not supported'):
        K.batch_dot(x, y, axes=([1, 2], [1, 2]))
    with pytest.raises(ValueError, match='batch_dot: axes must be None, an int or a pair'):
        K.batch_dot(x, y, axes=(1, 2, 3))
    with pytest.raises(ValueError, match='batch_dot: axes .* out of range'):
        K.batch_dot(x, y, axes=(3, 1))
    with pytest.raises(TypeError, match='batch_dot: axes must be ints'):
        K.batch_dot(x, y, axes=(2.0, 1))
