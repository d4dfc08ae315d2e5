"""CTC kernels (loss, gradient, greedy and beam-search decoding) against their NumPy twins;
the cuDNN path's pure-Python translation on the CPU and its GPU run marked gpu."""
import ml_dtypes
import numpy as np
import pytest

from gpuk.cpu_fallback import ctc as twin
from gpuk.kernels import ctc, runtime
from gpuk.kernels.runtime import deferred
from gpuk.kernels.cudnn import ctc as cudnn_ctc
from gpuk.kernels.testing import assert_close, assert_same_error, to_device, to_host

DTYPES = [np.float16, np.float32, np.float64]


def _batch(rng, dtype, blank_last=True):
    """Repeats, an empty label, label length = input length, an impossible alignment and
    variable lengths in one batch (A = 6, blank = 5 or 0)."""
    steps, classes = 9, 6
    x = (rng.standard_normal((5, steps, classes)) * 2).astype(dtype)
    labels = np.array([[1, 1, 2, 0], [3, 0, 0, 0], [1, 2, 3, 4], [2, 2, 2, 0], [4, 0, 1, 3]])
    if not blank_last:
        labels = labels + 1   # blank = 0
    label_lengths = np.array([3, 0, 4, 3, 4])
    input_lengths = np.array([9, 5, 4, 4, 7])   # sample 3 needs 5 frames for 2, 2, 2: impossible
    return x, labels, input_lengths, label_lengths


def _loss_and_grad(rt, x, labels, input_lengths, label_lengths, blank=None):
    loss, log_alpha, frame_lse = ctc.ctc_loss_fwd(
        *[to_device(rt, a) for a in (x, labels, input_lengths, label_lengths)], blank, runtime=rt)
    dloss = np.linspace(0.5, 1.5, x.shape[0]).astype(to_host(loss).dtype)
    grad = ctc.ctc_loss_bwd(*[to_device(rt, a) for a in (x, labels, input_lengths, label_lengths)], log_alpha,
                            frame_lse, loss, to_device(rt, dloss), blank, runtime=rt)
    return to_host(loss), to_host(log_alpha), dloss, to_host(grad)


@pytest.mark.parametrize('dtype', DTYPES)
@pytest.mark.parametrize('blank_last', [True, False])
def test_ctc_loss_and_grad_match_twin(kernel_runtime, dtype, blank_last):
    rng = np.random.default_rng(1)
    x, labels, input_lengths, label_lengths = _batch(rng, dtype, blank_last)
    blank = None if blank_last else 0
    loss, log_alpha, dloss, grad = _loss_and_grad(kernel_runtime, x, labels, input_lengths, label_lengths, blank)
    loss_t, log_alpha_t, _ = twin.ctc_loss_fwd(x, labels, input_lengths, label_lengths, blank)
    assert loss.dtype == loss_t.dtype and log_alpha.dtype == log_alpha_t.dtype
    loss_r, log_alpha_r, lse_r = twin.ctc_loss_fwd(x.astype(np.float64), labels, input_lengths, label_lengths,
                                                   blank)
    assert loss[3] == np.inf and loss[1] >= 0   # impossible alignment: inf, never NaN
    assert_close(loss, loss_r, dtype, 'ctc_loss_fwd loss')
    assert_close(log_alpha, log_alpha_r, dtype, 'ctc_loss_fwd log_alpha')
    # the twin's gradient from the same saved loss (float16 rounds it)
    grad_r = twin.ctc_loss_bwd(x.astype(np.float64), labels, input_lengths, label_lengths, log_alpha_r, lse_r,
                               loss.astype(np.float64), dloss.astype(np.float64), blank)
    assert grad.dtype == x.dtype
    assert_close(grad, grad_r, dtype, 'ctc_loss_bwd')
    assert np.all(grad[3] == 0) and np.all(grad[1, 5:] == 0)   # impossible; past the input length


def test_ctc_label_longer_than_the_block(kernel_runtime):
    """2 L + 1 = 601 states > 256 threads: the threads loop over positions."""
    rng = np.random.default_rng(2)
    length = 300
    labels = rng.integers(0, 4, (1, length))
    labels[0, 1::2] = (labels[0, ::2] + 1) % 4   # no repeats: 300 frames suffice
    x = rng.standard_normal((1, 305, 5)).astype(np.float64)
    lengths = (np.array([305]), np.array([length]))
    loss, log_alpha, dloss, grad = _loss_and_grad(kernel_runtime, x, labels, *lengths)
    loss_r, log_alpha_r, lse_r = twin.ctc_loss_fwd(x, labels, *lengths)
    assert_close(loss, loss_r, np.float64, 'loss')
    assert_close(log_alpha, log_alpha_r, np.float64, 'log_alpha')
    assert_close(grad, twin.ctc_loss_bwd(x, labels, *lengths, log_alpha_r, lse_r, loss_r, dloss), np.float64, 'grad')


@pytest.mark.parametrize('dtype', [np.float32, np.float64])
def test_ctc_labels_past_the_shared_memory_states(kernel_runtime, monkeypatch, dtype):
    """Extended labels longer than CTC_SHARED_STATES keep the previous step in global memory
    (log_alpha's previous row; a (N, 2, S) scratch for beta): the same results. A smaller
    limit here takes that path on the test batch (9 states); no staging budget takes the
    unstaged paths of ctc_emissions and ctc_grad (gathers from global memory)."""
    monkeypatch.setattr(ctc, 'CTC_SHARED_STATES', 7)
    monkeypatch.setattr(ctc, 'CTC_STAGE_BYTES', 0)
    rng = np.random.default_rng(4)
    x, labels, input_lengths, label_lengths = _batch(rng, dtype, True)
    loss, log_alpha, dloss, grad = _loss_and_grad(kernel_runtime, x, labels, input_lengths, label_lengths)
    loss_r, log_alpha_r, lse_r = twin.ctc_loss_fwd(x.astype(np.float64), labels, input_lengths, label_lengths)
    assert_close(loss, loss_r, dtype, 'loss')
    assert_close(log_alpha, log_alpha_r, dtype, 'log_alpha')
    grad_r = twin.ctc_loss_bwd(x.astype(np.float64), labels, input_lengths, label_lengths, log_alpha_r, lse_r,
                               loss.astype(np.float64), dloss.astype(np.float64))
    assert_close(grad, grad_r, dtype, 'grad')


def test_frame_lse_is_a_forward_output_the_backward_reads(kernel_runtime):
    """The forward's frame log-sum-exp matches the twin's, and the backward uses the one it is
    given (the twin's gradient for a shifted frame_lse, not the unshifted one) instead of
    recomputing it."""
    rng = np.random.default_rng(6)
    x, labels, input_lengths, label_lengths = _batch(rng, np.float64, True)
    rt = kernel_runtime
    args = [to_device(rt, a) for a in (x, labels, input_lengths, label_lengths)]
    loss, log_alpha, frame_lse = ctc.ctc_loss_fwd(*args, runtime=rt)
    _, log_alpha_t, lse_t = twin.ctc_loss_fwd(x, labels, input_lengths, label_lengths)
    assert frame_lse.shape == (5, 9)
    assert_close(to_host(frame_lse), lse_t, np.float64, 'frame_lse')
    dloss = np.ones(5)
    grad = to_host(ctc.ctc_loss_bwd(*args, log_alpha, frame_lse, loss, to_device(rt, dloss), runtime=rt))
    shifted = to_host(ctc.ctc_loss_bwd(*args, log_alpha, frame_lse + 0.5, loss, to_device(rt, dloss), runtime=rt))
    expected = twin.ctc_loss_bwd(x, labels, input_lengths, label_lengths, log_alpha_t, lse_t + 0.5, to_host(loss),
                                 dloss)
    assert_close(shifted, expected, np.float64, 'grad with a shifted frame_lse')
    assert np.abs(shifted - grad).max() > 0.1


def test_the_runners_step_buffers_hold_the_launchers_results_and_spare_a_held_one(kernel_runtime):
    """ctc_loss_fwd_runner / ctc_loss_bwd_runner's ``specialized`` variants (what a CtcLoss /
    CtcLossGrad plan step keeps) write into reused buffers: call after call they give the
    plain launchers' results, a result someone still holds (log_alpha, whose padded rows the
    backward reads in place, the gradient) is never written, and a released one is reused."""
    rt = kernel_runtime
    rng = np.random.default_rng(7)
    x, labels, input_lengths, label_lengths = _batch(rng, np.float32, True)
    ints = [to_device(rt, a.astype(np.int64)) for a in (labels, input_lengths, label_lengths)]
    batches = [to_device(rt, x), to_device(rt, (rng.standard_normal(x.shape) * 2).astype(np.float32))]
    dloss = to_device(rt, np.linspace(0.5, 1.5, x.shape[0]).astype(np.float32))
    by = lambda out: (out[1], out[2], out[0])   # noqa: E731  (loss, log_alpha, frame_lse) -> the backward's order
    fwd = ctc.ctc_loss_fwd_runner(batches[0], *ints, runtime=rt, values_checked=True)
    first = fwd(batches[0], *ints)
    bwd = ctc.ctc_loss_bwd_runner(batches[0], *ints, *by(first), dloss, runtime=rt, values_checked=True)
    fwd, bwd = fwd.specialized(None), bwd.specialized(None)

    def fresh(logits):   # the plain launchers: new outputs
        out = ctc.ctc_loss_fwd(logits, *ints, runtime=rt, values_checked=True)
        grad = ctc.ctc_loss_bwd(logits, *ints, *by(out), dloss, runtime=rt, values_checked=True)
        return [np.array(to_host(a)) for a in out + (grad,)]
    expected = [fresh(b) for b in batches]
    held = fwd(batches[0], *ints)
    held = held + (bwd(batches[0], *ints, *by(held), dloss),)
    held_copy = [np.array(to_host(a)) for a in held]   # copies (the emulator's to_host is the array)
    for step in range(3):   # the held results force other buffers; their values stay
        out = fwd(batches[1], *ints)
        got = [np.array(to_host(a)) for a in out] + [np.array(to_host(bwd(batches[1], *ints, *by(out), dloss)))]
        for g, e in zip(got, expected[1]):
            np.testing.assert_array_equal(g, e)
        del out
    for g, e, h in zip(held_copy, expected[0], held):
        np.testing.assert_array_equal(to_host(h), g)
        np.testing.assert_array_equal(g, e)
    # released: the next calls write the same buffers again (log_alpha's padded rows, found as the
    # backward finds them; ids of buffers the step keeps alive), while the buffers the loop's
    # steps took are held (prepared.StepBuffers tries those first: they were its last ones)
    rows, grad = id(ctc._padded_rows(rt, held[1], np.float32)), id(held[3])
    held_too = fwd(batches[1], *ints)
    held_too = held_too + (bwd(batches[1], *ints, *by(held_too), dloss),)
    del held, g, e, h
    out = fwd(batches[0], *ints)
    assert id(ctc._padded_rows(rt, out[1], np.float32)) == rows
    assert id(bwd(batches[0], *ints, *by(out), dloss)) == grad
    np.testing.assert_array_equal(to_host(out[1]), expected[0][1])


def test_ctc_empty_inputs(kernel_runtime):
    x = np.zeros((2, 0, 3), np.float32)
    loss, log_alpha, frame_lse = ctc.ctc_loss_fwd(to_device(kernel_runtime, x), np.zeros((2, 1)), np.array([0, 0]),
                                       np.array([0, 1]), runtime=kernel_runtime)
    np.testing.assert_array_equal(to_host(loss), [0.0, np.inf])
    assert log_alpha.shape == (2, 0, 3)


def _decode_input(rng, dtype, steps=11, classes=6, batch=4, quantize=False):
    x = rng.standard_normal((batch, steps, classes)) * 2
    if quantize:
        x = np.round(x)   # ties: the lowest class wins
    log_probs = (x - np.log(np.sum(np.exp(x), axis=2, keepdims=True))).astype(dtype)
    input_lengths = np.array([steps, steps - 3, 0, 1][:batch])
    return log_probs, input_lengths


@pytest.mark.parametrize('dtype', DTYPES)
@pytest.mark.parametrize('merge_repeated, blank, quantize', [(True, None, False), (False, None, True),
                                                            (True, 0, True)])
def test_greedy_decode_matches_twin(kernel_runtime, dtype, merge_repeated, blank, quantize):
    rng = np.random.default_rng(3)
    log_probs, input_lengths = _decode_input(rng, dtype, steps=300, quantize=quantize)
    decoded, neg_sum = ctc.ctc_greedy_decode(to_device(kernel_runtime, log_probs), input_lengths, blank,
                                             merge_repeated, runtime=kernel_runtime)
    decoded_t, neg_sum_t = twin.ctc_greedy_decode(log_probs, input_lengths, blank, merge_repeated)
    np.testing.assert_array_equal(to_host(decoded), decoded_t)
    assert to_host(neg_sum).dtype == neg_sum_t.dtype and neg_sum.shape == neg_sum_t.shape
    assert_close(neg_sum, twin.ctc_greedy_decode(log_probs.astype(np.float64), input_lengths, blank,
                                                 merge_repeated)[1], dtype, 'neg_sum')


@pytest.mark.parametrize('dtype', [np.float32, np.float64])
@pytest.mark.parametrize('beam_width, top_paths, blank, merge_repeated', [
    (1, 1, None, False), (4, 3, None, False), (16, 5, 0, True), (40, 2, None, False)])
def test_beam_search_matches_twin(kernel_runtime, dtype, beam_width, top_paths, blank, merge_repeated):
    rng = np.random.default_rng(beam_width)
    log_probs, input_lengths = _decode_input(rng, dtype, steps=10, classes=5)
    paths, scores = ctc.ctc_beam_search_decode(to_device(kernel_runtime, log_probs), input_lengths, beam_width,
                                               top_paths, blank, merge_repeated, runtime=kernel_runtime)
    paths_t, scores_t = twin.ctc_beam_search_decode(log_probs, input_lengths, beam_width, top_paths, blank,
                                                    merge_repeated)
    assert len(paths) == top_paths
    for got, expected in zip(paths, paths_t):
        np.testing.assert_array_equal(to_host(got), expected)
    scores = to_host(scores)
    assert scores.dtype == scores_t.dtype
    np.testing.assert_array_equal(np.isinf(scores), np.isinf(scores_t))
    finite = np.isfinite(scores_t)
    np.testing.assert_allclose(scores[finite], scores_t[finite], rtol=1e-5)


@pytest.mark.parametrize('dtype', [np.float32, np.float64])
@pytest.mark.parametrize('beam_width, top_paths', [(2, 2), (3, 1), (5, 3)])
def test_beam_search_ties_follow_the_total_order(kernel_runtime, dtype, beam_width, top_paths):
    """Frames of few distinct values (uniform frames included): extensions tie within a beam
    and across beams, at each beam's top-W cut and at the global threshold. The kernel keeps
    each beam's best W extensions first, then selects; the twin ranks all W A candidates:
    the same beams (total desc, prefix key asc), so the same paths and scores."""
    rng = np.random.default_rng(beam_width * 10 + top_paths)
    batch, steps, classes = 3, 7, 9
    x = rng.integers(0, 2, (batch, steps, classes)).astype(np.float64)
    x[1] = 0.0                      # uniform frames: every extension of a beam ties
    x[2, ::2] = x[2, 0]             # repeated frames
    log_probs = (x - np.log(np.exp(x).sum(-1, keepdims=True))).astype(dtype)
    input_lengths = np.array([steps, steps, steps - 2])
    paths, scores = ctc.ctc_beam_search_decode(to_device(kernel_runtime, log_probs), input_lengths, beam_width,
                                               top_paths, runtime=kernel_runtime)
    paths_t, scores_t = twin.ctc_beam_search_decode(log_probs, input_lengths, beam_width, top_paths)
    for got, expected in zip(paths, paths_t):
        np.testing.assert_array_equal(to_host(got), expected)
    np.testing.assert_allclose(to_host(scores), scores_t, rtol=1e-6)


def test_beam_search_frames_wider_than_the_shared_cache(kernel_runtime, monkeypatch):
    """Frames of more than BEAM_SHARED_CLASSES classes are read from global memory instead of
    the shared cache: the same beams (a smaller limit here takes that path)."""
    monkeypatch.setattr(ctc, 'BEAM_SHARED_CLASSES', 4)
    log_probs, input_lengths = _decode_input(np.random.default_rng(12), np.float32, steps=8, classes=7)
    paths, scores = ctc.ctc_beam_search_decode(to_device(kernel_runtime, log_probs), input_lengths, 3, 2,
                                               runtime=kernel_runtime)
    paths_t, scores_t = twin.ctc_beam_search_decode(log_probs, input_lengths, 3, 2)
    for got, expected in zip(paths, paths_t):
        np.testing.assert_array_equal(to_host(got), expected)
    np.testing.assert_allclose(to_host(scores), scores_t, rtol=1e-5)


def test_beam_search_float16_and_fewer_prefixes_than_paths(kernel_runtime):
    """Two classes and two frames: fewer distinct prefixes than top_paths gives -inf rows."""
    rng = np.random.default_rng(9)
    log_probs = rng.standard_normal((2, 2, 2)).astype(np.float16)
    paths, scores = ctc.ctc_beam_search_decode(to_device(kernel_runtime, log_probs), np.array([2, 1]), 8, 8,
                                               runtime=kernel_runtime)
    paths_t, scores_t = twin.ctc_beam_search_decode(log_probs, np.array([2, 1]), 8, 8)
    for got, expected in zip(paths, paths_t):
        np.testing.assert_array_equal(to_host(got), expected)
    np.testing.assert_allclose(to_host(scores).astype(np.float64), scores_t.astype(np.float64), rtol=2e-3)
    assert np.isinf(scores_t).any()


class _NoLaunch:
    """A runtime whose every load fails the test: errors must come before any launch."""
    kind = 'emulate'

    def __init__(self):
        import numpy
        self.xp = numpy

    def load(self, *args, **kwargs):
        raise AssertionError('a kernel was loaded for bad input')


def test_bad_shapes_and_dtypes_raise_before_any_launch(monkeypatch):
    monkeypatch.setattr(runtime, 'get_runtime', lambda kind: _NoLaunch())
    x = np.zeros((2, 5, 4), np.float32)
    labels = np.array([[0, 1], [2, 2]])
    ok_in, ok_lab = np.array([5, 5]), np.array([2, 2])
    loss_cases = [
        (x, labels[:1], ok_in, ok_lab),                        # batch sizes differ
        (x, labels, ok_in[:1], ok_lab),
        (x.astype(np.int32), labels, ok_in, ok_lab),
        (x[0], labels, ok_in, ok_lab),
    ]
    for case in loss_cases:
        assert_same_error(ctc.ctc_loss_fwd, twin.ctc_loss_fwd, case)
    log_alpha, loss = np.zeros((2, 5, 5), np.float32), np.zeros(2, np.float32)
    lse = np.zeros((2, 5), np.float32)
    for by_products in ((log_alpha[:, :4], lse, loss, loss), (log_alpha, lse[:, :4], loss, loss),
                        (log_alpha, lse, loss[:1], loss)):
        assert_same_error(ctc.ctc_loss_bwd, twin.ctc_loss_bwd, (x, labels, ok_in, ok_lab) + by_products)
    assert_same_error(ctc.ctc_greedy_decode, twin.ctc_greedy_decode, (x, ok_in, 4))
    assert_same_error(ctc.ctc_beam_search_decode, twin.ctc_beam_search_decode, (x, ok_in, 0))
    assert_same_error(ctc.ctc_beam_search_decode, twin.ctc_beam_search_decode, (x, ok_in, 2, 3))


def test_bad_values_raise_the_twins_errors_from_the_device_check():
    """Labels and lengths are checked on the device (no host sync at the call); the error, the
    twin's message, is raised where the results are read (deferred.raise_pending), and the
    kernels ran on the bad values without reading out of bounds (sanitizer on)."""
    x = np.zeros((2, 5, 4), np.float32)
    labels = np.array([[0, 1], [2, 2]])
    ok_in, ok_lab = np.array([5, 5]), np.array([2, 2])
    loss_cases = [
        (x, np.array([[0, 4], [1, 1]]), ok_in, ok_lab),        # label >= classes
        (x, np.array([[0, 3], [1, 1]]), ok_in, ok_lab),        # the blank as a label
        (x, np.array([[0, -7], [1, 1]]), ok_in, ok_lab),       # negative label
        (x, labels, np.array([5, -1]), ok_lab),                # negative length
        (x, labels, np.array([5, 6]), ok_lab),                 # input length > T
        (x, labels, ok_in, np.array([2, 3])),                  # label length > Lmax
        (x, labels + 0.5, ok_in, ok_lab),                      # non-integer labels
    ]
    for case in loss_cases:
        assert_same_error(ctc.ctc_loss_fwd, twin.ctc_loss_fwd, case)
        log_alpha, loss = np.zeros((2, 5, 5), np.float32), np.zeros(2, np.float32)
        assert_same_error(ctc.ctc_loss_bwd, twin.ctc_loss_bwd,
                          case + (log_alpha, np.zeros((2, 5), np.float32), loss, loss))
    assert_same_error(ctc.ctc_greedy_decode, twin.ctc_greedy_decode, (x, np.array([6, 1])))
    assert_same_error(ctc.ctc_beam_search_decode, twin.ctc_beam_search_decode, (x, np.array([-1, 1]), 2))


@pytest.mark.usefixtures('deferred_checks')
def test_no_host_syncs_per_call(emulator):
    """Loss, gradient and decoders never copy to the host at the call (runtime.to_host counts
    what would be a device-to-host copy on a GPU); one read of the pending flags follows."""
    rng = np.random.default_rng(3)
    x = rng.standard_normal((2, 6, 4)).astype(np.float32)
    labels, lengths, label_lengths = np.array([[0, 1], [2, 2]]), np.array([6, 5]), np.array([2, 1])
    before = emulator.host_syncs = getattr(emulator, 'host_syncs', 0)
    loss, log_alpha, frame_lse = ctc.ctc_loss_fwd(x, labels, lengths, label_lengths, runtime=emulator)
    ctc.ctc_loss_bwd(x, labels, lengths, label_lengths, log_alpha, frame_lse, loss, np.ones(2, np.float32),
                     runtime=emulator)
    ctc.ctc_greedy_decode(x, lengths, runtime=emulator)
    ctc.ctc_beam_search_decode(x, lengths, 3, runtime=emulator)
    assert emulator.host_syncs == before
    assert deferred.pending_count() == 4
    deferred.raise_pending()
    assert emulator.host_syncs == before + 1 and deferred.pending_count() == 0


def test_bfloat16_is_refused_by_launcher_and_twin(monkeypatch):
    """The CTC kernels have no bfloat16 variant (the softmax family's checks accept it)."""
    monkeypatch.setattr(runtime, 'get_runtime', lambda kind: _NoLaunch())
    x = np.zeros((2, 5, 4), ml_dtypes.bfloat16)
    labels, lengths = np.array([[0, 1], [2, 2]]), np.array([5, 5])
    log_alpha, loss = np.zeros((2, 5, 5), np.float32), np.zeros(2, np.float32)
    assert_same_error(ctc.ctc_loss_fwd, twin.ctc_loss_fwd, (x, labels, lengths, lengths - 3))
    assert_same_error(ctc.ctc_loss_bwd, twin.ctc_loss_bwd, (x.astype(np.float32), labels, lengths, lengths - 3,
                                                      log_alpha.astype(ml_dtypes.bfloat16), loss[:, None], loss,
                                                      loss))
    assert_same_error(ctc.ctc_greedy_decode, twin.ctc_greedy_decode, (x, lengths))
    with pytest.raises(TypeError, match='ctc_loss_fwd: logits must be a float16, float32 or float64 array, '
                                        'got dtype bfloat16'):
        twin.ctc_loss_fwd(x, labels, lengths, lengths - 3)


def test_theano_helpers_delegate_to_the_twin():
    y = np.array([2, 2, 1])
    np.testing.assert_array_equal(ctc.ctc_interleave_blanks(y, runtime='emulate'), twin.ctc_interleave_blanks(y))
    interleaved = twin.ctc_interleave_blanks(y)
    np.testing.assert_array_equal(ctc.ctc_create_skip_idxs(interleaved, runtime='emulate'),
                                  twin.ctc_create_skip_idxs(interleaved))
    predict = np.random.default_rng(0).dirichlet(np.ones(3), 6)
    assert ctc.ctc_cost(predict, y, runtime='emulate') == twin.ctc_cost(predict, y)
    got, expected = ctc.ctc_path_probs(predict, interleaved, runtime='emulate'), twin.ctc_path_probs(predict,
                                                                                                     interleaved)
    np.testing.assert_array_equal(got[1], expected[1])
    np.testing.assert_array_equal(got[0], expected[0])


# ---------------------------------------------------------------- cuDNN path

def test_cudnn_translation_moves_the_blank_first():
    order, inverse = cudnn_ctc.class_permutation(5, 4)
    np.testing.assert_array_equal(order, [4, 0, 1, 2, 3])
    x = np.arange(10).reshape(2, 5)
    np.testing.assert_array_equal(x[:, order][:, inverse], x)
    order, _ = cudnn_ctc.class_permutation(5, 2)
    np.testing.assert_array_equal(order, [2, 0, 1, 3, 4])
    labels = np.array([[0, 1, 3, 4]])
    # the renumbered label indexes the same class of the permuted logits
    np.testing.assert_array_equal(order[cudnn_ctc.cudnn_labels(labels, 2)], labels)
    np.testing.assert_array_equal(cudnn_ctc.cudnn_labels(labels[:, :3], 4), labels[:, :3] + 1)


def test_cudnn_label_packing_and_descriptor():
    labels = np.array([[1, 2, 9], [3, 9, 9], [9, 9, 9]])
    packed = cudnn_ctc.pack_labels(labels, np.array([2, 1, 0]))
    assert packed.dtype == np.int32
    np.testing.assert_array_equal(packed, [1, 2, 3])
    np.testing.assert_array_equal(cudnn_ctc.min_frames(np.array([[1, 1, 2], [2, 2, 2]]), np.array([3, 2])), [4, 3])
    args = cudnn_ctc.descriptor_args((4, 50, 29), 12)
    assert args['dims'] == (50, 4, 29) and args['strides'] == (116, 29, 1)
    assert args['max_label_length'] == 12 and args['norm_mode'] == cudnn_ctc.CUDNN_LOSS_NORMALIZATION_SOFTMAX


@pytest.mark.gpu
def test_cudnn_ctc_matches_gpuk():
    from gpuk.kernels import dispatch
    from gpuk.kernels.cudnn import library as cudnn_library
    if not runtime.cuda_usable() or not cudnn_library.available():
        pytest.skip('needs a GPU and cuDNN: %s' % (cudnn_library.why_unavailable() or 'no GPU'))
    import cupy
    rng = np.random.default_rng(5)
    x, labels, input_lengths, label_lengths = _batch(rng, np.float32)
    loss, grad = cudnn_ctc.cudnn_ctc_loss(cupy.asarray(x), labels, input_lengths, label_lengths)
    loss_t, log_alpha_t, lse_t = twin.ctc_loss_fwd(x.astype(np.float64), labels, input_lengths, label_lengths)
    np.testing.assert_allclose(to_host(loss), loss_t, rtol=1e-4)
    grad_t = twin.ctc_loss_bwd(x.astype(np.float64), labels, input_lengths, label_lengths, log_alpha_t, lse_t, loss_t,
                               np.ones(5))
    np.testing.assert_allclose(to_host(grad), grad_t, atol=1e-4)
    with pytest.raises(dispatch.Unsupported):
        cudnn_ctc.cudnn_ctc_loss(cupy.asarray(x.astype(np.float64)), labels, input_lengths, label_lengths)


# ctc_check_loss_values: Keras's labels and lengths checked and converted in one launch

CHECK_STEPS, CHECK_CLASSES = 50, 29   # the blank is 28: a label >= 28 ends the label


def _keras_labels(rng, batch, width, dtype):
    """Labels in [0, 27] with garbage past each length (what Keras pads with is unchecked) and
    first-blank cuts (28, or a class past it) inside two lengths."""
    labels = rng.integers(0, CHECK_CLASSES - 1, (batch, width)).astype(np.float64)
    label_lengths = rng.integers(0, width + 1, batch)
    label_lengths[:6] = (width, 0, 1, 33, 20, width)
    for n in range(batch):
        labels[n, label_lengths[n]:] = rng.choice([-3.0, 99.0, 0.5, np.nan])
    labels[4, 7:20] = CHECK_CLASSES - 1   # the blank ends sample 4's label (blanks up to its length)
    labels[5, 40:] = (CHECK_CLASSES + 60, CHECK_CLASSES - 1, CHECK_CLASSES, 200, 28)   # a class past the blank ends sample 5's
    if np.dtype(dtype).kind in 'iu':   # integer garbage: no NaN or fractions, no negatives unsigned
        labels = np.where(np.isnan(labels) | (labels == 0.5), 7, labels)
        labels = np.where(labels < 0, 0, labels) if np.dtype(dtype).kind == 'u' else labels
    return labels.astype(dtype), label_lengths


def _check_matches_twin(rt, labels, input_lengths, label_lengths):
    """Kernel and twin agree on every output, the flag included; returns the flag."""
    got = ctc.ctc_check_loss_values(*[to_device(rt, a) for a in (labels, input_lengths, label_lengths)],
                                    CHECK_STEPS, CHECK_CLASSES, runtime=rt)
    expected = twin.ctc_check_loss_values(labels, input_lengths, label_lengths, CHECK_STEPS, CHECK_CLASSES)
    for name, g, e in zip(('labels', 'input_lengths', 'label_lengths', 'bad'), got, expected):
        g = to_host(g)
        assert g.shape == e.shape, name
        np.testing.assert_array_equal(g.astype(e.dtype), e, err_msg=name)
    return bool(expected[3])


@pytest.mark.parametrize('labels_dtype', [np.int64, np.int32, np.uint8, np.float16, np.float32, np.float64])
@pytest.mark.parametrize('lengths_dtype', [np.int64, np.int32, np.float32])
def test_check_loss_values_matches_twin(kernel_runtime, labels_dtype, lengths_dtype):
    """Good values in the dtypes Keras may feed, odd sizes: batch 37 (warps stride over the
    samples), width 45 (two ballot chunks per row; 1,665 labels over 256 threads); no flag."""
    rng = np.random.default_rng(11)
    labels, label_lengths = _keras_labels(rng, 37, 45, labels_dtype)
    input_lengths = rng.integers(0, CHECK_STEPS + 1, 37)
    assert not _check_matches_twin(kernel_runtime, labels, input_lengths.astype(lengths_dtype),
                                   label_lengths.astype(lengths_dtype))


def _with(array, at, value):
    changed = array.copy()
    changed[at] = value
    return changed


def _bad_value_cases():
    """(what, labels, input_lengths, label_lengths, flagged): each kind of bad value, and values
    that look bad but are not checked (past the length, past the first-blank cut)."""
    labels = np.arange(1.0, 13.0).reshape(3, 4)
    ok_in, ok_lab = np.array([50., 9., 0.]), np.array([4., 2., 0.])
    return [
        ('input length > steps', labels, _with(ok_in, 1, 51), ok_lab, True),
        ('negative input length', labels, _with(ok_in, 2, -1), ok_lab, True),
        ('fractional input length', labels, _with(ok_in, 0, 4.5), ok_lab, True),
        ('NaN input length', labels, _with(ok_in, 0, np.nan), ok_lab, True),
        ('label length > width', labels, ok_in, _with(ok_lab, 1, 5), True),
        ('negative label length', labels, ok_in, _with(ok_lab, 2, -2), True),
        ('fractional label length', labels, ok_in, _with(ok_lab, 1, 1.5), True),
        ('inf label length', labels, ok_in, _with(ok_lab, 1, np.inf), True),
        ('negative label', _with(labels, (1, 1), -1), ok_in, ok_lab, True),
        ('fractional label', _with(labels, (1, 1), 2.5), ok_in, ok_lab, True),
        ('NaN label', _with(labels, (1, 1), np.nan), ok_in, ok_lab, True),
        ('-inf label', _with(labels, (0, 3), -np.inf), ok_in, ok_lab, True),
        ('bad label past the length', _with(labels, (1, 3), -1), ok_in, ok_lab, False),
        ('bad label past the length after blanks', _with(_with(_with(labels, (1, 0), 28), (1, 1), 29), (1, 2), 0.5),
         ok_in, ok_lab, False),
        ('class past the first blank', _with(_with(labels, (1, 0), 28), (1, 1), 3), ok_in, ok_lab, True),
        ('fractional label past the first blank', _with(_with(labels, (1, 0), 28), (1, 1), 0.5), ok_in, ok_lab, True),
        ('NaN past the first blank', _with(_with(_with(labels, (0, 1), 30), (0, 2), 28), (0, 3), np.nan), ok_in, ok_lab, True),
        ('blanks past the first blank', _with(_with(_with(labels, (0, 1), 30), (0, 2), 28), (0, 3), 1e9), ok_in, ok_lab, False),
        ('+inf ends a label', _with(_with(labels, (0, 2), np.inf), (0, 3), 28), ok_in, ok_lab, False),
    ]


@pytest.mark.parametrize('case', _bad_value_cases(), ids=lambda case: case[0])
def test_check_loss_values_flags_each_bad_value(kernel_runtime, case):
    what, labels, input_lengths, label_lengths, flagged = case
    for dtype in (np.float64, np.float32):
        assert _check_matches_twin(kernel_runtime, labels.astype(dtype), input_lengths.astype(dtype),
                                   label_lengths.astype(dtype)) == flagged, what


def test_check_loss_values_integer_extremes(kernel_runtime):
    """Integers past 2^53 (the kernel reads doubles): a huge unsigned label ends a label; the
    most negative int64 label and length are flagged."""
    huge = np.array([[3, 2**63 + 5, 2**63]], np.uint64)
    assert not _check_matches_twin(kernel_runtime, huge, np.array([5], np.uint64), np.array([3], np.uint64))
    low = np.iinfo(np.int64).min
    assert _check_matches_twin(kernel_runtime, np.array([[3, low, 1]]), np.array([5]), np.array([3]))
    assert _check_matches_twin(kernel_runtime, np.array([[3, 2, 1]]), np.array([low]), np.array([3]))


@pytest.mark.parametrize('shape', [(0, 4), (3, 0), (0, 0)])
def test_check_loss_values_empty(kernel_runtime, shape):
    labels = np.zeros(shape, np.float32)
    assert not _check_matches_twin(kernel_runtime, labels, np.full(shape[0], 3), np.zeros(shape[0], np.int64))


def test_check_loss_values_shapes_and_dtypes_raise_the_twins_errors(monkeypatch):
    monkeypatch.setattr(runtime, 'get_runtime', lambda kind: _NoLaunch())
    labels, lengths = np.zeros((2, 3)), np.array([1, 1])
    for args in ((labels[0], lengths, lengths), (labels, lengths[:1], lengths), (labels, lengths, lengths[:, None]),
                 (labels.astype(bool), lengths, lengths), (labels, lengths.astype(ml_dtypes.bfloat16), lengths)):
        assert_same_error(ctc.ctc_check_loss_values, twin.ctc_check_loss_values, args + (5, 4))
