"""NumPy CTC twins against brute-force enumeration of alignments and labelings,
finite differences, hand-made decodes and the Theano-backend definitions."""
import itertools
import math

import numpy as np
import pytest

from gpuk.cpu_fallback import ctc

A = 3          # classes; Keras's blank is the last one


def _collapse(path, blank):
    out, previous = [], None
    for c in path:
        if c != previous and c != blank:
            out.append(c)
        previous = c
    return tuple(out)


def _log_softmax(x):
    x = np.asarray(x, dtype=np.float64)
    m = x.max(-1, keepdims=True)
    return x - m - np.log(np.exp(x - m).sum(-1, keepdims=True))


def _labeling_probs(emission, blank):
    """{labeling: summed probability of its alignments}, every path of every class
    enumerated; `emission` (T, A) holds per-frame (not necessarily normalized) weights."""
    steps, classes = emission.shape
    probs = {}
    for path in itertools.product(range(classes), repeat=steps):
        weight = math.prod(float(emission[t, c]) for t, c in enumerate(path))
        key = _collapse(path, blank)
        probs[key] = probs.get(key, 0.0) + weight
    return probs


def _brute_loss(logits, label, steps, blank):
    emission = np.exp(_log_softmax(logits[:steps]))
    p = _labeling_probs(emission, blank).get(tuple(label), 0.0)
    return -math.log(p) if p > 0 else math.inf


# (input length, label) per sample; T = 5 in all batches
BATCH = [
    (5, [0, 1]),
    (5, [1, 1]),        # repeat: needs a blank between
    (4, []),            # empty label
    (2, [0, 1]),        # label length == input length
    (2, [1, 1]),        # impossible: 2 labels + 1 repeat > 2 frames
    (3, [1, 0, 1]),     # label length == input length, no repeats
    (0, []),            # no frames, empty label: probability 1
    (5, [0, 0, 0]),     # three repeats need 5 frames exactly
]


def _batch(rng, dtype=np.float64, blank=A - 1):
    steps, width = 5, 3
    logits = rng.standard_normal((len(BATCH), steps, A)).astype(dtype)
    labels = np.full((len(BATCH), width), 7)             # padding is ignored
    labels_other_blank = labels.copy()
    for i, (_, label) in enumerate(BATCH):
        labels[i, :len(label)] = label
        # with blank = 0, relabel 0 -> 2 so no label is the blank
        labels_other_blank[i, :len(label)] = [2 if c == 0 else c for c in label]
    input_lengths = np.array([n for n, _ in BATCH])
    label_lengths = np.array([len(label) for _, label in BATCH])
    chosen = labels if blank == A - 1 else labels_other_blank
    return logits, chosen, input_lengths, label_lengths


@pytest.mark.parametrize('blank', [A - 1, 0])
def test_loss_matches_brute_force(rng, blank):
    logits, labels, input_lengths, label_lengths = _batch(rng, blank=blank)
    loss, log_alpha, frame_lse = ctc.ctc_loss_fwd(logits, labels, input_lengths, label_lengths, blank)
    assert frame_lse.shape == (len(BATCH), 5)
    assert log_alpha.shape == (len(BATCH), 5, 7)
    for i in range(len(BATCH)):
        ref = _brute_loss(logits[i], labels[i, :label_lengths[i]], input_lengths[i], blank)
        if math.isinf(ref):
            assert loss[i] == np.inf
        else:
            np.testing.assert_allclose(loss[i], ref, rtol=1e-12, err_msg='sample %d' % i)
    # the empty label: -sum log p(blank)
    blank_log = _log_softmax(logits[2, :4])[:, blank]
    np.testing.assert_allclose(loss[2], -blank_log.sum(), rtol=1e-12)
    assert loss[6] == 0


def test_default_blank_is_the_last_class(rng):
    logits, labels, input_lengths, label_lengths = _batch(rng)
    a = ctc.ctc_loss_fwd(logits, labels, input_lengths, label_lengths)[0]
    b = ctc.ctc_loss_fwd(logits, labels, input_lengths, label_lengths, A - 1)[0]
    np.testing.assert_array_equal(a, b)


@pytest.mark.parametrize('blank', [A - 1, 0])
def test_gradient_matches_finite_differences(rng, blank):
    logits, labels, input_lengths, label_lengths = _batch(rng, blank=blank)
    dloss = rng.uniform(0.5, 2, len(BATCH))
    loss, log_alpha, frame_lse = ctc.ctc_loss_fwd(logits, labels, input_lengths, label_lengths, blank)
    grad = ctc.ctc_loss_bwd(logits, labels, input_lengths, label_lengths, log_alpha, frame_lse, loss,
                            dloss, blank)
    assert np.all(np.isfinite(grad))
    possible = np.isfinite(loss)

    def objective(x):
        values = ctc.ctc_loss_fwd(x, labels, input_lengths, label_lengths, blank)[0]
        return np.sum(np.where(possible, values, 0) * dloss)

    numeric = np.zeros_like(logits)
    eps = 1e-6
    for k in np.ndindex(*logits.shape):
        up, down = logits.copy(), logits.copy()
        up[k] += eps
        down[k] -= eps
        numeric[k] = (objective(up) - objective(down)) / (2 * eps)
    np.testing.assert_allclose(grad, numeric, rtol=1e-6, atol=1e-8)
    # impossible label: inf loss, zero gradient; frames past input_length: zero
    assert loss[4] == np.inf and np.all(grad[4] == 0)
    assert np.all(grad[2, 4:] == 0) and np.all(grad[6] == 0)


@pytest.mark.parametrize('dtype', [np.float16, np.float32])
def test_low_precision_matches_float64(rng, dtype):
    logits, labels, input_lengths, label_lengths = _batch(rng)
    logits = logits.astype(dtype)
    ref_loss, ref_alpha, ref_lse = ctc.ctc_loss_fwd(logits.astype(np.float64), labels, input_lengths,
                                                    label_lengths)
    loss, log_alpha, frame_lse = ctc.ctc_loss_fwd(logits, labels, input_lengths, label_lengths)
    assert loss.dtype == dtype and log_alpha.dtype == np.float32
    tol = 1e-2 if dtype == np.float16 else 1e-5
    np.testing.assert_allclose(loss.astype(np.float64), ref_loss, rtol=tol)
    dloss = np.ones(len(BATCH), dtype)
    ref_grad = ctc.ctc_loss_bwd(logits.astype(np.float64), labels, input_lengths, label_lengths,
                                ref_alpha, ref_lse, ref_loss, dloss.astype(np.float64))
    grad = ctc.ctc_loss_bwd(logits, labels, input_lengths, label_lengths, log_alpha, frame_lse, loss, dloss)
    assert grad.dtype == dtype
    np.testing.assert_allclose(grad.astype(np.float64), ref_grad, rtol=tol, atol=tol)


def test_extreme_logits_stay_finite():
    steps = 4
    logits = np.zeros((3, steps, A))
    logits[0] = [[1e4, -1e4, 0], [-1e4, 1e4, 0], [0, 0, 1e4], [1e4, 0, -1e4]]
    logits[1, :, 1] = -np.inf                      # a class never used by the label
    logits[2] = [[1e4, -1e4, 0], [-1e4, 1e4, 0], [0, 0, 1e4], [1e4, 0, -1e4]]
    labels = np.array([[0, 1, 0], [0, 0, 0], [1, 1, 1]])
    input_lengths = np.array([4, 4, 4])
    label_lengths = np.array([3, 1, 0])
    loss, log_alpha, frame_lse = ctc.ctc_loss_fwd(logits, labels, input_lengths, label_lengths)
    # sample 0 follows the peaks 0,1,blank,0: a loss of ~0
    np.testing.assert_allclose(loss[:2], [0, _brute_loss(logits[1], [0], 4, A - 1)], atol=1e-9)
    # sample 2 (empty label) pays -log p(blank) = 1e4 + 1e4 + 0 + 2e4, large but finite
    np.testing.assert_allclose(loss[2], 4e4, rtol=1e-9)
    grad = ctc.ctc_loss_bwd(logits, labels, input_lengths, label_lengths, log_alpha, frame_lse, loss,
                            np.ones(3))
    assert np.all(np.isfinite(grad))
    assert np.all(grad[1, :, 1] == 0)


@pytest.mark.parametrize('change,message', [
    (dict(labels=np.array([[0, 3], [0, 0]])), r'ctc_loss_fwd: labels must lie in \[0, 3\)'),
    (dict(labels=np.array([[0, 2], [0, 0]])), 'ctc_loss_fwd: labels .*blank index 2'),
    (dict(labels=np.array([[0, 0.5], [0, 0]])), 'ctc_loss_fwd: labels must hold integers'),
    (dict(labels=np.array([[0, 1]])), 'ctc_loss_fwd: labels must have the batch size'),
    (dict(input_lengths=np.array([4, -1])), 'ctc_loss_fwd: input_lengths must lie in'),
    (dict(input_lengths=np.array([5, 4])), r'ctc_loss_fwd: input_lengths must lie in \[0, 4\]'),
    (dict(input_lengths=np.array([4, 4, 4])), r'ctc_loss_fwd: input_lengths must have shape'),
    (dict(label_lengths=np.array([3, 1])), r'ctc_loss_fwd: label_lengths must lie in \[0, 2\]'),
    (dict(label_lengths=np.array([-1, 1])), 'ctc_loss_fwd: label_lengths must lie'),
    (dict(blank=3), 'ctc_loss_fwd: blank must be'),
])
def test_bad_inputs_name_function_and_argument(change, message):
    args = dict(logits=np.zeros((2, 4, A)), labels=np.array([[0, 1], [1, 9]]),
                input_lengths=np.array([4, 3]), label_lengths=np.array([2, 1]), blank=None)
    args.update(change)
    with pytest.raises(ValueError, match=message):
        ctc.ctc_loss_fwd(**args)


def test_float_labels_with_whole_values_are_accepted(rng):
    logits, labels, input_lengths, label_lengths = _batch(rng)
    a = ctc.ctc_loss_fwd(logits, labels, input_lengths, label_lengths)[0]
    b = ctc.ctc_loss_fwd(logits, labels.astype(np.float32), input_lengths.astype(np.float32),
                         label_lengths)[0]
    np.testing.assert_array_equal(a, b)


def test_bwd_checks_saved_shapes():
    logits = np.zeros((1, 3, A))
    args = (logits, np.array([[0]]), np.array([3]), np.array([1]))
    loss, log_alpha, frame_lse = ctc.ctc_loss_fwd(*args)
    with pytest.raises(ValueError, match='ctc_loss_bwd: log_alpha must have shape'):
        ctc.ctc_loss_bwd(*args, log_alpha[:, :2], frame_lse, loss, np.ones(1))
    with pytest.raises(ValueError, match=r'ctc_loss_bwd: frame_lse must have shape \(1, 3\)'):
        ctc.ctc_loss_bwd(*args, log_alpha, frame_lse[:, :2], loss, np.ones(1))
    with pytest.raises(ValueError, match='ctc_loss_bwd: dloss must have shape'):
        ctc.ctc_loss_bwd(*args, log_alpha, frame_lse, loss, np.ones(2))


# ---------------------------------------------------------------- greedy decoding

def _frames(best, classes=A):
    """log-probabilities whose per-frame argmax is `best`."""
    out = np.full((len(best), classes), math.log(0.1))
    out[np.arange(len(best)), best] = math.log(0.8)
    return out


def test_greedy_decode_hand_made_cases():
    blank = 3
    log_probs = np.stack([
        _frames([0, 0, 3, 0, 1, 1, 3], 4),      # repeat merged; blank separates 0 and 0
        _frames([3, 3, 2, 2, 2, 3, 3], 4),
        _frames([1, 2, 1, 2, 0, 0, 0], 4),      # truncated by input_length 4
        _frames([3, 3, 3, 3, 3, 3, 3], 4),      # all blank
    ])
    lengths = np.array([7, 7, 4, 7])
    decoded, neg_sum = ctc.ctc_greedy_decode(log_probs, lengths, blank)
    expected = np.array([[0, 0, 1, -1, -1, -1, -1],
                         [2, -1, -1, -1, -1, -1, -1],
                         [1, 2, 1, 2, -1, -1, -1],
                         [-1] * 7])
    np.testing.assert_array_equal(decoded, expected)
    assert decoded.dtype == np.int64
    np.testing.assert_allclose(neg_sum[:, 0], -math.log(0.8) * lengths)
    unmerged, _ = ctc.ctc_greedy_decode(log_probs, lengths, blank, merge_repeated=False)
    np.testing.assert_array_equal(unmerged[0], [0, 0, 0, 1, 1, -1, -1])
    np.testing.assert_array_equal(unmerged[1], [2, 2, 2, -1, -1, -1, -1])


def test_greedy_decode_default_blank_and_errors():
    log_probs = _frames([0, 2, 2, 1])[None]
    decoded, _ = ctc.ctc_greedy_decode(log_probs, np.array([4]))
    np.testing.assert_array_equal(decoded, [[0, 1, -1, -1]])
    with pytest.raises(ValueError, match='ctc_greedy_decode: input_lengths must lie'):
        ctc.ctc_greedy_decode(log_probs, np.array([5]))
    with pytest.raises(ValueError, match='ctc_greedy_decode: log_probs must have rank 3'):
        ctc.ctc_greedy_decode(log_probs[0], np.array([4]))


# ---------------------------------------------------------------- beam search

def test_beam_search_finds_the_most_probable_labelings(rng):
    steps = 4
    logits = rng.standard_normal((3, steps, A)) * 1.5
    input_lengths = np.array([4, 3, 4])
    # 1 + 2 + 4 + 8 + 16 = 31 prefixes exist over 2 labels and 4 frames: a beam of
    # 32 never prunes, so prefix search is exact
    paths, scores = ctc.ctc_beam_search_decode(logits, input_lengths, beam_width=32,
                                               top_paths=3, blank=A - 1)
    assert len(paths) == 3 and scores.shape == (3, 3)
    for i in range(3):
        probs = _labeling_probs(np.exp(_log_softmax(logits[i, :input_lengths[i]])), A - 1)
        ranked = sorted(probs.items(), key=lambda item: -item[1])[:3]
        for k, (labeling, p) in enumerate(ranked):
            got = paths[k][i]
            assert tuple(got[got >= 0]) == labeling
            assert np.all(got[len(labeling):] == -1) and got.shape == (steps,)
            np.testing.assert_allclose(scores[i, k], math.log(p), rtol=1e-10)


def test_beam_search_merge_repeated_collapses_output_only():
    # frames favour 1, blank, 1: the best labeling is (1, 1)
    log_probs = np.log(np.array([[[0.1, 0.8, 0.1], [0.05, 0.05, 0.9], [0.1, 0.8, 0.1]]]))
    paths, scores = ctc.ctc_beam_search_decode(log_probs, np.array([3]), 8, 1, 2)
    np.testing.assert_array_equal(paths[0], [[1, 1, -1]])
    merged, merged_scores = ctc.ctc_beam_search_decode(log_probs, np.array([3]), 8, 1, 2,
                                                       merge_repeated=True)
    np.testing.assert_array_equal(merged[0], [[1, -1, -1]])
    np.testing.assert_array_equal(scores, merged_scores)


def test_beam_search_narrow_beam_and_padding(rng):
    log_probs = np.log(np.array([[[0.6, 0.3, 0.1]], [[0.2, 0.2, 0.6]]]))
    paths, scores = ctc.ctc_beam_search_decode(log_probs, np.array([1, 0]), 3, 3, 2)
    # one frame: labelings (0), (1), () for sample 0; only () for an empty input
    np.testing.assert_array_equal([p[0, 0] for p in paths], [0, 1, -1])
    np.testing.assert_allclose(np.exp(scores[0]), [0.6, 0.3, 0.1])
    assert scores[1, 0] == 0 and np.all(scores[1, 1:] == -np.inf)
    assert all(np.all(p[1] == -1) for p in paths)
    # a beam of one keeps the single best prefix
    logits = rng.standard_normal((2, 5, A))
    paths, scores = ctc.ctc_beam_search_decode(logits, np.array([5, 5]), 1, 1)
    assert np.all(np.isfinite(scores))
    with pytest.raises(ValueError, match='ctc_beam_search_decode: top_paths'):
        ctc.ctc_beam_search_decode(logits, np.array([5, 5]), 2, 3)
    with pytest.raises(ValueError, match='ctc_beam_search_decode: beam_width'):
        ctc.ctc_beam_search_decode(logits, np.array([5, 5]), 0, 1)


# ---------------------------------------------------------------- Theano backend helpers

def test_interleave_and_skip_indices():
    np.testing.assert_array_equal(ctc.ctc_interleave_blanks(np.array([4, 4, 2])),
                                  [-1, 4, -1, 4, -1, 2, -1])
    np.testing.assert_array_equal(ctc.ctc_interleave_blanks(np.array([], np.int64)), [-1])
    # skips from 1 (4 -> 4: repeat, no) and 3 (4 -> 2: yes)
    np.testing.assert_array_equal(ctc.ctc_create_skip_idxs(np.array([-1, 4, -1, 4, -1, 2, -1])),
                                  [3])
    np.testing.assert_array_equal(ctc.ctc_create_skip_idxs(np.array([-1, 1, -1, 0, -1, 1, -1])),
                                  [1, 3])
    assert ctc.ctc_create_skip_idxs(np.array([-1])).size == 0


def test_update_log_p_first_step():
    zeros = np.zeros(5)
    log_curr = np.log(np.array([0.1, 0.2, 0.3, 0.4, 0.5]))
    active, log_next = ctc.ctc_update_log_p(np.array([1]), zeros, 1, log_curr, zeros)
    assert active == 2
    np.testing.assert_allclose(log_next, [log_curr[0], log_curr[1], 0, 0, 0])
    # second step: state 0 -> 0, 1; state 1 -> 1, 2 and the skip 1 -> 3
    active, log_next2 = ctc.ctc_update_log_p(np.array([1]), zeros, 2, log_curr, log_next)
    assert active == 4
    p0, p1 = 0.1, 0.2
    np.testing.assert_allclose(np.exp(log_next2[:4]),
                               np.array([p0, p0 + p1, p1, p1]) * np.exp(log_curr[:4]))


def test_path_probs_give_the_label_probability_at_every_frame(rng):
    predict = np.exp(_log_softmax(rng.standard_normal((4, A))))
    label = [0, 1]
    log_probs, mask = ctc.ctc_path_probs(predict, ctc.ctc_interleave_blanks(label), alpha=0.0)
    p = _labeling_probs(predict, A - 1)[tuple(label)]
    for t in range(4):
        np.testing.assert_allclose(np.exp(log_probs[t][mask[t]]).sum(), p, rtol=1e-10)


@pytest.mark.parametrize('label', [[0, 1], [1, 1], [0]])
def test_cost_is_minus_log_of_frames_times_smoothed_probability(rng, label):
    steps = 4
    predict = np.exp(_log_softmax(rng.standard_normal((steps, A))))
    smoothed = (1 - 1e-4) * predict + 1e-4 / (2 * len(label) + 1)
    p = _labeling_probs(smoothed, A - 1)[tuple(label)]
    np.testing.assert_allclose(ctc.ctc_cost(predict, np.array(label)),
                               -math.log(steps * p), rtol=1e-10)


def test_theano_helpers_check_arguments():
    with pytest.raises(ValueError, match='ctc_interleave_blanks: Y must have rank 1'):
        ctc.ctc_interleave_blanks(np.zeros((2, 2), np.int64))
    with pytest.raises(ValueError, match='ctc_path_probs: predict must have rank 2'):
        ctc.ctc_path_probs(np.ones(3), np.array([-1, 0, -1]))
    with pytest.raises(ValueError, match='ctc_update_log_p: active'):
        ctc.ctc_update_log_p(np.array([1]), np.zeros(3), 0, np.zeros(3), np.zeros(3))
