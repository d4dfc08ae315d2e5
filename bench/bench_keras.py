"""Real Keras 2.3.1 training throughput on gpuk, beside PyTorch on the CPU.

One ``train_on_batch`` step (forward, loss, gradients, Adam update) of
- mlp: Dense 784-256-256-10, softmax cross-entropy, batch 128;
- cnn: Conv2D(16, 3) + MaxPool + Conv2D(32, 3) + MaxPool + Dense(10) on 28x28x1, batch 64;
reported as samples/s (``extra_info['samples_per_s']``). The torch rows build the same
networks with torch.nn and torch.optim.Adam and run on the CPU; they are skipped, with the
reason, where torch is not importable. gpuk runs on its current device (GPUK_DEVICE), once
per precision policy (float32, mixed_bfloat16, mixed_float16: impl 'gpuk <policy>'); on a
CPU the mixed rows only emulate half-precision rounding and are not expected to be faster.
"""
import os
import statistics
import sys

import numpy as np
import pytest

from bench import harness as h

os.environ.setdefault('KERAS_BACKEND', 'gpuk.backend')
if 'KERAS_HOME' not in os.environ:   # a private keras.json, removed when the run ends
    import atexit
    import shutil
    import tempfile
    os.environ['KERAS_HOME'] = tempfile.mkdtemp(prefix='gpuk-bench-keras-')
    atexit.register(shutil.rmtree, os.environ['KERAS_HOME'], ignore_errors=True)

PRECISIONS = ('float32', 'mixed_bfloat16', 'mixed_float16')
MODELS = {'mlp': dict(batch=128, input_shape=(784,)), 'cnn': dict(batch=64, input_shape=(28, 28, 1))}


def _keras():
    if 'keras' in sys.modules and sys.modules['keras'].backend.backend() != 'gpuk.backend':
        pytest.skip('keras was already imported with backend %r'
                    % sys.modules['keras'].backend.backend())
    import keras
    if keras.backend.backend() != 'gpuk.backend':
        pytest.skip('KERAS_BACKEND is %r, not gpuk.backend' % keras.backend.backend())
    return keras


def _data(model):
    rng = np.random.default_rng(0)
    spec = MODELS[model]
    x = rng.standard_normal((spec['batch'],) + spec['input_shape']).astype(np.float32)
    y = np.eye(10, dtype=np.float32)[rng.integers(0, 10, spec['batch'])]
    return x, y


def build_keras(keras, model):
    layers = keras.layers
    if model == 'mlp':
        stack = [layers.Dense(256, activation='relu', input_shape=(784,)),
                 layers.Dense(256, activation='relu'), layers.Dense(10, activation='softmax')]
    else:
        stack = [layers.Conv2D(16, 3, activation='relu', input_shape=(28, 28, 1)),
                 layers.MaxPooling2D(), layers.Conv2D(32, 3, activation='relu'),
                 layers.MaxPooling2D(), layers.Flatten(), layers.Dense(10, activation='softmax')]
    net = keras.models.Sequential(stack)
    net.compile(keras.optimizers.Adam(1e-3), 'categorical_crossentropy')
    return net


def build_torch(torch, model):
    nn = torch.nn
    if model == 'mlp':
        net = nn.Sequential(nn.Linear(784, 256), nn.ReLU(), nn.Linear(256, 256), nn.ReLU(),
                            nn.Linear(256, 10))
    else:
        net = nn.Sequential(nn.Conv2d(1, 16, 3), nn.ReLU(), nn.MaxPool2d(2), nn.Conv2d(16, 32, 3),
                            nn.ReLU(), nn.MaxPool2d(2), nn.Flatten(), nn.Linear(32 * 5 * 5, 10))
    optimizer = torch.optim.Adam(net.parameters(), lr=1e-3)
    loss_fn = nn.CrossEntropyLoss()

    def step(x, labels):
        optimizer.zero_grad()
        loss = loss_fn(net(x), labels)
        loss.backward()
        optimizer.step()
        return loss.detach()
    return step


def _record(benchmark, fn, args, samples):
    if getattr(benchmark, '_timer', None) is h.REPLAY_CLOCK:
        h.record_samples(benchmark, samples)
    else:
        benchmark.pedantic(fn, args=args, rounds=len(samples), iterations=1, warmup_rounds=1)


def _report(benchmark, model, impl, device_name, samples, dtype='float32'):
    median = statistics.median(samples)
    batch = MODELS[model]['batch']
    benchmark.extra_info.update(
        family='keras', case='%s train step, batch %d' % (model, batch), impl=impl,
        device=device_name, dtype=dtype, time_s=median, samples_per_s=batch / median)


@pytest.mark.parametrize('precision', PRECISIONS)
@pytest.mark.parametrize('model', sorted(MODELS))
def test_keras_gpuk_train_step(benchmark, model, precision):
    keras = _keras()
    from gpuk import backend as K
    from gpuk import config, device
    K.clear_session()
    saved_precision = config.precision()
    config.set_precision(precision)
    try:
        net = build_keras(keras, model)
        x, y = _data(model)
        first = float(net.train_on_batch(x, y))
        for _ in range(3):
            net.train_on_batch(x, y)
        samples = h.time_cpu(net.train_on_batch, [(x, y)], min_time=0.4, min_runs=5, max_runs=200)
        _record(benchmark, net.train_on_batch, (x, y), samples)
        assert float(net.train_on_batch(x, y)) < first  # the timed steps trained it
    finally:
        config.set_precision(saved_precision)
    name = h.gpu_name() if device.kind() == 'cuda' else h.cpu_name()
    impl = 'gpuk' if precision == 'float32' else 'gpuk ' + precision
    _report(benchmark, model, impl, name, samples, dtype=precision)


@pytest.mark.parametrize('model', sorted(MODELS))
def test_torch_cpu_train_step(benchmark, model):
    try:
        import torch
    except ImportError as error:
        pytest.skip('torch is not importable here (%s): no PyTorch CPU row' % error)
    torch.manual_seed(0)
    step = build_torch(torch, model)
    x, y = _data(model)
    xt = torch.from_numpy(x if model == 'mlp' else x.transpose(0, 3, 1, 2).copy())
    labels = torch.from_numpy(y.argmax(axis=1))
    first = float(step(xt, labels))
    for _ in range(3):
        step(xt, labels)
    samples = h.time_cpu(step, [(xt, labels)], min_time=0.4, min_runs=5, max_runs=200)
    _record(benchmark, step, (xt, labels), samples)
    assert float(step(xt, labels)) < first
    _report(benchmark, model, 'torch', h.cpu_name(), samples)
