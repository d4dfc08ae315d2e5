"""Convolution ops: N-d convolution, depthwise convolution and locally connected layers.

Each family is three ops, forward (x, w -> y), data gradient (dy, w -> dx) and filter
gradient (x, dy -> dw), computed by ``impl.conv.<family>_{fwd,dgrad,wgrad}``. The three are
bilinear and adjoint to each other, so the gradient of each is built from the other two:
second derivatives work, and a transposed convolution is just the data-gradient op.

Padding is kept as a mode ('same', 'valid', 'causal', 'full') and turned into explicit
(before, after) pads from the runtime shapes, so spatial dims may be unknown at build
time. The data- and filter-gradient ops take the shape they produce as an int vector
input (``K.shape(x)`` or a user's output_shape), plus its static part for ``infer``.
"""
import math

import numpy as np

from gpuk.graph import Meta, apply
from gpuk.kernels.runtime import prepared
from gpuk.contracts import geometry
from gpuk.ops.base import Op

# family -> impl.conv function names (forward, data gradient, filter gradient)
# each family's runners (fwd, dgrad, wgrad): checked and set up once per problem signature
_RUNNERS = {
    'conv': ('conv_fwd_runner', 'conv_dgrad_runner', 'conv_wgrad_runner'),
    'depthwise': ('depthwise_conv_fwd_runner', 'depthwise_conv_dgrad_runner', 'depthwise_conv_wgrad_runner'),
}


# ---------------------------------------------------------------- layout helpers

def spatial_dims(shape, channels_first):
    return tuple(shape[2:]) if channels_first else tuple(shape[1:-1])


def channel_dim(shape, channels_first):
    return shape[1] if channels_first else shape[-1]


def assemble_shape(batch, channels, spatial, channels_first):
    if channels_first:
        return (batch, channels) + tuple(spatial)
    return (batch,) + tuple(spatial) + (channels,)


def _runtime_shape(source, from_like):
    """The shape a gradient op produces, from its shape-source input: the tensor itself
    (``from_like``: a gradient of a forward op, whose x or w is at hand; reading ``.shape``
    costs nothing) or an int shape vector (a user's output_shape, maybe symbolic; a
    device-to-host copy on a GPU)."""
    if from_like:
        return tuple(source.shape)
    return tuple(int(d) for d in source.tolist())


def _check_rank(where, name, shape, rank, layout):
    if shape is None or len(shape) != rank:
        raise ValueError('%s: %s must have rank %d %s, got shape %s'
                         % (where, name, rank, layout, shape))


def _check_channels(where, a_name, a_shape, a_channels, b_name, b_shape, b_channels):
    if a_channels is not None and b_channels is not None and a_channels != b_channels:
        raise ValueError('%s: %s of shape %s has %d channels but %s of shape %s expects %d'
                         % (where, a_name, a_shape, a_channels, b_name, b_shape, b_channels))


def _check_float(where, name, dtype):
    if np.dtype(dtype).kind != 'f':
        raise TypeError('%s: %s must be a float tensor, got dtype %s' % (where, name, dtype))


# ---------------------------------------------------------------- shared convolution

def kept_pads(window, shapes, compute):
    """``compute()`` (a window's geometry.conv_pads), kept on the window per ``shapes``: a plan
    step asks on every call with the shapes of its last one. Shapes that are not all tuples of
    known sizes are computed per call; at most 64 are kept per window."""
    kept = window.__dict__.setdefault('_pads', {})
    cacheable = all(type(shape) is tuple and None not in shape for shape in shapes)
    pads = kept.get(shapes) if cacheable else None
    if pads is None:
        pads = compute()
        if cacheable and len(kept) < 64:
            kept[shapes] = pads
    return pads


class Window:
    """The static attributes of a (depthwise) convolution."""

    def __init__(self, where, family, strides, dilation, padding, data_format):
        rank = len(strides)
        self.where = where
        self.family = family
        self.strides = geometry.normalize_positive_tuple(strides, rank, where, 'strides')
        self.dilation = geometry.normalize_positive_tuple(dilation, rank, where,
                                                          'dilation_rate')
        self.padding = geometry.normalize_padding(padding, where)
        self.data_format = geometry.normalize_data_format(data_format, where)
        if family not in ('conv', 'depthwise'):
            raise ValueError('Window: family must be conv or depthwise, got %r' % (family,))

    @property
    def rank(self):
        return len(self.strides)

    @property
    def channels_first(self):
        return self.data_format == 'channels_first'

    def key(self):
        return (self.where, self.family, self.strides, self.dilation, self.padding,
                self.data_format)

    def pads(self, in_spatial, kernel_spatial):
        """geometry.conv_pads for this window, kept per (input, kernel) spatial shape."""
        return kept_pads(self, (in_spatial, kernel_spatial), lambda: geometry.conv_pads(
            in_spatial, kernel_spatial, self.strides, self.dilation, self.padding))

    def out_spatial(self, in_spatial, kernel_spatial, x_name, x_shape, w_shape):
        """Static output sizes (None where unknown); ValueError for an empty output."""
        out = []
        for n, k, s, d in zip(in_spatial, kernel_spatial, self.strides, self.dilation):
            length = None if k is None else geometry.conv_output_length(n, k, self.padding, s, d)
            if length is not None and length < 1:
                raise ValueError('%s: %s of shape %s is smaller than the kernel of shape %s '
                                 "(dilation_rate %s) with padding '%s'"
                                 % (self.where, x_name, x_shape, w_shape, self.dilation,
                                    self.padding))
            out.append(length)
        return tuple(out)

    def out_channels(self, w_shape):
        if self.family == 'conv':
            return w_shape[-1]
        return None if None in w_shape[-2:] else w_shape[-2] * w_shape[-1]

    def check_x_w(self, x_name, x_shape, w_shape):
        """Checks ranks and input channels of x against the kernel."""
        _check_rank(self.where, 'the kernel', w_shape, self.rank + 2,
                    '(*kernel_spatial, in_channels, %s)'
                    % ('out_channels' if self.family == 'conv' else 'depth_multiplier'))
        _check_rank(self.where, x_name, x_shape, self.rank + 2,
                    '(batch, channels and %d spatial dims)' % self.rank)
        _check_channels(self.where, x_name, x_shape, channel_dim(x_shape, self.channels_first),
                        'the kernel', w_shape, w_shape[-2])

    def check_dy(self, dy_shape, w_shape):
        _check_rank(self.where, 'dy', dy_shape, self.rank + 2, 'like x')
        _check_channels(self.where, 'dy', dy_shape, channel_dim(dy_shape, self.channels_first),
                        'the kernel', w_shape, self.out_channels(w_shape))

    def runner(self, impl, index):
        """The family's runner launcher on ``impl``: 0 forward, 1 dgrad, 2 wgrad (_RUNNERS)."""
        return getattr(impl.conv, _RUNNERS[self.family][index])

    def __repr__(self):
        return 'Window%r' % (self.key(),)


class _WindowOp(Op):
    """``static_shape``: the static shape a gradient op produces; ``from_like``: whether its
    third input is a tensor of that shape (else an int shape vector)."""
    keeps_calls = True   # False: its forward calls the launcher itself (Op.kept stays None)

    def __init__(self, window, static_shape=None, from_like=True):
        self.window = window
        self.static_shape = static_shape
        self.from_like = from_like
        # The call of the step's last problem, ``self._call(impl, *arrays)`` (the family's
        # runner with this problem's pads and result shape bound, all read from the shapes), is
        # kept with the arrays' signature (prepared.Kept), so a step that sees the same shapes
        # again skips reading them. A result shape read from a shape vector's values (not
        # ``from_like``) is never kept.
        if self.keeps_calls:
            self.kept = prepared.Kept(keeps=from_like)
        # a gradient's result shape read from a shape vector's values (third input)
        self.shape_from_values = slice(0, 0) if from_like else slice(2, None)


class ConvFwd(_WindowOp):
    """y = conv(x, w)."""

    def infer(self, x, w):
        _check_float(self.window.where, 'x', x.dtype)
        return Meta(self.output_shape(x.shape, w.shape), x.dtype)

    def output_shape(self, x_shape, w_shape):
        win = self.window
        win.check_x_w('x', x_shape, w_shape)
        out = win.out_spatial(spatial_dims(x_shape, win.channels_first), w_shape[:win.rank],
                              'x', x_shape, w_shape)
        return assemble_shape(x_shape[0], win.out_channels(w_shape), out, win.channels_first)

    def forward(self, impl, x, w):
        return self.kept.run(impl, (x, w), self._call)

    def _call(self, impl, x, w):
        win = self.window
        if x.shape[0] == 0:  # an empty batch: an empty result, as in TensorFlow
            shape = self.output_shape(x.shape, w.shape)
            return lambda x, w: impl.xp.zeros(shape, x.dtype)
        geometry = (win.strides, win.dilation, win.pads(spatial_dims(x.shape, win.channels_first), w.shape[:win.rank]),
                    win.data_format)
        # the launcher's runner: checked and set up once (runtime/prepared.py)
        return win.runner(impl, 0)(x, w, *geometry)

    def grad(self, inputs, outputs, output_grads):
        x, w = inputs
        g = output_grads[0]
        return [apply(ConvDgrad(self.window, x.shape), g, w, x),
                apply(ConvWgrad(self.window, w.shape), x, g, w)]


class ConvDgrad(_WindowOp):
    """dx = conv_dgrad(dy, w) for an x of shape ``static_shape`` (the runtime shape comes
    from the third input); also the forward of a transposed convolution."""

    def infer(self, dy, w, x_shape_source):
        win = self.window
        _check_float(win.where, 'x', dy.dtype)
        win.check_dy(dy.shape, w.shape)
        x_shape = self.static_shape
        win.check_x_w('output_shape', x_shape, w.shape)
        out = win.out_spatial(spatial_dims(x_shape, win.channels_first), w.shape[:win.rank],
                              'output_shape', x_shape, w.shape)
        dy_spatial = spatial_dims(dy.shape, win.channels_first)
        if any(a is not None and b is not None and a != b for a, b in zip(out, dy_spatial)):
            raise ValueError('%s: output_shape %s convolved with the kernel of shape %s gives '
                             'spatial shape %s, but the input of shape %s has spatial shape %s'
                             % (win.where, x_shape, w.shape, out, dy.shape, dy_spatial))
        if None not in (x_shape[0], dy.shape[0]) and x_shape[0] != dy.shape[0]:
            raise ValueError('%s: batch size of output_shape %s and of the input of shape %s '
                             'differ' % (win.where, x_shape, dy.shape))
        # Entries unknown in output_shape may be known from dy (batch) or w (channels).
        batch = x_shape[0] if x_shape[0] is not None else dy.shape[0]
        channels = channel_dim(x_shape, win.channels_first)
        channels = w.shape[-2] if channels is None else channels
        return Meta(assemble_shape(batch, channels, spatial_dims(x_shape, win.channels_first),
                                   win.channels_first), dy.dtype)

    def forward(self, impl, dy, w, x_shape_source):
        return self.kept.run(impl, (dy, w, x_shape_source), self._call)

    def _call(self, impl, dy, w, x_shape_source):
        win = self.window
        x_shape = _runtime_shape(x_shape_source, self.from_like)
        if dy.shape[0] == 0:
            return lambda dy, w, _: impl.xp.zeros(x_shape, dy.dtype)
        geometry = (x_shape, win.strides, win.dilation, win.pads(spatial_dims(x_shape, win.channels_first),
                                                                 w.shape[:win.rank]), win.data_format)
        run = win.runner(impl, 1)(dy, w, *geometry)   # the launcher's runner, as ConvFwd's
        return prepared.reordered(run, lambda dy, w, _: (dy, w))

    def grad(self, inputs, outputs, output_grads):
        dy, w, _ = inputs
        g = output_grads[0]
        return [apply(ConvFwd(self.window), g, w),
                apply(ConvWgrad(self.window, w.shape), g, dy, w),
                None]


class ConvWgrad(_WindowOp):
    """dw = conv_wgrad(x, dy) for a kernel of shape ``static_shape``."""

    def infer(self, x, dy, w_shape_source):
        win = self.window
        _check_float(win.where, 'x', x.dtype)
        w_shape = self.static_shape
        win.check_x_w('x', x.shape, w_shape)
        win.check_dy(dy.shape, w_shape)
        return Meta(w_shape, x.dtype)

    def forward(self, impl, x, dy, w_shape_source):
        return self.kept.run(impl, (x, dy, w_shape_source), self._call)

    def _call(self, impl, x, dy, w_shape_source):
        win = self.window
        w_shape = _runtime_shape(w_shape_source, self.from_like)
        if x.shape[0] == 0:  # no samples: no gradient
            return lambda x, dy, _: impl.xp.zeros(w_shape, x.dtype)
        geometry = (w_shape, win.strides, win.dilation, win.pads(spatial_dims(x.shape, win.channels_first),
                                                                 w_shape[:win.rank]), win.data_format)
        run = win.runner(impl, 2)(x, dy, *geometry)   # the launcher's runner, as ConvFwd's
        return prepared.reordered(run, lambda x, dy, _: (x, dy))

    def grad(self, inputs, outputs, output_grads):
        x, dy, _ = inputs
        g = output_grads[0]
        return [apply(ConvDgrad(self.window, x.shape), dy, g, x),
                apply(ConvFwd(self.window), x, g),
                None]


def conv(x, w, window):
    """Convolution (or depthwise convolution) of tensor x with kernel w."""
    return apply(ConvFwd(window), x, w)


def conv_transpose(x, w, output_static, output_vector, window):
    """Transposed convolution: the data gradient of a convolution producing
    ``output_static`` (static shape, None entries allowed; runtime shape ``output_vector``)
    whose output would be x. w is (*k, out_channels, in_channels)."""
    return apply(ConvDgrad(window, tuple(output_static), from_like=False), x, w, output_vector)


# ---------------------------------------------------------------- locally connected

class LocalWindow:
    """The static attributes of a locally connected convolution (no padding, no dilation)."""

    def __init__(self, where, kernel_size, strides, output_spatial, data_format):
        rank = len(output_spatial)
        self.where = where
        self.kernel_size = geometry.normalize_positive_tuple(kernel_size, rank, where,
                                                             'kernel_size')
        self.strides = geometry.normalize_positive_tuple(strides, rank, where, 'strides')
        self.output_spatial = geometry.normalize_positive_tuple(output_spatial, rank, where,
                                                                'output_shape')
        self.data_format = geometry.normalize_data_format(data_format, where)

    @property
    def channels_first(self):
        return self.data_format == 'channels_first'

    def args(self):
        return self.kernel_size, self.strides, self.output_spatial, self.data_format

    def __repr__(self):
        return 'LocalWindow%r' % ((self.where,) + self.args(),)

    def check(self, x_name, x_shape, w_shape):
        rank = len(self.output_spatial)
        _check_rank(self.where, x_name, x_shape, rank + 2,
                    '(batch, channels and %d spatial dims)' % rank)
        _check_rank(self.where, 'the kernel', w_shape, 3,
                    '(output positions, kernel volume * in_channels, filters)')
        for n, k, s, o in zip(spatial_dims(x_shape, self.channels_first), self.kernel_size,
                              self.strides, self.output_spatial):
            if n is not None and (o - 1) * s + k > n:
                raise ValueError('%s: output shape %s with kernel_size %s and strides %s reads '
                                 'past the spatial dims of %s of shape %s'
                                 % (self.where, self.output_spatial, self.kernel_size,
                                    self.strides, x_name, x_shape))
        c_in = channel_dim(x_shape, self.channels_first)
        expected = (math.prod(self.output_spatial),
                    None if c_in is None else math.prod(self.kernel_size) * c_in)
        if any(e is not None and g is not None and e != g for e, g in zip(expected, w_shape[:2])):
            raise ValueError('%s: the kernel of shape %s does not fit %s of shape %s: expected '
                             '(%s, %s, filters) = (output positions, kernel volume * channels, '
                             'filters)' % (self.where, w_shape, x_name, x_shape,
                                           expected[0], expected[1]))


class LocalConvFwd(_WindowOp):
    """A locally connected convolution, whose forward (and its gradients') calls the launcher
    itself: no runner is kept (Op.kept), so a plan calls no Kept in its place."""
    keeps_calls = False

    def infer(self, x, w):
        win = self.window
        _check_float(win.where, 'inputs', x.dtype)
        win.check('inputs', x.shape, w.shape)
        return Meta(assemble_shape(x.shape[0], w.shape[-1], win.output_spatial,
                                   win.channels_first), x.dtype)

    def forward(self, impl, x, w):
        return impl.conv.local_conv_fwd(x, w, *self.window.args())

    def grad(self, inputs, outputs, output_grads):
        x, w = inputs
        g = output_grads[0]
        return [apply(LocalConvDgrad(self.window, x.shape), g, w, x),
                apply(LocalConvWgrad(self.window, w.shape), x, g, w)]


class LocalConvDgrad(LocalConvFwd):
    def infer(self, dy, w, x_shape_source):
        self.window.check('x', self.static_shape, w.shape)
        _check_channels(self.window.where, 'dy', dy.shape,
                        channel_dim(dy.shape, self.window.channels_first),
                        'the kernel', w.shape, w.shape[-1])
        return Meta(self.static_shape, dy.dtype)

    def forward(self, impl, dy, w, x_shape_source):
        return impl.conv.local_conv_dgrad(dy, w, _runtime_shape(x_shape_source, self.from_like),
                                          *self.window.args())

    def grad(self, inputs, outputs, output_grads):
        dy, w, _ = inputs
        g = output_grads[0]
        return [apply(LocalConvFwd(self.window), g, w),
                apply(LocalConvWgrad(self.window, w.shape), g, dy, w),
                None]


class LocalConvWgrad(LocalConvFwd):
    def infer(self, x, dy, w_shape_source):
        self.window.check('x', x.shape, self.static_shape)
        return Meta(self.static_shape, x.dtype)

    def forward(self, impl, x, dy, w_shape_source):
        return impl.conv.local_conv_wgrad(x, dy, _runtime_shape(w_shape_source, self.from_like),
                                          *self.window.args())

    def grad(self, inputs, outputs, output_grads):
        x, dy, _ = inputs
        g = output_grads[0]
        return [apply(LocalConvDgrad(self.window, x.shape), dy, g, x),
                apply(LocalConvFwd(self.window), x, g),
                None]


def local_conv(x, w, window):
    """Locally connected convolution of x with unshared kernel w (P, F, filters)."""
    return apply(LocalConvFwd(window), x, w)
