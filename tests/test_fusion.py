"""Plan-time fusion (gpuk/fusion.py): conv -> bias_add [-> relu] into one convolution with a
fused epilogue, bias_add -> relu into BiasAct('relu'); results equal the unfused plan
(GPUK_FUSION=0), and chains whose intermediates are read elsewhere stay unfused."""
import numpy as np
import pytest

from gpuk import backend as K
from gpuk import device, fusion
from gpuk.cpu_fallback import conv as conv_twin
from gpuk.graph import apply
from gpuk.kernels import runtime
from gpuk.ops import conv as conv_ops
from gpuk.ops.bias import BiasAct, ConvBiasAct
from gpuk.ops.conv import ConvFwd

from tests.evaluation import compiled_with_fusion as _compiled, plan_ops as _ops
from tests.gradcheck import check_gradients


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


def test_a_target_that_is_an_identity_broadcast_is_its_sources_slot(monkeypatch):
    """SumToShapeOf / BroadcastLike between equal, fully known shapes (what a Scan's step plan
    sees, compiled for its run-time shapes) compute nothing: as plan targets they are their
    source's slot, with no step of their own (a Scan stacks such outputs once); unfused, the
    steps run and give the same values."""
    from gpuk.ops.elementwise import BroadcastLike, SumToShapeOf
    x = K.placeholder((2, 3), dtype='float32')
    doubled = x * 2
    outputs = [doubled, apply(SumToShapeOf(), doubled, x), apply(BroadcastLike(), doubled, x)]
    value = np.arange(6, dtype=np.float32).reshape(2, 3)
    for fusion_on in (True, False):
        f = _compiled(monkeypatch, fusion_on, [x], outputs)
        broadcasts = [op for op in _ops(f) if isinstance(op, (SumToShapeOf, BroadcastLike))]
        assert (len(set(f._plan.target_slots)), len(broadcasts)) == ((1, 0) if fusion_on else (3, 2))
        for got in f([value]):
            np.testing.assert_array_equal(got, value * 2)


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


# ---------------------------------------------------------------- batch normalization

def _keras_batch_norm(x, gamma, beta, moving_mean, moving_var, axis, momentum=0.99, epsilon=1e-3):
    """What keras.layers.BatchNormalization.call (Keras 2.3.1) builds, with its updates."""
    ndim = len(K.int_shape(x))
    reduction_axes = [a for a in range(ndim) if a != axis % ndim]
    broadcast_shape = [1] * ndim
    broadcast_shape[axis] = K.int_shape(x)[axis]
    needs_broadcasting = sorted(reduction_axes) != list(range(ndim))[:-1]

    def normalize_inference():
        params = [moving_mean, moving_var, beta, gamma]
        if needs_broadcasting:
            params = [K.reshape(p, broadcast_shape) for p in params]
        return K.batch_normalization(x, *params, axis=axis, epsilon=epsilon)
    normed, mean, variance = K.normalize_batch_in_training(x, gamma, beta, reduction_axes, epsilon=epsilon)
    sample_size = K.cast(K.prod([K.shape(x)[a] for a in reduction_axes]), dtype=K.dtype(x))
    variance *= sample_size / (sample_size - (1.0 + epsilon))
    updates = [K.moving_average_update(moving_mean, mean, momentum),
               K.moving_average_update(moving_var, variance, momentum)]
    return K.in_train_phase(normed, normalize_inference), updates


def _bn_problem(rng, data_format, dtype):
    shape = (3, 4, 5, 7) if data_format == 'channels_last' else (3, 7, 4, 5)
    return (rng.standard_normal(shape).astype(dtype) * 2 + 1, rng.uniform(0.5, 1.5, 7).astype(dtype),
            rng.standard_normal(7).astype(dtype), rng.standard_normal(7).astype(dtype),
            rng.uniform(0.5, 2, 7).astype(dtype))


def _bn_relu_step(monkeypatch, fusion, data_format, dtype, values, activation=K.relu):
    """One Keras-style BN -> relu training step: (function, outputs per phase, variables after)."""
    xv, *init = values
    axis = -1 if data_format == 'channels_last' else 1
    x = K.placeholder((None,) + xv.shape[1:], dtype=dtype)
    gamma, beta, moving_mean, moving_var = (K.variable(v, dtype=dtype) for v in init)
    out, updates = _keras_batch_norm(x, gamma, beta, moving_mean, moving_var, axis)
    y = activation(out)
    loss = K.sum(y * K.constant(np.linspace(-1, 2, xv.size).reshape(xv.shape), dtype=dtype))
    grads = K.gradients(loss, [x, gamma, beta])
    f = _compiled(monkeypatch, fusion, [x, K.learning_phase()], [y, loss] + grads, updates=updates)
    results = [f([xv, 0]), f([xv, 1]), f([xv, 1])]
    return f, results, [K.get_value(v) for v in (moving_mean, moving_var)]


def _bn_ops(f):
    return [(type(op).__name__, op.activation, getattr(op, 'moving', None) is not None)
            for op in _ops(f) if type(op).__name__ in ('BnTrain', 'BnInfer', 'BnGrad')]


@pytest.fixture
def kernel_calls(monkeypatch):
    """``kernel_calls(name)``: from then on, the keyword view of every call of the current
    device's impl.batchnorm.<name> (the NumPy twin on cpu, the launcher on emulate), in order.
    The plan steps call the *_runner functions once per problem (prepared.Kept keeps the
    runner, whose every call computes what these arguments ask for)."""
    def spy_on(name):
        module = device.impl().batchnorm
        real, calls = getattr(module, name), []
        names = real.__code__.co_varnames[:real.__code__.co_argcount]

        def spy(*args, **kwargs):
            calls.append(dict(zip(names, args), **kwargs))
            return real(*args, **kwargs)
        monkeypatch.setattr(module, name, spy)
        return calls
    return spy_on


@pytest.mark.parametrize('kind', ['cpu', 'emulate'])
@pytest.mark.parametrize('data_format', ['channels_last', 'channels_first'])
@pytest.mark.parametrize('dtype', ['float32', 'float64'])
def test_keras_batch_norm_relu_and_moving_averages_fuse(monkeypatch, on, kernel_calls, rng, kind, data_format,
                                                        dtype):
    on(kind)
    values = _bn_problem(rng, data_format, dtype)
    calls = kernel_calls('bn_train_fwd_runner')
    fused, got, got_vars = _bn_relu_step(monkeypatch, True, data_format, dtype, values)
    # every call (the switch computes both branches in either phase) ran the fused kernel:
    # relu and the moving averages, not the elementwise steps MovingAverages falls back to
    # (the three steps are one problem: one runner, or one per step with GPUK_CHECK_LAUNCHES=1)
    runners = 3 if runtime.check_launches_forced() else 1
    assert len(calls) == runners
    for call in calls:
        assert call['activation'] == 'relu'
        assert call['moving_mean'].shape == call['moving_var'].shape == (7,)
        assert call['decay'].shape == call['var_decay'].shape == call['var_factor'].shape == ()
    del calls[:]
    plain, want, want_vars = _bn_relu_step(monkeypatch, False, data_format, dtype, values)
    assert len(calls) == runners and not any(call.get('moving_mean') is not None for call in calls)
    assert sorted(_bn_ops(fused)) == [('BnGrad', 'linear', False), ('BnInfer', 'relu', False),
                                      ('BnTrain', 'relu', True)]
    assert not any(type(op).__name__ == 'Relu' for op in _ops(fused))
    assert any(type(op).__name__ == 'Relu' for op in _ops(plain))
    assert sorted(_bn_ops(plain)) == [('BnGrad', 'linear', False), ('BnInfer', 'linear', False),
                                      ('BnTrain', 'linear', False)]
    tolerance = {'rtol': 2e-6, 'atol': 2e-6} if dtype == 'float32' else {'rtol': 1e-13, 'atol': 1e-13}
    for phase_got, phase_want in zip(got, want):
        for a, b in zip(phase_got, phase_want):
            assert a.dtype == b.dtype
            np.testing.assert_allclose(a, b, **tolerance)
    y_train = got[1][0]
    assert (y_train == 0).any() and (y_train > 0).any()
    for a, b, before in zip(got_vars, want_vars, values[3:]):
        assert not np.allclose(a, before)       # the calls moved the averages
        np.testing.assert_allclose(a, b, **tolerance)


def test_moving_averages_equal_keras_formula(monkeypatch, rng):
    """The fused update against the formula written out in float64."""
    values = _bn_problem(rng, 'channels_last', 'float64')
    xv, _, _, mm, mv = values
    _, _, (got_mean, got_var) = _bn_relu_step(monkeypatch, True, 'channels_last', 'float64',
                                              (xv,) + values[1:])
    mean, var = xv.mean(axis=(0, 1, 2)), xv.var(axis=(0, 1, 2))
    n = xv.size / xv.shape[-1]
    for _ in range(3):   # the updates run on every call, in either phase (as in Keras)
        mm = mm - (mm - mean) * (1 - 0.99)
        mv = mv - (mv - var * n / (n - 1.001)) * (1 - 0.99)
    np.testing.assert_allclose(got_mean, mm, rtol=1e-12)
    np.testing.assert_allclose(got_var, mv, rtol=1e-12)


def test_batch_norm_relu_fuses_without_a_switch(monkeypatch, rng):
    xv, gv, bv, mmv, mvv = _bn_problem(rng, 'channels_first', 'float64')
    x = K.placeholder(xv.shape, dtype='float64')
    gamma, beta = K.variable(gv), K.variable(bv)
    train, _, _ = K.normalize_batch_in_training(x, gamma, beta, [0, 2, 3])
    infer = K.batch_normalization(x, K.constant(mmv.reshape(1, 7, 1, 1)), K.constant(mvv.reshape(1, 7, 1, 1)),
                                  beta, gamma, axis=1)
    outs = [K.relu(train), K.relu(infer)]
    fused, plain = (_compiled(monkeypatch, f, [x], outs) for f in (True, False))
    assert sorted(_bn_ops(fused)) == [('BnInfer', 'relu', False), ('BnTrain', 'relu', False)]
    assert len(_ops(fused)) == len(_ops(plain)) - 2
    for a, b in zip(fused([xv]), plain([xv])):
        np.testing.assert_allclose(a, b, rtol=1e-13, atol=1e-13)


def test_batch_norm_relu_gradients_through_fused_plans(kernel_calls):
    rng = np.random.default_rng(5)

    def build(x, gamma, beta):
        y, _, _ = K.normalize_batch_in_training(x, gamma, beta, [0, 1])
        return K.relu(y)
    backward = kernel_calls('bn_bwd_runner')
    check_gradients(build, rng.standard_normal((4, 3, 5)), rng.uniform(0.5, 1.5, 5),
                    rng.standard_normal(5) * 0.3)
    assert [call['activation'] for call in backward] == ['relu']   # the fused backward was checked
    check_gradients(lambda x, m, v, g, b: K.relu(K.batch_normalization(x, m, v, b, g, axis=1)),
                    rng.standard_normal((4, 3)), rng.standard_normal(3), rng.uniform(0.5, 2, 3),
                    rng.uniform(0.5, 1.5, 3), rng.standard_normal(3) * 0.3)


def _bn_relu_gradients(dtype, data_format, values):
    """A K-level BN -> relu (no learning-phase switch) and its gradients: (x, outputs)."""
    xv, gv, bv, _, _ = values
    axes = [0, 1, 2] if data_format == 'channels_last' else [0, 2, 3]
    x = K.placeholder(xv.shape, dtype=dtype)
    gamma, beta = K.variable(gv, dtype=dtype), K.variable(bv, dtype=dtype)
    normed, _, _ = K.normalize_batch_in_training(x, gamma, beta, axes)
    y = K.relu(normed)
    loss = K.sum(y * K.constant(np.linspace(-1, 2, xv.size).reshape(xv.shape), dtype=dtype))
    return x, [y] + K.gradients(loss, [x, gamma, beta])


@pytest.mark.parametrize('kind', ['cpu', 'emulate'])
@pytest.mark.parametrize('data_format', ['channels_last', 'channels_first'])
@pytest.mark.parametrize('dtype', ['float32', 'float64'])
def test_batch_norm_relu_backward_fuses_without_a_switch(monkeypatch, on, rng, kind, data_format, dtype):
    """ReluGrad -> BnGrad becomes BnGrad('relu') reading the fused forward's output."""
    on(kind)
    values = _bn_problem(rng, data_format, dtype)
    x, outputs = _bn_relu_gradients(dtype, data_format, values)
    fused, plain = (_compiled(monkeypatch, f, [x], outputs) for f in (True, False))
    assert sorted(_bn_ops(fused)) == [('BnGrad', 'relu', False), ('BnTrain', 'relu', False)]
    assert not any(type(op).__name__ in ('Relu', 'ReluGrad') for op in _ops(fused))
    assert sorted(_bn_ops(plain)) == [('BnGrad', 'linear', False), ('BnTrain', 'linear', False)]
    assert [type(op).__name__ for op in _ops(plain)].count('ReluGrad') == 1
    got, want = fused([values[0]]), plain([values[0]])
    assert (got[0] == 0).any() and (got[0] > 0).any()     # the mask cut something
    tolerance = {'rtol': 1e-6, 'atol': 1e-6} if dtype == 'float32' else {'rtol': 1e-13, 'atol': 1e-13}
    for a, b in zip(got, want):
        assert a.dtype == b.dtype
        np.testing.assert_allclose(a, b, **tolerance)


def test_batch_norm_relu_backward_stays_unfused_when_its_input_gradient_is_kept(monkeypatch, rng):
    values = _bn_problem(rng, 'channels_last', 'float64')
    xv, gv, bv, _, _ = values
    x = K.placeholder(xv.shape, dtype='float64')
    normed, _, _ = K.normalize_batch_in_training(x, K.variable(gv), K.variable(bv), [0, 1, 2])
    loss = K.sum(K.relu(normed) * K.constant(np.linspace(-1, 2, xv.size).reshape(xv.shape)))
    # the relu's gradient is itself an output (the gradient to normed): the BnGrad cannot absorb it
    g_x, g_normed = K.gradients(loss, [x, normed])
    f = _compiled(monkeypatch, True, [x], [g_x, g_normed])
    assert sorted(_bn_ops(f)) == [('BnGrad', 'linear', False), ('BnTrain', 'relu', False)]
    plain = _compiled(monkeypatch, False, [x], [g_x, g_normed])
    for a, b in zip(f([xv]), plain([xv])):
        np.testing.assert_array_equal(a, b)


def test_unusual_batch_norm_patterns_stay_unfused(monkeypatch, rng):
    xv, gv, bv, mmv, mvv = _bn_problem(rng, 'channels_last', 'float32')
    x = K.placeholder((None,) + xv.shape[1:])
    gamma, beta, moving_mean, moving_var = (K.variable(v) for v in (gv, bv, mmv, mvv))
    out, updates = _keras_batch_norm(x, gamma, beta, moving_mean, moving_var, -1)
    # leaky relu; the switch's output read twice; only the mean's update
    leaky = _compiled(monkeypatch, True, [x, K.learning_phase()], [K.relu(out, alpha=0.1)], updates=updates[:1])
    assert sorted(_bn_ops(leaky)) == [('BnInfer', 'linear', False), ('BnTrain', 'linear', False)]
    shared = _compiled(monkeypatch, True, [x, K.learning_phase()], [K.relu(out), out * 2], updates=updates)
    assert sorted(_bn_ops(shared)) == [('BnInfer', 'linear', False), ('BnTrain', 'linear', True)]
    # an update that is not Keras's formula (momentum on the other side)
    normed, mean, var = K.normalize_batch_in_training(x, gamma, beta, [0, 1, 2])
    other = [K.update(moving_mean, moving_mean * 0.99 + mean * 0.01), K.moving_average_update(moving_var, var, 0.99)]
    g = _compiled(monkeypatch, True, [x], [K.relu(normed)], updates=other)
    assert _bn_ops(g) == [('BnTrain', 'relu', False)]
    # the batch mean is also an output: still fine (it stays computed); the corrected
    # variance is an output: the variance chain loses an intermediate, so no fusion
    _, mean2, var2 = K.normalize_batch_in_training(x, gamma, beta, [0, 1, 2])
    corrected = var2 * 1.5
    h = _compiled(monkeypatch, True, [x], [mean2, corrected], updates=[
        K.moving_average_update(moving_mean, mean2, 0.9), K.moving_average_update(moving_var, corrected, 0.9)])
    assert _bn_ops(h) == [('BnTrain', 'linear', False)]
    for f, n_outputs in ((leaky, 1), (shared, 2)):
        assert len(f([xv, 1])) == n_outputs
    np.testing.assert_allclose(g([xv])[0], np.maximum(
        (xv - xv.mean((0, 1, 2))) / np.sqrt(xv.var((0, 1, 2)) + 1e-3) * gv + bv, 0), rtol=1e-5, atol=1e-5)


def test_fusion_flag_leaves_batch_norm_unfused(monkeypatch, rng):
    values = _bn_problem(rng, 'channels_last', 'float32')
    f, _, _ = _bn_relu_step(monkeypatch, False, 'channels_last', 'float32', values)
    assert all(activation == 'linear' and not moving for _, activation, moving in _bn_ops(f))
    x, outputs = _bn_relu_gradients('float32', 'channels_last', values)
    g = _compiled(monkeypatch, False, [x], outputs)
    assert sorted(_bn_ops(g)) == [('BnGrad', 'linear', False), ('BnTrain', 'linear', False)]


def test_fused_batch_norm_ops_differentiate(rng):
    """The fused ops' own gradients. Plans fuse after K.gradients built the graph, so graph
    gradients (second derivatives included) never go through a fused op; these serve a
    graph that applies a fused op itself."""
    from gpuk.ops.batchnorm import BnInfer, BnTrain, MovingAverages

    def train(x, gamma, beta, mm, mv, decay, factor):
        op = BnTrain((0, 1), 1e-3, True, True, activation='relu', moving=MovingAverages(True))
        y, mean, var, inv_std, next_mean, next_var = apply(op, x, gamma, beta, mm, mv, decay, decay, factor)
        return K.sum(y) * 0.1 + K.sum(next_mean * next_var) + K.sum(inv_std)
    check_gradients(lambda *a: K.reshape(train(*a), (1,)), rng.standard_normal((3, 2, 4)),
                    rng.uniform(0.5, 1.5, 4), rng.standard_normal(4), rng.standard_normal(4),
                    rng.uniform(0.5, 2, 4), np.array(0.1), np.array(1.2))
    check_gradients(lambda x, m, v, g, b: apply(BnInfer(1e-3, True, True, 1, activation='relu'), x, m, v, g, b),
                    rng.standard_normal((4, 3)), rng.standard_normal(3), rng.uniform(0.5, 2, 3),
                    rng.uniform(0.5, 1.5, 3), rng.standard_normal(3) * 0.3)
    from gpuk.ops.batchnorm import BnGrad
    y = np.maximum(rng.standard_normal((3, 4)), 0)   # a fused output: its zeros are the mask
    check_gradients(lambda dy, x, mean, inv_std, gamma, out: apply(
        BnGrad((0,), True, False, False, 'relu'), dy, x, mean, inv_std, gamma, out)[0],
        rng.standard_normal((3, 4)), rng.standard_normal((3, 4)), rng.standard_normal(4),
        rng.uniform(0.5, 2, 4), rng.uniform(0.5, 1.5, 4), y, wrt=range(5))


# ---------------------------------------------------------------- the backward rule on hand-built steps

X, GAMMA, BETA, Y, MEAN, VAR, INV_STD, G, RELU_GRAD, DX, DGAMMA, DBETA, OTHER = range(13)


def _relu_backward_steps(train_axes=(0, 1), grad_axes=(0, 1), train_activation='relu', grad_has_gamma=True,
                         grad_mean=MEAN):
    """BnTrain(relu) -> y; ReluGrad(g, y); linear BnGrad(relu grad, x, mean, inv_std, gamma)."""
    from gpuk.ops.activation import Relu, ReluGrad
    from gpuk.ops.batchnorm import BnGrad, BnTrain
    grad_ins = [RELU_GRAD, X, grad_mean, INV_STD] + ([GAMMA] if grad_has_gamma else [])
    return [(BnTrain(train_axes, 1e-3, True, True, activation=train_activation), [X, GAMMA, BETA],
             [Y, MEAN, VAR, INV_STD]),
            (ReluGrad(Relu(0., None, 0.)), [G, Y], [RELU_GRAD]),
            (BnGrad(grad_axes, grad_has_gamma, False, False), grad_ins, [DX, DGAMMA, DBETA][:3 if grad_has_gamma else 2])]


def _kinds(steps):
    return [(type(op).__name__, getattr(op, 'activation', None)) for op, _, _ in steps]


def test_relu_backward_rule_fuses_the_batch_norms_own_backward():
    fused = fusion.fuse(_relu_backward_steps(), protected={Y, DX, DGAMMA, DBETA})
    assert _kinds(fused) == [('BnTrain', 'relu'), ('BnGrad', 'relu')]
    assert fused[1][1] == [G, X, MEAN, INV_STD, GAMMA, Y]


@pytest.mark.parametrize('mismatch', [dict(grad_axes=(0,)), dict(train_activation='linear'),
                                      dict(grad_has_gamma=False), dict(grad_mean=OTHER)],
                         ids=['other axes', 'linear forward', 'gamma differs', 'other statistics'])
def test_relu_backward_rule_leaves_another_batch_norms_backward_alone(mismatch):
    fused = fusion.fuse(_relu_backward_steps(**mismatch), protected={Y, DX, DGAMMA, DBETA})
    assert ('ReluGrad', None) in _kinds(fused) and ('BnGrad', 'linear') in _kinds(fused)
