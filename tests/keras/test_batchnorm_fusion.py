"""Keras BatchNormalization + ReLU trains the same with the plan's batch-norm fusions
(BN -> relu epilogue, moving averages in the training forward, and with a fixed learning
phase the relu gradient in the batch norm's backward) as without them."""
import numpy as np
import pytest


def _train(keras, monkeypatch, fusion, activation_layer, data_format, fixed_phase=None):
    monkeypatch.setenv('GPUK_FUSION', '1' if fusion else '0')
    keras.backend.set_floatx('float64')   # the fixture restores floatx
    if fixed_phase is not None:
        keras.backend.set_learning_phase(fixed_phase)   # the fixture's clear_session forgets it
    np.random.seed(7)
    layers = keras.layers
    shape = (6, 6, 3) if data_format == 'channels_last' else (3, 6, 6)
    model = keras.models.Sequential([
        layers.Conv2D(4, 3, use_bias=False, data_format=data_format, input_shape=shape),
        layers.BatchNormalization(axis=-1 if data_format == 'channels_last' else 1, momentum=0.9),
        activation_layer(),
        layers.Flatten(),
        layers.Dense(2)])
    model.compile(keras.optimizers.SGD(0.05), 'mse')
    rng = np.random.default_rng(3)
    x, y = rng.standard_normal((8,) + shape), rng.standard_normal((8, 2))
    losses = [model.train_on_batch(x, y) for _ in range(3)]
    bn = model.layers[1]
    # a fused elementwise step (gpuk/fusion_elementwise.py) counts as the ops it runs
    step_ops = [member for forward, _, _, _ in model.train_function._plan.steps
                for member in ([m for m, _ in forward.__self__.members] if hasattr(forward.__self__, 'members')
                               else [forward.__self__])]
    ops = [type(op).__name__ + ':' + getattr(op, 'activation', '')
           + (':moving' if getattr(op, 'moving', None) is not None else '') for op in step_ops]
    return losses, [keras.backend.get_value(w) for w in bn.weights], model.predict(x), ops


@pytest.mark.parametrize('data_format', ['channels_last', 'channels_first'])
@pytest.mark.parametrize('activation', ['Activation', 'ReLU'])
def test_batchnorm_relu_trains_like_unfused(keras, monkeypatch, data_format, activation):
    layer = (lambda: keras.layers.Activation('relu')) if activation == 'Activation' else keras.layers.ReLU
    losses, weights, predictions, ops = _train(keras, monkeypatch, True, layer, data_format)
    plain_losses, plain_weights, plain_predictions, plain_ops = _train(keras, monkeypatch, False, layer, data_format)
    assert 'BnTrain:relu:moving' in ops and 'BnInfer:relu' in ops and 'Relu:' not in ops
    # the switch's gradient gives the relu's gradient two readers: that backward stays unfused
    assert 'BnGrad:linear' in ops and 'ReluGrad:' in ops
    assert 'BnTrain:linear' in plain_ops and 'Relu:' in plain_ops
    assert losses[-1] < losses[0]
    np.testing.assert_allclose(losses, plain_losses, rtol=1e-12)
    # gamma, beta, moving_mean, moving_variance
    for got, want in zip(weights, plain_weights):
        np.testing.assert_allclose(got, want, rtol=1e-12, atol=1e-14)
    assert not np.allclose(weights[2], 0) and not np.allclose(weights[3], 1)
    np.testing.assert_allclose(predictions, plain_predictions, rtol=1e-12, atol=1e-14)


@pytest.mark.parametrize('data_format', ['channels_last', 'channels_first'])
def test_fixed_training_phase_fuses_the_relu_gradient_into_the_backward(keras, monkeypatch, data_format):
    """With K.set_learning_phase(1), Keras 2.3.1's in_train_phase returns the training branch
    itself (no switch), so the relu's gradient has the BnGrad as its one reader."""
    losses, weights, predictions, ops = _train(keras, monkeypatch, True, keras.layers.ReLU, data_format, 1)
    plain_losses, plain_weights, plain_predictions, plain_ops = _train(keras, monkeypatch, False, keras.layers.ReLU,
                                                                       data_format, 1)
    assert 'BnTrain:relu:moving' in ops and 'BnGrad:relu' in ops
    assert not any(op.split(':')[0] in ('Relu', 'ReluGrad', 'BnInfer', 'Where') for op in ops)
    assert 'ReluGrad:' in plain_ops and 'BnGrad:linear' in plain_ops
    assert losses[-1] < losses[0]
    np.testing.assert_allclose(losses, plain_losses, rtol=1e-12)
    for got, want in zip(weights, plain_weights):
        np.testing.assert_allclose(got, want, rtol=1e-12, atol=1e-14)
    np.testing.assert_allclose(predictions, plain_predictions, rtol=1e-12, atol=1e-14)
