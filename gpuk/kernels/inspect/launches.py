"""What the launchers pass at launch time that the build registry does not record.

Block size: every gpuk kernel has ``__launch_bounds__(THREADS)`` and its launcher launches
exactly THREADS threads (docs/kernels.md), so the report reads the block size from the
cubin (variants.max_threads_per_kernel). Dynamic shared memory: the depthwise convolution
(its input / dy tiles; the report asks the launcher's own tile rule, conv/direct.py, for the
benchmarks' MobileNet-like layer: 3x3 filter, stride 1, 56x56 output, which fwd and dgrad run
through their whole-filter windows) and the Hopper wgmma
convolution (its stage ring, by the build's tile: conv/wgmma.py) and the implicit-GEMM tiles
whose stage ring passes the 48 KB of static shared memory (CONV_DYNAMIC_SMEM, conv/tiles.py).
"""
from ..conv import direct, wgmma
from ..runtime.kernel_source import SCALAR_DTYPES

TYPICAL_OUTPUT = (56, 56)
TYPICAL_FILTER = (3, 3)


def dynamic_shared_bytes(kernel, defines):
    """Bytes of dynamic shared memory the launcher asks for when launching ``kernel`` built
    with ``defines`` (a dict), on the benchmark-like shape."""
    if kernel.startswith('conv_igemm_'):   # tf32 128x128x32's stage ring (conv/tiles.py dynamic_smem)
        return int(defines.get('CONV_DYNAMIC_SMEM', 0))
    if kernel in wgmma.STAGED_KERNELS:
        return wgmma.shared_bytes(int(defines.get('WG_BN', wgmma.BLOCK_N)))
    if not kernel.startswith('depthwise_') or kernel == 'depthwise_reduce_splits':
        return 0
    dtype = SCALAR_DTYPES[defines['ELEMENT_T']]
    channels_first = not int(defines.get('DW_CHANNELS_LAST', 1))
    if kernel == 'depthwise_wgrad':
        tile = direct.depthwise_wgrad_tile('inspect', dtype, channels_first, TYPICAL_OUTPUT, TYPICAL_FILTER,
                                           (1, 1), (1, 1))
    else:
        tile = direct.depthwise_tile('inspect', dtype, channels_first, TYPICAL_OUTPUT, TYPICAL_FILTER,
                                     (1, 1), (1, 1), rows_window=True)
    return tile.shared_bytes
