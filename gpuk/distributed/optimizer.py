"""DistributedOptimizer: a Keras optimizer whose gradients are averaged across workers.

Keras 2.3.1's optimizers get their gradients from ``self.get_gradients(loss, params)`` inside
``get_updates``. The wrapper is a subclass of the optimizer's own class (as Horovod makes it)
whose ``get_gradients`` returns the averaged gradients, as graph nodes: the all-reduces run
inside the training K.function, between the backward and the updates, and the optimizer's
update rule runs unchanged on every worker with the same averaged gradients.

Clipping (``clipnorm``/``clipvalue``) applies to the averaged gradients, so training on N
workers is the same as on one worker with the whole batch (Horovod clips each worker's
gradients before averaging, which is not).
"""
import numpy as np

from gpuk import backend as K
from gpuk.distributed import buckets, world
from gpuk.distributed.graph_ops import allreduce_gradients


def DistributedOptimizer(optimizer, bucket_bytes=buckets.DEFAULT_BUCKET_BYTES):
    """A copy of the Keras ``optimizer`` (same class, same config) that averages gradients
    across workers in buckets of about ``bucket_bytes`` before applying them.

    # Arguments
        optimizer: a Keras optimizer instance (e.g. ``keras.optimizers.SGD(0.01)``).
        bucket_bytes: gradients are flattened into all-reduces of about this size
            (default 25 MiB).
    """
    where = 'gpuk.distributed.DistributedOptimizer'
    world.transport(where)
    cls = type(optimizer)
    if isinstance(optimizer, type) or not all(
            callable(getattr(optimizer, name, None)) for name in ('get_gradients', 'get_updates', 'get_config')):
        raise TypeError('%s: optimizer must be a Keras optimizer instance (with get_gradients, '
                        'get_updates and get_config), got %r' % (where, optimizer))
    if getattr(optimizer, '_gpuk_distributed', False):
        raise ValueError('%s: the optimizer is already distributed' % where)
    if isinstance(bucket_bytes, bool) or not isinstance(bucket_bytes, (int, np.integer)) \
            or bucket_bytes <= 0:
        raise ValueError('%s: bucket_bytes must be a positive int, got %r' % (where, bucket_bytes))

    def get_gradients(self, loss, params):
        clipping = {name: self.__dict__.pop(name) for name in ('clipnorm', 'clipvalue')
                    if name in self.__dict__}
        try:  # the base class's gradients, None check included, but not yet clipped
            grads = super(distributed, self).get_gradients(loss, params)
        finally:
            self.__dict__.update(clipping)
        grads = allreduce_gradients(grads, self._gpuk_bucket_bytes, where)
        return _clip(grads, clipping.get('clipnorm', 0), clipping.get('clipvalue', 0))

    distributed = type(cls.__name__, (cls,), {
        'get_gradients': get_gradients, '_gpuk_distributed': True,
        '__doc__': 'Distributed (gradients averaged across workers) ' + cls.__name__ + '.'})
    copy = distributed.from_config(optimizer.get_config())
    copy._gpuk_bucket_bytes = int(bucket_bytes)
    return copy


def _clip(grads, clipnorm, clipvalue):
    """Keras 2.3.1's clipping (optimizers.Optimizer.get_gradients and clip_norm)."""
    if clipnorm and clipnorm > 0:
        norm = K.sqrt(sum([K.sum(K.square(g)) for g in grads]))
        grads = [K.switch(norm >= clipnorm, g * clipnorm / norm, g) for g in grads]
    if clipvalue and clipvalue > 0:
        grads = [K.clip(g, -clipvalue, clipvalue) for g in grads]
    return grads
