"""One worker of the 2-process tests (test_two_workers.py starts it under mpiexec, or alone for
the one-process reference): ``python worker.py SCENARIO OUT_DIR``.

Scenarios:
  reference  one process, the whole batch, a plain Keras optimizer
  train      each worker its half of every batch, DistributedOptimizer, broadcast and metric
             averaging callbacks; workers seeded differently so their initial weights differ
  kill       like train, but rank 1 SIGKILLs itself at batch 3
  stop       like train, but rank 1 SIGSTOPs itself at batch 3 (a hung worker)
  collectives  allreduce and broadcast_variables at the K level
"""
import os
import signal
import sys

import numpy as np

os.environ.setdefault('KERAS_BACKEND', 'gpuk.backend')

GLOBAL_BATCH = 16
STEPS = 4
EPOCHS = 2
BUCKET_BYTES = 100  # the model's 66 float32 parameters fall into 3 buckets


def data():
    rng = np.random.RandomState(0)
    x = rng.normal(size=(GLOBAL_BATCH * STEPS, 5)).astype('float32')
    y = np.stack([x[:, 0] * 2 - x[:, 1], np.tanh(x[:, 2] + x[:, 3] * x[:, 4])], axis=1)
    return x, y.astype('float32')


def shard(array, rank, size):
    """Worker ``rank``'s part of every global batch: global batch i is the concatenation of
    the workers' batch i, so averaging their gradients gives the whole batch's."""
    per_worker = GLOBAL_BATCH // size
    return array.reshape(STEPS, size, per_worker, -1)[:, rank].reshape(STEPS * per_worker, -1)


def model(keras, seed):
    np.random.seed(seed)
    return keras.models.Sequential([
        keras.layers.Dense(8, activation='tanh', input_shape=(5,)),
        keras.layers.Dense(2)])


def optimizer(keras):
    # clipnorm small enough to clip: clipping must act on the averaged gradients.
    return keras.optimizers.SGD(lr=0.1, momentum=0.9, clipnorm=0.5)



def main(scenario, out):
    import keras
    import gpuk.distributed as hvd
    hvd.init()
    rank, size = hvd.rank(), hvd.size()
    with open(os.path.join(out, 'pid-%d' % rank), 'w') as f:
        f.write(str(os.getpid()))
    if scenario == 'collectives':
        return collectives(hvd, rank, size, out)

    x, y = data()
    net = model(keras, seed=100 + rank)
    before = net.get_weights()
    initial = {}

    class Snapshot(keras.callbacks.Callback):
        def on_train_begin(self, logs=None):  # runs after the broadcast callback
            initial['weights'] = [w.copy() for w in self.model.get_weights()]

        def on_batch_end(self, batch, logs=None):
            if scenario in ('kill', 'stop') and rank == 1 and batch == 2:
                os.kill(os.getpid(), signal.SIGKILL if scenario == 'kill' else signal.SIGSTOP)

    if scenario == 'reference':
        net.compile(optimizer(keras), 'mse')
        callbacks = [Snapshot()]
        batch = GLOBAL_BATCH
    else:
        net.compile(hvd.DistributedOptimizer(optimizer(keras), bucket_bytes=BUCKET_BYTES), 'mse')
        callbacks = [hvd.BroadcastGlobalVariablesCallback(0), hvd.MetricAverageCallback(), Snapshot()]
        x, y = shard(x, rank, size), shard(y, rank, size)
        batch = GLOBAL_BATCH // size
    history = net.fit(x, y, batch_size=batch, epochs=EPOCHS, shuffle=False, verbose=0,
                      callbacks=callbacks)
    np.savez(os.path.join(out, '%s-%d.npz' % (scenario, rank)),
             loss=np.array(history.history['loss']),
             **{'before%d' % i: w for i, w in enumerate(before)},
             **{'initial%d' % i: w for i, w in enumerate(initial['weights'])},
             **{'final%d' % i: w for i, w in enumerate(net.get_weights())})


def collectives(hvd, rank, size, out):
    from gpuk import backend as K
    results = {}
    results['mean'] = hvd.allreduce(np.array([1.0, 2.0]) * (rank + 1))
    results['sum'] = hvd.allreduce(np.array([rank + 1], dtype=np.int64), average=False)
    x = K.placeholder(shape=(3,))
    y = hvd.allreduce(x * 2.0)
    grad = K.gradients(K.sum(y * K.constant([1.0, 2.0, 3.0])), [x])[0]
    f = K.function([x], [y, grad])
    results['graph'], results['graph_grad'] = f([np.full(3, rank + 1.0, dtype='float32')])
    v = K.variable(np.full((2, 2), float(rank)))
    w = K.variable(np.arange(3, dtype='float64') + 10 * rank, dtype='float64')
    hvd.broadcast_variables([v, w], root_rank=1)
    results['broadcast_v'], results['broadcast_w'] = K.get_value(v), K.get_value(w)
    try:
        hvd.broadcast_variables([v] if rank == 0 else [v, w], root_rank=0)
    except ValueError as exc:
        results['mismatch_error'] = np.array(str(exc))
    results['unchanged_v'] = K.get_value(v)
    np.savez(os.path.join(out, 'collectives-%d.npz' % rank), **results)


if __name__ == '__main__':
    main(sys.argv[1], sys.argv[2])
