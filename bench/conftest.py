"""pytest set-up of the benchmark suites.

- bench_*.py files are collected here even where ``python_files`` says test_*.py only;
- every benchmark's timer is ``harness.REPLAY_CLOCK``, so its stats are the CUDA-event
  (or perf_counter) samples the harness measured; a ``benchmark`` marker's other
  settings are kept;
- ``--rounds N`` (default 3; python -m bench: 5, --quick 3) runs every row N times, in rounds: all rows once, then all
  again, so a burst of load lands on different rows each round rather than on all
  repeats of one; the report takes the median of a row's round medians and their
  spread (max / min) says how steady the machine was;
- rows that cannot run on this host are deselected at collection and their reasons kept
  (a GPU row without a GPU, a torch row without torch); the CPU rows of the GPU suites (NumPy and
  torch at GPU problem sizes) are the GPU rows' baselines and skip on a host without a
  GPU, where bench_cpu.py compares the same families at CPU sizes
  (``--gpu-suite-cpu-rows`` runs them anyway);
- the results JSON gets ``machine_info['gpuk_bench']`` (device, mode, rounds, thread
  settings, load average at the start and end) and ``skipped`` (every row that did not
  run, with why);
- ``harness`` is one session-wide Harness: the measured ceilings are taken once;
- every kernel family is set to 'gpuk' for the session, so a gpuk row never dispatches to
  cuDNN whatever GPUK_KERNELS says;
- ``--quick`` keeps one case per benchmark function and implementation (the first
  collected);
- ``GPUK_GPU_REHEARSAL=1`` runs the GPU rows without a GPU (tests/gpu_rehearsal/bench_plugin.py:
  a NumPy stand-in for CuPy, the emulator, shrunken work, meaningless timings, scratch output).
"""
import datetime
import fnmatch
import os

import pytest

from bench import harness as _harness
from bench import runs
from tests import gpu_rehearsal

# Before any row asks whether a GPU is usable: in the rehearsal the CuPy stand-in answers.
REHEARSAL = gpu_rehearsal.activate_if_requested()
CPU_SUITES = ('bench_cpu.py', 'bench_keras.py', 'bench_graph.py')
DEFAULT_ROUNDS = 3
_session = {'load_start': None, 'skipped': [], 'failed': [], 'first_round': set(), 'uses_torch': False}


def pytest_configure(config):
    _session['load_start'] = runs.load_average()
    _session['started'] = datetime.datetime.now(datetime.timezone.utc).strftime('%Y-%m-%d %H:%M:%S')
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
    parser.addoption('--rounds', type=int, default=DEFAULT_ROUNDS,
                     help='time every row this many times, interleaved (default %(default)s)')
    parser.addoption('--bench-mode', choices=runs.MODES, default=None,
                     help='how the results call this run (default: quick with --quick, else full)')
    parser.addoption('--gpu-suite-cpu-rows', action='store_true',
                     help='run the GPU suites\' NumPy/torch rows on a host without a GPU too')


@pytest.fixture(autouse=True)
def bench_round():
    """Which round this row belongs to (parametrized by pytest_generate_tests)."""
    return 0


def pytest_generate_tests(metafunc):
    if 'benchmark' in metafunc.fixturenames and 'bench_round' in metafunc.fixturenames:
        rounds = metafunc.config.getoption('--rounds', DEFAULT_ROUNDS)
        if rounds < 1:
            raise pytest.UsageError('--rounds must be >= 1, got %d' % rounds)
        metafunc.parametrize('bench_round', range(rounds), ids=['r%d' % r for r in range(rounds)])


def _params(item):
    return getattr(getattr(item, 'callspec', None), 'params', {})


def _quick_key(item):
    """(file, function, impl, round): the rows --quick keeps one of."""
    params = _params(item)
    return item.path, item.originalname, params.get('impl'), params.get('bench_round', 0)


def _skip_reason_at_collection(config, item):
    impl = _params(item).get('impl')
    if impl not in _harness.IMPLEMENTATIONS:
        return None
    if (item.path.name not in CPU_SUITES and _harness.device_kind(impl) == 'cpu'
            and not config.getoption('--gpu-suite-cpu-rows', False)
            and _harness.gpu_unusable_reason() is not None):
        return ('%s at GPU problem size: a GPU row\'s baseline, run on GPU hosts '
                '(bench_cpu.py compares the family on this CPU)' % impl)
    return _harness.skip_reason(impl)


@pytest.hookimpl(trylast=True)   # after -k / -m have deselected: what is left is this run's
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
    # all rows of round 0, then all of round 1, ...; within a round, the collected order
    order = {id(item): i for i, item in enumerate(items)}
    items.sort(key=lambda item: (_params(item).get('bench_round', 0), order[id(item)]))
    _session['first_round'] = {item.nodeid for item in items if _params(item).get('bench_round', 0) == 0}
    cannot_run = []
    for item in items:
        if 'benchmark' not in getattr(item, 'fixturenames', ()):
            continue
        marker = item.get_closest_marker('benchmark')
        settings = dict(marker.kwargs) if marker else {}
        settings['timer'] = _harness.REPLAY_CLOCK
        item.add_marker(pytest.mark.benchmark(**settings))
        reason = None if REHEARSAL else _skip_reason_at_collection(config, item)
        if reason:   # not run at all, so the progress line shows the rows that do run
            cannot_run.append(item)
            if item.nodeid in _session['first_round']:
                _session['skipped'].append({'test': item.nodeid, 'reason': reason})
    if cannot_run:
        config.hook.pytest_deselected(items=cannot_run)
        dropped = set(map(id, cannot_run))
        items[:] = [item for item in items if id(item) not in dropped]
    _session['uses_torch'] = any('torch' in item.name for item in items)   # torch loads in seconds: only if needed


def pytest_runtest_logreport(report):
    """Keeps why each row did not run (once per row: round 0 only) for the results JSON."""
    if report.skipped and report.when in ('setup', 'call'):
        reason = report.longrepr[2] if isinstance(report.longrepr, tuple) else str(report.longrepr)
        if report.nodeid in _session['first_round']:
            _session['skipped'].append({'test': report.nodeid,
                                        'reason': reason.replace('Skipped: ', '', 1)})
    elif report.failed:
        message = str(report.longrepr).strip().splitlines()
        _session['failed'].append({'test': report.nodeid, 'when': report.when,
                                   'error': message[-1] if message else ''})


@pytest.fixture(scope='session', autouse=True)
def _torch_threads():
    """torch.set_num_threads from OMP_NUM_THREADS (python -m bench sets it): torch does not
    read it after it has loaded, and every torch row must use the same count as NumPy."""
    threads = os.environ.get('OMP_NUM_THREADS', '')
    if threads.isdigit() and _session['uses_torch'] and _harness.skip_reason('torch') is None:
        import torch
        torch.set_num_threads(int(threads))
    yield


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


def run_info(config):
    """What the results JSON records about this run besides the rows."""
    mode = config.getoption('--bench-mode') or ('quick' if config.getoption('--quick') else 'full')
    return {
        'device': _harness.run_device(), 'mode': mode, 'rounds': config.getoption('--rounds'),
        'started_utc': _session.get('started'),
        'threads': _harness.thread_settings(),
        'load_average_start': _session['load_start'], 'load_average_end': runs.load_average(),
        'rehearsal': bool(REHEARSAL),
    }


def pytest_benchmark_update_json(config, benchmarks, output_json):
    output_json.setdefault('machine_info', {})['gpuk_bench'] = run_info(config)
    output_json['skipped'] = list(_session['skipped'])
    output_json['failed'] = list(_session['failed'])
