"""Shared test set-up: the `gpu` marker (skipped without a usable GPU) and the device
fixture that runs a test body on every implementation (NumPy twins, the CUDA kernels on the
emulated runtime, the CUDA kernels on a GPU), selected by markers (`-m "not emulate"`).

``GPUK_REQUIRE_GPU=1`` (bench/gpu_session.sh sets it) turns the skip into an error, so a
session meant to test the GPU cannot pass by skipping every `gpu` test.

``GPUK_GPU_REHEARSAL=1`` runs the `gpu` tests without a GPU (tests/gpu_rehearsal): CuPy is a
NumPy stand-in and the 'cuda' runtime runs the kernels in the emulator."""
import os

import numpy as np
import pytest

from gpuk import device
from gpuk.contracts.families import FAMILIES
from gpuk.kernels import runtime
from tests import gpu_rehearsal

# Before GPU_USABLE: in the rehearsal, the CuPy stand-in is what the probe must find.
REHEARSAL = gpu_rehearsal.activate_if_requested()


def _gpu_usable():
    return device.gpu_unusable_reason() is None


GPU_USABLE = _gpu_usable()


def pytest_configure(config):
    if REHEARSAL:
        from tests.gpu_rehearsal import plugin
        config.pluginmanager.register(plugin, 'gpu_rehearsal')


def pytest_collection_modifyitems(config, items):
    if GPU_USABLE:
        return
    reason = 'needs a usable NVIDIA GPU (CuPy): %s' % device.gpu_unusable_reason()
    if os.environ.get('GPUK_REQUIRE_GPU') == '1' and any('gpu' in item.keywords for item in items):
        raise pytest.UsageError('GPUK_REQUIRE_GPU=1 but the gpu tests would be skipped: ' + reason)
    skip = pytest.mark.skip(reason=reason)
    for item in items:
        if 'gpu' in item.keywords:
            item.add_marker(skip)


# The implementations a test body runs on: the NumPy twins, the CUDA kernels on the emulated
# runtime (any host), the CUDA kernels on a GPU. Select with markers: -m "not emulate", -m gpu.
IMPLEMENTATIONS = ['cpu', pytest.param('emulate', marks=pytest.mark.emulate), pytest.param('cuda', marks=pytest.mark.gpu)]


def assert_runs_on(kind):
    """The device, the array namespace, the kernel families and the kernels' runtime are those of
    `kind`: never a silent fallback (to NumPy, or to the emulator)."""
    impl = device.impl()
    assert device.kind() == kind and impl.kind == kind, 'running on %r, not %r' % (device.kind(), kind)
    if kind == 'cpu':
        assert impl.xp is np and impl.conv.__name__ == 'gpuk.cpu_fallback.conv'
        return
    assert impl.xp.__name__ == ('cupy' if kind == 'cuda' else 'numpy')
    assert runtime.current().kind == kind, 'the kernels run on %r, not %r' % (runtime.current().kind, kind)
    assert all(getattr(impl, family).__name__ == 'gpuk.kernels.' + family for family in FAMILIES)


@pytest.fixture(params=IMPLEMENTATIONS)
def on_device(request, monkeypatch):
    """Runs the test once per implementation (see IMPLEMENTATIONS), checking before and after
    the body that it ran there.

    On 'emulate' (and in every test of the GPU rehearsal, whose 'cuda' runs the emulator:
    tests/gpu_rehearsal/plugin.py), plans keep their elementwise steps unfused
    (GPUK_FUSE_ELEMENTWISE=0) unless the test is marked `fuse_elementwise`: every distinct fused group is a kernel the emulator
    compiles with g++ (about a second each, some 160 over the op and model tests), while the
    generated kernels are proven against the unfused ops by the tests marked so
    (tests/test_fusion_elementwise.py, tests/keras/test_rnn_fusion.py) and by
    tests/kernels/test_fused_elementwise.py.

    Restores the device and the kernels' current runtime afterwards: device.impl() points the
    runtime at 'cuda', and a later test on 'emulate' must not launch there with NumPy arrays."""
    if request.param == 'emulate' and request.node.get_closest_marker('fuse_elementwise') is None:
        monkeypatch.setenv('GPUK_FUSE_ELEMENTWISE', '0')
    saved = dict(device._state)
    saved_runtime = runtime.current_setting()
    device.set_device(request.param)
    try:
        assert_runs_on(request.param)
        yield request.param
        assert_runs_on(request.param)
    finally:
        device._state.update(saved)
        runtime.set_current(saved_runtime)


@pytest.fixture(autouse=True)
def _fresh_session():
    """Each test starts with a clean graph session (learning phase, names, uids) and leaves
    floatx / epsilon / image_data_format as it found them."""
    from gpuk import backend as K
    K.clear_session()
    saved = K.floatx(), K.epsilon(), K.image_data_format()
    yield
    K.set_floatx(saved[0])
    K.set_epsilon(saved[1])
    K.set_image_data_format(saved[2])


@pytest.fixture(autouse=True)
def _step_buffers_kept_as_before():
    """An allocation failure stops keeping step buffers for the rest of the process
    (prepared.stop_keeping_buffers); each test starts and leaves that switch as it found it."""
    from gpuk.kernels.runtime import prepared
    saved = prepared._not_kept[:], prepared._stopped[:]
    yield
    prepared._not_kept[:], prepared._stopped[:] = saved


@pytest.fixture
def restore_precision():
    """Puts gpuk's precision policy (gpuk.config.set_precision) back as the test found it."""
    from gpuk import config as gpuk_config
    saved = gpuk_config.precision()
    yield
    gpuk_config.set_precision(saved)


@pytest.fixture
def conv_runs_out_of_memory_past(monkeypatch):
    """The NumPy twin's forward convolution fails for a batch above ``limit[0]`` (set by the
    test; None: never) as NumPy does when an array does not fit (its own MemoryError, asking
    for 2**47 bytes per sample)."""
    from gpuk.cpu_fallback import conv as conv_twin
    limit = [None]
    conv_fwd = conv_twin.conv_fwd

    def short_of_memory(x, w, *args, **kwargs):
        if limit[0] is not None and x.shape[0] > limit[0]:
            np.empty((x.shape[0], 1 << 45), x.dtype)
        return conv_fwd(x, w, *args, **kwargs)

    monkeypatch.setattr(conv_twin, 'conv_fwd', short_of_memory)
    return limit


@pytest.fixture
def deferred_checks(monkeypatch):
    """Checks of device values deferred to the read after the step, as gpuk runs them by default:
    the tests of that mechanism (what is pending, how many host syncs) hold in a debugging run
    under GPUK_SYNC_LAUNCHES=1 too, where every other test reads each check at its call."""
    monkeypatch.delenv('GPUK_SYNC_LAUNCHES', raising=False)


@pytest.fixture
def rng():
    return np.random.default_rng(int(os.environ.get('GPUK_TEST_SEED', '1234')))


@pytest.fixture
def on():
    """``on(kind)`` switches gpuk's device for the rest of the test; the device and the
    kernels' runtime come back afterwards."""
    saved, saved_runtime = dict(device._state), runtime.current_setting()
    yield device.set_device
    device._state.update(saved)
    runtime.set_current(saved_runtime)
