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
    model = keras.models.Sequential([
        layers.TimeDistributed(layers.Conv2D(5, (2, 2)), batch_input_shape=(2, 3, 4, 6, 6))])
    model.compile('sgd', 'mse')
    assert model.predict(np.ones((2, 3, 4, 6, 6), 'float32')).shape == (2, 3, 5, 5, 5)


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
