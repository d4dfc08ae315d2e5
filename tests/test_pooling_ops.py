"""pool2d / pool3d against Keras 2.3.1's NumPy reference backend and a loop transcription
of TensorFlow's padding rule, static shapes, finite-difference gradients (tie-free
inputs), second derivatives, the argmax output, bad input."""
import numpy as np
import pytest

from gpuk import backend as K
from gpuk.graph import apply
from gpuk.ops import pooling as pool_ops
from tests.evaluation import layout
from tests.gradcheck import check_gradients
from tests.keras_reference import numpy_backend

# Every test here runs on each implementation (tests/conftest.py: on_device), the CUDA kernels included.
pytestmark = pytest.mark.usefixtures('on_device')

REF = numpy_backend()
FORMATS = ['channels_last', 'channels_first']
DTYPES = ['float32', 'float64']


def tie_free(rng, shape, dtype='float64'):
    """Distinct values at least 0.1 apart, so a small perturbation never moves a max."""
    return (rng.permutation(int(np.prod(shape))).reshape(shape) * 0.1 - 1.0).astype(dtype)


def pool(rank):
    return K.pool2d if rank == 2 else K.pool3d


def evaluate(build, x):
    placeholder = K.placeholder(shape=(None,) + x.shape[1:], dtype=x.dtype.name)
    y = build(placeholder)
    value = K.function([placeholder], [y])([x])[0]
    static = K.int_shape(y)
    assert static[0] is None and static[1:] == value.shape[1:], (static, value.shape)
    return value


def assert_close(got, want, dtype):
    assert got.dtype == np.dtype(dtype) and got.shape == want.shape, (got.shape, want.shape)
    tol = 1e-12 if dtype == 'float64' else 1e-6
    np.testing.assert_allclose(got, want, rtol=tol, atol=tol * max(np.abs(want).max(), 1))


def reference_pool_tf(x, pool_size, strides, padding, data_format, pool_mode):
    """TensorFlow's pooling as loops: 'same' pads total = (out-1)*s + k - n, the odd pixel
    after; padding never takes part (avg divides by the real inputs only)."""
    if data_format == 'channels_first':
        x = np.moveaxis(x, 1, -1)
    spatial = x.shape[1:-1]
    if padding == 'same':
        outs = [-(-n // s) for n, s in zip(spatial, strides)]
        befores = [max((o - 1) * s + k - n, 0) // 2
                   for o, s, k, n in zip(outs, strides, pool_size, spatial)]
    else:
        outs = [(n - k) // s + 1 for n, k, s in zip(spatial, pool_size, strides)]
        befores = [0] * len(spatial)
    y = np.zeros((x.shape[0],) + tuple(outs) + (x.shape[-1],))
    for position in np.ndindex(*outs):
        window = tuple(slice(max(p * s - b, 0), min(p * s - b + k, n))
                       for p, s, b, k, n in zip(position, strides, befores, pool_size, spatial))
        block = x[(slice(None),) + window + (slice(None),)].astype(np.float64)
        axes = tuple(range(1, len(spatial) + 1))
        y[(slice(None),) + position + (slice(None),)] = \
            block.max(axis=axes) if pool_mode == 'max' else block.mean(axis=axes)
    return np.moveaxis(y, -1, 1) if data_format == 'channels_first' else y


# ---------------------------------------------------------------- values

# (spatial, pool_size, strides, padding). The Keras reference pads 'same' by k//2 on both
# sides: it agrees with TensorFlow for odd pool sizes and input sizes 1 modulo the stride.
KERAS_CASES = [
    ((6, 7), (2, 2), (2, 2), 'valid'),
    ((7, 5), (3, 3), (2, 2), 'same'),
    ((5, 6), (3, 1), (1, 1), 'same'),
    ((7, 8), (3, 2), (2, 3), 'valid'),
    ((4, 5, 3), (2, 2, 2), (1, 2, 1), 'valid'),
    ((5, 3, 5), (3, 3, 1), (2, 1, 2), 'same'),
]
KERAS_PARAMS = [pytest.param(case, data_format, mode, DTYPES[i % 2],
                             id='%dd-%s-%d-%s-%s' % (len(case[0]), case[3], i, data_format,
                                                     mode))
                for i, case in enumerate(KERAS_CASES) for data_format in FORMATS
                for mode in ('max', 'avg')]


@pytest.mark.parametrize('case,data_format,pool_mode,dtype', KERAS_PARAMS)
def test_pool_matches_keras_reference(on_device, rng, case, data_format, pool_mode, dtype):
    spatial, pool_size, strides, padding = case
    x = rng.standard_normal(layout(2, spatial, 3, data_format)).astype(dtype)
    got = evaluate(lambda t: pool(len(spatial))(t, pool_size, strides, padding, data_format,
                                                pool_mode), x)
    want = REF.pool(x.astype(np.float64), pool_size, strides, padding, data_format, pool_mode)
    assert_close(got, want, dtype)


# Even windows and strides where TensorFlow's 'same' pads asymmetrically (the odd pixel
# after), beyond what the Keras reference models.
@pytest.mark.parametrize('spatial,pool_size,strides', [
    ((5, 5), (2, 2), (2, 2)), ((6, 4), (2, 3), (1, 2)), ((4, 5), (4, 2), (3, 3)),
    ((3, 4, 5), (2, 3, 2), (2, 2, 1))])
@pytest.mark.parametrize('data_format', FORMATS)
@pytest.mark.parametrize('pool_mode', ['max', 'avg'])
def test_same_padding_is_tensorflows(on_device, rng, spatial, pool_size, strides,
                                     data_format, pool_mode):
    x = rng.standard_normal(layout(2, spatial, 2, data_format))
    got = evaluate(lambda t: pool(len(spatial))(t, pool_size, strides, 'same', data_format,
                                                pool_mode), x)
    assert_close(got, reference_pool_tf(x, pool_size, strides, 'same', data_format, pool_mode),
                 'float64')


def test_avg_pool_excludes_padding_and_float16_stays_float16():
    x = K.placeholder((1, 3, 3, 1), dtype='float16')
    y = K.pool2d(x, (2, 2), (2, 2), 'same', 'channels_last', 'avg')
    value = K.function([x], [y])([np.arange(9, dtype='float16').reshape(1, 3, 3, 1)])[0]
    assert value.dtype == np.float16
    np.testing.assert_array_equal(value[0, :, :, 0], [[2, 3.5], [6.5, 8]])


def test_pool_uses_image_data_format_by_default(rng):
    x = rng.standard_normal((1, 2, 4, 4))
    K.set_image_data_format('channels_first')
    try:
        got = evaluate(lambda t: K.pool2d(t, (2, 2), (2, 2)), x)
    finally:
        K.set_image_data_format('channels_last')
    assert_close(got, reference_pool_tf(x, (2, 2), (2, 2), 'valid', 'channels_first', 'max'),
                 'float64')


# ---------------------------------------------------------------- shapes and argmax

def test_static_shapes_with_unknown_dims():
    x = K.placeholder((None, None, 7, 3))
    assert K.int_shape(K.pool2d(x, (2, 2), (2, 2), 'same')) == (None, None, 4, 3)
    assert K.int_shape(K.pool2d(x, (3, 3), (1, 2), 'valid', pool_mode='avg')) == \
        (None, None, 3, 3)
    x3 = K.placeholder((2, 4, None, 5, 6))
    assert K.int_shape(K.pool3d(x3, (2, 2, 2), (2, 2, 2), 'valid', 'channels_first')) == \
        (2, 4, None, 2, 3)


def test_argmax_output_is_a_uint8_window_tap_and_not_differentiable(rng):
    x = K.placeholder((None, 4, 4, 2), dtype='float64')
    y = K.pool2d(x, (2, 2), (2, 2))
    argmax = y.node.outputs[1]
    assert argmax.dtype == 'uint8' and K.int_shape(argmax) == (None, 2, 2, 2)
    assert K.gradients(K.sum(K.cast(argmax, 'float64')), [x]) == [None]
    value = tie_free(rng, (1, 4, 4, 2))
    got = K.function([x], [argmax])([value])[0]
    assert got.dtype == np.uint8 and got.max() < 4
    # tap t of output (i, j) is input (2i + t // 2, 2j + t % 2)
    rows = 2 * np.arange(2).reshape(1, 2, 1, 1) + got // 2
    cols = 2 * np.arange(2).reshape(1, 1, 2, 1) + got % 2
    picked = value[0, rows[0], cols[0], np.arange(2)]
    np.testing.assert_array_equal(picked, K.function([x], [y])([value])[0][0])


# ---------------------------------------------------------------- gradients

@pytest.mark.parametrize('pool_mode', ['max', 'avg'])
def test_gradients_pool2d_pool3d(rng, pool_mode):
    check_gradients(lambda x: K.pool2d(x, (2, 3), (2, 2), 'same', 'channels_last', pool_mode),
                    tie_free(rng, (2, 5, 6, 2)))
    check_gradients(lambda x: K.pool2d(x, (3, 3), (1, 2), 'valid', 'channels_first',
                                       pool_mode), tie_free(rng, (1, 2, 5, 6)))
    check_gradients(lambda x: K.pool3d(x, (2, 2, 2), (1, 2, 2), 'same', 'channels_first',
                                       pool_mode), tie_free(rng, (1, 2, 3, 3, 4)))


@pytest.mark.parametrize('pool_mode', ['max', 'avg'])
def test_second_derivatives_of_pool2d(rng, pool_mode):
    def gradient(x):
        y = K.pool2d(x, (2, 2), (1, 2), 'same', 'channels_last', pool_mode)
        return K.gradients(K.sum(K.square(y)), [x])[0]
    check_gradients(gradient, tie_free(rng, (2, 4, 5, 2)))


def test_gradient_of_the_argmax_gather(rng):
    """MaxPoolGather (the gradient of the max-pool backward) differentiates into a scatter."""
    window = pool_ops.PoolWindow('pool2d', (2, 2), (2, 1), 'same', 'channels_first')
    argmax = apply(pool_ops.MaxPool(window), K.constant(tie_free(rng, (2, 2, 5, 4))))[1]
    check_gradients(lambda g: apply(pool_ops.MaxPoolGather(window), g, argmax),
                    rng.standard_normal((2, 2, 5, 4)))


# ---------------------------------------------------------------- bad input

@pytest.mark.parametrize('call,error,pattern', [
    (lambda x: K.pool2d(x, (2, 2), pool_mode='median'), ValueError,
     r"pool2d: pool_mode must be 'max' or 'avg', got 'median'"),
    (lambda x: K.pool2d(x, (2, 2), padding='causal'), ValueError,
     r"pool2d: padding must be one of 'same', 'valid', got 'causal'"),
    (lambda x: K.pool2d(x, (2, 2, 2)), ValueError,
     r'pool2d: pool_size must be an int or a tuple of 2 ints, got \(2, 2, 2\)'),
    (lambda x: K.pool2d(x, (2, 2), (0, 1)), ValueError, r'pool2d: strides must be >= 1'),
    (lambda x: K.pool2d(x, (2, 2), data_format='nhwc'), ValueError,
     r"pool2d: data_format must be 'channels_first' or 'channels_last', got 'nhwc'"),
    (lambda x: K.pool3d(x, (2, 2, 2)), ValueError, r'pool3d: x must have rank 5'),
    (lambda x: K.pool2d(x, (9, 2)), ValueError,
     r"pool2d: x of shape \(None, 8, 8, 3\) is smaller than pool_size \(9, 2\)"),
    (lambda x: K.pool2d(K.cast(x, 'int32'), (2, 2)), TypeError,
     r'pool2d: x must be a float tensor, got dtype int32'),
])
def test_bad_pooling_arguments(call, error, pattern):
    with pytest.raises(error, match=pattern):
        call(K.placeholder((None, 8, 8, 3)))
