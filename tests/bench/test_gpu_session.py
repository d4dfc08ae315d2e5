"""What of bench/gpu_session.sh's GPU-only parts can be checked without a GPU: the script
parses and documents its parts, the sanitizer's list of tests (bench/sanitize.py) covers every
kernel source and still names tests that exist, bench/ncu_cases.py's cases run (in the GPU
rehearsal; on a GPU too, unprofiled), and the sanitizer and ncu parts hand the tools their
options and run those scripts (stand-in tools, the GPU rehearsal)."""
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
    loop = source[source.rindex('for part in "${PART_LIST[@]}"'):source.index('BENCH_FILTER+=')]
    parts = re.findall(r'^\s+([a-z0-9-]+)\)', loop, re.M)
    assert {'tests', 'sanitizer', 'ncu', 'ncu-cudnn', 'keras3'} <= set(parts)
    known = re.search(r'^KNOWN_PARTS=" (.*) "$', source, re.M).group(1).split()
    assert sorted(known) == sorted(parts), 'KNOWN_PARTS (checked before any part runs) and the parts run differ'
    undocumented = [part for part in parts if not re.search(r'(^|\s)%s(\s|:)' % re.escape(part), usage, re.M)]
    assert not undocumented, 'parts missing from the script\'s header (--help): %s' % undocumented


def test_an_unknown_part_fails_before_any_part_runs(tmp_path):
    env = dict(os.environ, OUT=str(tmp_path), PYTHON=sys.executable)
    done = subprocess.run(['bash', str(SCRIPT), '--parts', 'info,tests,bench-quik,bench-', '--budget', '30'],
                          capture_output=True, text=True, env=env, timeout=60)
    assert done.returncode == 2 and "unknown part 'bench-quik'" in done.stdout, done.stdout
    assert '=== ' not in done.stdout and 'bench-FAMILY' in done.stdout   # no part ran


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


FAKE_SANITIZER = '''#!/bin/bash
[ "$1" = --version ] && { echo "fake compute-sanitizer"; exit 0; }
echo "fake compute-sanitizer: $*"
while [[ "$1" == --* ]]; do shift 2; done
"$@"
'''
FAKE_NCU = '''#!/bin/bash
case "$1" in --list-sections) echo "SpeedOfLight MemoryWorkloadAnalysis"; exit 0 ;;
             --version) echo "fake ncu"; exit 0 ;; esac
echo "fake ncu: $*"
while [[ "$1" == --* ]]; do
    case "$1" in --nvtx) shift ;; --log-file) echo "  fake_kernel() (1, 1, 1)x(32, 1, 1)" > "$2"; shift 2 ;;
                 *) shift 2 ;; esac
done
exec "$@"
'''


@pytest.mark.skipif(any((REPO / '.whl').glob('*.whl')), reason='the script would install .whl/ (a GPU session\'s wheels)')
def test_sanitizer_and_ncu_parts_run_their_scripts(tmp_path):
    """The parts' shell plumbing, in the GPU rehearsal with stand-ins for compute-sanitizer and ncu
    that print their options and run the program: the tools get the options docs/kernels.md
    names, bench.sanitize runs its tests, bench.ncu_cases its cases (tiny, through NCU_ARGS)."""
    tools = tmp_path / 'bin'
    tools.mkdir()
    for name, text in (('compute-sanitizer', FAKE_SANITIZER), ('ncu', FAKE_NCU)):
        (tools / name).write_text(text)
        (tools / name).chmod(0o755)
    out = tmp_path / 'out'
    env = dict(os.environ, PATH='%s:%s' % (tools, os.environ['PATH']), PYTHON=sys.executable, OUT=str(out),
               GPUK_GPU_REHEARSAL='1', SANITIZER_SECONDS='200', NCU_ARGS='--small --cases conv_fwd,ctc_loss')
    env.pop('PYTHONPATH', None)
    # tests/kernels/conftest.py compiles into a fresh cache per session unless this is set (make
    # test sets it): the runtime's own cache, so the emulator builds the modules once, not per run
    from gpuk.kernels import runtime
    env.setdefault('GPUK_CACHE_DIR', str(runtime.cache_dir()))
    done = subprocess.run(['bash', str(SCRIPT), '--parts', 'sanitizer,ncu', '--sync', '--budget', '400'],
                          capture_output=True, text=True, env=env, timeout=600)
    log = (out / 'session.log').read_text()
    assert done.returncode == 0, log[-4000:]
    assert 'fake compute-sanitizer: --tool memcheck --target-processes all --error-exitcode 86' in log
    assert '--tool racecheck' in log and '--racecheck-report analysis' in log
    assert log.count('%d passed' % len(sanitize.node_ids())) == 2, log[-4000:]
    assert 'fake ncu: --profile-from-start off --nvtx --clock-control none' in log
    assert '--section SpeedOfLight --section MemoryWorkloadAnalysis --log-file' in log
    assert 'ncu case conv_fwd (gpuk' in log and 'ncu case ctc_loss (gpuk' in log
    assert (out / 'ncu.txt').exists()


def test_every_part_together_writes_at_most_the_eight_files_the_header_names():
    """The device tool brings back 8 files of $OUT at most: whatever parts a call names, the
    script writes only the files its header lists (bench.json's report beside it: .md, .png)."""
    source = SCRIPT.read_text()
    header = source[:source.index('set -uo pipefail')]
    listed = re.search(r'at most 8 files .*?:(.*?)\. The exit status', header, re.S).group(1)
    listed = set(re.findall(r'[\w-]+\.\w+', listed))
    written = set(re.findall(r'\$OUT/([\w-]+\.\w+)', source))
    written |= set(re.findall(r'run_ncu ([\w-]+\.txt)', source))   # run_ncu FILE writes $OUT/FILE
    if 'bench.json' in written:                                     # python -m bench --out "$OUT"
        written |= {'bench.md', 'bench.png'}
    assert written == listed and len(listed) <= 8, (sorted(written), sorted(listed))
