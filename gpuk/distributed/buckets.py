"""Gradient buckets: many small tensors become a few large all-reduces.

An all-reduce costs a fixed latency (a few microseconds per step of the ring, times 2(N-1)
steps) plus its bytes over the bus bandwidth; hundreds of small gradient all-reduces pay the
latency hundreds of times. Flattening the gradients into buckets of about ``bucket_bytes``
pays it a few times, yet still lets the first bucket's all-reduce start while the backward
is computing the next one (docs/distributed.md argues the size).
"""
import numpy as np

DEFAULT_BUCKET_BYTES = 25 * 2 ** 20  # PyTorch DDP's default: 25 MiB


def plan_buckets(sizes, dtypes, bucket_bytes):
    """Groups tensors, in the order given, into buckets: lists of indices.

    ``sizes`` are element counts (None when unknown before run time), ``dtypes`` NumPy dtypes.
    A bucket holds one dtype only (it is one flat array). A tensor joins the open bucket unless
    the bucket would then pass ``bucket_bytes``; a tensor larger than that, or of unknown
    size, is a bucket of its own.
    """
    buckets, current, current_bytes, current_dtype = [], [], 0, None
    for index, (count, dtype) in enumerate(zip(sizes, dtypes)):
        dtype = np.dtype(dtype)
        nbytes = bucket_bytes if count is None else count * dtype.itemsize
        if current and (dtype != current_dtype or current_bytes + nbytes > bucket_bytes):
            buckets.append(current)
            current, current_bytes = [], 0
        current.append(index)
        current_bytes += nbytes
        current_dtype = dtype
    if current:
        buckets.append(current)
    return buckets


def flatten(arrays, wire_dtype, xp):
    """One new contiguous 1-D array of ``wire_dtype`` holding ``arrays`` one after the other."""
    if len(arrays) == 1:
        return xp.array(arrays[0], dtype=wire_dtype, copy=True).reshape(-1)
    return xp.concatenate([xp.asarray(a, dtype=wire_dtype).reshape(-1) for a in arrays])


def unflatten(buffer, shapes, dtypes, divisor):
    """The arrays ``flatten`` packed, each divided by ``divisor`` (the number of workers, to
    average a sum; 1 to keep it) and back in its own dtype and shape.

    Each is a new array (not a view of ``buffer``), so a variable assigned one of them never
    shares memory with another."""
    out, offset = [], 0
    for shape, dtype in zip(shapes, dtypes):
        count = int(np.prod(shape, dtype=np.int64))
        part = buffer[offset:offset + count]
        offset += count
        part = part / part.dtype.type(divisor) if divisor != 1 else part.copy()
        out.append(part.astype(dtype, copy=False).reshape(shape))
    return out
