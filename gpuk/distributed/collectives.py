"""allreduce and broadcast_variables: the collectives users call themselves."""
import hashlib

import numpy as np

from gpuk import device
from gpuk.distributed import buckets, world
from gpuk.distributed.graph_ops import AllReduce
from gpuk.graph import Tensor, Variable, apply


def allreduce(value, average=True, name=None):
    """The sum of ``value`` over all workers, divided by their number unless ``average`` is
    False (Horovod's default is to average too). Every worker must call it, in the same
    order, with a value of the same shape and dtype.

    A gpuk tensor gives a tensor (the reduction runs when a K.function evaluates it); a NumPy
    array, number or nested list gives a NumPy array at once (as Horovod's Keras
    ``allreduce`` does). Averaged integers come back as float64.
    """
    where = 'gpuk.distributed.allreduce'
    if not isinstance(average, bool):
        raise TypeError('%s: average must be True or False, got %r' % (where, average))
    if name is not None and not isinstance(name, str):
        raise TypeError('%s: name must be a string or None, got %r' % (where, name))
    chosen = world.transport(where)
    if isinstance(value, Tensor):
        if value.dtype not in ('float16', 'float32', 'float64'):
            raise TypeError('%s: graph tensors must be float16/32/64, got %s' % (where, value.dtype))
        return apply(AllReduce(average, name), value)
    try:
        array = np.asarray(value)
    except Exception as exc:
        raise TypeError('%s: value must be a gpuk tensor, a NumPy array or a number, got %r'
                        % (where, value)) from exc
    if array.dtype.kind not in 'biuf':
        raise TypeError('%s: value must hold numbers, got dtype %s' % (where, array.dtype))
    wire = np.float64 if array.dtype.kind in 'biu' or array.dtype == np.float16 else array.dtype
    total = chosen.allreduce_host(array.astype(wire), 'allreduce %r' % (name or 'of a value'))
    if not average:
        return total.astype(array.dtype) if array.dtype.kind != 'b' else total
    mean = total / chosen.size
    return mean.astype(array.dtype) if array.dtype.kind == 'f' else mean


def broadcast_variables(variables, root_rank):
    """Sets every worker's ``variables`` to root_rank's values (Horovod's
    ``broadcast_variables``). The lists must name variables of the same shapes and dtypes in
    the same order on every worker; a mismatch is a ValueError on every worker, and a failed
    call changes no variable.
    """
    where = 'gpuk.distributed.broadcast_variables'
    chosen = world.transport(where)
    if not isinstance(variables, (list, tuple)):
        raise TypeError('%s: variables must be a list of gpuk variables, got %r' % (where, variables))
    for i, v in enumerate(variables):
        if not isinstance(v, Variable):
            raise TypeError('%s: variables must be gpuk variables, got %r at position %d'
                            % (where, v, i))
    if isinstance(root_rank, bool) or not isinstance(root_rank, (int, np.integer)) \
            or not 0 <= root_rank < chosen.size:
        raise ValueError('%s: root_rank must be an int in [0, %d), got %r'
                         % (where, chosen.size, root_rank))
    root_rank = int(root_rank)
    _check_same_layout(chosen, variables, root_rank, where)

    groups = {}
    for i, v in enumerate(variables):
        groups.setdefault(np.dtype(v.dtype), []).append(i)
    new_values = {}
    xp = device.xp()
    for dtype in sorted(groups, key=str):  # the same order on every worker
        indices = groups[dtype]
        buffer = buckets.flatten([variables[i].value for i in indices], dtype, xp)
        buffer = chosen.broadcast(buffer, root_rank, 'the broadcast of %d %s variables from rank %d'
                                  % (len(indices), dtype.name, root_rank))
        parts = buckets.unflatten(buffer, [variables[i].shape for i in indices],
                                  [dtype] * len(indices), 1)
        new_values.update(zip(indices, parts))
    for i, v in enumerate(variables):
        v.value = new_values[i]


def _check_same_layout(chosen, variables, root_rank, where):
    """Every worker compares its (shape, dtype) list with root's, then all learn whether any
    differed, so they raise together instead of hanging in a broadcast of the wrong size."""
    layout = repr([(tuple(v.shape), np.dtype(v.dtype).name) for v in variables]).encode()
    digest = np.frombuffer(hashlib.sha256(layout).digest(), dtype=np.uint8).copy()
    root_digest = chosen.broadcast_host(digest, root_rank, 'the layout check of broadcast_variables')
    same = np.array([int(np.array_equal(digest, root_digest))], dtype=np.int32)
    if chosen.allreduce_host(same, 'the layout check of broadcast_variables', op='min')[0] != 1:
        raise ValueError('%s: the variables differ in number, shape or dtype between workers '
                         '(this worker: %d variables); every worker must pass the same list'
                         % (where, len(variables)))
