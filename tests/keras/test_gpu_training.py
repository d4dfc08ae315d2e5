"""Keras 2.3.1 trains on the GPU (CuPy arrays, the CUDA kernels) as it does on the NumPy
device: the same model, weights and batches give the same losses and predictions.

Both models start from the weights the NumPy-device model drew (initializers draw on the
device, and CuPy's generator is not NumPy's), and batches are not shuffled."""
import numpy as np
import pytest

from gpuk.backend import clear_session   # keras.backend (2.3.1) does not re-export it

pytestmark = pytest.mark.gpu


@pytest.fixture(autouse=True)
def _fresh_keras_session(on):
    yield
    clear_session()


def _cnn(keras):
    layers = keras.layers
    return keras.models.Sequential([
        layers.Conv2D(8, 3, padding='same', input_shape=(12, 12, 3)), layers.BatchNormalization(),
        layers.Activation('relu'), layers.MaxPooling2D(), layers.DepthwiseConv2D(3, activation='relu'),
        layers.AveragePooling2D(), layers.Flatten(), layers.Dense(4, activation='softmax')])


def _ctc_model(keras):
    layers, K = keras.layers, keras.backend
    frames = layers.Input((20, 6))
    probs = layers.Dense(5, activation='softmax')(frames)
    labels, input_length, label_length = layers.Input((4,)), layers.Input((1,)), layers.Input((1,))
    loss = layers.Lambda(lambda a: K.ctc_batch_cost(*a), output_shape=(1,))([labels, probs, input_length,
                                                                            label_length])
    return keras.models.Model([frames, labels, input_length, label_length], loss)


def _train(keras, build, compile_args, inputs, targets, weights=None):
    """(the model's initial weights, losses of 3 epochs, predictions after training)."""
    model = build(keras)
    if weights is not None:
        model.set_weights(weights)
    initial = model.get_weights()
    model.compile(*compile_args)
    history = model.fit(inputs, targets, epochs=3, batch_size=8, shuffle=False, verbose=0)
    return initial, history.history['loss'], model.predict(inputs, batch_size=8)


def _same_training_on_both_devices(keras, on, build, compile_args, inputs, targets):
    on('cpu')
    weights, cpu_losses, cpu_predictions = _train(keras, build, compile_args, inputs, targets)
    clear_session()
    on('cuda')
    _, gpu_losses, gpu_predictions = _train(keras, build, compile_args, inputs, targets, weights)
    # float32 sums run in other orders on the GPU (and cuDNN may pick other algorithms),
    # and three epochs of Adam carry those roundings along: 1e-3, not float32's 1e-6.
    np.testing.assert_allclose(gpu_losses, cpu_losses, rtol=1e-3)
    np.testing.assert_allclose(gpu_predictions, cpu_predictions, rtol=1e-3, atol=1e-4)


def test_cnn_with_batchnorm_pooling_and_depthwise_trains_the_same_on_the_gpu(keras, on):
    rng = np.random.default_rng(0)
    images = rng.standard_normal((16, 12, 12, 3)).astype(np.float32)
    classes = np.eye(4, dtype=np.float32)[rng.integers(0, 4, 16)]
    _same_training_on_both_devices(keras, on, _cnn, ('adam', 'categorical_crossentropy'), images, classes)


def test_ctc_model_trains_the_same_on_the_gpu(keras, on):
    rng = np.random.default_rng(1)
    inputs = [rng.standard_normal((16, 20, 6)).astype(np.float32),
              rng.integers(0, 4, (16, 4)).astype(np.float32), np.full((16, 1), 20.0, np.float32),
              rng.integers(1, 5, (16, 1)).astype(np.float32)]
    _same_training_on_both_devices(keras, on, _ctc_model, ('adam', lambda y_true, y_pred: y_pred), inputs,
                                   np.zeros((16, 1), np.float32))
