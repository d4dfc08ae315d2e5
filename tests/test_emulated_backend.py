"""GPUK_DEVICE=emulate: K functions computed by the CUDA kernels on the emulated runtime
give the same results as the NumPy device."""
import numpy as np
import pytest

from gpuk import backend as K
from gpuk import device


def _run_on(kind, build, arrays):
    saved = dict(device._state)
    device.set_device(kind)
    try:
        placeholders = [K.placeholder(a.shape, dtype=a.dtype.name) for a in arrays]
        outputs = build(*placeholders)
        outputs = outputs if isinstance(outputs, list) else [outputs]
        loss = K.sum(outputs[0] * outputs[0])
        grads = [g for g in K.gradients(loss, placeholders) if g is not None]
        return K.function(placeholders, outputs + grads)(arrays)
    finally:
        device._state.update(saved)


CASES = {
    'bias_add_channels_last': (lambda x, b: K.bias_add(x, b), [(2, 3, 4, 5), (5,)]),
    'bias_add_channels_first': (lambda x, b: K.bias_add(x, b, data_format='channels_first'),
                                [(2, 5, 3, 4), (5,)]),
    'relu_of_bias_add': (lambda x, b: K.relu(K.bias_add(x, b)), [(3, 7), (7,)]),
}


@pytest.mark.parametrize('case', sorted(CASES))
def test_emulated_kernels_match_numpy_device(case):
    build, shapes = CASES[case]
    rng = np.random.default_rng(0)
    arrays = [rng.standard_normal(s).astype(np.float32) for s in shapes]
    assert device.kind() != 'emulate'
    on_cpu = _run_on('cpu', build, arrays)
    emulated = _run_on('emulate', build, arrays)
    for want, got in zip(on_cpu, emulated):
        np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)


def test_emulate_device_uses_the_kernel_launchers():
    saved = dict(device._state)
    device.set_device('emulate')
    try:
        assert device.impl().elementwise.__name__ == 'gpuk.kernels.elementwise'
        assert device.impl().xp is np
    finally:
        device._state.update(saved)
