"""What of bench/gpu_session.sh's GPU-only parts can be checked without a GPU: the script
parses and documents its parts, the sanitizer's list of tests (bench/sanitize.py) covers every
kernel source and still names tests that exist, and bench/ncu_cases.py's cases run (in the GPU
rehearsal; on a GPU too, unprofiled)."""
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from bench import ncu_cases, sanitize

REPO = Path(__file__).resolve().parents[2]
SCRIPT = REPO / 'bench' / 'gpu_session.sh'


def test_gpu_session_script_parses_and_documents_every_part():
    subprocess.run(['bash', '-n', str(SCRIPT)], check=True)
    usage = subprocess.run(['bash', str(SCRIPT), '--help'], capture_output=True, text=True, check=True).stdout
    source = SCRIPT.read_text()
    loop = source[source.index('for part in "${PART_LIST[@]}"'):source.index('BENCH_FILTER+=')]
    parts = re.findall(r'^\s+([a-z0-9-]+)\)', loop, re.M)
    assert {'tests', 'sanitizer', 'ncu', 'ncu-cudnn', 'keras3'} <= set(parts)
    undocumented = [part for part in parts if not re.search(r'(^|\s)%s(\s|:)' % re.escape(part), usage, re.M)]
    assert not undocumented, 'parts missing from the script\'s header (--help): %s' % undocumented


def test_sanitizer_tests_cover_every_kernel_source():
    kernels = REPO / 'gpuk' / 'kernels'
    sources = {str(p.relative_to(kernels)) for p in kernels.rglob('*.cu')}
    assert set(sanitize.TESTS) == sources, 'bench/sanitize.py TESTS: one entry per gpuk/kernels/**/*.cu'
    assert all(node.startswith('tests/kernels/') and '[cuda' in node for node in sanitize.node_ids())


def test_sanitizer_tests_exist():
    """Every node id collects as a `gpu` test (pytest fails on an id it cannot find)."""
    ids = sanitize.node_ids()
    done = subprocess.run([sys.executable, '-m', 'pytest', '--collect-only', '-q', '-m', 'gpu', *ids],
                          capture_output=True, text=True, cwd=REPO, env=dict(os.environ, PYTHONPATH=str(REPO)),
                          timeout=300)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    assert '%d tests collected' % len(ids) in done.stdout, done.stdout[-3000:]


def test_ncu_cases_profile_benchmark_rows():
    """Each case's full shape is one a benchmark row times, so its profile explains that row."""
    from bench import bench_batchnorm, bench_conv, bench_ctc, bench_softmax_xent
    assert ncu_cases.CONV in bench_conv.RESNET_CASES and ncu_cases.DEPTHWISE in bench_conv.DEPTHWISE_CASES
    assert ncu_cases.BN in bench_batchnorm.SHAPES and ncu_cases.XENT in bench_softmax_xent.SHAPES
    assert ncu_cases.CTC in bench_ctc.LOSS_CASES


def test_ncu_cases_arguments(capsys):
    assert ncu_cases.main(['--list']) == {}
    assert capsys.readouterr().out.split() == list(ncu_cases.CASES)
    with pytest.raises(SystemExit):
        ncu_cases.parse(['--cases', 'conv_fwd,nonesuch'])


@pytest.mark.gpu
def test_ncu_cases_run_each_case_once_through_gpuk():
    """Every case builds, warms up and makes its profiled call (small shapes): the script the
    `ncu` part profiles runs through, and each case launches gpuk's kernels."""
    launches = ncu_cases.main(['--small', '--warmup', '1'])
    assert set(launches) == set(ncu_cases.CASES)
    assert all(count >= 1 for count in launches.values()), launches
