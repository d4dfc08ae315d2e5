"""Collectives as graph nodes, so a K.function (Keras's training step) runs them in its plan.

Gradients are all-reduced in buckets by two nodes each: ``BucketStart`` (flatten the bucket's
gradients, start the all-reduce) and ``BucketFinish`` (wait for it, average, split). Their
dependencies order the plan so that communication overlaps with the backward:

    bucket k's gradients -> Start_k -> (backward computing bucket k+1) -> Start_{k+1} -> Finish_k

Start_k also reads Start_{k-1}'s token, so every rank issues the all-reduces in the same
order whatever order the plan's traversal visits the updates in; Finish_k reads Start_{k+1}'s
token, so it waits only once the next bucket's all-reduce is in flight. Buckets follow the
parameters in reverse (the last layer's gradients are ready first in the backward). The
token that flows from a Start is the in-flight all-reduce itself, not an array.
"""
import numpy as np

from gpuk.distributed import buckets, world
from gpuk.graph import Meta, Tensor, apply
from gpuk.ops.base import Op


class BucketStart(Op):
    """Flattens its gradient inputs into one buffer and starts summing it across workers."""
    foldable = False
    differentiable = False

    def __init__(self, index, count, where):
        self.index = index  # the bucket's position, for error messages
        self.count = count  # how many inputs are gradients (a last one may be the previous token)
        self.where = where

    def infer(self, *metas):
        return Meta((), 'int64')

    def forward(self, impl, *arrays):
        chosen = world.transport(self.where)
        grads = arrays[:self.count]
        wire = chosen.wire_dtype(grads[0].dtype)
        buffer = buckets.flatten(grads, wire, impl.xp)
        chosen.progress()
        what = 'the all-reduce of gradient bucket %d (%d tensors, %.3g MB)' % (
            self.index, self.count, buffer.nbytes / 1e6)
        pending = chosen.start_allreduce(buffer, what)
        pending.shapes = [tuple(g.shape) for g in grads]
        pending.dtypes = [g.dtype for g in grads]
        return pending


class BucketFinish(Op):
    """Waits for its bucket's all-reduce; outputs the averaged gradients."""
    foldable = False
    differentiable = False

    def __init__(self, index, metas, where):
        self.index = index
        self.metas = tuple(metas)
        self.where = where

    def infer(self, *metas):
        return self.metas if len(self.metas) > 1 else self.metas[0]

    def forward(self, impl, pending, *ordering_tokens):
        chosen = world.transport(self.where)
        buffer = chosen.finish_allreduce(pending)
        out = buckets.unflatten(buffer, pending.shapes, pending.dtypes, chosen.size)
        return tuple(out) if len(out) > 1 else out[0]


class AllReduce(Op):
    """One tensor summed (or averaged) across workers, for ``allreduce`` on graph tensors."""
    foldable = False

    def __init__(self, average, name):
        self.average = average
        self.name = name

    def infer(self, x):
        return Meta(x.shape, x.dtype)

    def forward(self, impl, x):
        chosen = world.transport('gpuk.distributed.allreduce')
        buffer = buckets.flatten([x], chosen.wire_dtype(x.dtype), impl.xp)
        pending = chosen.start_allreduce(buffer, 'allreduce %r' % (self.name or 'of a tensor'))
        buffer = chosen.finish_allreduce(pending)
        divisor = chosen.size if self.average else 1
        return buckets.unflatten(buffer, [x.shape], [x.dtype], divisor)[0]

    def grad(self, inputs, outputs, output_grads):
        # Every worker's output depends on every worker's input with weight 1 (or 1/N):
        # the gradient is the same reduction of the output gradients.
        return [apply(AllReduce(self.average, self.name), output_grads[0])]


def allreduce_gradients(grads, bucket_bytes, where='DistributedOptimizer'):
    """``grads`` (graph tensors, None allowed) averaged across workers in buckets; same order."""
    world.transport(where)
    present = [i for i, g in enumerate(grads) if g is not None]
    for i in present:
        if not isinstance(grads[i], Tensor):
            raise TypeError('%s: gradients must be gpuk tensors, got %r at position %d'
                            % (where, grads[i], i))
    order = present[::-1]  # the last layers' gradients are computed first
    sizes = [None if grads[i].shape is None or None in grads[i].shape
             else int(np.prod(grads[i].shape, dtype=np.int64)) for i in order]
    plan = buckets.plan_buckets(sizes, [grads[i].dtype for i in order], bucket_bytes)
    groups = [[order[j] for j in bucket] for bucket in plan]

    tokens = []
    for k, group in enumerate(groups):
        inputs = [grads[i] for i in group] + tokens[-1:]
        tokens.append(apply(BucketStart(k, len(group), where), *inputs))
    averaged = list(grads)
    for k, group in enumerate(groups):
        metas = [grads[i].meta for i in group]
        outs = apply(BucketFinish(k, metas, where), *([tokens[k]] + tokens[k + 1:k + 2]))
        outs = outs if isinstance(outs, tuple) else (outs,)
        for i, out in zip(group, outs):
            averaged[i] = out
    return averaged
