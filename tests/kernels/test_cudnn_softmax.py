"""gpuk.kernels.cudnn.softmax (cuDNN softmax / log-softmax) and the 'softmax_xent' family's
dispatch: the tensor mapping is checked on the CPU by doing cuDNN's channel softmax over
the very buffer and strides it would get; the dispatch with a stand-in CUDA runtime (the
emulator under kind 'cuda'); the real cuDNN calls are `gpu` tests against the twin."""
import sys
import warnings

import ml_dtypes
import numpy as np
import pytest
from numpy.lib.stride_tricks import as_strided

from gpuk import config
from gpuk.cpu_fallback import softmax_xent as twin
from gpuk.kernels import dispatch, softmax_xent
from gpuk.kernels.cudnn import library as cudnn_library
from gpuk.kernels.cudnn import softmax as cudnn_softmax

SHAPES = [((7, 10), -1), ((7, 10), 0), ((2, 3, 4, 5), 1), ((2, 3, 4, 5), 2), ((5,), 0), ((3, 1), 1)]


def _channel_view(x, axis):
    """The (N, C, H, W) tensor cuDNN reads from x's buffer with our dims and strides."""
    data_type, dims, strides = cudnn_softmax.tensor_args(x.shape, axis % x.ndim, x.dtype.name)
    assert data_type == cudnn_library.DATA_TYPES[x.dtype.name]
    return as_strided(x, shape=dims, strides=[s * x.itemsize for s in strides])


@pytest.mark.parametrize('shape, axis', SHAPES)
def test_channel_mode_on_our_tensor_is_the_twins_softmax(rng, shape, axis):
    x = rng.standard_normal(shape)
    v = _channel_view(x, axis)          # CUDNN_SOFTMAX_MODE_CHANNEL: over C at each (n, h, w)
    e = np.exp(v - v.max(axis=1, keepdims=True))
    y = np.empty_like(x)
    _channel_view(y, axis)[...] = e / e.sum(axis=1, keepdims=True)
    np.testing.assert_allclose(y, twin.softmax_fwd(x, axis), rtol=1e-13)
    log_y = np.empty_like(x)
    _channel_view(log_y, axis)[...] = np.log(e / e.sum(axis=1, keepdims=True))
    np.testing.assert_allclose(log_y, twin.log_softmax_fwd(x, axis), rtol=1e-12, atol=1e-13)
    dy = rng.standard_normal(shape)
    yv, dyv, dx = _channel_view(y, axis), _channel_view(dy, axis), np.empty_like(x)
    _channel_view(dx, axis)[...] = yv * (dyv - (dyv * yv).sum(axis=1, keepdims=True))
    np.testing.assert_allclose(dx, twin.softmax_bwd(y, dy, axis), rtol=1e-12, atol=1e-13)


def test_tensor_args_limits():
    with pytest.raises(TypeError, match='cudnn_softmax: arrays must be float16, float32 or float64, got int32'):
        cudnn_softmax.tensor_args((2, 3), 1, 'int32')
    with pytest.raises(dispatch.Unsupported, match='fewer than 2\\^31 elements'):
        cudnn_softmax.tensor_args((1 << 16, 1 << 15), 1, 'float32')
    assert cudnn_softmax.tensor_args((4, 5, 6), 1, 'float16') == (2, (4, 5, 6, 1), (30, 6, 1, 1))


# ---------------------------------------------------------------- the family's dispatch

@pytest.mark.parametrize('name, args', [
    ('softmax_fwd', ('x', 1)), ('log_softmax_fwd', ('x', 1)),
    ('softmax_bwd', ('y', 'dy', 0)), ('log_softmax_bwd', ('y', 'dy', 0))])
def test_softmax_runs_cudnn_when_chosen(cuda_standin, monkeypatch, rng, name, args):
    arrays = {'x': rng.standard_normal((3, 4)), 'y': rng.random((3, 4)), 'dy': rng.standard_normal((3, 4))}
    args = tuple(arrays.get(a, a) if isinstance(a, str) else a for a in args)
    calls = []
    monkeypatch.setattr(cudnn_softmax, name, lambda *a: calls.append(a) or 'cudnn result')
    config.set_kernels(softmax_xent='cudnn')
    assert getattr(softmax_xent, name)(*args, runtime=cuda_standin) == 'cudnn result'
    assert len(calls) == 1 and all(c is a for c, a in zip(calls[0], args))
    config.set_kernels(softmax_xent='gpuk')
    np.testing.assert_allclose(getattr(softmax_xent, name)(*args, runtime=cuda_standin),
                               getattr(twin, name)(*args), rtol=1e-12)
    assert len(calls) == 1


def test_bfloat16_softmax_falls_back_to_gpuk(cuda_standin, monkeypatch, rng):
    monkeypatch.setitem(sys.modules, 'cupy', np)    # cudnn_softmax's array handling, on the host
    config.set_kernels(softmax_xent='cudnn')
    x = rng.standard_normal((3, 8)).astype(ml_dtypes.bfloat16)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter('always')
        y = softmax_xent.softmax_fwd(x, runtime=cuda_standin)
    assert [str(w.message) for w in caught] == [
        "gpuk: cuDNN cannot run this softmax_xent problem (%s); using gpuk's kernel" % cudnn_softmax.NO_BFLOAT16]
    assert y.dtype == ml_dtypes.bfloat16
    np.testing.assert_array_equal(y, softmax_xent.softmax_fwd(x, runtime='emulate'))


def test_cross_entropy_stays_gpuk_and_says_so_once(cuda_standin, rng):
    config.set_kernels(softmax_xent='cudnn')
    logits, target = rng.standard_normal((3, 5)), rng.random((3, 5))
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter('always')
        for _ in range(2):
            loss, lse = softmax_xent.softmax_xent_fwd(logits, target, runtime=cuda_standin)
            np.testing.assert_allclose(loss, twin.softmax_xent_fwd(logits, target)[0], rtol=1e-12)
        softmax_xent.binary_xent_logits_fwd(logits, target, runtime=cuda_standin)
    messages = [str(w.message) for w in caught]
    assert messages == ["gpuk: cuDNN cannot run this softmax_xent problem (%s); using gpuk's kernel"
                        % cudnn_softmax.NO_FUSED_CROSS_ENTROPY]


def test_cross_entropy_under_auto_times_nothing(cuda_standin, monkeypatch, rng):
    config.set_kernels(softmax_xent='auto')
    timed = []

    def fake_time(fn, args, kwargs):    # no CUDA events on the stand-in
        timed.append(fn)
        fn(*args, **kwargs)             # the cuDNN side raises Unsupported here
        return 1.0
    monkeypatch.setattr(dispatch, '_time', fake_time)
    logits, target = rng.standard_normal((3, 5)), rng.random((3, 5))
    with warnings.catch_warnings():
        warnings.simplefilter('error')      # auto falls back silently
        softmax_xent.softmax_xent_fwd(logits, target, runtime=cuda_standin)
    assert timed == [cudnn_softmax.fused_cross_entropy_unsupported]


# ---------------------------------------------------------------- on a GPU with cuDNN

@pytest.mark.gpu
@pytest.mark.parametrize('dtype, tol', [('float32', 1e-5), ('float16', 2e-3), ('float64', 1e-12)])
@pytest.mark.parametrize('shape, axis', SHAPES + [((64, 32000), -1), ((4, 0, 3), 2)])
def test_cudnn_softmax_matches_the_twin(rng, dtype, tol, shape, axis):
    if not cudnn_library.available():
        pytest.skip('cuDNN unavailable: %s' % cudnn_library.why_unavailable())
    import cupy
    x = (rng.standard_normal(shape) * 4).astype(dtype)
    dy = rng.standard_normal(shape).astype(dtype)
    x64, dy64 = x.astype(np.float64), dy.astype(np.float64)
    y_ref, log_y_ref = twin.softmax_fwd(x64, axis), twin.log_softmax_fwd(x64, axis)
    y = cudnn_softmax.softmax_fwd(cupy.asarray(x), axis)
    log_y = cudnn_softmax.log_softmax_fwd(cupy.asarray(x), axis)
    got = {'y': (y, y_ref), 'log_y': (log_y, log_y_ref),
           'dx': (cudnn_softmax.softmax_bwd(y, cupy.asarray(dy), axis),
                  twin.softmax_bwd(cupy.asnumpy(y).astype(np.float64), dy64, axis)),
           'dlog': (cudnn_softmax.log_softmax_bwd(log_y, cupy.asarray(dy), axis),
                    twin.log_softmax_bwd(cupy.asnumpy(log_y).astype(np.float64), dy64, axis))}
    for name, (value, ref) in got.items():
        value = cupy.asnumpy(value)
        assert value.dtype == np.dtype(dtype) and value.shape == ref.shape, name
        if ref.size:
            error = np.max(np.abs(value.astype(np.float64) - ref)) / max(np.max(np.abs(ref)), 1e-30)
            assert error < tol, (name, error)


@pytest.mark.gpu
def test_cudnn_softmax_errors_match_the_launcher():
    if not cudnn_library.available():
        pytest.skip('cuDNN unavailable: %s' % cudnn_library.why_unavailable())
    import cupy
    for fn in (cudnn_softmax.softmax_fwd, softmax_xent.softmax_fwd):
        with pytest.raises(TypeError, match='softmax_fwd: x must be a float16, bfloat16, float32 or float64 array, '
                                            'got dtype int32'):
            fn(cupy.zeros((2, 3), cupy.int32))
        with pytest.raises(ValueError, match='softmax_fwd: x must have at least one class along axis 1'):
            fn(cupy.zeros((2, 0), cupy.float32))
