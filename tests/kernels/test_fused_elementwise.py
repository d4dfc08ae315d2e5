"""The generated fused elementwise kernels (fused_elementwise.cu) against the NumPy twin, which
runs the same ops one by one: broadcasting, dtype promotion, float16 rounding per op, NaN and
infinities, several outputs, and the cases the kernel leaves to the ops."""
import numpy as np
import pytest

from gpuk import device
from gpuk.contracts.fused_program import FusedProgram
from gpuk.cpu_fallback import elementwise as twin
from gpuk.fusion_elementwise import FusedElementwise
from gpuk.kernels import elementwise
from gpuk.kernels import fused_elementwise as launcher
from gpuk.kernels.testing import to_device, to_host
from gpuk.ops.activation import Relu, ReluGrad
from gpuk.ops.elementwise import Binary, Cast, Clip, Unary, Where

TOLERANCE = {np.bool_: 0, np.float16: 1e-3, np.float32: 2e-6, np.float64: 1e-13}


def _program(op, xp, arrays):
    return op.program(device.Implementation('cpu', xp), arrays)


def _run(kernel_runtime, op, arrays, monkeypatch):
    """(kernel outputs, twin outputs); fails when the launcher fell back to the ops."""
    program = _program(op, np, arrays)
    assert program.kernel_ready()
    monkeypatch.setattr(FusedProgram, 'run_unfused', lambda *a: pytest.fail('the kernel did not run'))
    xp = kernel_runtime.xp
    got = launcher.fused(_program(op, xp, [to_device(kernel_runtime, a) for a in arrays]),
                         [to_device(kernel_runtime, a) for a in arrays], runtime=kernel_runtime)
    monkeypatch.undo()
    return [to_host(g) for g in got], twin.fused(program, arrays)


def _assert_close(got, want, least_precise=None):
    """Equal to the last bits of the least precise dtype the chain computed in (exp, tanh, ...
    may differ by an ulp between the C library and NumPy)."""
    assert len(got) == len(want)
    for g, w in zip(got, want):
        assert g.dtype == w.dtype and g.shape == w.shape
        tolerance = TOLERANCE[(least_precise or w.dtype).type]
        np.testing.assert_allclose(g.astype(np.float64), w.astype(np.float64), rtol=tolerance,
                                   atol=tolerance, equal_nan=True)


def _promoting_chain():
    """Inputs a, b, c: v3 = a * b; v4 = sigmoid(v3 + c); v5 = tanh(a) (in a's dtype);
    outputs v3 and v4 - v5."""
    return FusedElementwise([(Binary('multiply'), (0, 1)), (Binary('add'), (3, 2)), (Unary('sigmoid'), (4,)),
                             (Unary('tanh'), (0,)), (Binary('subtract'), (5, 6))], 3, [3, 7])


def test_broadcasting_and_promotion(kernel_runtime, monkeypatch):
    rng = np.random.default_rng(0)
    a = rng.standard_normal((4, 1, 5)).astype(np.float32)
    b = rng.standard_normal((3, 1)).astype(np.float64)
    c = np.asarray(rng.standard_normal(), np.float16)
    op = _promoting_chain()   # v3 = a * b: float64, broadcast to (4, 3, 5)
    got, want = _run(kernel_runtime, op, [a, b, c], monkeypatch)
    assert [w.dtype for w in want] == [np.float64, np.float64] and want[0].shape == (4, 3, 5)
    _assert_close(got, want, np.dtype(np.float32))   # tanh(a) is a float32 op


def test_a_strided_input_beside_contiguous_ones(kernel_runtime, monkeypatch):
    """A view sliced off a wider array (as a GRU step's gates off its matrix product) beside
    contiguous inputs and a scalar: the view is copied for the kernel, the others pass as they
    are, and the results are the twin's (the program above: no new kernel build)."""
    rng = np.random.default_rng(0)
    wide = rng.standard_normal((4, 1, 9)).astype(np.float32)
    b = rng.standard_normal((3, 1)).astype(np.float64)
    c = np.asarray(rng.standard_normal(), np.float16)
    op = _promoting_chain()
    inputs = [to_device(kernel_runtime, wide)[..., 2:7], to_device(kernel_runtime, b), c]
    assert not inputs[0].flags.c_contiguous and inputs[1].flags.c_contiguous
    host = [wide[..., 2:7], b, c]
    program = _program(op, np, host)
    assert program.kernel_ready()
    monkeypatch.setattr(FusedProgram, 'run_unfused', lambda *a: pytest.fail('the kernel did not run'))
    got = launcher.fused(_program(op, kernel_runtime.xp, inputs), inputs, runtime=kernel_runtime)
    monkeypatch.undo()
    _assert_close([to_host(g) for g in got], twin.fused(program, host), np.dtype(np.float32))


def test_gate_slices_are_read_in_place_through_input_views(kernel_runtime, monkeypatch):
    """A GRU step's cell with its gates folded in as input views (FusedProgram.input_views):
    z = sigmoid(x_z + r_z), r = sigmoid(x_r + r_r), x_z and x_r column slices of one matrix
    product passed twice, r_z and r_r of another, h whole: the kernel reads each at its
    strides and offset (no copy: the arrays are contiguous), the twin slices views."""
    rng = np.random.default_rng(5)
    xm = rng.standard_normal((4, 9)).astype(np.float32)     # x . W: gates z, r, h of 3 columns
    rm = rng.standard_normal((4, 6)).astype(np.float32)     # h . U[:, :6]: gates z, r
    h = rng.standard_normal((4, 3)).astype(np.float32)
    full = slice(None)
    views = [(full, slice(0, 3)), (full, slice(3, 6)), (full, slice(0, 3)), (full, slice(3, None)), None]
    op = FusedElementwise([(Binary('add'), (0, 2)), (Unary('sigmoid'), (5,)), (Binary('add'), (1, 3)),
                           (Unary('sigmoid'), (7,)), (Binary('multiply'), (6, 8)), (Binary('multiply'), (9, 4))],
                          5, [6, 10], views)
    host = [xm, xm, rm, rm, h]
    want = twin.fused(_program(op, np, host), host)
    sliced = [xm[:, :3], xm[:, 3:6], rm[:, :3], rm[:, 3:], h]
    plain = FusedElementwise(op.members, 5, op.outputs)
    np.testing.assert_array_equal(want[1], twin.fused(_program(plain, np, sliced), sliced)[1])
    inputs = [to_device(kernel_runtime, a) for a in host]
    inputs[1], inputs[3] = inputs[0], inputs[2]   # one array read through two views
    monkeypatch.setattr(FusedProgram, 'run_unfused', lambda *a: pytest.fail('the kernel did not run'))
    monkeypatch.setattr(launcher, '_contiguous', lambda xp, a: pytest.fail('an input was copied'))
    got = launcher.fused(_program(op, kernel_runtime.xp, inputs), inputs, runtime=kernel_runtime)
    monkeypatch.undo()
    _assert_close([to_host(g) for g in got], want)


def test_a_plan_steps_variant_reads_a_dense_strided_input_in_place(kernel_runtime, monkeypatch):
    """A plan step's variant (fused_runner's ``specialized``, kept per layouts) reads an input
    whose memory is one dense block in place: a transposed value (K.rnn's batch-major view of
    its time-major outputs, a K.permute_dimensions), also with a size-1 dim and beside a
    broadcast input, and a value broadcast to the output's shape (zero strides: a sum's
    gradient) give bit for bit the plain run's result, which copies them, and make no copy; a
    strided input with gaps or a reversed dim is still copied, to the same results."""
    rng = np.random.default_rng(7)
    xp = kernel_runtime.xp
    # relu'(x) * g * s: the demo's ReLU-gradient step, with a broadcast scale
    op = FusedElementwise([(ReluGrad(Relu(0., None, 0.)), (0, 1)), (Binary('multiply'), (3, 2))], 3, [4])
    time_major = rng.standard_normal((6, 4, 5)).astype(np.float32)
    gradient = rng.standard_normal((4, 6, 5)).astype(np.float32)
    scale = rng.standard_normal((1, 6, 1)).astype(np.float32)
    wide = rng.standard_normal((4, 6, 7)).astype(np.float32)
    transposed = lambda a: a.transpose(1, 0, 2)   # noqa: E731

    def broadcast(a, shape):
        return (np if isinstance(a, np.ndarray) else xp).broadcast_to(a, shape)
    cases = [  # (g, x, s) as functions of (gradient, time_major, scale, wide); read in place or copied
        (lambda g, t, s, w: (g, transposed(t), s), True),
        (lambda g, t, s, w: (g[:, None], t[:, None].transpose(2, 1, 0, 3), s), True),   # a size-1 dim
        (lambda g, t, s, w: (g[:1], transposed(t[:, :1]), s), False),           # gaps
        (lambda g, t, s, w: (transposed(t), g, s), True),                        # g strided
        (lambda g, t, s, w: (g, transposed(t), transposed(transposed(s))), True),
        (lambda g, t, s, w: (g, transposed(t), broadcast(s, g.shape)), True),    # a broadcast scale
        (lambda g, t, s, w: (broadcast(s.reshape(-1)[:1], g.shape), transposed(t), s), True),   # a sum's gradient
        (lambda g, t, s, w: (g, w[..., 1:6], s), False),                         # gaps
        (lambda g, t, s, w: (g[:, ::-1], transposed(t), s), False)]             # a reversed dim
    arrays = (gradient, time_major, scale, wide)
    for case, (view, in_place) in enumerate(cases):
        host = list(view(*arrays))
        inputs = list(view(*[to_device(kernel_runtime, a) for a in arrays]))
        assert [a.strides for a in inputs] == [a.strides for a in host]
        assert any(not a.flags.c_contiguous for a in inputs), case
        program = _program(op, xp, inputs)
        assert program.kernel_ready()
        monkeypatch.setattr(FusedProgram, 'run_unfused', lambda *a: pytest.fail('the kernel did not run'))
        run = launcher.fused_runner(program, inputs, runtime=kernel_runtime)
        want = to_host(run(*inputs))                             # the plain run: strided inputs copied
        copies = []
        real = launcher._contiguous
        monkeypatch.setattr(launcher, '_contiguous', lambda xp, a: copies.append(a.shape) or real(xp, a))
        variant = run.specialized(inputs)
        for _ in range(2):                                       # into a new buffer, then the reused one
            got = variant(*inputs)
            assert got.shape == want.shape and got.flags.c_contiguous, case
            np.testing.assert_array_equal(to_host(got), want)
            del got
        monkeypatch.undo()
        assert (copies == []) == in_place, (case, copies)
        np.testing.assert_array_equal(want, twin.fused(_program(op, np, host), host)[0])


def test_dense_block():
    a = np.zeros((6, 4, 5), np.float32)
    everything = (slice(None),) * 3
    assert launcher._dense_block(a.transpose(1, 0, 2)) == (None, (1, 0, 2))
    assert launcher._dense_block(a.transpose(2, 0, 1)) == (None, (1, 2, 0))
    assert launcher._dense_block(a[:, None].transpose(2, 1, 0, 3)) is not None   # a size-1 dim
    assert launcher._dense_block(np.broadcast_to(a[:1], (3, 4, 5))) == ((slice(0, 1),) + everything[1:], (1, 2, 0))
    index, order = launcher._dense_block(np.broadcast_to(np.float32(2), (3, 4)))   # a broadcast scalar
    assert index == (slice(0, 1),) * 2
    broadcast_transposed = np.broadcast_to(a.transpose(1, 0, 2)[:, None], (4, 3, 6, 5))
    index, order = launcher._dense_block(broadcast_transposed)
    assert broadcast_transposed[index].transpose(order).flags.c_contiguous
    assert np.shares_memory(broadcast_transposed[index].transpose(order), a)
    assert launcher._dense_block(a[:, :1].transpose(1, 0, 2)) is None          # gaps
    assert launcher._dense_block(a[..., 1:4]) is None                          # gaps
    assert launcher._dense_block(a[::-1]) is None                              # a reversed dim
    assert launcher._dense_block(a[:, :, 0]) is None and launcher._dense_block(a[:, 0, :]) is None
    assert launcher._dense_block(a.reshape(-1)[::2]) is None


def test_viewed_layout():
    from gpuk.contracts.fused_program import viewed_layout
    full = slice(None)
    assert viewed_layout((4, 9), (full, slice(3, 6))) == ((4, 3), (9, 1), 3)
    assert viewed_layout((4, 9), (slice(1, None, 2),)) == ((2, 9), (18, 1), 9)
    assert viewed_layout((2, 3, 8), (full, full, slice(6, None))) == ((2, 3, 2), (24, 8, 1), 6)


@pytest.mark.parametrize('dtype', [np.float16, np.float32, np.float64])
def test_chain_of_every_expression(kernel_runtime, monkeypatch, dtype):
    rng = np.random.default_rng(1)
    x = (rng.standard_normal((7, 9)) * 1.5).astype(dtype)
    y = rng.uniform(0.5, 2, (9,)).astype(dtype)
    members, value = [], 2

    def add(op, *args):
        nonlocal value
        members.append((op, args))
        value += 1
        return value - 1
    names = ['negative', 'abs', 'sign', 'square', 'exp', 'expm1', 'sin', 'cos', 'tanh',
             'sigmoid', 'softplus', 'softsign', 'floor', 'ceil']
    last = 0
    for name in names:   # each unary op on x, summed with the previous result
        last = add(Binary('add'), add(Unary(name), 0), last)
    last = add(Binary('add'), add(Unary('log1p'), add(Unary('abs'), 0)), last)   # finite: no NaN hides a bug
    assert np.isfinite(twin.fused(_program(FusedElementwise(members, 2, [last]), np, [x, y]), [x, y])[0]).all()
    z = add(Binary('divide'), last, 1)
    z = add(Binary('maximum'), add(Binary('power'), 1, add(Clip(-1.5, 1.5), 0)), z)
    z = add(Binary('minimum'), z, add(Unary('sqrt'), 1))
    z = add(Relu(0., None, 0.), add(Binary('subtract'), z, add(Unary('log'), 1)))
    z = add(ReluGrad(Relu(0., None, 0.)), 0, z)
    z = add(Cast('float64'), z)
    op = FusedElementwise(members, 2, [z])
    got, want = _run(kernel_runtime, op, [x, y], monkeypatch)
    assert want[0].dtype == np.float64
    _assert_close(got, want, np.dtype(dtype))


def test_comparisons_and_where(kernel_runtime, monkeypatch):
    """Keras's sqrt (where(x < 0, 0, x) first) and masks: bool values inside the kernel, a bool
    input and a bool output; comparisons promote their operands (float16 vs float64 here)."""
    rng = np.random.default_rng(3)
    x = rng.standard_normal((5, 6)).astype(np.float16)
    y = rng.standard_normal((6,)).astype(np.float64)
    mask = rng.uniform(size=(5, 1)) > 0.5
    zero = np.asarray(0, np.float16)
    op = FusedElementwise([(Binary('less'), (0, 3)), (Where(), (4, 3, 0)), (Unary('sqrt'), (5,)),
                           (Binary('greater_equal'), (0, 1)), (Binary('logical_and'), (7, 2)),
                           (Unary('logical_not'), (8,)), (Where(), (9, 6, 1))], 4, [10, 8])
    got, want = _run(kernel_runtime, op, [x, y, mask, zero], monkeypatch)
    assert [w.dtype for w in want] == [np.float64, np.bool_]
    _assert_close(got[:1], want[:1], np.dtype(np.float16))
    np.testing.assert_array_equal(got[1], want[1])


def test_float16_rounds_after_each_op(kernel_runtime, monkeypatch):
    # (x + 1) - 1 in float16 loses x's low bits at the add; computing the chain in float32
    # and rounding once would give x back
    x = np.array([1e-3, 3e-4, -2e-3], np.float16)
    one = np.asarray(1, np.float16)
    op = FusedElementwise([(Binary('add'), (0, 1)), (Binary('subtract'), (2, 1))], 2, [3])
    got, want = _run(kernel_runtime, op, [x, one], monkeypatch)
    np.testing.assert_array_equal(got[0], want[0])
    assert not np.array_equal(want[0], x)


def test_nan_and_infinities(kernel_runtime, monkeypatch):
    x = np.array([np.nan, np.inf, -np.inf, 0.0, -3.0, 50.0, -50.0], np.float32)
    y = np.array([1.0, np.nan, 2.0, np.nan, -4.0, 1.0, 0.0], np.float32)
    op = FusedElementwise([(Binary('maximum'), (0, 1)), (Binary('minimum'), (0, 1)), (Unary('sigmoid'), (0,)),
                           (Relu(0., None, 0.), (0,))], 2, [2, 3, 4, 5])
    got, want = _run(kernel_runtime, op, [x, y], monkeypatch)
    for g, w in zip(got, want):
        np.testing.assert_array_equal(g, w)


def test_cases_the_kernel_leaves_to_the_ops(kernel_runtime):
    """int arithmetic and outputs of different shapes run op by op, with the same results."""
    ints = FusedElementwise([(Binary('add'), (0, 1)), (Binary('multiply'), (2, 0))], 2, [3])
    a, b = np.arange(6, dtype=np.int32).reshape(2, 3), np.int32(4)
    program = _program(ints, np, [a, np.asarray(b)])
    assert not program.kernel_ready()
    got = elementwise.fused(_program(ints, kernel_runtime.xp, [a, np.asarray(b)]),
                            [to_device(kernel_runtime, a), to_device(kernel_runtime, np.asarray(b))],
                            runtime=kernel_runtime)
    np.testing.assert_array_equal(to_host(got[0]), (a + b) * a)
    shapes = FusedElementwise([(Unary('exp'), (0,)), (Binary('add'), (2, 1))], 2, [2, 3])
    x, y = np.ones(3, np.float32), np.ones((2, 3), np.float32)
    got = elementwise.fused(_program(shapes, kernel_runtime.xp, [x, y]),
                            [to_device(kernel_runtime, x), to_device(kernel_runtime, y)], runtime=kernel_runtime)
    assert [to_host(g).shape for g in got] == [(3,), (2, 3)]


def test_empty_and_scalar(kernel_runtime, monkeypatch):
    op = FusedElementwise([(Unary('exp'), (0,)), (Binary('multiply'), (2, 1))], 2, [3])
    for x, y in [(np.zeros((0, 4), np.float32), np.ones(4, np.float32)),
                 (np.asarray(0.5, np.float32), np.asarray(3.0, np.float32))]:
        got, want = _run(kernel_runtime, op, [x, y], monkeypatch)
        _assert_close(got, want)


def test_bad_program_arguments():
    op = FusedElementwise([(Unary('exp'), (0,))], 1, [1])
    program = _program(op, np, [np.ones(2, np.float32)])
    with pytest.raises(ValueError, match='fused: the program takes 1 inputs, got 2'):
        twin.fused(program, [np.ones(2, np.float32)] * 2)
    with pytest.raises(TypeError, match='fused: input 0 must have dtype float32'):
        twin.fused(program, [np.ones(2, np.float64)])
    with pytest.raises(TypeError, match='fused: program must be a FusedProgram'):
        twin.fused('exp', [np.ones(2, np.float32)])


def test_bad_input_views(kernel_runtime):
    # a view must be a tuple of forward slices of static ints, one per input at most, and fit
    # its input's dims: the kernel would read another region than the twin's slice
    op = FusedElementwise([(Unary('exp'), (0,))], 1, [1], [(slice(None), slice(1, 3))])
    with pytest.raises(ValueError, match=r'FusedProgram: input_views must hold one entry per input \(1\), got 2'):
        FusedProgram((np.dtype(np.float32),), (), (0,), (None, None))
    with pytest.raises(ValueError, match=r'FusedProgram: input_views\[0\] must be None or a tuple of slices .*'
                                         r'got \(slice\(None, None, -1\),\)'):
        FusedProgram((np.dtype(np.float32),), (), (0,), ((slice(None, None, -1),),))
    program = _program(op, np, [np.ones((2, 4), np.float32)])
    flat = np.ones(4, np.float32)
    message = r'fused: input 0 is read through a view of 2 slices but has 1 dims \(shape \(4,\)\)'
    with pytest.raises(ValueError, match=message):
        twin.fused(program, [flat])
    with pytest.raises(ValueError, match=message):
        launcher.fused(program, [to_device(kernel_runtime, flat)], runtime=kernel_runtime)


def test_kernel_body_has_one_expression_per_op():
    op = FusedElementwise([(Binary('add'), (0, 1)), (Unary('tanh'), (2,))], 2, [3])
    program = _program(op, np, [np.ones(2, np.float16), np.ones(2, np.float16)])
    body = launcher.kernel_body(program)
    assert body == ('const float v0 = LOAD(0); const float v1 = LOAD(1); '
                    'const float v2 = (float)(round_to<__half, float>(((float)v0) + ((float)v1))); '
                    'const float v3 = (float)(round_to<__half, float>(tanh(((float)v2)))); STORE(0, v3);')


def _lstm_cell_program(dtype):
    """Keras's LSTM cell (i, f, c~, o gates -> c, h), as the fusion pass groups it."""
    sigmoid, tanh, multiply, add = Unary('sigmoid'), Unary('tanh'), Binary('multiply'), Binary('add')
    # inputs: z_i 0, z_f 1, z_c 2, z_o 3, c_prev 4
    members = [(sigmoid, (0,)), (sigmoid, (1,)), (tanh, (2,)), (multiply, (6, 4)), (multiply, (5, 7)),
               (add, (8, 9)), (sigmoid, (3,)), (tanh, (10,)), (multiply, (11, 12))]
    arrays = [np.ones((2, 3), dtype)] * 5
    return _program(FusedElementwise(members, 5, [10, 13]), np, arrays)


@pytest.mark.parametrize('arch', ['sm_80', 'sm_90'])
@pytest.mark.parametrize('dtype, offsets', [(np.float16, False), (np.float32, False), (np.float64, False),
                                            (np.float32, True)])   # gates read in place (FUSED_OFFSETS)
def test_generated_kernels_compile_spill_free_with_nvrtc(arch, dtype, offsets):
    from gpuk.kernels.runtime import build
    from gpuk.kernels.runtime.kernel_source import kernel_source
    program = _lstm_cell_program(dtype)
    text = kernel_source(launcher.SOURCE, launcher.kernel_defines(program, 2, offsets))
    try:
        _, log = build.compile_cubin(text, 'fused_elementwise.cu', arch,
                                     options=build.nvrtc_options(launcher.SOURCE))
    except build.NvrtcMissing as exc:
        pytest.skip(str(exc))
    usage, spilled = build.kernel_usage(log, ['fused_elementwise'])
    assert spilled == 0 and usage['fused_elementwise'].spill_stores == 0
    assert usage['fused_elementwise'].registers <= 64


def test_lstm_cell_kernel_matches_twin(kernel_runtime, monkeypatch):
    rng = np.random.default_rng(5)
    arrays = [rng.standard_normal((4, 7)).astype(np.float32) * 3 for _ in range(5)]
    sigmoid, tanh, multiply, add = Unary('sigmoid'), Unary('tanh'), Binary('multiply'), Binary('add')
    op = FusedElementwise([(sigmoid, (0,)), (sigmoid, (1,)), (tanh, (2,)), (multiply, (6, 4)), (multiply, (5, 7)),
                           (add, (8, 9)), (sigmoid, (3,)), (tanh, (10,)), (multiply, (11, 12))], 5, [10, 13])
    got, want = _run(kernel_runtime, op, arrays, monkeypatch)
    _assert_close(got, want)


def test_index_collapses_to_one_dim_where_every_input_allows():
    # same shape and scalars: one flat dim (no division in the kernel)
    assert launcher.collapsed_index((4, 3, 5), [(4, 3, 5), ()]) == ((60,), [(1,), (0,)])
    # a (3, 1) input keeps the last two dims apart; the leading two cannot merge either
    assert launcher.collapsed_index((4, 3, 5), [(4, 3, 5), (3, 1)]) == ((4, 3, 5), [(15, 5, 1), (0, 1, 0)])
    # size-1 dims drop out; a bias along the last dim keeps two dims
    assert launcher.collapsed_index((2, 1, 6), [(2, 1, 6), (6,)]) == ((2, 6), [(6, 1), (0, 1)])
    assert launcher.collapsed_index((), [(), ()]) == ((1,), [(0,), (0,)])
