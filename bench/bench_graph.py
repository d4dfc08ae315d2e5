"""Host overhead of compiled K functions: what gpuk's graph engine adds per op.

- chain: a 100-op elementwise chain on a 4-element array, so compute is negligible and
  the time is the engine's dispatch plus the array library's own per-call cost. The
  same chain called directly on the array namespace is timed beside it; the difference
  is gpuk's overhead. A 1-op function gives the fixed cost of one call (feeding the
  input, copying the output back to the host).
- mlp: one training step of a 3-layer MLP (forward, K.gradients, SGD through
  ``updates=``), per call and per node of the compiled graph.

Rows run on NumPy and, where a GPU is usable, on CuPy. Host time (perf_counter) is the
measure on both, since host overhead is the point; every call returns NumPy arrays, so
each GPU call ends synchronised. ``extra_info`` holds us_per_op against the goal of
GOAL_US_PER_OP microseconds per op.
"""
import contextlib
import statistics

import numpy as np
import pytest

from bench import harness as h
from gpuk import backend as K
from gpuk import device
from gpuk.graph import topological_nodes

GOAL_US_PER_OP = 10.0
IMPLS = ('numpy', 'cupy')
_DEVICE_OF = {'numpy': 'cpu', 'cupy': 'cuda'}

# Each step: how the graph builds it, and the same computation on the array namespace.
_F32 = np.float32
CHAIN_STEPS = (
    (lambda y: y * 0.999, lambda xp, y: y * _F32(0.999)),
    (lambda y: y + 0.001, lambda xp, y: y + _F32(0.001)),
    (lambda y: K.tanh(y), lambda xp, y: xp.tanh(y)),
    (lambda y: K.abs(y), lambda xp, y: xp.abs(y)),
)
CHAIN_LENGTH = 100
MLP_SIZES = (64, 128, 128, 10)
MLP_BATCH = 32


@contextlib.contextmanager
def gpuk_device(impl):
    """Runs the block with gpuk on the device of ``impl`` and a fresh graph session."""
    h.require(impl)
    previous = device.kind()
    device.set_device(_DEVICE_OF[impl])
    K.clear_session()
    try:
        yield device.xp()
    finally:
        device.set_device(previous)


def _time_calls(fn, args, warmup_calls=5):
    """Per-call seconds of many single calls (each is tens to hundreds of microseconds).
    A few untimed calls first wake BLAS threads and caches, so the harness's probe call,
    which sets the number of runs, is a typical one."""
    for _ in range(warmup_calls):
        fn(*args)
    return h.time_cpu(fn, [args], min_time=0.2, min_runs=20, max_runs=3000)


def _record(benchmark, fn, args, samples):
    """Gives pytest-benchmark the samples (through the harness's replay clock when
    bench/conftest.py installed it; by timing ``fn`` itself otherwise)."""
    if getattr(benchmark, '_timer', None) is h.REPLAY_CLOCK:
        h.record_samples(benchmark, samples)
    else:
        benchmark.pedantic(fn, args=args, rounds=len(samples), iterations=1, warmup_rounds=1)


def _device_name(impl):
    return h.gpu_name() if impl == 'cupy' else h.cpu_name()


def build_chain(x, length):
    y = x
    for i in range(length):
        y = CHAIN_STEPS[i % len(CHAIN_STEPS)][0](y)
    return y


def run_chain_on_xp(xp, x, length):
    for i in range(length):
        x = CHAIN_STEPS[i % len(CHAIN_STEPS)][1](xp, x)
    return device.to_host(x)


@pytest.mark.parametrize('impl', IMPLS)
def test_chain_host_overhead(benchmark, impl):
    with gpuk_device(impl) as xp:
        x = K.placeholder((4,))
        y = build_chain(x, CHAIN_LENGTH)
        assert len(topological_nodes([y])) == CHAIN_LENGTH
        chain = K.function([x], [y])
        one_op = K.function([x], [x * 0.5])
        value = np.linspace(-1, 1, 4, dtype=np.float32)
        on_device = device.to_device(value)
        np.testing.assert_allclose(chain([value])[0], run_chain_on_xp(xp, on_device, CHAIN_LENGTH),
                                   rtol=1e-6)

        samples = _time_calls(chain, ([value],))
        call_s = statistics.median(_time_calls(one_op, ([value],)))
        xp_s = statistics.median(_time_calls(run_chain_on_xp, (xp, on_device, CHAIN_LENGTH)))
        _record(benchmark, chain, ([value],), samples)
    median = statistics.median(samples)
    us_per_op = median / CHAIN_LENGTH * 1e6
    benchmark.extra_info.update(
        family='graph', case='elementwise chain of %d ops, shape (4,)' % CHAIN_LENGTH, impl=impl,
        device=_device_name(impl), dtype='float32', time_s=median, n_ops=CHAIN_LENGTH,
        us_per_op=us_per_op,
        # what the same ops cost called directly on the namespace, and what gpuk adds
        xp_us_per_op=xp_s / CHAIN_LENGTH * 1e6,
        overhead_us_per_op=(median - xp_s) / CHAIN_LENGTH * 1e6,
        # beyond the fixed cost of a call, what each further op costs
        marginal_us_per_op=(median - call_s) / (CHAIN_LENGTH - 1) * 1e6,
        call_us=call_s * 1e6, goal_us_per_op=GOAL_US_PER_OP, meets_goal=us_per_op <= GOAL_US_PER_OP)


def build_mlp_step(rng, learning_rate=0.05):
    """(step function, node count of its graph): 3 dense layers, MSE loss, plain SGD."""
    x = K.placeholder((None, MLP_SIZES[0]))
    target = K.placeholder((None, MLP_SIZES[-1]))
    params, h_ = [], x
    for layer, (n_in, n_out) in enumerate(zip(MLP_SIZES[:-1], MLP_SIZES[1:])):
        w = K.variable(rng.standard_normal((n_in, n_out)) * np.sqrt(2.0 / n_in), name='w%d' % layer)
        b = K.variable(np.zeros(n_out), name='b%d' % layer)
        params += [w, b]
        h_ = K.dot(h_, w) + b
        if layer < len(MLP_SIZES) - 2:
            h_ = K.relu(h_)
    loss = K.mean(K.square(h_ - target))
    grads = K.gradients(loss, params)
    updates = [K.update_sub(p, learning_rate * g) for p, g in zip(params, grads)]
    step = K.function([x, target], [loss], updates=updates)
    n_ops = len(topological_nodes([loss] + [u.value for u in updates]))
    return step, n_ops


@pytest.mark.parametrize('impl', IMPLS)
def test_mlp_training_step_host_overhead(benchmark, impl):
    with gpuk_device(impl):
        rng = np.random.default_rng(0)
        step, n_ops = build_mlp_step(rng)
        inputs = rng.standard_normal((MLP_BATCH, MLP_SIZES[0])).astype(np.float32)
        targets = (inputs[:, :MLP_SIZES[-1]] > 0).astype(np.float32)
        first_loss = float(step([inputs, targets])[0])
        samples = _time_calls(step, ([inputs, targets],))
        _record(benchmark, step, ([inputs, targets],), samples)
        # the timed calls trained the same batch: its loss must have gone down
        assert float(step([inputs, targets])[0]) < first_loss
    median = statistics.median(samples)
    us_per_op = median / n_ops * 1e6
    benchmark.extra_info.update(
        family='graph', case='MLP %s train step, batch %d' % ('-'.join(map(str, MLP_SIZES)), MLP_BATCH),
        impl=impl, device=_device_name(impl), dtype='float32', time_s=median, n_ops=n_ops,
        us_per_op=us_per_op, goal_us_per_op=GOAL_US_PER_OP, meets_goal=us_per_op <= GOAL_US_PER_OP)
