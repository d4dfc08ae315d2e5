"""Launcher families checked once per problem signature (gpuk/kernels/runtime/prepared.py): the
cross-entropies from probabilities, softmax_xent_dtarget, depthwise and locally connected
convolutions, the CTC decoders and loss gradient, cuBLAS matmul, the layout transposes. A repeated problem skips its
checks and launch set-up; bad input still raises the launcher's own error before any launch, on
every call; GPUK_CHECK_LAUNCHES=1 checks every call. The launchers run against a runtime that
records launches (no kernel is compiled or run: what is tested is when checks happen)."""
import numpy as np
import pytest

from gpuk import backend as K
from gpuk.kernels import conv, ctc, layout, matmul, runtime
from gpuk.kernels import softmax_xent as xent
from gpuk.kernels.runtime import prepared

F32 = np.float32
PROBS = np.full((2, 3), 1 / 3, F32)
VALID = ((0, 0), (0, 0))
LOG_PROBS = np.log(np.full((2, 5, 4), 0.25, F32))


class RecordingRuntime:
    """What the launchers use of a runtime, with launches recorded instead of run."""
    kind = 'emulate'
    xp = np

    def __init__(self):
        self.launched = []

    def kernel_launch(self, source, defines, name, grid, block, shared_mem=0, arch=None):
        return lambda args: self.launched.append(name)

    def load(self, *args, **kwargs):
        raise AssertionError('the prepared launches load no module per call')


# (good call, bad call, error type, message): the message names the launcher, the argument,
# what is allowed and what came
CASES = {
    'categorical_xent_probs_fwd': (
        lambda rt: xent.categorical_xent_probs_fwd(PROBS, PROBS, runtime=rt),
        lambda rt: xent.categorical_xent_probs_fwd(PROBS, np.ones((2, 4), F32), runtime=rt),
        ValueError, r'categorical_xent_probs_fwd: probs and target must have the same shape, got \(2, 3\) and \(2, 4\)'),
    'categorical_xent_probs_bwd': (
        lambda rt: xent.categorical_xent_probs_bwd(PROBS, PROBS, np.ones(2, F32), runtime=rt),
        lambda rt: xent.categorical_xent_probs_bwd(PROBS, PROBS, np.ones(3, F32), runtime=rt),
        ValueError, r'categorical_xent_probs_bwd: dloss must have shape \(2,\) .*got \(3,\)'),
    'binary_xent_probs_fwd': (
        lambda rt: xent.binary_xent_probs_fwd(PROBS, PROBS, runtime=rt),
        lambda rt: xent.binary_xent_probs_fwd(PROBS, np.ones((2, 3), np.int32), runtime=rt),
        TypeError, 'binary_xent_probs_fwd: target must be a float16, bfloat16, float32 or float64 array, got dtype '
                   'int32'),
    'binary_xent_probs_fwd epsilon': (   # False == 0 as a key: its type keys the problem too
        lambda rt: xent.binary_xent_probs_fwd(PROBS, PROBS, epsilon=0, runtime=rt),
        lambda rt: xent.binary_xent_probs_fwd(PROBS, PROBS, epsilon=False, runtime=rt),
        ValueError, r'binary_xent_probs_fwd: epsilon must be a number in \[0, 0.5\), got False'),
    'softmax_xent_dtarget': (
        lambda rt: xent.softmax_xent_dtarget(PROBS, np.ones(2, F32), np.ones(2, F32), runtime=rt),
        lambda rt: xent.softmax_xent_dtarget(PROBS, np.ones(3, F32), np.ones(2, F32), runtime=rt),
        ValueError, r'softmax_xent_dtarget: lse must have shape \(2,\) .*got \(3,\)'),
    'depthwise_conv_fwd': (
        lambda rt: conv.depthwise_conv_fwd(np.ones((1, 5, 5, 2), F32), np.ones((3, 3, 2, 1), F32), (1, 1), (1, 1),
                                           VALID, 'channels_last', runtime=rt),
        lambda rt: conv.depthwise_conv_fwd(np.ones((1, 5, 5, 2), F32), np.ones((3, 3, 3, 1), F32), (1, 1), (1, 1),
                                           VALID, 'channels_last', runtime=rt),
        ValueError, r'depthwise_conv_fwd: the channel count of x \(shape \(1, 5, 5, 2\)\) is 2 but w .* has 3'),
    'local_conv_fwd': (
        lambda rt: conv.local_conv_fwd(np.ones((1, 5, 5, 2), F32), np.ones((9, 18, 4), F32), (3, 3), (1, 1), (3, 3),
                                       'channels_last', runtime=rt),
        lambda rt: conv.local_conv_fwd(np.ones((1, 5, 5, 2), F32), np.ones((8, 18, 4), F32), (3, 3), (1, 1), (3, 3),
                                       'channels_last', runtime=rt),
        ValueError, r'local_conv_fwd: w must have shape \(9, 18, C_out\).*got \(8, 18, 4\)'),
    'ctc_greedy_decode': (
        lambda rt: ctc.ctc_greedy_decode(LOG_PROBS, np.full(2, 5), runtime=rt),
        lambda rt: ctc.ctc_greedy_decode(LOG_PROBS, np.full(3, 5), runtime=rt),
        ValueError, r'ctc_greedy_decode: input_lengths must have shape \(2,\) \(the batch size\), got \(3,\)'),
    'ctc_beam_search_decode': (
        lambda rt: ctc.ctc_beam_search_decode(LOG_PROBS, np.full(2, 5), beam_width=1, runtime=rt),
        lambda rt: ctc.ctc_beam_search_decode(LOG_PROBS, np.full(2, 5), beam_width=True, runtime=rt),
        ValueError, 'ctc_beam_search_decode: beam_width must be an int >= 1, got True'),
    'matmul': (
        lambda rt: matmul.matmul(np.ones((2, 3), F32), np.ones((3, 2), F32), runtime=rt),
        lambda rt: matmul.matmul(np.ones((2, 3), F32), np.ones((2, 3), F32), runtime=rt),
        ValueError, r'matmul: inner dimensions differ: shapes \(2, 3\) and \(2, 3\)'),
    'to_channels_last': (   # a thin plane (3 channels)
        lambda rt: layout.to_channels_last(np.ones((2, 3, 5, 7), F32), runtime=rt),
        lambda rt: layout.to_channels_last(np.ones((2, 3), F32), runtime=rt),
        ValueError, r'to_channels_last: x must have 3 to 5 dimensions .*got shape \(2, 3\)'),
    'to_channels_first': (   # vector-friendly planes (16 x 8)
        lambda rt: layout.to_channels_first(np.ones((2, 4, 4, 16), F32), runtime=rt),
        lambda rt: layout.to_channels_first(np.ones((2, 4, 4, 16), np.int8), runtime=rt),
        TypeError, r'to_channels_first: x.dtype must have 2, 4 or 8 bytes per element, got int8'),
}


@pytest.fixture
def prepares(monkeypatch):
    """How many times a launcher's prepare() ran (its checks and launch set-up)."""
    prepared.clear()
    count = [0]
    real_get = prepared.get

    def counted_get(rt, launcher, arrays, params, prepare):
        def counted_prepare():
            count[0] += 1
            return prepare()
        return real_get(rt, launcher, arrays, params, counted_prepare)
    monkeypatch.setattr(prepared, 'get', counted_get)
    yield count
    prepared.clear()


@pytest.mark.parametrize('family', sorted(CASES))
def test_a_family_checks_a_problem_once_and_still_refuses_bad_input(prepares, monkeypatch, family):
    good, bad, error, message = CASES[family]
    rt = RecordingRuntime()
    first = good(rt)
    launches = list(rt.launched)
    assert prepares[0] == 1
    again = good(rt)                                   # the same problem: prepared, no check
    assert prepares[0] == 1 and rt.launched == launches * 2
    for a, b in zip(*(r if isinstance(r, (list, tuple)) else [r] for r in (first, again))):
        assert np.shape(a) == np.shape(b)
    for _ in range(2):                                 # a refused problem is checked on every call
        with pytest.raises(error, match=message):
            bad(rt)
    assert rt.launched == launches * 2                 # nothing launched for bad input
    monkeypatch.setenv('GPUK_CHECK_LAUNCHES', '1')
    with runtime.prepared_launches():                  # reads the switch
        before = prepares[0]
        good(rt)
        good(rt)
        assert prepares[0] == before + 2               # the debug flag: checked on every call


def test_bad_probabilities_in_a_training_step_raise_the_k_functions_error_and_change_no_variable(on_device):
    """categorical_crossentropy from probabilities checks its problem once per input signature;
    a later call with another (refused) signature raises the K function's error and commits no
    update."""
    w = K.variable(np.full(3, 0.5, F32))
    p, t = K.placeholder((None, 3)), K.placeholder((None, None))
    loss = K.mean(K.categorical_crossentropy(t, p * w))
    step = K.function([p, t], [loss], updates=[K.update_sub(w, 0.1 * K.gradients(loss, [w])[0])])
    probs = np.full((2, 3), 1 / 3, F32)
    for _ in range(2):
        step([probs, np.eye(3, dtype=F32)[[0, 2]]])
    before = K.get_value(w)
    assert not np.array_equal(before, np.full(3, 0.5, F32))
    with pytest.raises(ValueError, match=r'categorical_crossentropy: .*same shape.*\(2, 3\).*\(2, 4\)'):
        step([probs, np.ones((2, 4), F32)])
    np.testing.assert_array_equal(K.get_value(w), before)


def test_a_parameter_of_another_type_is_a_new_problem():
    # 1.0 == 1 as dict keys: an axis of 1.0 must still be refused after axis=1 was prepared
    x = np.zeros((2, 3), F32)
    rt = RecordingRuntime()
    xent.softmax_fwd(x, 1, runtime=rt)
    with pytest.raises(TypeError, match='softmax_fwd: axis must be an int'):
        xent.softmax_fwd(x, 1.0, runtime=rt)
    prepared.clear()


def _kept_call(kept, token, array, make):
    """``kept.run`` on ``array`` inside a plan run of ``token`` (prepared.LayoutToken)."""
    previous = prepared.enter_run(token)
    try:
        return kept.run('owner', (array,), make)
    finally:
        prepared.leave_run(previous)


def test_a_kept_runner_is_skipped_to_only_under_the_plan_run_that_kept_it():
    """prepared.Kept skips its layout comparison in a plan run of the token its runner was kept
    under. Another plan's call sharing the op (another thread: K.function instances share their
    ops) may land right after this run's call kept its runner and before it notes the run; the
    next run of this plan must still get a runner for its own layouts, never the other plan's
    (whose shapes would go to the kernel)."""
    import sys
    kept = prepared.Kept()
    this_plan, other_plan = prepared.LayoutToken(), prepared.LayoutToken()
    wide, narrow = np.zeros((4, 3), F32), np.zeros((2, 3), F32)

    def make(owner, array):
        shape = array.shape
        return lambda array: shape   # a runner made for one shape

    interfered = []

    def on_line(frame, event, arg):
        # the first line Kept.run reaches with a runner kept: the other plan's call runs there
        if event == 'line' and kept._last is not None and not interfered:
            interfered.append(_kept_call(kept, other_plan, narrow, make))
        return on_line

    tracing = sys.gettrace()
    sys.settrace(lambda frame, event, arg: on_line if frame.f_code is prepared.Kept.run.__code__ else None)
    try:
        assert _kept_call(kept, this_plan, wide, make) == (4, 3)
    finally:
        sys.settrace(tracing)
    assert interfered == [(2, 3)]
    assert _kept_call(kept, this_plan, wide, make) == (4, 3)
    assert _kept_call(kept, other_plan, narrow, make) == (2, 3)


def test_a_runner_holds_none_of_the_arrays_it_was_prepared_for():
    """prepared.get keeps each problem's runner (LIMIT of them) and a plan step's Kept keeps its
    own: neither, nor the runner's step variant (``specialized``), may hold the arrays of the
    call that prepared it (an activation per problem kept alive on the device, and a reused
    step buffer among them never free again: prepared.StepBuffers)."""
    import gc
    import weakref
    from gpuk.kernels import elementwise
    from gpuk.ops.linalg import _product_runner
    rt = RecordingRuntime()
    x, bias = np.ones((2, 3), F32), np.zeros(3, F32)
    a, b = np.ones((2, 3), F32), np.ones((3, 2), np.float64)   # a product without a step variant
    arrays = [weakref.ref(v) for v in (x, a, b)]
    runners = [elementwise.bias_act_fwd_runner(x, bias, runtime=rt), _product_runner(rt, a, b)]
    del x, a, b
    gc.collect()
    assert [array() for array in arrays] == [None] * 3, runners
    prepared.clear()
