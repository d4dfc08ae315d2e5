"""CTC K functions: loss against brute-force enumeration, gradients against finite
differences, impossible alignments, decoders against the NumPy twin, hand cases and Keras
2.3.1's NumPy backend, label masking, argument errors, and the Theano-backend helpers."""
import itertools
import math

import numpy as np
import pytest

from gpuk import backend as K, device
from gpuk.cpu_fallback import ctc as ctc_twin
from tests.gradcheck import check_gradients
from tests.keras_reference import numpy_backend

# Every test here runs on each implementation (tests/conftest.py: on_device), the CUDA kernels included.
pytestmark = pytest.mark.usefixtures('on_device')

A = 3  # classes; the blank is the last


def _log_softmax(x):
    x = np.asarray(x, np.float64)
    m = x.max(-1, keepdims=True)
    return x - m - np.log(np.exp(x - m).sum(-1, keepdims=True))


def _collapse(path):
    out, previous = [], None
    for c in path:
        if c != previous and c != A - 1:
            out.append(c)
        previous = c
    return tuple(out)


def _brute_loss(log_probs, label):
    """-log of the summed probability of every path collapsing to ``label``."""
    total = 0.0
    for path in itertools.product(range(A), repeat=log_probs.shape[0]):
        if _collapse(path) == tuple(label):
            total += math.exp(sum(log_probs[t, c] for t, c in enumerate(path)))
    return -math.log(total) if total > 0 else math.inf


# (input length, label) per sample, T = 4
BATCH = [(4, [0, 1]), (4, [1, 1]), (3, []), (2, [0, 1]), (4, [0, 0, 1]), (1, [1, 0])]


def _batch(rng):
    logits = rng.standard_normal((len(BATCH), 4, A))
    labels = np.full((len(BATCH), 3), 9.0)  # padding past the lengths is ignored
    for i, (_, label) in enumerate(BATCH):
        labels[i, :len(label)] = label
    input_lengths = np.array([[n] for n, _ in BATCH])
    label_lengths = np.array([[len(label)] for _, label in BATCH])
    return logits, labels, input_lengths, label_lengths


@pytest.mark.parametrize('dtype', ['float16', 'float32', 'float64'])
def test_ctc_batch_cost_matches_brute_force(on_device, rng, dtype):
    logits, labels, input_lengths, label_lengths = _batch(rng)
    logits = logits.astype(dtype)
    x = K.placeholder(logits.shape, dtype=dtype)
    probs = K.placeholder(logits.shape, dtype=dtype)
    y, il, ll = K.placeholder((None, 3)), K.placeholder((None, 1), dtype='int32'), K.placeholder((None, 1))
    from_softmax = K.ctc_batch_cost(y, K.softmax(x), il, ll)
    from_probs = K.ctc_batch_cost(y, probs, il, ll)
    assert K.int_shape(from_softmax) == (len(BATCH), 1)
    assert from_softmax.node.inputs[0].node.inputs[0] is x  # the softmax's logits are used
    softmax = np.exp(_log_softmax(logits)).astype(dtype)
    a, b = K.function([x, probs, y, il, ll], [from_softmax, from_probs])(
        [logits, softmax, labels, input_lengths, label_lengths])
    assert a.dtype == dtype and a.shape == (len(BATCH), 1)
    tol = dict(rtol=2e-2, atol=2e-2) if dtype == 'float16' else dict(rtol=1e-5, atol=1e-6)
    for i, (n, label) in enumerate(BATCH):
        expected = _brute_loss(_log_softmax(logits[i, :n].astype(np.float64)), label)
        np.testing.assert_allclose(a[i, 0], expected, **tol)
        # TensorFlow's path for probabilities: log(p + epsilon), renormalized
        eps_logits = np.log(softmax[i, :n].astype(np.float64) + 1e-7)
        np.testing.assert_allclose(b[i, 0], _brute_loss(_log_softmax(eps_logits), label), **tol)


def test_ctc_gradients_match_finite_differences(rng):
    logits, labels, input_lengths, label_lengths = _batch(rng)
    possible = [0, 1, 2, 3, 4]  # sample 5 is impossible (inf loss)
    consts = [K.constant(a[possible]) for a in (labels, input_lengths, label_lengths)]
    check_gradients(lambda x: K.ctc_batch_cost(consts[0], K.softmax(x), consts[1], consts[2]),
                    logits[possible], rtol=1e-5, atol=1e-8)
    probs = np.exp(_log_softmax(logits[:2]))
    consts2 = [K.constant(a[:2]) for a in (labels, input_lengths, label_lengths)]
    check_gradients(lambda p: K.ctc_batch_cost(consts2[0], p, consts2[1], consts2[2]), probs,
                    rtol=1e-4, atol=1e-7)


def test_impossible_alignment_is_inf_with_zero_gradient(on_device, rng):
    logits = rng.standard_normal((2, 3, A)).astype(np.float32)
    x = K.placeholder(logits.shape)
    loss = K.ctc_batch_cost(K.constant([[1, 1], [0, 1]]), K.softmax(x), K.constant([[2], [1]]),
                            K.constant([[2], [2]]))
    value, grad = K.function([x], [loss, K.gradients(K.sum(loss), [x])[0]])([logits])
    assert np.all(np.isinf(value)) and np.all(value > 0)
    np.testing.assert_array_equal(grad, 0)


@pytest.mark.usefixtures('deferred_checks')
def test_ctc_errors(on_device):
    y_pred = K.placeholder((2, 4, A))
    good = dict(y_true=K.constant([[0, 1], [1, 0]]), y_pred=y_pred,
                input_length=K.constant([[4], [3]]), label_length=K.constant([[2], [1]]))
    cases = [
        (dict(y_true=K.constant([[0, -1], [1, 0]])), r'y_true must lie in \[0, 2\)'),  # (>= 2, the blank, ends a label)
        (dict(input_length=K.constant([[5], [3]])), 'input_length must be at most 4'),
        (dict(label_length=K.constant([[-1], [1]])), 'label_length must not be negative'),
        (dict(label_length=K.constant([[3], [1]])), 'label_length must be at most 2'),
        (dict(input_length=K.constant([[4], [3], [3]])), 'batch sizes differ'),
        (dict(y_true=K.constant([[0.5, 1], [1, 0]])), 'y_true must hold integers'),
        # a class after the blank within label_length: TensorFlow refuses it (labels using every
        # class of y_pred, the last one colliding with the blank); a blank ends a label
        (dict(y_true=K.constant([[2, 1], [1, 0]])), r'y_true holds class 1 after the blank 2 .* in sample 0 '
                                                     r'at position 1 \(labels \[2, 1\]\)'),
        (dict(y_pred=K.placeholder((2, A))), 'y_pred must have rank 3'),
    ]
    for change, message in cases:
        with pytest.raises(ValueError, match='ctc_batch_cost: ' + message):
            K.ctc_batch_cost(**dict(good, **change))
    # known only at run time: checked before any computation
    y, il, ll = K.placeholder((2, 2)), K.placeholder((2, 1)), K.placeholder((2, 1))
    f = K.function([y_pred, y, il, ll], [K.ctc_batch_cost(y, y_pred, il, ll)])
    probs = np.full((2, 4, A), 1 / A, dtype=np.float32)
    runs = [([[0, 1], [1, 0]], [[4], [3]], [[2], [3]], 'label_length must be at most 2'),
            ([[0, -5], [1, 0]], [[4], [3]], [[2], [1]], r'y_true must lie in \[0, 2\)'),
            ([[0, 1], [1, 0]], [[4], [-3]], [[2], [1]], 'input_length must not be negative'),
            ([[0, 1.5], [1, 0]], [[4], [3]], [[2], [1]], 'y_true must hold integers'),
            ([[0, 1], [2, 0]], [[4], [3]], [[2], [2]], 'y_true holds class 0 after the blank 2 .* sample 1')]
    for labels, inputs, lengths, message in runs:
        with pytest.raises(ValueError, match='ctc_batch_cost: ' + message):
            f([probs, np.array(labels), np.array(inputs), np.array(lengths)])
    if on_device != 'cpu':   # the loss ops queue one check of the values each, not theirs and the launcher's
        from gpuk import device
        from gpuk.kernels.runtime import deferred
        from gpuk.ops import ctc as ctc_ops
        impl = device.impl()
        xp = impl.xp
        logits = xp.asarray(np.zeros((2, 4, A), np.float32))
        labels, inputs, lengths = xp.asarray([[0, 1], [1, 0]]), xp.asarray([[4], [3]]), xp.asarray([[2], [3]])
        deferred.discard()
        loss, log_alpha, frame_lse = ctc_ops.CtcLoss().forward(impl, logits, labels, inputs, lengths)
        assert deferred.pending_count() == 1
        ctc_ops.CtcLossGrad().forward(impl, logits, labels, inputs, lengths, log_alpha, frame_lse, loss,
                                      xp.ones_like(loss))
        assert deferred.pending_count() == 2
        with pytest.raises(ValueError, match='ctc_batch_cost: label_length must be at most 2'):
            deferred.raise_pending()


def test_bad_label_in_a_ctc_training_step_changes_no_variable(on_device):
    """Labels and lengths are checked on the device: the step raises the eager check's message
    (ctc_batch_cost, y_true) and applies no update; a good step reads the flags once."""
    from gpuk.kernels import runtime
    w = K.variable(np.ones((3, A), np.float32))
    x, y = K.placeholder((2, 4, 3)), K.placeholder((2, 2))
    lengths, label_lengths = K.constant([[4], [3]]), K.constant([[2], [1]])
    loss = K.mean(K.ctc_batch_cost(y, K.softmax(K.dot(x, w)), lengths, label_lengths))
    step = K.function([x, y], [loss], updates=[K.update_sub(w, 0.1 * K.gradients(loss, [w])[0])])
    inputs = np.random.default_rng(0).standard_normal((2, 4, 3)).astype(np.float32)
    with pytest.raises(ValueError, match=r'ctc_batch_cost: y_true must lie in \[0, 2\)'):
        step([inputs, np.array([[0, -1], [1, 0]])])   # (labels >= the blank end a sequence, as in TF)
    np.testing.assert_array_equal(K.get_value(w), np.ones((3, A), np.float32))
    rt = runtime.get_runtime('emulate')
    before = rt.host_syncs = getattr(rt, 'host_syncs', 0)
    step([inputs, np.array([[0, 1], [1, 0]])])
    if on_device == 'emulate':
        assert rt.host_syncs - before == 1   # the pending flags, read once per call
    assert not np.array_equal(K.get_value(w), np.ones((3, A), np.float32))


def test_a_ctc_training_step_checks_its_values_once(on_device, monkeypatch):
    """The forward's value check (one ctc_check_inputs launch on the kernel runtimes, the twin on
    'cpu') serves the gradient step of the same run too: one check per training step."""
    family = device.impl().ctc
    checked = family.ctc_check_loss_values
    calls = []
    monkeypatch.setattr(family, 'ctc_check_loss_values', lambda *args: calls.append(args) or checked(*args))
    w = K.variable(np.ones((3, A), np.float32))
    x, y = K.placeholder((2, 4, 3)), K.placeholder((2, 2))
    loss = K.mean(K.ctc_batch_cost(y, K.softmax(K.dot(x, w)), K.constant([[4], [3]]), K.constant([[2], [1]])))
    step = K.function([x, y], [loss], updates=[K.update_sub(w, 0.1 * K.gradients(loss, [w])[0])])
    inputs = np.random.default_rng(0).standard_normal((2, 4, 3)).astype(np.float32)
    for _ in range(3):
        step([inputs, np.array([[0, 1], [1, 0]], np.float32)])
    assert len(calls) == 3


# --- decoding ------------------------------------------------------------------------------------

def _frames(rows):
    """Per-frame probabilities from rows of class weights."""
    p = np.asarray(rows, np.float64)
    return (p / p.sum(-1, keepdims=True)).astype(np.float32)


def test_greedy_decode_hand_case_and_keras(on_device):
    # argmax paths: [0, 0, 2, 0, 1] -> [0, 0, 1]; [1, 1, 1, 2, 2] cut at length 3 -> [1]
    y_pred = np.stack([_frames([[5, 1, 1], [5, 1, 1], [1, 1, 5], [5, 1, 1], [1, 5, 1]]),
                       _frames([[1, 5, 1], [1, 5, 1], [1, 5, 1], [1, 1, 5], [1, 1, 5]])])
    lengths = np.array([5, 3])
    yp, il = K.placeholder((2, 5, A)), K.placeholder((2,), dtype='int32')
    decoded, log_prob = K.ctc_decode(yp, il)
    assert len(decoded) == 1 and K.int_shape(log_prob) == (2, 1)
    paths, logp = K.function([yp, il], decoded + [log_prob])([y_pred, lengths])
    np.testing.assert_array_equal(paths, [[0, 0, 1], [1, -1, -1]])
    keras_paths, keras_logp = numpy_backend().ctc_decode(y_pred.astype(np.float64), lengths)
    np.testing.assert_array_equal(paths, keras_paths)
    np.testing.assert_allclose(logp, keras_logp, rtol=1e-5)
    blanks, = K.function([yp, il], K.ctc_decode(yp, il)[0])([np.tile(_frames([[1, 1, 5]]), (2, 5, 1)), lengths])
    assert blanks.shape == (2, 0)


def test_beam_decode_against_twin_and_hand_case(on_device, rng):
    # best path is blank-blank (0.36) but label [0] has 0.6 * 0.4 * 2 + 0.4 * 0.4 = 0.64
    y_pred = np.array([[[0.4, 0.0, 0.6], [0.4, 0.0, 0.6]]], dtype=np.float32)
    yp, il = K.placeholder((1, 2, A)), K.placeholder((1,))
    greedy, _ = K.ctc_decode(yp, il)
    beam, beam_logp = K.ctc_decode(yp, il, greedy=False, beam_width=4, top_paths=2)
    values = K.function([yp, il], greedy + beam + [beam_logp])([y_pred, np.array([2])])
    assert values[0].shape == (1, 0)
    np.testing.assert_array_equal(values[1], [[0]])
    assert values[2].shape == (1, 0)  # second best: the empty label (0.36)
    np.testing.assert_allclose(np.exp(values[3]), [[0.64, 0.36]], rtol=1e-4)
    # random inputs: same as the twin on log(y_pred + epsilon)
    probs = np.exp(_log_softmax(rng.standard_normal((3, 6, A)) * 2)).astype(np.float32)
    lengths = np.array([6, 4, 1])
    yp, il = K.placeholder((3, 6, A)), K.placeholder((3,), dtype='int64')
    paths, logp = K.ctc_decode(yp, il, greedy=False, beam_width=5, top_paths=3, merge_repeated=True)
    got = K.function([yp, il], paths + [logp])([probs, lengths])
    want_paths, want_logp = ctc_twin.ctc_beam_search_decode(np.log(probs + 1e-7), lengths, 5, 3,
                                                            merge_repeated=True)
    for g, w in zip(got[:3], want_paths):
        width = int(max((w >= 0).sum(1).max(), 0))
        np.testing.assert_array_equal(g, w[:, :width])
    np.testing.assert_allclose(got[3], want_logp, rtol=1e-5)
    with pytest.raises(ValueError, match=r'ctc_decode: top_paths \(3\) must not exceed beam_width \(2\)'):
        K.ctc_decode(yp, il, greedy=False, beam_width=2, top_paths=3)
    with pytest.raises(ValueError, match='ctc_decode: input_length must be at most 6'):
        K.function([yp], K.ctc_decode(yp, K.constant([7, 1, 1]))[0])


def test_beam_search_wider_than_its_prefixes_or_its_memory(on_device):
    """A beam wider than the prefixes the frames can spell gives the results of one just wide
    enough; one whose scratch would not fit is refused before anything is allocated, naming
    ctc_decode and beam_width (was the OOM killer: the twin's scratch is O(T B W), CUDA's O(W^2))."""
    y_pred = np.array([[[0.4, 0.0, 0.6], [0.3, 0.2, 0.5]]], dtype=np.float32)   # 1 + 2 + 4 prefixes
    yp, il = K.placeholder((1, 2, A)), K.placeholder((1,))
    decoded = [K.function([yp, il], paths + [logp])([y_pred, np.array([2])])
               for paths, logp in (K.ctc_decode(yp, il, greedy=False, beam_width=width, top_paths=top)
                                   for width, top in ((10 ** 9, 9), (9, 9)))]
    for wide, narrow in zip(*decoded):
        np.testing.assert_array_equal(wide, narrow)
    # 5 prefixes can be spelled (a repeat needs a blank between): then empty paths of log-probability -inf
    assert np.isfinite(decoded[0][-1][0, :5]).all() and np.isneginf(decoded[0][-1][0, 5:]).all()
    v = K.variable(np.zeros(2))
    yp, il = K.placeholder((2, 40, A)), K.placeholder((2,))   # 2 ** 41 prefixes
    paths, logp = K.ctc_decode(yp, il, greedy=False, beam_width=10 ** 9)
    decode = K.function([yp, il], paths + [logp], updates=[K.update_add(v, 1)])
    with pytest.raises(MemoryError, match=r'^ctc_decode: out of (host|GPU) memory .*: ctc_beam_search_decode: '
                                          r'beam_width 1000000000 needs .* of (host|GPU) memory for its beam '
                                          r'search scratch .*use a smaller beam_width'):
        decode([np.full((2, 40, A), 1 / A, np.float32), np.array([40, 40])])
    np.testing.assert_array_equal(K.get_value(v), 0)


@pytest.mark.usefixtures('deferred_checks')
def test_decode_lengths_checked_on_device(on_device):
    """Run-time input lengths of both decoders are checked on the device (no host sync per
    op) with the eager check's messages; a good call reads the pending flags once."""
    from gpuk.kernels import runtime
    probs = np.full((2, 3, A), 1 / A, dtype=np.float32)
    yp, il = K.placeholder((2, 3, A)), K.placeholder((2,))
    greedy = K.function([yp, il], K.ctc_decode(yp, il)[0])
    beam_paths, beam_logp = K.ctc_decode(yp, il, greedy=False, beam_width=3, top_paths=2)
    beam = K.function([yp, il], beam_paths + [beam_logp])
    for lengths, message in (([4, 1], 'input_length must be at most 3'),
                             ([2, -1], 'input_length must not be negative'),
                             ([1.5, 1], 'input_length must hold integers')):
        for decode in (greedy, beam):
            with pytest.raises(ValueError, match='ctc_decode: ' + message):
                decode([probs, np.array(lengths)])
    rt = runtime.get_runtime('emulate')
    for decode in (greedy, beam):
        before = rt.host_syncs = getattr(rt, 'host_syncs', 0)
        decode([probs, np.array([3, 2])])
        if on_device == 'emulate':
            assert rt.host_syncs - before == 1   # the pending flags, read once per call
    if on_device != 'cpu':   # the op itself does not read the lengths: it queues their check
        from gpuk import device
        from gpuk.kernels.runtime import deferred
        from gpuk.ops import ctc as ctc_ops
        impl = device.impl()
        for op in (ctc_ops.CtcGreedyDecode(), ctc_ops.CtcBeamDecode(3, 2, False)):
            deferred.discard()
            op.forward(impl, impl.xp.asarray(np.log(probs)), impl.xp.asarray([4, 1]))
            assert deferred.pending_count() == 1   # one check of the lengths, not the op's and the launcher's
            with pytest.raises(ValueError, match='ctc_decode: input_length must be at most 3'):
                deferred.raise_pending()


def test_label_dense_to_sparse(on_device):
    labels, lengths = K.placeholder((3, 4), dtype='int32'), K.placeholder((3,), dtype='int32')
    masked = K.ctc_label_dense_to_sparse(labels, lengths)
    assert masked.dtype == 'int32'
    out, = K.function([labels, lengths], [masked])([np.arange(12).reshape(3, 4), np.array([2, 0, 4])])
    np.testing.assert_array_equal(out, [[0, 1, -1, -1], [-1, -1, -1, -1], [8, 9, 10, 11]])
    with pytest.raises(ValueError, match='ctc_label_dense_to_sparse: label_lengths must be at most 4'):
        K.function([labels, lengths], [masked])([np.zeros((3, 4)), np.array([5, 0, 0])])


# --- the Theano backend's helpers --------------------------------------------------------------

def test_theano_helpers_match_twin(on_device, rng):
    y = K.placeholder((3,), dtype='int32')
    interleaved = K.ctc_interleave_blanks(y)
    skips = K.ctc_create_skip_idxs(interleaved)
    label = np.array([0, 0, 1])
    got_interleaved, got_skips = K.function([y], [interleaved, skips])([label])
    np.testing.assert_array_equal(got_interleaved, [-1, 0, -1, 0, -1, 1, -1])
    np.testing.assert_array_equal(got_skips, ctc_twin.ctc_create_skip_idxs(got_interleaved))
    predict = np.exp(_log_softmax(rng.standard_normal((4, A)))).astype(np.float32)
    p = K.placeholder((4, A))
    log_probs, mask = K.ctc_path_probs(p, interleaved)
    cost = K.ctc_cost(p, y)
    got = K.function([p, y], [log_probs, mask, cost])([predict, label])
    want_lp, want_mask = ctc_twin.ctc_path_probs(predict, ctc_twin.ctc_interleave_blanks(label))
    np.testing.assert_array_equal(got[1], want_mask)
    np.testing.assert_allclose(got[0], want_lp, rtol=1e-5)
    np.testing.assert_allclose(got[2], ctc_twin.ctc_cost(predict, label), rtol=1e-5)


def test_theano_ctc_cost_is_minus_log_t_times_probability(rng):
    predict = np.exp(_log_softmax(rng.standard_normal((4, A))))
    value, = K.function([], [K.ctc_cost(K.constant(predict, dtype='float64'), K.constant([0, 1]))])([])
    # the smoothing (alpha = 1e-4) moves the value by ~1e-4 only
    expected = _brute_loss(np.log(predict), [0, 1]) - math.log(4)
    np.testing.assert_allclose(value, expected, rtol=1e-3)


def test_theano_helper_gradients(rng):
    predict = np.exp(_log_softmax(rng.standard_normal((4, A))))
    label = K.constant([0, 0, 1], dtype='int32')
    check_gradients(lambda p: K.ctc_cost(p, label), predict, rtol=1e-5, atol=1e-8)
    interleaved = K.ctc_interleave_blanks(K.constant([1, 0], dtype='int32'))
    check_gradients(lambda p: K.ctc_path_probs(p, interleaved)[0], predict, rtol=1e-5, atol=1e-8)
    skips = K.ctc_create_skip_idxs(interleaved)
    curr, prev, zeros = rng.standard_normal(5), rng.standard_normal(5), rng.uniform(0.1, 1, 5)
    for active in (1, 2, 3):
        check_gradients(lambda z, c, q: K.ctc_update_log_p(skips, z, active, c, q)[1],
                        zeros, curr, prev, rtol=1e-5, atol=1e-8)
    z, c, q = (K.constant(a, dtype='float64') for a in (np.zeros(5), curr, prev))
    active_next, log_p_next = K.ctc_update_log_p(skips, z, 2, c, q)
    got = K.function([], [active_next, log_p_next])([])
    want = ctc_twin.ctc_update_log_p(np.array([1]), np.zeros(5), 2, curr, prev)
    assert int(got[0]) == want[0] == 4
    np.testing.assert_allclose(got[1], want[1])
