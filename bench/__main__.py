"""python -m bench [--quick] [--threads N] [--rounds N] [--strict] [--json PATH] [--out DIR] [PYTEST ARGS...]

Runs every suite in bench/ that applies to this host under pytest-benchmark and writes a
new results file, bench/results/<device>-<date>-<time>-<mode>.json (mode quick, full, or
partial when PYTEST ARGS such as ``-k conv`` pick rows), never replacing an earlier one,
then its report beside it (<stem>.md, <stem>.png; see bench/report.py), points
bench/results/latest at it and prints the summary: per family, each implementation's
time relative to the reference (cuDNN or PyTorch), the rows that did not run and why.

Timing hygiene: OMP/OpenBLAS/MKL/GPUK_CPU_THREADS and torch use ``--threads`` (default 1)
threads, set here before NumPy or torch load; every row is timed in ``--rounds`` rounds
over all rows (interleaved); a row whose round medians differ by more than
``--max-spread`` makes the summary warn that the machine was too busy, and ``--strict``
turns that warning into exit status 3.
"""
import argparse
import os
import sys

from bench import runs

NOISY_EXIT = 3
SUITES_DIR = os.path.dirname(os.path.abspath(__file__))


def parse(argv):
    from bench.rows import NOISY_SPREAD
    parser = argparse.ArgumentParser(prog='python -m bench', description=__doc__.split('\n\n')[1])
    parser.add_argument('--quick', action='store_true', help='one case per benchmark and implementation')
    parser.add_argument('--threads', type=int, default=runs.DEFAULT_THREADS,
                        help='threads for NumPy\'s BLAS, the NumPy twins and torch (default %(default)s)')
    parser.add_argument('--rounds', type=int, default=None,
                        help='interleaved rounds per row (default 5, --quick 3, the GPU rehearsal 1)')
    parser.add_argument('--max-spread', type=float, default=NOISY_SPREAD,
                        help='round-to-round spread above which a row counts as noisy (default %(default)s)')
    parser.add_argument('--strict', action='store_true', help='exit with status 3 when a row is noisy')
    parser.add_argument('--json', default=None, help='results path (default: a new file in bench/results/)')
    parser.add_argument('--out', default=None, help='folder of the report (default: the JSON folder)')
    parser.add_argument('--results-dir', default=runs.RESULTS_DIR,
                        help='where new results files and the latest pointer go (default bench/results)')
    parser.add_argument('--suites', default=SUITES_DIR,
                        help='folder of bench_*.py suites (default bench/; another one runs with bench/conftest.py)')
    args, pytest_args = parser.parse_known_args(argv)
    if args.threads < 1:
        parser.error('--threads must be >= 1, got %d' % args.threads)
    if args.rounds is not None and args.rounds < 1:   # (0 ran the default silently)
        parser.error('--rounds must be >= 1, got %d' % args.rounds)
    return parser, args, pytest_args


def picks_rows(pytest_args):
    """Whether pytest arguments select a subset of rows (-k, -m, or test paths / node ids)."""
    return any(a.startswith(('-k', '-m', '--deselect', '--ignore')) or not a.startswith('-')
               for a in pytest_args)


def main(argv=None):
    parser, args, pytest_args = parse(argv)
    threads = runs.apply_thread_env(args.threads)   # before NumPy (through gpuk) or torch load
    import pytest
    from bench import harness, report
    from tests import gpu_rehearsal

    rehearsal = gpu_rehearsal.activate_if_requested()
    scratch = None
    if rehearsal:   # GPUK_GPU_REHEARSAL=1: meaningless timings, scratch files only
        from tests.gpu_rehearsal import bench_plugin
        try:
            if args.json is None:
                args.json = bench_plugin.rehearsal_json_path(None)
                scratch = os.path.dirname(args.json)
            else:
                args.json = bench_plugin.rehearsal_json_path(args.json)
            if args.out:
                bench_plugin.check_scratch_path(args.out, '--out')
        except pytest.UsageError as exc:
            parser.error(str(exc))
    mode = 'quick' if args.quick else ('partial' if picks_rows(pytest_args) else 'full')
    previous = runs.read_latest(args.results_dir) if args.json is None else None
    args.json = args.json or runs.new_results_path(harness.run_device(), mode, args.results_dir)
    rounds = args.rounds or (1 if rehearsal else 3 if args.quick else 5)
    os.makedirs(os.path.dirname(os.path.abspath(args.json)), exist_ok=True)
    print('python -m bench: %s run, %d round(s), %s thread(s) each (%s); results: %s'
          % (mode, rounds, args.threads, ', '.join(sorted(threads)), args.json))
    options = ['--benchmark-json=%s' % args.json, '--benchmark-quiet', '-p', 'no:cacheprovider',
               '--rounds=%d' % rounds, '--bench-mode=%s' % mode] + (['--quick'] if args.quick else [])
    if os.path.abspath(args.suites) != SUITES_DIR:   # bench/conftest.py is not their conftest: load it
        options = ['-p', 'bench.conftest'] + options
    code = pytest.main([args.suites] + options + pytest_args)
    if code not in (pytest.ExitCode.OK, pytest.ExitCode.TESTS_FAILED) or not os.path.exists(args.json):
        return int(code)
    if rehearsal:
        return int(code) or _rehearsal_summary(args.json, scratch)
    try:
        summary, md_path, png_path = report.write_report(args.json, args.out, args.max_spread)
    except (OSError, ValueError) as exc:
        print('bench: %s' % exc, file=sys.stderr)
        return 1
    in_results = os.path.dirname(os.path.abspath(args.json)) == os.path.abspath(args.results_dir)
    pointer = runs.write_latest(args.json) if in_results else None
    print('\n' + summary)
    print('wrote %s, %s%s' % (args.json, md_path, ' and %s' % png_path if png_path else ''))
    if pointer:
        print('%s now names this run' % pointer)
    if previous and os.path.exists(previous):
        print('compare with the run before: python -m bench.report %s %s'
              % (os.path.relpath(previous), os.path.relpath(args.json)))
    if args.strict and report.noise_lines(report.load(args.json)[1], args.max_spread):
        return NOISY_EXIT
    return int(code)


def _rehearsal_summary(json_path, scratch):
    """One line: the rehearsal's timings mean nothing, so no table, no ratios, no plot."""
    from bench import report
    results, rows = report.load(json_path)
    print('GPU rehearsal: %d rows ran end to end through the GPU code paths (timings meaningless, '
          'not reported); %d did not run' % (len(rows), len(results.get('skipped') or [])))
    if results.get('failed'):
        return 1
    if scratch:   # nothing to keep: the folder was made for this run
        import shutil
        shutil.rmtree(scratch, ignore_errors=True)
    return 0


if __name__ == '__main__':
    sys.exit(main())
