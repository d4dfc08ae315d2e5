"""Mixed precision as a plan pass: under 'mixed_bfloat16' / 'mixed_float16'
(gpuk.config.set_precision or GPUK_PRECISION) every step of a compiled plan that runs a
convolution (plain, depthwise, locally connected, the fused conv + bias [+ relu]) or a
matrix product (dot, batch_dot, Dense) on float32 operands is wrapped in ``LowPrecision``:
its operands are rounded to bfloat16 / float16, the kernel multiplies them and sums in
float32 (tensor cores on a GPU, the NumPy twins' float32 math elsewhere), and its result,
rounded to the compute dtype like torch.autocast's, is widened back to float32.

Why at plan time and not in the graph: the graph, and so everything Keras sees (dtypes,
variables, outputs, the gradients' dtypes), stays float32, and every op that is not a
tensor-core op (batch norm and its statistics, softmax, losses, CTC, reductions, the
optimizer's updates) runs in float32 without knowing about the policy. The backward
convolutions and products are steps of the same plan, so they are wrapped too. Which
step runs in which dtype is on the plan: ``step_dtypes(function)``.

Loss scaling for float16 lives in gpuk/loss_scaling.py.
"""
import ml_dtypes
import numpy as np

from gpuk import config
from gpuk.ops.bias import ConvBiasAct
from gpuk.ops.conv import (ConvDgrad, ConvFwd, ConvWgrad, LocalConvDgrad, LocalConvFwd,
                           LocalConvWgrad)
from gpuk.ops.linalg import MatMul

COMPUTE_DTYPES = {'mixed_bfloat16': np.dtype(ml_dtypes.bfloat16), 'mixed_float16': np.dtype(np.float16)}

# tensor-core op -> the positions of its operands (the gradient ops' last input is a shape
# source, only its shape is read, so it is not cast)
TENSOR_CORE_OPERANDS = {
    ConvFwd: (0, 1), ConvDgrad: (0, 1), ConvWgrad: (0, 1), ConvBiasAct: (0, 1, 2),
    LocalConvFwd: (0, 1), LocalConvDgrad: (0, 1), LocalConvWgrad: (0, 1), MatMul: (0, 1),
}


def compute_dtype(policy=None):
    """The dtype tensor-core ops compute in under ``policy`` (default: the current one);
    None for the float32 policies."""
    return COMPUTE_DTYPES.get(config.precision() if policy is None else policy)


class LowPrecision:
    """A plan step running ``op`` on its operands rounded to ``dtype``, widened back to float32."""

    def __init__(self, op, dtype, operands):
        self.op, self.dtype, self.operands = op, np.dtype(dtype), operands

    def forward(self, impl, *arrays):
        # Overflow to inf in float16 is expected (a loss scale too large): loss scaling
        # detects it and skips the step, so NumPy's warnings would only be noise.
        with np.errstate(over='ignore', invalid='ignore'):
            arrays = [a.astype(self.dtype) if i in self.operands else a for i, a in enumerate(arrays)]
            return self.op.forward(impl, *arrays).astype(np.float32)

    def __repr__(self):
        return 'LowPrecision(%s, %s)' % (type(self.op).__name__, self.dtype.name)


def apply_policy(steps, slot_dtypes, policy):
    """``steps`` ``(op, input_slots, output_slots)`` with the tensor-core ops on float32
    operands wrapped in LowPrecision for ``policy`` (unchanged for the float32 policies;
    float16 and float64 graphs keep their own precision)."""
    dtype = compute_dtype(policy)
    if dtype is None:
        return steps
    wrapped = []
    for op, ins, outs in steps:
        operands = TENSOR_CORE_OPERANDS.get(type(op))
        if operands is not None and all(slot_dtypes[ins[i]] == 'float32' for i in operands):
            op = LowPrecision(op, dtype, operands)
        wrapped.append((op, ins, outs))
    return wrapped


def step_dtypes(plan, prefix=''):
    """[(op name, dtype name)] per step of a K.function (e.g. a Keras model's
    ``train_function``, compiled now if needed under the current policy) or of a compiled
    plan: the compute dtype of wrapped tensor-core steps ('bfloat16', 'float16'), else the
    dtype of the step's first output. The steps of a scan's (rnn's) step plan follow the
    scan's, named 'Scan/<op>', once that plan has been compiled (the scan compiles it when
    it first runs)."""
    if hasattr(plan, '_compiled'):       # a gpuk.function.Function
        plan = plan._compiled()
    described = []
    for forward, _, outs, _ in plan.steps:
        op = getattr(forward, '__self__', forward)
        if isinstance(op, LowPrecision):
            described.append((prefix + type(op.op).__name__, op.dtype.name))
            continue
        described.append((prefix + type(op).__name__, plan.slot_dtypes.get(outs[0]) if outs else None))
        for inner in getattr(op, '_plans', {}).values():      # gpuk.ops.scan.Scan
            if inner.impl is plan.impl and inner.precision == plan.precision:
                described += step_dtypes(inner, prefix + type(op).__name__ + '/')
    return described
