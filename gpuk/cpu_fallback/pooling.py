"""NumPy twins of the pooling kernels (gpuk/kernels/pooling.py).

One N-d implementation (1, 2 or 3 spatial dims). Arrays are (N, *spatial, C)
for 'channels_last' or (N, C, *spatial) for 'channels_first'; `pads` holds one
(before, after) pair per spatial dim (gpuk.contracts.geometry.conv_pads with
dilation 1). Like TensorFlow, padding never takes part: max pooling pads with
-inf and average pooling divides by the number of real inputs in the window.
"""
import math

import numpy as np

from gpuk.cpu_fallback import parallel
from gpuk.contracts import conv_checks, pooling_checks
from gpuk.cpu_fallback.layout import (
    compute_dtype, crop_spatial, from_channels_last, pad_spatial, to_channels_last, window_regions)

__all__ = ['max_pool_fwd', 'max_pool_bwd', 'avg_pool_fwd', 'avg_pool_bwd', 'max_pool_fwd_runner', 'max_pool_bwd_runner',
           'avg_pool_fwd_runner', 'avg_pool_bwd_runner']


def _checked_forward(fn, x, window, strides, pads, data_format):
    """(x, its pooling_checks.PoolSetup): the checks of max_pool_fwd and avg_pool_fwd."""
    x = conv_checks.float_array(fn, 'x', x, bfloat16=False)
    return x, pooling_checks.forward_setup(fn, x, window, strides, pads, data_format)


def max_pool_fwd(x, window, strides, pads, data_format):
    """Max pooling -> (y, argmax).

    argmax (shaped like y, dtype pooling_checks.tap_dtype(window): uint8 up to 256
    taps) is the row-major index of the winner inside its window, taps counted from
    the window's padded start; the first one wins ties, padding never wins.
    """
    x, setup = _checked_forward('max_pool_fwd', x, window, strides, pads, data_format)
    channels_first, _, window, strides, pads, in_spatial, out_spatial = setup
    rank = len(window)
    x_cl = to_channels_last(x, channels_first)
    padded_spatial = [s + b + a for s, (b, a) in zip(in_spatial, pads)]
    y = np.empty((x.shape[0], *out_spatial, x_cl.shape[-1]), x.dtype)
    argmax = np.empty(y.shape, pooling_checks.tap_dtype(window))

    def block_fwd(block):
        # Blocks of output rows sized for L2 (parallel.row_blocks) on parallel's
        # threads; each writes its own rows of y and argmax.
        images, rows = block
        x_block = parallel.padded_rows(
            x_cl, images, rows.start * strides[0], (rows.stop - 1) * strides[0] + window[0],
            [b for b, _ in pads], (1,) * rank, padded_spatial, x.dtype, fill=-np.inf)
        block_out = (rows.stop - rows.start,) + out_spatial[1:]
        y_block, tap = _running_max(x_block, window, strides, block_out)
        y[images, rows] = y_block
        # Window start per output position and dim, shaped to broadcast over (n, *out, C).
        first_rows = (rows.start,) + (0,) * (rank - 1)
        starts = [((np.arange(o) + f) * s - b).reshape((1,) + (1,) * i + (o,) + (1,) * (rank - i))
                  for i, (o, f, s, (b, _)) in enumerate(zip(block_out, first_rows, strides,
                                                            pads))]
        lowest = np.min(y_block)   # cheaper than np.isneginf(y).any(); NaN hides -inf
        if lowest == -np.inf or (np.isnan(lowest) and np.isneginf(y_block).any()):
            argmax[images, rows] = _argmax_off_padding(tap, starts, window, in_spatial)
        else:
            argmax[images, rows] = tap
    row = (math.prod(padded_spatial[1:]) * strides[0] * x.itemsize +
           math.prod(out_spatial[1:]) * (x.itemsize + argmax.itemsize + 2)) * x_cl.shape[-1]
    # 4x parallel's default block: this loop makes ~4 small ufunc calls per tap and
    # block, and at 1 MiB the call overhead measured 25 ms against 14 ms at 4 MiB
    # (N=8 112^2x64 3x3/2, 2 threads); the running max then streams from L3.
    parallel.run_blocks(block_fwd, parallel.row_blocks(x.shape[0], out_spatial[0], row,
                                                       4 * parallel.BLOCK_BYTES))
    return (from_channels_last(y, channels_first, x.dtype),
            from_channels_last(argmax, channels_first, argmax.dtype))


def _running_max(padded, window, strides, out_spatial, nan_aware=False):
    """(y, tap): the window max of (N, *S_padded, C) and the index of its first winning tap.

    A loop over the taps keeps a running max over whole (N, *out, C) blocks with
    branch-free ufuncs: the tap index only grows, so "tap = index where better"
    is max(tap, better * index). np.argmax over a (..., taps) window copy, and
    masked copies (np.copyto where=), measured ~8x slower. Ties keep the earlier
    tap and NaN wins, like np.argmax; the NaN-aware test costs three more passes
    per tap, so it only runs again with nan_aware when a window holds a NaN.
    """
    rank = len(window)
    regions = [region for _, region in window_regions(out_spatial, window, strides, (1,) * rank)]
    y = padded[(slice(None),) + regions[0]].copy()
    tap_dtype = np.min_scalar_type(len(regions) - 1)
    tap = np.zeros(y.shape, tap_dtype)
    better = np.empty(y.shape, bool)
    candidate_tap = np.empty(y.shape, tap_dtype)
    for index, region in enumerate(regions[1:], start=1):
        candidate = padded[(slice(None),) + region]
        np.greater(candidate, y, out=better)
        if nan_aware:
            better |= np.isnan(candidate) & ~np.isnan(y)
        # as uint8 the product needs no cast: a casting ufunc buffers and keeps the GIL
        np.multiply(better.view(np.uint8), tap_dtype.type(index), out=candidate_tap)
        np.maximum(tap, candidate_tap, out=tap)
        np.maximum(y, candidate, out=y)    # NaN propagates: a window with a NaN gets NaN
    if not nan_aware and np.isnan(y).any():
        # the plain test let later taps win over a NaN; redo those with the NaN rule
        return _running_max(padded, window, strides, out_spatial, nan_aware=True)
    return y, tap


def _argmax_off_padding(tap, starts, window, in_spatial):
    """Winner taps when some window is all -inf.

    There the first tap of the tie may be padding; padding never wins, so such
    a window reports its first real element (its value is -inf too).
    """
    offsets = np.unravel_index(tap, window)
    in_padding = np.zeros(tap.shape, bool)
    for start, t, size in zip(starts, offsets, in_spatial):
        in_padding |= (start + t < 0) | (start + t >= size)
    offsets = [np.where(in_padding, np.maximum(start, 0) - start, t)
               for start, t in zip(starts, offsets)]
    return np.ravel_multi_index(offsets, window)


def max_pool_bwd(dy, argmax, x_shape, window, strides, pads, data_format):
    """Gradient of max_pool_fwd: dy added at the winners (argmax: window taps) of dx.

    Each dx element sums, in output order, the dy of the windows it won: the order of
    the kernels' gather, so results agree bit for bit. A tap outside its window (or on
    padding) adds nothing.
    """
    fn = 'max_pool_bwd'
    dy = conv_checks.float_array(fn, 'dy', dy, bfloat16=False)
    argmax = np.asarray(argmax)
    setup = pooling_checks.max_backward_setup(fn, dy, argmax, x_shape, window, strides, pads, data_format)
    channels_first, x_shape, in_spatial = setup.channels_first, setup.x_shape, setup.in_spatial
    volume = math.prod(in_spatial)
    n, channels = x_shape[0], conv_checks.channel_count(x_shape, channels_first)
    positions, valid = pooling_checks.window_positions(np, argmax, setup)
    # Flat index into dx in channels_last order: (n * volume + position) * C + c.
    flat = to_channels_last(positions, channels_first).reshape(n, -1, channels)
    flat *= channels
    flat += (np.arange(n)[:, None, None] * (volume * channels)
             + np.arange(channels)[None, None, :])
    compute = compute_dtype(dy.dtype)
    weights = to_channels_last(dy, channels_first).astype(compute, copy=False)
    flat, weights = flat.ravel(), weights.ravel()
    if not valid.all():
        keep = to_channels_last(valid, channels_first).ravel()
        flat, weights = flat[keep], weights[keep]
    # NumPy 2's np.add.at measured 2x faster than bincount (which fills a float64
    # array); it adds in output order, in float32 for float16 inputs (one rounding
    # at the end, like the kernels' float accumulator).
    dx = np.zeros(n * volume * channels, compute)
    np.add.at(dx, flat, weights)
    return from_channels_last(dx.reshape(n, *in_spatial, channels), channels_first, dy.dtype)


def _window_counts(in_spatial, out_spatial, window, strides, pads, dtype):
    """Number of real (un-padded) inputs in each window, shaped (1, *out, 1), in `dtype`."""
    rank = len(in_spatial)
    counts = np.ones((1,) * (rank + 2), np.int64)
    for i, (size, o, k, s, (b, _)) in enumerate(zip(in_spatial, out_spatial, window,
                                                    strides, pads)):
        start = np.arange(o) * s - b
        per_dim = np.minimum(start + k, size) - np.maximum(start, 0)
        counts = counts * per_dim.reshape((1,) + (1,) * i + (o,) + (1,) * (rank - i))
    return counts.astype(dtype)


def avg_pool_fwd(x, window, strides, pads, data_format):
    """Average pooling over the real inputs of each window (padding excluded)."""
    x, setup = _checked_forward('avg_pool_fwd', x, window, strides, pads, data_format)
    channels_first, _, window, strides, pads, in_spatial, out_spatial = setup
    rank = len(window)
    compute = compute_dtype(x.dtype)
    padded = pad_spatial(to_channels_last(x, channels_first), pads, compute)
    total = np.zeros((x.shape[0], *out_spatial, padded.shape[-1]), compute)
    for _, region in window_regions(out_spatial, window, strides, (1,) * rank):
        total += padded[(slice(None),) + region]
    total /= _window_counts(in_spatial, out_spatial, window, strides, pads, compute)
    return from_channels_last(total, channels_first, x.dtype)


def avg_pool_bwd(dy, x_shape, window, strides, pads, data_format):
    """Gradient of avg_pool_fwd with respect to x."""
    dy = conv_checks.float_array('avg_pool_bwd', 'dy', dy, bfloat16=False)
    setup = pooling_checks.avg_backward_setup(
        'avg_pool_bwd', dy, x_shape, window, strides, pads, data_format)
    channels_first, _, window, strides, pads, in_spatial, out_spatial = setup
    rank = len(window)
    compute = compute_dtype(dy.dtype)
    share = to_channels_last(dy, channels_first).astype(compute) / \
        _window_counts(in_spatial, out_spatial, window, strides, pads, compute)
    padded_spatial = [s + b + a for s, (b, a) in zip(in_spatial, pads)]
    dx = np.zeros((dy.shape[0], *padded_spatial, share.shape[-1]), compute)
    for _, region in window_regions(out_spatial, window, strides, (1,) * rank):
        dx[(slice(None),) + region] += share
    return from_channels_last(crop_spatial(dx, pads, in_spatial), channels_first, dy.dtype)


def max_pool_fwd_runner(x, window, strides, pads, data_format):
    """``run(x)``: max_pool_fwd with this geometry (what a MaxPool plan step keeps between calls;
    the checks run per call here, as in max_pool_fwd)."""
    return lambda x: max_pool_fwd(x, window, strides, pads, data_format)


def max_pool_bwd_runner(dy, argmax, x_shape, window, strides, pads, data_format):
    """``run(dy, argmax)``: max_pool_bwd with this x_shape and geometry (what a MaxPoolBwd plan
    step keeps; checked per call here, as in max_pool_bwd)."""
    return lambda dy, argmax: max_pool_bwd(dy, argmax, x_shape, window, strides, pads, data_format)


def avg_pool_fwd_runner(x, window, strides, pads, data_format):
    """``run(x)``: avg_pool_fwd with this geometry (what an AvgPool plan step keeps between calls;
    the checks run per call here, as in avg_pool_fwd)."""
    return lambda x: avg_pool_fwd(x, window, strides, pads, data_format)


def avg_pool_bwd_runner(dy, x_shape, window, strides, pads, data_format):
    """``run(dy)``: avg_pool_bwd with this x_shape and geometry (what an AvgPoolBwd plan step
    keeps; checked per call here, as in avg_pool_bwd)."""
    return lambda dy: avg_pool_bwd(dy, x_shape, window, strides, pads, data_format)
