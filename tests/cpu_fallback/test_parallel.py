"""Block splitting and threads of the NumPy twins (gpuk/cpu_fallback/parallel.py).

The depthwise convolutions and max pooling must give the same results with tiny blocks
on 2 threads as with one block on one thread: exactly for max pooling and the forward
depthwise convolution, up to float summation order for the depthwise gradients.
"""
import threading

import numpy as np
import pytest

from gpuk.contracts import pooling_checks
from gpuk.cpu_fallback import conv, parallel, pooling


@pytest.fixture
def split(monkeypatch):
    """Returns run(fn, *args, tiny): fn with tiny blocks on 2 threads, or 1 block on 1 thread."""
    def run(fn, *args, tiny):
        monkeypatch.setenv('GPUK_CPU_THREADS', '2' if tiny else '1')
        monkeypatch.setattr(parallel, 'MAX_BLOCK_BYTES', 1 if tiny else None)
        monkeypatch.setattr(parallel, 'BLOCK_BYTES', 1 if tiny else 1 << 40)
        return fn(*args)
    return run


# ---------------------------------------------------------------- parallel.py itself

def test_cpu_threads_reads_the_environment(monkeypatch):
    monkeypatch.setenv('GPUK_CPU_THREADS', '3')
    assert parallel.cpu_threads() == 3
    for bad in ('0', 'two', '-1'):
        monkeypatch.setenv('GPUK_CPU_THREADS', bad)
        with pytest.raises(ValueError, match='cpu_threads: GPUK_CPU_THREADS must be a '
                                             'positive integer'):
            parallel.cpu_threads()
    monkeypatch.delenv('GPUK_CPU_THREADS')
    assert parallel.cpu_threads() >= 1


def test_run_blocks_keeps_block_order_and_uses_the_pool(monkeypatch):
    monkeypatch.setenv('GPUK_CPU_THREADS', '2')
    names = set()

    def work(block):
        names.add(threading.current_thread().name)
        return block * block
    assert parallel.run_blocks(work, range(7)) == [b * b for b in range(7)]
    assert any(name.startswith('gpuk-cpu') for name in names)
    assert threading.current_thread().name in names
    monkeypatch.setenv('GPUK_CPU_THREADS', '1')
    names.clear()
    assert parallel.run_blocks(work, range(3)) == [0, 1, 4]
    assert names == {threading.current_thread().name}


@pytest.mark.parametrize('n,rows,row_bytes,block_bytes', [
    (3, 5, 10, 1), (3, 5, 10, 25), (3, 5, 10, 50), (4, 5, 10, 120), (1, 1, 7, 1 << 20)])
def test_row_blocks_cover_the_grid_once(n, rows, row_bytes, block_bytes):
    seen = np.zeros((n, rows), int)
    for images, row_slice in parallel.row_blocks(n, rows, row_bytes, block_bytes):
        seen[images, row_slice] += 1
    assert (seen == 1).all()


@pytest.mark.parametrize('offsets,spread,first,stop', [
    ((1, 2), (1, 1), 0, 7), ((1, 2), (1, 1), 2, 4), ((-2, 1), (2, 3), 0, 6),
    ((3, 0), (2, 1), 1, 9), ((0, 0), (1, 1), 1, 4)])
def test_padded_rows_matches_a_dense_spread(offsets, spread, first, stop):
    rng = np.random.default_rng(0)
    source = rng.standard_normal((3, 4, 5, 2)).astype(np.float32)
    sizes = (10, 14)
    dense = np.full((3, 30, 30, 2), -7.0, np.float64)   # big enough, then cut to sizes
    for o0 in range(4):
        for o1 in range(5):
            p0, p1 = offsets[0] + o0 * spread[0], offsets[1] + o1 * spread[1]
            if 0 <= p0 < sizes[0] and 0 <= p1 < sizes[1]:
                dense[:, p0, p1] = source[:, o0, o1]
    expected = dense[1:3, first:stop, :sizes[1]]
    got = parallel.padded_rows(source, slice(1, 3), first, stop, offsets, spread, sizes,
                               np.float64, fill=-7.0)
    assert got.dtype == np.float64
    np.testing.assert_array_equal(got, expected)


# ---------------------------------------------------------------- depthwise convolution

DEPTHWISE_CASES = [
    # x shape (channels_last), kernel, multiplier, strides, dilation, pads
    ((2, 9, 3), (3,), 1, (1,), (1,), ((1, 1),)),
    ((2, 7, 6, 3), (3, 3), 1, (1, 1), (1, 1), ((1, 1), (1, 1))),
    ((3, 8, 7, 4), (3, 2), 2, (2, 1), (1, 2), ((1, 0), (2, 1))),
    ((2, 9, 9, 2), (3, 3), 1, (2, 3), (1, 1), ((0, 1), (1, 1))),
    ((2, 6, 5, 2), (1, 2), 1, (2, 2), (1, 1), ((2, 1), (0, 3))),   # pads past the kernel
    ((1, 5, 4, 6, 2), (2, 3, 2), 2, (1, 2, 1), (2, 1, 1), ((1, 1), (0, 2), (1, 0))),
]


def _depthwise_inputs(case, dtype=np.float32):
    x_shape, kernel, multiplier, strides, dilation, pads = case
    rng = np.random.default_rng(len(x_shape) + sum(x_shape))
    x = rng.standard_normal(x_shape).astype(dtype)
    w = rng.standard_normal((*kernel, x_shape[-1], multiplier)).astype(dtype)
    return x, w, (strides, dilation, pads, 'channels_last')


@pytest.mark.parametrize('case', DEPTHWISE_CASES)
def test_depthwise_blocks_and_threads_match_one_block(split, case):
    x, w, geometry = _depthwise_inputs(case)
    y_one = split(conv.depthwise_conv_fwd, x, w, *geometry, tiny=False)
    np.testing.assert_array_equal(split(conv.depthwise_conv_fwd, x, w, *geometry, tiny=True),
                                  y_one)
    dy = np.random.default_rng(1).standard_normal(y_one.shape).astype(np.float32)
    dx_one = split(conv.depthwise_conv_dgrad, dy, w, x.shape, *geometry, tiny=False)
    np.testing.assert_allclose(
        split(conv.depthwise_conv_dgrad, dy, w, x.shape, *geometry, tiny=True), dx_one,
        rtol=1e-6, atol=1e-6)
    dw_one = split(conv.depthwise_conv_wgrad, x, dy, w.shape, *geometry, tiny=False)
    np.testing.assert_allclose(
        split(conv.depthwise_conv_wgrad, x, dy, w.shape, *geometry, tiny=True), dw_one,
        rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize('case', DEPTHWISE_CASES)
@pytest.mark.parametrize('tiny', [False, True])
def test_depthwise_gradients_are_adjoints_of_the_forward(split, case, tiny):
    """<fwd(x, w), dy> = <x, dgrad(dy, w)> = <w, wgrad(x, dy)> in float64, block split or not."""
    x, w, geometry = _depthwise_inputs(case, np.float64)
    y = split(conv.depthwise_conv_fwd, x, w, *geometry, tiny=tiny)
    dy = np.random.default_rng(2).standard_normal(y.shape)
    dx = split(conv.depthwise_conv_dgrad, dy, w, x.shape, *geometry, tiny=tiny)
    dw = split(conv.depthwise_conv_wgrad, x, dy, w.shape, *geometry, tiny=tiny)
    inner = np.vdot(y, dy)
    np.testing.assert_allclose(np.vdot(x, dx), inner, rtol=1e-10)
    np.testing.assert_allclose(np.vdot(w, dw), inner, rtol=1e-10)


def test_depthwise_float16_blocks_compute_in_float32(split):
    x, w, geometry = _depthwise_inputs(DEPTHWISE_CASES[2], np.float16)
    y = split(conv.depthwise_conv_fwd, x, w, *geometry, tiny=True)
    assert y.dtype == np.float16
    reference = conv.depthwise_conv_fwd(x.astype(np.float64), w.astype(np.float64), *geometry)
    np.testing.assert_allclose(y.astype(np.float64), reference, rtol=2e-3, atol=2e-3)
    dy = np.ones(y.shape, np.float16)
    dw = split(conv.depthwise_conv_wgrad, x, dy, w.shape, *geometry, tiny=True)
    assert dw.dtype == np.float16
    np.testing.assert_allclose(
        dw.astype(np.float64),
        conv.depthwise_conv_wgrad(x.astype(np.float64), dy.astype(np.float64), w.shape,
                                  *geometry), rtol=2e-3, atol=2e-2)


# ---------------------------------------------------------------- max pooling

@pytest.mark.parametrize('shape,window,strides,pads', [
    ((2, 9, 8, 3), (3, 3), (2, 2), ((1, 1), (1, 1))),
    ((3, 7, 3), (3,), (1,), ((2, 0),)),
    ((1, 5, 6, 4, 2), (2, 3, 2), (2, 1, 2), ((1, 0), (1, 1), (0, 1))),
])
def test_max_pool_blocks_and_threads_match_one_block_exactly(split, shape, window, strides,
                                                             pads):
    rng = np.random.default_rng(3)
    x = rng.integers(-3, 3, shape).astype(np.float32)       # many ties
    x.flat[rng.choice(x.size, 5, replace=False)] = np.nan   # first NaN wins its windows
    x.flat[rng.choice(x.size, 9, replace=False)] = -np.inf  # padding never wins
    x[0, :2] = -np.inf                                      # windows of only -inf
    geometry = (window, strides, pads, 'channels_last')
    y_one, argmax_one = split(pooling.max_pool_fwd, x, *geometry, tiny=False)
    y_split, argmax_split = split(pooling.max_pool_fwd, x, *geometry, tiny=True)
    np.testing.assert_array_equal(y_split, y_one)
    np.testing.assert_array_equal(argmax_split, argmax_one)
    # and argmax points at the winning value of x itself
    rank = len(window)
    n, channels = shape[0], shape[-1]
    flat_x = x.reshape(n, -1, channels)
    setup = pooling_checks.forward_setup('positions', x, *geometry)
    winners = pooling_checks.window_positions(np, argmax_split, setup)[0]
    picked = np.take_along_axis(flat_x, winners.reshape(n, -1, channels), axis=1)
    np.testing.assert_array_equal(picked, y_split.reshape(n, -1, channels))
    assert argmax_split.shape == y_split.shape and rank == x.ndim - 2
