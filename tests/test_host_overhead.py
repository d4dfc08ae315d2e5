"""The step counters (gpuk/kernels/runtime/counters.py) and bench.host_overhead count launches,
syncs and allocations of a step correctly, on the CUDA path (the GPU rehearsal, in a fresh
process: it installs process-wide state)."""
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]


def _rehearse(code, timeout=300):
    script = 'from tests import gpu_rehearsal\ngpu_rehearsal.activate()\n' + textwrap.dedent(code)
    result = subprocess.run([sys.executable, '-c', script], capture_output=True, text=True, cwd=REPO,
                            env={'PYTHONPATH': str(REPO), 'PATH': '/usr/bin:/bin', 'KERAS_BACKEND': 'gpuk.backend',
                                 'HOME': str(Path.home())}, timeout=timeout)
    assert result.stdout.strip().endswith('ok'), result.stdout + result.stderr
    return result


def test_a_step_counts_its_launches_syncs_and_allocations():
    _rehearse('''
        import numpy as np
        from gpuk import backend as K
        from gpuk.kernels.runtime import counters
        x = K.placeholder((4, 8))
        w = K.variable(np.ones((8, 3), np.float32))
        b = K.variable(np.zeros(3, np.float32))
        h = K.dot(x, w)                                  # MatMul: an xp step (CuPy's GEMM in float32)
        y = K.relu(K.bias_add(h, b))                     # BiasAct: one gpuk launch
        f = K.function([x], [y, h], updates=[K.update(b, b + 1.0)])
        f([np.ones((4, 8), np.float32)])                 # compiles
        with counters.counting() as c:
            out = f([np.ones((4, 8), np.float32)])
        assert np.allclose(out[0], 9.0), out[0]
        assert c.launches == 1 and c.launching_launches == 1, c.as_dict()
        assert c.in_step_syncs == 0, c.as_dict()
        assert c.host_syncs == 2, c.as_dict()            # the two outputs copied back to the host
        # MatMul's product, BiasAct's result and the update b + 1 are new buffers
        assert c.allocations == 3, c.as_dict()
        with counters.counting() as outer:
            f([np.ones((4, 8), np.float32)])
            with counters.counting() as inner:
                K.function([x], [y])([np.ones((4, 8), np.float32)])
        assert inner.launches == 1 and outer.launches == 1, (outer.as_dict(), inner.as_dict())
        from gpuk.kernels import runtime
        rt = runtime.current()
        with counters.counting() as c:                   # a launcher's device-to-host copy
            runtime.to_host(rt, rt.xp.zeros(3))
        assert c.host_syncs == 1
        print('ok')
    ''')


def test_bench_host_overhead_reports_mlp_steps_without_syncs_and_replays_without_allocations():
    result = _rehearse('''
        from bench import host_overhead
        row = host_overhead.measure('mlp', steps=2, warmup=3, graphs=False, count_calls=True)
        print(row)
        assert row['steady'], row
        # prepared launches: each costs tens of Python calls, not the ~100 of unprepared ones
        assert 5 < row['calls_per_launch'] < 50, row
        # 3 bias + relu forward, softmax cross-entropy fwd + bwd, and 9 generated kernels of
        # fusion_elementwise: Adam's update of each of the 6 weights (16 ops each), its step size
        # and the loss's two scalings (the int casts before them are xp steps of their own)
        assert row['launches'] == 14, row
        assert row['syncs_in_step'] == 0 and row['syncs_total'] == 1, row
        assert row['host_us_per_launch'] > 0, row
        replayed = host_overhead.measure('mlp', steps=2, warmup=3, graphs=True)
        print(replayed)
        # the graph's arena: no allocation, no sync, one graph launch holding the 14 launches
        assert replayed['graphs'] and replayed['steady'], replayed
        assert replayed['allocations'] == 0 and replayed['syncs_in_step'] == 0, replayed
        assert replayed['launches'] == 14 and replayed['xp_steps'] == row['xp_steps'], replayed
        print(host_overhead.report([row, replayed], 'rehearsal'))
        print('ok')
    ''')
    assert '| mlp | 32 | False | 14 |' in result.stdout


_CONV_STEP = '''
    import os
    import numpy as np
    from gpuk import backend as K
    from gpuk.kernels.runtime import counters
    os.environ['GPUK_CUDA_GRAPHS'] = '1'
    rng = np.random.default_rng(0)
    x = K.placeholder((None, 8, 8, 3))
    w = K.variable(rng.standard_normal((3, 3, 3, 4)).astype(np.float32))
    b = K.variable(rng.standard_normal(4).astype(np.float32))
    y = K.pool2d(K.relu(K.bias_add(K.conv2d(x, w), b)), (2, 2), strides=(2, 2))    # conv+bias+relu epilogue, max pool
    def plain(f, value):
        os.environ['GPUK_CUDA_GRAPHS'] = '0'
        try:
            return f([value])
        finally:
            os.environ['GPUK_CUDA_GRAPHS'] = '1'
    def batch(n):
        return rng.standard_normal((n, 8, 8, 3)).astype(np.float32)
'''


def test_graph_replay_equals_plain_launches_and_falls_back_when_shapes_change():
    """The stand-in's graphs replay gpuk's launches only, so the step is made of kernels."""
    _rehearse(_CONV_STEP + '''
    v = K.variable(np.zeros((2, 3, 3, 4), np.float32))
    f = K.function([x], [y], updates=[K.update(v, y)])
    g = K.function([x], [y])
    graphs = f._compiled().graphs
    for step in range(4):                        # plain (checked), capture + replay, replay, replay
        value = batch(2)
        with counters.counting() as c:
            out, = f([value])
        expected, = plain(g, value)
        assert np.array_equal(out, expected), step
        assert np.array_equal(K.get_value(v), expected), step     # the update, written by the graph
        assert c.graph_replays == (step >= 1), (step, c.as_dict())
        if step >= 2:
            # one graph launch holding the conv and the pooling; no Python per kernel, no allocation
            assert c.launches == 1 and c.replayed_launches == 2 and c.allocations == 0, c.as_dict()
    assert len(graphs.captured) == 1 and not graphs.refused
    f = K.function([x], [y])                     # no update: any batch size
    graphs = f._compiled().graphs
    for n in (2, 2, 3, 3, 3):                    # a new batch size: plain first, then its own graph
        value = batch(n)
        with counters.counting() as c:
            out, = f([value])
        assert np.array_equal(out, plain(g, value)[0]), n
    assert c.graph_replays == 1 and len(graphs.captured) == 2
    value = batch(2)                             # the first shape still replays its graph
    K.set_value(w, rng.standard_normal((3, 3, 3, 4)).astype(np.float32))   # read by the graph: copied in
    with counters.counting() as c:
        out, = f([value])
    assert c.graph_replays == 1 and np.array_equal(out, plain(g, value)[0])
    p, q = K.variable(np.zeros(3, np.float32)), K.variable(np.ones(3, np.float32))
    swap = K.function([x], [y], updates=[(p, q), (q, p)])   # new values from the old ones, in a graph too
    for step in range(4):
        swap([batch(2)])
        assert K.get_value(p)[0] == (step + 1) % 2 == 1 - K.get_value(q)[0], step
    assert len(swap._compiled().graphs.captured) == 1
    os.environ['GPUK_CUDA_GRAPHS'] = '0'         # the switch, read per call
    with counters.counting() as c:
        f([value])
    assert c.graph_replays == 0 and c.launches > 0
    print('ok')
    ''')


def test_steps_that_sync_or_draw_random_numbers_keep_plain_launches():
    _rehearse(_CONV_STEP + '''
    printed = K.function([x], [K.print_tensor(y, 'y=')])        # a host read inside the step
    dropped = K.function([x], [K.dropout(y, 0.5)])               # a replay would repeat the mask
    value = batch(2)
    for f in (printed, dropped):
        for _ in range(3):
            with counters.counting() as c:
                f([value])
            assert c.graph_replays == 0
    assert 'syncs' in printed._compiled().graphs.refused[((2, 8, 8, 3), '<f4'),]
    assert 'random' in dropped._compiled().graphs.refused[((2, 8, 8, 3), '<f4'),]
    print('ok')
    ''')


def test_argument_checks_run_once_per_input_signature_unless_asked_for_every_call():
    _rehearse(_CONV_STEP + '''
    from gpuk.kernels import runtime
    from gpuk.kernels.runtime import cuda_runtime, kernel_source
    import sys
    calls = {'check_args': 0, 'source_key': 0}
    def counted(name, function):
        def wrapper(*args, **kwargs):   # the CUDA runtime's calls only (the emulator checks too)
            if sys._getframe(1).f_code.co_filename == cuda_runtime.__file__:
                calls[name] += 1
            return function(*args, **kwargs)
        return wrapper
    runtime.check_args = counted('check_args', runtime.check_args)
    cuda_runtime.source_key = counted('source_key', cuda_runtime.source_key)
    os.environ['GPUK_CUDA_GRAPHS'] = '0'              # plain launches on every call
    f = K.function([x], [y])
    def calls_of(value):
        before = dict(calls)
        f([value])
        return {k: calls[k] - before[k] for k in calls}
    first = calls_of(batch(2))
    assert first['check_args'] == 2, first            # conv and pool, checked on the first run
    assert calls_of(batch(2)) == {'check_args': 0, 'source_key': 0}   # prepared: no checks, no re-keying
    assert calls_of(batch(3))['check_args'] == 2      # a new input signature is checked again
    os.environ['GPUK_CHECK_LAUNCHES'] = '1'
    again = calls_of(batch(2))
    assert again['check_args'] == 2 and again['source_key'] == 2, again
    print('ok')
    ''')


def test_a_repeated_conv_problem_is_checked_once_and_bad_input_still_raises(monkeypatch):
    import numpy as np
    import pytest
    from gpuk.contracts import conv_checks
    from gpuk.kernels import conv
    checks = []
    real = conv_checks.fwd_problem
    monkeypatch.setattr(conv_checks, 'fwd_problem', lambda *a, **k: checks.append(1) or real(*a, **k))
    rng = np.random.default_rng(0)
    x, w = rng.standard_normal((1, 5, 5, 2)).astype(np.float32), rng.standard_normal((3, 3, 2, 4)).astype(np.float32)
    valid = ((0, 0), (0, 0))
    first = conv.conv_fwd(x, w, (1, 1), (1, 1), valid, 'channels_last', runtime='emulate')
    again = conv.conv_fwd(x, w, (1, 1), (1, 1), valid, 'channels_last', runtime='emulate')
    assert len(checks) == 1 and np.array_equal(first, again)
    with pytest.raises(TypeError, match='conv_fwd: bias.dtype'):   # another signature: checked, refused
        conv.conv_fwd(x, w, (1, 1), (1, 1), valid, 'channels_last', epilogue='bias', bias=np.zeros(4, np.float64),
                      runtime='emulate')
    with pytest.raises(ValueError, match='conv_fwd: pads'):       # an unhashable parameter: checked every call
        conv.conv_fwd(x, w, (1, 1), (1, 1), [[0, 0], [0, -1]], 'channels_last', runtime='emulate')
    monkeypatch.setenv('GPUK_CHECK_LAUNCHES', '1')
    from gpuk.kernels import runtime
    with runtime.prepared_launches():   # reads the switch
        conv.conv_fwd(x, w, (1, 1), (1, 1), valid, 'channels_last', runtime='emulate')
    assert len(checks) == 4


def test_a_kept_conv_runner_follows_the_precision_policy_and_the_forced_splits(monkeypatch):
    """A conv plan step keeps its launcher's runner (conv_wgrad_runner here) across calls: its
    checks and launch set-up run once, a forced split count remakes its launch, and another
    precision policy makes it another problem (checked again), as a plain launcher call would."""
    import numpy as np
    from gpuk import config
    from gpuk.contracts import conv_checks
    from gpuk.kernels import conv
    from gpuk.kernels.conv import tiles
    checks, made = [], []
    real_checks, real_launch = conv_checks.wgrad_problem, conv._wgrad_launch
    monkeypatch.setattr(conv_checks, 'wgrad_problem', lambda *a, **k: checks.append(1) or real_checks(*a, **k))
    monkeypatch.setattr(conv, '_wgrad_launch', lambda *a: made.append(tiles.forced_state()) or real_launch(*a))
    rng = np.random.default_rng(0)
    x, dy = rng.standard_normal((1, 5, 5, 2)).astype(np.float32), rng.standard_normal((1, 3, 3, 4)).astype(np.float32)
    geometry = ((1, 1), (1, 1), ((0, 0), (0, 0)), 'channels_last')
    run = conv.conv_wgrad_runner(x, dy, (3, 3, 2, 4), *geometry, runtime='emulate')
    first, again = run(x, dy), run(x, dy)
    assert len(checks) == 1 and made == [(None, None)] and np.array_equal(first, again)
    with tiles.forced(splits=2):
        split = run(x, dy)
    assert made == [(None, None), (None, 2)] and len(checks) == 1
    np.testing.assert_allclose(split, first, rtol=1e-5, atol=1e-5)
    assert np.array_equal(run(x, dy), first) and len(made) == 2   # back: the kept launch again
    previous = config.precision()
    config.set_precision('mixed_float16')   # float32 convolutions keep the FFMA tiles, another problem
    try:
        other = run(x, dy)
    finally:
        config.set_precision(previous)
    assert len(checks) == 2 and len(made) == 3 and np.array_equal(other, first)
    assert np.array_equal(run(x, dy), first) and len(checks) == 2 and len(made) == 3


def test_value_checks_are_read_with_the_outputs_so_sparse_xent_and_ctc_steps_replay_graphs():
    """Sparse cross-entropy's label range and CTC's labels and lengths are checked on the
    device (runtime/deferred.py); K.function reads the flags where it copies the outputs,
    not inside the step, so those steps are captured and replayed, and a bad value still
    raises the op's own error without changing a variable."""
    _rehearse(_CONV_STEP + '''
    import pytest
    from bench import host_overhead
    from gpuk.kernels.runtime import deferred
    labels = K.placeholder((None,), dtype='int32')
    logits = K.reshape(y, (-1, 4))                               # conv + relu epilogue, max pool
    loss = K.sparse_categorical_crossentropy(labels, logits, from_logits=True)
    v = K.variable(np.zeros(18, np.float32))                     # a batch of 2: 18 rows of 4 classes
    f = K.function([x, labels], [loss], updates=[K.update(v, loss)])
    good = np.arange(18, dtype=np.int32) % 4
    for step in range(3):                                        # plain, capture + replay, replay
        with counters.counting() as c:
            f([batch(2), good])
        capturing = step == 1                                    # reads its warm-up's flags once
        assert c.in_step_syncs == capturing, (step, c.as_dict())
        assert c.host_syncs == 2 + capturing, (step, c.as_dict())   # the loss, then the flags
        assert c.graph_replays == (step >= 1), (step, c.as_dict())
    assert not f._compiled().graphs.refused and deferred.pending_count() == 0
    os.environ['GPUK_CUDA_GRAPHS'] = '0'
    before = K.get_value(v)
    with pytest.raises(ValueError, match=r'sparse_categorical_crossentropy: target must lie in \\[0, 4\\)'):
        f([batch(2), np.where(good == 3, 4, good).astype(np.int32)])
    assert np.array_equal(K.get_value(v), before) and deferred.pending_count() == 0
    os.environ['GPUK_CUDA_GRAPHS'] = '1'
    for model in ('bn_cnn', 'ctc'):                              # the bench's CNN, the demo's CTC model
        # captured (so its first, plain step synced 0 times, or it would be refused) and replayed
        row = host_overhead.measure(model, steps=1, warmup=2, graphs=True)
        assert row['graphs'] and not row['graphs_refused'], row
        assert row['syncs_in_step'] == 0 and row['allocations'] == 0, row
    print('ok')
    ''')


def test_every_launcher_family_prepares_a_problem_once_and_checks_every_call_on_request():
    """runtime/prepared.py: a Keras step's launchers (conv, batch norm, pooling, bias +
    activation, fused elementwise, sparse softmax cross-entropy, CTC) run their checks and
    launch set-up on the first step of an input signature only; GPUK_CHECK_LAUNCHES=1 runs
    them on every call."""
    _rehearse('''
    import os
    import numpy as np
    import keras
    from keras import layers
    from gpuk import backend as K
    from gpuk.kernels.runtime import prepared
    seen, prepares = [], [0]
    real_get = prepared.get
    def counted_get(rt, launcher, arrays, params, prepare):
        seen.append(launcher)
        def counted_prepare():
            prepares[0] += 1
            return prepare()
        return real_get(rt, launcher, arrays, params, counted_prepare)
    prepared.get = counted_get
    net = keras.models.Sequential([
        layers.Conv2D(4, 3, use_bias=False, input_shape=(8, 8, 1)), layers.BatchNormalization(),
        layers.Activation('relu'), layers.MaxPooling2D(), layers.AveragePooling2D(padding='same'), layers.Flatten(),
        layers.Dense(3)])
    net.compile('adam', lambda y, p: K.sparse_categorical_crossentropy(y, p, from_logits=True))
    rng = np.random.default_rng(0)
    x, y = rng.standard_normal((4, 8, 8, 1)).astype(np.float32), np.array([0, 1, 2, 1])
    logits = K.placeholder((2, 5, 4))
    labels, lengths = K.constant([[0, 1], [1, 1]]), (K.constant([[5], [5]]), K.constant([[2], [2]]))
    ctc = K.function([logits], [K.ctc_batch_cost(labels, K.softmax(logits), *lengths)])
    def step():
        seen.clear()
        prepares[0] = 0
        net.train_on_batch(x, y)
        ctc([rng.standard_normal((2, 5, 4)).astype(np.float32)])
        return set(seen), prepares[0]
    families, count = step()                           # the first step prepares every family's problems
    kept = ('conv_fwd', 'conv_wgrad', 'bn_train_fwd', 'bn_bwd', 'max_pool_fwd', 'max_pool_bwd', 'avg_pool_fwd',
            'avg_pool_bwd', 'bias_act_fwd', 'fused', 'ctc_loss_fwd')
    for name in kept + ('sparse_softmax_xent_fwd', 'sparse_softmax_xent_bwd'):
        assert name in families, (name, families)
    assert count > 0, count
    step()   # Adam's iteration count: a 0-d array at first, a NumPy scalar after its first update
    families, count = step()
    assert count == 0, count                           # the second step of the signature: prepared
    # their plan steps keep their runners (prepared.Kept): not even the prepared table is asked
    assert not families & set(kept), families
    os.environ['GPUK_CHECK_LAUNCHES'] = '1'
    families, count = step()
    assert count == len(seen) > 0, (count, len(seen))  # the debug flag: every call checked
    print('ok')
    ''')


@pytest.mark.usefixtures('deferred_checks')
def test_checks_a_graph_collects_gate_its_updates_and_are_read_after_each_replay():
    """runtime/deferred.py as cuda_graph.py uses it: a capture's checks stay out of the pending
    ones, any_failed gives the device flag its update copies are masked with, and add_combined makes
    them pending again after a replay as one check on their union, to raise the op's own error
    where the outputs are read."""
    import numpy as np
    from gpuk.kernels.runtime import deferred, get_runtime
    rt = get_runtime('emulate')

    def recheck():
        raise ValueError('sparse_categorical_crossentropy: target must lie in [0, 4)')

    with deferred.collecting() as checks:
        deferred.defer(rt, np.array(False), recheck)
    assert deferred.pending_count() == 0 and len(checks) == 1
    assert not deferred.any_failed(checks)[0]
    with deferred.collecting() as failing:
        deferred.defer(rt, np.array(False), recheck)
        deferred.defer(rt, np.array([True]), recheck)
    assert deferred.any_failed(failing)[0]
    deferred.add_combined(checks, deferred.any_failed(checks))
    assert deferred.pending_count() == 1
    deferred.raise_pending()                      # nothing set: no error
    deferred.add_combined(failing, deferred.any_failed(failing))
    with pytest.raises(ValueError, match=r'target must lie in \[0, 4\)'):
        deferred.raise_pending()
    assert deferred.pending_count() == 0


def test_the_cuda_runtime_launches_one_way_and_checks_a_configuration_per_call_outside_prepared_steps():
    """CudaKernel.launch goes through its configuration's CudaLaunch (cuda_runtime.py): kept
    inside prepared steps, checked on every call elsewhere, so an int-equal bool grid or bad
    arguments still raise after a good launch of the same configuration."""
    _rehearse('''
    import numpy as np
    import pytest
    from gpuk import device
    from gpuk.kernels import elementwise, runtime
    rt = runtime.get_runtime('cuda')
    xp = rt.xp
    kernel = rt.load(elementwise.SOURCE, elementwise.defines(np.float32)).kernel('bias_act_fwd')
    x, b = xp.ones((4, 64), xp.float32), xp.full(64, 2.0, xp.float32)
    y = xp.empty_like(x)
    args = (x, b, y, np.int64(x.size), np.int64(64), np.int64(1), np.int32(0))
    kernel.launch(1, 64, args)
    assert np.allclose(device.to_host(y), 3.0)
    for _ in range(2):
        with pytest.raises(ValueError, match="kernel 'bias_act_fwd': grid"):
            kernel.launch(True, 64, args)
        with pytest.raises(TypeError, match="kernel 'bias_act_fwd': argument 0"):
            kernel.launch(1, 64, (x.astype(np.float64),) + args[1:])
    assert kernel.configured(1, 64) is not kernel.configured(1, 64)      # checked on every call
    with runtime.prepared_launches():
        launch = kernel.configured(1, 64)
        assert kernel.configured(1, 64) is launch                        # kept for the prepared step
        y[...] = 0
        launch(args)
    assert np.allclose(device.to_host(y), 3.0)
    print('ok')
    ''')


def test_reused_step_buffers_never_change_results_nor_overwrite_a_held_value():
    """A fused plan step writes its outputs into buffers of its own, reused from one call to the
    next (prepared.StepBuffers) only when nothing else holds them: steps give the numbers that
    fresh buffers on every call give (GPUK_CHECK_LAUNCHES=1 keeps no runner, so no buffer), a
    variable's old value someone still holds is never written, and the steady state reuses."""
    _rehearse('''
    import os
    import numpy as np
    from gpuk import backend as K
    from gpuk.kernels.runtime import counters
    from gpuk.kernels.testing import assert_same_steps
    os.environ['GPUK_CUDA_GRAPHS'] = '0'
    rng = np.random.default_rng(0)
    start_w = rng.standard_normal((8, 3)).astype(np.float32)
    x = K.placeholder((4, 8))
    w, b, m = K.variable(start_w), K.variable(np.zeros(3, np.float32)), K.variable(np.zeros((8, 3), np.float32))
    h = K.dot(x, w)
    z = K.sigmoid(K.relu(K.bias_add(h, b))) * 2.0 + h                # a fused group of several inputs
    loss = K.mean(K.square(z))
    gw, gb = K.gradients(loss, [w, b])
    m_new = 0.9 * m + 0.1 * gw                                       # Adam-like: outputs m_new and w_new
    w_new = w - 0.01 * m_new / (K.sqrt(K.square(m_new)) + 1e-3)
    f = K.function([x], [z, loss], updates=[K.update(m, m_new), K.update(w, w_new), K.update(b, b - 0.1 * gb)])
    batches = [rng.standard_normal((4, 8)).astype(np.float32) for _ in range(8)]
    def train():
        for v, value in ((w, start_w), (b, np.zeros(3, np.float32)), (m, np.zeros((8, 3), np.float32))):
            K.set_value(v, value)
        outputs, allocations = [], []
        for step, value in enumerate(batches):
            if step == 2:
                held, held_copy = w.value, np.array(w.value)         # an old value someone keeps
            with counters.counting() as c:
                outputs.append(f([value]) + [K.get_value(w), K.get_value(m)])
            allocations.append(c.allocations)
            if step == 4:
                assert np.array_equal(held, held_copy)               # never written since
                del held
        return outputs, allocations
    reused, reused_allocations = train()
    os.environ['GPUK_CHECK_LAUNCHES'] = '1'                          # no kept runner: fresh buffers
    fresh, fresh_allocations = train()
    assert_same_steps(reused, fresh)
    assert reused_allocations[-1] == reused_allocations[-2] < fresh_allocations[-1], (reused_allocations,
                                                                                        fresh_allocations)
    print('ok')
    ''')


# Allocations per steady-state plain step of bench.host_overhead's models (docs/architecture.md,
# "The memory plan"): every step of the three writes into its reused StepBuffers (the demo CTC
# model's CTC loss and gradient, K.tile, reshapes that copy and the scans' contiguous copies of a
# strided sequence included), and its two fused ReLU-gradient steps read their transposed input
# (the GRUs' batch-major outputs) in place instead of copying it
PLAIN_STEP_ALLOCATIONS = {'mlp': 0, 'bn_cnn': 0, 'ctc': 0}


def test_steady_steps_of_the_three_bench_models_sync_nothing_and_allocate_only_what_is_known():
    """bench.host_overhead's models on plain launches (dry: counts only): no device-to-host
    sync inside a steady-state step, the same allocations step after step, and exactly
    PLAIN_STEP_ALLOCATIONS of them (0 for each)."""
    _rehearse('''
    from bench import host_overhead
    from tests.gpu_rehearsal import rehearsal_runtime
    rehearsal_runtime.set_dry_launch_bytes(-1)
    for model in host_overhead.MODELS:
        row = host_overhead.measure(model, steps=2, warmup=3, graphs=False)
        assert row['syncs_in_step'] == 0 and row['steady'], row
        assert row['allocations'] == %r[model], row
    print('ok')
    ''' % PLAIN_STEP_ALLOCATIONS)


# Peak traced memory of a steady plain step with kept step buffers over the same without them
# (GPUK_STEP_BUFFERS=0: the pool's reuse alone), in the rehearsal with dry launches, at
# bench.host_overhead's batches (docs/architecture.md "The memory plan"). Measured 1.049 for the
# BN CNN and 1.080 for the demo CTC model with the shared arena (prepared.StepBuffers); one list
# of buffers per step output, before it, gave 1.217 and 1.248.
PEAK_OVER_POOL = 1.12


def test_kept_step_buffers_share_blocks_so_a_step_peaks_near_the_pools_reuse():
    """Steps of one shape and dtype share the arena's buffers, so a steady plain step of the BN
    CNN and the demo CTC model peaks within PEAK_OVER_POOL of the memory pool's reuse alone, and
    still allocates nothing new (test above)."""
    from bench import host_overhead
    for row in host_overhead.peak_memory_rows(['bn_cnn', 'ctc']):
        assert row['peak_kept'] <= PEAK_OVER_POOL * row['peak_not_kept'], row


def test_reused_buffers_of_xp_and_kernel_steps_never_change_results_nor_a_held_value():
    """Steps computed with xp (reductions, binary ops, casts, shapes) and the batch norm, pooling
    and conv launches write into their step's reused buffers (prepared.xp_step_runner,
    prepared.Outputs): training steps give bit for bit the numbers of fresh buffers on every call
    (GPUK_CHECK_LAUNCHES=1 keeps no runner, so no buffer), an output the caller keeps and a
    variable's old value someone keeps are never written, and the steady state allocates 0."""
    _rehearse('''
    import os
    import numpy as np
    from gpuk import backend as K
    from gpuk.kernels.runtime import counters
    from gpuk.kernels.testing import assert_same_steps
    os.environ['GPUK_CUDA_GRAPHS'] = '0'
    rng = np.random.default_rng(0)
    start_w = rng.standard_normal((3, 3, 2, 4)).astype(np.float32)
    x = K.placeholder((None, 6, 6, 2))
    w = K.variable(start_w)
    gamma, beta = K.variable(np.ones(4, np.float32)), K.variable(np.zeros(4, np.float32))
    h = K.conv2d(x, w)
    normed, mean, var = K.normalize_batch_in_training(h, gamma, beta, [0, 1, 2])
    pooled = K.pool2d(K.relu(normed), (2, 2), strides=(2, 2))
    per_sample = K.sum(K.reshape(pooled, (K.shape(pooled)[0], -1)), axis=1)   # xp steps: shape, reduce
    loss = K.mean(K.square(per_sample - K.cast(K.shape(x)[0], 'float32')))
    gw, gg, gb = K.gradients(loss, [w, gamma, beta])
    f = K.function([x], [per_sample, mean, loss],
                   updates=[K.update_sub(w, 0.01 * gw), K.update_sub(gamma, 0.01 * gg), K.update_sub(beta, 0.01 * gb)])
    batches = [rng.standard_normal((3, 6, 6, 2)).astype(np.float32) for _ in range(7)]
    def train():
        for v, value in ((w, start_w), (gamma, np.ones(4, np.float32)), (beta, np.zeros(4, np.float32))):
            K.set_value(v, value)
        outputs, allocations = [], []
        for step, value in enumerate(batches):
            if step == 2:
                held, held_copy = w.value, np.array(w.value)          # an old value someone keeps
                kept_output, kept_copy = None, None
            with counters.counting() as c:
                result = f([value])
            if step == 2:
                kept_output, kept_copy = result[0], np.array(result[0])   # an output the caller keeps
            outputs.append([np.array(r) for r in result] + [K.get_value(w), K.get_value(gamma)])
            allocations.append(c.allocations)
            if step == 5:
                assert np.array_equal(held, held_copy) and np.array_equal(kept_output, kept_copy)
                del held, kept_output
        return outputs, allocations
    reused, reused_allocations = train()
    os.environ['GPUK_CHECK_LAUNCHES'] = '1'                          # no kept runner: fresh buffers
    fresh, fresh_allocations = train()
    assert_same_steps(reused, fresh)
    assert reused_allocations[-1] == 0 < fresh_allocations[-1], (reused_allocations, fresh_allocations)
    print('ok')
    ''')


def test_steps_skip_their_layout_comparison_only_where_a_plan_run_repeats_its_layouts():
    """prepared.LayoutToken: a plan whose output shapes follow from its inputs' layouts (K.shape
    arithmetic included) lets its steps skip comparing layouts; one reading a shape from a fed
    value does not, so a new shape vector with the same input layouts still gives its shape."""
    _rehearse('''
    import os
    import numpy as np
    from gpuk import backend as K
    from gpuk.kernels.runtime import prepared
    os.environ['GPUK_CUDA_GRAPHS'] = '0'
    x = K.placeholder((None, 6))
    shape = K.placeholder((2,), dtype='int64')
    fed = K.function([x, shape], [K.relu(K.reshape(x, shape)) * 2.0 + 1.0])
    derived = K.function([x], [K.relu(K.reshape(x, (K.shape(x)[0] * 2, 3))) * 2.0 + 1.0])
    value = np.arange(24, dtype=np.float32).reshape(4, 6) - 10
    expected = np.maximum(value, 0) * 2 + 1
    for target in [(4, 6), (4, 6), (2, 12), (3, 8)]:
        out, = fed([value, np.array(target)])
        assert np.array_equal(out, expected.reshape(target)), target
    assert not fed._compiled()._repeats_layouts
    compared = []
    real = prepared.Kept.run
    def run(self, owner, arrays, make):
        compared.append(prepared._plan_run.token is None or self._last is None
                        or self._last[4] is not prepared._plan_run.token)
        return real(self, owner, arrays, make)
    prepared.Kept.run = run
    for n in (4, 4, 4, 2, 2):
        compared.clear()
        out, = derived([value[:n]])
        assert np.array_equal(out, expected[:n].reshape(n * 2, 3)), n
    # the last run: no comparison (the fused step's Kept, and those of the xp steps computing the shape)
    assert derived._compiled()._repeats_layouts and compared and not any(compared), compared
    print('ok')
    ''')


# A K.rnn tanh cell over (2, steps, 3) inputs and its training step (an update of u), plain launches.
_RNN_STEP = '''
    import os
    import numpy as np
    from gpuk import backend as K
    os.environ['GPUK_CUDA_GRAPHS'] = '0'
    def rnn_training_step(steps, loss_of_outputs):
        x = K.placeholder((2, steps, 3))
        w = K.variable(np.full((3, 4), 0.1, np.float32))
        u = K.variable(np.full((4, 4), 0.2, np.float32))
        def step(x_t, states):
            h = K.tanh(K.dot(x_t, w) + K.dot(states[0], u))
            return h, [h]
        _, outputs, _ = K.rnn(step, x, [K.zeros((2, 4))])
        loss = loss_of_outputs(outputs)
        return K.function([x], [loss], updates=[K.update_sub(u, 0.01 * K.gradients(loss, [u])[0])])
'''


def test_a_scan_gradient_step_plan_not_reading_a_sequence_still_repeats_its_layouts():
    """A scan's gradient step plan is fed None for the forward sequences its steps do not
    read (the input slice x_t, when the weight gradients are taken after the loop): its plan
    runs still get a LayoutToken, as only the inputs a step reads make the steps' layouts."""
    _rehearse(_RNN_STEP + '''
    f = rnn_training_step(5, K.sum)
    value = np.ones((2, 5, 3), np.float32)
    for _ in range(3):
        f([value])
    fed_none, tokens = [], []
    real_token = f._compiled().__class__._layout_token
    def layout_token(plan, env):
        token = real_token(plan, env)
        fed_none.append(any(env[s] is None for s in plan.input_slots))
        tokens.append(token)
        return token
    f._compiled().__class__._layout_token = layout_token
    f([value])
    assert any(fed_none), 'no step plan was fed None: the test no longer tests that'
    assert all(t is not None for t in tokens), tokens
    print('ok')
    ''')


# Script lines recording in ``copies`` the shape of each strided input a fused step copies
_COPY_RECORDER = '''
    from gpuk.kernels import fused_elementwise
    copies = []
    real = fused_elementwise._contiguous
    def contiguous(xp, a):
        copies.append(a.shape)
        return real(xp, a)
    fused_elementwise._contiguous = contiguous
'''


def test_a_scan_copies_a_strided_sequence_once_per_loop_not_once_per_time_step():
    """The gradient of a K.rnn's batch-major outputs reaches the gradient scan as a time-major
    view whose per-step slices are strided; the kernels take contiguous operands, so the scan
    copies that sequence once (Scan: _steps_contiguous) instead of the fused step copying each
    slice: a steady step makes as many contiguous copies for 10 time steps as for 5."""
    _rehearse(_RNN_STEP + _COPY_RECORDER + '''
    def copies_per_step(steps):
        f = rnn_training_step(steps, lambda outputs: K.sum(K.square(outputs)))
        value = np.ones((2, steps, 3), np.float32)
        for _ in range(3):
            f([value])
        copies.clear()
        f([value])
        return len(copies)
    short, long = copies_per_step(5), copies_per_step(10)
    assert short == long, (short, long)
    print('ok')
    ''')


def test_a_capture_leaves_no_kept_buffer_to_plain_runs():
    """The step buffers a capture's steps take belong to the graph, whose replays keep writing
    them: the kept runners start over after the capture (prepared.forget_kept), not only before
    it, so that a plain run of another plan sharing an op is never handed one of them."""
    _rehearse('''
    import os
    import numpy as np
    from gpuk import backend as K
    from gpuk.kernels.runtime import prepared
    from gpuk import cuda_graph
    os.environ['GPUK_CUDA_GRAPHS'] = '1'
    capturing, forgotten = [], []
    begin = cuda_graph.CapturedStep.__init__
    forget = prepared.forget_kept
    def counting_forget():
        forgotten.append(bool(capturing))
        forget()
    def tracked_init(self, *args, **kwargs):
        capturing.append(True)
        try:
            begin(self, *args, **kwargs)
        finally:
            capturing.pop()
    cuda_graph.prepared.forget_kept = counting_forget
    cuda_graph.CapturedStep.__init__ = tracked_init
    x = K.placeholder((4, 8))
    v = K.variable(np.zeros((4, 8), np.float32))
    y = K.tanh(x * 2.0 + 1.0)
    f = K.function([x], [y], updates=[K.update(v, y)])
    for _ in range(3):                        # plain, then capture and replay
        f([np.ones((4, 8), np.float32)])
    assert f._compiled().graphs.captured, f._compiled().graphs.refused
    assert forgotten == [True, True], forgotten   # before the capture's warm-up and after the capture
    print('ok')
    ''')


def test_ctc_tile_and_copying_reshape_steps_write_reused_buffers_and_equal_fresh_ones():
    """The CTC loss and gradient launchers (CtcLoss / CtcLossGrad keep their runners: the loss,
    log_alpha's padded rows, frame_lse, the gradient and its work arrays in step buffers), K.tile
    and a reshape that copies a strided value write into their steps' reused buffers: training
    steps give bit for bit the numbers of fresh buffers (GPUK_CHECK_LAUNCHES=1 keeps no runner),
    a variable's old value someone holds is never written, the labels' value check still raises
    per call, and the steady state allocates 0."""
    _rehearse('''
    import os
    import numpy as np
    from gpuk import backend as K
    from gpuk.kernels.runtime import counters
    from gpuk.kernels.testing import assert_same_steps
    os.environ['GPUK_CUDA_GRAPHS'] = '0'
    rng = np.random.default_rng(0)
    start_w = (rng.standard_normal((5, 5)) * 0.5).astype(np.float32)
    x = K.placeholder((None, 7, 5))
    labels = K.placeholder((None, 3))
    lengths = K.placeholder((None, 1))
    w = K.variable(start_w)
    y_pred = K.softmax(K.dot(x, w))
    loss = K.ctc_batch_cost(labels, y_pred, K.tile(lengths[:, :1] * 0 + 7, (1, 1)), lengths)
    flat = K.reshape(K.permute_dimensions(K.dot(x, w), (0, 2, 1)), (-1, 35))   # strided: the reshape copies
    tiled = K.tile(lengths, (1, 4))
    g, = K.gradients(K.mean(loss), [w])
    f = K.function([x, labels, lengths], [loss, K.sum(flat, axis=1), tiled], updates=[K.update_sub(w, 0.1 * g)])
    label_values = np.array([[0, 1, 2], [3, 3, 0], [1, 0, 0]], np.float32)
    length_values = np.array([[3], [2], [1]], np.float32)
    batches = [rng.standard_normal((3, 7, 5)).astype(np.float32) for _ in range(6)]
    def train():
        K.set_value(w, start_w)
        outputs, allocations = [], []
        for step, value in enumerate(batches):
            if step == 2:
                held, held_copy = w.value, np.array(w.value)          # an old value someone keeps
            with counters.counting() as c:
                result = f([value, label_values, length_values])
            outputs.append([np.array(r) for r in result] + [K.get_value(w)])
            allocations.append(c.allocations)
            if step == 4:
                assert np.array_equal(held, held_copy)
                del held
        return outputs, allocations
    reused, reused_allocations = train()
    try:                                                              # a bad label: still raised per call
        f([batches[0], label_values + 0.5, length_values])
        raise AssertionError('no error')
    except ValueError as error:
        assert 'y_true must hold integers' in str(error), error
    os.environ['GPUK_CHECK_LAUNCHES'] = '1'                           # no kept runner: fresh buffers
    fresh, fresh_allocations = train()
    assert_same_steps(reused, fresh)
    assert np.all(np.isfinite(reused[-1][0])), reused[-1][0]
    assert reused_allocations[-1] == 0 < fresh_allocations[-1], (reused_allocations, fresh_allocations)
    print('ok')
    ''')


def test_fused_steps_read_a_transposed_input_in_place_and_equal_fresh_buffers():
    """K.rnn's outputs are a batch-major view of its time-major stacked results; the fused step
    reading them (a ReLU after the loop, as the demo CTC model's ReLU-gradient steps read its
    GRUs' outputs) reads that view in place (fused_elementwise: _dense_block) instead of
    copying it, and its gradient step so reads the sum's gradient broadcast to the outputs'
    shape (zero strides): training steps give bit for bit the numbers of fresh buffers
    (GPUK_CHECK_LAUNCHES=1 keeps no runner) with those inputs copied, an output the caller
    keeps and a variable's old value someone keeps are never written, and the steady state
    copies and allocates nothing."""
    _rehearse('''
    import os
    import numpy as np
    from gpuk import backend as K
    from gpuk.kernels.runtime import counters
    from gpuk.kernels.testing import assert_same_steps
    os.environ['GPUK_CUDA_GRAPHS'] = '0'
    ''' + _COPY_RECORDER + '''
    rng = np.random.default_rng(0)
    start_u = (rng.standard_normal((4, 4)) * 0.3).astype(np.float32)
    x = K.placeholder((2, 6, 3))
    w = K.variable((rng.standard_normal((3, 4)) * 0.5).astype(np.float32))
    u = K.variable(start_u)
    def step(x_t, states):
        h = K.tanh(K.dot(x_t, w) + K.dot(states[0], u))
        return h, [h]
    _, outputs, _ = K.rnn(step, x, [K.zeros((2, 4))])
    activated = K.relu(outputs - 0.1) * 2.0 + 0.5                    # reads the batch-major view
    loss = K.sum(K.square(activated))
    f = K.function([x], [activated, loss], updates=[K.update_sub(u, 0.01 * K.gradients(loss, [u])[0])])
    batches = [rng.standard_normal((2, 6, 3)).astype(np.float32) for _ in range(6)]
    def train():
        K.set_value(u, start_u)
        outputs, allocations, copied = [], [], []
        for step, value in enumerate(batches):
            if step == 2:
                held, held_copy = u.value, np.array(u.value)          # an old value someone keeps
            copies.clear()
            with counters.counting() as c:
                result = f([value])
            if step == 2:
                kept_output, kept_copy = result[0], np.array(result[0])   # an output the caller keeps
            outputs.append([np.array(r) for r in result] + [K.get_value(u)])
            allocations.append(c.allocations)
            copied.append(len(copies))
        assert np.array_equal(held, held_copy) and np.array_equal(kept_output, kept_copy)
        return outputs, allocations, copied
    reused, reused_allocations, reused_copies = train()
    os.environ['GPUK_CHECK_LAUNCHES'] = '1'                           # no kept runner: fresh buffers
    fused_elementwise._dense_block = lambda a: None                   # and strided inputs copied
    fresh, fresh_allocations, fresh_copies = train()
    assert_same_steps(reused, fresh)
    assert reused_copies == [0] * len(batches) and fresh_copies[-1] == 2, (reused_copies, fresh_copies)
    assert reused_allocations[-1] == 0 < fresh_allocations[-1], (reused_allocations, fresh_allocations)
    print('ok')
    ''')


def test_a_copying_reshape_keeps_its_buffer_only_for_the_shape_it_probed():
    """Reshape's kept variant copies a strided value into its step buffer for the layouts whose
    reshape copies; a fed shape vector may give another shape with the same layouts (then a
    plain reshape), a view stays a view, and a held result is never written."""
    _rehearse('''
    import os
    import numpy as np
    from gpuk import backend as K
    os.environ['GPUK_CUDA_GRAPHS'] = '0'
    x = K.placeholder((4, 6))
    shape = K.placeholder((2,), dtype='int64')
    fed = K.function([x, shape], [K.reshape(K.transpose(x), shape) + 0.0, K.reshape(x, shape) + 0.0])
    static = K.function([x], [K.reshape(K.transpose(x), (3, 8))])
    value = np.arange(24, dtype=np.float32).reshape(4, 6)
    for target in [(6, 4), (6, 4), (3, 8), (-1, 12), (8, -1), (6, 4)]:
        strided, plain = fed([value, np.array(target)])
        assert np.array_equal(strided, value.T.reshape(target)), target
        assert np.array_equal(plain, value.reshape(target)), target
    first = static([value])[0]
    kept, kept_copy = first, np.array(first)
    for k in range(3):
        out = static([value + k])[0]
        assert np.array_equal(out, (value + k).T.reshape(3, 8)), k
    assert np.array_equal(kept, kept_copy)
    print('ok')
    ''')


def test_a_capture_whose_warm_up_finds_a_bad_value_leaves_plain_runs_nothing_of_its_pool():
    """A capture's warm-up runs in the graph's private pool: the kept runners it made (K.shape's
    array, made once per layout) start over after it also when it stops at a bad value
    (cuda_graph.BadValues), so that a plain run never reads memory of a pool dropped with it."""
    _rehearse('''
    import os
    import numpy as np
    from gpuk import backend as K
    from gpuk import cuda_graph
    os.environ['GPUK_CUDA_GRAPHS'] = '1'
    x, labels = K.placeholder((None, 3)), K.placeholder((None,))
    rows = K.cast(K.shape(x)[0], 'float32')
    loss = K.sum(K.sparse_categorical_crossentropy(labels, x, from_logits=True)) / rows
    f = K.function([x, labels], [loss])
    logits = np.ones((4, 3), np.float32)
    f([logits, np.zeros(4, np.float32)])                      # plain: the signature's first call
    shape_kept, = [step[0].__self__.kept for step in f._compiled().steps if type(step[0].__self__).__name__ == 'Shape']
    in_warm_up = []
    begin = cuda_graph.CapturedStep.__init__
    def tracked_init(self, *args, **kwargs):
        try:
            begin(self, *args, **kwargs)
        except cuda_graph.BadValues:
            in_warm_up.append(shape_kept._last[3]())          # K.shape's array, made in the warm-up
            raise
    cuda_graph.CapturedStep.__init__ = tracked_init
    try:
        f([logits, np.full(4, 7, np.float32)])                  # labels out of range: the warm-up stops
        raise AssertionError('no error for labels out of range')
    except ValueError as error:
        assert 'must lie in [0, 3)' in str(error), error
    assert len(in_warm_up) == 1 and not f._compiled().graphs.captured
    assert shape_kept._last[3]() is not in_warm_up[0]         # the call's plain run made its own
    print('ok')
    ''')
