"""The demo's OCR network, written once against a ``keras`` module passed in (no Keras import
here): conv + batch norm + pooling, a time axis along the image width, a bidirectional GRU and
a per-step softmax over the 10 digits plus the CTC blank, trained on a Lambda layer whose
output *is* the CTC loss, as in Keras's own image_ocr example.

gpuk.demo.model builds it with Keras 2.3.1 and ``K.ctc_batch_cost`` (the demo itself);
bench/keras_models.py's 'ctc' model builds the same layers with Keras 3 for
bench/keras3_jax.py, and its PyTorch twin from the constants below. So the layer arguments
here are the ones both Keras versions take alike.
"""
import numpy as np

from gpuk.demo.settings import ModelSpec

NUM_CLASSES = 11              # digits 0-9, then the CTC blank
BLANK = NUM_CLASSES - 1       # Keras's ctc_batch_cost puts the blank last
# The first pooling halves both axes (one time step = two columns), the second only the height;
# conv layers past these are not pooled.
POOLS = ((2, 2), (2, 1))
# Batch norm's moving-average momentum (Keras: 0.99): the run is short, so the moving statistics
# used on the held-out set must settle within tens of steps.
BN_MOMENTUM = 0.9


def time_steps(width):
    """Recurrent time steps for images ``width`` pixels wide (the first pooling halves the width)."""
    return width // 2


def pooled_height(height, spec=ModelSpec()):
    """The image height left after the pooled conv layers: the features per column are this
    times spec.conv_filters[-1]."""
    for pool in POOLS[:len(spec.conv_filters)]:
        height //= pool[0]
    return height


def check_geometry(height, width, max_label_len, spec=ModelSpec()):
    """Raises ValueError where the network cannot be built for these images and labels."""
    if not spec.conv_filters:
        raise ValueError('build_models: spec.conv_filters must name at least one layer, got %r'
                         % (spec.conv_filters,))
    if width % 2:
        raise ValueError('build_models: width must be even (the first pooling halves it), got %d' % width)
    if height % 4:
        raise ValueError('build_models: height must be a multiple of 4 (pooled twice), got %d' % height)
    steps = time_steps(width)
    if steps < 2 * max_label_len - 1:
        raise ValueError('build_models: %d time steps cannot align labels of %d characters '
                         '(CTC needs up to 2*length-1)' % (steps, max_label_len))


def build_models(keras, height, width, max_label_len, ctc_batch_cost, spec=ModelSpec()):
    """Returns (training_model, prediction_model) sharing their weights, built with ``keras``.

    ctc_batch_cost(labels, y_pred, input_length, label_length) -> (batch, 1): the CTC loss of
        the softmax ``y_pred``, blank last, as Keras 2.3.1's ``K.ctc_batch_cost``.
    training_model: inputs [image, labels, input_length, label_length] (model_inputs), output
        the (batch, 1) CTC loss; compiled with Adam(spec.learning_rate) and a loss that returns
        y_pred.
    prediction_model: image -> (batch, time_steps(width), NUM_CLASSES) softmax.
    """
    check_geometry(height, width, max_label_len, spec)
    layers = keras.layers
    image = layers.Input(shape=(height, width, 1), name='image')
    x = image
    for i, filters in enumerate(spec.conv_filters):
        x = layers.Conv2D(filters, 3, padding='same', use_bias=False, name='conv%d' % (i + 1))(x)
        x = layers.BatchNormalization(momentum=BN_MOMENTUM, name='bn%d' % (i + 1))(x)
        x = layers.Activation('relu', name='relu%d' % (i + 1))(x)
        if i < len(POOLS):
            x = layers.MaxPooling2D(POOLS[i], name='pool%d' % (i + 1))(x)
    x = layers.Permute((2, 1, 3), name='width_first')(x)
    x = layers.Reshape((time_steps(width), pooled_height(height, spec) * spec.conv_filters[-1]),
                       name='to_time_axis')(x)
    x = layers.Dense(spec.dense_units, activation='relu', name='features')(x)
    # reset_after=False is Keras 2.3.1's default; Keras 3's is True (a second bias row): named, so
    # both versions build the same cell
    recurrent = layers.GRU(spec.rnn_units, return_sequences=True, reset_after=False, name='gru')
    if spec.bidirectional:
        recurrent = layers.Bidirectional(recurrent, name='bigru')
    x = recurrent(x)
    y_pred = layers.Dense(NUM_CLASSES, activation='softmax', name='softmax')(x)
    prediction_model = keras.models.Model(image, y_pred, name='ocr_predict')

    labels = layers.Input(shape=(max_label_len,), dtype='float32', name='labels')
    input_length = layers.Input(shape=(1,), dtype='int64', name='input_length')
    label_length = layers.Input(shape=(1,), dtype='int64', name='label_length')
    loss = layers.Lambda(lambda args: ctc_batch_cost(*args), output_shape=(1,),
                         name='ctc')([labels, y_pred, input_length, label_length])
    training_model = keras.models.Model([image, labels, input_length, label_length], loss, name='ocr_train')
    training_model.compile(optimizer=keras.optimizers.Adam(learning_rate=spec.learning_rate),
                           loss={'ctc': lambda y_true, y_pred: y_pred})
    return training_model, prediction_model


def model_inputs(dataset, steps):
    """The four inputs of the training model, in order, for a gpuk.demo.data.Dataset."""
    n = len(dataset)
    return [dataset.images, dataset.labels.astype(np.float32),
            np.full((n, 1), steps, dtype=np.int64), dataset.label_lengths[:, None].astype(np.int64)]
