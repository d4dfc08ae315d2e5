"""NumPy pooling twins against slow loop definitions, finite differences and
argument checks."""
import itertools

import numpy as np
import pytest

from gpuk.cpu_fallback import pooling
from gpuk.contracts import geometry, pooling_checks
from tests.evaluation import assert_close_to_scale, from_cl, layout, to_cl

DTYPES = [np.float16, np.float32, np.float64]
FORMATS = ['channels_last', 'channels_first']
TOLERANCE = {np.float16: 1e-2, np.float32: 1e-5, np.float64: 1e-12}

# (input spatial, window, strides, padding): 1d/2d/3d, odd sizes, strides
# larger than the window, TensorFlow 'same' padding with the odd pixel after.
CASES = [
    ((7,), (3,), (2,), 'same'),
    ((8,), (2,), (3,), 'valid'),
    ((6,), (4,), (1,), 'same'),
    ((5, 6), (3, 2), (2, 1), 'same'),
    ((7, 5), (2, 2), (3, 3), 'valid'),
    ((6, 7), (3, 3), (1, 2), 'same'),
    ((4, 5, 3), (2, 3, 2), (2, 2, 1), 'same'),
    ((5, 4, 4), (2, 2, 3), (2, 1, 2), 'valid'),
]
CASE_IDS = ['%dd-%s-%d' % (len(c[0]), c[3], i) for i, c in enumerate(CASES)]


def tie_free(rng, shape, dtype):
    """Distinct small integers (exact in float16), in random order."""
    size = int(np.prod(shape))
    assert size <= 2048
    return (rng.permutation(size) - size // 2).reshape(shape).astype(dtype)


def real_window(out_pos, window, strides, pads, in_spatial):
    """Input positions (inside the un-padded input) of one pooling window."""
    ranges = []
    for o, k, s, (b, _), size in zip(out_pos, window, strides, pads, in_spatial):
        start = o * s - b
        ranges.append(range(max(start, 0), min(start + k, size)))
    return list(itertools.product(*ranges))


def ref_out_spatial(in_spatial, window, strides, pads):
    return tuple((size + b + a - k) // s + 1
                 for size, k, s, (b, a) in zip(in_spatial, window, strides, pads))


def ref_max_pool(x, window, strides, pads, data_format):
    x_cl = to_cl(x, data_format)
    in_spatial = x_cl.shape[1:-1]
    out_spatial = ref_out_spatial(in_spatial, window, strides, pads)
    y = np.zeros((x.shape[0],) + out_spatial + (x_cl.shape[-1],), x.dtype)
    argmax = np.zeros(y.shape, np.int64)
    for n, c in itertools.product(range(x.shape[0]), range(x_cl.shape[-1])):
        for o in itertools.product(*map(range, out_spatial)):
            positions = real_window(o, window, strides, pads, in_spatial)
            values = [x_cl[(n,) + p + (c,)] for p in positions]
            best = positions[int(np.argmax(values))]
            y[(n,) + o + (c,)] = x_cl[(n,) + best + (c,)]
            argmax[(n,) + o + (c,)] = np.ravel_multi_index(best, in_spatial)
    return from_cl(y, data_format), from_cl(argmax, data_format)


def positions(argmax, x, window, strides, pads, data_format):
    """The flat spatial positions of x that max_pool_fwd's window taps point at."""
    setup = pooling_checks.forward_setup('positions', x, window, strides, pads, data_format)
    return pooling_checks.window_positions(np, argmax, setup)[0]


def ref_avg_pool(x, dy, window, strides, pads, data_format):
    """y and dx in float64 straight from the definition (padding excluded)."""
    x_cl = to_cl(x, data_format).astype(np.float64)
    dy_cl = to_cl(dy, data_format).astype(np.float64)
    in_spatial = x_cl.shape[1:-1]
    out_spatial = ref_out_spatial(in_spatial, window, strides, pads)
    y = np.zeros((x.shape[0],) + out_spatial + (x_cl.shape[-1],))
    dx = np.zeros_like(x_cl)
    for n in range(x.shape[0]):
        for o in itertools.product(*map(range, out_spatial)):
            positions = real_window(o, window, strides, pads, in_spatial)
            for p in positions:
                y[(n,) + o] += x_cl[(n,) + p] / len(positions)
                dx[(n,) + p] += dy_cl[(n,) + o] / len(positions)
    return from_cl(y, data_format), from_cl(dx, data_format)


def assert_close(got, ref, dtype):
    assert_close_to_scale(got, ref, dtype, TOLERANCE[dtype])


def pads_of(case):
    in_spatial, window, strides, padding = case
    return geometry.conv_pads(in_spatial, window, strides, (1,) * len(window), padding)


# ---------------------------------------------------------------- max pooling

@pytest.mark.parametrize('dtype', DTYPES)
@pytest.mark.parametrize('data_format', FORMATS)
@pytest.mark.parametrize('case', CASES, ids=CASE_IDS)
def test_max_pool_matches_definition(case, data_format, dtype):
    in_spatial, window, strides, _ = case
    pads = pads_of(case)
    rng = np.random.default_rng(len(in_spatial))
    x = tie_free(rng, layout(2, in_spatial, 3, data_format), dtype)
    y, argmax = pooling.max_pool_fwd(x, window, strides, pads, data_format)
    y_ref, argmax_ref = ref_max_pool(x, window, strides, pads, data_format)
    assert y.dtype == dtype and argmax.dtype == np.uint8
    np.testing.assert_array_equal(y, y_ref)
    winners = positions(argmax, x, window, strides, pads, data_format)
    np.testing.assert_array_equal(winners, argmax_ref)

    dy = rng.standard_normal(y.shape).astype(dtype)
    dx = pooling.max_pool_bwd(dy, argmax, x.shape, window, strides, pads, data_format)
    dx_ref = np.zeros(x.shape)
    dx_ref_cl = to_cl(dx_ref, data_format)
    dy_cl, arg_cl = to_cl(dy, data_format), to_cl(winners, data_format)
    for index in np.ndindex(*dy_cl.shape):
        position = np.unravel_index(arg_cl[index], in_spatial)
        dx_ref_cl[(index[0],) + position + (index[-1],)] += dy_cl[index]
    assert_close(dx, dx_ref, dtype)


@pytest.mark.parametrize('data_format', FORMATS)
def test_max_pool_backward_matches_finite_differences(data_format):
    rng = np.random.default_rng(7)
    case = ((5, 4), (3, 2), (2, 1), 'same')
    pads = pads_of(case)
    x = tie_free(rng, layout(2, case[0], 2, data_format), np.float64)
    y, argmax = pooling.max_pool_fwd(x, case[1], case[2], pads, data_format)
    g = rng.standard_normal(y.shape)
    numerical = np.zeros_like(x)
    eps = 1e-3  # far below the gap of 1 between tie-free values
    for i in np.ndindex(*x.shape):
        saved = x[i]
        x[i] = saved + eps
        up = np.vdot(pooling.max_pool_fwd(x, case[1], case[2], pads, data_format)[0], g)
        x[i] = saved - eps
        down = np.vdot(pooling.max_pool_fwd(x, case[1], case[2], pads, data_format)[0], g)
        x[i] = saved
        numerical[i] = (up - down) / (2 * eps)
    np.testing.assert_allclose(pooling.max_pool_bwd(g, argmax, x.shape, case[1], case[2], pads, data_format),
                               numerical, rtol=1e-9, atol=1e-9)


def test_max_pool_padding_never_wins():
    # All real values -inf next to padding: the winner must still be a real element.
    x = np.full((1, 4, 1), -np.inf)
    x[0, 3, 0] = 1.0
    pads = geometry.conv_pads((4,), (3,), (1,), (1,), 'same')
    y, argmax = pooling.max_pool_fwd(x, 3, 1, pads, 'channels_last')
    np.testing.assert_array_equal(y[0, :, 0], [-np.inf, -np.inf, 1.0, 1.0])
    np.testing.assert_array_equal(positions(argmax, x, 3, 1, pads, 'channels_last')[0, :, 0], [0, 0, 3, 3])
    np.testing.assert_array_equal(argmax[0, :, 0], [1, 0, 2, 1])   # the same as window taps
    dx = pooling.max_pool_bwd(np.ones_like(y), argmax, x.shape, 3, 1, pads, 'channels_last')
    np.testing.assert_array_equal(dx[0, :, 0], [2.0, 0.0, 0.0, 2.0])


@pytest.mark.parametrize('data_format', FORMATS)
def test_max_pool_all_minus_inf_windows_report_a_real_element(data_format):
    rng = np.random.default_rng(19)
    case = ((5, 6), (3, 4), (2, 2), 'same')
    pads = pads_of(case)
    x = tie_free(rng, layout(2, case[0], 3, data_format), np.float32)
    x[x < 20] = -np.inf
    y, argmax = pooling.max_pool_fwd(x, case[1], case[2], pads, data_format)
    y_ref, argmax_ref = ref_max_pool(x, case[1], case[2], pads, data_format)
    assert np.isneginf(y).any()
    np.testing.assert_array_equal(y, y_ref)
    np.testing.assert_array_equal(positions(argmax, x, case[1], case[2], pads, data_format), argmax_ref)


def test_max_pool_propagates_nan():
    x = np.arange(6, dtype=np.float32).reshape(1, 6, 1)
    x[0, 1, 0] = np.nan
    y, argmax = pooling.max_pool_fwd(x, 2, 2, ((0, 0),), 'channels_last')
    assert np.isnan(y[0, 0, 0]) and argmax[0, 0, 0] == 1
    np.testing.assert_array_equal(y[0, 1:, 0], [3.0, 5.0])


# ---------------------------------------------------------------- average pooling

@pytest.mark.parametrize('dtype', DTYPES)
@pytest.mark.parametrize('data_format', FORMATS)
@pytest.mark.parametrize('case', CASES, ids=CASE_IDS)
def test_avg_pool_matches_definition(case, data_format, dtype):
    in_spatial, window, strides, _ = case
    pads = pads_of(case)
    rng = np.random.default_rng(len(in_spatial) + 10)
    x = rng.standard_normal(layout(2, in_spatial, 3, data_format)).astype(dtype)
    out_spatial = ref_out_spatial(in_spatial, window, strides, pads)
    dy = rng.standard_normal(layout(2, out_spatial, 3, data_format)).astype(dtype)
    y_ref, dx_ref = ref_avg_pool(x, dy, window, strides, pads, data_format)
    assert_close(pooling.avg_pool_fwd(x, window, strides, pads, data_format), y_ref, dtype)
    assert_close(pooling.avg_pool_bwd(dy, x.shape, window, strides, pads, data_format),
                 dx_ref, dtype)


@pytest.mark.parametrize('case', CASES, ids=CASE_IDS)
def test_avg_pool_backward_is_exact_adjoint(case):
    pads = pads_of(case)
    rng = np.random.default_rng(3)
    x = rng.standard_normal(layout(2, case[0], 2, 'channels_first'))
    y = pooling.avg_pool_fwd(x, case[1], case[2], pads, 'channels_first')
    dy = rng.standard_normal(y.shape)
    dx = pooling.avg_pool_bwd(dy, x.shape, case[1], case[2], pads, 'channels_first')
    assert np.vdot(x, dx) == pytest.approx(np.vdot(y, dy), rel=1e-12)


def test_avg_pool_excludes_padding_like_tensorflow():
    x = np.arange(1.0, 6.0).reshape(1, 5, 1)
    pads = geometry.conv_pads((5,), (3,), (2,), (1,), 'same')        # ((1, 1),)
    y = pooling.avg_pool_fwd(x, 3, 2, pads, 'channels_last')
    np.testing.assert_allclose(y[0, :, 0], [1.5, 3.0, 4.5])


def test_float16_average_accumulates_in_float32():
    x = np.full((1, 4096, 1), 1.0, np.float16)
    x[0, 0, 0] = 2048.0
    # A float16 running sum stalls at 2048 (+1 rounds away); float32 gets 6143/4096.
    y = pooling.avg_pool_fwd(x, 4096, 1, ((0, 0),), 'channels_last')
    assert y.dtype == np.float16
    assert float(y[0, 0, 0]) == pytest.approx(6143 / 4096, rel=1e-3)


# ---------------------------------------------------------------- argument checks

X = np.zeros((1, 5, 5, 2), np.float32)
SAME = ((1, 1), (1, 1))


@pytest.mark.parametrize('call, error, message', [
    (lambda: pooling.max_pool_fwd(X.astype(np.int64), 3, 1, SAME, 'channels_last'),
     TypeError, r'max_pool_fwd: x must be a float16, float32 or float64 array, got dtype int64'),
    (lambda: pooling.max_pool_fwd(X, 3, 1, SAME, 'nhwc'),
     ValueError, r"max_pool_fwd: data_format must be 'channels_first' or 'channels_last', "
                 r"got 'nhwc'"),
    (lambda: pooling.max_pool_fwd(X, (3, 0), 1, SAME, 'channels_last'),
     ValueError, r'max_pool_fwd: window must be >= 1'),
    (lambda: pooling.avg_pool_fwd(X, 3, (1, 2, 3), SAME, 'channels_last'),
     ValueError, r'avg_pool_fwd: strides must be an int or a tuple of 2 ints'),
    (lambda: pooling.avg_pool_fwd(X, 2, 1, ((2, 0), (0, 0)), 'channels_last'),
     ValueError, r'avg_pool_fwd: pads \(\(2, 0\), \(0, 0\)\) must be smaller than window'),
    (lambda: pooling.avg_pool_fwd(X, 2, 1, ((-1, 0), (0, 0)), 'channels_last'),
     ValueError, r'avg_pool_fwd: pads must be a tuple of 2 \(before, after\) pairs'),
    (lambda: pooling.max_pool_fwd(X, 8, 1, SAME, 'channels_last'),
     ValueError, r'max_pool_fwd: padded input spatial size 7 .* smaller than the window extent 8'),
    (lambda: pooling.max_pool_fwd(X[:, :0], 3, 1, SAME, 'channels_last'),
     ValueError, r'max_pool_fwd: x must not have a zero-size dimension'),
    (lambda: pooling.max_pool_bwd(X, X, X.shape, 3, 1, SAME, 'channels_last'),
     TypeError, r'max_pool_bwd: argmax must be an integer array, got dtype float32'),
    (lambda: pooling.max_pool_bwd(X, np.zeros((1, 5, 5, 1), np.uint8), X.shape, 3, 1, SAME,
                                  'channels_last'),
     ValueError, r'max_pool_bwd: argmax shape \(1, 5, 5, 1\) and dy shape \(1, 5, 5, 2\)'),
    (lambda: pooling.max_pool_bwd(X, np.zeros(X.shape, np.uint8), X.shape, 3, 1, SAME, 'nhwc'),
     ValueError, r"max_pool_bwd: data_format must be 'channels_first' or 'channels_last'"),
    (lambda: pooling.max_pool_bwd(X, np.zeros(X.shape, np.uint8), (1, 5, 5, 3), 3, 1, SAME,
                                  'channels_last'),
     ValueError, r'max_pool_bwd: batch and channels of dy'),
    (lambda: pooling.avg_pool_bwd(X, (1, 6, 6, 2), 3, 1, SAME, 'channels_last'),
     ValueError, r'avg_pool_bwd: dy spatial shape \(5, 5\) does not match the pooled '
                 r'spatial shape \(6, 6\)'),
])
def test_bad_arguments_are_named(call, error, message):
    with pytest.raises(error, match=message):
        call()
