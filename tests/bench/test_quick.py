"""python -m bench: --quick keeps one case per benchmark function and implementation; every
run writes its own results files and moves the `latest` pointer."""
import json
import os
import subprocess
import sys
import textwrap

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
ENV = dict(os.environ, PYTHONPATH=REPO)


def test_quick_keeps_one_case_per_function_and_impl(tmp_path):
    suite = tmp_path / 'bench_fake.py'
    suite.write_text(textwrap.dedent('''
        import pytest

        @pytest.mark.parametrize('impl', ['numpy', 'torch'])
        @pytest.mark.parametrize('size', [1, 2, 3])
        def test_rows(size, impl):
            pass

        def test_single():
            pass
    '''))
    conftest = tmp_path / 'conftest.py'
    conftest.write_text('from bench.conftest import pytest_addoption, pytest_collection_modifyitems\n')
    command = [sys.executable, '-m', 'pytest', str(suite), '--collect-only', '-q', '-p', 'no:cacheprovider',
               '--rootdir', str(tmp_path)]
    everything = subprocess.run(command, capture_output=True, text=True, cwd=tmp_path, env=ENV)
    quick = subprocess.run(command + ['--quick'], capture_output=True, text=True, cwd=tmp_path, env=ENV)
    assert '7 tests collected' in everything.stdout, everything.stdout + everything.stderr
    assert '3/7 tests collected (4 deselected)' in quick.stdout, quick.stdout + quick.stderr
    assert 'test_rows[1-numpy]' in quick.stdout and 'test_rows[1-torch]' in quick.stdout


# One cheap row through the real runner and harness: NumPy summing 1,000 floats.
FAKE_SUITE = '''
import numpy as np
import pytest


@pytest.mark.parametrize('size', [1000, 2000])
def test_sum(benchmark, harness, size):
    harness.run(benchmark, family='fake', case='sum %d' % size, impl='numpy', fn=np.sum,
                make_inputs=lambda i: (np.full(size, float(i)),), set_bytes=8 * size)


def test_never(benchmark):
    pytest.skip('fake row: cannot run here')
'''


def _run_bench(suites, results, *extra, status=0):
    command = [sys.executable, '-m', 'bench', '--suites', str(suites), '--results-dir', str(results),
               '--rounds', '2', '-q', *extra]
    done = subprocess.run(command, capture_output=True, text=True, cwd=REPO, env=ENV, timeout=300)
    assert done.returncode == status, done.stdout + done.stderr
    return done.stdout


def test_quick_run_after_full_run_leaves_both_result_files(tmp_path):
    suites, results = tmp_path / 'suites', tmp_path / 'results'
    suites.mkdir()
    (suites / 'bench_fake.py').write_text(FAKE_SUITE)
    _run_bench(suites, results)
    full, = [p for p in os.listdir(results) if p.endswith('-full.json')]
    assert (results / 'latest').read_text().strip() == full
    output = _run_bench(suites, results, '--quick')
    quick, = [p for p in os.listdir(results) if p.endswith('-quick.json')]
    assert (results / 'latest').read_text().strip() == quick
    assert sorted(p for p in os.listdir(results) if p.endswith('.json')) == sorted([full, quick])
    for name in (full, quick):   # each with its own report
        assert (results / name.replace('.json', '.md')).exists()
    rows_per_run = {name: {b['extra_info']['case'] for b in json.loads((results / name).read_text())['benchmarks']}
                    for name in (full, quick)}
    assert rows_per_run == {full: {'sum 1000', 'sum 2000'}, quick: {'sum 1000'}}
    info = json.loads((results / quick).read_text())['machine_info']['gpuk_bench']
    assert info['mode'] == 'quick' and info['rounds'] == 2
    assert info['threads']['OPENBLAS_NUM_THREADS'] == '1' and info['threads']['OMP_NUM_THREADS'] == '1'
    assert len(info['load_average_start']) == 3
    assert 'compare with the run before: python -m bench.report' in output
    assert '- 1 row: fake row: cannot run here' in output   # once, not once per round


def test_strict_exits_3_when_rounds_disagree(tmp_path):
    suites = tmp_path / 'suites'
    suites.mkdir()
    (suites / 'bench_fake.py').write_text(FAKE_SUITE)
    # any two rounds differ by a factor >= 1, so a threshold under 1 marks every row noisy
    output = _run_bench(suites, tmp_path / 'results', '--strict', '--max-spread', '0.99', status=3)
    assert 'WARNING: 2 of 2 rows varied by more than 0.99x between rounds' in output
