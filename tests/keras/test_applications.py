"""Every keras.applications model Keras 2.3.1 ships builds on gpuk (weights=None, the
smallest input each allows), predicts, and takes a training step (issue 17).

Building and predicting run for all of them; the training step runs by default for the
lighter models only. The heavy ones (deep ResNets, DenseNets, Inceptions, Xception,
NASNets, VGGs: 5-25 s per step on a 2-core host) train when GPUK_HEAVY_TESTS=1.
"""
import os

import numpy as np
import pytest

HEAVY = os.environ.get('GPUK_HEAVY_TESTS') == '1'

# name: smallest input side (keras_applications 1.0.8's _obtain_input_shape minimums)
SMALLEST_INPUT = {
    'VGG16': 32, 'VGG19': 32, 'ResNet50': 32, 'ResNet101': 32, 'ResNet152': 32,
    'ResNet50V2': 32, 'ResNet101V2': 32, 'ResNet152V2': 32, 'InceptionV3': 75,
    'InceptionResNetV2': 75, 'Xception': 71, 'MobileNet': 32, 'MobileNetV2': 32,
    'DenseNet121': 32, 'DenseNet169': 32, 'DenseNet201': 32, 'NASNetMobile': 32,
    'NASNetLarge': 32,
}
LIGHT = ('MobileNet', 'MobileNetV2', 'ResNet50')
CLASSES = 3


def _build(keras, name):
    side = SMALLEST_INPUT[name]
    model = getattr(keras.applications, name)(weights=None, input_shape=(side, side, 3),
                                              classes=CLASSES)
    x = np.random.rand(2, side, side, 3).astype('float32')
    return model, x


def test_every_application_is_covered(keras):
    shipped = {name for name in dir(keras.applications)
               if name[0].isupper() and callable(getattr(keras.applications, name))}
    assert shipped == set(SMALLEST_INPUT)


@pytest.mark.parametrize('name', sorted(SMALLEST_INPUT))
def test_application_builds_and_predicts(keras, name):
    model, x = _build(keras, name)
    probabilities = model.predict(x[:1])
    assert probabilities.shape == (1, CLASSES)
    np.testing.assert_allclose(probabilities.sum(), 1, rtol=1e-5)


@pytest.mark.parametrize('name', [
    name if name in LIGHT else pytest.param(
        name, marks=pytest.mark.skipif(not HEAVY, reason='heavy: GPUK_HEAVY_TESTS=1 runs it'))
    for name in sorted(SMALLEST_INPUT)])
def test_application_takes_a_training_step(keras, name):
    model, x = _build(keras, name)
    model.compile(keras.optimizers.SGD(0.01), 'categorical_crossentropy')
    y = np.eye(CLASSES)[[0, 1]]
    K = keras.backend
    before = K.batch_get_value(model.trainable_weights)
    loss = model.train_on_batch(x, y)
    assert np.isfinite(loss)
    after = K.batch_get_value(model.trainable_weights)
    moved = sum(not np.array_equal(a, b) for a, b in zip(before, after))
    assert moved >= 0.9 * len(before)  # the gradient step reached (nearly) every weight
