"""The Keras models of the training-step benchmarks, written once for Keras 2.3.1 and Keras 3.

    net = keras_models.build(keras, 'bn_cnn'); x, y = keras_models.data('bn_cnn', batch=8)

Each model is a Sequential stack that ends in a 10-way softmax, trained with Adam(1e-3) on
categorical cross-entropy. The builders take the ``keras`` module and use only what both
Keras versions have (Sequential, these layers, ``input_shape`` on the first layer, Adam, a
loss by name), so bench/bench_keras.py, bench/host_overhead.py and bench/rnn_cpu.py (Keras
2.3.1 on gpuk) and bench/keras3_jax.py (Keras 3 on JAX, in a process of its own) train the
same networks. PARAMS is each model's parameter count (trainable and not), which both
versions report alike for the same network: tests/bench/test_keras_models.py checks it on
Keras 2.3.1 and bench/keras3_jax.py on Keras 3 before timing.

- mlp: Dense 784-256-256-10 (relu, softmax);
- cnn: Conv2D(16, 3) + MaxPool + Conv2D(32, 3) + MaxPool + Dense(10) on 28x28x1;
- bn_cnn: Conv2D(8, 3, no bias) + BatchNormalization + relu + MaxPool, then 16 filters the
  same, Dense(10), on 16x16x1;
- lstm, gru: LSTM(128) or GRU(128) over 50 steps of 32 features, Dense(10) on the last state.
"""
import numpy as np

CLASSES = 10
RNN_STEPS, RNN_FEATURES, RNN_UNITS = 50, 32, 128


def _mlp(layers, input_shape):
    return [layers.Dense(256, activation='relu', input_shape=input_shape), layers.Dense(256, activation='relu'),
            layers.Dense(CLASSES, activation='softmax')]


def _cnn(layers, input_shape):
    return [layers.Conv2D(16, 3, activation='relu', input_shape=input_shape), layers.MaxPooling2D(),
            layers.Conv2D(32, 3, activation='relu'), layers.MaxPooling2D(), layers.Flatten(),
            layers.Dense(CLASSES, activation='softmax')]


def _bn_cnn(layers, input_shape):
    return [layers.Conv2D(8, 3, use_bias=False, input_shape=input_shape), layers.BatchNormalization(),
            layers.Activation('relu'), layers.MaxPooling2D(),
            layers.Conv2D(16, 3, use_bias=False), layers.BatchNormalization(), layers.Activation('relu'),
            layers.MaxPooling2D(), layers.Flatten(), layers.Dense(CLASSES, activation='softmax')]


def _rnn(cell):
    def stack(layers, input_shape):
        return [getattr(layers, cell)(RNN_UNITS, input_shape=input_shape),
                layers.Dense(CLASSES, activation='softmax')]
    return stack


# name -> (input shape of one sample, the layers)
MODELS = {
    'mlp': ((784,), _mlp),
    'cnn': ((28, 28, 1), _cnn),
    'bn_cnn': ((16, 16, 1), _bn_cnn),
    'lstm': ((RNN_STEPS, RNN_FEATURES), _rnn('LSTM')),
    'gru': ((RNN_STEPS, RNN_FEATURES), _rnn('GRU')),
}
# Keras 3's GRU has reset_after=True (two bias rows) where 2.3.1's default is False: not the same
# network, so the GRU is left out of the comparison between the two.
PARAMS = {'mlp': 269322, 'cnn': 12810, 'bn_cnn': 1970, 'lstm': 83722}
# The models of the training-step benchmark (bench_keras.py, keras3_jax.py), and their batch.
BATCH = {'mlp': 128, 'cnn': 64, 'bn_cnn': 64, 'lstm': 32}


def input_shape(name):
    return MODELS[name][0]


def build(keras, name):
    """Model ``name`` built and compiled with ``keras`` (2.3.1 or 3)."""
    shape, layers_of = MODELS[name]
    net = keras.models.Sequential(layers_of(keras.layers, shape))
    net.compile(keras.optimizers.Adam(1e-3), 'categorical_crossentropy')
    return net


def data(name, batch, seed=0):
    """(x, y) of one batch: standard normal float32 inputs, one-hot float32 targets."""
    rng = np.random.default_rng(seed)
    x = rng.standard_normal((batch,) + input_shape(name)).astype(np.float32)
    y = np.eye(CLASSES, dtype=np.float32)[rng.integers(0, CLASSES, batch)]
    return x, y
