"""Data-parallel training with Horovod's names: one process per GPU (or per host with the NumPy
device), started by mpirun/mpiexec/srun; gradients averaged across them in every step.

    import gpuk.distributed as hvd
    hvd.init()
    opt = hvd.DistributedOptimizer(keras.optimizers.SGD(0.01 * hvd.size()))
    model.compile(opt, 'mse')
    model.fit(x_shard, y_shard, callbacks=[hvd.BroadcastGlobalVariablesCallback(0),
                                           hvd.MetricAverageCallback()])

See docs/distributed.md.
"""
from gpuk.distributed.collectives import allreduce, broadcast_variables
from gpuk.distributed.errors import DistributedError
from gpuk.distributed.optimizer import DistributedOptimizer
from gpuk.distributed.world import init, is_initialized, local_rank, local_size, rank, shutdown, size

_CALLBACKS = ('BroadcastGlobalVariablesCallback', 'MetricAverageCallback')

__all__ = ['init', 'is_initialized', 'rank', 'size', 'local_rank', 'local_size', 'shutdown',
           'allreduce', 'broadcast_variables', 'DistributedOptimizer', 'DistributedError',
           *_CALLBACKS]


def __getattr__(name):
    # The callbacks subclass keras.callbacks.Callback: importing them imports Keras, which
    # users of the K module alone need not have.
    if name in _CALLBACKS:
        from gpuk.distributed import callbacks
        return getattr(callbacks, name)
    raise AttributeError('module %r has no attribute %r' % (__name__, name))
