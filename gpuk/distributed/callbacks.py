"""Keras callbacks with Horovod's names (imported on first use: they subclass Keras's Callback)."""
import numpy as np
from keras.callbacks import Callback

from gpuk.distributed import world
from gpuk.distributed.collectives import allreduce, broadcast_variables


class BroadcastGlobalVariablesCallback(Callback):
    """At the start of training, sets every worker's model and optimizer weights to root_rank's,
    so workers initialised differently (each seeds its own random initialisers) start equal.
    Keras builds the optimizer's weights before ``on_train_begin``, so its slots (momenta,
    Adam's moments, the iteration count) are broadcast too. Runs once per callback object."""

    def __init__(self, root_rank=0):
        super().__init__()
        world.transport('gpuk.distributed.BroadcastGlobalVariablesCallback')
        if isinstance(root_rank, bool) or not isinstance(root_rank, (int, np.integer)) \
                or not 0 <= root_rank < world.size():
            raise ValueError('gpuk.distributed.BroadcastGlobalVariablesCallback: root_rank must be '
                             'an int in [0, %d), got %r' % (world.size(), root_rank))
        self.root_rank = int(root_rank)
        self.broadcast_done = False

    def on_train_begin(self, logs=None):
        if self.broadcast_done:
            return
        variables = list(self.model.weights)
        optimizer = getattr(self.model, 'optimizer', None)
        if optimizer is not None:
            variables += [w for w in optimizer.weights if all(w is not v for v in variables)]
        broadcast_variables(variables, self.root_rank)
        self.broadcast_done = True


class MetricAverageCallback(Callback):
    """At the end of each epoch, replaces every metric in ``logs`` by its average over the
    workers (each worker's metrics come from its own shard of the data). Put it before
    callbacks that read the metrics (ModelCheckpoint, EarlyStopping, ReduceLROnPlateau)."""

    def __init__(self):
        super().__init__()
        world.transport('gpuk.distributed.MetricAverageCallback')

    def on_epoch_end(self, epoch, logs=None):
        if not logs:
            return
        names = sorted(k for k, v in logs.items() if np.ndim(v) == 0 and np.isreal(v))
        values = allreduce(np.array([float(logs[k]) for k in names], dtype=np.float64),
                           name='the metrics of epoch %d' % epoch)
        for name, value in zip(names, values):
            logs[name] = float(value)
