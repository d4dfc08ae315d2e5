"""Keras 2.3.1 models under the mixed-precision policies (gpuk/mixed_precision.py and
gpuk/loss_scaling.py): they train, their variables stay float32, the compiled training step
runs every convolution and matrix product in the policy's dtype and nothing else, and a
float16 step with a non-finite gradient changes nothing but the loss scale.

Each model runs on the NumPy device and on the emulated CUDA runtime (the convolution,
batch-norm, pooling, softmax and CTC kernels in bfloat16/float16/float32 as on a GPU),
kept tiny for the emulator, and on the GPU where one is usable."""
import numpy as np
import pytest

from gpuk import config, mixed_precision
from gpuk.backend import clear_session   # keras.backend (2.3.1) does not re-export it

POLICIES = ('mixed_bfloat16', 'mixed_float16')
# 'cuda' runs where a GPU is usable, and in the GPU rehearsal (CuPy and cuBLAS stand-ins)
DEVICES = ('cpu', 'emulate', pytest.param('cuda', marks=pytest.mark.gpu))
HALF_NAMES = {'mixed_bfloat16': 'bfloat16', 'mixed_float16': 'float16'}


@pytest.fixture(autouse=True)
def _restore_precision(on):
    saved = config.precision()
    yield
    config.set_precision(saved)
    clear_session()


def _is_tensor_core_step(name):
    """Named independently of mixed_precision's table: every convolution and product."""
    base = name.split('/')[-1]
    return 'Conv' in base or base == 'MatMul'


def _check_plan(function, policy):
    """Every conv / matmul step of the compiled function (rnn step plans included) runs in
    the policy's half dtype, every other step in float32 (or an integer / bool type)."""
    steps = mixed_precision.step_dtypes(function)
    half = HALF_NAMES[policy]
    tensor_core = [(name, dtype) for name, dtype in steps if _is_tensor_core_step(name)]
    assert tensor_core and all(dtype == half for _, dtype in tensor_core), tensor_core
    others = [(name, dtype) for name, dtype in steps if not _is_tensor_core_step(name)]
    assert all(dtype not in ('bfloat16', 'float16', 'float64') for _, dtype in others), others
    return [name for name, _ in tensor_core]


def _check_float32_variables(model):
    for weight in model.weights + model.optimizer.weights:
        assert weight.dtype == 'float32' or weight.dtype.startswith('int'), weight.name
        if weight.dtype == 'float32':
            assert weight.value.dtype == np.float32, weight.name


def _cnn(keras):
    layers = keras.layers
    return keras.models.Sequential([
        layers.Conv2D(6, 3, padding='same', input_shape=(8, 8, 2)), layers.BatchNormalization(),
        layers.Activation('relu'), layers.MaxPooling2D(), layers.DepthwiseConv2D(3, activation='relu'),
        layers.Flatten(), layers.Dense(3, activation='softmax')])


def _cnn_data(n=32):
    rng = np.random.RandomState(0)
    x = rng.rand(n, 8, 8, 2).astype('float32')
    labels = (x[:, :4].mean(axis=(1, 2, 3)) > x[:, 4:].mean(axis=(1, 2, 3))).astype(int)
    labels += (x[..., 0].mean(axis=(1, 2)) > 0.5).astype(int)
    return x, np.eye(3, dtype='float32')[labels]


@pytest.mark.parametrize('kind', DEVICES)
@pytest.mark.parametrize('policy', POLICIES)
def test_batchnorm_cnn_trains_with_float32_variables(keras, on, kind, policy):
    on(kind)
    config.set_precision(policy)
    x, y = _cnn_data()
    model = _cnn(keras)
    model.compile(keras.optimizers.Adam(lr=0.02), 'categorical_crossentropy')
    losses = model.fit(x, y, epochs=6, batch_size=16, shuffle=False, verbose=0).history['loss']
    assert losses[-1] < 0.6 * losses[0], losses    # float32: 1.29 -> 0.66
    _check_float32_variables(model)
    prediction = model.predict(x[:4])
    assert prediction.dtype == np.float32 and np.allclose(prediction.sum(axis=1), 1, atol=1e-5)
    names = _check_plan(model.train_function, policy)
    # forward, data and filter gradients of the conv (its bias and relu fused or not), the
    # depthwise conv and the dense layer (the first conv needs no data gradient)
    assert {'ConvWgrad', 'ConvDgrad', 'MatMul'} <= set(names)
    assert any(name in ('ConvFwd', 'ConvBiasAct') for name in names)
    assert len(names) >= 7, names


def _ocr(keras, kind):
    from gpuk.demo.data import RenderSpec, make_dataset
    from gpuk.demo.model import build_models, time_steps
    from gpuk.demo.settings import ModelSpec
    from gpuk.demo.train import model_inputs
    render = RenderSpec(height=8, width=24, min_len=2, max_len=3, max_gap=1, max_jitter=0)
    data = make_dataset(64 if kind == 'cpu' else 32, 4, render)
    np.random.seed(3)
    spec = ModelSpec(conv_filters=(4, 6), dense_units=12, rnn_units=8, learning_rate=0.01)
    training, prediction = build_models(render.height, render.width, render.max_len, spec)
    inputs = model_inputs(data, time_steps(render.width))
    return training, prediction, inputs, np.zeros(len(data), np.float32)


@pytest.mark.filterwarnings('ignore:invalid value encountered:RuntimeWarning')   # skipped float16 steps
@pytest.mark.parametrize('kind', DEVICES)
@pytest.mark.parametrize('policy', POLICIES)
def test_the_demos_ctc_model_trains(keras, on, kind, policy):
    on(kind)
    config.set_precision(policy)
    training, prediction, inputs, targets = _ocr(keras, kind)
    before = training.evaluate(inputs, targets, verbose=0)
    # 12 (emulated) or 16 steps; under float16 the first few overflow at the initial scale
    # 2^16 and are skipped, as with torch's GradScaler
    epochs, batch_size = (4, 16) if kind == 'cpu' else (3, 8)
    training.fit(inputs, targets, epochs=epochs, batch_size=batch_size, shuffle=False, verbose=0)
    after = training.evaluate(inputs, targets, verbose=0)
    assert np.isfinite(after) and after < 0.8 * before, (before, after)
    _check_float32_variables(training)
    assert prediction.predict(inputs[0][:2]).dtype == np.float32
    names = _check_plan(training.train_function, policy)
    assert any(name.startswith('Scan') and name.endswith('MatMul') for name in names), names


@pytest.mark.filterwarnings('ignore:invalid value encountered:RuntimeWarning')   # the injected inf
def test_a_float16_step_with_an_infinite_gradient_changes_no_variable(keras):
    """The whole step is skipped (weights, Adam's moments and iterations, the batch norm's
    moving averages) and the scale halves; the next finite step applies, and the scale
    grows after growth_interval finite steps."""
    config.set_precision('mixed_float16')
    x, y = _cnn_data(16)
    model = _cnn(keras)
    model.compile(keras.optimizers.Adam(lr=0.01), 'categorical_crossentropy')
    model.train_on_batch(x, y)          # builds the step; at 2^16 it may overflow and back off
    guard = model.train_function._guard
    assert guard is not None and len(guard.scalers) == 1
    scaler = guard.scalers[0]
    state = [w for w in model.weights + model.optimizer.weights]
    assert any('iterations' in w.name for w in state) and any('moving_mean' in w.name for w in state)
    before = [np.array(w.value, copy=True) for w in state]
    scale = scaler.scale

    poisoned = x.copy()
    poisoned[0, 0, 0, 0] = np.inf
    model.train_on_batch(poisoned, y)
    assert scaler.scale == scale / 2
    for weight, old in zip(state, before):
        np.testing.assert_array_equal(weight.value, old, err_msg=weight.name)

    scaler.growth_interval = 2
    model.train_on_batch(x, y)
    model.train_on_batch(x, y)
    assert scaler.scale == scale     # two finite steps in a row: grown back
    iterations = [w for w in state if 'iterations' in w.name][0]
    assert iterations.value == before[state.index(iterations)] + 2


def test_bfloat16_needs_no_loss_scaling(keras):
    config.set_precision('mixed_bfloat16')
    x, y = _cnn_data(16)
    model = _cnn(keras)
    model.compile('sgd', 'categorical_crossentropy')
    model.train_on_batch(x, y)
    assert model.train_function._guard is None
