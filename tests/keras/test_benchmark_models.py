"""bench/keras_models.py: the training-step models that gpuk's benchmarks (Keras 2.3.1) and
bench/keras3_jax.py (Keras 3 on JAX, run on a GPU machine only) build from one definition.

Keras 3 is not installed here: its side of the comparison is checked where it runs
(keras3_jax.py refuses a model whose parameter count differs from keras_models.PARAMS). These
tests hold the Keras 2.3.1 side and the PyTorch twins to the same counts, check that the CTC
twin computes the Keras model's loss from its weights, and check what of keras3_jax.py runs
without Keras 3 (its arguments)."""
import numpy as np
import pytest

from bench import keras3_jax, keras_models


def _torch():
    return pytest.importorskip('torch')


def test_every_benchmarked_model_has_the_parameter_count_both_keras_versions_check():
    assert set(keras_models.BATCH) <= set(keras_models.PARAMS) <= set(keras_models.MODELS) | {'ctc'}


@pytest.mark.parametrize('name', sorted(keras_models.PARAMS))
def test_keras_2_builds_the_counted_network(keras, name):
    net = keras_models.build(keras, name)
    assert net.count_params() == keras_models.PARAMS[name]
    x, y = keras_models.data(name, 3)
    # the ctc model's output is its (batch, 1) loss
    assert net.predict(x).shape == y.shape == ((3, 1) if name == 'ctc' else (3, keras_models.CLASSES))


def test_keras3_runner_arguments():
    args = keras3_jax.parse([])
    assert args.models == list(keras_models.BATCH) and args.precisions == ['float32']
    args = keras3_jax.parse(['--models', 'mlp,lstm', '--precisions', 'float32,mixed_bfloat16', '--steps', '2'])
    assert args.models == ['mlp', 'lstm'] and args.precisions == ['float32', 'mixed_bfloat16'] and args.steps == 2
    for bad in (['--models', 'gru'], ['--precisions', 'float64'], ['--steps', '0']):
        with pytest.raises(SystemExit):
            keras3_jax.parse(bad)


@pytest.mark.parametrize('name', sorted(keras_models.PARAMS))
def test_the_pytorch_twin_has_the_counted_parameters(name):
    torch = _torch()
    net = keras_models.torch_model(torch, name)
    # Keras counts batch norm's moving mean and variance, torch keeps them as buffers
    moving = sum(b.numel() for n, b in net.named_buffers() if n.endswith(('running_mean', 'running_var')))
    extra = keras_models.TORCH_EXTRA_PARAMS.get(name, 0)
    assert sum(p.numel() for p in net.parameters()) + moving == keras_models.PARAMS[name] + extra


def _keras_weights_into_torch(keras_net, torch_net, torch):
    """The Keras ctc model's weights, in its layer order, copied into its torch twin."""
    weights = iter(keras_net.get_weights())
    tensors = []
    for module in torch_net.modules():
        if isinstance(module, torch.nn.Conv2d):      # (h, w, in, out) -> (out, in, h, w)
            tensors.append((module.weight, next(weights).transpose(3, 2, 0, 1)))
        elif isinstance(module, torch.nn.BatchNorm2d):
            tensors += [(module.weight, next(weights)), (module.bias, next(weights)),
                        (module.running_mean, next(weights)), (module.running_var, next(weights))]
        elif isinstance(module, torch.nn.Linear):
            tensors += [(module.weight, next(weights).T), (module.bias, next(weights))]
        elif hasattr(module, 'recurrent_kernel'):    # the Keras GRU cell: the same layout
            tensors += [(module.kernel, next(weights)), (module.recurrent_kernel, next(weights)),
                        (module.bias, next(weights))]
    assert next(weights, None) is None
    with torch.no_grad():
        for tensor, value in tensors:
            tensor.copy_(torch.from_numpy(np.ascontiguousarray(value)))


def test_the_ctc_model_trains_a_step_and_its_pytorch_twin_computes_the_same_loss(keras):
    """One step of the demo's model on Keras 2.3.1 (the NumPy device here); its torch twin, given
    the same weights and batch, gives the same, finite loss (Keras takes the log of softmax +
    1e-7, torch log_softmax). No torch step: torch.optim's first use imports torch._dynamo,
    seconds of it (bench_keras.py's torch rows run the steps)."""
    torch = _torch()
    net = keras_models.build(keras, 'ctc')
    x, y = keras_models.data('ctc', 4)
    twin = keras_models.torch_model(torch, 'ctc')
    _keras_weights_into_torch(net, twin, torch)
    images, target = keras_models.torch_inputs(torch, 'ctc', x, y)
    torch_loss = keras_models.torch_loss(torch, 'ctc')(twin(images), target).item()
    keras_loss = float(net.train_on_batch(x, y))
    assert np.isfinite(torch_loss) and keras_loss > 0
    np.testing.assert_allclose(torch_loss, keras_loss, rtol=1e-4)
    assert float(net.train_on_batch(x, y)) < keras_loss
