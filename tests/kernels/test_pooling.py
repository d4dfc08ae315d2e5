"""pooling kernels against their NumPy twins on every kernel runtime, plus the pure-Python
translation of the cuDNN legacy pooling path (descriptor arguments, stride/padding)."""
import numpy as np
import pytest

from gpuk.cpu_fallback import pooling as twin
from gpuk.kernels import dispatch, pooling
from gpuk.kernels.cudnn import pooling as cudnn_pooling
from gpuk.kernels.testing import assert_close, assert_matches_twin, to_device, to_host

DTYPES = [np.float16, np.float32, np.float64]


def _shape(n, spatial, c, data_format):
    return (n, c) + spatial if data_format == 'channels_first' else (n,) + spatial + (c,)


def _tie_free(shape, dtype, seed):
    """A permutation of distinct values, exactly representable in float16."""
    size = int(np.prod(shape))
    values = np.random.default_rng(seed).permutation(size).astype(np.float64)
    values = (values - size / 2) / max(size // 1024, 1) / 8   # float16 keeps 11 bits
    return values.reshape(shape).astype(dtype)


# (n, spatial, channels, window, strides, pads): 1-d / 2-d / 3-d, odd channels, windows
# larger than strides, padding (even and uneven), N = 1, vectorizable channel counts.
CASES = [
    (2, (9,), 3, (3,), (2,), ((1, 1),)),
    (1, (7, 6), 5, (3, 3), (2, 2), ((1, 1), (0, 1))),
    (2, (5, 7), 8, (2, 3), (1, 2), ((0, 0), (1, 1))),
    (1, (6, 6), 16, (2, 2), (2, 2), ((0, 0), (0, 0))),
    (1, (4, 5, 3), 3, (2, 3, 2), (2, 1, 1), ((1, 0), (1, 1), (0, 1))),
]
IDS = ['1d', '2d-odd-pad', '2d-c8', '2d-c16-tile', '3d']


@pytest.mark.parametrize('data_format', ['channels_last', 'channels_first'])
@pytest.mark.parametrize('dtype', DTYPES)
@pytest.mark.parametrize('n, spatial, c, window, strides, pads', CASES, ids=IDS)
def test_max_pool_matches_twin(kernel_runtime, dtype, data_format, n, spatial, c, window, strides, pads):
    x = _tie_free(_shape(n, spatial, c, data_format), dtype, seed=len(spatial) * 31 + c)
    args = (x, window, strides, pads, data_format)
    y, argmax = (to_host(a) for a in pooling.max_pool_fwd(to_device(kernel_runtime, x), *args[1:],
                                                          runtime=kernel_runtime))
    y_ref, argmax_ref = twin.max_pool_fwd(*args)
    np.testing.assert_array_equal(y, y_ref)           # max is exact
    np.testing.assert_array_equal(argmax, argmax_ref)
    assert argmax.dtype == np.uint8 and y.dtype == dtype
    dy = np.random.default_rng(5).standard_normal(y.shape).astype(dtype)
    dx = assert_matches_twin(pooling.max_pool_bwd, twin.max_pool_bwd,
                             (dy, argmax_ref, x.shape, window, strides, pads, data_format), kernel_runtime)
    # the gather adds in the twin's order, in the same precision: equal bit for bit
    np.testing.assert_array_equal(dx, twin.max_pool_bwd(dy, argmax_ref, x.shape, window, strides, pads,
                                                        data_format))


@pytest.mark.parametrize('data_format', ['channels_last', 'channels_first'])
@pytest.mark.parametrize('dtype', DTYPES)
@pytest.mark.parametrize('n, spatial, c, window, strides, pads', CASES, ids=IDS)
def test_avg_pool_matches_twin(kernel_runtime, dtype, data_format, n, spatial, c, window, strides, pads):
    rng = np.random.default_rng(len(spatial) * 7 + c)
    x = rng.standard_normal(_shape(n, spatial, c, data_format)).astype(dtype)
    y = assert_matches_twin(pooling.avg_pool_fwd, twin.avg_pool_fwd, (x, window, strides, pads, data_format),
                            kernel_runtime)
    dy = rng.standard_normal(y.shape).astype(dtype)
    assert_matches_twin(pooling.avg_pool_bwd, twin.avg_pool_bwd,
                        (dy, x.shape, window, strides, pads, data_format), kernel_runtime)


@pytest.mark.parametrize('data_format', ['channels_last', 'channels_first'])
@pytest.mark.parametrize('dtype', DTYPES)
@pytest.mark.parametrize('n, spatial, c', [(3, (7, 7), 37), (1, (5,), 64), (2, (2, 3, 4), 8)])
def test_global_avg_pool_reduction(kernel_runtime, dtype, data_format, n, spatial, c):
    x = np.random.default_rng(c).standard_normal(_shape(n, spatial, c, data_format)).astype(dtype) + 3
    problem = pooling._Problem(n, c, data_format == 'channels_first', spatial, (1,) * len(spatial), spatial,
                               spatial, ((0, 0),) * len(spatial), dtype)
    assert problem.is_global     # so the reduction kernel, not the window loop, runs
    args = (x, spatial, (1,) * len(spatial), ((0, 0),) * len(spatial), data_format)
    assert_matches_twin(pooling.avg_pool_fwd, twin.avg_pool_fwd, args, kernel_runtime)


def test_max_pool_all_neg_inf_window_and_nan(kernel_runtime):
    x = np.full((1, 1, 4, 4), -np.inf, np.float32)
    x[0, 0, 3, 3] = 1.0
    x[0, 0, 0, 3] = np.nan
    args = (x, (2, 2), (2, 2), ((1, 1), (1, 1)), 'channels_first')
    y, argmax = pooling.max_pool_fwd(to_device(kernel_runtime, x), *args[1:], runtime=kernel_runtime)
    y_ref, argmax_ref = twin.max_pool_fwd(*args)
    np.testing.assert_array_equal(to_host(y), y_ref)
    np.testing.assert_array_equal(to_host(argmax), argmax_ref)


def test_vectorized_path_on_unaligned_view_falls_back(kernel_runtime):
    """A channels-last view whose base is not 16-byte aligned must still pool correctly."""
    base = _tie_free((1 + 2 * 5 * 5 * 8,), np.float32, seed=3)
    x = base[1:].reshape(2, 5, 5, 8)
    args = (x, (2, 2), (1, 1), ((0, 0), (0, 0)), 'channels_last')
    y, argmax = pooling.max_pool_fwd(to_device(kernel_runtime, x), *args[1:], runtime=kernel_runtime)
    np.testing.assert_array_equal(to_host(argmax), twin.max_pool_fwd(*args)[1])
    dy_base = _tie_free((1 + 2 * 4 * 4 * 8,), np.float32, seed=4)
    dy = dy_base[1:].reshape(2, 4, 4, 8)                  # the backward's unaligned dy
    taps = twin.max_pool_fwd(*args)[1]
    dx = pooling.max_pool_bwd(to_device(kernel_runtime, dy), to_device(kernel_runtime, taps), x.shape, *args[1:],
                              runtime=kernel_runtime)
    np.testing.assert_array_equal(to_host(dx), twin.max_pool_bwd(dy, taps, x.shape, *args[1:]))
    assert pooling.layout_code(False, 8, np.float32) == pooling.LAYOUT_CHANNELS_LAST_VEC
    assert pooling.layout_code(False, 6, np.float32) == pooling.LAYOUT_CHANNELS_LAST
    assert pooling.layout_code(False, 8, np.float16) == pooling.LAYOUT_CHANNELS_LAST_VEC


def test_geometry_lifts_to_three_dims():
    args = pooling.geometry_args(2, 3, (9,), (5,), (3,), (2,), ((1, 1),))
    assert [int(a) for a in args] == [2, 3, 1, 1, 9, 1, 1, 5, 1, 1, 3, 1, 1, 2, 0, 0, 1]
    assert all(a.dtype == np.int32 for a in args)


# ---------------------------------------------------------------- bad input

@pytest.mark.parametrize('module', [pooling, twin])
def test_bad_input_raises_before_launch(module):
    kw = {'runtime': 'emulate'} if module is pooling else {}
    x = np.zeros((1, 4, 4, 3), np.float32)
    cl = 'channels_last'
    with pytest.raises(ValueError, match=r"max_pool_fwd: data_format must be 'channels_first' or "
                                         r"'channels_last', got 'nhwc'"):
        module.max_pool_fwd(x, 2, 2, ((0, 0), (0, 0)), 'nhwc', **kw)
    with pytest.raises(ValueError, match=r"avg_pool_fwd: padded input spatial size 4 .* smaller than the window"):
        module.avg_pool_fwd(x, (5, 5), (1, 1), ((0, 0), (0, 0)), cl, **kw)
    with pytest.raises(ValueError, match=r"max_pool_fwd: strides must be >= 1 in every dimension, got \(0, 1\)"):
        module.max_pool_fwd(x, 2, (0, 1), ((0, 0), (0, 0)), cl, **kw)
    with pytest.raises(ValueError, match=r"max_pool_fwd: strides must be >= 1 in every dimension, got -1"):
        module.max_pool_fwd(x, 2, -1, ((0, 0), (0, 0)), cl, **kw)
    with pytest.raises(TypeError, match=r"max_pool_fwd: x must be a float16, float32 or float64 array, got dtype int32"):
        module.max_pool_fwd(x.astype(np.int32), 2, 2, ((0, 0), (0, 0)), cl, **kw)
    with pytest.raises(ValueError, match=r"avg_pool_fwd: x must have rank 3, 4 or 5"):
        module.avg_pool_fwd(x[0, 0], 2, 2, ((0, 0),), cl, **kw)
    with pytest.raises(ValueError, match=r"max_pool_fwd: pads .* must be smaller than window"):
        module.max_pool_fwd(x, 2, 1, ((2, 0), (0, 0)), cl, **kw)
    dy = np.zeros((1, 2, 2, 3), np.float32)
    geometry = (2, 2, ((0, 0), (0, 0)), cl)
    with pytest.raises(TypeError, match=r"max_pool_bwd: argmax must be an integer array, got dtype float32"):
        module.max_pool_bwd(dy, dy, x.shape, *geometry, **kw)
    with pytest.raises(ValueError, match=r"max_pool_bwd: argmax shape .* and dy shape .* differ"):
        module.max_pool_bwd(dy, np.zeros((1, 2, 2, 2), np.uint8), x.shape, *geometry, **kw)
    with pytest.raises(ValueError, match=r"max_pool_bwd: dy spatial shape \(2, 2\) does not match .* \(3, 3\)"):
        module.max_pool_bwd(dy, np.zeros(dy.shape, np.uint8), x.shape, 2, 1, ((0, 0), (0, 0)), cl, **kw)
    with pytest.raises(ValueError, match=r"avg_pool_bwd: dy spatial shape \(2, 2\) does not match .* \(3, 3\)"):
        module.avg_pool_bwd(dy, x.shape, 2, 1, ((0, 0), (0, 0)), cl, **kw)


# ---------------------------------------------------------------- cuDNN translation (CPU)

def test_cudnn_pool_problem_and_descriptors():
    problem = cudnn_pooling.pool_problem('f', (2, 9, 3), (3,), (2,), ((1, 1),), 'channels_last')
    assert problem.lifted and problem.x_shape == (2, 1, 9, 3) and problem.y_shape == (2, 1, 5, 3)
    assert cudnn_pooling.pooling_descriptor_args(problem, 'avg') == (
        cudnn_pooling.CUDNN_POOLING_AVERAGE_COUNT_EXCLUDE_PADDING, 1, 2, [1, 3], [0, 1], [1, 2])
    assert cudnn_pooling.pooling_descriptor_args(problem, 'max')[0] == cudnn_pooling.CUDNN_POOLING_MAX_DETERMINISTIC
    # NHWC memory described in NCHW order with strides; NCHW packed
    assert cudnn_pooling.tensor_descriptor_args((2, 4, 5, 3), True, 'float16') == (2, 4, [2, 3, 4, 5], [60, 1, 15, 3])
    assert cudnn_pooling.tensor_descriptor_args((2, 3, 4, 5), False, 'float64') == (1, 4, [2, 3, 4, 5], [60, 20, 5, 1])
    p3 = cudnn_pooling.pool_problem('f', (1, 2, 8, 8, 8), 2, 2, ((0, 0),) * 3, 'channels_first')
    assert p3.y_shape == (1, 2, 4, 4, 4) and p3.pads == (0, 0, 0)
    with pytest.raises(dispatch.Unsupported, match='symmetric padding'):
        cudnn_pooling.pool_problem('f', (1, 7, 7, 3), 3, 2, ((0, 1), (0, 1)), 'channels_last')
    with pytest.raises(dispatch.Unsupported, match='argmax'):
        cudnn_pooling.max_pool_fwd(None, 2, 2, ((0, 0), (0, 0)), 'channels_last')
    with pytest.raises(ValueError, match="mode must be 'max' or 'avg'"):
        cudnn_pooling.pooling_descriptor_args(problem, 'median')


def test_cudnn_max_bwd_maps_only_tiling_windows():
    dy, taps = np.zeros((1, 3, 3, 2), np.float32), np.zeros((1, 3, 3, 2), np.uint8)
    for window, strides, pads in (((3, 3), (2, 2), ((1, 1), (1, 1))), ((2, 2), (2, 2), ((1, 0), (1, 0))),
                                  ((2, 3), (2, 2), ((0, 0), (0, 0)))):
        with pytest.raises(dispatch.Unsupported, match='window == strides, no padding'):
            cudnn_pooling.max_pool_bwd(dy, taps, (1, 6, 6, 2), window, strides, pads, 'channels_last')


@pytest.mark.gpu
@pytest.mark.parametrize('data_format', ['channels_last', 'channels_first'])
def test_cudnn_pooling_matches_twin(data_format):
    from gpuk.kernels.cudnn import library as cudnn_library
    if not cudnn_library.available():
        pytest.skip(cudnn_library.why_unavailable())
    import cupy
    x = _tie_free(_shape(2, (8, 8), 5, data_format), np.float32, seed=9)
    pads = ((1, 1), (1, 1))
    y = cudnn_pooling.avg_pool_fwd(cupy.asarray(x), 3, 2, pads, data_format)
    assert_close(y, twin.avg_pool_fwd(x.astype(np.float64), 3, 2, pads, data_format), np.float32)
    dy = np.random.default_rng(2).standard_normal(y.shape).astype(np.float32)
    dx = cudnn_pooling.avg_pool_bwd(cupy.asarray(dy), x.shape, 3, 2, pads, data_format)
    assert_close(dx, twin.avg_pool_bwd(dy.astype(np.float64), x.shape, 3, 2, pads, data_format), np.float32)
    tiles = ((2, 2), (2, 2), ((0, 0), (0, 0)))
    _, argmax = twin.max_pool_fwd(x, *tiles, data_format)
    dy = np.random.default_rng(3).standard_normal(argmax.shape).astype(np.float32)
    dx = cudnn_pooling.max_pool_bwd(cupy.asarray(dy), cupy.asarray(argmax), x.shape, *tiles, data_format)
    assert_close(dx, twin.max_pool_bwd(dy.astype(np.float64), argmax, x.shape, *tiles, data_format), np.float32)


# ---------------------------------------------------------------- max-pool backward: the gather

@pytest.mark.parametrize('dtype', [np.float32, np.float64])
@pytest.mark.parametrize('data_format', ['channels_last', 'channels_first'])
def test_max_pool_bwd_keeps_subnormal_gradients(kernel_runtime, dtype, data_format):
    """Subnormal dy reach dx unchanged, and sums of them round as plain adds would (the old
    atomicAdd(float) scatter flushed them to zero)."""
    tiny = np.finfo(dtype).smallest_subnormal
    x = _tie_free(_shape(1, (5, 5), 4, data_format), dtype, seed=21)
    geometry = ((3, 3), (1, 1), ((1, 1), (1, 1)), data_format)   # overlapping: winners shared
    _, argmax = twin.max_pool_fwd(x, *geometry)
    dy = (np.arange(1, argmax.size + 1).reshape(argmax.shape) % 7 * tiny).astype(dtype)
    dx = to_host(pooling.max_pool_bwd(to_device(kernel_runtime, dy), to_device(kernel_runtime, argmax), x.shape,
                                      *geometry, runtime=kernel_runtime))
    expected = twin.max_pool_bwd(dy, argmax, x.shape, *geometry)
    np.testing.assert_array_equal(dx, expected)
    assert dx.sum() == dy.sum() and (np.abs(dx[dx != 0]) < np.finfo(dtype).tiny).any()


@pytest.mark.parametrize('dtype', DTYPES)
def test_max_pool_bwd_overlapping_windows_are_bit_identical_across_runs(kernel_runtime, dtype):
    rng = np.random.default_rng(4)
    x = rng.integers(-2, 3, (2, 7, 6, 8)).astype(dtype)     # many ties: windows share winners
    geometry = ((3, 3), (1, 2), ((1, 1), (1, 1)), 'channels_last')
    _, argmax = pooling.max_pool_fwd(to_device(kernel_runtime, x), *geometry, runtime=kernel_runtime)
    dy = to_device(kernel_runtime, rng.standard_normal(to_host(argmax).shape).astype(dtype) * 1e3)
    runs = [to_host(pooling.max_pool_bwd(dy, argmax, x.shape, *geometry, runtime=kernel_runtime)).tobytes()
            for _ in range(3)]
    assert runs[0] == runs[1] == runs[2]
    assert runs[0] == twin.max_pool_bwd(to_host(dy), to_host(argmax), x.shape, *geometry).tobytes()


def test_wide_windows_use_int32_taps(kernel_runtime):
    x = _tie_free((1, 18, 17, 2), np.float32, seed=8)
    geometry = ((17, 16), (1, 1), ((8, 8), (8, 7)), 'channels_last')   # 272 taps: past uint8
    y, argmax = (to_host(a) for a in pooling.max_pool_fwd(to_device(kernel_runtime, x), *geometry,
                                                          runtime=kernel_runtime))
    y_ref, argmax_ref = twin.max_pool_fwd(x, *geometry)
    assert argmax.dtype == np.int32 and argmax.max() > 255
    np.testing.assert_array_equal(y, y_ref)
    np.testing.assert_array_equal(argmax, argmax_ref)
    dy = np.random.default_rng(2).standard_normal(y.shape).astype(np.float32)
    assert_matches_twin(pooling.max_pool_bwd, twin.max_pool_bwd, (dy, argmax, x.shape) + geometry, kernel_runtime)


def test_taps_outside_the_window_add_nothing(kernel_runtime):
    """argmax values are never read on the host (no sync); a tap past the window (or on the
    padding) matches no input, in the kernels and the twin alike."""
    x_shape, geometry = (1, 4, 4, 1), ((2, 2), (2, 2), ((1, 1), (1, 1)), 'channels_last')
    taps = np.array([0, 3, 200, 3, 1, 2, 3, 0, 9], np.uint8).reshape(1, 3, 3, 1)
    dy = np.arange(1, 10, dtype=np.float32).reshape(1, 3, 3, 1)
    dx = to_host(pooling.max_pool_bwd(to_device(kernel_runtime, dy), to_device(kernel_runtime, taps), x_shape,
                                      *geometry, runtime=kernel_runtime))
    np.testing.assert_array_equal(dx, twin.max_pool_bwd(dy, taps, x_shape, *geometry))
    # output (0, 0) covers only input (0, 0) (tap 3); its tap 0 is padding: nothing added there
    assert dx[0, 0, 0, 0] == 0 and dx.sum() == dy.sum() - 1 - 3 - 7 - 9   # outputs (0,0), (0,2), (2,0), (2,2)
