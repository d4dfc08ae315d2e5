"""act(x + bias) with a vector bias along one axis, through the elementwise kernel family
(a fused CUDA kernel on the GPU). K.bias_add uses it for the common vector-bias case; the
'relu' form is what the plan's fusion (gpuk/fusion.py) makes of bias_add -> relu.

ConvBiasAct is act(conv(x, w) + bias) in one call of the convolution's fused epilogue; only
the fusion pass builds it (Keras's Conv2D computes conv2d -> bias_add -> activation)."""
import numpy as np

from gpuk.graph import Constant, Meta, apply, as_tensor
from gpuk.kernels.runtime import prepared
from gpuk.ops import elementwise as ew
from gpuk.ops.base import Op, normalize_axis
from gpuk.ops.conv import ConvFwd, spatial_dims
from gpuk.ops.reduction import reduce

ACTIVATIONS = ('linear', 'relu')


class BiasAct(Op):
    def __init__(self, axis, activation):
        self.axis, self.activation = axis, activation
        self.kept = prepared.Kept()

    def infer(self, x, bias):
        size = x.shape[self.axis]
        if bias.shape[0] is not None and size is not None and bias.shape[0] != size:
            raise ValueError('bias_add: bias of shape %s does not fit axis %d of x of shape %s'
                             % (bias.shape, self.axis, x.shape))
        return Meta(x.shape, x.dtype)

    def forward(self, impl, x, bias):
        # the step keeps the runner of its last problem (checked and set up once: prepared.Kept)
        return self.kept.run(impl, (x, bias), self._runner)

    def _runner(self, impl, x, bias):
        return impl.elementwise.bias_act_fwd_runner(x, bias, self.axis, self.activation)

    def grad(self, inputs, outputs, output_grads):
        return list(_bias_act_grads(self.activation, self.axis, outputs[0], output_grads[0]))


def _bias_act_grads(activation, axis, y, g):
    """(gradient of the pre-bias value, gradient of the bias) of y = act(v + bias)."""
    if activation == 'relu':
        g = ew.where(y > 0, g, Constant(np.zeros((), dtype=g.dtype)))
    other_axes = [a for a in range(y.ndim) if a != axis]
    return g, reduce('sum', g, other_axes)


# conv_fwd's epilogue names, by activation
_EPILOGUES = {'linear': 'bias', 'relu': 'bias_relu'}


class ConvBiasAct(Op):
    """y = act(conv(x, w) + bias), bias along the channel axis; ``window`` is a ConvFwd's
    (family 'conv'). One ``impl.conv.conv_fwd`` call with a fused epilogue."""

    def __init__(self, window, activation):
        if window.family != 'conv':
            raise ValueError("ConvBiasAct: window.family must be 'conv', got %r" % (window.family,))
        if activation not in ACTIVATIONS:
            raise ValueError('ConvBiasAct: activation must be one of %s, got %r'
                             % (ACTIVATIONS, activation))
        self.window, self.activation = window, activation
        self.kept = prepared.Kept()

    @property
    def channel_axis(self):
        return 1 if self.window.channels_first else self.window.rank + 1

    def infer(self, x, w, bias):
        conv_meta = ConvFwd(self.window).infer(x, w)
        return BiasAct(self.channel_axis, 'linear').infer(conv_meta, bias)

    def forward(self, impl, x, w, bias):   # the step keeps its runner, as BiasAct's
        return self.kept.run(impl, (x, w, bias), self._runner)

    def _runner(self, impl, x, w, bias):
        win = self.window
        if x.shape[0] == 0:  # an empty batch: an empty result, as in TensorFlow
            shape = ConvFwd(win).output_shape(x.shape, w.shape)
            return lambda x, w, bias: impl.xp.zeros(shape, x.dtype)
        pads = win.pads(spatial_dims(x.shape, win.channels_first), w.shape[:win.rank])
        return impl.conv.conv_fwd_runner(x, w, win.strides, win.dilation, pads, win.data_format,
                                         epilogue=_EPILOGUES[self.activation], bias=bias)

    def grad(self, inputs, outputs, output_grads):
        g, d_bias = _bias_act_grads(self.activation, self.channel_axis, outputs[0],
                                    output_grads[0])
        # the convolution's own rule (it reads x and w only, not the convolution's output)
        d_x, d_w = ConvFwd(self.window).grad(inputs[:2], [None], [g])
        return [d_x, d_w, d_bias]


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
