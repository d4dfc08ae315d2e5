"""python -m bench [--quick] [--json PATH] [--out DIR] [PYTEST ARGS...]

Runs every suite in bench/ that applies to this host under pytest-benchmark (GPU rows skip
without a GPU), writes the results JSON (default bench/results/<device>-<date>.json), then
the report beside it (markdown table and PNG plot, see bench/report.py). ``--quick`` runs
one case per benchmark and implementation. Extra arguments go to pytest, e.g. ``-k conv``.
"""
import argparse
import datetime
import os
import re
import sys

import pytest

from bench import harness, report


def default_json_path():
    """bench/results/<device>-<date>.json, the device being the GPU if one is usable."""
    device = harness.gpu_name() if harness.gpu_unusable_reason() is None else 'cpu-' + harness.cpu_name()
    slug = re.sub(r'[^A-Za-z0-9]+', '-', device).strip('-').lower()
    here = os.path.dirname(os.path.abspath(__file__))
    return os.path.join(here, 'results', '%s-%s.json' % (slug, datetime.date.today().isoformat()))


def main(argv=None):
    parser = argparse.ArgumentParser(prog='python -m bench', description=__doc__.split('\n\n')[1])
    parser.add_argument('--json', default=None,
                        help='where the pytest-benchmark JSON goes (default bench/results/<device>-<date>.json)')
    parser.add_argument('--quick', action='store_true', help='one case per benchmark and implementation')
    parser.add_argument('--out', default=None, help='folder of the report (default: the JSON folder)')
    args, pytest_args = parser.parse_known_args(argv)
    from tests import gpu_rehearsal
    if gpu_rehearsal.activate_if_requested():   # GPUK_GPU_REHEARSAL=1: meaningless timings, scratch files only
        from tests.gpu_rehearsal import bench_plugin
        try:
            args.json = bench_plugin.rehearsal_json_path(args.json)
            if args.out:
                bench_plugin.check_scratch_path(args.out, '--out')
        except pytest.UsageError as exc:
            parser.error(str(exc))
        print('GPU rehearsal: results go to %s (timings are meaningless)' % args.json)
    args.json = args.json or default_json_path()
    if args.quick:
        pytest_args = ['--quick'] + pytest_args
    os.makedirs(os.path.dirname(os.path.abspath(args.json)), exist_ok=True)
    here = os.path.dirname(os.path.abspath(__file__))
    code = pytest.main([here, '--benchmark-json=%s' % args.json, '-p', 'no:cacheprovider']
                       + pytest_args)
    if code not in (pytest.ExitCode.OK, pytest.ExitCode.TESTS_FAILED) or not os.path.exists(args.json):
        return int(code)
    status = report.main([args.json] + (['--out', args.out] if args.out else []))
    return int(code) or status


if __name__ == '__main__':
    sys.exit(main())
