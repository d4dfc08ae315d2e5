"""Random ops and dropout: statistics, seeds, symbolic shapes, dtypes, gradients, errors."""
import numpy as np
import pytest

from gpuk import backend as K
from gpuk.graph import Variable

N_ROWS, N_COLS = 200, 500  # 1e5 samples: a sample mean is within 5 sigma / 316 of the truth


def _draw(tensor, runs=1):
    f = K.function([], [tensor])
    return [f([])[0] for _ in range(runs)]


def _check_moments(values, mean, std, rel_std=0.02):
    n = values.size
    assert abs(values.mean() - mean) < 5 * std / np.sqrt(n)
    assert abs(values.std() - std) < rel_std * std


# --- distributions ----------------------------------------------------------------------------

def test_random_normal_statistics(on_device):
    values, = _draw(K.random_normal((N_ROWS, N_COLS), mean=2.0, stddev=3.0))
    assert values.shape == (N_ROWS, N_COLS) and values.dtype == np.float32
    _check_moments(values.astype(np.float64), 2.0, 3.0)
    # normal tails, not a bounded distribution: about 0.27% lie beyond 3 sigma
    beyond = np.mean(np.abs(values - 2.0) > 9.0)
    assert 0.0015 < beyond < 0.004


def test_truncated_normal_bound_and_statistics(on_device):
    values, = _draw(K.truncated_normal((N_ROWS, N_COLS), mean=1.0, stddev=2.0, dtype='float64'))
    assert values.dtype == np.float64
    assert values.min() >= 1.0 - 4.0 and values.max() <= 1.0 + 4.0
    # standard normal truncated to [-2, 2] has std sqrt(1 - 4 phi(2) / (2 Phi(2) - 1)) = 0.87962
    _check_moments(values, 1.0, 2.0 * 0.87962)
    assert np.mean(np.abs(values - 1.0) > 3.8) > 0.003  # the draws do reach near the bound


def test_random_uniform_statistics_and_bounds(on_device):
    values, = _draw(K.random_uniform((N_ROWS, N_COLS), minval=-2.0, maxval=3.0))
    assert values.dtype == np.float32
    assert values.min() >= -2.0 and values.max() < 3.0
    _check_moments(values.astype(np.float64), 0.5, 5.0 / np.sqrt(12.0))
    histogram, _ = np.histogram(values, bins=10, range=(-2.0, 3.0))
    np.testing.assert_allclose(histogram / values.size, 0.1, atol=0.005)


def test_random_uniform_integer_dtype(on_device):
    values, = _draw(K.random_uniform((N_ROWS, N_COLS), minval=-1, maxval=4, dtype='int32'))
    assert values.dtype == np.int32
    counts = np.bincount(values.ravel() + 1, minlength=5)
    assert counts.size == 5  # nothing outside [-1, 4)
    np.testing.assert_allclose(counts / values.size, 0.2, atol=0.006)


@pytest.mark.parametrize('name', ['random_binomial', 'random_bernoulli'])
def test_binomial_rate_values_and_extremes(on_device, name):
    draw = getattr(K, name)
    values, = _draw(draw((N_ROWS, N_COLS), p=0.3))
    assert values.dtype == np.float32
    assert set(np.unique(values)) <= {0.0, 1.0}
    assert abs(values.mean() - 0.3) < 5 * np.sqrt(0.3 * 0.7 / values.size)
    assert not _draw(draw((1000,), p=0.0))[0].any()
    assert _draw(draw((1000,), p=1.0))[0].all()
    as_int, = _draw(draw((10, 10), p=0.5, dtype='int64'))
    assert as_int.dtype == np.int64 and set(np.unique(as_int)) <= {0, 1}


def test_float16_and_float64_outputs(on_device):
    normal, = _draw(K.random_normal((100, 100), dtype='float16'))
    assert normal.dtype == np.float16 and abs(float(normal.astype(np.float32).std()) - 1.0) < 0.05
    uniform, = _draw(K.random_uniform((400, 500), dtype='float16'))
    assert uniform.dtype == np.float16 and uniform.min() >= 0 and uniform.max() < 1.0
    assert K.random_normal((2,), dtype='float64').dtype == 'float64'
    assert K.random_uniform((2,)).dtype == K.floatx()


def test_random_normal_variable_and_uniform_variable(on_device):
    v = K.random_normal_variable((300, 300), 1.0, 0.5, seed=3, name='w')
    assert isinstance(v, Variable) and K.is_variable(v) and v.name == 'w'
    value = K.get_value(v)
    assert value.dtype == np.float32 and value.shape == (300, 300)
    _check_moments(value.astype(np.float64), 1.0, 0.5)
    np.testing.assert_array_equal(K.get_value(K.random_normal_variable((300, 300), 1.0, 0.5, seed=3)), value)
    u = K.get_value(K.random_uniform_variable((300, 300), -1.0, 2.0, dtype='float64', seed=4))
    assert u.dtype == np.float64 and u.min() >= -1.0 and u.max() < 2.0
    _check_moments(u, 0.5, 3.0 / np.sqrt(12.0))
    saved = np.random.get_state()
    try:
        np.random.seed(11)
        first = K.get_value(K.random_uniform_variable((5,), 0, 1))
        np.random.seed(11)
        np.testing.assert_array_equal(K.get_value(K.random_uniform_variable((5,), 0, 1)), first)
    finally:
        np.random.set_state(saved)


def test_symbolic_parameters(on_device):
    mean = K.variable(5.0)
    stddev = K.placeholder(())
    x = K.random_normal((N_ROWS, N_COLS), mean=mean, stddev=stddev)
    values = K.function([stddev], [x])([0.5])[0]
    _check_moments(values.astype(np.float64), 5.0, 0.5)
    # the gradient of a sum of draws with respect to the mean is the number of draws
    d_mean, = K.gradients(K.sum(x), [mean])
    assert float(K.function([stddev], [d_mean])([0.5])[0]) == N_ROWS * N_COLS
    ones = K.function([], [K.random_binomial((1000,), p=K.constant(1.0))])([])[0]
    assert ones.all()
    shifted, = _draw(K.random_uniform((1000,), minval=K.constant(10.0), maxval=11.0))
    assert shifted.min() >= 10.0 and shifted.max() < 11.0


# --- seeds ------------------------------------------------------------------------------------

@pytest.mark.parametrize('make', [
    lambda seed: K.random_normal((3, 4), seed=seed),
    lambda seed: K.truncated_normal((3, 4), seed=seed),
    lambda seed: K.random_uniform((3, 4), seed=seed),
    lambda seed: K.random_binomial((3, 40), p=0.5, seed=seed),
    lambda seed: K.dropout(K.ones((3, 40)), 0.5, seed=seed),
], ids=['normal', 'truncated', 'uniform', 'binomial', 'dropout'])
def test_seed_replays_the_sequence_in_a_fresh_graph(on_device, make):
    first = _draw(make(7), runs=3)
    again = _draw(make(7), runs=3)
    for a, b in zip(first, again):
        np.testing.assert_array_equal(a, b)
    assert not np.array_equal(first[0], first[1])  # each run draws anew
    assert not np.array_equal(first[0], _draw(make(8))[0])


def test_unseeded_ops_differ_and_follow_numpys_global_seed(on_device):
    a, b = K.random_normal((50,)), K.random_normal((50,))
    f = K.function([], [a, b])
    first_a, first_b = f([])
    assert not np.array_equal(first_a, first_b)
    assert not np.array_equal(first_a, f([])[0])
    saved = np.random.get_state()
    try:
        np.random.seed(5)
        replay = _draw(K.random_normal((50,)))[0]
        np.random.seed(5)
        np.testing.assert_array_equal(_draw(K.random_normal((50,)))[0], replay)
    finally:
        np.random.set_state(saved)


def test_random_ops_are_not_constant_folded(on_device):
    x = K.random_uniform((100,), seed=1)
    y = x * 2.0 + 1.0  # a chain with no placeholders at all
    f = K.function([], [y])
    assert not np.array_equal(f([]), f([]))
    assert not np.array_equal(K.eval(x), K.eval(x))


# --- shapes -----------------------------------------------------------------------------------

def test_shapes_with_symbolic_dims(on_device):
    x = K.placeholder((None, 3, None))
    like_x = K.random_normal(shape=K.shape(x))
    mixed = K.random_uniform((K.shape(x)[0], 4, K.shape(x)[2]))
    assert K.int_shape(like_x) == (None, 3, None)
    assert K.int_shape(mixed) == (None, 4, None)
    f = K.function([x], [like_x, mixed])
    a, b = f([np.zeros((5, 3, 2))])
    assert a.shape == (5, 3, 2) and b.shape == (5, 4, 2)
    a, b = f([np.zeros((1, 3, 7))])
    assert a.shape == (1, 3, 7) and b.shape == (1, 4, 7)
    static = K.random_normal((K.shape(K.ones((2, 6)))[1], 2))
    assert K.int_shape(static) == (6, 2)
    assert K.eval(K.random_binomial(np.array([2, 3]), p=0.5)).shape == (2, 3)
    assert K.eval(K.random_normal(())).shape == ()
    assert K.eval(K.random_normal((0, 3))).shape == (0, 3)


# --- dropout ----------------------------------------------------------------------------------

def test_dropout_scales_kept_entries_and_drops_the_rate(on_device):
    x = K.placeholder((None, N_COLS))
    values = np.full((N_ROWS, N_COLS), 2.0, dtype=np.float32)
    out = K.function([x], [K.dropout(x, 0.25)])([values])[0]
    assert set(np.unique(out)) == {0.0, np.float32(2.0 / 0.75)}
    dropped = np.mean(out == 0)
    assert abs(dropped - 0.25) < 5 * np.sqrt(0.25 * 0.75 / out.size)
    # a level of 0 keeps everything unchanged
    np.testing.assert_array_equal(K.function([x], [K.dropout(x, 0.0)])([values])[0], values)


def test_dropout_float16_and_float64(on_device):
    for dtype in ('float16', 'float64'):
        x = K.placeholder((4, 1000), dtype=dtype)
        out = K.function([x], [K.dropout(x, 0.5)])([np.ones((4, 1000))])[0]
        assert out.dtype == dtype
        assert set(np.unique(out)) == {0.0, 2.0}


@pytest.mark.parametrize('noise_shape', [
    lambda x: (None, 1),
    lambda x: (K.shape(x)[0], 1),
    lambda x: K.concatenate([K.shape(x)[:1], K.constant([1], dtype='int32')]),
], ids=['none', 'symbolic', 'tensor'])
def test_dropout_noise_shape_broadcasts_over_columns(on_device, noise_shape):
    x = K.placeholder((None, 6))
    y = K.dropout(x, 0.5, noise_shape=noise_shape(x))
    assert K.int_shape(y) == (None, 6)
    out = K.function([x], [y])([np.ones((400, 6))])[0]
    row_kept = out[:, 0] != 0
    np.testing.assert_array_equal(out, np.where(row_kept[:, None], 2.0, np.zeros((400, 6))))
    assert 0.35 < row_kept.mean() < 0.65  # rows drop independently


def test_dropout_noise_shape_over_a_leading_axis(on_device):
    x = K.placeholder((3, None, 4))
    y = K.dropout(x, 0.5, noise_shape=(1, K.shape(x)[1], 4), seed=2)
    out = K.function([x], [y])([np.ones((3, 50, 4))])[0]
    # the same mask for each entry of axis 0
    np.testing.assert_array_equal(out[0], out[1])
    np.testing.assert_array_equal(out[0], out[2])
    assert 0 < np.mean(out[0] == 0) < 1


def test_dropout_gradient_is_the_mask_of_the_same_run(on_device, rng):
    x = K.placeholder((None, 30), dtype='float64')
    y = K.dropout(x, 0.4)
    weights = rng.standard_normal((20, 30))
    loss = K.sum(y * K.constant(weights, dtype='float64'))
    grad, = K.gradients(loss, [x])
    f = K.function([x], [y, grad])
    values = rng.uniform(1.0, 2.0, size=(20, 30))
    for _ in range(2):  # new masks on every run; each gradient uses its own run's mask
        out, g = f([values])
        mask = out / values
        assert set(np.round(np.unique(mask), 12)) == {0.0, round(1 / 0.6, 12)}
        np.testing.assert_allclose(g, weights * mask, rtol=1e-12)


def test_dropout_second_derivative_uses_the_same_mask(on_device):
    x = K.placeholder((5, 8), dtype='float64')
    y = K.dropout(x, 0.5)
    g, = K.gradients(K.sum(K.square(y)), [x])
    gg, = K.gradients(K.sum(g), [x])
    out, first, second = K.function([x], [y, g, gg])([np.ones((5, 8))])
    np.testing.assert_allclose(first, 2 * out * (out != 0) * 2.0)   # 2 y * mask
    np.testing.assert_allclose(second, 2 * (out != 0) * 4.0)        # 2 mask^2


# --- bad arguments ----------------------------------------------------------------------------

def _x():
    return K.placeholder((None, 4))


BAD_ARGUMENTS = [
    (ValueError, r'dropout: level must be in \[0, 1\), got 1.0', lambda: K.dropout(_x(), 1.0)),
    (ValueError, r'dropout: level must be in \[0, 1\), got -0.1', lambda: K.dropout(_x(), -0.1)),
    (TypeError, 'dropout: level must be a number', lambda: K.dropout(_x(), '0.5')),
    (TypeError, 'dropout: level must be a number in', lambda: K.dropout(_x(), K.constant(0.5))),
    (TypeError, 'dropout: x must be a float tensor',
     lambda: K.dropout(K.placeholder((2,), dtype='int32'), 0.5)),
    (ValueError, 'dropout: noise_shape .* does not broadcast', lambda: K.dropout(_x(), 0.5, noise_shape=(None, 3))),
    (ValueError, 'dropout: noise_shape .* one entry per axis', lambda: K.dropout(_x(), 0.5, noise_shape=(None,))),
    (TypeError, 'dropout: noise_shape must be', lambda: K.dropout(_x(), 0.5, noise_shape='full')),
    (TypeError, 'random_normal: dtype must be a float type', lambda: K.random_normal((2,), dtype='int32')),
    (ValueError, 'random_normal: stddev must be >= 0', lambda: K.random_normal((2,), stddev=-1.0)),
    (TypeError, 'random_normal: mean must be a number', lambda: K.random_normal((2,), mean='zero')),
    (ValueError, 'random_normal: mean must be a scalar', lambda: K.random_normal((2,), mean=K.ones((2,)))),
    (TypeError, 'truncated_normal: seed must be an int', lambda: K.truncated_normal((2,), seed='7')),
    (ValueError, 'random_uniform: shape entries must be non-negative', lambda: K.random_uniform((2, -1))),
    (TypeError, 'random_uniform: shape must be', lambda: K.random_uniform('2x2')),
    (TypeError, 'random_uniform: a shape tensor must have an integer dtype',
     lambda: K.random_uniform(K.ones((2,)))),
    (ValueError, 'random_uniform: minval must be <= maxval', lambda: K.random_uniform((2,), 1.0, 0.0)),
    (ValueError, 'random_uniform: minval must be < maxval',
     lambda: K.random_uniform((2,), 3, 3, dtype='int32')),
    (TypeError, 'random_uniform: maxval must be an integral number',
     lambda: K.random_uniform((2,), 0, 2.5, dtype='int32')),
    (TypeError, 'random_uniform: dtype must be a float or integer type',
     lambda: K.random_uniform((2,), dtype='bool')),
    (ValueError, r'random_binomial: p must be in \[0, 1\], got 1.5', lambda: K.random_binomial((2,), p=1.5)),
    (ValueError, r'random_bernoulli: p must be in \[0, 1\]', lambda: K.random_bernoulli((2,), p=-0.5)),
    (ValueError, 'random_normal_variable: shape .* has None entries',
     lambda: K.random_normal_variable((None, 2), 0, 1)),
    (ValueError, 'random_normal_variable: shape must be fully known',
     lambda: K.random_normal_variable(K.shape(_x()), 0, 1)),
    (ValueError, 'random_normal_variable: scale must be >= 0', lambda: K.random_normal_variable((2,), 0, -1)),
    (ValueError, 'random_uniform_variable: low must be <= high', lambda: K.random_uniform_variable((2,), 1, 0)),
    (TypeError, 'random_uniform_variable: dtype must be a float type',
     lambda: K.random_uniform_variable((2,), 0, 1, dtype='int64')),
]


@pytest.mark.parametrize('error, message, call', BAD_ARGUMENTS, ids=[m for _, m, _ in BAD_ARGUMENTS])
def test_bad_arguments_name_function_and_argument(error, message, call):
    with pytest.raises(error, match=message):
        call()
