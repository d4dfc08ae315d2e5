"""Theoretical occupancy from the CUDA occupancy rules (what cudaOccupancyMaxActiveBlocksPerMultiprocessor
and the CUDA occupancy calculator compute), for the architectures gpuk builds for.

Blocks per SM = the smallest of four limits:
- warps: max warps per SM // warps per block;
- blocks: max resident blocks per SM;
- registers: registers are allocated per warp in units of 256 (registers per thread * 32,
  rounded up), from four sub-partitions of regs/SM / 4 each; warps per sub-partition that
  fit, times 4, // warps per block (0 if a block needs more than regs per block);
- shared memory: (static + dynamic + the 1 KiB the system reserves per block), rounded up to
  128 bytes, against the SM's largest shared-memory carveout.
Occupancy = blocks * warps per block / max warps per SM.
"""
import math
from collections import namedtuple

ArchLimits = namedtuple('ArchLimits', 'max_warps max_blocks regs_per_sm regs_per_block reg_unit '
                                      'max_regs_per_thread smem_per_sm smem_per_block_optin '
                                      'smem_reserved_per_block smem_unit')

LIMITS = {
    # A100 (GA100): 164 KiB of shared memory per SM at the largest carveout, 163 KiB per block.
    'sm_80': ArchLimits(64, 32, 65536, 65536, 256, 255, 167936, 166912, 1024, 128),
    # H100 (GH100): 228 KiB per SM, 227 KiB per block.
    'sm_90': ArchLimits(64, 32, 65536, 65536, 256, 255, 233472, 232448, 1024, 128),
}
LIMITS['sm_90a'] = LIMITS['sm_90']   # the same H100, built with its architecture-specific instructions

Occupancy = namedtuple('Occupancy', 'blocks_per_sm warps_per_sm occupancy limiter')


def theoretical(arch, threads_per_block, registers, smem_per_block):
    """Occupancy of a kernel using ``registers`` per thread and ``smem_per_block`` bytes of
    static + dynamic shared memory in blocks of ``threads_per_block`` threads on ``arch``.

    ``limiter`` names the binding limit ('warps', 'blocks', 'registers', 'shared memory');
    a block that cannot launch at all gives 0 blocks and limiter 'does not fit'.
    """
    limits = LIMITS[arch]
    if threads_per_block < 1 or registers < 0 or smem_per_block < 0:
        raise ValueError('occupancy.theoretical: threads_per_block must be >= 1 and registers, '
                         'smem_per_block >= 0, got %r, %r, %r' % (threads_per_block, registers, smem_per_block))
    warps = math.ceil(threads_per_block / 32)
    regs_per_warp = math.ceil(max(registers, 1) * 32 / limits.reg_unit) * limits.reg_unit
    smem = math.ceil((smem_per_block + limits.smem_reserved_per_block) / limits.smem_unit) * limits.smem_unit
    if (registers > limits.max_regs_per_thread or regs_per_warp * warps > limits.regs_per_block
            or smem_per_block > limits.smem_per_block_optin or warps > limits.max_warps):
        return Occupancy(0, 0, 0.0, 'does not fit')
    by_limit = {
        'warps': limits.max_warps // warps,
        'blocks': limits.max_blocks,
        'registers': (limits.regs_per_sm // 4 // regs_per_warp) * 4 // warps,
        'shared memory': limits.smem_per_sm // smem,
    }
    limiter = min(by_limit, key=lambda name: by_limit[name])   # first of equals: warps before the rest
    blocks = by_limit[limiter]
    return Occupancy(blocks, blocks * warps, blocks * warps / limits.max_warps, limiter)
