"""Keras 2.3.1 code that broke on gpuk while it runs on TensorFlow (issue 17): each test is
the smallest program that showed one difference."""
import numpy as np


def test_time_distributed_with_a_known_batch_size(keras):
    """Keras's TimeDistributed takes its K.rnn path when the batch size is known; its step
    (wrappers.py:221-225) reads an undefined global when a layer output carries a
    ``_uses_learning_phase`` attribute, which a tf.Tensor does not have by default."""
    layers = keras.layers
    model = keras.models.Sequential([layers.TimeDistributed(layers.Dense(2), batch_input_shape=(1, 3, 4))])
    model.compile('sgd', 'mse')
    x = np.random.rand(1, 3, 4).astype('float32')
    kernel, bias = model.layers[0].get_weights()
    np.testing.assert_allclose(model.predict(x), x @ kernel + bias, atol=1e-5)


def test_time_distributed_conv2d_channels_first(keras):
    layers = keras.layers
    keras.backend.set_image_data_format('channels_first')
    x = np.random.rand(2, 3, 4, 6, 6).astype('float32')
    outputs = []
    for shape in (dict(batch_input_shape=(2, 3, 4, 6, 6)), dict(input_shape=(3, 4, 6, 6))):
        # a known batch size takes Keras's K.rnn path, an unknown one its reshape path
        model = keras.models.Sequential([layers.TimeDistributed(layers.Conv2D(5, (2, 2)), **shape)])
        model.compile('sgd', 'mse')
        if outputs:
            model.set_weights(weights)
        weights = model.get_weights()
        outputs.append(model.predict(x))
        assert model.output_shape[1:] == (3, 5, 5, 5)
        model.train_on_batch(x, np.zeros((2, 3, 5, 5, 5)))
    np.testing.assert_allclose(outputs[0], outputs[1], atol=1e-5)
    assert outputs[0].shape == (2, 3, 5, 5, 5)


def test_variables_set_as_layer_attributes_are_trainable(keras):
    """Keras 2.3.1's Layer.__setattr__ tracks a K.variable as trainable when the variable
    says it is (tf.Variable.trainable); Keras's test_weight_tracking."""
    K, layers = keras.backend, keras.layers

    class MyLayer(layers.Layer):
        def __init__(self):
            super().__init__()
            self.dense = layers.Dense(3)
            self.w1 = K.variable(0, name='w1')

        def build(self, input_shape):
            self.w2 = K.variable(1, name='w2')
            self.w3 = self.add_weight('w3', shape=(), trainable=False, initializer='zeros')

        def call(self, inputs):
            return self.dense(inputs) + self.w1 + self.w2

    layer = MyLayer()
    layer(K.constant(np.random.random((2, 2))))
    assert len(layer.weights) == 5
    assert len(layer.trainable_weights) == 4
    assert len(layer.non_trainable_weights) == 1


def test_h5dict_string_attributes_read_back_as_str(keras, tmp_h5):
    from keras.utils.io_utils import H5Dict
    path = tmp_h5('dict.h5')
    stored = H5Dict(path, mode='w')
    stored['name'] = 'abcd'
    stored.close()
    loaded = H5Dict(path, mode='r')
    value = loaded['name']
    loaded.close()
    assert value == 'abcd' and isinstance(value, str)


def test_load_model_from_an_open_h5py_file(keras, tmp_h5):
    import h5py
    layers = keras.layers
    model = keras.models.Sequential([layers.Dense(2, input_shape=(3,))])
    model.compile('sgd', 'mse')
    path = tmp_h5('model.h5')
    model.save(path)
    x = np.random.rand(4, 3).astype('float32')
    with h5py.File(path, 'r') as f:
        again = keras.models.load_model(f)
    np.testing.assert_allclose(again.predict(x), model.predict(x), atol=1e-6)


def test_summary_shapes_and_history_values_are_python_numbers(keras, capsys):
    layers = keras.layers
    model = keras.models.Sequential([
        layers.Reshape((4, 4, 1), input_shape=(16,)), layers.Conv2D(9, 1), layers.Flatten(),
        layers.Dense(2, activation='softmax')])
    model.compile('sgd', 'categorical_crossentropy', metrics=['accuracy'])
    model.summary()
    assert '(None, 144)' in capsys.readouterr().out
    assert type(model.layers[2].output_shape[1]) is int
    x, y = np.random.rand(8, 16).astype('float32'), np.eye(2)[np.arange(8) % 2]
    history = model.fit(x, y, epochs=2, batch_size=4, validation_split=0.5, verbose=0)
    for key in ('loss', 'accuracy', 'val_loss', 'val_accuracy'):
        assert all(type(v) is float for v in history.history[key]), key
    round(history.history['accuracy'][-1], 2)


def test_selu_is_rounded_once(keras):
    K = keras.backend
    alpha, scale = 1.6732632423543772848170429916717, 1.0507009873554804934193349852946
    x = np.linspace(-6, 3, 2001).astype('float32')
    exact = scale * np.where(x > 0, x.astype('float64'), alpha * np.expm1(x.astype('float64')))
    got = K.eval(keras.activations.selu(K.constant(x)))
    assert got.dtype == np.float32
    np.testing.assert_array_equal(got, exact.astype('float32'))
    assert keras.activations.get('selu') is keras.activations.selu
    assert keras.activations.serialize(keras.activations.selu) == 'selu'


def _write_word_index_npz(path, rng):
    """A tiny dataset in the imdb.npz / reuters.npz layout: ragged lists of word ids."""
    sequences = np.empty(12, dtype=object)
    for i in range(12):
        sequences[i] = list(rng.randint(1, 30, size=rng.randint(2, 9)))
    labels = rng.randint(0, 2, size=12)
    np.savez(path, x_train=sequences[:8], y_train=labels[:8], x_test=sequences[8:],
             y_test=labels[8:], x=sequences, y=labels)


def test_imdb_and_reuters_loaders_on_ragged_data(keras, tmp_h5, monkeypatch):
    from keras.datasets import imdb, reuters
    path = tmp_h5('words.npz')
    _write_word_index_npz(path, np.random.RandomState(0))
    for module in (imdb, reuters):
        monkeypatch.setattr(module, 'get_file', lambda *args, **kwargs: path)
        (x_train, y_train), (x_test, y_test) = module.load_data(num_words=20)
        assert x_train.dtype == object and len(x_train) + len(x_test) == 12
        assert len({len(s) for s in x_train}) > 1  # ragged, as with NumPy < 1.24
        assert all(max(s) < 20 for s in x_train)
        assert len(y_train) == len(x_train)


def test_crossentropies_on_channels_first_outputs_match_channels_last(keras):
    """Keras's test_model_with_crossentropy_losses_channels_first: the target placeholder of
    a custom loss is (None, None, None, None); TensorFlow flattens sparse targets."""
    K, layers = keras.backend, keras.layers
    data = np.array([[[[8., 7.1, 0.], [4.5, 2.6, 0.55], [0.9, 4.2, 11.2]]]], 'float32')
    sparse = np.array([[[[0, 1, 3], [2, 1, 0], [2, 2, 1]]]])
    dense = np.moveaxis(np.eye(4)[sparse[:, 0]], -1, 1)

    def evaluate(data_format, loss_name, labels, channels):
        K.set_image_data_format(data_format)
        axis = 1 if data_format == 'channels_first' else -1
        x = data if axis == 1 else np.moveaxis(data, 1, -1)
        y = labels if axis == 1 else np.moveaxis(labels, 1, -1)
        loss = getattr(K, loss_name)
        inputs = layers.Input(shape=x.shape[1:])
        outputs = layers.Conv2D(channels, 1, activation='softmax', kernel_initializer='ones',
                                bias_initializer='ones')(inputs)
        model = keras.models.Model(inputs, outputs)
        model.compile('rmsprop', lambda t, p: loss(t, p, axis=axis))
        return model.evaluate(x, y, batch_size=1, verbose=0)

    for loss_name, labels in [('sparse_categorical_crossentropy', sparse),
                              ('categorical_crossentropy', dense)]:
        last = evaluate('channels_last', loss_name, labels, 4)
        first = evaluate('channels_first', loss_name, labels, 4)
        np.testing.assert_allclose(first, last, rtol=1e-6)
        np.testing.assert_allclose(first, np.log(4), rtol=1e-6)  # equal logits everywhere


def test_sparse_categorical_crossentropy_takes_float_labels_holding_integers(keras):
    layers = keras.layers
    model = keras.models.Sequential([layers.Dense(3, activation='softmax', input_shape=(4,))])
    model.compile(keras.optimizers.SGD(0.5), 'sparse_categorical_crossentropy', metrics=['accuracy'])
    x = np.random.rand(30, 4).astype('float32')
    y = np.argmax(x[:, :3], axis=1).astype('float32')[:, None]  # [[1.], [0.], ...] as TF casts them
    history = model.fit(x, y, epochs=20, batch_size=10, verbose=0)
    assert history.history['loss'][-1] < history.history['loss'][0]
    with np.testing.assert_raises(ValueError):
        model.evaluate(x, y + 0.5, verbose=0)  # not integers: refused, not truncated
