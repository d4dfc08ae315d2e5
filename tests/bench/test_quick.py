"""python -m bench --quick keeps one case per benchmark function and implementation."""
import os
import subprocess
import sys
import textwrap

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


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
    env = dict(os.environ, PYTHONPATH=REPO)
    everything = subprocess.run(command, capture_output=True, text=True, cwd=tmp_path, env=env)
    quick = subprocess.run(command + ['--quick'], capture_output=True, text=True, cwd=tmp_path, env=env)
    assert '7 tests collected' in everything.stdout, everything.stdout + everything.stderr
    assert '3/7 tests collected (4 deselected)' in quick.stdout, quick.stdout + quick.stderr
    assert 'test_rows[1-numpy]' in quick.stdout and 'test_rows[1-torch]' in quick.stdout
