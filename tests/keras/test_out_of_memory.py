"""Keras 2.3.1's training loop on gpuk when a batch does not fit: train_on_batch raises
gpuk.OutOfMemoryError (a MemoryError), no weight nor optimizer state moves, and the next,
smaller batch trains as if the failed one had never been tried (tests/test_out_of_memory.py
covers the mechanism)."""
import numpy as np
import pytest

import gpuk


def _model(keras):
    layers = keras.layers
    model = keras.models.Sequential([layers.Conv2D(4, 3, activation='relu', input_shape=(6, 6, 2)),
                                     layers.Flatten(), layers.Dense(3, activation='softmax')])
    model.compile(keras.optimizers.Adam(lr=0.01), 'categorical_crossentropy')
    return model


def _state(model):
    return [w.copy() for w in model.get_weights() + model.optimizer.get_weights()]


def test_train_on_batch_out_of_memory_changes_nothing_and_a_smaller_batch_trains(keras, conv_runs_out_of_memory_past):
    rng = np.random.default_rng(0)
    x = rng.standard_normal((64, 6, 6, 2)).astype(np.float32)
    y = np.eye(3, dtype=np.float32)[rng.integers(0, 3, 64)]
    model, twin = _model(keras), _model(keras)
    model.train_on_batch(x[:8], y[:8])        # the optimizer's state exists
    twin.train_on_batch(x[:8], y[:8])
    twin.set_weights(model.get_weights())
    twin.optimizer.set_weights(model.optimizer.get_weights())
    before = _state(model)
    conv_runs_out_of_memory_past[0] = 8       # as NumPy fails for an array that does not fit
    # the Conv2D layer's conv2d, bias_add and relu are one fused step, named after its last K call
    with pytest.raises(gpuk.OutOfMemoryError, match=r'^relu: out of host memory .*float32 \(64, 6, 6, 2\)'):
        model.train_on_batch(x, y)
    for got, want in zip(_state(model), before):
        np.testing.assert_array_equal(got, want)
    np.testing.assert_array_equal(model.train_on_batch(x[8:16], y[8:16]), twin.train_on_batch(x[8:16], y[8:16]))
    for got, want in zip(_state(model), _state(twin)):
        np.testing.assert_array_equal(got, want)
