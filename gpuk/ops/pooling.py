"""Pooling ops: max pooling (with its argmax as a second output: the winner's tap in its
window, uint8 for windows of at most 256 taps, int32 beyond) and average pooling, computed
by ``impl.pooling``; padding never takes part (TensorFlow's rule).

Max pooling's backward adds dy at the winners (MaxPoolBwd); the gradient of that is a
gather from the same positions (MaxPoolGather), and the gradient of the gather is the
backward again, so second derivatives work. Average pooling and its backward
are adjoint linear maps, each the gradient of the other.
"""
import numpy as np

from gpuk.graph import Meta, apply
from gpuk.kernels.runtime import prepared
from gpuk.contracts import geometry, pooling_checks
from gpuk.ops.base import Op
from gpuk.ops.conv import assemble_shape, channel_dim, kept_pads, spatial_dims


class PoolWindow:
    """The static attributes of a pooling: window, strides, padding mode, data format."""

    def __init__(self, where, window, strides, padding, data_format):
        rank = len(window)
        self.where = where
        self.window = geometry.normalize_positive_tuple(window, rank, where, 'pool_size')
        self.strides = geometry.normalize_positive_tuple(strides, rank, where, 'strides')
        self.padding = geometry.normalize_padding(padding, where, allowed=('same', 'valid'))
        self.data_format = geometry.normalize_data_format(data_format, where)

    @property
    def channels_first(self):
        return self.data_format == 'channels_first'

    def pads(self, x_shape):
        """geometry.conv_pads for this window, kept per x shape (conv.kept_pads)."""
        return kept_pads(self, (x_shape,), lambda: geometry.conv_pads(
            spatial_dims(x_shape, self.channels_first), self.window, self.strides, (1,) * len(self.window),
            self.padding))

    def out_shape(self, x_shape):
        """Static pooled shape of x (None where unknown); ValueError for an empty output."""
        rank = len(self.window)
        if x_shape is None or len(x_shape) != rank + 2:
            raise ValueError('%s: x must have rank %d (batch, channels and %d spatial dims), '
                             'got shape %s' % (self.where, rank + 2, rank, x_shape))
        out = []
        for n, k, s in zip(spatial_dims(x_shape, self.channels_first), self.window,
                           self.strides):
            length = geometry.conv_output_length(n, k, self.padding, s)
            if length is not None and length < 1:
                raise ValueError("%s: x of shape %s is smaller than pool_size %s with padding "
                                 "'valid'" % (self.where, x_shape, self.window))
            out.append(length)
        return assemble_shape(x_shape[0], channel_dim(x_shape, self.channels_first), out,
                              self.channels_first)

    def args(self, x_shape):
        return self.window, self.strides, self.pads(x_shape), self.data_format

    def setup(self, x_shape, out_shape):
        """The pooling_checks.PoolSetup of static shapes x_shape -> out_shape."""
        return pooling_checks.PoolSetup(self.channels_first, tuple(x_shape), self.window, self.strides,
                                        self.pads(x_shape), spatial_dims(x_shape, self.channels_first),
                                        spatial_dims(out_shape, self.channels_first))

    def __repr__(self):
        return 'PoolWindow%r' % ((self.where, self.window, self.strides, self.padding,
                                  self.data_format),)


def _check_float(where, dtype):
    if np.dtype(dtype).kind != 'f':
        raise TypeError('%s: x must be a float tensor, got dtype %s' % (where, dtype))


class MaxPool(Op):
    """x -> (y, argmax); argmax: the winner's tap in its window (pooling_checks.tap_dtype)."""

    def __init__(self, window):
        self.window = window
        self.kept = prepared.Kept()

    def infer(self, x):
        _check_float(self.window.where, x.dtype)
        out = self.window.out_shape(x.shape)
        return Meta(out, x.dtype), Meta(out, pooling_checks.tap_dtype(self.window.window).name)

    def forward(self, impl, x):
        # the step keeps the runner of its last problem (checked and set up once: prepared.Kept)
        return self.kept.run(impl, (x,), self._runner)

    def _runner(self, impl, x):
        if x.shape[0] == 0:  # an empty batch: an empty result, as in TensorFlow
            out, taps = self.window.out_shape(x.shape), pooling_checks.tap_dtype(self.window.window)
            return lambda x: (impl.xp.zeros(out, x.dtype), impl.xp.zeros(out, taps))
        return impl.pooling.max_pool_fwd_runner(x, *self.window.args(x.shape))

    def grad(self, inputs, outputs, output_grads):
        x = inputs[0]
        argmax = outputs[1]
        return [apply(MaxPoolBwd(self.window, x.shape), output_grads[0], argmax, x)]


class MaxPoolBwd(Op):
    """dx: dy added at the winners (argmax taps) of x. The last input is x itself: only its
    shape is read (free on any device, unlike a K.shape vector on a GPU)."""

    def __init__(self, window, x_static):
        self.window, self.x_static = window, x_static
        self.kept = prepared.Kept()

    def infer(self, dy, argmax, x_like):
        return Meta(self.x_static, dy.dtype)

    def forward(self, impl, dy, argmax, x_like):   # the step keeps its runner, as MaxPool's
        return self.kept.run(impl, (dy, argmax, x_like), self._runner)

    def _runner(self, impl, dy, argmax, x_like):
        if dy.shape[0] == 0:
            return lambda dy, argmax, x_like: impl.xp.zeros(x_like.shape, dy.dtype)
        kernel = impl.pooling.max_pool_bwd_runner(dy, argmax, x_like.shape, *self.window.args(x_like.shape))
        return prepared.reordered(kernel, lambda dy, argmax, x_like: (dy, argmax))

    def grad(self, inputs, outputs, output_grads):
        _, argmax, _ = inputs
        return [apply(MaxPoolGather(self.window), output_grads[0], argmax), None, None]


class MaxPoolGather(Op):
    """g at the argmax positions, shaped like argmax (the adjoint of MaxPoolBwd)."""

    def __init__(self, window):
        self.window = window

    def infer(self, g, argmax):
        return Meta(argmax.shape, g.dtype)

    def forward(self, impl, g, argmax):
        xp = impl.xp
        n, channels = g.shape[0], channel_dim(g.shape, self.window.channels_first)
        if n == 0:
            return xp.zeros(argmax.shape, g.dtype)
        positions, valid = pooling_checks.window_positions(xp, argmax, self.window.setup(g.shape, argmax.shape))
        if self.window.channels_first:
            picked = xp.take_along_axis(g.reshape(n, channels, -1),
                                        positions.reshape(n, channels, -1), axis=2)
        else:
            picked = xp.take_along_axis(g.reshape(n, -1, channels),
                                        positions.reshape(n, -1, channels), axis=1)
        return xp.where(valid, picked.reshape(argmax.shape), 0).astype(g.dtype, copy=False)

    def grad(self, inputs, outputs, output_grads):
        g, argmax = inputs
        return [apply(MaxPoolBwd(self.window, g.shape), output_grads[0], argmax, g),
                None]


class AvgPool(Op):
    """Average over the real (un-padded) inputs of each window."""

    def __init__(self, window):
        self.window = window
        self.kept = prepared.Kept()

    def infer(self, x):
        _check_float(self.window.where, x.dtype)
        return Meta(self.window.out_shape(x.shape), x.dtype)

    def forward(self, impl, x):   # the step keeps its runner, as MaxPool's
        return self.kept.run(impl, (x,), self._runner)

    def _runner(self, impl, x):
        if x.shape[0] == 0:  # an empty batch: an empty result, as in TensorFlow
            out = self.window.out_shape(x.shape)
            return lambda x: impl.xp.zeros(out, x.dtype)
        return impl.pooling.avg_pool_fwd_runner(x, *self.window.args(x.shape))

    def grad(self, inputs, outputs, output_grads):
        x = inputs[0]
        return [apply(AvgPoolBwd(self.window, x.shape), output_grads[0], x)]


class AvgPoolBwd(Op):
    """dx of average pooling; the last input is x itself, for its shape."""

    def __init__(self, window, x_static):
        self.window, self.x_static = window, x_static
        self.kept = prepared.Kept()

    def infer(self, dy, x_like):
        return Meta(self.x_static, dy.dtype)

    def forward(self, impl, dy, x_like):   # the step keeps its runner, as MaxPool's
        return self.kept.run(impl, (dy, x_like), self._runner)

    def _runner(self, impl, dy, x_like):
        x_shape = x_like.shape
        if dy.shape[0] == 0:
            return lambda dy, x_like: impl.xp.zeros(x_like.shape, dy.dtype)
        kernel = impl.pooling.avg_pool_bwd_runner(dy, x_shape, *self.window.args(x_shape))
        return prepared.reordered(kernel, lambda dy, x_like: (dy,))

    def grad(self, inputs, outputs, output_grads):
        return [apply(AvgPool(self.window), output_grads[0]), None]


def max_pool(x, window):
    """Max pooling of tensor x; the argmax output stays in the graph for the gradient."""
    return apply(MaxPool(window), x)[0]


def avg_pool(x, window):
    return apply(AvgPool(window), x)
