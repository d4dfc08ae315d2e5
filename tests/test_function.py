"""K.function: plans, updates, learning phase, inputs, errors."""
import numpy as np
import pytest

from gpuk import backend as K
from gpuk.function import Plan


def test_updates_are_computed_from_old_values_and_applied_after_outputs(on_device):
    a = K.variable(1.0)
    b = K.variable(10.0)
    x = K.placeholder(())
    f = K.function([x], [a + b + x], updates=[(a, b), K.update(b, a), K.update_add(a, 0)])
    out, = f([0.5])
    assert out == 11.5
    # every new value saw the old values: a <- b (10), b <- a (1), then a <- a + 0 (old a = 1)
    assert K.get_value(b) == 1.0


def test_update_kinds(on_device):
    v = K.variable(np.array([1.0, 2.0]))
    f = K.function([], [], updates=[K.update_add(v, 1.0)])
    f([])
    np.testing.assert_allclose(K.get_value(v), [2.0, 3.0])
    K.function([], [], updates=[K.update_sub(v, np.array([2.0, 1.0]))])([])
    np.testing.assert_allclose(K.get_value(v), [0.0, 2.0])
    K.function([], [], updates=[K.moving_average_update(v, K.constant([10.0, 10.0]), 0.9)])([])
    np.testing.assert_allclose(K.get_value(v), [1.0, 2.8], rtol=1e-6)
    counter = K.variable(0, dtype='int64')
    step = K.function([], [counter], updates=[K.update_add(counter, 1)])
    assert [int(step([])[0]) for _ in range(3)] == [0, 1, 2]
    assert K.get_value(counter).dtype == np.int64


def test_failed_update_leaves_every_variable_unchanged():
    a = K.variable(np.zeros(2))
    b = K.variable(np.zeros(3))
    x = K.placeholder((None,))
    f = K.function([x], [], updates=[(a, a + 1), (b, x)])
    with pytest.raises(ValueError, match='function: update of .* has shape'):
        f([np.ones(4)])
    np.testing.assert_array_equal(K.get_value(a), [0, 0])
    np.testing.assert_array_equal(K.get_value(b), [0, 0, 0])


def test_outputs_are_copies_not_views_of_state():
    v = K.variable(np.zeros(3))
    out = K.function([], [v, K.reshape(v, (3, 1))])([])
    out[0][:] = 7
    out[1][:] = 7
    np.testing.assert_array_equal(K.get_value(v), [0, 0, 0])
    got = K.get_value(v)
    got[:] = 5
    np.testing.assert_array_equal(K.get_value(v), [0, 0, 0])


def test_inputs_validation_and_python_scalars():
    x = K.placeholder((None, 2))
    s = K.placeholder(())
    f = K.function([x, s], [x * s])
    np.testing.assert_allclose(f([np.ones((1, 2)), 3])[0], [[3, 3]])
    with pytest.raises(ValueError, match=r'function: input .* expects shape \(None, 2\), got \(1, 3\)'):
        f([np.ones((1, 3)), 1])
    with pytest.raises(ValueError, match='function: expected a list of 2 input values'):
        f([np.ones((1, 2))])
    with pytest.raises(TypeError, match='function: inputs must be placeholders'):
        K.function([K.variable(1.0)], [x])
    with pytest.raises(ValueError, match='function: unexpected keyword arguments'):
        K.function([x], [x], fetches=[])
    with pytest.raises(ValueError, match='is needed but is not among the inputs'):
        K.function([], [x * 2])([])


def test_learning_phase_defaults_to_test_and_can_be_fed():
    x = K.placeholder((2,))
    y = K.in_train_phase(x * 2, x * 3)
    assert y._uses_learning_phase
    phase = K.learning_phase()
    np.testing.assert_allclose(K.function([x], [y])([np.ones(2)])[0], [3, 3])
    f = K.function([x, phase], [y])
    np.testing.assert_allclose(f([np.ones(2), 1])[0], [2, 2])
    np.testing.assert_allclose(f([np.ones(2), 0])[0], [3, 3])
    np.testing.assert_allclose(K.function([x], [K.in_test_phase(x * 2, x * 3)])([np.ones(2)])[0], [2, 2])


def test_fixed_learning_phase():
    x = K.placeholder((2,))
    K.set_learning_phase(1)
    assert K.learning_phase() == 1
    assert K.in_train_phase(x * 2, x * 3) is not None
    np.testing.assert_allclose(K.function([x], [K.in_train_phase(x * 2, x * 3)])([np.ones(2)])[0], [2, 2])
    with pytest.raises(ValueError, match='set_learning_phase: value must be 0 or 1'):
        K.set_learning_phase(2)
    K.clear_session()
    with K.learning_phase_scope(0):
        assert K.learning_phase() == 0
    assert K.is_placeholder(K.learning_phase())


def test_plan_folds_constants_and_frees_intermediates(monkeypatch):
    monkeypatch.setenv('GPUK_FUSION', '0')   # the three steps would fuse into one (tests/test_fusion_elementwise.py)
    x = K.placeholder((3,))
    folded = K.exp(K.constant([0.0, 1.0, 2.0])) * 2
    y = K.tanh(x) * folded + 1
    f = K.function([x], [y])
    np.testing.assert_allclose(f([np.zeros(3)])[0], [1, 1, 1])
    plan = f._plan
    op_names = [type(forward.__self__).__name__ for forward, _, _, _ in plan.steps]
    assert 'Unary' in op_names and len(plan.steps) == 3  # tanh, multiply, add: exp and *2 folded
    freed = {s for _, _, _, frees in plan.steps for s in frees}
    assert plan.target_slots[0] not in freed and len(freed) >= 2
    f([np.ones(3)])
    assert f._plan is plan  # compiled once, reused


def test_random_ops_are_not_folded():
    f = K.function([], [K.random_uniform((4,))])
    assert not np.array_equal(f([])[0], f([])[0])


def test_eval_and_print_tensor(capsys):
    x = K.constant([1.0, 2.0])
    np.testing.assert_allclose(K.eval(K.print_tensor(x * 2, message='twice:')), [2, 4])
    assert 'twice:' in capsys.readouterr().out


def test_plan_accepts_non_placeholder_inputs():
    x = K.placeholder((2,))
    mid = x * 2
    out = mid + 1
    from gpuk import device
    plan = Plan([mid], [out], device.impl())
    np.testing.assert_allclose(plan.run([np.array([1.0, 2.0])])[0], [2.0, 3.0])


def test_plan_takes_static_shapes_as_constants():
    w = K.variable(np.ones((3, 4)))
    x = K.placeholder((None, 4))
    f = K.function([x], [K.reshape(x, (-1, K.shape(w)[1])), K.shape(x)[0] * K.shape(w)[0]])
    got = f([np.ones((2, 4))])
    assert got[0].shape == (2, 4) and got[1] == 6
    op_names = [type(forward.__self__).__name__ for forward, _, _, _ in f._plan.steps]
    assert op_names.count('Shape') == 1  # K.shape(x) only: K.shape(w) is known at compile time


def test_steps_call_their_kept_runners_once_a_run_of_the_same_layouts_repeats(on_device, monkeypatch):
    """From the third run with the same input layouts (prepared.LayoutToken), a step whose op
    keeps a runner (Op.kept) calls it directly, not through its forward; new layouts,
    prepared.clear() and GPUK_CHECK_LAUNCHES=1 go through the forwards again, and every run
    gives the same results."""
    from gpuk.kernels.runtime import prepared
    x = K.placeholder((None, 3))
    w = K.variable(np.full((3, 4), 0.5, np.float32))
    b = K.variable(np.arange(4, dtype=np.float32))
    f = K.function([x], [K.relu(K.bias_add(K.dot(x, w), b)) * 2.0 + 1.0])
    through_kept = []
    real = prepared.Kept.run

    def run(self, owner, arrays, make):
        through_kept.append(type(self))
        return real(self, owner, arrays, make)
    monkeypatch.setattr(prepared.Kept, 'run', run)

    def calls_through_kept(value):
        through_kept.clear()
        out, = f([value])
        expected = np.maximum(value @ np.full((3, 4), 0.5) + np.arange(4), 0) * 2 + 1
        np.testing.assert_allclose(out, expected, rtol=1e-6)
        return len(through_kept)

    value, other = np.ones((2, 3), np.float32), np.ones((5, 3), np.float32)
    first, second, third, fourth = [calls_through_kept(value) for _ in range(4)]
    assert first == second > 0 and third == fourth == 0, (first, second, third, fourth)
    assert calls_through_kept(other) == first          # new layouts: a new token
    assert calls_through_kept(value) == first          # and back
    prepared.clear()                                   # the runners are made again, in the next run
    assert [calls_through_kept(value) for _ in range(3)] == [first, 0, 0]
    monkeypatch.setenv('GPUK_CHECK_LAUNCHES', '1')
    assert calls_through_kept(value) == first
    monkeypatch.delenv('GPUK_CHECK_LAUNCHES')
    assert calls_through_kept(value) == 0


def test_an_op_in_two_steps_of_different_shapes_never_calls_one_kept_runner_for_both(on_device):
    """One op object in two steps shares one prepared.Kept, which keeps a runner for the shapes
    of its last call: neither step may be handed the other's runner, through its forward
    (Kept: a second call in a run trusts no token) or directly (Plan: _sole_kepts)."""
    from gpuk.graph import apply
    from gpuk.ops.bias import BiasAct
    shared = BiasAct(1, 'relu')
    x1, x2, b = K.placeholder((2, 3)), K.placeholder((4, 3)), K.variable(np.array([0.5, -1.0, 2.0], np.float32))
    f = K.function([x1, x2], [apply(shared, x1, b), apply(shared, x2, b)])
    v1, v2 = np.full((2, 3), 1.0, np.float32), np.full((4, 3), -2.0, np.float32)
    for _ in range(4):
        y1, y2 = f([v1, v2])
        np.testing.assert_array_equal(y1, np.maximum(v1 + [0.5, -1.0, 2.0], 0))
        np.testing.assert_array_equal(y2, np.maximum(v2 + [0.5, -1.0, 2.0], 0))


def test_an_op_repr_shows_what_it_computes_not_its_kept_runner():
    """Op.kept is run-time state like the private attributes: a repr names the op's parameters
    only, the same for two ops that compute the same thing."""
    from gpuk.ops.bias import BiasAct
    from gpuk.ops.linalg import MatMul
    assert repr(BiasAct(-1, 'relu')) == repr(BiasAct(-1, 'relu')) == "BiasAct(activation='relu', axis=-1)"
    assert repr(MatMul()) == 'MatMul()'


def test_only_ops_whose_forward_calls_their_kept_runner_expose_one(on_device, rng):
    """Op.kept says a plan may call the step's kept runner in place of its forward. The locally
    connected convolutions share _WindowOp with the convolutions but launch without a Kept:
    they expose none, and their plans give the same results run after run."""
    x = K.placeholder((2, 5, 5, 3))
    w = K.variable(rng.standard_normal((9, 12, 4)).astype(np.float32))
    y = K.local_conv2d(x, w, (2, 2), (1, 1), (3, 3), 'channels_last')
    f = K.function([x], [y, K.gradients(K.sum(y * y), [w])[0]])
    value = rng.standard_normal((2, 5, 5, 3)).astype(np.float32)
    first = f([value])
    for _ in range(3):
        for got, want in zip(f([value]), first):
            np.testing.assert_array_equal(got, want)
    ops = [forward.__self__ for forward, _, _, _ in f._compiled().steps]
    local = [op for op in ops if type(op).__name__.startswith('LocalConv')]
    assert local and all(op.kept is None for op in local), ops


def test_a_counted_run_makes_no_python_call_of_its_own_per_step_but_the_new_buffers_count():
    """Inside counters.counting() a plan's run calls each step through counting.step, which
    leaves its own bookkeeping out of a step's time and Python calls; the run itself makes no
    other Python call per step (no wrapper per step, none built per run). A scan's step plan
    runs once per time step inside the scan step being counted (bench.host_overhead --calls:
    a wrapper per step read the demo CTC model's 30.1 Python calls per launch as 33.9)."""
    import collections
    import sys

    from gpuk import function
    from gpuk.kernels.runtime import counters
    x = K.placeholder((3, 4))
    w = K.variable(np.ones((4, 4), np.float32))
    y = K.sum(K.dot(K.dot(K.dot(x, w), w), w), axis=0)
    f = K.function([x], [y])
    value = np.ones((3, 4), np.float32)
    f([value])
    steps = len(f._plan.steps)
    assert steps >= 4
    calls = collections.Counter()

    def profile(frame, event, arg):
        if event == 'call' and frame.f_code.co_filename == function.__file__:
            calls[frame.f_code.co_qualname] += 1
    with counters.counting():
        sys.setprofile(profile)
        try:
            f([value])
        finally:
            sys.setprofile(None)
    assert {name for name, n in calls.items() if n >= steps} == {'_NewBuffers.__init__', '_NewBuffers.__call__'}, calls
