"""NumPy convolution twins against slow loop definitions, adjoint identities,
finite differences, geometry and argument checks."""
import itertools

import ml_dtypes
import numpy as np
import pytest

from gpuk.cpu_fallback import conv
from gpuk.contracts import geometry
from tests.evaluation import assert_close_to_scale, from_cl, layout, to_cl
from tests.gradcheck import numeric_gradient

DTYPES = [np.float16, ml_dtypes.bfloat16, np.float32, np.float64]
FORMATS = ['channels_last', 'channels_first']
# 16-bit results are rounded once from float32 sums: float16 by up to 2^-11, bfloat16
# (8 significant bits) by up to 2^-8 = 3.9e-3 of each element.
TOLERANCE = {np.float16: 1e-2, ml_dtypes.bfloat16: 1.5e-2, np.float32: 1e-5, np.float64: 1e-12}

# (input spatial, kernel spatial, strides, dilation, padding): 1d/2d/3d, odd
# sizes, strides larger than the kernel, dilation, every padding mode.
CASES = [
    ((7,), (3,), (1,), (1,), 'valid'),
    ((9,), (3,), (2,), (2,), 'causal'),
    ((8,), (2,), (3,), (1,), 'same'),
    ((5, 6), (3, 2), (1, 2), (1, 1), 'same'),
    ((7, 5), (2, 3), (3, 1), (2, 1), 'valid'),
    ((6, 7), (3, 3), (2, 2), (1, 2), 'same'),
    ((5, 5), (1, 1), (4, 3), (1, 1), 'valid'),
    ((6, 5), (3, 2), (1, 1), (2, 1), 'same'),
    ((8,), (3,), (1,), (2,), 'causal'),
    ((4, 3, 5), (2, 2, 3), (1, 1, 1), (1, 2, 1), 'same'),
    ((4, 5, 3), (2, 3, 2), (1, 2, 1), (1, 1, 2), 'same'),
    ((5, 4, 4), (2, 2, 2), (2, 2, 3), (1, 1, 1), 'valid'),
]
CASE_IDS = ['%dd-%s-%d' % (len(c[0]), c[4], i) for i, c in enumerate(CASES)]


# ---------------------------------------------------------------- slow references

def ref_out_spatial(in_spatial, kernel, strides, dilation, pads):
    return tuple((s + b + a - (k - 1) * d - 1) // st + 1
                 for s, k, st, d, (b, a) in zip(in_spatial, kernel, strides, dilation, pads))


def ref_taps(out_pos, kernel, strides, dilation, pads, in_spatial):
    """(tap, input position) pairs of one output position that land in the input."""
    for tap in itertools.product(*map(range, kernel)):
        pos = tuple(o * s + t * d - b for o, t, s, d, (b, _)
                    in zip(out_pos, tap, strides, dilation, pads))
        if all(0 <= p < size for p, size in zip(pos, in_spatial)):
            yield tap, pos


def ref_operands(x, w, dy, strides, dilation, pads, data_format):
    """(x, dy, w, in_spatial, kernel, out_spatial) of a reference: x and dy channels last, all
    three in float64."""
    x_cl = to_cl(x, data_format).astype(np.float64)
    dy_cl = to_cl(dy, data_format).astype(np.float64)
    w = w.astype(np.float64)
    in_spatial, kernel = x_cl.shape[1:-1], w.shape[:x.ndim - 2]
    return x_cl, dy_cl, w, in_spatial, kernel, ref_out_spatial(in_spatial, kernel, strides, dilation, pads)


def ref_conv_all(x, w, dy, strides, dilation, pads, data_format):
    """y, dx, dw straight from the definition, in float64."""
    x_cl, dy_cl, w, in_spatial, kernel, out_spatial = ref_operands(x, w, dy, strides, dilation, pads, data_format)
    y = np.zeros((x.shape[0],) + out_spatial + (w.shape[-1],))
    dx, dw = np.zeros_like(x_cl), np.zeros_like(w)
    for n in range(x.shape[0]):
        for o in itertools.product(*map(range, out_spatial)):
            for tap, pos in ref_taps(o, kernel, strides, dilation, pads, in_spatial):
                y[(n,) + o] += x_cl[(n,) + pos] @ w[tap]
                dx[(n,) + pos] += w[tap] @ dy_cl[(n,) + o]
                dw[tap] += np.outer(x_cl[(n,) + pos], dy_cl[(n,) + o])
    return from_cl(y, data_format), from_cl(dx, data_format), dw


def ref_depthwise_all(x, w, dy, strides, dilation, pads, data_format):
    x_cl, dy_cl, w, in_spatial, kernel, out_spatial = ref_operands(x, w, dy, strides, dilation, pads, data_format)
    channels, multiplier = w.shape[-2:]
    y = np.zeros((x.shape[0],) + out_spatial + (channels * multiplier,))
    dx, dw = np.zeros_like(x_cl), np.zeros_like(w)
    for n in range(x.shape[0]):
        for o in itertools.product(*map(range, out_spatial)):
            g = dy_cl[(n,) + o].reshape(channels, multiplier)
            for tap, pos in ref_taps(o, kernel, strides, dilation, pads, in_spatial):
                for c, m in itertools.product(range(channels), range(multiplier)):
                    value = x_cl[(n,) + pos + (c,)]
                    y[(n,) + o + (c * multiplier + m,)] += value * w[tap + (c, m)]
                    dx[(n,) + pos + (c,)] += w[tap + (c, m)] * g[c, m]
                    dw[tap + (c, m)] += value * g[c, m]
    return from_cl(y, data_format), from_cl(dx, data_format), dw


def keras_window(a, out_pos, kernel, strides, data_format):
    """The slice Keras 2.3.1 local_conv takes, in the array's own layout."""
    window = tuple(slice(o * s, o * s + k) for o, s, k in zip(out_pos, strides, kernel))
    if data_format == 'channels_first':
        return (slice(None), slice(None)) + window
    return (slice(None),) + window + (slice(None),)


def ref_local_all(x, w, dy, kernel, strides, out_spatial, data_format):
    """Keras 2.3.1 K.local_conv1d/2d transcribed: slice, flatten, batch_dot."""
    x, w, dy = x.astype(np.float64), w.astype(np.float64), dy.astype(np.float64)
    dy_cl = to_cl(dy, data_format)
    n = x.shape[0]
    y = np.zeros((n,) + tuple(out_spatial) + (w.shape[-1],))
    dx, dw = np.zeros_like(x), np.zeros_like(w)
    for p, o in enumerate(itertools.product(*map(range, out_spatial))):
        index = keras_window(x, o, kernel, strides, data_format)
        patch = x[index].reshape(n, -1)
        y[(slice(None),) + o] = patch @ w[p]
        dx[index] += (dy_cl[(slice(None),) + o] @ w[p].T).reshape(x[index].shape)
        dw[p] = patch.T @ dy_cl[(slice(None),) + o]
    return from_cl(y, data_format), dx, dw


def assert_close(got, ref, dtype):
    assert_close_to_scale(got, ref, dtype, TOLERANCE[dtype])


def random(rng, shape, dtype):
    return rng.standard_normal(shape).astype(dtype)


# ---------------------------------------------------------------- shared convolution

@pytest.mark.parametrize('dtype', DTYPES)
@pytest.mark.parametrize('data_format', FORMATS)
@pytest.mark.parametrize('case', CASES, ids=CASE_IDS)
def test_conv_matches_definition(case, data_format, dtype):
    in_spatial, kernel, strides, dilation, padding = case
    rng = np.random.default_rng(len(in_spatial) * 7 + strides[0])
    pads = geometry.conv_pads(in_spatial, kernel, strides, dilation, padding)
    x = random(rng, layout(2, in_spatial, 3, data_format), dtype)
    w = random(rng, kernel + (3, 4), dtype)
    out_spatial = ref_out_spatial(in_spatial, kernel, strides, dilation, pads)
    assert out_spatial == tuple(geometry.conv_output_length(s, k, padding, st, d)
                                for s, k, st, d in zip(in_spatial, kernel, strides, dilation))
    dy = random(rng, layout(2, out_spatial, 4, data_format), dtype)
    y_ref, dx_ref, dw_ref = ref_conv_all(x, w, dy, strides, dilation, pads, data_format)

    assert_close(conv.conv_fwd(x, w, strides, dilation, pads, data_format), y_ref, dtype)
    assert_close(conv.conv_dgrad(dy, w, x.shape, strides, dilation, pads, data_format),
                 dx_ref, dtype)
    assert_close(conv.conv_wgrad(x, dy, w.shape, strides, dilation, pads, data_format),
                 dw_ref, dtype)


@pytest.mark.parametrize('strides', [(1, 1), (2, 1)])
def test_conv_with_pads_wider_than_the_kernel(strides):
    # Pads wider than extent - 1 (legal, if unusual) take the scatter path of dgrad.
    rng = np.random.default_rng(13)
    pads, dilation = ((3, 1), (0, 4)), (1, 2)
    x = random(rng, (2, 4, 3, 2), np.float64)
    w = random(rng, (2, 2, 2, 3), np.float64)
    out_spatial = ref_out_spatial((4, 3), (2, 2), strides, dilation, pads)
    dy = random(rng, (2,) + out_spatial + (3,), np.float64)
    y_ref, dx_ref, dw_ref = ref_conv_all(x, w, dy, strides, dilation, pads, 'channels_last')
    args = (strides, dilation, pads, 'channels_last')
    assert_close(conv.conv_fwd(x, w, *args), y_ref, np.float64)
    assert_close(conv.conv_dgrad(dy, w, x.shape, *args), dx_ref, np.float64)
    assert_close(conv.conv_wgrad(x, dy, w.shape, *args), dw_ref, np.float64)


@pytest.mark.parametrize('data_format', FORMATS)
@pytest.mark.parametrize('case', CASES, ids=CASE_IDS)
def test_conv_gradients_are_exact_adjoints(case, data_format):
    in_spatial, kernel, strides, dilation, padding = case
    rng = np.random.default_rng(3)
    pads = geometry.conv_pads(in_spatial, kernel, strides, dilation, padding)
    x = random(rng, layout(3, in_spatial, 2, data_format), np.float64)
    w = random(rng, kernel + (2, 3), np.float64)
    y = conv.conv_fwd(x, w, strides, dilation, pads, data_format)
    dy = random(rng, y.shape, np.float64)
    dx = conv.conv_dgrad(dy, w, x.shape, strides, dilation, pads, data_format)
    dw = conv.conv_wgrad(x, dy, w.shape, strides, dilation, pads, data_format)
    forward = np.vdot(y, dy)
    assert np.vdot(x, dx) == pytest.approx(forward, rel=1e-12)
    assert np.vdot(w, dw) == pytest.approx(forward, rel=1e-12)


def test_conv_gradients_match_finite_differences():
    rng = np.random.default_rng(11)
    strides, dilation = (2, 1), (1, 2)
    pads = geometry.conv_pads((5, 4), (2, 2), strides, dilation, 'same')
    x = random(rng, (1, 2, 5, 4), np.float64)
    w = random(rng, (2, 2, 2, 3), np.float64)
    y = conv.conv_fwd(x, w, strides, dilation, pads, 'channels_first')
    g = random(rng, y.shape, np.float64)

    def loss():
        return np.vdot(conv.conv_fwd(x, w, strides, dilation, pads, 'channels_first'), g)

    np.testing.assert_allclose(
        conv.conv_dgrad(g, w, x.shape, strides, dilation, pads, 'channels_first'),
        numeric_gradient(loss, x), rtol=1e-7, atol=1e-8)
    np.testing.assert_allclose(
        conv.conv_wgrad(x, g, w.shape, strides, dilation, pads, 'channels_first'),
        numeric_gradient(loss, w), rtol=1e-7, atol=1e-8)


def test_conv_dgrad_is_transpose_conv_for_keras_output_shapes():
    # conv2d_transpose: dgrad of the forward conv from the Keras output length.
    rng = np.random.default_rng(5)
    for padding in ('same', 'valid'):
        for stride, k in ((2, 3), (3, 2), (1, 3)):
            length = geometry.deconv_output_length(4, stride, k, padding)
            assert geometry.conv_output_length(length, k, padding, stride) == 4
            pads = geometry.conv_pads((length,), (k,), (stride,), (1,), padding)
            dy = random(rng, (2, 4, 3), np.float64)
            w = random(rng, (k, 5, 3), np.float64)
            out = conv.conv_dgrad(dy, w, (2, length, 5), (stride,), (1,), pads,
                                  'channels_last')
            assert out.shape == (2, length, 5)


@pytest.mark.parametrize('dtype', [np.float16, ml_dtypes.bfloat16])
def test_16_bit_floats_accumulate_in_float32(dtype):
    # 4096 products of 1: a float16 accumulator would stall at 2048, a bfloat16 one at 256.
    x = np.ones((1, 64, 64, 1), dtype)
    w = np.ones((64, 64, 1, 1), dtype)
    y = conv.conv_fwd(x, w, (1, 1), (1, 1), ((0, 0), (0, 0)), 'channels_last')
    assert y.dtype == dtype and y.item() == 4096
    depthwise = conv.depthwise_conv_fwd(x, w, (1, 1), (1, 1), ((0, 0), (0, 0)), 'channels_last')
    assert depthwise.dtype == dtype and depthwise.item() == 4096


# ---------------------------------------------------------------- depthwise

@pytest.mark.parametrize('dtype', DTYPES)
@pytest.mark.parametrize('data_format', FORMATS)
@pytest.mark.parametrize('case', CASES[::2], ids=CASE_IDS[::2])
def test_depthwise_matches_definition(case, data_format, dtype):
    in_spatial, kernel, strides, dilation, padding = case
    rng = np.random.default_rng(17)
    pads = geometry.conv_pads(in_spatial, kernel, strides, dilation, padding)
    x = random(rng, layout(2, in_spatial, 3, data_format), dtype)
    w = random(rng, kernel + (3, 2), dtype)
    out_spatial = ref_out_spatial(in_spatial, kernel, strides, dilation, pads)
    dy = random(rng, layout(2, out_spatial, 6, data_format), dtype)
    y_ref, dx_ref, dw_ref = ref_depthwise_all(x, w, dy, strides, dilation, pads, data_format)

    assert_close(conv.depthwise_conv_fwd(x, w, strides, dilation, pads, data_format),
                 y_ref, dtype)
    assert_close(conv.depthwise_conv_dgrad(dy, w, x.shape, strides, dilation, pads,
                                           data_format), dx_ref, dtype)
    assert_close(conv.depthwise_conv_wgrad(x, dy, w.shape, strides, dilation, pads,
                                           data_format), dw_ref, dtype)


@pytest.mark.parametrize('case', CASES[1::2], ids=CASE_IDS[1::2])
def test_depthwise_gradients_are_exact_adjoints(case):
    in_spatial, kernel, strides, dilation, padding = case
    rng = np.random.default_rng(23)
    pads = geometry.conv_pads(in_spatial, kernel, strides, dilation, padding)
    x = random(rng, layout(2, in_spatial, 3, 'channels_last'), np.float64)
    w = random(rng, kernel + (3, 2), np.float64)
    args = (strides, dilation, pads, 'channels_last')
    y = conv.depthwise_conv_fwd(x, w, *args)
    dy = random(rng, y.shape, np.float64)
    forward = np.vdot(y, dy)
    assert np.vdot(x, conv.depthwise_conv_dgrad(dy, w, x.shape, *args)) == \
        pytest.approx(forward, rel=1e-12)
    assert np.vdot(w, conv.depthwise_conv_wgrad(x, dy, w.shape, *args)) == \
        pytest.approx(forward, rel=1e-12)


def test_depthwise_with_one_multiplier_is_a_per_channel_conv():
    rng = np.random.default_rng(2)
    x = random(rng, (2, 6, 5, 3), np.float64)
    w = random(rng, (3, 2, 3, 1), np.float64)
    pads = ((1, 1), (0, 1))
    y = conv.depthwise_conv_fwd(x, w, (1, 2), (1, 1), pads, 'channels_last')
    for c in range(3):
        single = conv.conv_fwd(x[..., c:c + 1], w[:, :, c:c + 1, :], (1, 2), (1, 1), pads,
                               'channels_last')
        np.testing.assert_allclose(y[..., c:c + 1], single, rtol=1e-12, atol=1e-12)


# ---------------------------------------------------------------- locally connected

LOCAL_CASES = [  # (input spatial, kernel, strides)
    ((7,), (3,), (2,)),
    ((6,), (2,), (3,)),
    ((5, 6), (2, 3), (1, 2)),
    ((6, 5), (3, 2), (3, 2)),
    ((4, 5, 4), (2, 3, 2), (2, 1, 2)),
]


@pytest.mark.parametrize('dtype', DTYPES)
@pytest.mark.parametrize('data_format', FORMATS)
@pytest.mark.parametrize('case', LOCAL_CASES, ids=lambda c: '%dd-%s' % (len(c[0]), c[0]))
def test_local_conv_matches_keras(case, data_format, dtype):
    in_spatial, kernel, strides = case
    rng = np.random.default_rng(29)
    out_spatial = tuple(geometry.conv_output_length(s, k, 'valid', st)
                        for s, k, st in zip(in_spatial, kernel, strides))
    x = random(rng, layout(2, in_spatial, 3, data_format), dtype)
    w = random(rng, (int(np.prod(out_spatial)), int(np.prod(kernel)) * 3, 4), dtype)
    dy = random(rng, layout(2, out_spatial, 4, data_format), dtype)
    y_ref, dx_ref, dw_ref = ref_local_all(x, w, dy, kernel, strides, out_spatial, data_format)
    args = (kernel, strides, out_spatial, data_format)

    assert_close(conv.local_conv_fwd(x, w, *args), y_ref, dtype)
    assert_close(conv.local_conv_dgrad(dy, w, x.shape, *args), dx_ref, dtype)
    assert_close(conv.local_conv_wgrad(x, dy, w.shape, *args), dw_ref, dtype)


def test_local_conv_gradients_adjoint_and_finite_differences():
    rng = np.random.default_rng(31)
    kernel, strides, out_spatial = (2, 2), (2, 1), (2, 3)
    x = random(rng, (2, 2, 5, 4), np.float64)
    w = random(rng, (6, 8, 3), np.float64)
    args = (kernel, strides, out_spatial, 'channels_first')
    y = conv.local_conv_fwd(x, w, *args)
    g = random(rng, y.shape, np.float64)
    dx = conv.local_conv_dgrad(g, w, x.shape, *args)
    dw = conv.local_conv_wgrad(x, g, w.shape, *args)
    assert np.vdot(x, dx) == pytest.approx(np.vdot(y, g), rel=1e-12)
    assert np.vdot(w, dw) == pytest.approx(np.vdot(y, g), rel=1e-12)

    def loss():
        return np.vdot(conv.local_conv_fwd(x, w, *args), g)

    np.testing.assert_allclose(dx, numeric_gradient(loss, x), rtol=1e-7, atol=1e-8)
    np.testing.assert_allclose(dw, numeric_gradient(loss, w), rtol=1e-7, atol=1e-8)


# ---------------------------------------------------------------- geometry

def test_conv_pads_follow_tensorflow_same():
    # Odd total padding goes after, as TensorFlow does.
    assert geometry.conv_pads((6,), (3,), (2,), (1,), 'same') == ((0, 1),)
    assert geometry.conv_pads((5,), (3,), (2,), (1,), 'same') == ((1, 1),)
    assert geometry.conv_pads((4, 4), (4, 1), (1, 1), (1, 1), 'same') == ((1, 2), (0, 0))
    assert geometry.conv_pads((9,), (3,), (1,), (2,), 'causal') == ((4, 0),)
    assert geometry.conv_pads((5, 5), (3, 3), (2, 2), (1, 1), 'valid') == ((0, 0), (0, 0))
    assert geometry.conv_pads((5,), (3,), (1,), (2,), 'full') == ((4, 4),)


@pytest.mark.parametrize('padding', ['same', 'valid', 'causal', 'full'])
def test_conv_output_length_agrees_with_conv_pads(padding):
    for size, k, s, d in itertools.product((1, 4, 7, 10), (1, 2, 3), (1, 2, 3), (1, 2)):
        expected = geometry.conv_output_length(size, k, padding, s, d)
        (before, after), = geometry.conv_pads((size,), (k,), (s,), (d,), padding)
        padded, extent = size + before + after, (k - 1) * d + 1
        if expected < 1:
            assert padded < extent
        else:
            assert (padded - extent) // s + 1 == expected
    assert geometry.conv_output_length(None, 3, padding, 1) is None


def test_deconv_output_length_follows_keras():
    assert geometry.deconv_output_length(4, 2, 3, 'same') == 8
    assert geometry.deconv_output_length(4, 2, 3, 'valid') == 9
    assert geometry.deconv_output_length(4, 3, 2, 'valid') == 12
    assert geometry.deconv_output_length(4, 2, 3, 'full') == 5
    assert geometry.deconv_output_length(4, 2, 3, 'same', output_padding=1) == 8
    assert geometry.deconv_output_length(4, 2, 3, 'valid', output_padding=0, dilation=2) == 11
    assert geometry.deconv_output_length(None, 2, 3, 'same') is None
    with pytest.raises(ValueError, match="deconv_output_length: padding must be one of"):
        geometry.deconv_output_length(4, 2, 3, 'causal')


def test_geometry_checks_name_function_and_argument():
    with pytest.raises(ValueError, match="conv_pads: padding 'causal' needs 1 spatial dim"):
        geometry.conv_pads((4, 4), (2, 2), (1, 1), (1, 1), 'causal')
    with pytest.raises(ValueError, match="conv_pads: strides must be >= 1"):
        geometry.conv_pads((4,), (2,), (0,), (1,), 'same')
    with pytest.raises(ValueError, match="conv_pads: padding must be one of .* got 'middle'"):
        geometry.conv_pads((4,), (2,), (1,), (1,), 'middle')
    with pytest.raises(ValueError, match="f: kernel_size must be an int or a tuple of 2"):
        geometry.normalize_tuple((1, 2, 3), 2, 'f', 'kernel_size')
    with pytest.raises(ValueError, match="f: kernel_size must be an int or a tuple of 2"):
        geometry.normalize_tuple((1.5, 2), 2, 'f', 'kernel_size')
    with pytest.raises(ValueError, match="f: data_format must be 'channels_first' or "
                                         "'channels_last', got 'nhwc'"):
        geometry.normalize_data_format('nhwc', 'f')
    assert geometry.normalize_tuple(3, 2, 'f', 'strides') == (3, 3)
    assert geometry.normalize_data_format('Channels_Last', 'f') == 'channels_last'


# ---------------------------------------------------------------- argument checks

X = np.zeros((1, 5, 5, 2), np.float32)
W = np.zeros((3, 3, 2, 4), np.float32)
DY = np.zeros((1, 3, 3, 4), np.float32)
VALID = ((0, 0), (0, 0))


@pytest.mark.parametrize('call, error, message', [
    (lambda: conv.conv_fwd(X.astype(np.int32), W, 1, 1, VALID, 'channels_last'),
     TypeError, r'conv_fwd: x must be a float16, bfloat16, float32 or float64 array, got dtype int32'),
    (lambda: conv.conv_fwd(X.astype(ml_dtypes.bfloat16), W.astype(np.float16), 1, 1, VALID, 'channels_last'),
     TypeError, r'conv_fwd: x and w must have the same dtype, got bfloat16 and float16'),
    (lambda: conv.conv_fwd(X, W.astype(np.float64), 1, 1, VALID, 'channels_last'),
     TypeError, r'conv_fwd: x and w must have the same dtype'),
    (lambda: conv.conv_fwd(X, W[:, :, :1], 1, 1, VALID, 'channels_last'),
     ValueError, r'conv_fwd: the channel count of x \(shape \(1, 5, 5, 2\)\) is 2 but '
                 r'w \(shape \(3, 3, 1, 4\)\) has 1'),
    (lambda: conv.conv_fwd(X, W, (1, 0), 1, VALID, 'channels_last'),
     ValueError, r'conv_fwd: strides must be >= 1'),
    (lambda: conv.conv_fwd(X, W, 1, (2, -1), VALID, 'channels_last'),
     ValueError, r'conv_fwd: dilation must be >= 1'),
    (lambda: conv.conv_fwd(X, W, 1, 1, ((0, -1), (0, 0)), 'channels_last'),
     ValueError, r'conv_fwd: pads must be a tuple of 2 \(before, after\) pairs'),
    (lambda: conv.conv_fwd(X, W, 1, 1, ((0, 0),), 'channels_last'),
     ValueError, r'conv_fwd: pads must be a tuple of 2'),
    (lambda: conv.conv_fwd(X, W, 1, 1, VALID, 'nhwc'),
     ValueError, r"conv_fwd: data_format must be 'channels_first' or 'channels_last', "
                 r"got 'nhwc'"),
    (lambda: conv.conv_fwd(X[0, 0], W, 1, 1, VALID, 'channels_last'),
     ValueError, r'conv_fwd: x must have rank 3, 4 or 5 .* got shape \(5, 2\)'),
    (lambda: conv.conv_fwd(X[0], W, 1, 1, ((0, 0),), 'channels_last'),
     ValueError, r'conv_fwd: w must have rank 3 \(\*kernel_spatial, C_in, C_out\)'),
    (lambda: conv.conv_fwd(X, W[0], 1, 1, VALID, 'channels_last'),
     ValueError, r'conv_fwd: w must have rank 4'),
    (lambda: conv.conv_fwd(X[:0], W, 1, 1, VALID, 'channels_last'),
     ValueError, r'conv_fwd: x must not have a zero-size dimension, got shape \(0, 5, 5, 2\)'),
    (lambda: conv.conv_fwd(X, W, 1, 3, VALID, 'channels_last'),
     ValueError, r'conv_fwd: padded input spatial size 5 .* smaller than the kernel '
                 r'extent 7 \(kernel \(3, 3\), dilation \(3, 3\)\)'),
    (lambda: conv.conv_dgrad(DY[:, :2], W, X.shape, 1, 1, VALID, 'channels_last'),
     ValueError, r'conv_dgrad: dy spatial shape \(2, 3\) does not match the output '
                 r'spatial shape \(3, 3\)'),
    (lambda: conv.conv_dgrad(DY, W, (1, 5, 5, 3), 1, 1, VALID, 'channels_last'),
     ValueError, r'conv_dgrad: the channel count of x_shape'),
    (lambda: conv.conv_dgrad(DY, W, (2, 5, 5, 2), 1, 1, VALID, 'channels_last'),
     ValueError, r'conv_dgrad: batch sizes of dy .* and x_shape'),
    (lambda: conv.conv_dgrad(DY, W, (1, 5, 0, 2), 1, 1, VALID, 'channels_last'),
     ValueError, r'conv_dgrad: x_shape must be >= 1'),
    (lambda: conv.conv_dgrad(DY, W, 5, 1, 1, VALID, 'channels_last'),
     ValueError, r'conv_dgrad: x_shape must be a tuple of 4 ints, got 5'),
    (lambda: conv.conv_wgrad(X, DY[..., :3], W.shape, 1, 1, VALID, 'channels_last'),
     ValueError, r'conv_wgrad: the channel count of dy .* is 3 but w_shape'),
    (lambda: conv.depthwise_conv_fwd(X, W[:, :, :1], 1, 1, VALID, 'channels_last'),
     ValueError, r'depthwise_conv_fwd: the channel count of x .* is 2 but w .* has 1'),
    (lambda: conv.depthwise_conv_dgrad(DY, W[:, :, :, :1], X.shape, 1, 1, VALID,
                                       'channels_last'),
     ValueError, r'depthwise_conv_dgrad: the channel count of dy .* is 4 but w .* has 2'),
    (lambda: conv.local_conv_fwd(X, np.zeros((9, 18, 4), np.float32), (3, 3), 1, (4, 3),
                                 'channels_last'),
     ValueError, r'local_conv_fwd: output_spatial \(4, 3\) .* reads past the input'),
    (lambda: conv.local_conv_fwd(X, np.zeros((9, 17, 4), np.float32), (3, 3), 1, (3, 3),
                                 'channels_last'),
     ValueError, r'local_conv_fwd: w must have shape \(9, 18, C_out\)'),
    (lambda: conv.local_conv_wgrad(X, DY, (9, 18, 3), (3, 3), 1, (3, 3), 'channels_last'),
     ValueError, r'local_conv_wgrad: the channel count of dy'),
])
def test_bad_arguments_are_named(call, error, message):
    with pytest.raises(error, match=message):
        call()


@pytest.mark.parametrize('data_format', ['channels_last', 'channels_first'])
def test_conv_blocked_over_images_matches_one_block(monkeypatch, data_format):
    """The column buffer is filled a block of images at a time; one image per block must give
    the same results as the whole batch in one block."""
    rng = np.random.default_rng(5)
    x = rng.standard_normal((5, 7, 6, 3) if data_format == 'channels_last' else (5, 3, 7, 6))
    w = rng.standard_normal((3, 2, 3, 4))
    args = ((2, 1), (1, 2), ((1, 1), (0, 2)), data_format)
    whole = conv.conv_fwd(x, w, *args)
    dy = rng.standard_normal(whole.shape)
    whole_dw = conv.conv_wgrad(x, dy, w.shape, *args)
    monkeypatch.setattr(conv, 'COLUMN_BLOCK_BYTES', 1)
    np.testing.assert_allclose(conv.conv_fwd(x, w, *args), whole, rtol=1e-12)
    np.testing.assert_allclose(conv.conv_wgrad(x, dy, w.shape, *args), whole_dw, rtol=1e-12)
