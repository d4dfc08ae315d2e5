import os
import types

import pytest

from gpuk import config
from gpuk.kernels import dispatch, runtime
from gpuk.kernels.inspect import sass
from gpuk.kernels.runtime import build, deferred
from gpuk.kernels.cudnn import library as cudnn_library

KERNEL_RUNTIMES = ['emulate', pytest.param('cuda', marks=pytest.mark.gpu)]


@pytest.fixture(scope='session', autouse=True)
def _kernel_cache_dir(tmp_path_factory):
    """Compile into a fresh per-session cache (each emulated module builds in < 1 s)."""
    if os.environ.get('GPUK_CACHE_DIR'):
        yield
        return
    os.environ['GPUK_CACHE_DIR'] = str(tmp_path_factory.mktemp('gpuk-cache'))
    try:
        yield
    finally:
        os.environ.pop('GPUK_CACHE_DIR', None)


@pytest.fixture(scope='module', autouse=True)
def _emulator_sanitizer():
    """The emulator runs as a sanitizer in the kernel tests (racecheck, initcheck, cp.async,
    synccheck; docs/kernels.md) unless GPUK_EMU_SANITIZE is set explicitly."""
    if 'GPUK_EMU_SANITIZE' in os.environ:
        yield
        return
    os.environ['GPUK_EMU_SANITIZE'] = '1'
    try:
        yield
    finally:
        os.environ.pop('GPUK_EMU_SANITIZE', None)


@pytest.fixture(autouse=True)
def _deferred_checks_pass():
    """Every deferred argument check a test leaves (runtime/deferred.py) must pass: good input
    never sets a flag."""
    deferred.discard()
    yield
    deferred.raise_pending()


@pytest.fixture(scope='session')
def sass_tools():
    """Skips the test unless NVRTC and nvdisasm (the inspect report's compile and SASS tools,
    pip packages of the dev extra) are installed."""
    try:
        build.nvrtc_version()
        sass.find_tool('nvdisasm')
    except (build.NvrtcMissing, sass.ToolMissing) as exc:
        pytest.skip(str(exc))


@pytest.fixture(params=KERNEL_RUNTIMES)
def kernel_runtime(request):
    """Each kernel runtime: 'emulate' always, 'cuda' where a GPU is usable."""
    if request.param == 'cuda' and not runtime.cuda_usable():
        pytest.skip('no usable CUDA GPU')
    return runtime.get_runtime(request.param)


@pytest.fixture
def emulator():
    return runtime.get_runtime('emulate')


@pytest.fixture
def cuda_standin(monkeypatch, emulator):
    """The emulator presented as the CUDA runtime, with cuDNN reported available."""
    standin = types.SimpleNamespace(kind='cuda', xp=emulator.xp, load=emulator.load,
                                    kernel_launch=emulator.kernel_launch)
    monkeypatch.setattr(runtime, 'current', lambda: standin)
    monkeypatch.setattr(cudnn_library, 'available', lambda: True)
    monkeypatch.setattr(config, '_kernels', dict(config._kernels))
    monkeypatch.setattr(dispatch, '_warned', set())
    monkeypatch.setattr(dispatch, '_auto_choice', {})
    return standin


@pytest.fixture(scope='module')
def frontend():
    """The cuDNN Frontend module (skips where it or libcudnn cannot be loaded)."""
    from tests.kernels.cudnn_planning import frontend_or_skip
    return frontend_or_skip()


@pytest.fixture(scope='module')
def h100(frontend):
    """An H100 as a frontend device_property, to plan graphs without a GPU (needs libcudnn)."""
    from tests.kernels.cudnn_planning import h100_or_skip
    return h100_or_skip(frontend)
