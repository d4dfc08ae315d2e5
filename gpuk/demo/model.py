"""The Keras 2.3.1 OCR model: conv + batch norm + pooling, a time axis along the image width,
a bidirectional GRU and a per-step softmax over the 10 digits plus the CTC blank.

Trained with ``K.ctc_batch_cost`` inside a Lambda layer whose output *is* the loss, as in
Keras's own image_ocr example. Import this module only after KERAS_BACKEND is set.
"""
import keras
from keras import backend as K
from keras import layers

from gpuk.demo.settings import ModelSpec

NUM_CLASSES = 11  # digits 0-9, then the CTC blank (Keras puts the blank last)


def time_steps(width):
    """Recurrent time steps for images ``width`` pixels wide (the first pooling halves the width)."""
    return width // 2


def _ctc_loss(args):
    y_pred, labels, input_length, label_length = args
    return K.ctc_batch_cost(labels, y_pred, input_length, label_length)


def build_models(height, width, max_label_len, spec=ModelSpec()):
    """Returns (training_model, prediction_model) sharing their weights.

    training_model: inputs [image, labels, input_length, label_length], output the
        (batch, 1) CTC loss; compile it with a loss that returns y_pred.
    prediction_model: image -> (batch, time_steps(width), NUM_CLASSES) softmax.
    """
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

    image = layers.Input(shape=(height, width, 1), name='image')
    x = image
    # The first pooling halves both axes (one time step = two columns), the second only the height.
    pools = [(2, 2), (2, 1)]
    pooled_height = height
    for i, filters in enumerate(spec.conv_filters):
        x = layers.Conv2D(filters, 3, padding='same', use_bias=False, name='conv%d' % (i + 1))(x)
        # momentum 0.9 (Keras: 0.99): the run is short, so the moving statistics used on the
        # held-out set must settle within tens of steps.
        x = layers.BatchNormalization(momentum=0.9, name='bn%d' % (i + 1))(x)
        x = layers.Activation('relu', name='relu%d' % (i + 1))(x)
        if i < len(pools):
            x = layers.MaxPooling2D(pools[i], name='pool%d' % (i + 1))(x)
            pooled_height //= pools[i][0]
    x = layers.Permute((2, 1, 3), name='width_first')(x)
    x = layers.Reshape((steps, pooled_height * spec.conv_filters[-1]), name='to_time_axis')(x)
    x = layers.Dense(spec.dense_units, activation='relu', name='features')(x)
    recurrent = layers.GRU(spec.rnn_units, return_sequences=True, name='gru')
    if spec.bidirectional:
        recurrent = layers.Bidirectional(recurrent, name='bigru')
    x = recurrent(x)
    y_pred = layers.Dense(NUM_CLASSES, activation='softmax', name='softmax')(x)
    prediction_model = keras.models.Model(image, y_pred, name='ocr_predict')

    labels = layers.Input(shape=(max_label_len,), dtype='float32', name='labels')
    input_length = layers.Input(shape=(1,), dtype='int64', name='input_length')
    label_length = layers.Input(shape=(1,), dtype='int64', name='label_length')
    loss = layers.Lambda(_ctc_loss, output_shape=(1,), name='ctc')([y_pred, labels, input_length, label_length])
    training_model = keras.models.Model([image, labels, input_length, label_length], loss, name='ocr_train')
    training_model.compile(optimizer=keras.optimizers.Adam(lr=spec.learning_rate),
                           loss={'ctc': lambda y_true, y_pred: y_pred})
    return training_model, prediction_model
