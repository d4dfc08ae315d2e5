"""CPU time of every NVRTC job of a cold inspect report, one row per (variant, arch).

    python -m bench.nvrtc_jobs [--arch sm_90] [--workers 2] [--json PATH]

Compiles every registered variant for each arch (default: the report's, sm_90) as
``python -m gpuk.kernels.inspect`` does on an empty cache (build.compile_variant: the same source
text and NVRTC options), in ``--workers`` processes in registry order, without reading or writing
the compile cache, and prints one line per job (CPU-seconds of its worker, user + system, and
when it ran), the heaviest first, then the total and the wall time. CPU time is the figure to compare on a shared machine: wall time moves
with the other jobs; the start and end times show whether both workers stay busy to the end.
"""
import argparse
import json
import resource
import sys
import time
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path

from gpuk.kernels import runtime
from gpuk.kernels.inspect import report as _report   # noqa: F401 (imported first, as the report does: the registry order)
from gpuk.kernels.inspect import variants
from gpuk.kernels.runtime import build


def _cpu_seconds():
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


def compile_job(spec, arch):
    """One job compiled in this worker: its row (CPU-seconds, start and end in epoch seconds)."""
    start, cpu = time.time(), _cpu_seconds()
    cubin, _usage, _spilled = build.compile_variant(spec, arch)
    return {'source': Path(spec.source_file).name, 'arch': arch, 'defines': dict(spec.defines),
            'kernels': list(spec.kernels), 'cpu_s': round(_cpu_seconds() - cpu, 3),
            'start': start, 'end': time.time(), 'cubin_bytes': len(cubin)}


def measure(archs, workers=2):
    specs = runtime.registered_builds()
    jobs = [(spec, arch) for spec in specs for arch in spec.build_archs(archs)]
    began = time.time()
    with ProcessPoolExecutor(max_workers=workers) as pool:
        rows = [future.result() for future in [pool.submit(compile_job, *job) for job in jobs]]
    for row in rows:
        row['start'], row['end'] = round(row['start'] - began, 2), round(row['end'] - began, 2)
    return rows, time.time() - began


def main(argv=None):
    parser = argparse.ArgumentParser(prog='python -m bench.nvrtc_jobs', description=__doc__.split('\n\n')[0])
    parser.add_argument('--arch', default=','.join(variants.DEFAULT_ARCHS))
    parser.add_argument('--workers', type=int, default=2)
    parser.add_argument('--json', metavar='PATH')
    args = parser.parse_args(argv)
    rows, wall = measure(build.parse_archs(args.arch), args.workers)
    for row in sorted(rows, key=lambda r: -r['cpu_s']):
        defines = ' '.join('%s=%s' % kv for kv in sorted(row['defines'].items()) if kv[0] != 'REDUCE_THREADS')
        print('%6.2f  %6.1f-%6.1f  %-6s %-20s %s' % (row['cpu_s'], row['start'], row['end'], row['arch'],
                                                     row['source'], defines))
    by_source = {}
    for row in rows:
        by_source[row['source']] = by_source.get(row['source'], 0.0) + row['cpu_s']
    print('by source: ' + ', '.join('%s %.1f' % kv for kv in sorted(by_source.items(), key=lambda kv: -kv[1])))
    print('%d jobs: %.1f CPU-s, %.1f s wall, last two ends %s' % (
        len(rows), sum(r['cpu_s'] for r in rows), wall, sorted(r['end'] for r in rows)[-2:]))
    if args.json:
        Path(args.json).write_text(json.dumps(rows, indent=1) + '\n')
    return 0


if __name__ == '__main__':
    sys.exit(main())
