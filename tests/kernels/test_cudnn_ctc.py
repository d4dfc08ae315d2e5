"""gpuk.kernels.cudnn.ctc beyond tests/kernels/test_ctc.py: cuDNN's label range and limits
(pure Python), the 'ctc' family's dispatch in the launchers (the emulator standing in for
the CUDA runtime) and, on a GPU with cuDNN, loss and gradient against the NumPy twin."""
import numpy as np
import pytest

from gpuk import config
from gpuk.cpu_fallback import ctc as twin
from gpuk.kernels import ctc, dispatch
from gpuk.kernels.cudnn import ctc as cudnn_ctc
from gpuk.kernels.cudnn import library as cudnn_library
from gpuk.kernels.testing import assert_close


@pytest.mark.parametrize('blank', [0, 2, 4])
def test_blank_moves_to_class_zero_and_labels_to_one_up(rng, blank):
    classes = 5
    order, inverse = cudnn_ctc.class_permutation(classes, blank)
    logits = rng.standard_normal((2, 3, classes))
    moved = logits[..., order]
    np.testing.assert_array_equal(moved[..., 0], logits[..., blank])      # cuDNN's blank is class 0
    np.testing.assert_array_equal(moved[..., inverse], logits)
    labels = np.array([c for c in range(classes) if c != blank])
    renumbered = cudnn_ctc.cudnn_labels(labels, blank)
    assert renumbered.min() >= 1 and renumbered.max() <= classes - 1   # cudnn_adv.h: labels in [1, A - 1]
    np.testing.assert_array_equal(moved[..., renumbered], logits[..., labels])


@pytest.mark.parametrize('dtype, input_lengths, label_lengths, reason', [
    (np.float64, [5, 5], [2, 2], 'takes float32 logits'),
    (np.float32, [300, 300], [256, 2], 'labels up to 255 long, got 256'),
    (np.float32, [5, 2], [2, 3], 'label_lengths <= input_lengths, sample 1 has 3 > 2'),
])
def test_cudnn_limits_raise_unsupported(dtype, input_lengths, label_lengths, reason):
    with pytest.raises(dispatch.Unsupported, match=reason):
        cudnn_ctc.check_cudnn_limits((2, 300, 5), np.dtype(dtype), np.array(input_lengths), np.array(label_lengths))
    cudnn_ctc.check_cudnn_limits((2, 5, 5), np.dtype(np.float32), np.array([5, 3]), np.array([5, 0]))


@pytest.mark.parametrize('shape', [(0, 5, 4), (2, 0, 4)])
def test_empty_problems_are_left_to_gpuk(shape):
    lengths = np.zeros(shape[0], np.int64)
    with pytest.raises(dispatch.Unsupported, match='non-empty'):
        cudnn_ctc.check_cudnn_limits(shape, np.dtype(np.float32), lengths, lengths)


def _small_problem(rng, dtype=np.float64):
    logits = rng.standard_normal((3, 8, 5)).astype(dtype)
    labels = np.array([[1, 2, 2], [0, 3, 0], [4, 4, 4]])
    return logits, labels, np.array([8, 6, 3]), np.array([3, 2, 0])


def test_launchers_run_cudnn_for_loss_and_gradient_when_chosen(cuda_standin, monkeypatch, rng):
    logits, labels, input_lengths, label_lengths = _small_problem(rng)
    calls = []

    def fake_ctc_loss(fn, x, *args):
        calls.append((fn, x))
        return 'cudnn loss', np.full(x.shape, 2.0)
    monkeypatch.setattr(cudnn_ctc, '_ctc_loss', fake_ctc_loss)
    config.set_kernels(ctc='cudnn')
    loss, log_alpha, frame_lse = ctc.ctc_loss_fwd(logits, labels, input_lengths, label_lengths, runtime=cuda_standin)
    assert loss == 'cudnn loss' and log_alpha.shape == (3, 8, 7) and np.isnan(log_alpha).all()
    assert frame_lse.shape == (3, 8) and np.isnan(frame_lse).all()
    dloss = np.array([1.0, 0.5, 3.0])
    dlogits = ctc.ctc_loss_bwd(logits, labels, input_lengths, label_lengths, log_alpha, frame_lse, np.zeros(3), dloss,
                               runtime=cuda_standin)
    np.testing.assert_array_equal(dlogits, 2.0 * dloss[:, None, None] * np.ones(logits.shape))
    assert [fn for fn, _ in calls] == ['ctc_loss_fwd', 'ctc_loss_bwd'] and all(x is logits for _, x in calls)


def test_launchers_fall_back_to_gpuk_outside_cudnns_limits(cuda_standin, rng):
    """float64 logits are outside cuDNN's limits: gpuk's kernels run, say so once, and give the twin's result."""
    logits, labels, input_lengths, label_lengths = _small_problem(rng)
    config.set_kernels(ctc='cudnn')
    with pytest.warns(RuntimeWarning, match='float32'):
        loss, log_alpha, frame_lse = ctc.ctc_loss_fwd(logits, labels, input_lengths, label_lengths,
                                                      runtime=cuda_standin)
    dloss = np.array([1.0, 0.5, 3.0])
    dlogits = ctc.ctc_loss_bwd(logits, labels, input_lengths, label_lengths, log_alpha, frame_lse, loss, dloss,
                               runtime=cuda_standin)
    loss_t, log_alpha_t, lse_t = twin.ctc_loss_fwd(logits, labels, input_lengths, label_lengths)
    assert_close(loss, loss_t, np.float64, 'loss')
    assert_close(dlogits, twin.ctc_loss_bwd(logits, labels, input_lengths, label_lengths, log_alpha_t, lse_t, loss_t,
                                            dloss),
                 np.float64, 'dlogits')


@pytest.mark.gpu
@pytest.mark.parametrize('blank', [None, 0])
def test_cudnn_ctc_matches_the_twin(rng, blank):
    if not cudnn_library.available():
        pytest.skip('cuDNN unavailable: %s' % cudnn_library.why_unavailable())
    import cupy
    batch, steps, classes, width = 4, 30, 9, 6
    logits = rng.standard_normal((batch, steps, classes)).astype(np.float32)
    blank_index = classes - 1 if blank is None else blank
    values = [c for c in range(classes) if c != blank_index]
    labels = rng.choice(values, size=(batch, width)).astype(np.int32)
    labels[3, :3] = labels[3, 0]                     # repeats need blanks between them
    label_lengths = np.array([6, 3, 0, 4])
    input_lengths = np.array([30, 17, 5, 5])         # sample 3: 4 labels + 2 repeats > 5 frames
    loss_ref, log_alpha, lse = twin.ctc_loss_fwd(logits.astype(np.float64), labels, input_lengths, label_lengths,
                                                 blank)
    dlogits_ref = twin.ctc_loss_bwd(logits.astype(np.float64), labels, input_lengths, label_lengths, log_alpha, lse,
                                    loss_ref, np.ones(batch), blank)
    loss, dlogits = cudnn_ctc.cudnn_ctc_loss(cupy.asarray(logits), labels, input_lengths, label_lengths, blank)
    loss, dlogits = cupy.asnumpy(loss), cupy.asnumpy(dlogits)
    assert np.isinf(loss[3]) and np.isinf(loss_ref[3])
    np.testing.assert_allclose(loss[:3], loss_ref[:3], rtol=1e-4)
    np.testing.assert_allclose(dlogits, dlogits_ref, atol=1e-4)
