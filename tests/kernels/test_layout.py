"""The layout transpose (gpuk/kernels/layout.py, layout.cu) and the channels_first convolutions
that run through it, on every kernel runtime.

A transpose moves bytes, so results must equal NumPy's moveaxis bit for bit. Shapes are odd
so that every tile has right and bottom tails; a few are multiples of the 16-byte vector
(the vector path) and a misaligned view forces the scalar path on the same shape.
"""
import ml_dtypes
import numpy as np
import pytest

from gpuk.cpu_fallback import conv as twin
from gpuk.kernels import conv, layout
from gpuk.kernels.runtime import emulated_runtime
from gpuk.kernels.testing import to_device, to_host

DTYPES = [np.float16, np.dtype(ml_dtypes.bfloat16), np.float32, np.float64]
DTYPE_IDS = [np.dtype(d).name for d in DTYPES]
# (N, C, *spatial): 1-d, 2-d, 3-d; odd sizes (tails on both tile sides, planes with fewer
# rows or columns than a tile: the thin kernel both ways, odd and even short sides, several
# wide tiles per plane in 3x30x40); the last two are multiples of 8 (the vector path).
SHAPES = [(2, 5, 7), (3, 70, 9, 11), (1, 3, 4, 5, 6), (2, 3, 30, 40), (2, 6, 7, 9), (2, 16, 8, 9), (2, 8, 16, 8)]


def _bits(a):
    return to_host(a).view(np.uint8)


def _random(shape, dtype, seed=0):
    return np.random.default_rng(seed).standard_normal(shape).astype(dtype)


@pytest.mark.parametrize('dtype', DTYPES, ids=DTYPE_IDS)
@pytest.mark.parametrize('shape', SHAPES, ids=['x'.join(map(str, s)) for s in SHAPES])
def test_transpose_both_ways_equals_moveaxis(kernel_runtime, shape, dtype):
    x = _random(shape, dtype)
    last = layout.to_channels_last(to_device(kernel_runtime, x), runtime=kernel_runtime)
    expected = np.ascontiguousarray(np.moveaxis(x, 1, -1))
    assert last.shape == expected.shape and last.dtype == x.dtype
    np.testing.assert_array_equal(_bits(last), expected.view(np.uint8))
    first = layout.to_channels_first(last, runtime=kernel_runtime)
    assert first.shape == x.shape
    np.testing.assert_array_equal(_bits(first), x.view(np.uint8))


@pytest.mark.parametrize('dtype', [np.float16, np.float32, np.float64], ids=['float16', 'float32', 'float64'])
def test_vector_friendly_planes_move_16_bytes_per_access(emulator, dtype):
    """Row lengths that are multiples of 16 bytes: 16-byte accesses (more bytes per warp
    request than 32 lanes of single elements can carry); one channel fewer: element by
    element (2-byte elements along the long side in 4-byte pairs). Both exact."""
    itemsize = np.dtype(dtype).itemsize
    per_request = {}
    for channels in (16, 15):
        x = _random((2, channels, 8, 8), dtype)
        with emulated_runtime.counting() as launches:
            out = layout.to_channels_last(x, runtime=emulator)
        np.testing.assert_array_equal(out.view(np.uint8), np.moveaxis(x, 1, -1).copy().view(np.uint8))
        (launch,) = launches
        moved = launch['global_load_bytes'] + launch['global_store_bytes']
        per_request[channels] = moved / launch['global_requests']
    assert per_request[16] > 32 * max(itemsize, 4) >= per_request[15], per_request


def test_empty_arrays_and_planes_of_one_row_or_column_launch_nothing(emulator):
    """Nothing to move: empty arrays, one channel (grayscale images), one spatial position
    (after global pooling): the result has the new shape and the same values."""
    one_channel, one_pixel = _random((2, 1, 5, 3), np.float32), _random((3, 1, 1, 6), np.float32)
    with emulated_runtime.counting() as launches:
        out = layout.to_channels_last(np.zeros((0, 3, 4), np.float32), runtime=emulator)
        back = layout.to_channels_first(np.zeros((2, 0, 5), np.float32), runtime=emulator)
        gray = layout.to_channels_last(one_channel, runtime=emulator)
        pooled = layout.to_channels_first(one_pixel, runtime=emulator)
    assert out.shape == (0, 4, 3) and back.shape == (2, 5, 0) and launches == []
    np.testing.assert_array_equal(gray, np.moveaxis(one_channel, 1, -1))
    np.testing.assert_array_equal(pooled, np.moveaxis(one_pixel, -1, 1))


def test_bad_input_names_the_function(emulator):
    with pytest.raises(TypeError, match=r'to_channels_last: x must be a numpy.ndarray, got list'):
        layout.to_channels_last([[[1.0]]], runtime=emulator)
    with pytest.raises(ValueError, match=r'to_channels_first: x must have 3 to 5 dimensions.*\(2, 3\)'):
        layout.to_channels_first(np.zeros((2, 3), np.float32), runtime=emulator)
    with pytest.raises(TypeError, match=r'to_channels_last: x.dtype must have 2, 4 or 8 bytes.*int8'):
        layout.to_channels_last(np.zeros((1, 2, 3), np.int8), runtime=emulator)


def test_channels_first_convolutions_run_channels_last_between_transposes(emulator):
    """conv_fwd / dgrad / wgrad in channels_first: the activations are transposed in, the
    implicit GEMM runs channels_last, the activation result is transposed back; results
    equal the twin's (the fused bias/ReLU epilogue included)."""
    rng = np.random.default_rng(1)
    x = rng.standard_normal((2, 6, 5, 7)).astype(np.float32)
    w = rng.standard_normal((3, 3, 6, 10)).astype(np.float32)
    bias = rng.standard_normal(10).astype(np.float32)
    geometry = ((1, 2), (1, 1), ((1, 1), (1, 1)), 'channels_first')
    y = twin.conv_fwd(x, w, *geometry)
    dy = rng.standard_normal(y.shape).astype(np.float32)
    calls = {
        'fwd': (lambda: conv.conv_fwd(x, w, *geometry, epilogue='bias_relu', bias=bias, runtime=emulator),
                np.maximum(y + bias[:, None, None], 0)),
        'dgrad': (lambda: conv.conv_dgrad(dy, w, x.shape, *geometry, runtime=emulator),
                  twin.conv_dgrad(dy, w, x.shape, *geometry)),
        'wgrad': (lambda: conv.conv_wgrad(x, dy, w.shape, *geometry, runtime=emulator),
                  twin.conv_wgrad(x, dy, w.shape, *geometry)),
    }
    expected_kernels = {
        'fwd': ['transpose', 'conv_igemm_fwd', 'transpose'],
        'dgrad': ['transpose', 'conv_igemm_dgrad', 'transpose'],
        'wgrad': ['transpose', 'transpose', 'conv_igemm_wgrad'],
    }
    for name, (call, reference) in calls.items():
        with emulated_runtime.counting() as launches:
            out = call()
        kernels = ['transpose' if launch['kernel'].startswith('transpose_planes') else launch['kernel']
                   for launch in launches if launch['kernel'] != 'conv_reduce_splits']
        assert kernels == expected_kernels[name], name
        np.testing.assert_allclose(out, reference, rtol=1e-5, atol=1e-5 * np.abs(reference).max())



def test_the_inspect_shapes_coalesce_without_bank_conflicts():
    """The emulated figures gpuk.kernels.inspect reports for the transposes (a ResNet-50-like
    activation and an RGB image, each way): every sector moved is one the data needs, and
    shared memory serves each request in one wavefront per phase (the 16-bit thin kernel too:
    it moves the long side's elements in 4-byte pairs through a packed tile)."""
    from gpuk.kernels.inspect import emulated
    records = emulated.measure(['layout'])
    assert {r['kernel'] for r in records} == {'transpose_planes', 'transpose_planes_thin'}
    for r in records:
        assert r['coalescing'] == 1.0 and r['global_bytes'] == r['compulsory_bytes'], r['config']
        assert r['bank_conflicts_per_request'] == 0.0, r['config']
