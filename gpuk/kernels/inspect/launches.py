"""What the launchers pass at launch time that the build registry does not record.

Block size: every gpuk kernel has ``__launch_bounds__(THREADS)`` and its launcher launches
exactly THREADS threads (docs/kernels.md), so the report reads the block size from the
cubin (variants.max_threads_per_kernel). Dynamic shared memory: only the depthwise
convolution uses it (the filter of DW_CHANNELS channels, when it fits in
DW_MAX_FILTER_SHARED); the report uses the benchmarks' 3x3 filter.
"""
from ..conv_direct import _filter_shared_bytes   # the launcher's own rule
from ..kernel_source import SCALAR_DTYPES

TYPICAL_FILTER_ENTRIES = 3 * 3          # entries per channel of a 3x3 depthwise filter
_FILTER_IN_SHARED = ('depthwise_fwd', 'depthwise_dgrad')


def dynamic_shared_bytes(kernel, defines):
    """Bytes of dynamic shared memory the launcher asks for when launching ``kernel`` built
    with ``defines`` (a dict), on the benchmark-like shape."""
    if kernel in _FILTER_IN_SHARED:
        return _filter_shared_bytes(SCALAR_DTYPES[defines['ELEMENT_T']], TYPICAL_FILTER_ENTRIES)
    return 0
