"""pytest hooks of the GPU rehearsal for bench/ (bench/conftest.py registers this module when active).

The point is to run the Python of every GPU row (row builders, launcher arguments, the
harness's CUDA-event timing, ceilings, extra_info, the JSON) end to end. Timings are host
times of the emulator and mean nothing, so

- only GPU rows run (impl gpuk/cudnn/cupy, and gpuk on the current device in bench_keras);
- the benchmark shapes are far beyond the emulator (ResNet layers, 1 GiB copies): inside a
  harness row, launches whose arrays total more than DRY_LAUNCH_BYTES are checked but not
  run (see rehearsal_runtime.py; the rows check no results, and the Keras rows, which
  train, are not harness rows), rows whose input set is over MAX_SET_BYTES are skipped, and the
  ceilings are calibrated on CALIBRATION_BYTES and MATMUL_SIZE instead of 1 GiB / 8192^2;
- ``--quick`` keeps, per benchmark function and implementation, the first row that *runs*
  rather than the first collected (which is often over the cap): later rows of a function
  that already ran skip at setup;
- results may only go to a scratch path (never under the repository), and every GPU row's
  device says "GPU rehearsal ... timings are meaningless".
"""
import functools
import os
import tempfile
from pathlib import Path

import pytest

from . import rehearsal_runtime

DRY_LAUNCH_BYTES = 4 << 20
MAX_SET_BYTES = 256 << 20
CALIBRATION_BYTES = 1 << 20
MATMUL_SIZE = 256
REPOSITORY = Path(__file__).resolve().parents[2]
CPU_ONLY_FILES = ('bench_cpu.py',)


def check_scratch_path(path, what):
    """Raise pytest.UsageError when ``path`` lies inside the repository (rehearsal results are not results)."""
    resolved = Path(path).resolve()
    if resolved == REPOSITORY or REPOSITORY in resolved.parents:
        raise pytest.UsageError('GPU rehearsal: %s %s is inside the repository; rehearsal timings are meaningless '
                                'and go to a scratch folder only (default: a fresh temporary folder)' % (what, path))


def scratch_folder():
    return tempfile.mkdtemp(prefix='gpuk-gpu-rehearsal-')


def _patch_harness():
    from bench import harness
    harness.GPU_CALIBRATION_BYTES = CALIBRATION_BYTES
    harness.measure_gpu_copy = functools.partial(harness.measure_gpu_copy, nbytes=CALIBRATION_BYTES)
    harness._MATMUL_SIZE = {dtype: MATMUL_SIZE for dtype in harness._MATMUL_SIZE}
    run = harness.Harness.run

    @functools.wraps(run)
    def capped_run(self, benchmark, **row):
        if row['impl'] in harness.GPU_IMPLS and row['set_bytes'] > MAX_SET_BYTES:
            pytest.skip('GPU rehearsal: one input set is %d MiB, over the rehearsal cap of %d MiB'
                        % (row['set_bytes'] >> 20, MAX_SET_BYTES >> 20))
        rehearsal_runtime.set_dry_launch_bytes(DRY_LAUNCH_BYTES)
        try:
            return run(self, benchmark, **row)
        finally:
            rehearsal_runtime.set_dry_launch_bytes(None)
    harness.Harness.run = capped_run


def pytest_configure(config):
    json_option = getattr(config.option, 'benchmark_json', None)
    if json_option is not None:
        # pytest-benchmark gives an open file (older releases: argparse created it) or a path (newer)
        opened = hasattr(json_option, 'close')
        json_path = json_option.name if opened else os.fspath(json_option)
        try:
            check_scratch_path(json_path, '--benchmark-json')
        except pytest.UsageError:
            if opened:
                json_option.close()
                if os.path.getsize(json_path) == 0:   # leave nothing behind
                    os.unlink(json_path)
            raise
    if getattr(config.option, 'benchmark_autosave', False) or getattr(config.option, 'benchmark_save', None):
        raise pytest.UsageError('GPU rehearsal: --benchmark-save/--benchmark-autosave would keep meaningless timings')
    _patch_harness()
    if config.getoption('--quick'):   # bench/conftest.py's collection-time choice is replaced, see above
        config.option.quick = False
        _quick['enabled'] = True


_quick = {'enabled': False, 'ran': set()}


def _quick_key(item):
    from bench.conftest import _quick_key as bench_quick_key
    return bench_quick_key(item)


@pytest.hookimpl(tryfirst=True)
def pytest_runtest_setup(item):
    if _quick['enabled'] and _quick_key(item) in _quick['ran']:
        pytest.skip('GPU rehearsal --quick: a row of this function and implementation ran already')


def pytest_runtest_logreport(report):
    if _quick['enabled'] and report.when == 'call' and report.passed:
        _quick['ran'].add(_quick['keys'].get(report.nodeid))


def pytest_report_header(config):
    return ('GPU rehearsal (GPUK_GPU_REHEARSAL=1): GPU rows on a NumPy stand-in for CuPy and the emulator; '
            'launches over %d MiB are dry, sets over %d MiB skip; TIMINGS ARE MEANINGLESS'
            % (DRY_LAUNCH_BYTES >> 20, MAX_SET_BYTES >> 20))


def _is_gpu_row(item):
    from bench import harness
    if item.path.name in CPU_ONLY_FILES or 'torch' in item.name:
        return False
    impl = getattr(getattr(item, 'callspec', None), 'params', {}).get('impl')
    return impl is None or impl in harness.GPU_IMPLS


@pytest.hookimpl(tryfirst=True)   # before bench/conftest.py's --quick picks one row per function and impl
def pytest_collection_modifyitems(config, items):
    kept, dropped = [], []
    for item in items:
        (kept if _is_gpu_row(item) else dropped).append(item)
    if dropped:
        config.hook.pytest_deselected(items=dropped)
        items[:] = kept
    _quick['keys'] = {item.nodeid: _quick_key(item) for item in items}


def rehearsal_json_path(requested):
    """Where `python -m bench` writes in the rehearsal: a scratch file (``requested`` if outside the repo)."""
    if requested is None:
        return os.path.join(scratch_folder(), 'gpu-rehearsal.json')
    check_scratch_path(requested, '--json')
    return requested
