"""Plan-time fusion of the chains Keras layers produce: conv -> bias_add [-> relu] becomes one
convolution with a fused epilogue (ops.bias.ConvBiasAct), bias_add -> relu one BiasAct('relu'),
batch norm -> relu one BnTrain / BnInfer with activation='relu' (also through the layer's
learning-phase switch), that relu's gradient -> the batch norm's backward one
BnGrad(activation='relu') (where no switch stands between them), and the BatchNormalization
layer's two moving-average updates part of its BnTrain (ops.batchnorm.MovingAverages).

It rewrites a plan's steps ``(op, input_slots, output_slots)`` after constant folding. A chain
is fused only when every intermediate it removes has exactly one reader in the whole plan
(gradients included) and is not a plan target (output or update value), so nothing else can
see that an intermediate is gone. The fused step takes the place of the chain's last step:
its inputs were all computed before that, and every reader of its output comes after it.

The plain relu's gradient reads the relu's output, not its input (ops/activation.py), so in
training plans the bias-add output has the relu as its only reader and fuses away too.

Batch norm's outputs have one more kind of reader in training plans: the gradient of the
learning-phase switch (a ``where``) sums its gradient to the *shape* of each branch
(SumToShapeOf(g, like) reads only like's shape). Shape-only reads do not count as readers:
those of the relu's input (the batch norm's y, or the switch's output), a slot that goes
away, are moved to the relu's output, which has the same shape (relu keeps shapes); a switch
branch's y keeps its slot, which then holds the fused output, of the same shape. So the
value's one reader is the relu or the switch and the rule above applies unchanged.

Backward, the plain relu's gradient ReluGrad(g, y) reads the fused batch norm's output y; when
a linear BnGrad of that same batch norm is the one reader of its result, the two become
BnGrad(activation='relu') reading g and y (dy masked where y is not > 0). Masking selects
where ReluGrad multiplies by 0 or 1, so the only difference is a non-finite g at a masked
entry (0 instead of NaN). With the learning-phase switch the relu's gradient has two readers
(one ``where`` gradient per branch) and stays unfused; a fixed phase
(K.set_learning_phase(1), or a K-level BN -> relu) has no switch and fuses.

``GPUK_FUSION=0`` turns the pass off (read when a plan is compiled).
"""
import os
from collections import Counter, defaultdict

from gpuk.fusion_elementwise import fuse_elementwise
from gpuk.fusion_scan import prune_scan_outputs
from gpuk.fusion_gradients import drop_identity_broadcasts, merge_slice_gradients
from gpuk.ops.activation import Relu, ReluGrad
from gpuk.ops.batchnorm import BnGrad, BnInfer, BnTrain, MovingAverages
from gpuk.ops.bias import BiasAct, ConvBiasAct
from gpuk.ops.conv import ConvFwd
from gpuk.ops.elementwise import Binary, BroadcastLike, SumToShapeOf, Where


def _switch(name):
    """An on/off environment switch: unset or '1' (on), '0' (off)."""
    value = os.environ.get(name, '1').strip() or '1'
    if value not in ('0', '1'):
        raise ValueError("%s must be '0' or '1', got %r" % (name, value))
    return value == '1'


def enabled():
    """Whether plans are fused: ``GPUK_FUSION`` unset or '1' (on), '0' (off)."""
    return _switch('GPUK_FUSION')


def elementwise_enabled():
    """Whether elementwise groups become generated kernels (fusion_elementwise), within an
    enabled fusion: ``GPUK_FUSE_ELEMENTWISE`` unset or '1' (on), '0' (off). Each distinct
    group is one more kernel to compile on first use."""
    return _switch('GPUK_FUSE_ELEMENTWISE')


def _is_plain_relu(op):
    """relu with Keras's defaults (alpha=0, max_value=None, threshold=0), not leaky/capped."""
    return type(op) is Relu and op.plain


def _is_plain_conv(op):
    return type(op) is ConvFwd and op.window.family == 'conv'


def _conv_channel_axis(window):
    return 1 if window.channels_first else window.rank + 1


def _is_linear_bias(op):
    return type(op) is BiasAct and op.activation == 'linear'


def fuse(steps, protected, slot_shapes=None, kernel_limits=True, slot_dtypes=None):
    """The steps with every chain this module knows fused (see the module docstring);
    ``slot_shapes`` (slot -> static shape) lets elementwise groups keep to one shape, and
    ``slot_dtypes`` (slot -> static dtype) to the kernel's dtypes;
    ``kernel_limits``: whether elementwise groups must fit one generated kernel (False for
    plans of the NumPy device, fusion_elementwise.fuse_elementwise)."""
    steps = prune_scan_outputs(steps, protected)
    steps = drop_identity_broadcasts(steps, protected, slot_shapes or {})
    steps = merge_slice_gradients(steps, protected)
    steps = _fuse_bias_chains(steps, protected)
    steps = _fuse_batchnorm_relu(steps, protected)
    steps = _fuse_batchnorm_relu_backward(steps, protected)
    steps = _fuse_moving_averages(steps, protected)
    # last: the chains above are matched op by op, before their elementwise steps are grouped
    return fuse_elementwise(steps, protected, slot_shapes, kernel_limits, slot_dtypes) if elementwise_enabled() \
        else steps


def _fuse_bias_chains(steps, protected):
    """The steps with conv -> bias_add [-> relu] and bias_add -> relu chains fused.

    ``steps``: ``(op, input_slots, output_slots)`` in execution order; ``protected``: slots
    that must stay computed (targets, fed inputs).
    """
    readers = Counter(s for _, ins, _ in steps for s in ins)
    reader_step = {s: i for i, (_, ins, _) in enumerate(steps) for s in ins}

    def sole_reader(slot):
        """The index of the one step reading ``slot``, None when it is shared or kept."""
        if slot in protected or readers[slot] != 1:
            return None
        return reader_step[slot]

    claimed, fused_at = set(), {}
    for i, (op, ins, outs) in enumerate(steps):
        if i in claimed:
            continue
        chain = None
        if _is_plain_conv(op):
            j = sole_reader(outs[0])
            if j is not None and j not in claimed and _is_linear_bias(steps[j][0]) \
                    and steps[j][0].axis == _conv_channel_axis(op.window) \
                    and steps[j][1][0] == outs[0]:
                chain, activation = [i, j], 'linear'
                k = sole_reader(steps[j][2][0])
                if k is not None and k not in claimed and _is_plain_relu(steps[k][0]):
                    chain, activation = [i, j, k], 'relu'
                fused = (ConvBiasAct(op.window, activation), [ins[0], ins[1], steps[j][1][1]],
                         steps[chain[-1]][2])
        elif _is_linear_bias(op):
            k = sole_reader(outs[0])
            if k is not None and k not in claimed and _is_plain_relu(steps[k][0]):
                chain = [i, k]
                fused = (BiasAct(op.axis, 'relu'), list(ins), steps[k][2])
        if chain is not None:
            claimed.update(chain)
            fused_at[chain[-1]] = fused
    return [fused_at.get(i, step) for i, step in enumerate(steps)
            if i not in claimed or i in fused_at]


# ---------------------------------------------------------------- batch normalization

class _Readers:
    """Who reads each slot: value readers ``(step, position)`` and shape-only readers (the
    ``like`` input of SumToShapeOf / BroadcastLike)."""

    def __init__(self, steps):
        self.values, self.shapes = defaultdict(list), defaultdict(list)
        for i, (op, ins, _) in enumerate(steps):
            for position, slot in enumerate(ins):
                shape_only = position == 1 and type(op) in (SumToShapeOf, BroadcastLike)
                (self.shapes if shape_only else self.values)[slot].append((i, position))
        self.producer = {slot: i for i, (_, _, outs) in enumerate(steps) for slot in outs}

    def sole_value_reader(self, slot, protected):
        """The step that alone reads ``slot``'s value (shape reads aside), or None."""
        readers = self.values[slot]
        if slot in protected or len(readers) != 1:
            return None
        return readers[0][0]


def _is_linear_bn(op):
    return type(op) in (BnTrain, BnInfer) and op.activation == 'linear' and getattr(op, 'moving', None) is None


def _with_relu(op):
    """The batch-norm op with the relu epilogue."""
    if type(op) is BnTrain:
        return BnTrain(op.axes, op.epsilon, op.has_gamma, op.has_beta, op.where, 'relu', op.moving)
    return BnInfer(op.epsilon, op.has_gamma, op.has_beta, op.axis, op.where, 'relu')


def _bn_branch(steps, readers, slot, reader, protected):
    """The index of the linear batch norm whose y is ``slot`` when step ``reader`` alone reads
    that value, else None."""
    i = readers.producer.get(slot)
    if i is None or not _is_linear_bn(steps[i][0]) or steps[i][2][0] != slot:
        return None
    return i if readers.sole_value_reader(slot, protected) == reader else None


def _fuse_batchnorm_relu(steps, protected):
    """relu(bn(x)) -> bn(x, activation='relu'), and relu(where(c, bn_a, bn_b)) ->
    where(c, bn_a(relu), bn_b(relu)) (BatchNormalization's learning-phase switch), when
    every removed value has one value reader; shape-only reads of the relu's input move to
    the relu's output (relu keeps shapes)."""
    readers = _Readers(steps)
    steps = [(op, list(ins), list(outs)) for op, ins, outs in steps]
    removed = set()
    for r, (op, ins, outs) in enumerate(steps):
        if not _is_plain_relu(op) or readers.sole_value_reader(ins[0], protected) != r:
            continue
        source = readers.producer.get(ins[0])
        if source is not None and type(steps[source][0]) is Where:
            _, (_, a, b), _ = steps[source]
            branches = [_bn_branch(steps, readers, slot, source, protected) for slot in (a, b)]
        else:
            branches = [_bn_branch(steps, readers, ins[0], r, protected)]
        if None in branches or len(set(branches)) != len(branches):
            continue
        for i in branches:
            steps[i] = (_with_relu(steps[i][0]), steps[i][1], steps[i][2])
        steps[source][2][0] = outs[0]   # the switch, or the batch norm, writes the relu's output
        for i, position in readers.shapes[ins[0]]:
            steps[i][1][position] = outs[0]
        removed.add(r)
    return [step for i, step in enumerate(steps) if i not in removed]


def _is_plain_relu_grad(op):
    """The plain relu's gradient ReluGrad(g, y): reads the relu's output y (ops/activation.py)."""
    return type(op) is ReluGrad and _is_plain_relu(op.relu)


def _differentiates(train_step, grad_op, grad_ins, y):
    """Whether ``train_step`` is a relu-fused BnTrain writing ``y`` and the linear BnGrad
    (``grad_op`` reading ``grad_ins``) is its backward: same axes, and the x, mean, inv_std
    (and gamma) it computed from."""
    op, ins, outs = train_step
    if type(op) is not BnTrain or op.activation != 'relu' or outs[0] != y:
        return False
    if op.axes != tuple(grad_op.axes) or op.has_gamma != grad_op.has_gamma:
        return False
    read = [ins[0], outs[1], outs[3]] + ([ins[1]] if op.has_gamma else [])
    return grad_ins[1:1 + len(read)] == read


def _fuse_batchnorm_relu_backward(steps, protected):
    """BnGrad(ReluGrad(g, y), x, mean, inv_std, ...) -> BnGrad(g, x, mean, inv_std, ..., y,
    activation='relu') where y is the output of the relu-fused BnTrain those statistics
    come from, and the relu gradient's result has that BnGrad as its one reader."""
    readers = _Readers(steps)
    fused_at, removed = {}, set()
    for r, (op, ins, outs) in enumerate(steps):
        if not _is_plain_relu_grad(op) or not _removable(outs[0], readers, protected):
            continue
        b, position = readers.values[outs[0]][0]
        grad_op, grad_ins, grad_outs = steps[b]
        if type(grad_op) is not BnGrad or grad_op.activation != 'linear' or position != 0:
            continue
        g, y = ins
        source = readers.producer.get(y)
        if source is None or not _differentiates(steps[source], grad_op, grad_ins, y):
            continue
        fused_op = BnGrad(grad_op.axes, grad_op.has_gamma, grad_op.has_dmean, grad_op.has_dvar, 'relu')
        fused_at[b] = (fused_op, [g] + list(grad_ins[1:]) + [y], grad_outs)
        removed.add(r)
    return [fused_at.get(i, step) for i, step in enumerate(steps) if i not in removed]


def _is_binary(op, name):
    return type(op) is Binary and op.name == name


def _removable(slot, readers, protected):
    """An intermediate the fused op drops: one value reader, no shape reader, not kept."""
    return slot not in protected and len(readers.values[slot]) == 1 and not readers.shapes[slot]


def _moving_update(steps, readers, protected, value, s1):
    """Matches Keras's ``moving - (moving - value) * decay`` (K.moving_average_update with
    every cast an identity) starting at step ``s1``: (moving, decay, result, [s1, s2, s3])."""
    op1, ins1, outs1 = steps[s1]
    if not _is_binary(op1, 'subtract') or ins1[1] != value or not _removable(outs1[0], readers, protected):
        return None
    s2 = readers.values[outs1[0]][0][0]
    op2, ins2, outs2 = steps[s2]
    if not _is_binary(op2, 'multiply') or ins2[0] != outs1[0] or not _removable(outs2[0], readers, protected):
        return None
    s3 = readers.values[outs2[0]][0][0]
    op3, ins3, outs3 = steps[s3]
    if not _is_binary(op3, 'subtract') or ins3 != [ins1[0], outs2[0]]:
        return None
    return ins1[0], ins2[1], outs3[0], [s1, s2, s3]


def _only(matches):
    matches = [m for m in matches if m is not None]
    return matches[0] if len(matches) == 1 else None


def _mean_update(steps, readers, protected, mean):
    return _only(_moving_update(steps, readers, protected, mean, i) for i, _ in readers.values[mean])


def _var_update(steps, readers, protected, var):
    """The variance's update, of var itself or of var * factor (the layer's correction):
    (moving, decay, factor or None, result, steps)."""
    candidates = []
    for i, position in readers.values[var]:
        op, ins, outs = steps[i]
        if _is_binary(op, 'multiply') and ins[0] != ins[1] and _removable(outs[0], readers, protected):
            factor = ins[1 - position]
            for j, _ in readers.values[outs[0]]:
                match = _moving_update(steps, readers, protected, outs[0], j)
                candidates.append(match and (match[0], match[1], factor, match[2], [i] + match[3]))
        else:
            match = _moving_update(steps, readers, protected, var, i)
            candidates.append(match and (match[0], match[1], None, match[2], match[3]))
    return _only(candidates)


def _producers_after(steps, readers, position, slots):
    """The steps after ``position`` that the values ``slots`` need (transitively); None when
    one of them needs step ``position`` itself."""
    found, stack = set(), [readers.producer.get(s) for s in slots]
    while stack:
        i = stack.pop()
        if i is None or i < position or i in found:
            continue
        if i == position:
            return None
        found.add(i)
        stack.extend(readers.producer.get(s) for s in steps[i][1])
    return found


def _fuse_moving_averages(steps, protected):
    """BnTrain + Keras's two moving-average updates of its mean and variance -> one BnTrain
    with MovingAverages, at the BnTrain's place. The scalars the updates read (decay, the
    variance correction computed from K.shape) may come later in the plan: the steps that
    compute them, which cannot depend on the batch norm, move before it.

    One pass finds every batch norm's rewrite against one reader index and applies them all
    (a ResNet has a hundred batch norms: re-indexing after each rewrite was quadratic); a
    rewrite touching steps another one removes waits for the next pass."""
    while True:
        readers = _Readers(steps)
        rewrites, removed_all, hoisted_all, deferred = {}, set(), set(), False
        for t, (op, ins, outs) in enumerate(steps):
            if type(op) is not BnTrain or op.moving is not None:
                continue
            rewrite = _moving_average_rewrite(steps, readers, protected, t)
            if rewrite is None:
                continue
            _, hoisted, removed = rewrite
            own = removed | {t}
            if own & (removed_all | hoisted_all) or hoisted & removed_all:
                deferred = True
                continue
            rewrites[t] = rewrite
            removed_all |= own
            hoisted_all |= hoisted
        if not rewrites:
            return steps
        fused_steps, emitted = [], set()
        for i, step in enumerate(steps):
            if i in rewrites:
                fused, hoisted, _ = rewrites[i]
                fused_steps.extend(steps[j] for j in sorted(hoisted - emitted))
                emitted |= hoisted
                fused_steps.append(fused)
            elif i not in removed_all and i not in emitted:
                fused_steps.append(step)
        steps = fused_steps
        if not deferred:
            return steps


def _moving_average_rewrite(steps, readers, protected, t):
    """(the fused step, the indices of the steps to hoist before it, the indices of the
    update steps it replaces) for the BnTrain at ``t``, or None."""
    op, ins, outs = steps[t]
    mean_update = _mean_update(steps, readers, protected, outs[1])
    var_update = _var_update(steps, readers, protected, outs[2])
    if mean_update is None or var_update is None:
        return None
    moving_mean, decay, next_mean, mean_steps = mean_update
    moving_var, var_decay, factor, next_var, var_steps = var_update
    if moving_mean == moving_var:
        return None
    extra = [moving_mean, moving_var, decay, var_decay] + ([factor] if factor is not None else [])
    hoisted = _producers_after(steps, readers, t, extra)
    removed = set(mean_steps) | set(var_steps)
    if hoisted is None or hoisted & removed:
        return None
    fused_op = BnTrain(op.axes, op.epsilon, op.has_gamma, op.has_beta, op.where, op.activation,
                       MovingAverages(factor is not None))
    return (fused_op, list(ins) + extra, list(outs) + [next_mean, next_var]), set(hoisted), removed
