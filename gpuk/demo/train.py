"""Training and evaluation of the OCR demo. Import only after KERAS_BACKEND is set
(``python -m gpuk.demo`` does that for you)."""
import time
from dataclasses import dataclass

import keras
import numpy as np
from keras import backend as K

from gpuk.demo import metrics
from gpuk.demo.data import make_dataset
from gpuk.demo.model import build_models, time_steps
from gpuk.demo.network import model_inputs
from gpuk.demo.settings import TrainConfig


@dataclass
class Results:
    history: dict            # per epoch: loss, val_loss, val_seq_acc (greedy)
    greedy_accuracy: float
    beam_accuracy: float
    greedy_cer: float
    beam_cer: float
    examples: list           # (truth, greedy, beam) triples from the held-out set, some misread
    train_seconds: float
    val_texts: tuple
    greedy_texts: list
    beam_texts: list


class CtcDecoder:
    """``K.ctc_decode`` compiled once into a K.function (greedy or beam search)."""

    def __init__(self, steps, greedy=True, beam_width=10):
        self.steps = steps
        y_pred = K.placeholder(shape=(None, steps, None), name='decoder_softmax')
        lengths = K.placeholder(shape=(None,), dtype='int64', name='decoder_lengths')
        decoded, _ = K.ctc_decode(y_pred, lengths, greedy=greedy, beam_width=beam_width)
        self._decode = K.function([y_pred, lengths], [decoded[0]])

    def __call__(self, softmax):
        """(batch, steps, classes) softmax -> list of digit strings."""
        lengths = np.full(len(softmax), self.steps, dtype=np.int64)
        return metrics.decoded_to_strings(self._decode([softmax, lengths])[0])


class SequenceAccuracyCallback(keras.callbacks.Callback):
    """Greedy-decodes the held-out set after each epoch; adds ``val_seq_acc`` to the logs."""

    def __init__(self, prediction_model, decoder, dataset, batch_size, log):
        super().__init__()
        self.prediction_model, self.decoder, self.dataset = prediction_model, decoder, dataset
        self.batch_size, self.log = batch_size, log

    def on_epoch_end(self, epoch, logs=None):
        softmax = self.prediction_model.predict(self.dataset.images, batch_size=self.batch_size)
        accuracy = metrics.sequence_accuracy(self.decoder(softmax), self.dataset.texts)
        if logs is not None:
            logs['val_seq_acc'] = accuracy
        self.log('  held-out sequence accuracy (greedy): %.1f%%' % (100 * accuracy))


def _examples(triples, first=5, mistakes=3):
    """The first few (truth, greedy, beam) triples, then the first few misreadings after them."""
    wrong = [t for t in triples[first:] if not t[0] == t[1] == t[2]]
    return triples[:first] + wrong[:mistakes]


def train(config=TrainConfig(), log=print, verbose=1):
    """Builds the data and the model, trains, and evaluates on the held-out set."""
    render = config.render
    train_seed, val_seed, model_seed = np.random.SeedSequence(config.seed).spawn(3)
    train_set = make_dataset(config.train_size, train_seed, render)
    val_set = make_dataset(config.val_size, val_seed, render)
    # Keras draws initializer seeds and the shuffling order from NumPy's global generator.
    np.random.seed(model_seed.generate_state(1)[0])
    training_model, prediction_model = build_models(render.height, render.width, render.max_len, config.model)
    steps = time_steps(render.width)
    greedy = CtcDecoder(steps, greedy=True)
    beam = CtcDecoder(steps, greedy=False, beam_width=config.beam_width)

    log('data: %d training / %d held-out images of %dx%d, %d-%d digits; model: %d parameters'
        % (config.train_size, config.val_size, render.height, render.width, render.min_len,
           render.max_len, prediction_model.count_params()))
    started = time.perf_counter()
    fit = training_model.fit(
        model_inputs(train_set, steps), np.zeros(len(train_set), np.float32),
        batch_size=config.batch_size, epochs=config.epochs, verbose=verbose,
        validation_data=(model_inputs(val_set, steps), np.zeros(len(val_set), np.float32)),
        callbacks=[SequenceAccuracyCallback(prediction_model, greedy, val_set, config.batch_size, log)])
    train_seconds = time.perf_counter() - started

    softmax = prediction_model.predict(val_set.images, batch_size=config.batch_size)
    greedy_texts, beam_texts = greedy(softmax), beam(softmax)
    history = {name: [float(v) for v in values] for name, values in fit.history.items()}
    return Results(
        history=history,
        greedy_accuracy=metrics.sequence_accuracy(greedy_texts, val_set.texts),
        beam_accuracy=metrics.sequence_accuracy(beam_texts, val_set.texts),
        greedy_cer=metrics.character_error_rate(greedy_texts, val_set.texts),
        beam_cer=metrics.character_error_rate(beam_texts, val_set.texts),
        examples=_examples(list(zip(val_set.texts, greedy_texts, beam_texts))),
        train_seconds=train_seconds, val_texts=val_set.texts,
        greedy_texts=greedy_texts, beam_texts=beam_texts)
