"""Cache-sized blocks and a small shared thread pool for the NumPy twins.

Tap loops (depthwise convolution, pooling) make a few ufunc passes per kernel tap;
over a whole batch each pass streams memory, over a block of ~1 MiB it hits L2.
NumPy ufuncs release the GIL, so blocks also run in parallel on a few threads.

Determinism: block boundaries depend only on the array shapes (never on the thread
count), each block writes its own output slice, and per-block partial results are
combined by the caller in block order, so results do not depend on GPUK_CPU_THREADS.
"""
import concurrent.futures
import glob
import ctypes
import os
import threading

import numpy as np

__all__ = ['BLOCK_BYTES', 'cpu_threads', 'padded_rows', 'row_blocks', 'run_blocks']

# Working set per block (inputs + outputs + scratch of one block): half of a 2 MiB L2.
BLOCK_BYTES = 1 << 20
# Tests set this to a few bytes to force many blocks through every code path.
MAX_BLOCK_BYTES = None

_pool = None
_pool_threads = 0
_pool_lock = threading.Lock()


def blas_threads():
    """Threads NumPy's OpenBLAS uses, or None when the library cannot be asked."""
    libs = os.path.join(os.path.dirname(np.__file__), os.pardir, 'numpy.libs')
    for path in glob.glob(os.path.join(libs, '*openblas*')):
        try:
            lib = ctypes.CDLL(path)
        except OSError:
            continue
        for symbol in ('scipy_openblas_get_num_threads64_', 'scipy_openblas_get_num_threads',
                       'openblas_get_num_threads64_', 'openblas_get_num_threads'):
            getter = getattr(lib, symbol, None)
            if getter is not None:
                return int(getter())
    return None


_default_threads = None


def cpu_threads():
    """Threads for block-parallel twins: GPUK_CPU_THREADS, else NumPy's BLAS thread count.

    GPUK_CPU_THREADS=1 runs every block on the calling thread.
    """
    global _default_threads
    value = os.environ.get('GPUK_CPU_THREADS', '').strip()
    if value:
        if not value.isdigit() or int(value) < 1:
            raise ValueError('cpu_threads: GPUK_CPU_THREADS must be a positive integer, '
                             'got %r' % value)
        return int(value)
    if _default_threads is None:
        threads = blas_threads()
        if threads is None:
            for variable in ('OPENBLAS_NUM_THREADS', 'OMP_NUM_THREADS'):
                if os.environ.get(variable, '').isdigit():
                    threads = int(os.environ[variable])
                    break
        if threads is None:
            threads = len(os.sched_getaffinity(0)) if hasattr(os, 'sched_getaffinity') \
                else os.cpu_count()
        _default_threads = max(1, int(threads or 1))
    return _default_threads


def _executor(threads):
    """The one shared pool, created on first use (recreated if the thread count grows)."""
    global _pool, _pool_threads
    with _pool_lock:
        if _pool is None or _pool_threads < threads:
            if _pool is not None:
                _pool.shutdown(wait=False)
            _pool = concurrent.futures.ThreadPoolExecutor(
                max_workers=threads, thread_name_prefix='gpuk-cpu')
            _pool_threads = threads
        return _pool


def run_blocks(work, blocks):
    """[work(block) for block in blocks], the blocks spread over cpu_threads() threads.

    Results come back in block order. Runs inline with one thread or one block, and
    when called from a pool thread (a nested call must not wait on its own pool).
    """
    blocks = list(blocks)
    threads = min(cpu_threads(), len(blocks))
    if threads <= 1 or threading.current_thread().name.startswith('gpuk-cpu'):
        return [work(block) for block in blocks]
    # `threads` contiguous runs of blocks, one task each: fewer hand-offs than one
    # task per block, and neighbouring blocks share rows at their edges.
    bounds = [len(blocks) * i // threads for i in range(threads + 1)]

    def run(i):
        return [work(block) for block in blocks[bounds[i]:bounds[i + 1]]]
    futures = [_executor(threads).submit(run, i) for i in range(1, threads)]
    results = run(0)     # the caller works too instead of waiting idle
    for future in futures:
        results.extend(future.result())
    return results


def row_blocks(n, rows, bytes_per_row, block_bytes=None):
    """Blocks of (images slice, rows slice) covering an (n, rows) grid, ~block_bytes each.

    `bytes_per_row` is the working set of one image row (all arrays the block touches).
    Small images are grouped whole; large ones are split by rows.
    """
    block_bytes = BLOCK_BYTES if block_bytes is None else block_bytes
    if MAX_BLOCK_BYTES is not None:
        block_bytes = min(block_bytes, MAX_BLOCK_BYTES)
    per_image = rows * bytes_per_row
    if per_image <= block_bytes:
        step = max(1, block_bytes // max(per_image, 1))
        return [(slice(start, min(start + step, n)), slice(0, rows))
                for start in range(0, n, step)]
    step = max(1, block_bytes // max(bytes_per_row, 1))
    return [(slice(image, image + 1), slice(start, min(start + step, rows)))
            for image in range(n) for start in range(0, rows, step)]


def _placement(first, stop, offset, spread, length):
    """(source slice, target slice) of positions offset + o * spread (o in [0, length))
    that fall in [first, stop), target relative to first; None when none do."""
    low = max(0, -(-(first - offset) // spread))
    high = min(length - 1, (stop - 1 - offset) // spread)
    if high < low:
        return None
    start = offset + low * spread - first
    return slice(low, high + 1), slice(start, start + (high - low) * spread + 1, spread)


def padded_rows(source, images, first, stop, offsets, spread, sizes, dtype, fill=0):
    """Rows [first, stop) of a padded (N, *sizes, C) copy of `images` of `source`, in `dtype`.

    Element o of spatial dim i lands at offsets[i] + o * spread[i] (offsets may be
    negative: what falls outside is dropped); everything else holds `fill`. Rows count
    along the first spatial dim. Spread > 1 inserts the zeros of a strided dgrad.
    A block that is a plain slice of `source` in `dtype` comes back as a view.
    """
    bounds = [(first, stop)] + [(0, size) for size in sizes[1:]]
    placed = [_placement(lo, hi, offset, step, length) for (lo, hi), offset, step, length
              in zip(bounds, offsets, spread, source.shape[1:-1])]
    shape = (len(range(*images.indices(source.shape[0]))), stop - first) + \
        tuple(sizes[1:]) + (source.shape[-1],)
    if all(p is not None and p[1].step == 1 and p[1].start == 0 and
           p[1].stop == hi - lo for p, (lo, hi) in zip(placed, bounds)):
        return source[(images,) + tuple(p[0] for p in placed)].astype(dtype, copy=False)
    block = np.zeros(shape, dtype) if fill == 0 else np.full(shape, fill, dtype)
    if all(p is not None for p in placed):
        block[(slice(None),) + tuple(p[1] for p in placed)] = \
            source[(images,) + tuple(p[0] for p in placed)]
    return block
