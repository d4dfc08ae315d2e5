"""Plan-time fusion (gpuk/fusion.py): conv -> bias_add [-> relu] into one convolution with a
fused epilogue, bias_add -> relu into BiasAct('relu'); results equal the unfused plan
(GPUK_FUSION=0), and chains whose intermediates are read elsewhere stay unfused."""
import numpy as np
import pytest

from gpuk import backend as K
from gpuk import device
from gpuk.cpu_fallback import conv as conv_twin
from gpuk.graph import apply
from gpuk.ops import conv as conv_ops
from gpuk.ops.bias import BiasAct, ConvBiasAct
from gpuk.ops.conv import ConvFwd

from tests.gradcheck import check_gradients


@pytest.fixture
def on():
    """``on(kind)`` switches the device for the rest of the test (restored after)."""
    saved = dict(device._state)
    yield device.set_device
    device._state.update(saved)


def _ops(f):
    return [forward.__self__ for forward, _, _, _ in f._plan.steps]


def _compiled(monkeypatch, fusion, inputs, outputs, updates=None):
    monkeypatch.setenv('GPUK_FUSION', '1' if fusion else '0')
    f = K.function(inputs, outputs, updates=updates)
    f._compiled()
    return f


def _conv_block(x, w, b, data_format, activation='relu'):
    y = K.bias_add(K.conv2d(x, w, padding='same', data_format=data_format), b,
                   data_format=data_format)
    return K.relu(y) if activation == 'relu' else y


def _arrays(rng, data_format, dtype):
    x_shape = (2, 6, 7, 3) if data_format == 'channels_last' else (2, 3, 6, 7)
    return (rng.standard_normal(x_shape).astype(dtype),
            rng.standard_normal((3, 3, 3, 5)).astype(dtype),
            rng.standard_normal(5).astype(dtype))


# ---------------------------------------------------------------- forward plans

@pytest.mark.parametrize('kind', ['cpu', 'emulate'])
@pytest.mark.parametrize('data_format', ['channels_last', 'channels_first'])
@pytest.mark.parametrize('dtype', ['float32', 'float64'])
def test_conv_bias_relu_fuses_and_matches_unfused(monkeypatch, on, rng, kind, data_format, dtype):
    on(kind)
    xv, wv, bv = _arrays(rng, data_format, dtype)
    x = K.placeholder(xv.shape, dtype=dtype)
    w, b = K.variable(wv, dtype=dtype), K.variable(bv, dtype=dtype)
    y = _conv_block(x, w, b, data_format)
    fused = _compiled(monkeypatch, True, [x], [y])
    plain = _compiled(monkeypatch, False, [x], [y])
    ops = _ops(fused)
    assert len(ops) == 1 and isinstance(ops[0], ConvBiasAct) and ops[0].activation == 'relu'
    assert [type(op).__name__ for op in _ops(plain)] == ['ConvFwd', 'BiasAct', 'Relu']
    got, want = fused([xv])[0], plain([xv])[0]
    assert got.dtype == want.dtype == np.dtype(dtype)
    assert (got > 0).any() and (got == 0).any()  # relu did cut something
    np.testing.assert_allclose(got, want, rtol=1e-6 if dtype == 'float32' else 1e-13, atol=1e-6)


@pytest.mark.parametrize('kind', ['cpu', 'emulate'])
def test_conv_bias_without_relu_uses_the_bias_epilogue(monkeypatch, on, rng, kind):
    on(kind)
    xv, wv, bv = _arrays(rng, 'channels_first', 'float32')
    x = K.placeholder(xv.shape)
    w, b = K.variable(wv), K.variable(bv)
    y = K.tanh(_conv_block(x, w, b, 'channels_first', activation=None))
    fused, plain = (_compiled(monkeypatch, on_, [x], [y]) for on_ in (True, False))
    assert [(type(op).__name__, getattr(op, 'activation', None)) for op in _ops(fused)][0] == \
        ('ConvBiasAct', 'linear')
    np.testing.assert_allclose(fused([xv])[0], plain([xv])[0], rtol=1e-6, atol=1e-6)


def test_dense_bias_add_relu_becomes_bias_act_relu(monkeypatch, rng):
    x = K.placeholder((4, 6))
    w, b = K.variable(rng.standard_normal((6, 5))), K.variable(rng.standard_normal(5))
    y = K.relu(K.bias_add(K.dot(x, w), b)) * 2
    fused, plain = (_compiled(monkeypatch, on_, [x], [y]) for on_ in (True, False))
    bias_steps = [op for op in _ops(fused) if isinstance(op, BiasAct)]
    assert len(bias_steps) == 1 and bias_steps[0].activation == 'relu'
    assert len(_ops(fused)) == len(_ops(plain)) - 1
    xv = rng.standard_normal((4, 6)).astype('float32')
    np.testing.assert_array_equal(fused([xv])[0], plain([xv])[0])


# ---------------------------------------------------------------- when not to fuse

def _fused_kinds(f):
    return sorted((type(op).__name__, op.activation) for op in _ops(f)
                  if isinstance(op, (ConvBiasAct, BiasAct)))


def test_no_fusion_when_the_conv_output_is_a_function_output(monkeypatch, rng):
    xv, wv, bv = _arrays(rng, 'channels_last', 'float32')
    x = K.placeholder(xv.shape)
    w, b = K.variable(wv), K.variable(bv)
    conv = K.conv2d(x, w, padding='same')
    y = K.relu(K.bias_add(conv, b))
    f = _compiled(monkeypatch, True, [x], [y, conv])
    assert not any(isinstance(op, ConvBiasAct) for op in _ops(f))
    assert _fused_kinds(f) == [('BiasAct', 'relu')]  # bias_add -> relu still may fuse
    plain = _compiled(monkeypatch, False, [x], [y, conv])
    for got, want in zip(f([xv]), plain([xv])):
        np.testing.assert_array_equal(got, want)


def test_no_fusion_when_the_conv_output_has_another_reader(monkeypatch, rng):
    xv, wv, bv = _arrays(rng, 'channels_last', 'float32')
    x = K.placeholder(xv.shape)
    w, b = K.variable(wv), K.variable(bv)
    conv = K.conv2d(x, w, padding='same')
    y = K.relu(K.bias_add(conv, b)) + K.sum(conv)
    f = _compiled(monkeypatch, True, [x], [y])
    assert not any(isinstance(op, ConvBiasAct) for op in _ops(f))
    np.testing.assert_allclose(f([xv])[0], _compiled(monkeypatch, False, [x], [y])([xv])[0],
                               rtol=1e-6)


def test_bias_output_that_is_a_target_stops_the_relu_from_fusing(monkeypatch, rng):
    xv, wv, bv = _arrays(rng, 'channels_last', 'float32')
    x = K.placeholder(xv.shape)
    w, b = K.variable(wv), K.variable(bv)
    pre = K.bias_add(K.conv2d(x, w, padding='same'), b)
    y = K.relu(pre)
    f = _compiled(monkeypatch, True, [x], [y, pre])
    assert _fused_kinds(f) == [('ConvBiasAct', 'linear')]
    got_y, got_pre = f([xv])
    np.testing.assert_array_equal(got_y, np.maximum(got_pre, 0))


def test_no_fusion_for_leaky_relu_depthwise_or_other_axis(monkeypatch, rng):
    xv, wv, bv = _arrays(rng, 'channels_last', 'float32')
    x = K.placeholder(xv.shape)
    w, b = K.variable(wv), K.variable(bv)
    leaky = K.relu(K.bias_add(K.conv2d(x, w, padding='same'), b), alpha=0.1)
    depthwise = K.bias_add(K.depthwise_conv2d(x, K.variable(rng.standard_normal((3, 3, 3, 1)))),
                           K.variable(rng.standard_normal(3)))
    f = _compiled(monkeypatch, True, [x], [leaky, depthwise])
    assert _fused_kinds(f) == [('BiasAct', 'linear'), ('ConvBiasAct', 'linear')]
    # a bias along a spatial axis (channels_first bias_add of a channels_last conv) stays
    cf = K.bias_add(K.conv2d(x, w, padding='same'), K.variable(rng.standard_normal(6)),
                    data_format='channels_first')
    g = _compiled(monkeypatch, True, [x], [cf])
    assert [type(op) for op in _ops(g)] == [ConvFwd, BiasAct]


def test_fusion_flag(monkeypatch, rng):
    x = K.placeholder((2, 3))
    y = K.relu(K.bias_add(x, K.variable(np.ones(3))))
    assert _fused_kinds(_compiled(monkeypatch, True, [x], [y])) == [('BiasAct', 'relu')]
    assert _fused_kinds(_compiled(monkeypatch, False, [x], [y])) == [('BiasAct', 'linear')]
    monkeypatch.setenv('GPUK_FUSION', 'yes')
    with pytest.raises(ValueError, match="GPUK_FUSION must be '0' or '1', got 'yes'"):
        K.function([x], [y])([np.zeros((2, 3))])


# ---------------------------------------------------------------- training

def _train_step(monkeypatch, fusion, data_format, init, xv):
    x = K.placeholder(xv.shape)
    w1, b1, w2, b2 = [K.variable(v) for v in init]
    h = _conv_block(x, w1, b1, data_format)
    out = _conv_block(h, w2, b2, data_format)
    loss = K.mean(K.square(out - 0.5))
    params = [w1, b1, w2, b2]
    grads = K.gradients(loss, params)
    updates = [K.update_sub(p, 0.1 * g) for p, g in zip(params, grads)]
    f = _compiled(monkeypatch, fusion, [x], [loss] + grads, updates=updates)
    first = f([xv])
    second = f([xv])
    return f, first + second + [K.get_value(p) for p in params]


@pytest.mark.parametrize('data_format', ['channels_last', 'channels_first'])
def test_training_step_with_fusion_equals_without(monkeypatch, rng, data_format):
    K.set_floatx('float64')  # the session fixture restores floatx
    xv, w1, b1 = _arrays(rng, data_format, 'float64')
    init = [w1, b1, rng.standard_normal((3, 3, 5, 4)), rng.standard_normal(4)]
    fused, got = _train_step(monkeypatch, True, data_format, init, xv)
    plain, want = _train_step(monkeypatch, False, data_format, init, xv)
    # relu gradients read the relu output, so both blocks fuse whole even in training
    assert _fused_kinds(fused) == [('ConvBiasAct', 'relu')] * 2
    assert not any(isinstance(op, ConvBiasAct) for op in _ops(plain))
    assert got[0] > 0 and got[5] < got[0]  # the step trained something
    for a, b in zip(got, want):
        np.testing.assert_allclose(a, b, rtol=1e-12, atol=1e-12)


def test_relu_gradient_rewrite_keeps_values_with_nan_and_zeros(monkeypatch):
    x = K.placeholder((6,), dtype='float64')
    b = K.variable(np.zeros(6))
    y = K.relu(K.bias_add(K.reshape(x, (1, 6)), b))
    g = K.gradients(K.sum(y * K.constant(np.arange(1.0, 7.0).reshape(1, 6))), [x])[0]
    xv = np.array([-1.0, 0.0, -0.0, 2.0, np.nan, 1e-300])
    fused = _compiled(monkeypatch, True, [x], [y, g])
    plain = _compiled(monkeypatch, False, [x], [y, g])
    assert _fused_kinds(fused) == [('BiasAct', 'relu')]
    for got, want in zip(fused([xv]), plain([xv])):
        np.testing.assert_array_equal(got, want)


# ---------------------------------------------------------------- the fused op itself

def test_conv_bias_act_gradients():
    window = conv_ops.Window('conv2d', 'conv', (1, 1), (1, 1), 'same', 'channels_last')
    rng = np.random.default_rng(3)
    check_gradients(lambda x, w, b: apply(ConvBiasAct(window, 'relu'), x, w, b),
                    rng.standard_normal((1, 4, 3, 2)), rng.standard_normal((2, 2, 2, 3)),
                    rng.standard_normal(3))


def test_conv_bias_act_checks_shapes_at_build_time():
    window = conv_ops.Window('conv2d', 'conv', (1, 1), (1, 1), 'valid', 'channels_first')
    x, w = K.placeholder((2, 3, 5, 5)), K.placeholder((3, 3, 3, 4))
    with pytest.raises(ValueError, match='bias_add: bias of shape'):
        apply(ConvBiasAct(window, 'linear'), x, w, K.placeholder((5,)))
    with pytest.raises(ValueError, match="ConvBiasAct: activation must be one of"):
        ConvBiasAct(window, 'tanh')


# ---------------------------------------------------------------- the NumPy twin's epilogue

@pytest.mark.parametrize('data_format', ['channels_last', 'channels_first'])
@pytest.mark.parametrize('dtype', ['float16', 'float32', 'float64'])
def test_twin_epilogue_equals_conv_then_bias_then_relu(rng, data_format, dtype):
    xv, wv, bv = _arrays(rng, data_format, dtype)
    args = ((2, 1), (1, 1), ((1, 1), (0, 2)), data_format)
    shape = (1, 5, 1, 1) if data_format == 'channels_first' else (5,)
    acc = np.float32 if dtype == 'float16' else dtype
    conv = conv_twin.conv_fwd(xv.astype(acc), wv.astype(acc), *args)
    want_bias = conv + bv.astype(acc).reshape(shape)
    for epilogue, want in (('bias', want_bias), ('bias_relu', np.maximum(want_bias, 0))):
        got = conv_twin.conv_fwd(xv, wv, *args, epilogue=epilogue, bias=bv)
        assert got.dtype == np.dtype(dtype) and got.shape == conv.shape
        if dtype == 'float16':  # one rounding of the float32 result
            np.testing.assert_array_equal(got, want.astype(dtype))
        else:
            np.testing.assert_allclose(got, want, rtol=1e-6 if dtype == 'float32' else 1e-13,
                                       atol=1e-6)
    assert (got == 0).any() and (got > 0).any()


def test_twin_epilogue_keeps_nan_and_checks_arguments():
    x = np.ones((1, 3, 3, 2), np.float32)
    w = np.ones((1, 1, 2, 2), np.float32)
    args = ((1, 1), (1, 1), ((0, 0), (0, 0)), 'channels_last')
    y = conv_twin.conv_fwd(x, w, *args, epilogue='bias_relu',
                           bias=np.array([np.nan, -5.0], np.float32))
    assert np.isnan(y[..., 0]).all() and (y[..., 1] == 0).all()
    with pytest.raises(ValueError, match="conv_fwd: epilogue must be None, 'bias' or 'bias_relu', "
                                         "got 'relu'"):
        conv_twin.conv_fwd(x, w, *args, epilogue='relu', bias=np.zeros(2, np.float32))
    with pytest.raises(ValueError, match='bias is only used with'):
        conv_twin.conv_fwd(x, w, *args, bias=np.zeros(2, np.float32))
    with pytest.raises(TypeError, match='conv_fwd: bias must be a numpy.ndarray of shape'):
        conv_twin.conv_fwd(x, w, *args, epilogue='bias', bias=[0.0, 0.0])
    with pytest.raises(ValueError, match=r'conv_fwd: bias must have shape \(2,\)'):
        conv_twin.conv_fwd(x, w, *args, epilogue='bias', bias=np.zeros(3, np.float32))
    with pytest.raises(TypeError, match='bias.dtype must equal x.dtype'):
        conv_twin.conv_fwd(x, w, *args, epilogue='bias', bias=np.zeros(2, np.float64))
