"""A port of representative groups of Keras's own backend tests
(keras-team/keras tests/keras/backend/backend_test.py: check_single_tensor_operation /
check_two_tensor_operation, test_linear_operations, test_shape_operations,
test_repeat_elements, test_tile, test_gather, test_elementwise_operations, test_nn_operations,
test_conv). Keras compares every backend pairwise; here gpuk is compared against Keras
2.3.1's NumPy reference backend (tests/keras_reference.py), with Keras's atol=1e-5, through
the ``keras.backend`` module Keras itself uses. Only groups that apply to a non-TensorFlow
backend are ported."""
import numpy as np
import pytest

from tests.keras_reference import numpy_backend


@pytest.fixture(scope='module')
def KNP():
    return numpy_backend()


def _value(shape_or_value, rng):
    if isinstance(shape_or_value, np.ndarray):
        return shape_or_value
    return (rng.random_sample(shape_or_value) - 0.5).astype('float32')


def _check(K, KNP, name, args, kwargs, atol=1e-5):
    """Keras's check_*_tensor_operation: variables in, K.eval out, same values and shape;
    the static shape (_keras_shape / int_shape) agrees with the value's."""
    t = getattr(K, name)(*[K.variable(a) for a in args], **kwargs)
    z = K.eval(t)
    ref = getattr(KNP, name)(*[KNP.variable(a) for a in args], **kwargs)
    ref = np.asarray(ref)
    assert z.shape == ref.shape
    np.testing.assert_allclose(z, ref, atol=atol, rtol=1e-5)
    static = K.int_shape(t)
    assert len(static) == z.ndim and all(s in (None, d) for s, d in zip(static, z.shape))


SINGLE = [  # (function, shape or value, kwargs): backend_test.py's calls
    ('transpose', (4, 2), {}),
    ('reverse', (4, 3, 2), dict(axes=1)),
    ('reverse', (4, 3, 2), dict(axes=(1, 2))),
    ('reshape', (4, 2), dict(shape=(8, 1))),
    ('permute_dimensions', (4, 2, 3), dict(pattern=(2, 0, 1))),
    ('repeat', (4, 1), dict(n=3)),
    ('flatten', (4, 1), {}),
    ('batch_flatten', (20, 2, 5), {}),
    ('expand_dims', (4, 3), dict(axis=-1)),
    ('expand_dims', (4, 3, 2), dict(axis=1)),
    ('squeeze', (4, 3, 1), dict(axis=2)),
    ('squeeze', (4, 1, 1), dict(axis=1)),
    ('tile', (2, 5), dict(n=[5, 2])),
    ('max', (4, 2), {}), ('max', (4, 2), dict(axis=1, keepdims=True)),
    ('min', (4, 2), {}), ('min', (4, 2, 3), dict(axis=[1, -1])),
    ('mean', (4, 2), {}), ('mean', (4, 2, 3), dict(axis=-1, keepdims=True)),
    ('mean', (4, 2, 3), dict(axis=[1, -1])),
    ('var', (4, 2), {}), ('var', (4, 2, 3), dict(axis=[1, -1])),
    ('std', (4, 2), {}), ('std', (4, 2), dict(axis=1, keepdims=True)),
    ('prod', (4, 2), {}), ('prod', (4, 2, 3), dict(axis=[1, -1])),
    ('cumsum', (4, 2), {}), ('cumsum', (4, 2), dict(axis=1)),
    ('cumprod', (4, 2), {}),
    ('argmax', (4, 2), {}), ('argmax', (4, 2), dict(axis=1)),
    ('argmin', (4, 2), {}),
    ('square', (4, 2), {}), ('abs', (4, 2), {}), ('sqrt', (4, 2), {}), ('exp', (4, 2), {}),
    ('round', (4, 2), {}), ('sign', (4, 2), {}),
    ('pow', (4, 2), dict(a=3)), ('clip', (4, 2), dict(min_value=0.4, max_value=0.6)),
    ('cos', (4, 2), {}), ('sin', (4, 2), {}),
    ('logsumexp', (4, 3), dict(axis=1)),
    ('relu', (4, 2), {}), ('relu', (4, 2), dict(alpha=0.1, max_value=0.3, threshold=0.1)),
    ('softmax', (4, 10), {}), ('softmax', (4, 5, 3), dict(axis=1)),
    ('softplus', (4, 10), {}), ('elu', (4, 10), dict(alpha=0.5)),
    ('sigmoid', (4, 2), {}), ('hard_sigmoid', (4, 2), {}), ('tanh', (4, 2), {}),
    ('l2_normalize', (4, 3), dict(axis=-1)), ('l2_normalize', (4, 3), dict(axis=1)),
]


@pytest.mark.parametrize('name,shape,kwargs', SINGLE,
                         ids=['%s-%d' % (s[0], i) for i, s in enumerate(SINGLE)])
def test_single_tensor_operation(keras, KNP, name, shape, kwargs):
    rng = np.random.RandomState(0)
    value = _value(shape, rng)
    if name in ('sqrt',):
        value = np.abs(value)
    _check(keras.backend, KNP, name, [value], kwargs)


TWO = [
    ('dot', (4, 2), (2, 4), {}), ('dot', (4, 2), (5, 2, 3), {}),
    ('batch_dot', (4, 2, 3), (4, 5, 3), dict(axes=(2, 2))),
    ('batch_dot', (4, 2, 3), (4, 3), dict(axes=(2, 1))),
    ('batch_dot', (4, 2), (4, 2, 3), dict(axes=(1, 1))),
    ('batch_dot', (32, 20), (32, 20), dict(axes=1)),
    ('equal', (4, 2), (4, 2), {}), ('not_equal', (4, 2), (4, 2), {}),
    ('greater', (4, 2), (4, 2), {}), ('less_equal', (4, 2), (4, 2), {}),
    ('maximum', (4, 2), (4, 2), {}), ('minimum', (4, 2), (4, 2), {}),
    ('binary_crossentropy', (4, 2), (4, 2), dict(from_logits=True)),
    ('categorical_crossentropy', (4, 2), (4, 2), dict(from_logits=True)),
]


@pytest.mark.parametrize('name,x_shape,y_shape,kwargs', TWO,
                         ids=['%s-%d' % (s[0], i) for i, s in enumerate(TWO)])
def test_two_tensor_operation(keras, KNP, name, x_shape, y_shape, kwargs):
    rng = np.random.RandomState(1)
    _check(keras.backend, KNP, name, [_value(x_shape, rng), _value(y_shape, rng)], kwargs)


def test_concatenate_and_stack(keras, KNP):
    K, rng = keras.backend, np.random.RandomState(2)
    a, b = _value((4, 3), rng), _value((4, 2), rng)
    np.testing.assert_allclose(K.eval(K.concatenate([K.variable(a), K.variable(b)], axis=-1)),
                               KNP.concatenate([a, b], axis=-1))
    np.testing.assert_allclose(K.eval(K.stack([K.variable(a), K.variable(a)], axis=1)),
                               KNP.stack([a, a], axis=1))


@pytest.mark.parametrize('ndims', [1, 2, 3])
def test_repeat_elements(keras, ndims):
    K = keras.backend
    shape = np.arange(2, 2 + ndims)
    arr = np.arange(np.prod(shape)).reshape(shape).astype('float32')
    for axis in range(ndims):
        np.testing.assert_array_equal(K.eval(K.repeat_elements(K.variable(arr), 3, axis=axis)),
                                      np.repeat(arr, 3, axis=axis))
        placeholder_shape = list(shape)
        placeholder_shape[axis] = None
        y = K.repeat_elements(K.placeholder(shape=placeholder_shape), 3, axis=axis)
        assert K.int_shape(y) == tuple(placeholder_shape)


def test_gather(keras, KNP):
    K = keras.backend
    ref = np.arange(60).reshape(10, 2, 3).astype('float32')
    indices = [1, 3, 7, 9]
    np.testing.assert_array_equal(
        K.eval(K.gather(K.variable(ref), K.variable(indices, dtype='int32'))),
        KNP.gather(ref, np.array(indices)))
    y = K.gather(K.placeholder(shape=(None, 3, 4)), K.placeholder(shape=(5, 6), dtype='int32'))
    assert K.int_shape(y) == (5, 6, 3, 4)


def test_value_manipulation(keras):
    K = keras.backend
    value = np.random.random((4, 2))
    x = K.variable(value)
    np.testing.assert_allclose(K.get_value(x), value, rtol=1e-6)
    assert K.count_params(x) == 8
    # keras.backend (2.3.1) does not re-export get_variable_shape; the backend has it
    from gpuk.backend import get_variable_shape
    assert K.int_shape(x) == get_variable_shape(x) == (4, 2)
    K.set_value(x, value * 2)
    np.testing.assert_allclose(K.eval(x), value * 2, rtol=1e-6)


@pytest.mark.parametrize('data_format', ['channels_last', 'channels_first'])
@pytest.mark.parametrize('strides,padding', [((1, 1), 'valid'), ((1, 1), 'same'), ((2, 2), 'valid')])
def test_conv2d(keras, KNP, data_format, strides, padding):
    K, rng = keras.backend, np.random.RandomState(3)
    x = _value((2, 7, 6, 3) if data_format == 'channels_last' else (2, 3, 7, 6), rng)
    # odd kernel sizes: for even ones 'same' pads as TensorFlow does (less before than
    # after), the reference's scipy.signal 'same' the other way round
    kernel = _value((3, 3, 3, 4), rng)
    got = K.eval(K.conv2d(K.variable(x), K.variable(kernel), strides, padding, data_format))
    # The reference has no strides (Keras tests it at stride 1); 'valid' with stride s is
    # the stride-1 result subsampled. Its wrapper reads the keyword arguments.
    want = KNP.conv2d(x, kernel, padding=padding, data_format=data_format)
    rows, cols = (slice(None, None, strides[0]), slice(None, None, strides[1]))
    want = want[:, rows, cols] if data_format == 'channels_last' else want[:, :, rows, cols]
    np.testing.assert_allclose(got, want, atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize('pool_mode', ['max', 'avg'])
def test_pool2d(keras, KNP, pool_mode):
    K, rng = keras.backend, np.random.RandomState(4)
    x = _value((2, 6, 6, 3), rng)
    got = K.eval(K.pool2d(K.variable(x), (2, 2), (2, 2), 'valid', 'channels_last', pool_mode))
    want = KNP.pool2d(x, (2, 2), (2, 2), 'valid', 'channels_last', pool_mode)
    np.testing.assert_allclose(got, want, atol=1e-5, rtol=1e-5)


def test_rnn_matches_numpy_backend(keras, KNP):
    """backend_test.py's test_rnn idea: the same step function, masked, both backends."""
    K, rng = keras.backend, np.random.RandomState(5)
    x = _value((3, 4, 2), rng)
    w = _value((2, 2), rng)
    mask = np.array([[1, 1, 1, 0], [1, 1, 0, 0], [1, 1, 1, 1]], 'float32')

    def step_for(backend):
        def step(inputs, states):
            out = backend.tanh(backend.dot(inputs, w) + states[0])
            return out, [out]
        return step
    init = np.zeros((3, 2), 'float32')
    last, outputs, _ = K.rnn(step_for(K), K.variable(x), [K.variable(init)], mask=K.variable(mask))
    ref_last, ref_outputs, _ = KNP.rnn(step_for(KNP), x, [init], mask=mask)
    np.testing.assert_allclose(K.eval(last), ref_last, atol=1e-5)
    np.testing.assert_allclose(K.eval(outputs), ref_outputs, atol=1e-5)


def test_batchnorm_inference(keras, KNP):
    K, rng = keras.backend, np.random.RandomState(6)
    x = _value((4, 3, 5), rng)
    mean, var = _value((5,), rng), np.abs(_value((5,), rng)) + 0.1
    beta, gamma = _value((5,), rng), _value((5,), rng)
    got = K.eval(K.batch_normalization(*[K.variable(a) for a in (x, mean, var, beta, gamma)],
                                       epsilon=1e-3))
    want = KNP.batch_normalization(x, mean, var, beta, gamma, epsilon=1e-3)
    np.testing.assert_allclose(got, want, atol=1e-5, rtol=1e-5)
