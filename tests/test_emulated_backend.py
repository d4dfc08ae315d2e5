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
        # random weights, so the gradient is not a cancellation (e.g. sum(bn(x)^2) is flat in x)
        weights = np.random.default_rng(2).standard_normal(K.int_shape(outputs[0])).astype(outputs[0].dtype)
        loss = K.sum(outputs[0] * K.constant(weights))
        grads = [g for g in K.gradients(loss, placeholders) if g is not None]
        return K.function(placeholders, outputs + grads)(arrays)
    finally:
        device._state.update(saved)


CASES = {
    'bias_add_channels_last': (lambda x, b: K.bias_add(x, b), [(2, 3, 4, 5), (5,)]),
    'bias_add_channels_first': (lambda x, b: K.bias_add(x, b, data_format='channels_first'),
                                [(2, 5, 3, 4), (5,)]),
    'relu_of_bias_add': (lambda x, b: K.relu(K.bias_add(x, b)), [(3, 7), (7,)]),
    'max_pool2d_same': (lambda x: K.pool2d(x, (3, 3), (2, 2), 'same', pool_mode='max'), [(2, 7, 6, 3)]),
    'avg_pool2d_channels_first': (lambda x: K.pool2d(x, (2, 2), (1, 2), 'valid', 'channels_first', 'avg'),
                                  [(2, 3, 5, 6)]),
    'max_pool3d': (lambda x: K.pool3d(x, (2, 2, 2), (2, 2, 2), 'valid', pool_mode='max'), [(1, 4, 4, 4, 2)]),
    'batch_norm_training': (lambda x, g, b: list(K.normalize_batch_in_training(x, g, b, [0, 1, 2])),
                            [(2, 3, 4, 5), (5,), (5,)]),
    'batch_norm_inference': (lambda x, m, v, g, b: K.batch_normalization(x, m, K.abs(v) + 1, b, g),
                             [(4, 5), (5,), (5,), (5,), (5,)]),
    'softmax': (lambda x: K.softmax(x), [(3, 37)]),
    'fused_softmax_xent': (lambda t, x: K.categorical_crossentropy(K.softmax(t), K.softmax(x)), [(4, 9), (4, 9)]),
    'binary_xent_logits': (lambda t, x: K.binary_crossentropy(K.sigmoid(t), x, from_logits=True), [(3, 4), (3, 4)]),
}


@pytest.mark.parametrize('case', sorted(CASES))
def test_emulated_kernels_match_numpy_device(case):
    build, shapes = CASES[case]
    rng = np.random.default_rng(0)
    arrays = [rng.standard_normal(s).astype(np.float32) for s in shapes]
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


def test_ctc_batch_cost_through_emulated_kernels():
    rng = np.random.default_rng(1)
    logits = rng.standard_normal((2, 6, 5)).astype(np.float32)
    labels = np.array([[1, 2, 2], [3, 0, 0]], dtype=np.float32)

    def build(y):
        loss = K.ctc_batch_cost(K.constant(labels), K.softmax(y), K.constant([[6], [5]]), K.constant([[3], [1]]))
        return [loss]
    on_cpu = _run_on('cpu', build, [logits])
    emulated = _run_on('emulate', build, [logits])
    for want, got in zip(on_cpu, emulated):
        np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)
