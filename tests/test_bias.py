"""The fused bias + activation op (the elementwise kernel family) behind K.bias_add."""
import numpy as np
import pytest

from gpuk import backend as K
from gpuk.ops.bias import bias_act
from tests.gradcheck import check_gradients

# Every test here runs on each implementation (tests/conftest.py: on_device), the CUDA kernels included.
pytestmark = pytest.mark.usefixtures('on_device')


@pytest.mark.parametrize('activation', ['linear', 'relu'])
def test_bias_act_values_and_gradients(on_device, activation):
    rng = np.random.default_rng(0)
    x = rng.standard_normal((2, 3, 4)).astype(np.float32)
    b = rng.standard_normal(3).astype(np.float32)
    xt, bt = K.placeholder((None, 3, 4)), K.placeholder((3,))
    got = K.function([xt, bt], [bias_act(xt, bt, 1, activation)])([x, b])[0]
    want = x + b[None, :, None]
    np.testing.assert_allclose(got, np.maximum(want, 0) if activation == 'relu' else want, rtol=1e-6)
    check_gradients(lambda a, c: bias_act(a, c, 1, activation),
                    rng.standard_normal((2, 3, 4)), rng.standard_normal(3))


def test_bias_add_routes_vector_bias_through_the_fused_op():
    x = K.placeholder((None, 5, 5, 3))
    y = K.bias_add(x, K.variable(np.ones(3)), data_format='channels_last')
    assert type(y.node.op).__name__ == 'BiasAct' and y.node.op.axis == 3
    y = K.bias_add(K.placeholder((None, 3, 5)), K.variable(np.ones(3)), data_format='channels_first')
    assert y.node.op.axis == 1


def test_bias_act_rejects_bad_arguments():
    x = K.placeholder((2, 3))
    with pytest.raises(ValueError, match="bias_act: activation must be one of"):
        bias_act(x, K.placeholder((3,)), 1, 'gelu')
    with pytest.raises(ValueError, match='bias_act: bias must be 1-D'):
        bias_act(x, K.placeholder((3, 1)), 1)
    with pytest.raises(ValueError, match='bias_add: bias of shape'):
        bias_act(x, K.placeholder((4,)), 1)
