"""A replayed CUDA Graph (gpuk/cuda_graph.py) writes the step's updates into buffers it owns:
a variable whose value is shared at capture (with another variable, after two updates to one
value in a plain step; with a plan's folded constant) gets a copy, and an output that reads an
updated variable is the value before the update, as with plain launches. The rehearsal's graphs
replay gpuk's launches and copyto only, so the steps are made of kernels."""
import numpy as np
import pytest

from gpuk import backend as K
from gpuk.kernels.runtime import counters

pytestmark = pytest.mark.gpu


class _Calls:
    """Calls K functions on random batches, recording what each call showed (its outputs, then
    ``shown()``: the variables' values) and how many calls replayed a graph."""

    def __init__(self, rng, shown):
        self.rng, self.shown, self.seen, self.replays = rng, shown, [], 0

    def __call__(self, function, *inputs):
        with counters.counting() as counted:
            out = function(list(inputs))
        self.replays += counted.graph_replays
        self.seen.append([np.array(o) for o in out] + self.shown())

    def batch(self):
        return self.rng.standard_normal((2, 8, 8, 3)).astype(np.float32)


def _conv_relu(rng, x):
    w = K.variable(rng.standard_normal((3, 3, 3, 4)).astype(np.float32))
    b = K.variable(rng.standard_normal(4).astype(np.float32))
    return K.relu(K.bias_add(K.conv2d(x, w), b))


def _assert_replays_equal_plain_launches_and_numpy(sequence, monkeypatch, on, replays):
    """``sequence()`` -> (seen, replays), run with graphs, then with plain launches, then on the
    NumPy device: the same values every call (the replays as many as ``replays``)."""
    on('cuda')
    monkeypatch.setenv('GPUK_CUDA_GRAPHS', '1')
    replayed, counted = sequence()
    assert counted == replays, counted
    monkeypatch.setenv('GPUK_CUDA_GRAPHS', '0')
    plain, counted = sequence()
    assert counted == 0
    on('cpu')
    numpy, _ = sequence()
    for call, (got, want, host) in enumerate(zip(replayed, plain, numpy)):
        for k, (a, b, n) in enumerate(zip(got, want, host)):
            np.testing.assert_array_equal(a, b, err_msg='call %d, value %d' % (call, k))
            np.testing.assert_allclose(a, n, rtol=1e-5, atol=1e-5, err_msg='call %d, value %d' % (call, k))


def _sequence(seed):
    """Runs a fixed sequence of calls; returns what each showed (outputs, the variables, the
    constant) and how many calls replayed a graph."""
    rng = np.random.default_rng(seed)
    x = K.placeholder((2, 8, 8, 3))
    h = _conv_relu(rng, x)
    y = K.pool2d(h, (2, 2), strides=(2, 2))
    z = K.pool2d(h, (2, 2), strides=(2, 2), pool_mode='avg')
    u, v = K.variable(np.zeros((2, 3, 3, 4), np.float32)), K.variable(np.zeros((2, 3, 3, 4), np.float32))
    c = K.constant(np.full((2, 3, 3, 4), 7.0, np.float32))
    share = K.function([x], [], updates=[(u, y), (v, y)])   # plain: one array for both variables
    pin = K.function([], [], updates=[(u, c)])               # plain: u holds the plan's constant
    f = K.function([x], [u, y], updates=[(u, y), (v, z)])    # reads u before it updates it
    g = K.function([x], [v], updates=[(u, z)])
    call = _Calls(rng, lambda: [K.get_value(u), K.get_value(v), K.eval(c)])
    batch = call.batch
    call(f, batch())          # plain (a signature's first call)
    call(share, batch())      # u and v hold one array
    call(f, batch())          # captured with u and v sharing, replayed
    call(f, batch())          # replayed
    call(g, batch())          # plain
    call(pin)                 # u holds the constant's device value
    call(g, batch())          # captured with u holding the constant, replayed
    call(g, batch())
    call(f, batch())          # replayed (u copied into its buffer first)
    call(pin)
    call(f, batch())
    return call.seen, call.replays


@pytest.mark.parametrize('seed', [0])
def test_a_replay_writes_no_buffer_it_shares_and_equals_plain_launches_and_numpy(on, monkeypatch, seed):
    _assert_replays_equal_plain_launches_and_numpy(lambda: _sequence(seed), monkeypatch, on,
                                                   replays=7)   # f: 4, g: 2, pin: 1


def _sharing_after_capture(seed):
    """Buffers shared after a capture: a plain step that assigns a graph's updated variable to
    another variable, and a variable the graph only reads, shared at capture, then replaced."""
    rng = np.random.default_rng(seed)
    x = K.placeholder((2, 8, 8, 3))
    y = K.pool2d(_conv_relu(rng, x), (2, 2), strides=(2, 2))
    u, v, c, d = [K.variable(np.zeros((2, 3, 3, 4), np.float32)) for _ in range(4)]
    f = K.function([x], [c], updates=[(u, y)])               # reads c, updates u
    adopt = K.function([], [], updates=[(v, u)])             # plain: v holds u's value itself
    share = K.function([x], [], updates=[(c, y), (d, y)])    # plain: c and d hold one array
    call = _Calls(rng, lambda: [K.get_value(t) for t in (u, v, c, d)])
    batch = call.batch
    call(f, batch())          # plain
    call(share, batch())      # c and d share
    call(f, batch())          # captured with c shared, replayed
    call(adopt)               # v holds u's value (the graph's buffer on the CUDA path)
    call(f, batch())          # replayed: writes u
    K.set_value(c, np.full((2, 3, 3, 4), 3.0, np.float32))
    call(f, batch())          # replayed: c copied into the graph's buffer first
    return call.seen, call.replays


def test_a_replay_writes_no_buffer_shared_after_its_capture(on, monkeypatch):
    _assert_replays_equal_plain_launches_and_numpy(lambda: _sharing_after_capture(1), monkeypatch, on, replays=3)
