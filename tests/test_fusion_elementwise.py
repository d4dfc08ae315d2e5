"""Plan-time fusion of elementwise chains (gpuk/fusion_elementwise.py): which steps a plan
groups, and that fused plans compute what the unfused ones (GPUK_FUSION=0) do, on the NumPy
device (the ops one by one: bit for bit) and on the emulated runtime (one generated kernel)."""
import numpy as np
import pytest

from gpuk import backend as K
from gpuk.contracts.fused_program import FusedProgram
from gpuk.fusion_elementwise import FusedElementwise
from tests.evaluation import compiled_with_fusion as _compiled, plan_ops as _ops


def _no_fallback(monkeypatch, kind):
    """On the emulated runtime, fail when a fused step runs its ops one by one."""
    if kind == 'emulate':
        monkeypatch.setattr(FusedProgram, 'run_unfused', lambda *a: pytest.fail('the fused kernel did not run'))


@pytest.mark.parametrize('kind', ['cpu', 'emulate'])
@pytest.mark.parametrize('dtype', ['float16', 'float32', 'float64'])
def test_broadcast_chain_fuses_into_one_step(monkeypatch, on, rng, kind, dtype):
    on(kind)
    xv = rng.standard_normal((4, 6)).astype(dtype)
    bv = rng.standard_normal(6).astype(dtype)
    x = K.placeholder((None, 6), dtype=dtype)
    b = K.variable(bv, dtype=dtype)
    scale = K.variable(0.5, dtype=dtype)   # a scalar broadcast everywhere
    y = K.sigmoid(x * scale + b) * K.tanh(x) - K.exp(-K.abs(x)) / (1 + K.square(b))
    fused = _compiled(monkeypatch, True, [x], [y])
    plain = _compiled(monkeypatch, False, [x], [y])
    ops = _ops(fused)
    assert len(ops) == 1 and isinstance(ops[0], FusedElementwise) and len(ops[0].members) == 12
    assert len(_ops(plain)) == 12
    want = plain([xv])[0]
    _no_fallback(monkeypatch, kind)
    got = fused([xv])[0]
    assert got.dtype == want.dtype == np.dtype(dtype)
    if kind == 'cpu':
        np.testing.assert_array_equal(got, want)
    else:
        tolerance = {'float16': 2e-3, 'float32': 1e-6, 'float64': 1e-13}[dtype]
        np.testing.assert_allclose(got, want, rtol=tolerance, atol=tolerance)


@pytest.mark.parametrize('kind', ['cpu', 'emulate'])
def test_a_fused_step_keeps_its_runner_per_input_shapes(monkeypatch, on, rng, kind):
    """A fused step keeps the runner of its last problem (prepared.Kept): a call with other
    shapes or dtypes must not reuse it (the kernel's output shape and index tables are the
    problem's), and the step's results follow the shapes call after call."""
    on(kind)
    x = K.placeholder((None, 6))
    b = K.variable(rng.standard_normal(6).astype('float32'))
    scale = K.variable(0.5)
    y = K.sigmoid(x * scale + b) * K.tanh(x) - K.exp(-K.abs(x)) / (1 + K.square(b))   # as above: one build
    fused = _compiled(monkeypatch, True, [x], [y])
    plain = _compiled(monkeypatch, False, [x], [y])
    _no_fallback(monkeypatch, kind)
    for batch in (4, 4, 2, 2, 4, 1):
        xv = rng.standard_normal((batch, 6)).astype('float32')
        got, want = fused([xv])[0], plain([xv])[0]
        assert got.shape == want.shape == (batch, 6)
        np.testing.assert_allclose(got, want, rtol=1e-6, atol=1e-6)


@pytest.mark.parametrize('kind', ['cpu', 'emulate'])
def test_mixed_dtypes_promote_like_the_ops(monkeypatch, on, rng, kind):
    on(kind)
    xv = rng.standard_normal((3, 5)).astype('float32')
    wv = rng.standard_normal((5,)).astype('float64')
    x = K.placeholder((3, 5), dtype='float32')
    w = K.variable(wv, dtype='float64')
    half = K.cast(K.relu(x), 'float16')
    y = K.cast(half, 'float64') * w + K.cast(K.sigmoid(x), 'float64')
    fused = _compiled(monkeypatch, True, [x], [y])
    plain = _compiled(monkeypatch, False, [x], [y])
    assert [type(op).__name__ for op in _ops(fused)] == ['FusedElementwise']
    want = plain([xv])[0]
    _no_fallback(monkeypatch, kind)
    got = fused([xv])[0]
    assert got.dtype == want.dtype == np.float64
    np.testing.assert_allclose(got, want, rtol=1e-6, atol=1e-7)
    # the float16 rounding of relu(x) happened inside the kernel too
    np.testing.assert_allclose(got - K.eval(K.sigmoid(K.constant(xv))).astype(np.float64),
                               xv.clip(0).astype(np.float16).astype(np.float64) * wv, rtol=1e-6, atol=1e-6)


def test_values_read_elsewhere_stay_outputs_and_order_is_kept(monkeypatch, rng):
    xv = rng.standard_normal((3, 4)).astype('float32')
    x = K.placeholder((3, 4))
    a = K.exp(x) * 2           # read by the sum below, which the later chain reads back
    total = K.sum(a)
    y = K.tanh(a + total) - a
    fused = _compiled(monkeypatch, True, [x], [y, total])
    plain = _compiled(monkeypatch, False, [x], [y, total])
    names = [type(op).__name__ for op in _ops(fused)]
    # exp * 2 is one group (its output a is read by the reduction), tanh(a + total) - a another
    assert names == ['FusedElementwise', 'Reduce', 'FusedElementwise']
    for got, want in zip(fused([xv]), plain([xv])):
        np.testing.assert_array_equal(got, want)


def test_fusion_off(monkeypatch):
    x = K.placeholder((3,))
    f = _compiled(monkeypatch, False, [x], [K.exp(x) * 2 + 1])
    assert not any(isinstance(op, FusedElementwise) for op in _ops(f))


def _members(f):
    return [[getattr(op, 'name', type(op).__name__) for op, _ in step.members]
            for step in _ops(f) if isinstance(step, FusedElementwise)]


def test_one_unary_on_slices_of_one_value_runs_once_on_their_span(monkeypatch, rng):
    # the NumPy device's groups (no kernel limits): sigmoid on three of four column blocks, as
    # an LSTM's gates, is one sigmoid on the span (8 columns for 6: within 4/3); on two blocks
    # far apart (8 columns for 4) each keeps its own
    xv = rng.standard_normal((3, 8)).astype('float32')
    x = K.placeholder((3, 8))
    gates = K.sigmoid(x[:, 0:2]) * K.tanh(x[:, 4:6]) + K.sigmoid(x[:, 2:4]) * K.sigmoid(x[:, 6:])
    apart = K.sigmoid(x[:, :2]) + K.sigmoid(x[:, 6:8])
    for y, sigmoids in ((gates, 1), (apart, 2)):
        fused = _compiled(monkeypatch, True, [x], [y])
        plain = _compiled(monkeypatch, False, [x], [y])
        (members,) = _members(fused)
        assert members.count('sigmoid') == sigmoids and members.count('tanh') == 1 - (y is apart)
        np.testing.assert_array_equal(fused([xv])[0], plain([xv])[0])   # the same ufuncs per element


def test_kernel_groups_read_the_gate_slices_they_alone_read_in_place(monkeypatch, on, rng):
    # a GRU-like cell on the emulator: the column slices of x (each read by the group alone)
    # fold into the fused step as input views, x passed once per view; a slice read outside
    # the group too stays a step; batch sizes change call after call
    on('emulate')
    x = K.placeholder((None, 9))
    h = K.placeholder((None, 3))
    shared = x[:, 6:9]
    z = K.sigmoid(x[:, 0:3] + h)
    y = z * h + (1 - z) * K.tanh(x[:, 3:6] * shared)
    fused = _compiled(monkeypatch, True, [x, h], [y, K.sum(shared)])
    plain = _compiled(monkeypatch, False, [x, h], [y, K.sum(shared)])
    (step,) = [op for op in _ops(fused) if isinstance(op, FusedElementwise)]
    assert [type(op).__name__ for op in _ops(fused)].count('Getitem') == 1   # the shared slice
    assert sorted(str(v[1]) for v in step.input_views if v is not None) == ['slice(0, 3, None)', 'slice(3, 6, None)']
    _no_fallback(monkeypatch, 'emulate')
    for batch in (4, 2):
        xv, hv = rng.standard_normal((batch, 9)).astype('float32'), rng.standard_normal((batch, 3)).astype('float32')
        for got, want in zip(fused([xv, hv]), plain([xv, hv])):
            np.testing.assert_allclose(got, want, rtol=1e-6, atol=1e-6)


def test_a_group_slicing_by_a_fed_bound_still_refuses_a_bias_that_no_longer_fits(monkeypatch, on):
    # the NumPy device's groups take Getitems with bounds read at run time: the group's output
    # shape then follows a fed value, not the inputs' layouts, so no step of the plan may skip
    # comparing its layouts (prepared.LayoutToken): bias_add, fused in, kept a plain add for
    # 3 columns and must still refuse a bias of 3 for 1 column, not broadcast it
    on('cpu')
    x = K.placeholder((None, 3))
    n = K.placeholder((), dtype='int32')
    b = K.variable(np.arange(3, dtype=np.float32))
    f = _compiled(monkeypatch, True, [x, n], [K.bias_add(K.exp(x[:, :n]) * 2.0, b)])
    assert [type(op).__name__ for op in _ops(f)] == ['FusedElementwise']
    xv = np.zeros((2, 3), np.float32)
    np.testing.assert_array_equal(f([xv, np.int32(3)])[0], np.tile([2.0, 3.0, 4.0], (2, 1)))
    with pytest.raises(ValueError, match='bias_add: .*bias must have shape'):
        f([xv, np.int32(1)])
