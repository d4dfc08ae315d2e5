"""All-reduce bandwidth of gpuk.distributed's transport, reported as nccl-tests does:

    mpiexec -n N python -m gpuk.distributed.bandwidth [--mb 256] [--iters 20]

algbw = bytes / time; busbw = algbw * 2(N-1)/N, the traffic each rank's link carries in a
ring all-reduce, comparable across N (docs/distributed.md, "Scaling, on paper"). The time is
the median over iterations of start + wait of one all-reduce of a float32 buffer on gpuk's
device (NCCL on CUDA, MPI on the NumPy device), after two warm-up iterations.
"""
import argparse
import json
import time

import numpy as np

from gpuk import device
from gpuk.distributed import world


def measure(megabytes, iterations):
    """(seconds per all-reduce, median) of a float32 buffer of ``megabytes`` MB (10^6 bytes)."""
    chosen = world.transport('gpuk.distributed.bandwidth')
    xp = device.xp()
    count = max(1, int(megabytes * 1e6) // 4)
    buffer = xp.ones(count, dtype=np.float32)
    times = []
    for i in range(iterations + 2):
        start = time.perf_counter()
        pending = chosen.start_allreduce(buffer, 'the %g MB bandwidth all-reduce' % megabytes)
        chosen.finish_allreduce(pending)
        if i >= 2:
            times.append(time.perf_counter() - start)
    return float(np.median(times))


def main(argv=None):
    parser = argparse.ArgumentParser(prog='python -m gpuk.distributed.bandwidth',
                                     description=__doc__.split('\n\n')[0])
    parser.add_argument('--mb', type=float, default=256.0, help='buffer size in MB (default 256)')
    parser.add_argument('--iters', type=int, default=20, help='timed iterations (default 20)')
    args = parser.parse_args(argv)
    if not args.mb > 0 or args.iters < 1:
        parser.error('--mb must be positive and --iters at least 1')
    world.init()
    seconds = measure(args.mb, args.iters)
    n = world.size()
    # the slowest rank's median is the collective's time
    seconds = float(world.transport('bandwidth').allreduce_host(np.array([seconds]), 'the timing',
                                                                op='max')[0])
    algbw = args.mb * 1e6 / seconds / 1e9
    if world.rank() == 0:
        print(json.dumps({'transport': world.transport('bandwidth').name, 'device': device.kind(),
                          'ranks': n, 'megabytes': args.mb, 'seconds': seconds,
                          'algbw_GBps': algbw, 'busbw_GBps': algbw * 2 * (n - 1) / n}))


if __name__ == '__main__':
    main()
