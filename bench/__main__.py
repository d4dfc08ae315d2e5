"""python -m bench [--json PATH] [--out DIR] [PYTEST ARGS...]

Runs every suite in bench/ under pytest-benchmark, writes the results JSON, then the
report (markdown table and PNG plot, see bench/report.py). Extra arguments go to pytest,
e.g. ``-k conv`` or ``--benchmark-disable``.
"""
import argparse
import os
import sys

import pytest

from bench import report


def main(argv=None):
    parser = argparse.ArgumentParser(prog='python -m bench', description=__doc__.split('\n\n')[1])
    parser.add_argument('--json', default=os.path.join('bench-results', 'results.json'),
                        help='where the pytest-benchmark JSON goes (default %(default)s)')
    parser.add_argument('--out', default=None, help='folder of the report (default: the JSON folder)')
    args, pytest_args = parser.parse_known_args(argv)
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
