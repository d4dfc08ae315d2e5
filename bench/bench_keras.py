"""Real Keras 2.3.1 training throughput on gpuk, beside PyTorch eager (CPU and GPU).

One ``train_on_batch`` step (forward, loss, gradients, Adam update) of bench/keras_models.py's
- mlp: Dense 784-256-256-10, softmax cross-entropy, batch 128;
- cnn: Conv2D(16, 3) + MaxPool + Conv2D(32, 3) + MaxPool + Dense(10) on 28x28x1, batch 64;
- bn_cnn: two Conv2D + BatchNormalization + relu + MaxPool blocks, Dense(10), 16x16x1, batch 64;
- lstm: LSTM(128) over 50 steps of 32 features, Dense(10), batch 32;
- ctc: the OCR demo's model (gpuk.demo), conv + batch norm blocks, a bidirectional GRU(48) over
  36 steps and a per-step softmax, on the CTC loss of 12x72 rendered digit strings, batch 32;
reported as samples/s (``extra_info['samples_per_s']``). The torch rows build the same
networks with torch.nn and torch.optim.Adam, on the CPU (impl 'torch') and on the GPU
('torch-cuda'); they are skipped, with the reason, where torch (or its CUDA) is not usable.
The ctc twin's GRU is Keras 2.3.1's cell (reset_after=False) stepped in eager torch, not
torch.nn.GRU (cuDNN's, reset_after=True: a different network), so its rows time one small
kernel sequence per time step, as eager PyTorch runs such a cell.
Every step ends with the loss read on the host, as Keras's train_on_batch does, so the GPU
rows time whole steps. gpuk runs on its current device (GPUK_DEVICE), once per precision
policy (float32, mixed_bfloat16, mixed_float16: impl 'gpuk <policy>'); on a CPU the mixed
rows only emulate half-precision rounding and are not expected to be faster.
bench/keras3_jax.py times the same models on Keras 3 with JAX, in rows of this format.
"""
import os
import statistics
import sys

import numpy as np
import pytest

from bench import harness as h
from bench import keras_models

os.environ.setdefault('KERAS_BACKEND', 'gpuk.backend')
if 'KERAS_HOME' not in os.environ:   # a private keras.json, removed when the run ends
    import atexit
    import shutil
    import tempfile
    os.environ['KERAS_HOME'] = tempfile.mkdtemp(prefix='gpuk-bench-keras-')
    atexit.register(shutil.rmtree, os.environ['KERAS_HOME'], ignore_errors=True)

PRECISIONS = ('float32', 'mixed_bfloat16', 'mixed_float16')
BATCH = keras_models.BATCH   # the models timed, and their batch


def _keras():
    if 'keras' in sys.modules and sys.modules['keras'].backend.backend() != 'gpuk.backend':
        pytest.skip('keras was already imported with backend %r'
                    % sys.modules['keras'].backend.backend())
    import keras
    if keras.backend.backend() != 'gpuk.backend':
        pytest.skip('KERAS_BACKEND is %r, not gpuk.backend' % keras.backend.backend())
    return keras


def _data(model):
    return keras_models.data(model, BATCH[model])


def _record(benchmark, fn, args, samples):
    if getattr(benchmark, '_timer', None) is h.REPLAY_CLOCK:
        h.record_samples(benchmark, samples)
    else:
        benchmark.pedantic(fn, args=args, rounds=len(samples), iterations=1, warmup_rounds=1)


def _report(benchmark, model, impl, device_name, samples, dtype='float32'):
    median = statistics.median(samples)
    batch = BATCH[model]
    benchmark.extra_info.update(
        family='keras', case='%s train step, batch %d' % (model, batch), impl=impl,
        device=device_name, dtype=dtype, time_s=median, samples_per_s=batch / median)


@pytest.mark.parametrize('precision', PRECISIONS)
@pytest.mark.parametrize('model', sorted(BATCH))
def test_keras_gpuk_train_step(benchmark, model, precision):
    keras = _keras()
    from gpuk import backend as K
    from gpuk import config, device
    K.clear_session()
    saved_precision = config.precision()
    config.set_precision(precision)
    try:
        net = keras_models.build(keras, model)
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


@pytest.mark.parametrize('impl', ['torch', 'torch-cuda'])
@pytest.mark.parametrize('model', sorted(BATCH))
def test_torch_train_step(benchmark, model, impl):
    h.require(impl)
    import torch
    device = 'cuda' if impl == 'torch-cuda' else 'cpu'
    torch.manual_seed(0)
    step = keras_models.torch_step(torch, model, device)
    xt, target = keras_models.torch_inputs(torch, model, *_data(model), device=device)
    first = step(xt, target)
    for _ in range(3):
        step(xt, target)
    samples = h.time_cpu(step, [(xt, target)], min_time=0.4, min_runs=5, max_runs=200)
    _record(benchmark, step, (xt, target), samples)
    assert step(xt, target) < first
    _report(benchmark, model, impl, h.gpu_name() if device == 'cuda' else h.cpu_name(), samples)
