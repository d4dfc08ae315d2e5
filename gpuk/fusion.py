"""Plan-time fusion of the chains Keras layers produce: conv -> bias_add [-> relu] becomes one
convolution with a fused epilogue (ops.bias.ConvBiasAct), bias_add -> relu one BiasAct('relu').

It rewrites a plan's steps ``(op, input_slots, output_slots)`` after constant folding. A chain
is fused only when every intermediate it removes has exactly one reader in the whole plan
(gradients included) and is not a plan target (output or update value), so nothing else can
see that an intermediate is gone. The fused step takes the place of the chain's last step:
its inputs were all computed before that, and every reader of its output comes after it.

The plain relu's gradient reads the relu's output, not its input (ops/activation.py), so in
training plans the bias-add output has the relu as its only reader and fuses away too.

``GPUK_FUSION=0`` turns the pass off (read when a plan is compiled).
"""
import os
from collections import Counter

from gpuk.ops.activation import Relu
from gpuk.ops.bias import BiasAct, ConvBiasAct
from gpuk.ops.conv import ConvFwd


def enabled():
    """Whether plans are fused: ``GPUK_FUSION`` unset or '1' (on), '0' (off)."""
    value = os.environ.get('GPUK_FUSION', '1').strip() or '1'
    if value not in ('0', '1'):
        raise ValueError("GPUK_FUSION must be '0' or '1', got %r" % value)
    return value == '1'


def _is_plain_relu(op):
    """relu with Keras's defaults (alpha=0, max_value=None, threshold=0), not leaky/capped."""
    return type(op) is Relu and op.plain


def _is_plain_conv(op):
    return type(op) is ConvFwd and op.window.family == 'conv'


def _conv_channel_axis(window):
    return 1 if window.channels_first else window.rank + 1


def _is_linear_bias(op):
    return type(op) is BiasAct and op.activation == 'linear'


def fuse(steps, protected):
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
