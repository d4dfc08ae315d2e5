"""A simple throughput model of a hot loop on an H100, from its static instruction mix.

Unit: clock cycles of one SM sub-partition (SMSP; an SM has 4, each issues one warp
instruction per cycle) to run ONE warp through ONE loop iteration, with every SMSP busy
with such warps. The candidate times:

    issue        = instructions                      (1 warp instruction / cycle / SMSP)
    fp32         = FFMA + HFMA2 + FADD/FMUL/HADD2/HMUL2   (32 lanes / SMSP: 1 / cycle)
    fp64         = 2 * (DFMA + DADD + DMUL)          (16 FP64 lanes / SMSP)
    mufu         = 8 * MUFU                          (4 lanes / SMSP)
    tensor-core  = sum over MMAs of FLOPs / dense peak FLOPs per cycle per SMSP
                   (f16/bf16 1024, tf32 512, int8 2048, fp64 64: H100 SXM's dense rates
                   989 / 495 / 1979 / 67 TFLOP/s over 132 SMs * 4 SMSPs * 1.83 GHz)
    memory       = global bytes / (bandwidth per SMSP) / latency factor
                   bytes = 32 lanes * access width of every LDG/STG/LDGSTS/atomic, divided
                   by the emulator's coalescing (sectors ideal / moved) when known;
                   bandwidth = 3.35 TB/s HBM3 / 132 SMs / 1.83 GHz / 4 = 3.47 B/cycle/SMSP;
                   latency factor = min(1, bytes in flight per SM / (bandwidth per SM *
                   600 cycles)), bytes in flight = resident warps * one iteration's loads.

Predicted time T = the largest; the bound is its name (issue, fp32, fp64, mufu,
tensor-core, memory). The roofline time R = max(useful math at its peak pipe rate,
ideal memory time (fully coalesced, no latency limit)); predicted_fraction = R / T.

What it ignores (so it is an upper bound on the fraction): dependency stalls and latency
hiding of arithmetic, shared-memory bandwidth and bank conflicts, L2 hits (every global
byte is charged at HBM bandwidth, pessimistic for tiles re-read from L2), tail effects and
the launch itself, and mma.sync reaching only part of the dense rate that wgmma reaches on
sm_90. Not checked against an H100 yet: bench/gpu-results/ has no rows.
"""
import re

SMSP_PER_SM = 4
HBM_BYTES_PER_CYCLE_PER_SMSP = 3.35e12 / 132 / 1.83e9 / SMSP_PER_SM
MEMORY_LATENCY_CYCLES = 600
TENSOR_FLOPS_PER_CYCLE_PER_SMSP = {'f16': 1024, 'bf16': 1024, 'tf32': 512, 'int8': 2048, 'fp64': 64}
PIPE_CYCLES = {'fp32': 1, 'fp64': 2, 'mufu': 8}


def mma_cycles(opcode):
    """SMSP cycles of one tensor-core instruction at the dense peak: HMMA.16816.F32.BF16 -> 4."""
    flops = mma_flops(opcode)
    kind = ('tf32' if 'TF32' in opcode else 'bf16' if 'BF16' in opcode else
            'fp64' if opcode.startswith('DMMA') else 'int8' if opcode.startswith('IMMA') else 'f16')
    return flops / TENSOR_FLOPS_PER_CYCLE_PER_SMSP[kind]


def mma_flops(opcode):
    """FLOPs of one warp-level MMA from its shape: HMMA.16816 = 2*16*8*16, HMMA.1688 = 2*16*8*8,
    DMMA.884 = 2*8*8*4, HGMMA.64x128x16 = 2*64*128*16 (a warpgroup's, a quarter per warp)."""
    parts = opcode.split('.')
    shape = parts[1] if len(parts) > 1 else ''
    if 'x' in shape:                     # wgmma: MxNxK per warpgroup of 4 warps
        m, n, k = (int(v) for v in re.findall(r'\d+', shape)[:3])
        return 2 * m * n * k / 4
    digits = {'16816': (16, 8, 16), '1688': (16, 8, 8), '1684': (16, 8, 4), '884': (8, 8, 4),
              '8816': (8, 8, 16), '16832': (16, 8, 32), '8832': (8, 8, 32), '168256': (16, 8, 256)}
    m, n, k = digits.get(shape, (16, 8, 16))
    return 2 * m * n * k


def global_bytes(mix):
    """Bytes one warp's iteration moves in global memory (32 lanes * width of each access)."""
    accesses = [mix['ldg'], mix['stg'], mix['ldgsts']]
    total = sum(32 * bits // 8 * count for sized in accesses for bits, count in sized.items())
    return total + 32 * 4 * mix['atomic']


def load_bytes(mix):
    return sum(32 * bits // 8 * count for sized in (mix['ldg'], mix['ldgsts']) for bits, count in sized.items())


def predict(mix, mma_opcodes, warps_per_sm, coalescing=None):
    """(bound, predicted_fraction, times) for a loop's instruction mix; see the module docstring.

    ``mma_opcodes``: the full opcodes of the loop's MMAs (their shapes and types set their
    cost); ``warps_per_sm``: resident warps (theoretical occupancy); ``coalescing``: the
    emulator's figure in (0, 1], or None.
    """
    moved = global_bytes(mix)
    efficiency = coalescing if coalescing else 1.0
    needed_in_flight = HBM_BYTES_PER_CYCLE_PER_SMSP * SMSP_PER_SM * MEMORY_LATENCY_CYCLES
    in_flight = warps_per_sm * load_bytes(mix) / efficiency
    latency_factor = min(1.0, in_flight / needed_in_flight) if load_bytes(mix) else 1.0
    ideal_memory = moved / HBM_BYTES_PER_CYCLE_PER_SMSP
    times = {
        'issue': float(mix['total']),
        'fp32': PIPE_CYCLES['fp32'] * (mix['ffma'] + mix['hfma2'] + mix['fp_other']),
        'fp64': PIPE_CYCLES['fp64'] * (mix['dfma'] + mix['fp64_other']),
        'mufu': PIPE_CYCLES['mufu'] * mix['mufu'],
        'tensor-core': sum(mma_cycles(op) for op in mma_opcodes),
        'memory': ideal_memory / efficiency / max(latency_factor, 1e-9),
    }
    useful = max(times['fp32'], times['fp64'], times['tensor-core'], times['mufu'])
    roofline = max(useful, ideal_memory)
    order = ('fp32', 'fp64', 'tensor-core', 'mufu', 'memory', 'issue')   # ties: the useful unit
    bound = max(order, key=lambda name: (times[name], -order.index(name)))
    slowest = times[bound]
    fraction = roofline / slowest if slowest else None
    return bound, fraction, times

