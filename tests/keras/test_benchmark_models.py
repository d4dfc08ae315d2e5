"""bench/keras_models.py: the training-step models that gpuk's benchmarks (Keras 2.3.1) and
bench/keras3_jax.py (Keras 3 on JAX, run on a GPU machine only) build from one definition.

Keras 3 is not installed here: its side of the comparison is checked where it runs
(keras3_jax.py refuses a model whose parameter count differs from keras_models.PARAMS). These
tests hold the Keras 2.3.1 side to the same counts, and check what of keras3_jax.py runs
without Keras 3 (its arguments)."""
import pytest

from bench import keras3_jax, keras_models


def test_every_benchmarked_model_has_the_parameter_count_both_keras_versions_check():
    assert set(keras_models.BATCH) <= set(keras_models.PARAMS) <= set(keras_models.MODELS)


@pytest.mark.parametrize('name', sorted(keras_models.PARAMS))
def test_keras_2_builds_the_counted_network(keras, name):
    net = keras_models.build(keras, name)
    assert net.count_params() == keras_models.PARAMS[name]
    x, y = keras_models.data(name, 3)
    assert net.predict(x).shape == y.shape == (3, keras_models.CLASSES)


def test_keras3_runner_arguments():
    args = keras3_jax.parse([])
    assert args.models == list(keras_models.BATCH) and args.precisions == ['float32']
    args = keras3_jax.parse(['--models', 'mlp,lstm', '--precisions', 'float32,mixed_bfloat16', '--steps', '2'])
    assert args.models == ['mlp', 'lstm'] and args.precisions == ['float32', 'mixed_bfloat16'] and args.steps == 2
    for bad in (['--models', 'gru'], ['--precisions', 'float64'], ['--steps', '0']):
        with pytest.raises(SystemExit):
            keras3_jax.parse(bad)


@pytest.mark.parametrize('name', sorted(keras_models.MODELS))
def test_the_pytorch_twins_are_the_counted_networks(name):
    """torch_net's parameters, with BatchNorm's running mean and variance (Keras counts its
    moving statistics), are PARAMS; torch's recurrent layers have a second bias per gate."""
    torch = pytest.importorskip('torch')
    net = keras_models.torch_net(torch, name)
    count = sum(p.numel() for p in net.parameters()) + sum(
        b.numel() for n, b in net.named_buffers() if n.endswith(('running_mean', 'running_var')))
    gates = {'lstm': 4, 'gru': 3}.get(name)
    if gates is None:
        assert count == keras_models.PARAMS[name]
    elif name in keras_models.PARAMS:
        assert count == keras_models.PARAMS[name] + gates * keras_models.RNN_UNITS
    x, _ = keras_models.data(name, 3)
    x = torch.from_numpy(x.transpose(0, 3, 1, 2).copy() if x.ndim == 4 else x)
    assert tuple(net(x).shape) == (3, keras_models.CLASSES)
