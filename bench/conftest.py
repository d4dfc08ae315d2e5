"""pytest set-up of the benchmark suites.

- bench_*.py files are collected here even where ``python_files`` says test_*.py only;
- every benchmark's timer is ``harness.REPLAY_CLOCK``, so its stats are the CUDA-event
  (or perf_counter) samples the harness measured; a ``benchmark`` marker's other
  settings are kept;
- ``harness`` is one session-wide Harness: the measured ceilings are taken once;
- every kernel family is set to 'gpuk' for the session, so a gpuk row never dispatches to
  cuDNN whatever GPUK_KERNELS says;
- before the JSON is written, every row gets its ratio to the cudnn row of the same
  family and case, whichever ran first;
- ``--quick`` keeps one case per benchmark function and implementation (the first
  collected), for a run of about a minute;
- ``GPUK_GPU_REHEARSAL=1`` runs the GPU rows without a GPU (tests/gpu_rehearsal/bench_plugin.py:
  a NumPy stand-in for CuPy, the emulator, shrunken work, meaningless timings, scratch output).
"""
import fnmatch

import pytest

from bench import harness as _harness
from tests import gpu_rehearsal

# Before any row asks whether a GPU is usable: in the rehearsal the CuPy stand-in answers.
REHEARSAL = gpu_rehearsal.activate_if_requested()


def pytest_configure(config):
    if REHEARSAL:
        from tests.gpu_rehearsal import bench_plugin
        config.pluginmanager.register(bench_plugin, 'gpu_rehearsal_bench')   # pytest_configure is historic: it runs


def pytest_collect_file(file_path, parent):
    if file_path.suffix != '.py' or not fnmatch.fnmatch(file_path.name, 'bench_*.py'):
        return None
    if any(fnmatch.fnmatch(file_path.name, pattern) for pattern in parent.config.getini('python_files')):
        return None  # the ordinary collector takes it already
    if parent.session.isinitpath(file_path):
        return None  # named on the command line: pytest collects it itself
    return pytest.Module.from_parent(parent, path=file_path)


def pytest_addoption(parser):
    parser.addoption('--quick', action='store_true',
                     help='one case per benchmark function and implementation')


def _quick_key(item):
    """(file, function, impl): the rows --quick keeps one of."""
    params = getattr(getattr(item, 'callspec', None), 'params', {})
    return item.path, item.originalname, params.get('impl')


def pytest_collection_modifyitems(config, items):
    if config.getoption('--quick'):
        seen, kept, dropped = set(), [], []
        for item in items:
            key = _quick_key(item)
            (dropped if key in seen else kept).append(item)
            seen.add(key)
        if dropped:
            config.hook.pytest_deselected(items=dropped)
            items[:] = kept
    for item in items:
        if 'benchmark' not in getattr(item, 'fixturenames', ()):
            continue
        marker = item.get_closest_marker('benchmark')
        settings = dict(marker.kwargs) if marker else {}
        settings['timer'] = _harness.REPLAY_CLOCK
        item.add_marker(pytest.mark.benchmark(**settings))


@pytest.fixture(scope='session', autouse=True)
def _gpuk_rows_run_gpuk_kernels():
    """Every family on gpuk's kernels for the session, whatever GPUK_KERNELS says: a 'gpuk' row
    calls the public launchers, which would otherwise dispatch to cuDNN (the 'cudnn' rows call
    the cuDNN modules directly)."""
    from gpuk import config
    saved = config.kernels()
    config.set_kernels(**dict.fromkeys(config.KERNEL_FAMILIES, 'gpuk'))
    yield
    config.set_kernels(**saved)


@pytest.fixture(scope='session')
def harness():
    """The session's Harness (rows, ratios, measured ceilings)."""
    return _harness.Harness()


def pytest_benchmark_update_json(config, benchmarks, output_json):
    _harness.fill_ratios(b['extra_info'] for b in output_json.get('benchmarks', [])
                         if 'family' in (b.get('extra_info') or {}))
