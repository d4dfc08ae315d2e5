"""The max pooling twin's tap loop against brute-force definitions (first
row-major winner, ties, NaN, -inf windows, one block per row, wide windows with
uint16 tap indices in the loop and int32 argmax out) and max_pool_bwd's scatter,
bit for bit against np.add.at in output order."""
import itertools

import numpy as np
import pytest

from gpuk.contracts import pooling_checks
from gpuk.cpu_fallback import parallel, pooling


def positions(argmax, x, window, strides, pads, data_format='channels_last'):
    """The flat spatial positions of x that max_pool_fwd's window taps point at."""
    setup = pooling_checks.forward_setup('positions', x, window, strides, pads, data_format)
    return pooling_checks.window_positions(np, argmax, setup)[0]


def brute_force_max_pool(x_cl, window, strides, pads):
    """(y, argmax) by looping over windows: first real maximum in row-major order, NaN wins."""
    n, *in_spatial, channels = x_cl.shape
    out_spatial = [(s + b + a - k) // st + 1
                   for s, k, st, (b, a) in zip(in_spatial, window, strides, pads)]
    y = np.empty((n, *out_spatial, channels), x_cl.dtype)
    argmax = np.empty(y.shape, np.int64)
    for b_, c in itertools.product(range(n), range(channels)):
        for out_pos in np.ndindex(*out_spatial):
            best, best_pos = None, None
            for tap in np.ndindex(*window):
                pos = tuple(o * st - pb + t for o, st, (pb, _), t
                            in zip(out_pos, strides, pads, tap))
                if not all(0 <= p < s for p, s in zip(pos, in_spatial)):
                    continue
                value = x_cl[(b_,) + pos + (c,)]
                if best is None or (not np.isnan(best) and (value > best or np.isnan(value))):
                    best, best_pos = value, pos
            y[(b_,) + out_pos + (c,)] = best
            argmax[(b_,) + out_pos + (c,)] = np.ravel_multi_index(best_pos, in_spatial)
    return y, argmax


def tie_heavy(rng, shape, dtype, nan_rate=0.0, minus_inf_rate=0.0):
    """Few distinct values (many ties), optional NaN and -inf entries."""
    x = rng.integers(-2, 3, shape).astype(dtype)
    x[rng.random(shape) < minus_inf_rate] = -np.inf
    x[rng.random(shape) < nan_rate] = np.nan
    return x


# (spatial, window, strides, pads): overlapping and disjoint windows, 1-d to 3-d.
GEOMETRIES = [
    ((9,), (3,), (2,), ((1, 1),)),
    ((7, 8), (3, 3), (2, 2), ((1, 1), (1, 1))),
    ((6, 7), (2, 3), (1, 2), ((0, 1), (1, 1))),
    ((7, 6), (2, 2), (3, 2), ((0, 0), (0, 0))),
    ((4, 5, 4), (2, 3, 2), (2, 1, 2), ((1, 0), (1, 1), (0, 1))),
]


@pytest.mark.parametrize('geometry', GEOMETRIES, ids=lambda g: '%dd' % len(g[0]))
@pytest.mark.parametrize('kind', ['ties', 'nan', 'minus_inf'])
@pytest.mark.parametrize('block_bytes', [None, 64])
def test_running_max_matches_first_row_major_winner(geometry, kind, block_bytes, monkeypatch):
    monkeypatch.setattr(parallel, 'MAX_BLOCK_BYTES', block_bytes)   # 64: a block per row
    spatial, window, strides, pads = geometry
    rng = np.random.default_rng(len(spatial) * 7 + len(kind))
    x = tie_heavy(rng, (2, *spatial, 3), np.float32,
                  nan_rate=0.05 if kind == 'nan' else 0.0,
                  minus_inf_rate=0.6 if kind == 'minus_inf' else 0.0)
    y, argmax = pooling.max_pool_fwd(x, window, strides, pads, 'channels_last')
    y_ref, argmax_ref = brute_force_max_pool(x, window, strides, pads)
    np.testing.assert_array_equal(y, y_ref)
    np.testing.assert_array_equal(positions(argmax, x, window, strides, pads), argmax_ref)
    if kind == 'nan':
        assert np.isnan(y).any() and not np.isnan(y).all()
    if kind == 'minus_inf':
        assert np.isneginf(y).any()


def test_wide_window_uses_uint16_taps_and_keeps_first_winner():
    # 17 x 17 = 289 taps do not fit uint8: tap indices run in uint16
    rng = np.random.default_rng(3)
    x = tie_heavy(rng, (1, 19, 18, 2), np.float64, nan_rate=0.002)
    window, strides, pads = (17, 17), (1, 1), ((8, 8), (8, 8))
    y, argmax = pooling.max_pool_fwd(x, window, strides, pads, 'channels_last')
    y_ref, argmax_ref = brute_force_max_pool(x, window, strides, pads)
    assert argmax.dtype == np.int32
    np.testing.assert_array_equal(y, y_ref)
    np.testing.assert_array_equal(positions(argmax, x, window, strides, pads), argmax_ref)


def add_at_reference(dy_cl, argmax_cl, in_spatial):
    """The original scatter: float32 np.add.at in output (n, *out, c) order."""
    n, channels = dy_cl.shape[0], dy_cl.shape[-1]
    volume = int(np.prod(in_spatial))
    flat = ((np.arange(n)[:, None, None] * volume + argmax_cl.reshape(n, -1, channels))
            * channels + np.arange(channels)[None, None, :])
    dx = np.zeros(n * volume * channels, np.float32)
    np.add.at(dx, flat.ravel(), dy_cl.astype(np.float32).ravel())
    return dx.reshape(n, *in_spatial, channels)


@pytest.mark.parametrize('geometry', GEOMETRIES, ids=lambda g: '%dd' % len(g[0]))
@pytest.mark.parametrize('data_format', ['channels_last', 'channels_first'])
def test_backward_is_bitwise_the_ordered_scatter(geometry, data_format):
    spatial, window, strides, pads = geometry
    rng = np.random.default_rng(11)
    x_cl = tie_heavy(rng, (2, *spatial, 5), np.float32)   # ties: windows share winners
    dy_cl = rng.standard_normal((2,) + brute_force_max_pool(
        x_cl[:, ..., :1], window, strides, pads)[0].shape[1:-1] + (5,)).astype(np.float32)
    dy_cl[0, ..., 0] = -0.0     # 0 + -0 is +0 in the reference; a plain copy would keep -0
    to_format = (lambda a: np.moveaxis(a, -1, 1)) if data_format == 'channels_first' \
        else (lambda a: a)
    _, argmax = pooling.max_pool_fwd(to_format(x_cl), window, strides, pads, data_format)
    dx = pooling.max_pool_bwd(to_format(dy_cl), argmax, to_format(x_cl).shape, window, strides, pads, data_format)
    argmax_cl = positions(np.moveaxis(argmax, 1, -1) if data_format == 'channels_first' else argmax,
                          x_cl, window, strides, pads)
    expected = to_format(add_at_reference(dy_cl, argmax_cl, spatial))
    assert dx.tobytes() == np.ascontiguousarray(expected).tobytes()
