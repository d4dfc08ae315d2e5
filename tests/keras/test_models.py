"""Real Keras 2.3.1 models train on gpuk: the loss falls and learnable synthetic tasks reach
a stated accuracy. Data are tiny and seeded (conftest seeds NumPy before each test)."""
import numpy as np
import pytest

# Every test here runs on each implementation (tests/conftest.py: on_device), the CUDA kernels included.
pytestmark = pytest.mark.usefixtures('on_device')


def _separable_task(n=256, d=8, seed=0):
    rng = np.random.RandomState(seed)
    x = rng.randn(n, d).astype('float32')
    y = (x[:, 0] + x[:, 1] - x[:, 2] > 0).astype('float32')
    return x, y


def _falls(history, key='loss', factor=0.8):
    values = history.history[key]
    return values[-1] < factor * values[0]


def test_sequential_mlp_with_dropout_and_batchnorm(keras):
    layers = keras.layers
    x, y = _separable_task()
    model = keras.models.Sequential([
        layers.Dense(16, activation='relu', input_shape=(8,)), layers.Dropout(0.2),
        layers.BatchNormalization(), layers.Dense(1, activation='sigmoid')])
    model.compile(keras.optimizers.Adam(0.01), 'binary_crossentropy', metrics=['accuracy'])
    history = model.fit(x, y, epochs=15, batch_size=32, verbose=0)
    assert _falls(history, factor=0.5)
    loss, accuracy = model.evaluate(x, y, verbose=0)
    assert accuracy >= 0.93
    # the accuracy metric Keras reports matches the predictions
    np.testing.assert_allclose(accuracy, np.mean((model.predict(x)[:, 0] > 0.5) == y), atol=1e-6)


def _bright_half_task(n, data_format, seed=0):
    """Class 1 when the left half of the image is brighter than the right half."""
    rng = np.random.RandomState(seed)
    x = rng.rand(n, 8, 8, 2).astype('float32')
    y = (x[:, :, :4].mean(axis=(1, 2, 3)) > x[:, :, 4:].mean(axis=(1, 2, 3))).astype('float32')
    x[:, :, :4] += (y[:, None, None, None] - 0.5) * 0.3  # widen the margin
    if data_format == 'channels_first':
        x = x.transpose(0, 3, 1, 2)
    return x, y


@pytest.mark.parametrize('data_format', ['channels_last', 'channels_first'])
def test_cnn_in_both_data_formats(keras, data_format):
    layers = keras.layers
    keras.backend.set_image_data_format(data_format)
    channel_axis = 1 if data_format == 'channels_first' else -1
    x, y = _bright_half_task(128, data_format)
    model = keras.models.Sequential([
        layers.Conv2D(6, 3, padding='same', activation='relu', input_shape=x.shape[1:]),
        # a short run: momentum 0.8 lets the moving statistics that inference uses settle
        layers.BatchNormalization(axis=channel_axis, momentum=0.8),
        layers.SeparableConv2D(6, 3, padding='same', activation='relu'),
        layers.DepthwiseConv2D(3, padding='same'),
        layers.MaxPooling2D(),
        layers.AveragePooling2D(),
        layers.GlobalAveragePooling2D(),
        layers.Dense(1, activation='sigmoid')])
    assert model.layers[0].data_format == data_format
    model.compile(keras.optimizers.Adam(0.02), 'binary_crossentropy', metrics=['accuracy'])
    history = model.fit(x, y, epochs=12, batch_size=16, verbose=0)
    assert _falls(history, factor=0.7)
    assert model.evaluate(x, y, verbose=0)[1] >= 0.85


def _first_token_task(n=128, steps=7, seed=0):
    """Label: first token > 5; sequences end in zero padding of random length."""
    rng = np.random.RandomState(seed)
    x = rng.randint(1, 10, size=(n, steps))
    lengths = rng.randint(2, steps + 1, size=n)
    x[np.arange(steps)[None, :] >= lengths[:, None]] = 0
    return x, (x[:, 0] > 5).astype('float32')


@pytest.mark.parametrize('cell', ['LSTM', 'GRU', 'SimpleRNN'])
def test_embedding_recurrent_with_masking(keras, cell):
    layers = keras.layers
    x, y = _first_token_task()
    inputs = layers.Input((None,))
    h = layers.Embedding(10, 8, mask_zero=True)(inputs)
    h = getattr(layers, cell)(8, go_backwards=True)(h)  # reads the first token last
    model = keras.models.Model(inputs, layers.Dense(1, activation='sigmoid')(h))
    model.compile(keras.optimizers.Adam(0.02), 'binary_crossentropy', metrics=['accuracy'])
    history = model.fit(x, y, epochs=10, batch_size=16, verbose=0)
    assert _falls(history, factor=0.5)
    assert model.evaluate(x, y, verbose=0)[1] >= 0.95
    # masking: padding after the last token changes nothing
    padded = np.concatenate([x, np.zeros((len(x), 3), x.dtype)], axis=1)
    np.testing.assert_allclose(model.predict(padded), model.predict(x), rtol=1e-5, atol=1e-6)


def test_bidirectional_on_unknown_length_input(keras):
    layers = keras.layers
    rng = np.random.RandomState(1)
    x = rng.randn(96, 6, 3).astype('float32')
    y = (x[:, :, 0].sum(axis=1) > 0).astype('float32')
    inputs = layers.Input((None, 3))
    h = layers.Masking()(inputs)
    h = layers.Bidirectional(layers.LSTM(6, return_sequences=True), merge_mode='concat')(h)
    h = layers.Bidirectional(layers.GRU(4), merge_mode='sum')(h)
    model = keras.models.Model(inputs, layers.Dense(1, activation='sigmoid')(h))
    model.compile(keras.optimizers.Adam(0.02), 'binary_crossentropy', metrics=['accuracy'])
    history = model.fit(x, y, epochs=10, batch_size=16, verbose=0)
    assert _falls(history, factor=0.5)
    assert model.evaluate(x, y, verbose=0)[1] >= 0.9
    # the same weights take other sequence lengths
    assert model.predict(rng.randn(2, 11, 3).astype('float32')).shape == (2, 1)


def test_conv1d_conv3d_transpose_upsampling_padding_cropping(keras):
    layers = keras.layers
    rng = np.random.RandomState(2)
    a = layers.Input((10, 3))
    h1 = layers.Conv1D(4, 3, activation='relu')(a)
    h1 = layers.Cropping1D(1)(layers.ZeroPadding1D(1)(layers.UpSampling1D(2)(h1)))
    h1 = layers.GlobalMaxPooling1D()(h1)
    b = layers.Input((4, 4, 4, 2))
    h2 = layers.Conv3D(3, 2, activation='relu')(b)
    h2 = layers.Cropping3D(1)(layers.ZeroPadding3D(1)(layers.UpSampling3D(2)(h2)))
    h2 = layers.GlobalAveragePooling3D()(h2)
    c = layers.Input((5, 5, 2))
    h3 = layers.Conv2DTranspose(3, 3, strides=2, activation='relu')(c)
    h3 = layers.Cropping2D(2)(layers.ZeroPadding2D(1)(layers.UpSampling2D()(h3)))
    assert keras.backend.int_shape(h3) == (None, 20, 20, 3)
    h3 = layers.Flatten()(h3)
    model = keras.models.Model([a, b, c], layers.Dense(1)(layers.concatenate([h1, h2, h3])))
    model.compile(keras.optimizers.Adam(0.01), 'mse')
    xs = [rng.rand(32, 10, 3), rng.rand(32, 4, 4, 4, 2), rng.rand(32, 5, 5, 2)]
    target = xs[0].mean(axis=(1, 2))[:, None] + xs[2].mean(axis=(1, 2, 3))[:, None]
    history = model.fit(xs, target, epochs=10, batch_size=8, verbose=0)
    assert _falls(history, factor=0.3)


def test_functional_multi_input_multi_output(keras):
    layers = keras.layers
    rng = np.random.RandomState(3)
    left, right = rng.randn(160, 4).astype('float32'), rng.randn(160, 3).astype('float32')
    cls = (left[:, 0] > right[:, 0]).astype('int64')
    reg = (left.sum(axis=1) - right.sum(axis=1))[:, None]
    a, b = layers.Input((4,), name='left'), layers.Input((3,), name='right')
    shared = layers.Dense(16, activation='tanh')(layers.concatenate([a, b]))
    out_cls = layers.Dense(2, activation='softmax', name='cls')(shared)
    out_reg = layers.Dense(1, name='reg')(shared)
    model = keras.models.Model([a, b], [out_cls, out_reg])
    model.compile(keras.optimizers.Adam(0.02),
                  loss={'cls': 'sparse_categorical_crossentropy', 'reg': 'mse'},
                  loss_weights={'cls': 1.0, 'reg': 0.5}, metrics={'cls': 'accuracy'})
    history = model.fit({'left': left, 'right': right}, {'cls': cls, 'reg': reg},
                        epochs=20, batch_size=16, verbose=0)
    assert _falls(history, factor=0.3)
    np.testing.assert_allclose(history.history['loss'][-1], history.history['cls_loss'][-1]
                               + 0.5 * history.history['reg_loss'][-1], rtol=1e-4)
    results = dict(zip(model.metrics_names, model.evaluate([left, right], [cls, reg], verbose=0)))
    assert results['cls_accuracy'] >= 0.9 and results['reg_loss'] < 0.2 * np.var(reg)


def test_ctc_model_trains_and_decodes(keras):
    """Conv + recurrent + softmax; CTC loss through K.ctc_batch_cost in a Lambda; greedy
    K.ctc_decode recovers the label sequences."""
    layers, K = keras.layers, keras.backend
    steps, symbols, label_len, n = 12, 4, 3, 64
    rng = np.random.RandomState(4)
    labels = rng.randint(0, symbols, size=(n, label_len))
    x = 0.1 * rng.rand(n, steps, symbols + 1).astype('float32')
    for k in range(label_len):  # symbol k shown at steps 1+4k and 2+4k, blank-ish elsewhere
        x[np.arange(n), 1 + 4 * k, labels[:, k]] = 1
        x[np.arange(n), 2 + 4 * k, labels[:, k]] = 1
    x[:, [0, 3, 4, 7, 8, 11], symbols] = 1

    inputs = layers.Input((steps, symbols + 1), name='x')
    h = layers.Conv1D(16, 3, padding='same', activation='relu')(inputs)
    h = layers.Bidirectional(layers.GRU(16, return_sequences=True))(h)
    probs = layers.Dense(symbols + 1, activation='softmax')(h)
    label_in = layers.Input((label_len,), name='labels')
    input_len = layers.Input((1,), dtype='int64', name='input_length')
    label_len_in = layers.Input((1,), dtype='int64', name='label_length')
    ctc = layers.Lambda(lambda args: K.ctc_batch_cost(*args), output_shape=(1,))(
        [label_in, probs, input_len, label_len_in])
    model = keras.models.Model([inputs, label_in, input_len, label_len_in], ctc)
    model.compile(keras.optimizers.Adam(0.02), loss=lambda y_true, y_pred: y_pred)
    feeds = [x, labels, np.full((n, 1), steps), np.full((n, 1), label_len)]
    history = model.fit(feeds, np.zeros(n), epochs=25, batch_size=16, verbose=0)
    assert _falls(history, factor=0.2)

    predicted = keras.models.Model(inputs, probs).predict(x)
    decoded, log_prob = K.ctc_decode(predicted, np.full(n, steps), greedy=True)
    decoded = K.eval(decoded[0])
    assert decoded.shape[0] == n
    exact = np.mean([np.array_equal(decoded[i][decoded[i] >= 0], labels[i]) for i in range(n)])
    assert exact >= 0.9
