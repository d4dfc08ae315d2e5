"""Argument checks of the pooling family, shared by the NumPy twin
(gpuk/cpu_fallback/pooling.py) and the CUDA launcher (gpuk/kernels/pooling.py), so both
raise the same errors, with the same messages, before any work.

Arrays reach these functions already checked for dtype by the caller (NumPy or CuPy);
only shapes and the geometry are read here, never argmax values (window_positions
turns them into positions with the caller's xp, on the caller's device).
"""
import math
from collections import namedtuple

import numpy as np

from gpuk.contracts import conv_checks
from gpuk.contracts import geometry

# A checked pooling problem. x_shape is the input's shape (forward: x.shape).
PoolSetup = namedtuple('PoolSetup', 'channels_first x_shape window strides pads in_spatial out_spatial')


def pool_params(fn, rank, window, strides, pads):
    window = geometry.normalize_positive_tuple(window, rank, fn, 'window')
    strides = geometry.normalize_positive_tuple(strides, rank, fn, 'strides')
    pads = geometry.normalize_pads(pads, rank, fn)
    # A pad as wide as the window would allow windows made only of padding,
    # whose max or average is undefined; TensorFlow's 'same' never does that.
    if any(b >= k or a >= k for k, (b, a) in zip(window, pads)):
        raise ValueError('%s: pads %s must be smaller than window %s in every dimension'
                         % (fn, pads, window))
    return window, strides, pads


def check_x_shape(fn, x_shape, dy, channels_first):
    """x_shape as a tuple of dy's rank, with dy's batch and channel counts."""
    x_shape = conv_checks.shape_tuple(fn, 'x_shape', x_shape, dy.ndim)
    if x_shape[0] != dy.shape[0] or \
            conv_checks.channel_count(x_shape, channels_first) != conv_checks.channel_count(dy.shape, channels_first):
        raise ValueError('%s: batch and channels of dy (shape %s) and x_shape %s differ'
                         % (fn, dy.shape, x_shape))
    return x_shape


def _setup(fn, x_shape, rank, window, strides, pads, channels_first):
    window, strides, pads = pool_params(fn, rank, window, strides, pads)
    in_spatial = conv_checks.spatial_dims(x_shape, channels_first)
    out_spatial = conv_checks.output_spatial(fn, in_spatial, window, strides, (1,) * rank, pads, 'window')
    return PoolSetup(channels_first, tuple(x_shape), window, strides, pads, in_spatial, tuple(out_spatial))


def forward_setup(fn, x, window, strides, pads, data_format):
    """The PoolSetup of max_pool_fwd / avg_pool_fwd on a dtype-checked x."""
    channels_first = conv_checks.is_channels_first(fn, data_format)
    rank = conv_checks.spatial_rank(fn, 'x', x)
    return _setup(fn, x.shape, rank, window, strides, pads, channels_first)


def avg_backward_setup(fn, dy, x_shape, window, strides, pads, data_format):
    """The PoolSetup of avg_pool_bwd on a dtype-checked dy (whose spatial shape must be the output's)."""
    channels_first = conv_checks.is_channels_first(fn, data_format)
    rank = conv_checks.spatial_rank(fn, 'dy', dy)
    x_shape = check_x_shape(fn, x_shape, dy, channels_first)
    setup = _setup(fn, x_shape, rank, window, strides, pads, channels_first)
    got = conv_checks.spatial_dims(dy.shape, channels_first)
    if got != setup.out_spatial:
        raise ValueError('%s: dy spatial shape %s does not match the pooled spatial shape '
                         '%s of x_shape %s' % (fn, got, setup.out_spatial, x_shape))
    return setup


def tap_dtype(window):
    """The dtype of max pooling's argmax output: the winner's row-major index inside its
    window (taps counted from the window's padded start), 1 byte while a window has at most
    256 taps, int32 beyond."""
    return np.dtype(np.uint8 if math.prod(window) <= 256 else np.int32)


def max_backward_setup(fn, dy, argmax, x_shape, window, strides, pads, data_format):
    """The PoolSetup of max_pool_bwd on a dtype-checked dy.

    argmax (NumPy or CuPy) must be integers shaped like dy: window tap indices (tap_dtype).
    Their values are not read here (on a GPU that would be a host sync): a tap outside the
    window adds nothing, in the kernels and the twin alike.
    """
    if argmax.dtype.kind not in 'iu':
        raise TypeError('%s: argmax must be an integer array, got dtype %s' % (fn, argmax.dtype))
    if argmax.shape != dy.shape:
        raise ValueError('%s: argmax shape %s and dy shape %s differ' % (fn, argmax.shape, dy.shape))
    return avg_backward_setup(fn, dy, x_shape, window, strides, pads, data_format)


def window_positions(xp, tap, setup):
    """(positions, valid): the flat index in the spatial volume of x of each tap of `tap`
    (shaped like the pooled output, in setup's data format), and where that tap is a real
    input element of its window (False for taps past the window or on padding)."""
    rank = len(setup.window)
    first_spatial = 2 if setup.channels_first else 1
    tap = tap.astype(np.int64)
    valid = (tap >= 0) & (tap < math.prod(setup.window))
    remaining = xp.where(valid, tap, 0)
    positions = xp.zeros(tap.shape, np.int64)
    for dim in range(rank):
        inner_taps = math.prod(setup.window[dim + 1:])
        offset = remaining // inner_taps
        remaining = remaining - offset * inner_taps
        shape = [1] * tap.ndim
        shape[first_spatial + dim] = setup.out_spatial[dim]
        starts = (xp.arange(setup.out_spatial[dim], dtype=np.int64) * setup.strides[dim]
                  - setup.pads[dim][0]).reshape(shape)
        coord = starts + offset
        valid &= (coord >= 0) & (coord < setup.in_spatial[dim])
        positions = positions * setup.in_spatial[dim] + coord
    return xp.where(valid, positions, 0), valid
