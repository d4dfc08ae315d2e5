"""softmax_xent kernels against their NumPy twins, on every kernel runtime."""
import ml_dtypes
import numpy as np
import pytest

from gpuk.cpu_fallback import softmax_xent as twin
from gpuk.contracts.dtypes import accumulation_dtype
from gpuk.kernels import softmax_xent
from gpuk.kernels.runtime import deferred
from gpuk.kernels.testing import assert_matches_twin, assert_same_error, to_device, to_host

DTYPES = [np.float16, ml_dtypes.bfloat16, np.float32, np.float64]
# warp rows (<= 1024), block rows (> 1024); multiples of 4 take the vector path
CLASS_COUNTS = [2, 5, 33, 1024, 1030, 2052, 4099]


def _inputs(rng, shape, dtype, scale=3.0):
    x = (rng.standard_normal(shape) * scale).astype(dtype)
    t = rng.random(shape).astype(dtype)
    return x, t


@pytest.mark.parametrize('dtype', DTYPES)
@pytest.mark.parametrize('classes', CLASS_COUNTS)
def test_softmax_family_matches_twin(kernel_runtime, dtype, classes):
    rng = np.random.default_rng(classes)
    x, t = _inputs(rng, (3, classes), dtype)
    dy = rng.standard_normal((3, classes)).astype(dtype)
    rt = kernel_runtime
    y = twin.softmax_fwd(x)
    log_y = twin.log_softmax_fwd(x)
    assert_matches_twin(softmax_xent.softmax_fwd, twin.softmax_fwd, (x,), rt)
    assert_matches_twin(softmax_xent.log_softmax_fwd, twin.log_softmax_fwd, (x,), rt)
    assert_matches_twin(softmax_xent.softmax_bwd, twin.softmax_bwd, (y, dy), rt)
    assert_matches_twin(softmax_xent.log_softmax_bwd, twin.log_softmax_bwd, (log_y, dy), rt)


@pytest.mark.parametrize('dtype', DTYPES)
@pytest.mark.parametrize('classes', CLASS_COUNTS)
def test_softmax_xent_matches_twin(kernel_runtime, dtype, classes):
    rng = np.random.default_rng(classes + 1)
    x, t = _inputs(rng, (3, classes), dtype)
    rt = kernel_runtime
    loss, lse = assert_matches_twin(softmax_xent.softmax_xent_fwd, twin.softmax_xent_fwd, (x, t), rt)
    assert lse.dtype == accumulation_dtype(dtype)
    dloss = rng.random(3).astype(lse.dtype)
    assert_matches_twin(softmax_xent.softmax_xent_bwd, twin.softmax_xent_bwd, (x, t, lse, dloss), rt)
    assert_matches_twin(softmax_xent.softmax_xent_dtarget, twin.softmax_xent_dtarget, (x, lse, dloss), rt)
    labels = np.array([0, classes - 1, classes // 2])   # the first and the last class
    _, sparse_lse = assert_matches_twin(softmax_xent.sparse_softmax_xent_fwd, twin.sparse_softmax_xent_fwd,
                                        (x, labels), rt)
    assert_matches_twin(softmax_xent.sparse_softmax_xent_bwd, twin.sparse_softmax_xent_bwd,
                        (x, labels, sparse_lse, dloss), rt)


@pytest.mark.parametrize('dtype', [np.float16, np.float32, np.float64])
@pytest.mark.parametrize('classes', [1, 3, 4, 8, 12, 17, 32])
def test_short_rows_share_a_warp(kernel_runtime, dtype, classes):
    """Rows of <= 32 classes run several per warp (sub-warp groups of 1..32 lanes): a row
    count that leaves the last warp and block part-full, every kernel of the family, and an
    unaligned view (scalar path) for the vector-width counts."""
    rng = np.random.default_rng(classes + 40)
    rows, rt = 261, kernel_runtime
    x, t = _inputs(rng, (rows, classes), dtype)
    dy = rng.standard_normal((rows, classes)).astype(dtype)
    assert_matches_twin(softmax_xent.softmax_fwd, twin.softmax_fwd, (x,), rt)
    assert_matches_twin(softmax_xent.log_softmax_bwd, twin.log_softmax_bwd, (twin.log_softmax_fwd(x), dy), rt)
    loss, lse = assert_matches_twin(softmax_xent.softmax_xent_fwd, twin.softmax_xent_fwd, (x, t), rt)
    dloss = rng.random(rows).astype(lse.dtype)
    assert_matches_twin(softmax_xent.softmax_xent_bwd, twin.softmax_xent_bwd, (x, t, lse, dloss), rt)
    labels = rng.integers(0, classes, rows)
    _, lse = assert_matches_twin(softmax_xent.sparse_softmax_xent_fwd, twin.sparse_softmax_xent_fwd, (x, labels), rt)
    assert_matches_twin(softmax_xent.sparse_softmax_xent_bwd, twin.sparse_softmax_xent_bwd, (x, labels, lse, dloss), rt)
    p = rng.random((rows, classes)).astype(dtype)
    assert_matches_twin(softmax_xent.categorical_xent_probs_bwd, twin.categorical_xent_probs_bwd, (p, t, dloss), rt)
    unaligned = np.concatenate([np.zeros(1, dtype), x.reshape(-1)])[1:].reshape(rows, classes)
    assert_matches_twin(softmax_xent.softmax_xent_bwd, twin.softmax_xent_bwd, (unaligned, t, lse, dloss), rt)


@pytest.mark.parametrize('dtype', DTYPES)
@pytest.mark.parametrize('classes', [2, 7, 1024, 2051])
def test_probability_losses_match_twin(kernel_runtime, dtype, classes):
    rng = np.random.default_rng(classes + 2)
    p = rng.random((3, classes)).astype(dtype)
    p[0, 0] = 0   # below epsilon: clipped, zero gradient
    t = rng.random((3, classes)).astype(dtype)
    dloss = rng.random(3).astype(accumulation_dtype(dtype))
    rt = kernel_runtime
    assert_matches_twin(softmax_xent.categorical_xent_probs_fwd, twin.categorical_xent_probs_fwd, (p, t), rt)
    assert_matches_twin(softmax_xent.categorical_xent_probs_bwd, twin.categorical_xent_probs_bwd, (p, t, dloss), rt)
    assert_matches_twin(softmax_xent.categorical_xent_probs_dtarget, twin.categorical_xent_probs_dtarget,
                        (p, dloss), rt, {'epsilon': 1e-3})


@pytest.mark.parametrize('dtype', DTYPES)
def test_binary_losses_match_twin(kernel_runtime, dtype):
    rng = np.random.default_rng(7)
    shape = (5, 13)
    x = (rng.standard_normal(shape) * 4).astype(dtype)
    x[0, :4] = [1e4, -1e4, np.inf, -np.inf] if dtype != np.float16 else [6e4, -6e4, np.inf, -np.inf]
    z = rng.random(shape).astype(dtype)
    z[0, 2], z[0, 3] = 1, 0   # infinite logits with zero weight on their side: loss 0
    p = rng.random(shape).astype(dtype)
    # p = 1 is clipped to 1 - eps, which only float64 holds exactly enough for log(1 - q)
    p[1, :2] = [0, 1] if dtype == np.float64 else [0, 0.5]
    d = rng.standard_normal(shape).astype(dtype)
    rt = kernel_runtime
    assert_matches_twin(softmax_xent.binary_xent_logits_fwd, twin.binary_xent_logits_fwd, (x, z), rt)
    assert_matches_twin(softmax_xent.binary_xent_logits_bwd, twin.binary_xent_logits_bwd, (x, z, d), rt)
    assert_matches_twin(softmax_xent.binary_xent_logits_dtarget, twin.binary_xent_logits_dtarget, (x, d), rt)
    assert_matches_twin(softmax_xent.binary_xent_probs_fwd, twin.binary_xent_probs_fwd, (p, z), rt)
    assert_matches_twin(softmax_xent.binary_xent_probs_bwd, twin.binary_xent_probs_bwd, (p, z, d), rt)
    assert_matches_twin(softmax_xent.binary_xent_probs_dtarget, twin.binary_xent_probs_dtarget, (p, d), rt,
                        {'epsilon': 1e-2})


@pytest.mark.parametrize('axis', [0, 1, -3])
def test_any_axis(kernel_runtime, axis):
    rng = np.random.default_rng(3)
    x, t = _inputs(rng, (4, 6, 9), np.float32)
    rt = kernel_runtime
    assert_matches_twin(softmax_xent.softmax_fwd, twin.softmax_fwd, (x, axis), rt)
    loss, lse = assert_matches_twin(softmax_xent.softmax_xent_fwd, twin.softmax_xent_fwd, (x, t, axis), rt)
    dloss = np.ones_like(lse)
    assert_matches_twin(softmax_xent.softmax_xent_bwd, twin.softmax_xent_bwd, (x, t, lse, dloss, axis), rt)
    labels = rng.integers(0, x.shape[axis], lse.shape)
    assert_matches_twin(softmax_xent.sparse_softmax_xent_bwd, twin.sparse_softmax_xent_bwd,
                        (x, labels, lse, dloss, axis), rt)
    assert_matches_twin(softmax_xent.categorical_xent_probs_bwd, twin.categorical_xent_probs_bwd,
                        (np.abs(x), t, dloss, axis), rt)


@pytest.mark.parametrize('dtype', [np.float32, ml_dtypes.bfloat16])
@pytest.mark.parametrize('classes', [6, 1500])
def test_extreme_logits_and_masks(kernel_runtime, dtype, classes):
    """+-1e4 logits and -inf masks: finite losses where the target avoids the masked classes."""
    rng = np.random.default_rng(classes)
    x = rng.standard_normal((4, classes)).astype(dtype)
    x[0, 0], x[0, -1] = 1e4, -1e4
    x[1, ::2] = -np.inf                       # masked classes
    x[2, :] = -1e4
    x[2, 1] = 1e4
    x[3, 1:] = -np.inf                        # only the first class is possible
    t = np.zeros_like(x)
    t[0, 0], t[0, -1] = 0.5, 0.5
    t[1, 1] = 1
    t[2, 1] = 1
    t[3, 0] = 1
    rt = kernel_runtime
    y = assert_matches_twin(softmax_xent.softmax_fwd, twin.softmax_fwd, (x,), rt)
    assert np.all(y[1, ::2] == 0) and y[3, 0] == 1
    loss, lse = assert_matches_twin(softmax_xent.softmax_xent_fwd, twin.softmax_xent_fwd, (x, t), rt)
    assert np.all(np.isfinite(loss)) and loss[3] == 0
    assert_matches_twin(softmax_xent.softmax_xent_bwd, twin.softmax_xent_bwd, (x, t, lse, np.ones(4, np.float32)), rt)
    labels = np.array([0, 1, 1, 0])
    assert_matches_twin(softmax_xent.sparse_softmax_xent_fwd, twin.sparse_softmax_xent_fwd, (x, labels), rt)
    t[1, 0] = 1   # a target on a masked class: infinite loss
    loss, _ = assert_matches_twin(softmax_xent.softmax_xent_fwd, twin.softmax_xent_fwd, (x, t), rt)
    assert loss[1] == np.inf


@pytest.mark.parametrize('dtype', [np.float32, ml_dtypes.bfloat16])
def test_unaligned_views_take_the_scalar_path(kernel_runtime, dtype):
    """A row start that is not aligned to 4 elements must not use vector loads."""
    rng = np.random.default_rng(5)
    base = rng.standard_normal(3 * 1032 + 1).astype(dtype)
    x = base[1:].reshape(3, 1032)
    assert_matches_twin(softmax_xent.log_softmax_fwd, twin.log_softmax_fwd, (np.ascontiguousarray(x),),
                        kernel_runtime)
    assert_matches_twin(softmax_xent.softmax_fwd, twin.softmax_fwd, (x,), kernel_runtime)


def test_bad_input_raises_the_twins_errors():
    x = np.zeros((2, 3), np.float32)
    lse = np.zeros(2, np.float32)
    assert_same_error(softmax_xent.softmax_fwd, twin.softmax_fwd, (x, 2))
    assert_same_error(softmax_xent.softmax_fwd, twin.softmax_fwd, (x, 1.0))
    assert_same_error(softmax_xent.softmax_fwd, twin.softmax_fwd, (x.astype(np.int32),))
    assert_same_error(softmax_xent.binary_xent_logits_fwd, twin.binary_xent_logits_fwd, (x, x.view(np.uint32)))
    with pytest.raises(TypeError, match='softmax_fwd: x must be a float16, bfloat16, float32 or float64 array, '
                                        'got dtype uint16'):
        softmax_xent.softmax_fwd(x.astype(ml_dtypes.bfloat16).view(np.uint16), runtime='emulate')
    assert_same_error(softmax_xent.softmax_bwd, twin.softmax_bwd, (x, np.zeros((3, 2), np.float32)))
    assert_same_error(softmax_xent.softmax_xent_fwd, twin.softmax_xent_fwd, (x, np.zeros((2, 4), np.float32)))
    assert_same_error(softmax_xent.softmax_xent_bwd, twin.softmax_xent_bwd, (x, x, np.zeros(3, np.float32), lse))
    assert_same_error(softmax_xent.sparse_softmax_xent_fwd, twin.sparse_softmax_xent_fwd, (x, np.array([0, 3])))
    assert_same_error(softmax_xent.sparse_softmax_xent_fwd, twin.sparse_softmax_xent_fwd, (x, np.array([-1, 0])))
    assert_same_error(softmax_xent.sparse_softmax_xent_fwd, twin.sparse_softmax_xent_fwd, (x, np.array([0.0, 1.0])))
    assert_same_error(softmax_xent.sparse_softmax_xent_fwd, twin.sparse_softmax_xent_fwd, (x, np.array([0, 1, 2])))
    assert_same_error(softmax_xent.categorical_xent_probs_fwd, twin.categorical_xent_probs_fwd, (x, x),
                      {'epsilon': 0.5})
    assert_same_error(softmax_xent.binary_xent_probs_fwd, twin.binary_xent_probs_fwd, (x, x), {'epsilon': -1})
    assert_same_error(softmax_xent.binary_xent_logits_bwd, twin.binary_xent_logits_bwd, (x, x, lse))


@pytest.mark.parametrize('dtype', [np.float16, ml_dtypes.bfloat16])
def test_empty_rows_and_16_bit_results(kernel_runtime, dtype):
    x = np.zeros((0, 5), dtype)
    out = to_host(softmax_xent.softmax_fwd(to_device(kernel_runtime, x), runtime=kernel_runtime))
    assert out.shape == (0, 5) and out.dtype == dtype
    loss, lse = softmax_xent.softmax_xent_fwd(to_device(kernel_runtime, x), to_device(kernel_runtime, x),
                                              runtime=kernel_runtime)
    assert loss.shape == (0,) and loss.dtype == dtype and lse.dtype == np.float32


@pytest.mark.usefixtures('deferred_checks')
def test_sparse_labels_are_checked_without_a_host_sync(emulator):
    """The label range is checked on the device: no copy to the host at the call, the twin's
    error raised where the results are read, and the bad label never used as an index."""
    x = np.zeros((2, 3), np.float32)
    before = emulator.host_syncs = getattr(emulator, 'host_syncs', 0)
    loss, lse = softmax_xent.sparse_softmax_xent_fwd(x, np.array([0, 2]), runtime=emulator)
    softmax_xent.sparse_softmax_xent_bwd(x, np.array([0, 2]), lse, np.ones(2, np.float32), runtime=emulator)
    assert emulator.host_syncs == before and deferred.pending_count() == 2
    deferred.raise_pending()
    assert emulator.host_syncs == before + 1
    loss, _ = softmax_xent.sparse_softmax_xent_fwd(x, np.array([0, 9]), runtime=emulator)
    assert np.isnan(loss[1])
    with pytest.raises(ValueError, match=r'sparse_softmax_xent_fwd: labels must lie in \[0, 3\) \(the size of '
                                         r'logits axis 1\), got values in \[0, 9\]'):
        deferred.raise_pending()


def test_sync_launches_checks_labels_at_the_call(emulator, monkeypatch):
    """GPUK_SYNC_LAUNCHES=1 (debugging) reads the flag at once: the error names its call."""
    monkeypatch.setenv('GPUK_SYNC_LAUNCHES', '1')
    with pytest.raises(ValueError, match=r'sparse_softmax_xent_bwd: labels must lie in \[0, 3\)'):
        softmax_xent.sparse_softmax_xent_bwd(np.zeros((2, 3), np.float32), np.array([3, 0]), np.zeros(2, np.float32),
                                             np.ones(2, np.float32), runtime=emulator)
    assert deferred.pending_count() == 0
