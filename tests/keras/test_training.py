"""Keras 2.3.1's optimizers, callbacks, saving and generator training on gpuk."""
import csv
import io

import numpy as np
import pytest


def _regression_data(n=128, seed=0):
    rng = np.random.RandomState(seed)
    x = rng.randn(n, 6).astype('float32')
    y = x @ rng.randn(6, 2).astype('float32') + 0.5
    return x, y


def _model(keras, dropout=False):
    layers = keras.layers
    stack = [layers.Dense(12, activation='tanh', input_shape=(6,))]
    stack += [layers.Dropout(0.1)] if dropout else []
    stack += [layers.BatchNormalization(momentum=0.8), layers.Dense(2)]
    return keras.models.Sequential(stack)


OPTIMIZERS = [
    ('SGD', dict(lr=0.05, momentum=0.9)),
    ('SGD', dict(lr=0.05, momentum=0.9, nesterov=True)),
    ('SGD', dict(lr=0.05, clipnorm=0.5)),
    ('SGD', dict(lr=0.05, clipvalue=0.05)),
    ('RMSprop', dict(lr=0.01)),
    ('Adagrad', dict(lr=0.1)),
    ('Adadelta', dict(lr=1.0)),
    ('Adam', dict(lr=0.01)),
    ('Adam', dict(lr=0.01, amsgrad=True)),
    ('Adamax', dict(lr=0.02)),
    ('Nadam', dict(lr=0.01)),
]


@pytest.mark.parametrize('name,kwargs', OPTIMIZERS,
                         ids=['%s-%s' % (n, '-'.join(sorted(k))) for n, k in OPTIMIZERS])
def test_every_optimizer_reduces_the_loss(keras, name, kwargs):
    x, y = _regression_data()
    model = _model(keras)
    model.compile(getattr(keras.optimizers, name)(**kwargs), 'mse')
    before = model.evaluate(x, y, verbose=0)
    history = model.fit(x, y, epochs=12, batch_size=16, verbose=0)
    assert history.history['loss'][-1] < 0.6 * history.history['loss'][0]
    assert model.evaluate(x, y, verbose=0) < 0.6 * before


def test_clipvalue_bounds_every_step(keras):
    """One SGD step with clipvalue moves no weight by more than lr * clipvalue."""
    x, y = _regression_data()
    model = keras.models.Sequential([keras.layers.Dense(2, input_shape=(6,))])
    model.compile(keras.optimizers.SGD(lr=0.1, clipvalue=0.01), 'mse')
    before = model.get_weights()
    model.train_on_batch(x, 100 * y)
    steps = [np.abs(a - b).max() for a, b in zip(model.get_weights(), before)]
    assert max(steps) == pytest.approx(0.1 * 0.01, rel=1e-5)


def test_sgd_step_matches_numpy(keras):
    """A Dense + MSE step computed by hand in float64, within float32 precision."""
    x, y = _regression_data(n=16)
    model = keras.models.Sequential([keras.layers.Dense(2, input_shape=(6,))])
    model.compile(keras.optimizers.SGD(lr=0.1), 'mse')
    w, b = [v.astype('float64') for v in model.get_weights()]
    loss = model.train_on_batch(x, y)
    error = x.astype('float64') @ w + b - y
    np.testing.assert_allclose(loss, np.mean(error ** 2), rtol=1e-5)
    grad_out = 2 * error / error.size
    w_new, b_new = model.get_weights()
    np.testing.assert_allclose(w_new, w - 0.1 * x.T.astype('float64') @ grad_out, rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(b_new, b - 0.1 * grad_out.sum(axis=0), rtol=1e-5, atol=1e-6)


def test_callbacks_run(keras, tmp_h5):
    cb = keras.callbacks
    x, y = _regression_data()
    model = _model(keras)
    model.compile(keras.optimizers.SGD(lr=0.02), 'mse')
    seen_lrs = []
    callbacks = [
        cb.ModelCheckpoint(tmp_h5('best.h5'), monitor='val_loss', save_best_only=True),
        cb.EarlyStopping(monitor='loss', min_delta=10.0, patience=2),  # stops after 3 epochs
        cb.ReduceLROnPlateau(monitor='loss', factor=0.5, patience=0, min_delta=10.0),
        cb.CSVLogger(tmp_h5('log.csv')),
        cb.LearningRateScheduler(lambda epoch, lr: seen_lrs.append(float(lr)) or lr),
    ]
    history = model.fit(x, y, epochs=10, batch_size=32, validation_split=0.25, verbose=0,
                        callbacks=callbacks)
    assert len(history.epoch) == 3  # EarlyStopping
    assert seen_lrs == pytest.approx([0.02, 0.02, 0.01])  # ReduceLROnPlateau, end of epoch 1
    rows = list(csv.DictReader(open(tmp_h5('log.csv'))))
    assert [int(r['epoch']) for r in rows] == [0, 1, 2]
    np.testing.assert_allclose([float(r['loss']) for r in rows], history.history['loss'], rtol=1e-5)
    best = keras.models.load_model(tmp_h5('best.h5'))
    assert best.evaluate(x[96:], y[96:], verbose=0) == pytest.approx(min(history.history['val_loss']),
                                                                      rel=1e-5)


def _trained(keras, dropout=True):
    x, y = _regression_data()
    model = _model(keras, dropout=dropout)
    model.compile(keras.optimizers.Adam(0.01), 'mse', metrics=['mae'])
    model.fit(x, y, epochs=2, batch_size=32, verbose=0)
    return model, x, y


def test_save_model_load_model_round_trip(keras, tmp_h5):
    model, x, y = _trained(keras, dropout=False)  # no dropout: the next steps must agree
    model.save(tmp_h5('model.h5'))
    loaded = keras.models.load_model(tmp_h5('model.h5'))
    for a, b in zip(model.get_weights(), loaded.get_weights()):
        assert a.dtype == b.dtype and np.array_equal(a, b)
    for a, b in zip(keras.backend.batch_get_value(model.optimizer.weights),
                    keras.backend.batch_get_value(loaded.optimizer.weights)):
        assert np.array_equal(a, b)
    np.testing.assert_array_equal(loaded.predict(x), model.predict(x))
    # training goes on from the same optimizer state (fit leaves the last epoch's metric
    # totals in place; the loaded model starts from zero)
    model.reset_metrics()
    np.testing.assert_allclose(loaded.train_on_batch(x, y), model.train_on_batch(x, y), rtol=1e-6)


def test_save_model_to_a_file_like_object(keras):
    model, x, _ = _trained(keras)
    stream = io.BytesIO()
    keras.models.save_model(model, stream)
    stream.seek(0)
    loaded = keras.models.load_model(stream)
    np.testing.assert_array_equal(loaded.predict(x), model.predict(x))


@pytest.mark.parametrize('by_name', [False, True])
def test_save_weights_load_weights_round_trip(keras, tmp_h5, by_name):
    model, x, _ = _trained(keras)
    model.save_weights(tmp_h5('weights.h5'))
    fresh = _model(keras, dropout=True)
    if by_name:  # layer names differ in a fresh model: rename to match
        for a, b in zip(fresh.layers, model.layers):
            a.name = b.name
    fresh.load_weights(tmp_h5('weights.h5'), by_name=by_name)
    for a, b in zip(model.get_weights(), fresh.get_weights()):
        assert np.array_equal(a, b)
    np.testing.assert_array_equal(fresh.predict(x), model.predict(x))


def test_bidirectional_weights_round_trip(keras, tmp_h5):
    layers = keras.layers

    def build():
        inputs = layers.Input((None, 3))
        h = layers.Bidirectional(layers.LSTM(4, return_sequences=True))(inputs)
        return keras.models.Model(inputs, layers.Bidirectional(layers.GRU(3))(h))
    model = build()
    model.save_weights(tmp_h5('bidi.h5'))
    other = build()
    other.load_weights(tmp_h5('bidi.h5'))
    x = np.random.rand(2, 5, 3).astype('float32')
    np.testing.assert_array_equal(other.predict(x), model.predict(x))


def test_fit_generator_and_predict_generator(keras):
    x, y = _regression_data()
    model = _model(keras)
    model.compile(keras.optimizers.Adam(0.01), 'mse')

    def batches():
        while True:
            for start in range(0, len(x), 32):
                yield x[start:start + 32], y[start:start + 32]
    history = model.fit_generator(batches(), steps_per_epoch=4, epochs=6, verbose=0)
    assert history.history['loss'][-1] < 0.6 * history.history['loss'][0]
    predicted = model.predict_generator((x[s:s + 32] for s in range(0, len(x), 32)), steps=4)
    np.testing.assert_allclose(predicted, model.predict(x), rtol=1e-5, atol=1e-6)
    # Keras 2.3.1 reports the last batch's loss here (training_generator.py:420)
    assert model.evaluate_generator(batches(), steps=4) == pytest.approx(
        float(model.test_on_batch(x[96:], y[96:])), rel=1e-5)
