"""Shared test set-up: the `gpu` marker (skipped without a usable GPU) and the device
fixture that runs a test body on every available array backend."""
import os

import numpy as np
import pytest

from gpuk import device


def _gpu_usable():
    return device.gpu_unusable_reason() is None


GPU_USABLE = _gpu_usable()


def pytest_collection_modifyitems(config, items):
    if GPU_USABLE:
        return
    skip = pytest.mark.skip(reason='needs a usable NVIDIA GPU (CuPy): %s' % device.gpu_unusable_reason())
    for item in items:
        if 'gpu' in item.keywords:
            item.add_marker(skip)


@pytest.fixture(params=['cpu', pytest.param('cuda', marks=pytest.mark.gpu)])
def on_device(request):
    """Runs the test on the NumPy device and, where a GPU is usable, on CuPy."""
    saved = dict(device._state)
    device.set_device(request.param)
    try:
        yield request.param
    finally:
        device._state.update(saved)


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


@pytest.fixture
def rng():
    return np.random.default_rng(int(os.environ.get('GPUK_TEST_SEED', '1234')))
