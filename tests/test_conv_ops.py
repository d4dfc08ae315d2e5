"""Convolution K functions against Keras 2.3.1's NumPy reference backend, static shapes,
finite-difference gradients of every input (and one second derivative), bad input."""
import numpy as np
import pytest

from gpuk import backend as K
from tests.evaluation import layout
from tests.gradcheck import check_gradients
from tests.keras_reference import numpy_backend

# Every test here runs on each implementation (tests/conftest.py: on_device), the CUDA kernels included.
pytestmark = pytest.mark.usefixtures('on_device')

REF = numpy_backend()
FORMATS = ['channels_last', 'channels_first']
DTYPES = ['float32', 'float64']


# ---------------------------------------------------------------- helpers

def subsample(y, strides, data_format):
    """Every stride-th output position: the strided result of a 'valid' convolution, and of
    a 'same' one when each input size is 1 modulo its stride (then TensorFlow's pads equal
    the stride-1 pads)."""
    steps = tuple(slice(None, None, s) for s in strides)
    if data_format == 'channels_first':
        return y[(slice(None), slice(None)) + steps]
    return y[(slice(None),) + steps]


def evaluate(build, *arrays):
    """Runs ``build`` on placeholders with an unknown batch dim; checks K.int_shape (None
    where unknown) against the evaluated shape."""
    placeholders = [K.placeholder(shape=(None,) + a.shape[1:] if i == 0 else a.shape,
                                  dtype=a.dtype.name) for i, a in enumerate(arrays)]
    y = build(*placeholders)
    value = K.function(placeholders, [y])(list(arrays))[0]
    static = K.int_shape(y)
    assert static[0] is None
    assert len(static) == value.ndim and all(
        s is None or s == v for s, v in zip(static, value.shape)), (static, value.shape)
    return value


def assert_close(got, want, dtype):
    want = np.asarray(want, np.float64)
    assert got.dtype == np.dtype(dtype)
    assert got.shape == want.shape, (got.shape, want.shape)
    scale = max(np.abs(want).max(), 1.0)
    tol = 1e-11 if dtype == 'float64' else 2e-6
    np.testing.assert_allclose(got, want, rtol=tol * 10, atol=tol * scale)


def random(rng, shape, dtype='float64'):
    return rng.standard_normal(shape).astype(dtype)


# ---------------------------------------------------------------- convolution values

# (spatial, kernel, strides, dilation, padding). 'same' cases use odd dilated extents
# (scipy centers even kernels differently from TensorFlow) and, when strided, input sizes
# that are 1 modulo the stride (see subsample).
CONV_CASES = [
    ((9,), (3,), (1,), (1,), 'valid'),
    ((10,), (3,), (1,), (2,), 'same'),
    ((9,), (4,), (2,), (1,), 'valid'),
    ((9,), (3,), (2,), (1,), 'same'),
    ((8,), (3,), (1,), (2,), 'causal'),
    ((9,), (2,), (2,), (1,), 'causal'),
    ((7, 6), (3, 2), (1, 1), (1, 1), 'valid'),
    ((6, 7), (3, 3), (1, 1), (2, 1), 'same'),
    ((7, 5), (3, 3), (2, 2), (1, 1), 'same'),
    ((8, 7), (2, 3), (3, 2), (1, 1), 'valid'),
    ((4, 5, 3), (3, 1, 3), (1, 1, 1), (1, 1, 1), 'same'),
    ((5, 4, 5), (2, 2, 3), (2, 1, 2), (1, 1, 1), 'valid'),
    ((5, 4, 4), (3, 3, 1), (1, 1, 1), (1, 2, 1), 'same'),
]
# Keras allows padding='causal' only for channels_last; dtypes alternate over the cases.
CONV_PARAMS = [pytest.param(case, data_format, DTYPES[i % 2],
                            id='%dd-%s-%d-%s' % (len(case[0]), case[4], i, data_format))
               for i, case in enumerate(CONV_CASES) for data_format in FORMATS
               if not (case[4] == 'causal' and data_format == 'channels_first')]
CONV_FUNCTIONS = {1: K.conv1d, 2: K.conv2d, 3: K.conv3d}


def reference_conv(x, w, strides, dilation, padding, data_format):
    x, w = x.astype(np.float64), w.astype(np.float64)
    if padding == 'causal':  # Keras's definition: left-pad, then 'valid'
        x = np.pad(x, ((0, 0), (dilation[0] * (w.shape[0] - 1), 0), (0, 0)))
        padding = 'valid'
    reference = {1: REF.conv1d, 2: REF.conv2d, 3: REF.conv3d}[w.ndim - 2]
    y = reference(x, w, padding=padding, data_format=data_format, dilation_rate=dilation)
    return subsample(y, strides, data_format)


@pytest.mark.parametrize('case,data_format,dtype', CONV_PARAMS)
def test_conv_matches_keras_reference(on_device, rng, case, data_format, dtype):
    spatial, kernel, strides, dilation, padding = case
    x = random(rng, layout(2, spatial, 3, data_format), dtype)
    w = random(rng, kernel + (3, 4), dtype)
    conv = CONV_FUNCTIONS[len(spatial)]
    got = evaluate(lambda a, b: conv(a, b, strides if len(spatial) > 1 else strides[0],
                                     padding, data_format,
                                     dilation if len(spatial) > 1 else dilation[0]), x, w)
    assert_close(got, reference_conv(x, w, strides, dilation, padding, data_format), dtype)


@pytest.mark.parametrize('dtype', DTYPES)
@pytest.mark.parametrize('data_format', FORMATS)
@pytest.mark.parametrize('strides,dilation,padding', [
    ((1, 1), (1, 1), 'valid'), ((1, 1), (2, 1), 'same'), ((2, 2), (1, 1), 'same'),
    ((2, 3), (1, 1), 'valid')])
def test_depthwise_conv2d_matches_keras_reference(on_device, rng, dtype, data_format,
                                                  strides, dilation, padding):
    x = random(rng, layout(2, (7, 7), 3, data_format), dtype)
    w = random(rng, (3, 3, 3, 2), dtype)          # depth multiplier 2
    got = evaluate(lambda a, b: K.depthwise_conv2d(a, b, strides, padding, data_format,
                                                   dilation), x, w)
    want = REF.depthwise_conv2d(x.astype(np.float64), w.astype(np.float64), padding=padding,
                                data_format=data_format, dilation_rate=dilation)
    assert_close(got, subsample(want, strides, data_format), dtype)


@pytest.mark.parametrize('rank', [1, 2])
@pytest.mark.parametrize('data_format', FORMATS)
@pytest.mark.parametrize('strides,padding,dtype', [
    (1, 'valid', 'float64'), (1, 'same', 'float32'), (2, 'same', 'float64'),
    (2, 'valid', 'float32')])
def test_separable_conv_matches_keras_reference(on_device, rng, rank, data_format, strides,
                                                padding, dtype):
    x = random(rng, layout(2, (7,) * rank, 3, data_format), dtype)
    depthwise = random(rng, (3,) * rank + (3, 2), dtype)
    pointwise = random(rng, (1,) * rank + (6, 5), dtype)
    separable = K.separable_conv1d if rank == 1 else K.separable_conv2d
    got = evaluate(lambda a: separable(a, K.constant(depthwise, dtype),
                                       K.constant(pointwise, dtype),
                                       strides if rank == 1 else (strides,) * 2, padding,
                                       data_format), x)
    reference = REF.separable_conv1d if rank == 1 else REF.separable_conv2d
    want = reference(x.astype(np.float64), depthwise.astype(np.float64),
                     pointwise.astype(np.float64), padding=padding, data_format=data_format)
    assert_close(got, subsample(want, (strides,) * rank, data_format), dtype)


@pytest.mark.parametrize('rank', [2, 3])
@pytest.mark.parametrize('data_format', FORMATS)
def test_conv_transpose_matches_keras_reference(on_device, rng, rank, data_format):
    # The reference knows unit strides and 'same' only; strides are checked by adjointness.
    spatial = (5, 4, 3)[:rank]
    x = random(rng, layout(2, spatial, 3, data_format))
    w = random(rng, (3,) * rank + (4, 3))     # (*k, filters, in_channels)
    out_shape = layout(2, spatial, 4, data_format)
    transpose = K.conv2d_transpose if rank == 2 else K.conv3d_transpose
    got = evaluate(lambda a, b: transpose(a, b, (K.shape(a)[0],) + out_shape[1:], (1,) * rank,
                                          'same', data_format), x, w)
    reference = REF.conv2d_transpose if rank == 2 else REF.conv3d_transpose
    want = reference(x, w, out_shape, padding='same', data_format=data_format)
    assert_close(got, want, 'float64')


@pytest.mark.parametrize('data_format', FORMATS)
@pytest.mark.parametrize('spatial,strides,padding,dilation', [
    ((8, 7), (2, 3), 'same', (1, 1)), ((9, 8), (2, 2), 'valid', (1, 1)),
    ((7, 7), (1, 1), 'valid', (2, 1))])
def test_conv2d_transpose_is_the_adjoint_of_conv2d(on_device, rng, data_format, spatial,
                                                   strides, padding, dilation):
    """<conv2d_transpose(y, w), x> == <y, conv2d(x, w)> for every x and y."""
    x = random(rng, layout(2, spatial, 3, data_format))
    w = random(rng, (3, 2, 3, 4))
    x_t = K.placeholder(shape=(None,) + x.shape[1:], dtype='float64')
    w_t = K.constant(w, 'float64')
    y_t = K.conv2d(x_t, w_t, strides, padding, data_format, dilation)
    y = random(rng, K.function([x_t], [y_t])([x])[0].shape)
    y_in = K.placeholder(shape=(None,) + y.shape[1:], dtype='float64')
    back = K.conv2d_transpose(y_in, w_t,
                              (None,) + x.shape[1:], strides, padding, data_format, dilation)
    assert K.int_shape(back) == (None,) + x.shape[1:]
    dx = K.function([y_in], [back])([y])[0]
    assert dx.shape == x.shape
    np.testing.assert_allclose(np.sum(dx * x), np.sum(y * K.function([x_t], [y_t])([x])[0]),
                               rtol=1e-10)


# ---------------------------------------------------------------- locally connected

def reference_local(x, kernel, kernel_size, strides, output_spatial, data_format):
    """Keras 2.3.1 tensorflow_backend.local_conv1d/2d transcribed to NumPy loops."""
    blocks = []
    for position in np.ndindex(*output_spatial):
        window = tuple(slice(p * s, p * s + k)
                       for p, s, k in zip(position, strides, kernel_size))
        if data_format == 'channels_first':
            piece = x[(slice(None), slice(None)) + window]
        else:
            piece = x[(slice(None),) + window + (slice(None),)]
        blocks.append(piece.reshape(x.shape[0], -1))
    out = np.einsum('pnf,pfo->npo', np.stack(blocks), kernel.astype(np.float64))
    out = out.reshape((x.shape[0],) + tuple(output_spatial) + (kernel.shape[-1],))
    return np.moveaxis(out, -1, 1) if data_format == 'channels_first' else out


@pytest.mark.parametrize('dtype', DTYPES)
@pytest.mark.parametrize('data_format', FORMATS)
def test_local_conv2d_matches_keras_definition(on_device, rng, dtype, data_format):
    kernel_size, strides, output_spatial = (3, 2), (2, 1), (3, 5)
    x = random(rng, layout(2, (8, 6), 3, data_format), dtype)
    kernel = random(rng, (15, 3 * 2 * 3, 4), dtype)
    got = evaluate(lambda a, b: K.local_conv2d(a, b, kernel_size, strides, output_spatial,
                                               data_format), x, kernel)
    want = reference_local(x.astype(np.float64), kernel, kernel_size, strides,
                           output_spatial, data_format)
    assert_close(got, want, dtype)


@pytest.mark.parametrize('data_format', FORMATS)
def test_local_conv1d_is_always_steps_then_features(on_device, rng, data_format):
    """Like TensorFlow's backend, local_conv1d reads (batch, steps, input_dim) whatever
    data_format says (LocallyConnected1D passes none)."""
    x = random(rng, (2, 9, 3))
    kernel = random(rng, (4, 2 * 3, 5))
    got = evaluate(lambda a, b: K.local_conv1d(a, b, (2,), (2,), data_format), x, kernel)
    assert_close(got, reference_local(x, kernel, (2,), (2,), (4,), 'channels_last'),
                 'float64')


# ---------------------------------------------------------------- bias_add

@pytest.mark.parametrize('data_format', FORMATS)
@pytest.mark.parametrize('ndim', [2, 3, 4, 5])
def test_bias_add_vector_matches_keras_reference(on_device, rng, data_format, ndim):
    x = random(rng, (2, 3, 4, 5, 6)[:ndim], 'float32')
    channels = x.shape[1] if data_format == 'channels_first' and ndim > 2 else x.shape[-1]
    bias = random(rng, (channels,), 'float32')
    got = evaluate(lambda a, b: K.bias_add(a, b, data_format), x, bias)
    ref_format = data_format if ndim > 2 else 'channels_last'  # TF adds on the last axis
    assert_close(got, REF.bias_add(x.astype(np.float64), bias, ref_format), 'float32')


@pytest.mark.parametrize('data_format', FORMATS)
@pytest.mark.parametrize('ndim', [3, 4, 5])
def test_bias_add_full_bias_follows_keras_reshape_rule(on_device, rng, data_format, ndim):
    """A bias of rank ndim - 1 is (*spatial, channels); channels_first reshapes it (Keras
    2.3.1 reshapes, it does not transpose) to (channels, *spatial)."""
    cl_shape = (2, 3, 4, 5, 6)[:ndim]
    bias = random(rng, cl_shape[1:])
    if data_format == 'channels_first':
        x = random(rng, (cl_shape[0], cl_shape[-1]) + cl_shape[1:-1])
        want = x + bias.reshape((1, bias.shape[-1]) + bias.shape[:-1])
        if ndim == 3:  # the reference backend agrees here
            np.testing.assert_allclose(want, REF.bias_add(x, bias, data_format))
    else:
        x = random(rng, cl_shape)
        want = REF.bias_add(x, bias, data_format)
    got = evaluate(lambda a, b: K.bias_add(a, b, data_format), x, bias)
    assert_close(got, want, 'float64')


def test_bias_add_uses_image_data_format_by_default(rng):
    x = K.placeholder((None, 3, 4, 4))
    K.set_image_data_format('channels_first')
    try:
        y = K.bias_add(x, K.constant(np.arange(3.0)))
    finally:
        K.set_image_data_format('channels_last')
    value = K.function([x], [y])([np.zeros((1, 3, 4, 4), 'float32')])[0]
    np.testing.assert_array_equal(value[0, :, 0, 0], [0, 1, 2])


# ---------------------------------------------------------------- static shapes

def test_static_shapes_with_unknown_dims():
    x = K.placeholder((None, None, 7, 3))
    w = K.placeholder((3, 3, 3, 8))
    assert K.int_shape(K.conv2d(x, w, (2, 2), 'same')) == (None, None, 4, 8)
    assert K.int_shape(K.conv2d(x, w, (1, 2), 'valid', dilation_rate=(1, 2))) == \
        (None, None, 2, 8)
    x1 = K.placeholder((4, None, 3))
    assert K.int_shape(K.conv1d(x1, K.placeholder((3, 3, 5)), 2, 'causal')) == (4, None, 5)
    xf = K.placeholder((None, 3, 9, None))
    assert K.int_shape(K.depthwise_conv2d(xf, K.placeholder((3, 3, 3, 2)),
                                          data_format='channels_first')) == (None, 6, 7, None)
    up = K.conv2d_transpose(K.placeholder((None, 4, 4, 8)), K.placeholder((3, 3, 5, 8)),
                            (None, 8, 8, 5), (2, 2), 'same')
    assert K.int_shape(up) == (None, 8, 8, 5)
    x3 = K.placeholder((2, 5, 6, 7, 3))
    assert K.int_shape(K.conv3d(x3, K.placeholder((2, 3, 3, 3, 4)), (2, 2, 2), 'valid')) == \
        (2, 2, 2, 3, 4)
    assert K.int_shape(K.local_conv2d(K.placeholder((None, 3, 8, 6)),
                                      K.placeholder((15, 18, 4)), (3, 2), (2, 1), (3, 5),
                                      'channels_first')) == (None, 4, 3, 5)


def test_conv_transpose_output_shape_as_a_shape_tensor(rng):
    """output_shape may be a 1-D int tensor known only at run time (K.shape of a tensor)."""
    like = K.placeholder((None, None, None, 2))
    y = K.placeholder((None, 3, 3, 4))
    w = K.constant(random(rng, (3, 3, 2, 4)), 'float32')
    from_tensor = K.conv2d_transpose(y, w, K.shape(like), (2, 2), 'same')
    from_tuple = K.conv2d_transpose(y, w, (None, 6, 5, 2), (2, 2), 'same')
    assert K.int_shape(from_tensor) == (None, None, None, 2)
    y_value = random(rng, (2, 3, 3, 4), 'float32')
    a, b = K.function([y, like], [from_tensor, from_tuple])(
        [y_value, np.zeros((2, 6, 5, 2), 'float32')])
    assert a.shape == (2, 6, 5, 2)
    np.testing.assert_array_equal(a, b)


def test_kernel_dtype_is_cast_to_the_common_float_type():
    x = K.placeholder((1, 5, 5, 2), dtype='float32')
    y = K.conv2d(x, K.constant(np.ones((3, 3, 2, 1)), 'float64'))
    assert K.dtype(y) == 'float64'
    x16 = K.placeholder((1, 5, 5, 2), dtype='float16')
    y16 = K.conv2d(x16, K.constant(np.ones((3, 3, 2, 1)), 'float16'), padding='same')
    value = K.function([x16], [y16])([np.ones((1, 5, 5, 2), 'float16')])[0]
    assert value.dtype == np.float16 and value[0, 2, 2, 0] == 18


# ---------------------------------------------------------------- gradients

def test_gradients_conv1d_conv2d_conv3d(rng):
    check_gradients(lambda x, w: K.conv1d(x, w, 2, 'causal', dilation_rate=2),
                    random(rng, (2, 7, 2)), random(rng, (2, 2, 3)))
    check_gradients(lambda x, w: K.conv2d(x, w, (2, 1), 'same', 'channels_first', (1, 2)),
                    random(rng, (2, 2, 5, 6)), random(rng, (3, 2, 2, 3)))
    check_gradients(lambda x, w: K.conv3d(x, w, (1, 2, 1), 'valid'),
                    random(rng, (1, 3, 4, 3, 2)), random(rng, (2, 2, 2, 2, 2)))


def test_gradients_conv_transpose(rng):
    check_gradients(lambda x, w: K.conv2d_transpose(x, w, (2, 7, 5, 2), (2, 2), 'same'),
                    random(rng, (2, 4, 3, 3)), random(rng, (3, 2, 2, 3)))
    check_gradients(lambda x, w: K.conv3d_transpose(x, w, (1, 2, 5, 4, 3), (2, 1, 1), 'valid',
                                                    'channels_first'),
                    random(rng, (1, 2, 2, 3, 2)), random(rng, (2, 2, 2, 2, 2)))


def test_gradients_depthwise_and_separable(rng):
    check_gradients(lambda x, w: K.depthwise_conv2d(x, w, (2, 1), 'same'),
                    random(rng, (2, 5, 4, 2)), random(rng, (3, 2, 2, 2)))
    check_gradients(lambda x, d, p: K.separable_conv2d(x, d, p, (1, 1), 'valid',
                                                       'channels_first', (2, 1)),
                    random(rng, (1, 2, 6, 4)), random(rng, (2, 2, 2, 2)),
                    random(rng, (1, 1, 4, 3)))
    check_gradients(lambda x, d, p: K.separable_conv1d(x, d, p, 2, 'same'),
                    random(rng, (2, 7, 2)), random(rng, (3, 2, 1)), random(rng, (1, 2, 3)))


def test_gradients_local_conv(rng):
    check_gradients(lambda x, w: K.local_conv1d(x, w, (2,), (2,)),
                    random(rng, (2, 6, 2)), random(rng, (3, 4, 2)))
    check_gradients(lambda x, w: K.local_conv2d(x, w, (2, 2), (1, 2), (2, 2),
                                                'channels_first'),
                    random(rng, (2, 2, 3, 4)), random(rng, (4, 8, 2)))


def test_gradients_bias_add(rng):
    check_gradients(lambda x, b: K.bias_add(x, b, 'channels_first'),
                    random(rng, (2, 3, 4)), random(rng, (3,)))
    check_gradients(lambda x, b: K.bias_add(x, b, 'channels_last'),
                    random(rng, (2, 3, 2, 2)), random(rng, (3, 2, 2)))


def test_second_derivatives_of_conv2d(rng):
    """Gradients of the data and filter gradients: ConvDgrad and ConvWgrad differentiate
    into the other convolution ops."""
    x, w = random(rng, (2, 5, 4, 2)), random(rng, (3, 2, 2, 2))

    def gradient(index):
        def build(x_t, w_t):
            y = K.conv2d(x_t, w_t, (2, 1), 'same')
            return K.gradients(K.sum(K.square(y)), [x_t, w_t])[index]
        return build
    check_gradients(gradient(0), x, w, rtol=1e-5, atol=1e-7)
    check_gradients(gradient(1), x, w, rtol=1e-5, atol=1e-7)


@pytest.mark.parametrize('index', [0, 1])
def test_second_derivatives_of_depthwise_and_local(rng, index):
    def depthwise(x_t, w_t):
        y = K.depthwise_conv2d(x_t, w_t, (1, 2), 'same', 'channels_first')
        return K.gradients(K.sum(K.square(y)), [x_t, w_t])[index]

    def local(x_t, w_t):
        y = K.local_conv2d(x_t, w_t, (2, 2), (1, 1), (2, 2), 'channels_last')
        return K.gradients(K.sum(K.square(y)), [x_t, w_t])[index]
    check_gradients(depthwise, random(rng, (1, 2, 4, 5)), random(rng, (3, 2, 2, 2)),
                    rtol=1e-5, atol=1e-7)
    check_gradients(local, random(rng, (2, 3, 3, 2)), random(rng, (4, 8, 2)),
                    rtol=1e-5, atol=1e-7)


# ---------------------------------------------------------------- bad input

def _raises(error, pattern, build):
    with pytest.raises(error, match=pattern):
        build()


def test_bad_convolution_arguments():
    x = K.placeholder((None, 8, 8, 3))
    w = K.placeholder((3, 3, 3, 4))
    _raises(ValueError, r'conv2d: the channels of x \(5\) does not match the input channels '
            r'of kernel \(3\); shapes \(None, 8, 8, 5\) and \(3, 3, 3, 4\)',
            lambda: K.conv2d(K.placeholder((None, 8, 8, 5)), w))
    _raises(ValueError, r'conv2d: kernel must have rank 4',
            lambda: K.conv2d(x, K.placeholder((3, 3, 4))))
    _raises(ValueError, r'conv2d: x must have rank 4',
            lambda: K.conv2d(K.placeholder((None, 8, 3)), w))
    _raises(ValueError, r'conv2d: strides must be >= 1', lambda: K.conv2d(x, w, (0, 1)))
    _raises(ValueError, r'conv2d: dilation_rate must be an int or a tuple of 2 ints',
            lambda: K.conv2d(x, w, dilation_rate=(1, 2, 3)))
    _raises(ValueError, r"conv2d: padding must be one of 'same', 'valid', got 'causal'",
            lambda: K.conv2d(x, w, padding='causal'))
    _raises(ValueError, r"conv3d: data_format must be 'channels_first' or 'channels_last', "
            r"got 'ndhwc'",
            lambda: K.conv3d(K.placeholder((1, 4, 4, 4, 1)), K.placeholder((1, 1, 1, 1, 1)),
                             data_format='ndhwc'))
    _raises(ValueError, r"conv1d: padding 'causal' needs data_format 'channels_last'",
            lambda: K.conv1d(K.placeholder((1, 3, 9)), K.placeholder((2, 3, 1)),
                             padding='causal', data_format='channels_first'))
    _raises(ValueError, r'conv2d: x of shape \(None, 2, 8, 3\) is smaller than the kernel',
            lambda: K.conv2d(K.placeholder((None, 2, 8, 3)), w))
    _raises(TypeError, r'conv2d: x must be a float tensor, got dtype int32',
            lambda: K.conv2d(K.placeholder((None, 8, 8, 3), dtype='int32'), w))


def test_bad_transpose_separable_local_and_bias_arguments():
    x = K.placeholder((None, 4, 4, 8))
    _raises(ValueError, r'conv2d_transpose: output_shape \(None, 9, 9, 5\) convolved with the '
            r'kernel of shape \(3, 3, 5, 8\) gives spatial shape \(5, 5\)',
            lambda: K.conv2d_transpose(x, K.placeholder((3, 3, 5, 8)), (None, 9, 9, 5),
                                       (2, 2), 'same'))
    _raises(ValueError, r'conv2d_transpose: the channels of output_shape \(6\) does not match',
            lambda: K.conv2d_transpose(x, K.placeholder((3, 3, 5, 8)), (None, 8, 8, 6),
                                       (2, 2), 'same'))
    _raises(ValueError, r'conv2d_transpose: output_shape must have 4 entries',
            lambda: K.conv2d_transpose(x, K.placeholder((3, 3, 5, 8)), (8, 8, 5)))
    _raises(ValueError, r'separable_conv2d: in_channels \* depth_multiplier of '
            r'depthwise_kernel \(16\) does not match the input channels of pointwise_kernel '
            r'\(12\)',
            lambda: K.separable_conv2d(x, K.placeholder((3, 3, 8, 2)),
                                       K.placeholder((1, 1, 12, 4))))
    _raises(ValueError, r'separable_conv1d: pointwise_kernel must have spatial dims of size 1',
            lambda: K.separable_conv1d(K.placeholder((1, 9, 2)), K.placeholder((3, 2, 1)),
                                       K.placeholder((2, 2, 4))))
    _raises(ValueError, r'local_conv2d: the kernel of shape \(15, 17, 4\) does not fit',
            lambda: K.local_conv2d(K.placeholder((None, 8, 6, 3)), K.placeholder((15, 17, 4)),
                                   (3, 2), (2, 1), (3, 5), 'channels_last'))
    _raises(ValueError, r'local_conv2d: output shape \(4, 5\) .* reads past',
            lambda: K.local_conv2d(K.placeholder((None, 8, 6, 3)), K.placeholder((20, 18, 4)),
                                   (3, 2), (2, 1), (4, 5), 'channels_last'))
    _raises(ValueError, r'bias_add: bias must have rank 1 or 3 for x of shape',
            lambda: K.bias_add(x, K.placeholder((4, 8))))
    _raises(ValueError, r'bias_add: bias of shape \(7,\) does not fit x of shape '
            r'\(None, 4, 4, 8\)', lambda: K.bias_add(x, K.placeholder((7,))))
    _raises(ValueError, r"bias_add: data_format must be 'channels_first' or 'channels_last'",
            lambda: K.bias_add(x, K.placeholder((8,)), data_format='NHWC'))


def test_runtime_shape_mismatch_names_the_function(rng):
    x = K.placeholder((None, None, None, 3))
    y = K.conv2d(x, K.constant(np.ones((3, 3, 3, 2))), padding='valid')
    with pytest.raises(ValueError, match='conv'):
        K.function([x], [y])([np.ones((1, 2, 2, 3), 'float32')])
