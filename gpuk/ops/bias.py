"""act(x + bias) with a vector bias along one axis, through the elementwise kernel family
(a fused CUDA kernel on the GPU). K.bias_add uses it for the common vector-bias case; the
'relu' form is the epilogue a graph fusion of bias_add -> relu can use."""
import numpy as np

from gpuk.graph import Constant, Meta, apply, as_tensor
from gpuk.ops import elementwise as ew
from gpuk.ops.base import Op, normalize_axis
from gpuk.ops.reduction import reduce

ACTIVATIONS = ('linear', 'relu')


class BiasAct(Op):
    def __init__(self, axis, activation):
        self.axis, self.activation = axis, activation

    def infer(self, x, bias):
        size = x.shape[self.axis]
        if bias.shape[0] is not None and size is not None and bias.shape[0] != size:
            raise ValueError('bias_add: bias of shape %s does not fit axis %d of x of shape %s'
                             % (bias.shape, self.axis, x.shape))
        return Meta(x.shape, x.dtype)

    def forward(self, impl, x, bias):
        return impl.elementwise.bias_act_fwd(x, bias, self.axis, self.activation)

    def grad(self, inputs, outputs, output_grads):
        x, y, g = inputs[0], outputs[0], output_grads[0]
        if self.activation == 'relu':
            g = ew.where(y > 0, g, Constant(np.zeros((), dtype=g.dtype)))
        other_axes = [a for a in range(x.ndim) if a != self.axis]
        return [g, reduce('sum', g, other_axes)]


def bias_act(x, bias, axis, activation='linear'):
    """act(x + bias) with the 1-D ``bias`` along ``axis`` of ``x``."""
    x, bias = as_tensor(x), as_tensor(bias)
    if activation not in ACTIVATIONS:
        raise ValueError('bias_act: activation must be one of %s, got %r' % (ACTIVATIONS, activation))
    if bias.ndim != 1:
        raise ValueError('bias_act: bias must be 1-D, got shape %s' % (bias.shape,))
    if bias.dtype != x.dtype:
        bias = ew.cast(bias, x.dtype)
    return apply(BiasAct(normalize_axis(axis, x.ndim, 'bias_act'), activation), x, bias)
