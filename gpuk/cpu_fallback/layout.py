"""Layout and window helpers shared by the NumPy twins of convolution and pooling.

The twins work in channels_last: (N, *spatial, C). These move arrays into and out of
that layout, pad and crop the spatial dims, and view or scatter the windows a kernel
(or a pooling window) reads, one tap at a time.
"""
import ml_dtypes
import numpy as np
from numpy.lib.stride_tricks import sliding_window_view

from gpuk.contracts import geometry

__all__ = ['compute_dtype', 'to_channels_last', 'from_channels_last', 'pad_spatial', 'crop_spatial',
           'gather_windows', 'window_regions', 'scatter_windows']


def compute_dtype(dtype):
    """float16 and bfloat16 accumulate in float32; every other float computes in itself."""
    return np.dtype(np.float32) if dtype in (np.float16, ml_dtypes.bfloat16) else np.dtype(dtype)


def to_channels_last(array, channels_first):
    return np.moveaxis(array, 1, -1) if channels_first else array


def from_channels_last(array, channels_first, dtype):
    array = np.moveaxis(array, -1, 1) if channels_first else array
    return np.ascontiguousarray(array, dtype=dtype)


def pad_spatial(x_cl, pads, dtype, fill=0):
    """(N, *S, C) -> (N, *S_padded, C) in `dtype` with `fill` in the border."""
    if not any(before or after for before, after in pads):
        return x_cl.astype(dtype, copy=False)
    n, channels = x_cl.shape[0], x_cl.shape[-1]
    padded_spatial = [s + b + a for s, (b, a) in zip(x_cl.shape[1:-1], pads)]
    # np.zeros gets pre-zeroed pages from calloc; np.full would write the zeros first
    padded = np.zeros((n, *padded_spatial, channels), dtype) if fill == 0 else \
        np.full((n, *padded_spatial, channels), fill, dtype)
    interior = tuple(slice(b, b + s) for s, (b, _) in zip(x_cl.shape[1:-1], pads))
    padded[(slice(None),) + interior] = x_cl
    return padded


def crop_spatial(padded, pads, spatial):
    interior = tuple(slice(b, b + s) for s, (b, _) in zip(spatial, pads))
    return padded[(slice(None),) + interior]


def gather_windows(padded, kernel_spatial, strides, dilation):
    """Read-only view (N, *out, *kernel, C) of the windows of (N, *S_padded, C)."""
    rank = len(kernel_spatial)
    extent = tuple(geometry.dilated_size(k, d) for k, d in zip(kernel_spatial, dilation))
    view = sliding_window_view(padded, extent, axis=tuple(range(1, rank + 1)))
    # view is (N, *all_positions, C, *extent): keep every stride-th position
    # and every dilation-th tap.
    view = view[(slice(None),) + tuple(slice(None, None, s) for s in strides)
                + (slice(None),) + tuple(slice(None, None, d) for d in dilation)]
    return np.moveaxis(view, rank + 1, -1)


def window_regions(out_spatial, kernel_spatial, strides, dilation):
    """For each kernel tap: (tap, slices of the padded input that tap reads)."""
    for tap in np.ndindex(*kernel_spatial):
        yield tap, tuple(slice(t * d, t * d + s * (o - 1) + 1, s)
                         for t, d, s, o in zip(tap, dilation, strides, out_spatial))


def scatter_windows(columns, padded_spatial, strides, dilation, dtype):
    """Adjoint of gather_windows: sum columns (N, *out, *kernel, C) into (N, *S_padded, C)."""
    rank = len(padded_spatial)
    out_spatial = columns.shape[1:rank + 1]
    kernel_spatial = columns.shape[rank + 1:2 * rank + 1]
    result = np.zeros((columns.shape[0], *padded_spatial, columns.shape[-1]), dtype)
    leading = (slice(None),) * (rank + 1)
    for tap, region in window_regions(out_spatial, kernel_spatial, strides, dilation):
        result[(slice(None),) + region] += columns[leading + tap]
    return result
