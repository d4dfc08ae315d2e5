"""Keras 2.3.1's LSTM and GRU and its Adam under plan-time fusion (gpuk/fusion_elementwise.py,
gpuk/fusion_scan.py): each time step's cell arithmetic is one fused step, training gives the
losses and weights of the unfused plans (GPUK_FUSION=0), the gradients through the fused
scan agree with finite differences, and an Adam update is one fused step per parameter."""
import numpy as np
import pytest

from gpuk import device
from gpuk.fusion_elementwise import FusedElementwise
from gpuk.ops.scan import Scan

from tests.evaluation import plan_ops as _step_ops
from tests.gradcheck import check_gradients

# the emulate case runs the generated kernels (see tests/conftest.py, on_device)
pytestmark = pytest.mark.fuse_elementwise




def _scan_step_plans(f):
    """{'rnn': step op names, 'rnn gradient': ...} of the Scans in function ``f``'s plan."""
    plans = {}
    for op in _step_ops(f):
        if isinstance(op, Scan):
            for plan in op._plans.values():
                plans[op.where] = [type(forward.__self__).__name__ for forward, _, _, _ in plan.steps]
    return plans


def _train(keras, monkeypatch, cell, fusion, steps=3):
    """(losses, weights after, the train function) of a small float64 model trained ``steps`` times."""
    monkeypatch.setenv('GPUK_FUSION', '1' if fusion else '0')
    keras.backend.set_floatx('float64')
    np.random.seed(7)
    layer = getattr(keras.layers, cell)(5, input_shape=(4, 3))
    net = keras.models.Sequential([layer, keras.layers.Dense(2, activation='softmax')])
    net.compile(keras.optimizers.Adam(0.05), 'categorical_crossentropy')
    rng = np.random.default_rng(0)
    x = rng.standard_normal((6, 4, 3))
    y = np.eye(2)[rng.integers(0, 2, 6)]
    losses = [net.train_on_batch(x, y) for _ in range(steps)]
    return losses, net.get_weights(), net.train_function


@pytest.mark.parametrize('cell', ['LSTM', 'GRU'])
def test_recurrent_training_fused_equals_unfused(keras, monkeypatch, on_device, cell):
    losses, weights, f = _train(keras, monkeypatch, cell, True)
    want_losses, want_weights, plain = _train(keras, monkeypatch, cell, False)
    # NumPy: the same ops; the kernels: exp/tanh of the C library or CUDA, an ulp or two apart
    tolerance = 1e-12 if on_device != 'cuda' else 1e-9
    np.testing.assert_allclose(losses, want_losses, rtol=tolerance)
    for got, want in zip(weights, want_weights):
        np.testing.assert_allclose(got, want, rtol=100 * tolerance, atol=tolerance)
    assert losses[-1] < losses[0]
    fused, unfused = _scan_step_plans(f), _scan_step_plans(plain)
    # the forward step: the recurrent GEMMs, bias, gate slices, and the cell in one fused step
    # (the NumPy device keeps the LSTM's activations for the gradient step, gpuk/ops/scan.py:
    # 7 outputs, more than a kernel's 4, but its groups have no kernel limits)
    assert fused['rnn'].count('FusedElementwise') == (1 if cell == 'LSTM' else 2)
    if on_device == 'cpu' and cell == 'LSTM':
        # and the cell's gradient one step too: no kernel's input and output limits to keep
        assert fused['rnn gradient'].count('FusedElementwise') == 1
    assert fused['rnn'].count('MatMul') == unfused['rnn'].count('MatMul') == (2 if cell == 'LSTM' else 3)
    # the gate slices of the matrix products are read by the fused steps themselves (members
    # on the NumPy device, input views a kernel reads in place elsewhere): no slice steps left
    assert 'Getitem' in unfused['rnn'] and 'Getitem' not in fused['rnn'] + fused['rnn gradient']
    assert len(fused['rnn']) < len(unfused['rnn']) and len(fused['rnn gradient']) < len(unfused['rnn gradient'])
    # fusion_scan: the gradient step no longer computes d(loss)/d(inputs) (dz @ W^T): one GEMM fewer
    assert fused['rnn gradient'].count('MatMul') == unfused['rnn gradient'].count('MatMul') - 1


@pytest.mark.parametrize('cell', ['LSTM', 'GRU'])
def test_recurrent_gradients_through_fused_steps(keras, monkeypatch, cell):
    monkeypatch.setenv('GPUK_FUSION', '1')
    keras.backend.set_floatx('float64')
    np.random.seed(3)
    layer = getattr(keras.layers, cell)(3, return_sequences=True)
    rng = np.random.default_rng(1)
    x = rng.standard_normal((2, 4, 2))
    outputs = layer(keras.layers.Input((4, 2)))   # builds the layer's weights
    del outputs
    weights = layer.get_weights()

    def build(inputs, kernel, recurrent, bias):
        layer.cell.kernel, layer.cell.recurrent_kernel, layer.cell.bias = kernel, recurrent, bias
        return layer.call(inputs)
    check_gradients(build, x, *weights, rtol=1e-5, atol=1e-7)


def test_adam_update_of_a_dense_layer_is_one_fused_step_per_parameter(keras, monkeypatch):
    counts = {}
    for fusion in (False, True):
        monkeypatch.setenv('GPUK_FUSION', '1' if fusion else '0')
        net = keras.models.Sequential([keras.layers.Dense(3, input_shape=(4,))])
        net.compile(keras.optimizers.Adam(1e-3), 'mse')
        net._make_train_function()
        f = net.train_function
        f._compiled()
        ops = _step_ops(f)
        counts[fusion] = len(ops)
        fused = [op for op in ops if isinstance(op, FusedElementwise)]
    # Keras's Adam per parameter: m_t, v_t, sqrt (with its clip at 0), p_t: 16 elementwise ops;
    # the step size lr_t 11 ops on scalars; the loss and its gradient arithmetic between the
    # reductions a few more
    updates = [op for op in fused if 'sqrt' in op.name]
    if device.kind() == 'cpu':
        # the NumPy device's groups have no kernel limits (one output shape, at most 4
        # outputs) and join unconnected groups: the step size, both parameters' updates and
        # the iteration count's increment are one step (and the dense layer's bias add joins
        # the loss arithmetic after it)
        assert len(updates) == 1 and len(updates[0].members) == 11 + 2 * 16 + 1
        assert counts == {False: 69, True: 20}
    else:
        # one kernel per parameter; lr_t, a scalar read by both, its own step
        assert [len(op.members) for op in updates] == [16, 16]   # kernel and bias
        assert updates[0].name.startswith('fused(square, subtract, multiply, multiply, add, less')
        assert counts == {False: 69, True: 24}
