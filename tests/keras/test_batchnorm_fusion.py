"""Keras BatchNormalization + ReLU trains the same with the plan's batch-norm fusions
(BN -> relu epilogue, moving averages in the training forward) as without them."""
import numpy as np
import pytest


def _train(keras, monkeypatch, fusion, activation_layer, data_format):
    monkeypatch.setenv('GPUK_FUSION', '1' if fusion else '0')
    keras.backend.set_floatx('float64')   # the fixture restores floatx
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
    ops = [type(forward.__self__).__name__ + ':' + getattr(forward.__self__, 'activation', '')
           + (':moving' if getattr(forward.__self__, 'moving', None) is not None else '')
           for forward, _, _, _ in model.train_function._plan.steps]
    return losses, [keras.backend.get_value(w) for w in bn.weights], model.predict(x), ops


@pytest.mark.parametrize('data_format', ['channels_last', 'channels_first'])
@pytest.mark.parametrize('activation', ['Activation', 'ReLU'])
def test_batchnorm_relu_trains_like_unfused(keras, monkeypatch, data_format, activation):
    layer = (lambda: keras.layers.Activation('relu')) if activation == 'Activation' else keras.layers.ReLU
    losses, weights, predictions, ops = _train(keras, monkeypatch, True, layer, data_format)
    plain_losses, plain_weights, plain_predictions, plain_ops = _train(keras, monkeypatch, False, layer, data_format)
    assert 'BnTrain:relu:moving' in ops and 'BnInfer:relu' in ops and 'Relu:' not in ops
    assert 'BnTrain:linear' in plain_ops and 'Relu:' in plain_ops
    assert losses[-1] < losses[0]
    np.testing.assert_allclose(losses, plain_losses, rtol=1e-12)
    # gamma, beta, moving_mean, moving_variance
    for got, want in zip(weights, plain_weights):
        np.testing.assert_allclose(got, want, rtol=1e-12, atol=1e-14)
    assert not np.allclose(weights[2], 0) and not np.allclose(weights[3], 1)
    np.testing.assert_allclose(predictions, plain_predictions, rtol=1e-12, atol=1e-14)
