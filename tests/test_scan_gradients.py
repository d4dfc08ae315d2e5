"""The gradient of a scan (K.rnn) as a training plan runs it: the forward loop runs once and
keeps the values its gradient reads (ResidualScan, merged in the plan), the backward step
recomputes no GEMM of the forward, its gradient plumbing between equal shapes and over gate
slices is gone (gpuk/fusion_gradients.py), its loop invariants run once, and unread state
histories are not recorded. Values: float64 finite differences and NumPy references."""
import numpy as np

from gpuk import backend as K
from gpuk.graph import apply
from gpuk.fusion_gradients import _disjoint
from gpuk.ops.scan import Scan
from gpuk.ops.shape import ScatterSlice, ScatterSlices
from tests.evaluation import compiled_with_fusion, plan_ops
from tests.gradcheck import check_gradients, numeric_gradient

UNITS = 3


def _lstm_like(w, u, b):
    """An LSTM cell written as Keras 2.3.1 writes it (implementation 2): one GEMM per
    operand for all gates, a bias, gate slices, sigmoid and tanh."""
    def step(x_t, states):
        h, c = states
        z = K.bias_add(K.dot(x_t, w) + K.dot(h, u), b)
        i, f = K.sigmoid(z[:, :UNITS]), K.sigmoid(z[:, UNITS:2 * UNITS])
        g, o = K.tanh(z[:, 2 * UNITS:3 * UNITS]), K.sigmoid(z[:, 3 * UNITS:])
        c = f * c + i * g
        h = o * K.tanh(c)
        return h, [h, c]
    return step


def _loss(x, w, u, b):
    zeros = K.zeros_like(x[:, 0, :1]) * K.zeros((1, UNITS), dtype=x.dtype)
    last, _, _ = K.rnn(_lstm_like(w, u, b), x, [zeros, zeros])
    return K.sum(last * last)


def _arrays(dtype):
    rng = np.random.default_rng(5)
    return (rng.standard_normal((2, 4, 2)).astype(dtype),
            rng.standard_normal((2, 4 * UNITS)).astype(dtype) * 0.5,
            rng.standard_normal((UNITS, 4 * UNITS)).astype(dtype) * 0.5,
            rng.standard_normal((4 * UNITS,)).astype(dtype) * 0.1)


def _step_op_names(scan):
    (plan,) = scan._plans.values()
    return [type(forward.__self__).__name__ for forward, _, _, _ in plan.steps]


def test_lstm_like_scan_gradients_match_finite_differences():
    check_gradients(_loss, *_arrays(np.float64), rtol=1e-5, atol=1e-8)


def test_training_plan_runs_the_forward_loop_once_and_recomputes_no_gemm(monkeypatch):
    arrays = _arrays(np.float32)
    x, w, u, b = [K.placeholder(a.shape, dtype='float32') for a in arrays]
    loss = _loss(x, w, u, b)
    grads = K.gradients(loss, [w, u, b])
    f = compiled_with_fusion(monkeypatch, True, [x, w, u, b], [loss] + grads)
    got = f(list(arrays))
    plain = compiled_with_fusion(monkeypatch, False, [x, w, u, b], [loss] + grads)
    for g, want in zip(got, plain(list(arrays))):
        np.testing.assert_allclose(g, want, rtol=1e-5, atol=1e-6)

    scans = [op for op in plan_ops(f) if isinstance(op, Scan)]
    assert [op.where for op in scans] == ['rnn', 'rnn gradient']
    forward, backward = scans
    assert backward.recorded_history == ()   # nothing reads the gradient loop's state history
    forward_ops, backward_ops = _step_op_names(forward), _step_op_names(backward)
    assert forward_ops.count('MatMul') == 2
    # dz @ u^T alone: none of the forward's GEMMs again, and the weight gradients
    # sum_t h_t^T dz_t, sum_t x_t^T dz_t and the bias's are one product (sum) after the loop
    assert backward_ops.count('MatMul') == 1
    # u^T is a loop invariant (the prologue's); no per-step transposes
    assert 'Transpose' not in backward_ops and 'Reduce' not in backward_ops
    outside = [type(op).__name__ for op in plan_ops(f)]
    assert outside.count('MatMul') >= 2   # the two time-summed weight gradients
    # the gate slices' gradients are one buffer; no SumToShapeOf between equal shapes remains
    assert backward_ops.count('ScatterSlices') == 1 and 'ScatterSlice' not in backward_ops
    assert 'SumToShapeOf' not in backward_ops


def test_the_gradient_reads_the_forward_steps_random_values(monkeypatch):
    # noise drawn inside the step: the gradient must use the noise the outputs were made
    # with, so the forward loop must run once (the plan merges the Scan and its ResidualScan)
    x = K.placeholder((3, 5, 4), dtype='float64')

    def step(x_t, states):
        y = x_t * K.random_uniform(K.shape(x_t), 0.5, 1.5, dtype='float64')
        return y, [states[0] + y]
    init = K.zeros_like(x[:, 0])
    _, outputs, _ = K.rnn(step, x, [init])
    weights = K.constant(np.arange(60, dtype=np.float64).reshape(3, 5, 4))
    (g,) = K.gradients(K.sum(outputs * weights), [x])
    values = np.random.default_rng(2).uniform(1, 2, (3, 5, 4))
    for fusion in (True, False):
        out, got = compiled_with_fusion(monkeypatch, fusion, [x], [outputs, g])([values])
        np.testing.assert_allclose(got, out / values * weights.value, rtol=1e-12)


def _slice_gradient(monkeypatch, first, second):
    x = K.placeholder((2, 6), dtype='float64')
    a, b = K.constant(np.full((2, 3), 2.0)), K.constant(np.full((2, 3), 5.0))
    (g,) = K.gradients(K.sum(x[:, first] * a) + K.sum(x[:, second] * b), [x])
    f = compiled_with_fusion(monkeypatch, True, [x], [g])
    (value,) = f([np.ones((2, 6))])
    return value, [type(op) for op in plan_ops(f)]


def test_disjoint_slice_gradients_become_one_scatter(monkeypatch):
    value, ops = _slice_gradient(monkeypatch, slice(0, 3), slice(3, None))
    np.testing.assert_array_equal(value, [[2, 2, 2, 5, 5, 5]] * 2)
    assert ScatterSlices in ops and ScatterSlice not in ops


def test_overlapping_slice_gradients_stay_a_sum(monkeypatch):
    value, ops = _slice_gradient(monkeypatch, slice(0, 3), slice(2, 5))
    np.testing.assert_array_equal(value, [[2, 2, 7, 5, 5, 0]] * 2)
    assert ScatterSlices not in ops and ops.count(ScatterSlice) == 2


def test_disjoint_keys():
    full = slice(None)
    assert _disjoint([(full, slice(0, 3)), (full, slice(3, 6)), (full, slice(6, None))])
    assert not _disjoint([(full, slice(0, 3)), (full, slice(2, None))])
    assert not _disjoint([(slice(0, 1), slice(0, 3)), (full, slice(3, 6))])   # two axes differ
    assert not _disjoint([(full, slice(0, 4, 2)), (full, slice(1, 5, 2))])     # strided: not checked
    assert not _disjoint([(full, slice(-3, None)), (full, slice(0, 3))])       # negative bounds


def test_scattered_slices_fill_zeros_only_where_they_do_not_cover(monkeypatch):
    # slices covering the whole tensor (an LSTM's four gates) skip the zero fill; a gap
    # between slices stays zero even in a buffer that held other values
    from gpuk import device
    full = slice(None)
    covering = ScatterSlices([(full, slice(0, 2)), (full, slice(2, 5)), (full, slice(5, None))])
    gapped = ScatterSlices([(full, slice(0, 2)), (full, slice(3, 5))])
    assert covering._covers((3, 7)) and not gapped._covers((3, 7))
    monkeypatch.setattr(np, 'empty', lambda shape, dtype: np.full(shape, np.nan, dtype))
    like, ones = np.zeros((3, 7)), np.ones((3, 2))
    np.testing.assert_array_equal(covering.forward(device.impl(), ones, 2 * np.ones((3, 3)), 3 * ones, like),
                                  [[1, 1, 2, 2, 2, 3, 3]] * 3)
    np.testing.assert_array_equal(gapped.forward(device.impl(), ones, 2 * ones, like),
                                  [[1, 1, 0, 2, 2, 0, 0]] * 3)


def test_loop_invariants_run_once_and_keep_their_shapes():
    # a step reading transpose(w) and sum(w) (a scalar), w captured: the prologue computes
    # both once per loop, the step reads them with their own shapes (the scalar stays 0-d).
    # Built as a Scan node directly: K.rnn and map_fn compute such values outside the step
    # (find_captured); inside, they come from gradients (a backward step's transposed kernel).
    rng = np.random.default_rng(4)
    xs, ws = rng.standard_normal((3, 2, 4)), rng.standard_normal((4, 4))
    x, w = K.placeholder((3, 2, 4), dtype='float64'), K.placeholder((4, 4), dtype='float64')
    x_t, w_inner = K.placeholder((2, 4), dtype='float64'), K.placeholder((4, 4), dtype='float64')
    total = K.sum(w_inner)
    scan = Scan([x_t], [], [w_inner], [K.dot(x_t, K.transpose(w_inner)) * total, total], [])
    products, sums = apply(scan, x, w)
    f = K.function([x, w], [products, sums])
    got, got_sums = f([xs, ws])
    np.testing.assert_allclose(got, xs @ ws.T * ws.sum(), rtol=1e-12)
    np.testing.assert_allclose(got_sums, np.full(3, ws.sum()), rtol=1e-12)
    assert got_sums.shape == (3,)
    (prologue,) = scan._prologues.values()
    assert [type(forward.__self__).__name__ for forward, _, _, _ in prologue.steps] == ['Reduce', 'Transpose']
    assert _step_op_names(scan) == ['MatMul', 'Binary']


def test_second_order_gradients_through_the_gradient_loop():
    # the gradient of a gradient reads the forward loop's state history, so the history's
    # gradient is not zeros there (the first-order gradient skips adding zeros per step), and
    # the time-summed weight gradients (one product after the loop) differentiate again
    def gradient_norm(x, w, u, b):
        (g_u,) = K.gradients(_loss(x, w, u, b), [u])
        return K.sum(g_u * g_u)
    check_gradients(gradient_norm, *_arrays(np.float64), rtol=1e-4, atol=1e-7)


def test_stacked_results_reuse_their_buffers_only_when_nothing_holds_them(monkeypatch):
    # a Scan run again fills the stacked buffers of its last run when they are no longer
    # referenced (no page faults on fresh multi-MB buffers per training step), never one
    # that a caller still holds (directly or through a view)
    x = K.placeholder((4, 2, 3), dtype='float64')

    def step(x_t, states):
        y = states[0] * 0.5 + x_t
        return y, [y]
    _, outputs, _ = K.rnn(step, x, [K.zeros_like(x[:, 0])])
    f = compiled_with_fusion(monkeypatch, True, [x], [outputs])
    (scan,) = [op for op in plan_ops(f) if isinstance(op, Scan)]
    impl = f._plan.impl
    sequences = np.ones((2, 4, 3))
    first = scan.forward(impl, sequences, np.zeros((4, 3)))
    first_stacked = first[0]
    addresses = {first_stacked.__array_interface__['data'][0]}
    kept = first_stacked.copy()
    view = first_stacked[1]
    del first, first_stacked
    second = scan.forward(impl, sequences * 3, np.zeros((4, 3)))
    np.testing.assert_array_equal(view, kept[1])            # the view's buffer was not refilled
    assert not np.shares_memory(second[0], view)
    addresses.add(second[0].__array_interface__['data'][0])
    del second, view
    third = scan.forward(impl, sequences * 3, np.zeros((4, 3)))
    # neither held any more: one of the two reused (prepared.StepBuffers keeps two per result)
    assert third[0].__array_interface__['data'][0] in addresses
    np.testing.assert_array_equal(third[0], [[[3.0] * 3] * 4, [[4.5] * 3] * 4])


def test_weight_gradients_over_an_empty_sequence_are_zeros():
    # the time-summed weight gradients are products of factors stacked over no steps: zeros
    x = K.placeholder((2, None, 2), dtype='float64')
    h0 = K.placeholder((2, UNITS), dtype='float64')
    _, w, u, b = [K.placeholder(a.shape, dtype='float64') for a in _arrays(np.float64)]
    _, _, states = K.rnn(_lstm_like(w, u, b), x, [h0, h0])
    loss = K.sum(states[0] * states[0])
    f = K.function([x, w, u, b, h0], K.gradients(loss, [w, u, b, h0]))
    _, ws, us, bs = _arrays(np.float64)
    h0s = np.ones((2, UNITS))
    g_w, g_u, g_b, g_h0 = f([np.zeros((2, 0, 2)), ws, us, bs, h0s])
    for g, like in ((g_w, ws), (g_u, us), (g_b, bs)):
        np.testing.assert_array_equal(g, np.zeros_like(like))
    np.testing.assert_array_equal(g_h0, 2 * h0s)


def _fused_member_names(scan):
    (plan,) = scan._plans.values()
    return [getattr(op, 'name', '') for forward, _, _, _ in plan.steps
            for op, _ in getattr(forward.__self__, 'members', ())]


def test_activations_are_kept_on_the_numpy_device_and_recomputed_for_kernels(monkeypatch):
    # on the NumPy device the backward step reads the forward's sigmoids and tanhs stacked
    # (several ufunc calls each); for kernel devices they are recomputed in the backward cell
    # kernel (no extra forward kernel outputs): both give the same gradients
    # (the elementwise family's RECOMPUTES_STEP_ACTIVATIONS says which: the twin's is set to
    # the launchers' True for the second case)
    from gpuk import device
    assert device.kind() == 'cpu'
    twin = device.impl().elementwise
    assert not twin.RECOMPUTES_STEP_ACTIVATIONS
    arrays = _arrays(np.float32)
    results = {}
    for policy in ('kept', 'recomputed'):
        if policy == 'recomputed':
            monkeypatch.setattr(twin, 'RECOMPUTES_STEP_ACTIVATIONS', True)
        x, w, u, b = [K.placeholder(a.shape, dtype='float32') for a in arrays]
        loss = _loss(x, w, u, b)
        f = compiled_with_fusion(monkeypatch, True, [x, w, u, b], [loss] + K.gradients(loss, [w, u, b]))
        results[policy] = f(list(arrays))
        backward = [op for op in plan_ops(f) if isinstance(op, Scan)][1]
        recomputed = {'sigmoid', 'tanh'} & set(_fused_member_names(backward))
        assert recomputed == (set() if policy == 'kept' else {'sigmoid', 'tanh'})
    for kept, recomputed in zip(results['kept'], results['recomputed']):
        np.testing.assert_array_equal(kept, recomputed)   # the same ufuncs on the same values


def test_batch_one_inputs_broadcast_against_batch_n_states_have_right_gradients():
    # batch dims known only at run time: a batch-1 sequence broadcasts against batch-4 initial
    # states inside the step (x_t W + h U), so W's time-summed gradient must sum the step's
    # gradient over the broadcast rows (it used to multiply 1-row inputs by 4-row gradients)
    rng = np.random.default_rng(7)
    x = K.placeholder((None, 5, 3), dtype='float64')
    h0 = K.placeholder((None, UNITS), dtype='float64')
    w, u, b = (K.placeholder(s, dtype='float64') for s in ((3, UNITS), (UNITS, UNITS), (UNITS,)))

    def step(x_t, states):
        h = K.tanh(K.bias_add(K.dot(x_t, w) + K.dot(states[0], u), b))
        return h, [h]
    last, _, _ = K.rnn(step, x, [h0])
    weights = K.constant(rng.standard_normal((4, UNITS)), dtype='float64')
    loss = K.sum(last * weights)
    tensors = [x, h0, w, u, b]
    arrays = [rng.standard_normal((1, 5, 3)), rng.standard_normal((4, UNITS)),
              rng.standard_normal((3, UNITS)) * 0.5, rng.standard_normal((UNITS, UNITS)) * 0.5,
              rng.standard_normal((UNITS,)) * 0.1]
    grads = K.function(tensors, K.gradients(loss, tensors))(arrays)
    evaluate = K.function(tensors, [loss])
    for array, grad in zip(arrays, grads):
        assert grad.shape == array.shape
        np.testing.assert_allclose(grad, numeric_gradient(lambda: evaluate(arrays)[0], array),
                                   rtol=1e-6, atol=1e-8)


def test_the_gradient_loop_stacks_one_gate_gradient_for_all_weight_factors(monkeypatch):
    # with run-time batch dims the weight factors x_t^T dz, h^T dz and colsum(dz) are three
    # tensors of the step graph; at equal run-time shapes they are one value, stacked once
    arrays = _arrays(np.float32)
    x = K.placeholder((None,) + arrays[0].shape[1:], dtype='float32')
    w, u, b = [K.placeholder(a.shape, dtype='float32') for a in arrays[1:]]
    loss = _loss(x, w, u, b)
    f = K.function([x, w, u, b], K.gradients(loss, [w, u, b]))
    stacked_gate_gradients = []
    forward = Scan.forward

    def recording_forward(scan, impl, *inputs):
        results = forward(scan, impl, *inputs)
        if scan.reverse:
            stacked_gate_gradients.extend(r for r in results[:len(scan.step_outputs)]
                                          if r.shape == (arrays[0].shape[1], 2, 4 * UNITS))
        return results
    monkeypatch.setattr(Scan, 'forward', recording_forward)
    f(list(arrays))
    assert len(stacked_gate_gradients) == 3   # the factors of w, u and b
    assert len({id(r) for r in stacked_gate_gradients}) == 1


def test_last_output_of_a_step_returning_its_state_stacks_no_outputs(monkeypatch):
    # Keras's cells return (h, [h, c]): K.rnn's last output is h's final state, so a model
    # reading only the last output (no return_sequences) makes the loop stack no outputs
    arrays = _arrays(np.float64)
    x, w, u, b = [K.placeholder(a.shape, dtype='float64') for a in arrays]
    zeros = K.zeros_like(x[:, 0, :1]) * K.zeros((1, UNITS), dtype='float64')
    last, outputs, _ = K.rnn(_lstm_like(w, u, b), x, [zeros, zeros])
    every = K.function([x, w, u, b], [last, outputs])(list(arrays))
    np.testing.assert_array_equal(every[0], every[1][:, -1])
    f = compiled_with_fusion(monkeypatch, True, [x, w, u, b], [last])
    np.testing.assert_array_equal(f(list(arrays))[0], every[0])
    (scan,) = [op for op in plan_ops(f) if isinstance(op, Scan)]
    assert scan.step_outputs == []


def test_a_broadcasts_like_computed_for_nothing_else_leaves_the_plan():
    # SumToShapeOf(g, like) between equal shapes is dropped; like (a product read for its
    # shape alone, as an LSTM gradient's gate products) goes with it, its inputs stay
    from gpuk.fusion_gradients import drop_identity_broadcasts
    from gpuk.ops.elementwise import Binary, SumToShapeOf
    steps = [(Binary('multiply'), [0, 1], [3]),      # like: read only by the broadcast
             (Binary('multiply'), [0, 2], [4]),      # g
             (SumToShapeOf(), [4, 3], [5]),
             (Binary('add'), [5, 1], [6])]
    kept = drop_identity_broadcasts(steps, {0, 1, 2, 6}, {s: (2, 3) for s in range(7)})
    assert [(op.name, ins, outs) for op, ins, outs in kept] == [('multiply', [0, 2], [4]), ('add', [4, 1], [6])]
    # a like read elsewhere too, or protected, stays
    kept = drop_identity_broadcasts(steps, {0, 1, 2, 3, 6}, {s: (2, 3) for s in range(7)})
    assert [outs for _, _, outs in kept] == [[3], [4], [6]]


def test_a_scan_copies_strided_sequences_but_never_a_broadcast_stand_in(on_device):
    """On the kernel runtimes a sequence whose per-step slices are strided is copied once per
    loop (Scan: _steps_contiguous); a broadcast sequence (the zero-stride stand-in of a value
    read for its shape alone, Scan._stacked_like) is passed as it is: a copy would make a whole
    sequence of memory out of none. The NumPy device copies nothing. The copy goes into the
    step's reused buffer (the Scan's _Stacks), written again only once nothing holds it."""
    from gpuk import device
    from gpuk.ops.scan import _Stacks, _steps_contiguous
    impl = device.impl()
    xp = impl.xp
    stacks = _Stacks(xp.empty)
    stand_in = xp.broadcast_to(xp.zeros((), np.float32), (5, 2, 3))
    assert _steps_contiguous(impl, stacks, 0, stand_in) is stand_in
    time_major = xp.transpose(xp.asarray(np.arange(30, dtype=np.float32).reshape(2, 5, 3)), (1, 0, 2))
    sliced = _steps_contiguous(impl, stacks, 0, time_major)
    assert (sliced is time_major) == (impl.kind == 'cpu')
    assert sliced[0].flags.c_contiguous or impl.kind == 'cpu'
    np.testing.assert_array_equal(device.to_host(sliced), device.to_host(time_major))
    if impl.kind != 'cpu':
        other = _steps_contiguous(impl, stacks, 0, time_major + 1)   # the first is held: another buffer
        assert other is not sliced
        np.testing.assert_array_equal(device.to_host(sliced), device.to_host(time_major))
        first = id(sliced)
        del sliced, other
        assert id(_steps_contiguous(impl, stacks, 0, time_major)) == first   # released: reused
