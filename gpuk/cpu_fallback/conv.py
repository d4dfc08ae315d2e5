"""NumPy twins of the convolution kernels (gpuk/kernels/conv/__init__.py).

One N-d implementation (1, 2 or 3 spatial dims) for every function. Arrays are
(N, *spatial, C) for 'channels_last' or (N, C, *spatial) for 'channels_first';
kernels use the Keras layout (*kernel_spatial, C_in, C_out). `pads` holds one
(before, after) pair per spatial dim (see gpuk.contracts.geometry.conv_pads).
Cross-correlation, like every Keras backend.

How: work in channels_last, pad once, view the windows with stride tricks,
and run one BLAS matmul. Gradients with respect to the input scatter the
window columns back (col2im) with a loop over kernel taps only.
float16 and bfloat16 (ml_dtypes.bfloat16) are computed in float32 and returned in
their own dtype.
"""
import math

import numpy as np

from gpuk.contracts import conv_checks as checks
from gpuk.cpu_fallback import parallel
from gpuk.cpu_fallback.layout import (
    compute_dtype, crop_spatial, from_channels_last, gather_windows, pad_spatial, scatter_windows,
    to_channels_last)
from gpuk.contracts import geometry

__all__ = [
    'conv_fwd', 'conv_dgrad', 'conv_wgrad', 'conv_fwd_runner', 'conv_dgrad_runner', 'conv_wgrad_runner',
    'depthwise_conv_fwd', 'depthwise_conv_dgrad', 'depthwise_conv_wgrad', 'depthwise_conv_fwd_runner',
    'depthwise_conv_dgrad_runner', 'depthwise_conv_wgrad_runner',
    'local_conv_fwd', 'local_conv_dgrad', 'local_conv_wgrad',
]


# ---------------------------------------------------------------- shared convolution

def _matmul_tall(a, b, out=None):
    """a @ b for 2-D a, b (into `out` if given), as (b.T @ a.T).T when the product is wide.

    With 2 OpenBLAS threads on a busy host, sgemm measured 5-20x slower when the
    product has fewer rows than columns (e.g. 256 x 1568 @ 1568 x 1024: 11 GFLOP/s,
    its transpose 51 GFLOP/s); on an idle host both run alike. Same sums either way.
    """
    if a.shape[0] >= b.shape[1]:
        return np.matmul(a, b, out=out)
    product = (b.T @ a.T).T
    if out is None:
        return product
    out[...] = product
    return out


# im2col copies the windows of a block of images at a time into one reused buffer of
# at most this size (or one image): a whole-batch copy (9x the input for 3x3) is a
# fresh mmap the kernel faults in page by page, measured ~40% of a 3x3 conv's time;
# under glibc's 32 MiB mmap threshold the buffer's pages come back from the heap.
COLUMN_BLOCK_BYTES = 16 << 20


def _window_column_blocks(padded, kernel_spatial, strides, dilation):
    """Yields (images, columns): a slice of the batch and its im2col matrix
    (rows: image-major output positions, columns: (*kernel, C) taps).

    Where every window is one pixel (1x1 kernel, unit strides) the padded input is
    already that matrix; otherwise blocks of images are copied into one buffer.
    """
    windows = gather_windows(padded, kernel_spatial, strides, dilation)
    n, width = windows.shape[0], math.prod(windows.shape[len(kernel_spatial) + 1:])
    if all(k == 1 for k in kernel_spatial) and all(s == 1 for s in strides):
        yield slice(0, n), padded.reshape(-1, width)
        return
    per_image = math.prod(windows.shape[1:]) * windows.itemsize
    step = max(1, min(n, COLUMN_BLOCK_BYTES // per_image))
    buffer = np.empty((step,) + windows.shape[1:], windows.dtype)
    for start in range(0, n, step):
        images = slice(start, min(start + step, n))
        block = buffer[:images.stop - start]
        np.copyto(block, windows[images])
        yield images, block.reshape(-1, width)


def _conv_channels_last(x_cl, w, strides, dilation, pads, out_spatial, compute):
    """The convolution itself: (N, *S, C_in) -> (N, *out, C_out) in `compute`."""
    kernel_spatial, c_out = w.shape[:-2], w.shape[-1]
    padded = pad_spatial(x_cl, pads, compute)
    w_matrix = w.reshape(-1, c_out).astype(compute, copy=False)
    y = np.empty((x_cl.shape[0], math.prod(out_spatial), c_out), compute)
    for images, columns in _window_column_blocks(padded, kernel_spatial, strides, dilation):
        _matmul_tall(columns, w_matrix, out=y[images].reshape(-1, c_out))
    return y.reshape(x_cl.shape[0], *out_spatial, c_out)


EPILOGUES = (None, 'bias', 'bias_relu')


def _check_epilogue(fn, epilogue, bias, c_out, dtype):
    """The launcher's checks of ``epilogue`` and ``bias`` (same messages)."""
    if epilogue not in EPILOGUES:
        raise ValueError("%s: epilogue must be None, 'bias' or 'bias_relu', got %r" % (fn, epilogue))
    if epilogue is None:
        if bias is not None:
            raise ValueError("%s: bias is only used with epilogue='bias' or 'bias_relu', "
                             "got epilogue=None" % fn)
        return
    if not isinstance(bias, np.ndarray):
        raise TypeError('%s: bias must be a numpy.ndarray of shape (%d,) with epilogue=%r, got %s'
                        % (fn, c_out, epilogue, type(bias).__name__))
    if bias.shape != (c_out,):
        raise ValueError('%s: bias must have shape (%d,) (C_out), got %s'
                         % (fn, c_out, tuple(bias.shape)))
    if bias.dtype != dtype:
        raise TypeError('%s: bias.dtype must equal x.dtype (%s), got %s' % (fn, dtype, bias.dtype))


def conv_fwd(x, w, strides, dilation, pads, data_format, *, epilogue=None, bias=None):
    """Convolution (cross-correlation) of x with w -> y; with ``epilogue='bias'`` y + bias
    (bias of shape (C_out,), along the channel axis), with ``'bias_relu'`` relu(y + bias).
    The epilogue runs in the compute dtype before the one rounding to x.dtype, as the
    kernel's does; relu keeps NaN."""
    fn = 'conv_fwd'
    x, w, shapes = checks.fwd_problem(fn, x, w, strides, dilation, pads, data_format)
    channels_first, strides, dilation, pads = shapes.channels_first, shapes.strides, shapes.dilation, shapes.pads
    out_spatial = shapes.out_spatial
    _check_epilogue(fn, epilogue, bias, w.shape[-1], x.dtype)
    compute = compute_dtype(x.dtype)
    y = _conv_channels_last(to_channels_last(x, channels_first), w, strides, dilation,
                            pads, out_spatial, compute)
    if epilogue is not None:
        y += bias.astype(compute, copy=False)       # y is channels_last here
        if epilogue == 'bias_relu':
            np.maximum(y, 0, out=y)                 # np.maximum propagates NaN
    return from_channels_last(y, channels_first, x.dtype)


def conv_dgrad(dy, w, x_shape, strides, dilation, pads, data_format):
    """Gradient of conv_fwd with respect to x (also the forward of conv_transpose)."""
    fn = 'conv_dgrad'
    dy, w, x_shape, shapes = checks.dgrad_problem(fn, dy, w, x_shape, strides, dilation, pads, data_format)
    (channels_first, rank, _, c_in, _, in_spatial, out_spatial, kernel_spatial, strides, dilation,
     pads) = shapes
    compute = compute_dtype(dy.dtype)
    c_out = w.shape[-1]
    dy_cl = to_channels_last(dy, channels_first).astype(compute, copy=False)
    extents = [geometry.dilated_size(k, d) for k, d in zip(kernel_spatial, dilation)]
    if all(s == 1 for s in strides) and \
            all(max(p) <= e - 1 for p, e in zip(pads, extents)):
        # Unit strides: dx is the convolution of dy with the flipped, transposed
        # kernel (no scatter, measured ~20% faster); strided dgrad would need
        # zeros inserted into dy, so it scatters below instead.
        flipped = w[(slice(None, None, -1),) * rank].swapaxes(-1, -2)
        flipped_pads = tuple((e - 1 - b, e - 1 - a) for e, (b, a) in zip(extents, pads))
        dx = _conv_channels_last(dy_cl, flipped, strides, dilation, flipped_pads,
                                 in_spatial, compute)
        return from_channels_last(dx, channels_first, dy.dtype)
    columns = _matmul_tall(dy_cl.reshape(-1, c_out),
                           w.reshape(-1, c_out).astype(compute, copy=False).T)
    columns = columns.reshape(dy.shape[0], *out_spatial, *kernel_spatial, c_in)
    padded_spatial = [s + b + a for s, (b, a) in zip(in_spatial, pads)]
    dx = scatter_windows(columns, padded_spatial, strides, dilation, compute)
    return from_channels_last(crop_spatial(dx, pads, in_spatial), channels_first, dy.dtype)


def conv_wgrad(x, dy, w_shape, strides, dilation, pads, data_format):
    """Gradient of conv_fwd with respect to w."""
    fn = 'conv_wgrad'
    x, dy, w_shape, shapes = checks.wgrad_problem(fn, x, dy, w_shape, strides, dilation, pads, data_format)
    (channels_first, rank, _, c_in, c_out, _, out_spatial, kernel_spatial, strides, dilation,
     pads) = shapes
    compute = compute_dtype(x.dtype)
    padded = pad_spatial(to_channels_last(x, channels_first), pads, compute)
    dy_cl = to_channels_last(dy, channels_first).astype(compute, copy=False)
    dw = np.zeros((math.prod(kernel_spatial) * c_in, c_out), compute)
    for images, columns in _window_column_blocks(padded, kernel_spatial, strides, dilation):
        dw += _matmul_tall(columns.T, dy_cl[images].reshape(-1, c_out))
    return dw.reshape(w_shape).astype(x.dtype, copy=False)


# ---------------------------------------------------------------- depthwise

# Depthwise convolutions are one np.einsum per block over a window view: einsum's
# sum-of-products runs all taps as fused multiply-adds into the output, measured
# ~2x faster than a multiply and an add per tap, and an im2col copy plus one tiny
# matmul per channel measured 30-60x slower than PyTorch. The kernel is tiled along
# the last output dim so einsum's inner loop spans a whole row (W * C) instead of C.
# The batch runs in blocks of images / rows (parallel.row_blocks) spread over
# parallel.run_blocks' threads; each block writes its own rows of the output, and
# wgrad sums per-block partials in block order, so threads never change a result.

_OUT, _TAPS = 'ijk', 'pqr'     # einsum letters for output and kernel spatial dims


# ---------------------------------------------------------------- runners (what a plan step keeps)

def conv_fwd_runner(x, w, strides, dilation, pads, data_format, *, epilogue=None, bias=None):
    """``run(x, w, bias=None)``: conv_fwd with this geometry and epilogue (what a ConvFwd plan step
    keeps between calls; the checks run per call here, as in conv_fwd)."""
    return lambda x, w, bias=None: conv_fwd(x, w, strides, dilation, pads, data_format, epilogue=epilogue,
                                            bias=bias)


def conv_dgrad_runner(dy, w, x_shape, strides, dilation, pads, data_format):
    """``run(dy, w)``: conv_dgrad with this x_shape and geometry (what a ConvDgrad plan step keeps;
    checked per call here, as in conv_dgrad)."""
    return lambda dy, w: conv_dgrad(dy, w, x_shape, strides, dilation, pads, data_format)


def conv_wgrad_runner(x, dy, w_shape, strides, dilation, pads, data_format):
    """``run(x, dy)``: conv_wgrad with this w_shape and geometry (what a ConvWgrad plan step keeps;
    checked per call here, as in conv_wgrad)."""
    return lambda x, dy: conv_wgrad(x, dy, w_shape, strides, dilation, pads, data_format)


def depthwise_conv_fwd_runner(x, w, strides, dilation, pads, data_format):
    """``run(x, w)``: depthwise_conv_fwd with this geometry (checked per call here)."""
    return lambda x, w: depthwise_conv_fwd(x, w, strides, dilation, pads, data_format)


def depthwise_conv_dgrad_runner(dy, w, x_shape, strides, dilation, pads, data_format):
    """``run(dy, w)``: depthwise_conv_dgrad with this x_shape and geometry (checked per call here)."""
    return lambda dy, w: depthwise_conv_dgrad(dy, w, x_shape, strides, dilation, pads, data_format)


def depthwise_conv_wgrad_runner(x, dy, w_shape, strides, dilation, pads, data_format):
    """``run(x, dy)``: depthwise_conv_wgrad with this w_shape and geometry (checked per call here)."""
    return lambda x, dy: depthwise_conv_wgrad(x, dy, w_shape, strides, dilation, pads, data_format)


def _depthwise_kernel(kernel, rank, c_in, multiplier, row, compute):
    """(*k, C_in, M) -> (*k, row, C_in, M) in `compute`, tiled over the last output dim
    (kept (*k, C_in, M) in 1-d, where that dim is the one split into blocks)."""
    if rank == 1:
        return kernel.astype(compute)
    kernel = kernel.reshape(*kernel.shape[:rank], 1, c_in, multiplier)
    return np.ascontiguousarray(np.broadcast_to(kernel, kernel.shape[:rank] +
                                                (row, c_in, multiplier)), dtype=compute)


def _depthwise_blocks(n, rows, row_elements, itemsize):
    """parallel.row_blocks sized by the elements one row of every array touches."""
    return parallel.row_blocks(n, rows, row_elements * itemsize)


def _input_rows(rows, stride, extent):
    """Padded input rows [first, stop) (first spatial dim) read by output rows `rows`."""
    return rows.start * stride, (rows.stop - 1) * stride + extent


def depthwise_conv_fwd(x, w, strides, dilation, pads, data_format):
    """Depthwise convolution; w is (*k, C_in, M), output channel c*M + m like TensorFlow."""
    fn = 'depthwise_conv_fwd'
    x, w = checks.float_array(fn, 'x', x), checks.float_array(fn, 'w', w)
    checks.same_dtype(fn, [('x', x), ('w', w)])
    (channels_first, rank, strides, dilation, pads, c_in, multiplier, in_spatial,
     out_spatial) = checks.depthwise_fwd_setup(fn, x, w, strides, dilation, pads, data_format)
    kernel_spatial = w.shape[:rank]
    compute = compute_dtype(x.dtype)
    x_cl = to_channels_last(x, channels_first)
    kernel = _depthwise_kernel(w, rank, c_in, multiplier, out_spatial[-1], compute)
    y = np.empty((x.shape[0], *out_spatial, c_in, multiplier), compute)
    padded_spatial = [s + b + a for s, (b, a) in zip(in_spatial, pads)]
    extent = geometry.dilated_size(kernel_spatial[0], dilation[0])
    o, k = _OUT[:rank], _TAPS[:rank]
    subscripts = 'n%s%sc,%s%scm->n%scm' % (o, k, k, o[1:][-1:], o)

    def block_fwd(block):
        images, rows = block
        x_block = parallel.padded_rows(x_cl, images, *_input_rows(rows, strides[0], extent),
                                       [b for b, _ in pads], (1,) * rank, padded_spatial,
                                       compute)
        windows = gather_windows(x_block, kernel_spatial, strides, dilation)
        np.einsum(subscripts, windows, kernel, out=y[images, rows])
    row = math.prod(padded_spatial[1:]) * c_in * strides[0] + \
        math.prod(out_spatial[1:]) * c_in * multiplier
    parallel.run_blocks(block_fwd, _depthwise_blocks(x.shape[0], out_spatial[0], row,
                                                     compute.itemsize))
    y = y.reshape(x.shape[0], *out_spatial, c_in * multiplier)
    return from_channels_last(y, channels_first, x.dtype)


def _depthwise_dy(fn, dy, channels_first, c_in, multiplier, w_name, w_shape):
    """dy as channels_last (N, *out, C_in * M), after checking its channel count."""
    c_out = checks.channel_count(dy.shape, channels_first)
    checks.check_channels(fn, 'the channel count', 'dy', dy.shape, c_out, w_name, w_shape,
                          c_in * multiplier)
    return to_channels_last(dy, channels_first)


def depthwise_conv_dgrad(dy, w, x_shape, strides, dilation, pads, data_format):
    """Gradient of depthwise_conv_fwd with respect to x."""
    fn = 'depthwise_conv_dgrad'
    dy, w, x_shape, channels_first, rank, strides, dilation, pads = checks.dgrad_setup(
        fn, dy, w, x_shape, strides, dilation, pads, data_format)
    c_in = checks.channel_count(x_shape, channels_first)
    checks.check_channels(fn, 'the channel count', 'x_shape', x_shape, c_in, 'w', w.shape,
                          w.shape[-2])
    in_spatial = checks.spatial_dims(x_shape, channels_first)
    kernel_spatial, multiplier = w.shape[:rank], w.shape[-1]
    out_spatial = checks.output_spatial(fn, in_spatial, kernel_spatial, strides, dilation, pads)
    checks.check_dy_spatial(fn, dy, channels_first, out_spatial, 'x_shape %s' % (x_shape,))
    compute = compute_dtype(dy.dtype)
    dy_cl = _depthwise_dy(fn, dy, channels_first, c_in, multiplier, 'w', w.shape)
    # dx is the stride-1 correlation of dy, spread out by the strides (zeros between
    # its rows and columns) and padded, with the flipped kernel: a gather, so blocks
    # of dx rows never overlap, and one code path for every stride.
    flipped = w[(slice(None, None, -1),) * rank]
    kernel = _depthwise_kernel(flipped, rank, c_in, multiplier, in_spatial[-1], compute)
    extents = [geometry.dilated_size(k, d) for k, d in zip(kernel_spatial, dilation)]
    spread_spatial = [s + e - 1 for s, e in zip(in_spatial, extents)]
    offsets = [e - 1 - b for e, (b, _) in zip(extents, pads)]
    dx = np.empty((dy.shape[0], *in_spatial, c_in), compute)
    o, k = _OUT[:rank], _TAPS[:rank]
    subscripts = 'n%s%scm,%s%scm->n%sc' % (o, k, k, o[1:][-1:], o)

    def block_dgrad(block):
        images, rows = block
        spread = parallel.padded_rows(dy_cl, images, rows.start, rows.stop + extents[0] - 1,
                                      offsets, strides, spread_spatial, compute)
        windows = gather_windows(spread, kernel_spatial, (1,) * rank, dilation)
        windows = windows.reshape(*windows.shape[:-1], c_in, multiplier)
        np.einsum(subscripts, windows, kernel, out=dx[images, rows])
    row = (math.prod(spread_spatial[1:]) + math.prod(in_spatial[1:])) * c_in * multiplier
    parallel.run_blocks(block_dgrad, _depthwise_blocks(dy.shape[0], in_spatial[0], row,
                                                       compute.itemsize))
    return from_channels_last(dx, channels_first, dy.dtype)


def depthwise_conv_wgrad(x, dy, w_shape, strides, dilation, pads, data_format):
    """Gradient of depthwise_conv_fwd with respect to w."""
    fn = 'depthwise_conv_wgrad'
    x, dy, channels_first, rank, w_shape, strides, dilation, pads = checks.wgrad_setup(
        fn, x, dy, w_shape, strides, dilation, pads, data_format)
    c_in = checks.channel_count(x.shape, channels_first)
    checks.check_channels(fn, 'the channel count', 'x', x.shape, c_in, 'w_shape', w_shape,
                          w_shape[-2])
    kernel_spatial, multiplier = w_shape[:rank], w_shape[-1]
    in_spatial = checks.spatial_dims(x.shape, channels_first)
    out_spatial = checks.output_spatial(fn, in_spatial, kernel_spatial, strides, dilation, pads)
    checks.check_dy_spatial(fn, dy, channels_first, out_spatial, 'x shape %s' % (x.shape,))
    compute = compute_dtype(x.dtype)
    dy_cl = _depthwise_dy(fn, dy, channels_first, c_in, multiplier, 'w_shape', w_shape)
    x_cl = to_channels_last(x, channels_first)
    padded_spatial = [s + b + a for s, (b, a) in zip(in_spatial, pads)]
    extent = geometry.dilated_size(kernel_spatial[0], dilation[0])
    o, k = _OUT[:rank], _TAPS[:rank]
    # The sum keeps the last output dim until the end: einsum's inner loop then spans
    # whole rows, and each partial sum stays shorter (more accurate in float32).
    subscripts = 'n%s%sc,n%scm->%s%scm' % (o, k, o, k, o[-1])

    def block_wgrad(block):
        images, rows = block
        x_block = parallel.padded_rows(x_cl, images, *_input_rows(rows, strides[0], extent),
                                       [b for b, _ in pads], (1,) * rank, padded_spatial,
                                       compute)
        windows = gather_windows(x_block, kernel_spatial, strides, dilation)
        dy_block = dy_cl[images, rows].astype(compute, copy=False)
        dy_block = dy_block.reshape(*dy_block.shape[:-1], c_in, multiplier)
        return np.einsum(subscripts, windows, dy_block).sum(axis=rank)
    row = math.prod(padded_spatial[1:]) * c_in * strides[0] + \
        math.prod(out_spatial[1:]) * c_in * multiplier
    partials = parallel.run_blocks(block_wgrad, _depthwise_blocks(
        x.shape[0], out_spatial[0], row, compute.itemsize))
    dw = partials[0]
    for partial in partials[1:]:    # block order: the same sum for any thread count
        dw += partial
    return dw.reshape(w_shape).astype(x.dtype, copy=False)


# ---------------------------------------------------------------- locally connected

def _local_columns(x, channels_first, kernel_size, strides, output_spatial, compute):
    """Windows as (P, N, F): F is (*k, C) for channels_last, (C, *k) for
    channels_first, the order in which Keras flattens a slice of each layout."""
    rank = len(kernel_size)
    x_cl = to_channels_last(x, channels_first).astype(compute, copy=False)
    columns = gather_windows(x_cl, kernel_size, strides, (1,) * rank)
    columns = columns[(slice(None),) + tuple(slice(0, o) for o in output_spatial)]
    if channels_first:
        columns = np.moveaxis(columns, -1, rank + 1)
    n = x.shape[0]
    return columns.reshape(n, math.prod(output_spatial), -1).transpose(1, 0, 2)


def _local_prologue(fn, x, other_name, other, kernel_size, strides, output_spatial, data_format):
    """The checks local_conv_fwd and local_conv_wgrad (both given x) start with."""
    x, other = checks.float_array(fn, 'x', x), checks.float_array(fn, other_name, other)
    checks.same_dtype(fn, [('x', x), (other_name, other)])
    channels_first = checks.is_channels_first(fn, data_format)
    rank = checks.spatial_rank(fn, 'x', x)
    kernel_size, strides, output_spatial = checks.local_setup(
        fn, rank, kernel_size, strides, output_spatial, checks.spatial_dims(x.shape, channels_first))
    return x, other, channels_first, rank, kernel_size, strides, output_spatial


def local_conv_fwd(x, w, kernel_size, strides, output_spatial, data_format):
    """Convolution with unshared weights w (P, prod(k) * C_in, C_out), P = prod(output_spatial)."""
    fn = 'local_conv_fwd'
    x, w, channels_first, rank, kernel_size, strides, output_spatial = _local_prologue(
        fn, x, 'w', w, kernel_size, strides, output_spatial, data_format)
    checks.check_local_kernel(fn, 'w', w.shape, output_spatial, kernel_size,
                              checks.channel_count(x.shape, channels_first))
    compute = compute_dtype(x.dtype)
    columns = _local_columns(x, channels_first, kernel_size, strides, output_spatial, compute)
    y = np.matmul(columns, w.astype(compute, copy=False))                 # (P, N, C_out)
    y = y.transpose(1, 0, 2).reshape(x.shape[0], *output_spatial, w.shape[-1])
    return from_channels_last(y, channels_first, x.dtype)


def local_conv_dgrad(dy, w, x_shape, kernel_size, strides, output_spatial, data_format):
    """Gradient of local_conv_fwd with respect to x."""
    fn = 'local_conv_dgrad'
    dy, w = checks.float_array(fn, 'dy', dy), checks.float_array(fn, 'w', w)
    checks.same_dtype(fn, [('dy', dy), ('w', w)])
    channels_first = checks.is_channels_first(fn, data_format)
    rank = checks.spatial_rank(fn, 'dy', dy)
    x_shape = checks.shape_tuple(fn, 'x_shape', x_shape, rank + 2)
    in_spatial = checks.spatial_dims(x_shape, channels_first)
    kernel_size, strides, output_spatial = checks.local_setup(
        fn, rank, kernel_size, strides, output_spatial, in_spatial)
    c_in = checks.check_local_dgrad_operands(fn, dy, w, x_shape, channels_first, output_spatial, kernel_size)
    compute = compute_dtype(dy.dtype)
    n, c_out = dy.shape[0], w.shape[-1]
    dy_p = to_channels_last(dy, channels_first).astype(compute, copy=False)
    dy_p = dy_p.reshape(n, -1, c_out).transpose(1, 0, 2)                  # (P, N, C_out)
    columns = np.matmul(dy_p, w.astype(compute, copy=False).transpose(0, 2, 1))  # (P, N, F)
    columns = columns.transpose(1, 0, 2)
    if channels_first:
        columns = np.moveaxis(columns.reshape(n, *output_spatial, c_in, *kernel_size),
                              rank + 1, -1)
    else:
        columns = columns.reshape(n, *output_spatial, *kernel_size, c_in)
    dx = scatter_windows(columns, in_spatial, strides, (1,) * rank, compute)
    return from_channels_last(dx, channels_first, dy.dtype)


def local_conv_wgrad(x, dy, w_shape, kernel_size, strides, output_spatial, data_format):
    """Gradient of local_conv_fwd with respect to w."""
    fn = 'local_conv_wgrad'
    x, dy, channels_first, rank, kernel_size, strides, output_spatial = _local_prologue(
        fn, x, 'dy', dy, kernel_size, strides, output_spatial, data_format)
    checks.check_rank(fn, 'dy', dy, rank + 2, 'like x')
    w_shape = checks.shape_tuple(fn, 'w_shape', w_shape, 3)
    checks.check_batch(fn, 'x', x.shape, 'dy', dy.shape)
    checks.check_local_kernel(fn, 'w_shape', w_shape, output_spatial, kernel_size,
                              checks.channel_count(x.shape, channels_first))
    c_out = checks.channel_count(dy.shape, channels_first)
    checks.check_channels(fn, 'the channel count', 'dy', dy.shape, c_out, 'w_shape', w_shape,
                          w_shape[-1])
    checks.check_dy_spatial(fn, dy, channels_first, output_spatial, 'output_spatial')
    compute = compute_dtype(x.dtype)
    columns = _local_columns(x, channels_first, kernel_size, strides, output_spatial, compute)
    dy_p = to_channels_last(dy, channels_first).astype(compute, copy=False)
    dy_p = dy_p.reshape(x.shape[0], -1, c_out).transpose(1, 0, 2)         # (P, N, C_out)
    dw = np.matmul(columns.transpose(0, 2, 1), dy_p)                      # (P, F, C_out)
    return dw.astype(x.dtype, copy=False)
