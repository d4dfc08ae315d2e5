"""The Keras 2.3.1 OCR model of the demo: gpuk.demo.network's layers, trained with
``K.ctc_batch_cost`` inside a Lambda layer whose output *is* the loss. Import this module only
after KERAS_BACKEND is set.
"""
import keras
from keras import backend as K

from gpuk.demo import network
from gpuk.demo.network import NUM_CLASSES, time_steps  # noqa: F401 (the demo's names for them)
from gpuk.demo.settings import ModelSpec


def build_models(height, width, max_label_len, spec=ModelSpec()):
    """Returns (training_model, prediction_model) sharing their weights.

    training_model: inputs [image, labels, input_length, label_length] (model_inputs), output
        the (batch, 1) CTC loss; compiled with a loss that returns y_pred.
    prediction_model: image -> (batch, time_steps(width), NUM_CLASSES) softmax.
    """
    return network.build_models(keras, height, width, max_label_len, K.ctc_batch_cost, spec)
