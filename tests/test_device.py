import numpy as np
import pytest

from gpuk import device


@pytest.fixture
def restore_device():
    saved = dict(device._state)
    yield
    device._state.update(saved)


def test_cpu_device_uses_numpy_and_the_numpy_twins(restore_device, monkeypatch):
    monkeypatch.setenv('GPUK_DEVICE', 'cpu')
    device._state.update(kind=None, impl=None)
    assert device.kind() == 'cpu'
    impl = device.impl()
    assert impl.xp is np
    assert impl.conv.__name__ == 'gpuk.cpu_fallback.conv'


def test_bad_device_name_is_rejected(restore_device, monkeypatch):
    monkeypatch.setenv('GPUK_DEVICE', 'tpu')
    device._state.update(kind=None, impl=None)
    with pytest.raises(device.DeviceError, match="GPUK_DEVICE must be one of .* got 'tpu'"):
        device.kind()
    with pytest.raises(ValueError, match='set_device: name must be one of'):
        device.set_device('tpu')


def test_cuda_without_gpu_says_why(restore_device, monkeypatch):
    monkeypatch.setattr(device, 'gpu_unusable_reason', lambda: 'CuPy cannot be imported (ImportError: x)')
    monkeypatch.setenv('GPUK_DEVICE', 'cuda')
    device._state.update(kind=None, impl=None)
    with pytest.raises(device.DeviceError, match='GPUK_DEVICE=cuda but no GPU is usable: CuPy cannot be imported'):
        device.kind()
    monkeypatch.setenv('GPUK_DEVICE', 'auto')
    device._state.update(kind=None, impl=None)
    assert device.kind() == 'cpu'


def test_unknown_family_is_an_attribute_error():
    with pytest.raises(AttributeError):
        device.impl().no_such_family


def test_host_device_copies_round_trip(on_device):
    value = np.arange(6, dtype=np.float32).reshape(2, 3)
    on = device.to_device(value)
    assert type(on).__module__.split('.')[0] == ('cupy' if on_device == 'cuda' else 'numpy')
    back = device.to_host(on)
    assert isinstance(back, np.ndarray)
    np.testing.assert_array_equal(back, value)
    assert device.to_device([1, 2], dtype='int64').dtype == np.int64
