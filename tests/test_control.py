"""rnn (a scan node) against an explicit Python loop; switch, map_fn, foldl, foldr."""
import numpy as np
import pytest

from gpuk import backend as K
from tests.gradcheck import check_gradients

RNG = np.random.default_rng(7)
X = RNG.standard_normal((3, 5, 4)).astype(np.float32)
W = RNG.standard_normal((4, 6)).astype(np.float32) * 0.5
U = RNG.standard_normal((6, 6)).astype(np.float32) * 0.3
MASK = np.array([[1, 1, 1, 0, 0], [1, 1, 1, 1, 1], [0, 1, 0, 1, 1]], dtype=bool)


def _step(w, u, bias=None):
    def step(x_t, states):
        h = K.tanh(K.dot_like(x_t, w) + K.dot_like(states[0], u) + (states[1] if bias is None else bias))
        return h * 2, [h, states[1] + 1]
    return step


def reference(x, mask=None, go_backwards=False, bias=None):
    """The same recurrence written as a Python loop, with Keras's mask semantics."""
    h, counter = np.zeros((x.shape[0], 6), np.float32), np.zeros((x.shape[0], 6), np.float32)
    outputs, prev_out = [], np.zeros((x.shape[0], 6), np.float32)
    steps = range(x.shape[1] - 1, -1, -1) if go_backwards else range(x.shape[1])
    for t in steps:
        new_h = np.tanh(x[:, t] @ W + h @ U + (counter if bias is None else bias))
        out, new_counter = new_h * 2, counter + 1
        if mask is not None:
            m = mask[:, t][:, None]
            out = np.where(m, out, prev_out)
            new_h, new_counter = np.where(m, new_h, h), np.where(m, new_counter, counter)
        outputs.append(out)
        prev_out, h, counter = out, new_h, new_counter
    return outputs[-1], np.stack(outputs, 1), [h, counter]


@pytest.fixture(autouse=True)
def _matmul_without_linalg(monkeypatch):
    # The step uses a broadcast-and-sum product, so these tests exercise scan alone.
    monkeypatch.setattr(K, 'dot_like', lambda a, b: K.sum(K.expand_dims(a, -1) * b, axis=-2), raising=False)


@pytest.mark.parametrize('unroll', [False, True])
@pytest.mark.parametrize('go_backwards', [False, True])
@pytest.mark.parametrize('masked', [False, True])
def test_rnn_matches_python_loop(on_device, unroll, go_backwards, masked):
    x = K.placeholder((None, 5 if unroll else None, 4))
    mask = K.placeholder((None, 5 if unroll else None), dtype='bool') if masked else None
    init = [K.zeros_like(x[:, 0, :1]) + K.constant(np.zeros((1, 6))) for _ in range(2)]
    last, outputs, states = K.rnn(_step(K.constant(W), K.constant(U)), x, init, go_backwards=go_backwards,
                                  mask=mask, unroll=unroll)
    assert K.int_shape(outputs) == (None, 5 if unroll else None, 6)
    feeds = [X] + ([MASK] if masked else [])
    got = K.function([x] + ([mask] if masked else []), [last, outputs] + states)(feeds)
    want_last, want_outputs, want_states = reference(X, MASK if masked else None, go_backwards)
    for g, w in zip(got, [want_last, want_outputs] + want_states):
        np.testing.assert_allclose(g, w, rtol=1e-5, atol=1e-6)


def test_rnn_constants_and_unknown_time_dimension():
    x = K.placeholder((None, None, 4))
    bias = K.placeholder((6,))
    b = RNG.standard_normal(6).astype(np.float32)

    def step(x_t, states):
        h = K.tanh(K.dot_like(x_t, K.constant(W)) + K.dot_like(states[0], K.constant(U)) + states[2])
        return h * 2, [h, states[1] + 1]
    init = [K.zeros_like(x[:, 0, :1]) + K.constant(np.zeros((1, 6))) for _ in range(2)]
    last, outputs, states = K.rnn(step, x, init, constants=[bias])
    f = K.function([x, bias], [outputs])
    np.testing.assert_allclose(f([X, b])[0], reference(X, bias=b)[1], rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(f([X[:, :2], b])[0], reference(X[:, :2], bias=b)[1], rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize('masked', [False, True])
def test_rnn_gradient_through_time(masked):
    mask = K.constant(MASK[:2, :4]) if masked else None

    def build(x, w, u, h0):
        def step(x_t, states):
            h = K.tanh(K.dot_like(x_t, w) + K.dot_like(states[0], u))
            return h * h, [h]
        last, outputs, states = K.rnn(step, x, [h0], mask=mask, go_backwards=True)
        return outputs * 2 + K.expand_dims(states[0], 1)
    rng = np.random.default_rng(3)
    check_gradients(build, rng.standard_normal((2, 4, 3)), rng.standard_normal((3, 5)) * 0.5,
                    rng.standard_normal((5, 5)) * 0.5, rng.standard_normal((2, 5)))


def test_scan_second_derivative():
    x = K.placeholder((4,), dtype='float64')
    total = K.foldl(lambda acc, v: acc + v * v * v, x, initializer=K.constant(0.0, dtype='float64'))
    (g,) = K.gradients(total, [x])
    (h,) = K.gradients(K.sum(g), [x])
    value = np.array([1.0, -2.0, 0.5, 3.0])
    got_g, got_h = K.function([x], [g, h])([value])
    np.testing.assert_allclose(got_g, 3 * value ** 2)
    np.testing.assert_allclose(got_h, 6 * value)


def test_scan_reads_variables_and_learning_phase():
    w = K.variable(2.0)
    x = K.placeholder((3, 2))
    out = K.map_fn(lambda row: K.in_train_phase(row * w, row), x)
    assert out._uses_learning_phase
    f = K.function([x, K.learning_phase()], [out])
    np.testing.assert_allclose(f([np.ones((3, 2)), 1])[0], np.full((3, 2), 2.0))
    np.testing.assert_allclose(f([np.ones((3, 2)), 0])[0], np.ones((3, 2)))
    K.set_value(w, 3.0)
    np.testing.assert_allclose(f([np.ones((3, 2)), 1])[0], np.full((3, 2), 3.0))
    (gw,) = K.gradients(K.sum(out), [w])
    assert K.function([x, K.learning_phase()], [gw])([np.ones((3, 2)), 1])[0] == 6.0


def test_map_fn_foldl_foldr(on_device):
    elems = K.constant([[1.0, 2.0], [3.0, 4.0], [5.0, 6.0]])
    np.testing.assert_allclose(K.eval(K.map_fn(lambda r: K.sum(r * r), elems)), [5, 25, 61])
    np.testing.assert_allclose(K.eval(K.foldl(lambda a, r: a * 2 + r, elems)), [15, 22])
    np.testing.assert_allclose(K.eval(K.foldr(lambda a, r: a * 2 + r, elems)), [27, 34])
    np.testing.assert_allclose(K.eval(K.foldl(lambda a, r: a - r, elems, initializer=K.constant([0.0, 0.0]))),
                               [-9, -12])
    assert K.eval(K.map_fn(lambda r: r[0] > 2, elems, dtype='float32')).tolist() == [0, 1, 1]


def test_switch(on_device):
    x = K.placeholder((2, 3))
    flag = K.placeholder((), dtype='bool')
    rows = K.placeholder((2,), dtype='bool')
    a = np.arange(6, dtype=np.float32).reshape(2, 3)
    f = K.function([x, flag, rows], [K.switch(flag, x, -x), K.switch(rows, x, lambda: x * 10)])
    whole, by_row = f([a, True, np.array([True, False])])
    np.testing.assert_array_equal(whole, a)
    np.testing.assert_array_equal(by_row, np.stack([a[0], a[1] * 10]))
    assert K.switch(True, x, -x) is x
    with pytest.raises(ValueError, match='switch: rank of condition'):
        K.switch(K.placeholder((2, 3, 1), dtype='bool'), x, x)


def test_rnn_rejects_bad_arguments():
    x = K.placeholder((None, 4))
    with pytest.raises(ValueError, match='rnn: inputs must have at least 3 dims'):
        K.rnn(lambda a, s: (a, s), x, [])
    x3 = K.placeholder((None, None, 4))
    with pytest.raises(ValueError, match='rnn: a mask needs at least one state'):
        K.rnn(lambda a, s: (a, s), x3, [], mask=K.placeholder((None, None)))
    with pytest.raises(ValueError, match='rnn: unroll=True needs a static number of time steps'):
        K.rnn(lambda a, s: (a, s), x3, [K.zeros_like(x3[:, 0])], unroll=True)
    with pytest.raises(ValueError, match='rnn: the step returns a state of dtype'):
        K.rnn(lambda a, s: (a, [K.cast(s[0], 'int32')]), x3, [x3[:, 0]])
