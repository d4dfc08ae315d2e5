"""batchnorm kernels against their NumPy twins on every kernel runtime, plus the
pure-Python layout translation of the cuDNN Frontend path."""
import numpy as np
import pytest

from gpuk.cpu_fallback import batchnorm as twin
from gpuk.kernels import batchnorm, batchnorm_launch, dispatch
from gpuk.kernels.cudnn import batchnorm as cudnn_batchnorm
from gpuk.kernels.testing import assert_close, to_device, to_host
from gpuk.kernels.runtime import prepared

DTYPES = [np.float16, np.float32, np.float64]

# (x shape, reduced axes): channels last (NHWC, 2-d, 1-d conv), channels first (NCHW,
# NCDHW), odd channel counts, N = 1, non-channel axes (kept axes not contiguous: the
# transposed path; kept (0,); everything reduced).
CASES = [
    ((3, 5, 4, 7), (0, 1, 2)),
    ((1, 6, 5, 3), (0, 2, 3)),
    ((2, 3, 2, 3, 2), (0, 2, 3, 4)),
    ((37, 9), (0,)),
    ((2, 11, 5), (0, 1)),
    ((4, 6, 5), (1,)),
    ((5, 7, 3), (0, 2)),
    ((6, 4), (1,)),
    ((3, 4, 5), (0, 1, 2)),
]
IDS = ['nhwc', 'nchw-n1', 'ncdhw', '2d', 'nwc', 'axes-1-of-3d', 'kept-middle', 'kept-0', 'all']


def _params(rng, kept_shape, dtype):
    gamma = rng.uniform(0.5, 1.5, kept_shape).astype(dtype)
    beta = rng.standard_normal(kept_shape).astype(dtype)
    return gamma, beta


def _kept(shape, axes):
    return tuple(s for i, s in enumerate(shape) if i not in axes)


def _run(fn, rt, *args, **kwargs):
    out = fn(*[to_device(rt, a) for a in args], runtime=rt, **kwargs)
    return tuple(to_host(o) for o in out) if isinstance(out, tuple) else to_host(out)


def _as64(values):
    return [v.astype(np.float64) if isinstance(v, np.ndarray) else v for v in values]


@pytest.mark.parametrize('dtype', DTYPES)
@pytest.mark.parametrize('shape, axes', CASES, ids=IDS)
def test_bn_train_fwd_and_bwd_match_twin(kernel_runtime, dtype, shape, axes):
    rng = np.random.default_rng(len(shape) * 13 + shape[-1])
    x = (rng.standard_normal(shape) * 2 + 5).astype(dtype)    # an offset the shifted sums must absorb
    gamma, beta = _params(rng, _kept(shape, axes), dtype)
    outs = _run(batchnorm.bn_train_fwd, kernel_runtime, x, gamma, beta, axes, 1e-3)
    refs = twin.bn_train_fwd(*_as64([x, gamma, beta]), axes, 1e-3)
    twin_dtypes = [o.dtype for o in twin.bn_train_fwd(x, gamma, beta, axes, 1e-3)]
    for name, out, ref, want in zip(('y', 'mean', 'var', 'inv_std'), outs, refs, twin_dtypes):
        assert out.dtype == want and out.shape == ref.shape, name
        assert_close(out, ref, dtype, 'bn_train_fwd ' + name)

    _, mean, _, inv_std = twin.bn_train_fwd(x, gamma, beta, axes, 1e-3)
    dy = rng.standard_normal(shape).astype(dtype)
    dmean, dvar = (rng.standard_normal(mean.shape).astype(mean.dtype) for _ in range(2))
    for extra in ({}, {'dmean': dmean, 'dvar': dvar}):
        outs = _run(batchnorm.bn_bwd, kernel_runtime, dy, x, gamma, mean, inv_std, axes, **extra)
        refs = twin.bn_bwd(*_as64([dy, x, gamma, mean, inv_std]), axes,
                           **{k: v.astype(np.float64) for k, v in extra.items()})
        twin_dtypes = [o.dtype for o in twin.bn_bwd(dy, x, gamma, mean, inv_std, axes, **extra)]
        for name, out, ref, want in zip(('dx', 'dgamma', 'dbeta'), outs, refs, twin_dtypes):
            assert out.dtype == want and out.shape == ref.shape, name
            assert_close(out, ref, dtype, 'bn_bwd %s %s' % (name, sorted(extra)))


@pytest.mark.parametrize('layout', ['channels_last', 'channels_first'])
def test_many_splits_combine_in_order(kernel_runtime, monkeypatch, layout):
    """Force several blocks per channel so the second (combine) pass matters (the split path:
    no single-kernel forward)."""
    monkeypatch.setattr(batchnorm_launch, 'MIN_ROWS_PER_SPLIT', 3)
    monkeypatch.setattr(batchnorm_launch, 'MIN_PER_SPLIT', 40)
    shape, axes = ((50, 3, 7), (0, 1)) if layout == 'channels_last' else ((5, 3, 60), (0, 2))
    view = batchnorm_launch._View(shape, twin._Layout(shape, axes))
    assert batchnorm_launch._splits(view)[0] > 3
    rng = np.random.default_rng(1)
    x = (rng.standard_normal(shape) + 100).astype(np.float32)
    outs = _run(batchnorm.bn_train_fwd, kernel_runtime, x, None, None, axes, single_kernel=False)
    refs = twin.bn_train_fwd(x.astype(np.float64), None, None, axes)
    for out, ref in zip(outs, refs):
        assert_close(out, ref, np.float32)
    dy = rng.standard_normal(shape).astype(np.float32)
    _, mean, _, inv_std = twin.bn_train_fwd(x, None, None, axes)
    outs = _run(batchnorm.bn_bwd, kernel_runtime, dy, x, None, mean, inv_std, axes)
    for out, ref in zip(outs, twin.bn_bwd(dy.astype(np.float64), x.astype(np.float64), None, mean, inv_std, axes)):
        assert_close(out, ref, np.float32)


@pytest.mark.parametrize('dtype', DTYPES)
@pytest.mark.parametrize('shape, axis, param_shape', [
    ((3, 5, 4, 7), -1, (7,)), ((2, 6, 3, 3), 1, (6,)), ((2, 6, 3, 3), 1, (1, 6, 1, 1)),
    ((4, 9), 1, (9,)), ((9,), 0, (9,)), ((2, 3, 4), 1, (3, 4)), ((2, 3, 4), -1, (2, 1, 4))])
def test_bn_infer_fwd_matches_twin(kernel_runtime, dtype, shape, axis, param_shape):
    rng = np.random.default_rng(sum(shape))
    x = rng.standard_normal(shape).astype(dtype)
    mean = rng.standard_normal(param_shape).astype(dtype)
    var = rng.uniform(0.5, 2, param_shape).astype(dtype)
    gamma, beta = _params(rng, param_shape, dtype)
    for g, b in ((gamma, beta), (None, None)):
        out = _run(batchnorm.bn_infer_fwd, kernel_runtime, x, mean, var, g, b, 1e-3, axis)
        ref = twin.bn_infer_fwd(*_as64([x, mean, var, g, b]), 1e-3, axis)
        assert out.dtype == dtype and out.shape == shape
        assert_close(out, ref, dtype, 'bn_infer_fwd')


def test_parameter_span():
    assert batchnorm_launch.parameter_span((2, 3, 4), [(1, 3, 1)]) == (1, 2)
    assert batchnorm_launch.parameter_span((2, 3, 4), [(1, 3, 1), (2, 1, 4)]) == (0, 3)
    assert batchnorm_launch.parameter_span((2, 3, 4), [(1, 1, 1)]) == (0, 0)


def test_views():
    nchw = batchnorm_launch._View((2, 3, 4, 5), twin._Layout((2, 3, 4, 5), (0, 2, 3)))
    assert (nchw.outer, nchw.channels, nchw.inner, nchw.permutation) == (2, 3, 20, None)
    nhwc = batchnorm_launch._View((2, 4, 5, 3), twin._Layout((2, 4, 5, 3), (0, 1, 2)))
    assert (nhwc.outer, nhwc.channels, nhwc.inner) == (40, 3, 1)
    odd = batchnorm_launch._View((4, 6, 5), twin._Layout((4, 6, 5), (1,)))
    assert odd.permutation == (1, 0, 2) and (odd.outer, odd.channels, odd.inner) == (6, 20, 1)


# ---------------------------------------------------------------- bad input

@pytest.mark.parametrize('module', [batchnorm, twin])
def test_bad_input_raises_before_launch(module):
    kw = {'runtime': 'emulate'} if module is batchnorm else {}
    x = np.zeros((2, 3, 4), np.float32)
    with pytest.raises(ValueError, match=r"bn_train_fwd: gamma must have shape \(4,\) .* got shape \(3,\)"):
        module.bn_train_fwd(x, np.ones(3, np.float32), None, (0, 1), **kw)
    with pytest.raises(ValueError, match=r"bn_train_fwd: beta must have shape \(4,\)"):
        module.bn_train_fwd(x, None, np.ones(5, np.float32), (0, 1), **kw)
    with pytest.raises(ValueError, match=r"bn_train_fwd: axes must lie in \[-3, 3\) for x of rank 3, got \(0, 3\)"):
        module.bn_train_fwd(x, None, None, (0, 3), **kw)
    with pytest.raises(ValueError, match=r"bn_train_fwd: axes must not repeat an axis"):
        module.bn_train_fwd(x, None, None, (0, -3), **kw)
    with pytest.raises(TypeError, match=r"bn_train_fwd: axes must be a tuple of ints"):
        module.bn_train_fwd(x, None, None, 'batch', **kw)
    with pytest.raises(ValueError, match=r"bn_train_fwd: epsilon must be a number >= 0, got -1"):
        module.bn_train_fwd(x, None, None, (0,), -1, **kw)
    with pytest.raises(TypeError, match=r"bn_train_fwd: x must be a float16, float32 or float64 array, got dtype int64"):
        module.bn_train_fwd(x.astype(np.int64), None, None, (0,), **kw)
    with pytest.raises(ValueError, match=r"bn_train_fwd: x must have elements along the reduced axes"):
        module.bn_train_fwd(np.zeros((0, 3), np.float32), None, None, (0,), **kw)
    with pytest.raises(ValueError, match=r"bn_bwd: dy must have the shape of x"):
        module.bn_bwd(x[:1], x, None, np.zeros(4, np.float32), np.ones(4, np.float32), (0, 1), **kw)
    with pytest.raises(ValueError, match=r"bn_bwd: mean and inv_std .* are required"):
        module.bn_bwd(x, x, None, None, np.ones(4, np.float32), (0, 1), **kw)
    with pytest.raises(ValueError, match=r"bn_bwd: dvar must have shape \(4,\)"):
        module.bn_bwd(x, x, None, np.zeros(4, np.float32), np.ones(4, np.float32), (0, 1),
                      dvar=np.zeros(2, np.float32), **kw)
    with pytest.raises(ValueError, match=r"bn_infer_fwd: axis must be an int in \[-3, 3\) .* got 3"):
        module.bn_infer_fwd(x, np.zeros(4, np.float32), np.ones(4, np.float32), None, None, 1e-3, 3, **kw)
    with pytest.raises(ValueError, match=r"bn_infer_fwd: mean must have shape \(4,\) .* got shape \(5,\)"):
        module.bn_infer_fwd(x, np.zeros(5, np.float32), np.ones(4, np.float32), None, None, 1e-3, -1, **kw)
    with pytest.raises(ValueError, match=r"bn_infer_fwd: gamma of shape \(5, 1, 1\) would broadcast"):
        module.bn_infer_fwd(x[:1], np.zeros(4, np.float32), np.ones(4, np.float32), np.ones((5, 1, 1), np.float32),
                            None, 1e-3, -1, **kw)


# ---------------------------------------------------------------- cuDNN translation (CPU)

def test_cudnn_views_and_dims():
    assert cudnn_batchnorm.contiguous_view((8, 16, 5, 5), (0, 2, 3)) == (8, 16, 25)
    assert cudnn_batchnorm.contiguous_view((8, 5, 5, 16), (0, 1, 2)) == (200, 16, 1)
    assert cudnn_batchnorm.contiguous_view((4, 6, 5), (1,)) is None
    assert cudnn_batchnorm.contiguous_view((4, 6), (0, 1)) == (1, 1, 24)
    dims, strides, sdims, sstrides = cudnn_batchnorm.bn_dims(200, 16, 1)
    assert dims == [200, 16, 1, 1] and strides == [16, 1, 1, 1] and sdims == [1, 16, 1, 1]
    assert cudnn_batchnorm.bn_dims(8, 16, 25)[1] == [400, 25, 1, 1]
    assert cudnn_batchnorm.graph_key('train', 0, 'float16', (8, 16, 25), 'float32') != \
        cudnn_batchnorm.graph_key('train', 0, 'float32', (8, 16, 25), 'float32')


@pytest.mark.gpu
@pytest.mark.parametrize('shape, axes', [((4, 6, 5, 16), (0, 1, 2)), ((4, 16, 6, 5), (0, 2, 3))])
def test_cudnn_batchnorm_matches_twin(shape, axes):
    from gpuk.kernels.cudnn import library as cudnn_library
    if not cudnn_library.available():
        pytest.skip(cudnn_library.why_unavailable())
    import cupy
    rng = np.random.default_rng(0)
    x = rng.standard_normal(shape).astype(np.float32)
    gamma, beta = _params(rng, _kept(shape, axes), np.float32)
    outs = cudnn_batchnorm.bn_train_fwd(cupy.asarray(x), cupy.asarray(gamma), cupy.asarray(beta), axes, 1e-3)
    refs = twin.bn_train_fwd(*_as64([x, gamma, beta]), axes, 1e-3)
    for out, ref in zip(outs[:2] + outs[3:], refs[:2] + refs[3:]):
        assert_close(out, ref, np.float32)
    _, mean, _, inv_std = twin.bn_train_fwd(x, gamma, beta, axes, 1e-3)
    dy = rng.standard_normal(shape).astype(np.float32)
    outs = cudnn_batchnorm.bn_bwd(*[cupy.asarray(a) for a in (dy, x, gamma, mean, inv_std)], axes)
    for out, ref in zip(outs, twin.bn_bwd(*_as64([dy, x, gamma, mean, inv_std]), axes)):
        assert_close(out, ref, np.float32)


# ---------------------------------------------------------------- fusions: relu epilogue, moving averages

FUSED_CASES = [CASES[0], CASES[1], CASES[3], CASES[5]]
FUSED_IDS = ['nhwc', 'nchw-n1', '2d', 'axes-1-of-3d']


@pytest.mark.parametrize('dtype', DTYPES)
@pytest.mark.parametrize('shape, axes', FUSED_CASES, ids=FUSED_IDS)
def test_fused_train_relu_moving_and_relu_bwd_match_twin(kernel_runtime, dtype, shape, axes):
    rng = np.random.default_rng(sum(shape) + len(axes))
    x = (rng.standard_normal(shape) + 3).astype(dtype)
    gamma, beta = _params(rng, _kept(shape, axes), dtype)
    acc = np.float32 if dtype == np.float16 else dtype
    moving_mean = rng.standard_normal(_kept(shape, axes)).astype(acc)
    moving_var = rng.uniform(0.5, 2, _kept(shape, axes)).astype(acc)
    args = (x, gamma, beta, axes, 1e-3, 'relu', moving_mean, moving_var, 0.01, 0.02, 1.25)
    outs = _run(batchnorm.bn_train_fwd, kernel_runtime, *args)
    refs = twin.bn_train_fwd(*_as64(args))
    names = ('y', 'mean', 'var', 'inv_std', 'next_moving_mean', 'next_moving_var')
    for name, out, ref, want in zip(names, outs, refs, twin.bn_train_fwd(*args)):
        assert out.dtype == want.dtype and out.shape == ref.shape, name
        assert_close(out, ref, dtype, 'bn_train_fwd relu ' + name)
    assert (outs[0] == 0).any() and (outs[0] > 0).any()
    np.testing.assert_array_equal(moving_mean, args[6])   # new buffers: the inputs are untouched

    y, mean, _, inv_std = twin.bn_train_fwd(*args[:6])
    dy = rng.standard_normal(shape).astype(dtype)
    outs = _run(batchnorm.bn_bwd, kernel_runtime, dy, x, gamma, mean, inv_std, axes, activation='relu', y=y)
    refs = twin.bn_bwd(*_as64([dy, x, gamma, mean, inv_std]), axes, activation='relu', y=y.astype(np.float64))
    for name, out, ref in zip(('dx', 'dgamma', 'dbeta'), outs, refs):
        assert_close(out, ref, dtype, 'bn_bwd relu ' + name)


@pytest.mark.parametrize('dtype', DTYPES)
@pytest.mark.parametrize('shape, axis, param_shape', [((3, 5, 4, 7), -1, (7,)), ((1, 5, 3, 3), 1, (1, 5, 1, 1))])
def test_fused_infer_relu_matches_twin(kernel_runtime, dtype, shape, axis, param_shape):
    rng = np.random.default_rng(sum(shape))
    x = rng.standard_normal(shape).astype(dtype)
    mean, var = rng.standard_normal(param_shape).astype(dtype), rng.uniform(0.5, 2, param_shape).astype(dtype)
    gamma, beta = _params(rng, param_shape, dtype)
    out = _run(batchnorm.bn_infer_fwd, kernel_runtime, x, mean, var, gamma, beta, 1e-3, axis, 'relu')
    ref = twin.bn_infer_fwd(*_as64([x, mean, var, gamma, beta]), 1e-3, axis, 'relu')
    assert out.dtype == dtype and (out == 0).any() and (out > 0).any()
    assert_close(out, ref, dtype, 'bn_infer_fwd relu')


def test_fused_relu_keeps_nan_and_masks_it_in_backward(kernel_runtime):
    x = np.array([[1.0, np.nan], [-1.0, 2.0], [0.5, 3.0]], np.float32)
    y, mean, _, inv_std = _run(batchnorm.bn_train_fwd, kernel_runtime, x, None, None, (0,), 1e-3, 'relu')
    assert np.isnan(y[:, 1]).all() and y[1, 0] == 0 and y[0, 0] > 0
    dy = np.ones_like(x)
    dy[1, 0], dy[2, 1] = np.inf, np.nan   # masked: the select drops them (a multiply by the mask would not)
    dx, dgamma, dbeta = _run(batchnorm.bn_bwd, kernel_runtime, dy, x, None, mean, inv_std, (0,),
                             activation='relu', y=y)
    assert dbeta[1] == 0 and dbeta[0] == 2   # NaN outputs and the zero pass no gradient
    assert np.isfinite(dgamma[0]) and np.isfinite(dx[:, 0]).all()   # (channel 1: x holds a NaN)


@pytest.mark.parametrize('module', [batchnorm, twin])
def test_fused_bad_input_raises_before_launch(module):
    kw = {'runtime': 'emulate'} if module is batchnorm else {}
    x = np.zeros((2, 3, 4), np.float32)
    stat = np.zeros(4, np.float32)
    with pytest.raises(ValueError, match=r"bn_train_fwd: activation must be 'linear' or 'relu', got 'tanh'"):
        module.bn_train_fwd(x, None, None, (0, 1), 1e-3, 'tanh', **kw)
    with pytest.raises(ValueError, match=r"bn_infer_fwd: activation must be 'linear' or 'relu', got 'elu'"):
        module.bn_infer_fwd(x, stat, stat, None, None, 1e-3, -1, 'elu', **kw)
    with pytest.raises(ValueError, match=r"bn_train_fwd: moving_mean and moving_var go together, got only moving_var"):
        module.bn_train_fwd(x, None, None, (0, 1), moving_var=stat, decay=0.1, **kw)
    with pytest.raises(ValueError, match=r"bn_train_fwd: decay \(1 - momentum\) is required"):
        module.bn_train_fwd(x, None, None, (0, 1), moving_mean=stat, moving_var=stat, **kw)
    with pytest.raises(ValueError, match=r"bn_train_fwd: decay, var_decay and var_factor are only used with"):
        module.bn_train_fwd(x, None, None, (0, 1), var_factor=2.0, **kw)
    with pytest.raises(TypeError, match=r"bn_train_fwd: decay must be a float or a one-element float array"):
        module.bn_train_fwd(x, None, None, (0, 1), moving_mean=stat, moving_var=stat, decay=np.zeros(2), **kw)
    with pytest.raises(TypeError, match=r"bn_train_fwd: var_factor must be a float or a one-element"):
        module.bn_train_fwd(x, None, None, (0, 1), moving_mean=stat, moving_var=stat, decay=0.1, var_factor='2',
                            **kw)
    with pytest.raises(ValueError, match=r"bn_train_fwd: moving_var must have shape \(4,\)"):
        module.bn_train_fwd(x, None, None, (0, 1), moving_mean=stat, moving_var=stat[:3], decay=0.1, **kw)
    with pytest.raises(ValueError, match=r"bn_bwd: y \(the fused forward's output\) is required"):
        module.bn_bwd(x, x, None, stat, stat + 1, (0, 1), activation='relu', **kw)
    with pytest.raises(ValueError, match=r"bn_bwd: y is only used with activation='relu'"):
        module.bn_bwd(x, x, None, stat, stat + 1, (0, 1), y=x, **kw)
    with pytest.raises(ValueError, match=r"bn_bwd: y must have the shape of x"):
        module.bn_bwd(x, x, None, stat, stat + 1, (0, 1), activation='relu', y=x[:1], **kw)
    with pytest.raises(TypeError, match=r"bn_bwd: y must have the dtype of x \(float32\), got float64"):
        module.bn_bwd(x, x, None, stat, stat + 1, (0, 1), activation='relu', y=x.astype(np.float64), **kw)


def test_cudnn_fused_graph_names_and_momentum():
    assert cudnn_batchnorm._op('train', 'relu') == 'train_relu' and cudnn_batchnorm._op('bwd', 'linear') == 'bwd'
    assert cudnn_batchnorm._host_momentum(np.full(1, 0.25, np.float32), 0.25) == 0.25
    with pytest.raises(Exception, match='one momentum') as info:
        cudnn_batchnorm._host_momentum(0.1, 0.2)
    assert type(info.value).__name__ == 'Unsupported'


def _raises_unsupported(match, call, *args, **kwargs):
    """``call`` refuses the problem with dispatch.Unsupported (the dispatcher then runs gpuk's
    kernel); these checks come before any CuPy or cuDNN use, so NumPy arrays do here."""
    with pytest.raises(dispatch.Unsupported, match=match):
        call(*args, **kwargs)


def test_cudnn_refuses_empty_problems_and_single_value_moving_variance():
    empty, stat = np.zeros((4, 0), np.float32), np.zeros(0, np.float32)
    _raises_unsupported('no empty tensors', cudnn_batchnorm.bn_train_fwd, empty, None, None, (0,))
    _raises_unsupported('no empty tensors', cudnn_batchnorm.bn_infer_fwd, empty, stat, stat, None, None, 1e-3, 1)
    _raises_unsupported('no empty tensors', cudnn_batchnorm.bn_bwd, empty, empty, None, stat, stat, (0,))
    one_row, moving = np.ones((1, 3), np.float32), np.zeros(3, np.float32)
    _raises_unsupported(r'divides by n - 1; got n = 1', cudnn_batchnorm.bn_train_fwd, one_row, None, None, (0,),
                        moving_mean=moving, moving_var=moving + 1, decay=0.1)


@pytest.mark.gpu
@pytest.mark.parametrize('shape, axes', [((4, 6, 5, 16), (0, 1, 2)), ((4, 16, 6, 5), (0, 2, 3))])
def test_cudnn_fused_batchnorm_matches_twin(shape, axes):
    from gpuk.kernels.cudnn import library as cudnn_library
    if not cudnn_library.available():
        pytest.skip(cudnn_library.why_unavailable())
    import cupy
    rng = np.random.default_rng(0)
    x = rng.standard_normal(shape).astype(np.float32)
    gamma, beta = _params(rng, _kept(shape, axes), np.float32)
    moving = [rng.standard_normal(16).astype(np.float32), rng.uniform(0.5, 2, 16).astype(np.float32)]
    outs = cudnn_batchnorm.bn_train_fwd(*[cupy.asarray(a) for a in (x, gamma, beta)], axes, 1e-3, 'relu',
                                        *[cupy.asarray(m) for m in moving], 0.1, 0.1, 1.01)
    refs = twin.bn_train_fwd(*_as64([x, gamma, beta]), axes, 1e-3, 'relu', *_as64(moving), 0.1, 0.1, 1.01)
    for i in (0, 1, 3, 4, 5):
        assert_close(outs[i], refs[i], np.float32)
    y, mean, _, inv_std = twin.bn_train_fwd(x, gamma, beta, axes, 1e-3, 'relu')
    dy = rng.standard_normal(shape).astype(np.float32)
    outs = cudnn_batchnorm.bn_bwd(*[cupy.asarray(a) for a in (dy, x, gamma, mean, inv_std)], axes,
                                  activation='relu', y=cupy.asarray(y))
    refs = twin.bn_bwd(*_as64([dy, x, gamma, mean, inv_std]), axes, activation='relu', y=y.astype(np.float64))
    for out, ref in zip(outs, refs):
        assert_close(out, ref, np.float32)


# ---------------------------------------------------------------- vectorized elementwise passes

def _misaligned(x):
    """x's values in a contiguous view one element into a larger buffer (not 16-byte aligned)."""
    buffer = np.empty(x.size + 1, x.dtype)
    view = buffer[1:].reshape(x.shape)
    view[...] = x
    return view


# Each case reaches one layout of the elementwise kernels (batchnorm.cu, "elementwise passes"):
# channels last with C a multiple of the vector width (one block: hoisted coefficients; a
# forced single block with C = 24: per-step consecutive coefficients), channels first with
# inner a multiple of it (one channel per vector), and a misaligned x (scalar).
VECTOR_CASES = {
    'nhwc-hoisted': ((4, 3, 5, 16), (0, 1, 2), None),
    'nhwc-consecutive': ((5, 7, 24), (0, 1), 1),
    'nchw-shared': ((3, 5, 4, 8), (0, 2, 3), None),
    'misaligned': ((4, 3, 5, 16), (0, 1, 2), 'misaligned'),
}


@pytest.mark.emulate
@pytest.mark.parametrize('dtype', DTYPES)
@pytest.mark.parametrize('case', list(VECTOR_CASES))
def test_vector_layouts_match_twin(monkeypatch, dtype, case):
    shape, axes, how = VECTOR_CASES[case]
    if how == 1:
        monkeypatch.setattr(batchnorm_launch, '_elementwise_blocks', lambda *args: 1)
    prepare = _misaligned if how == 'misaligned' else (lambda a: a)
    rng = np.random.default_rng(len(case))
    x = (rng.standard_normal(shape) + 2).astype(dtype)
    gamma, beta = _params(rng, _kept(shape, axes), dtype)
    outs = batchnorm.bn_train_fwd(prepare(x), gamma, beta, axes, 1e-3, 'relu', runtime='emulate')
    refs = twin.bn_train_fwd(*_as64([x, gamma, beta]), axes, 1e-3, 'relu')
    for name, out, ref in zip(('y', 'mean', 'var', 'inv_std'), outs, refs):
        assert_close(out, ref, dtype, '%s bn_train_fwd %s' % (case, name))
    y, mean, var, inv_std = twin.bn_train_fwd(x, gamma, beta, axes, 1e-3, 'relu')
    dy = rng.standard_normal(shape).astype(dtype)
    for activation, fused_y in (('linear', None), ('relu', y)):
        outs = batchnorm.bn_bwd(prepare(dy), prepare(x), gamma, mean, inv_std, axes, activation=activation,
                                y=fused_y, runtime='emulate')
        refs = twin.bn_bwd(*_as64([dy, x, gamma, mean, inv_std]), axes, activation=activation,
                           y=None if fused_y is None else fused_y.astype(np.float64))
        for name, out, ref in zip(('dx', 'dgamma', 'dbeta'), outs, refs):
            assert_close(out, ref, dtype, '%s bn_bwd %s %s' % (case, activation, name))
    axis = -1 if axes[-1] != x.ndim - 1 else 1
    out = batchnorm.bn_infer_fwd(prepare(x), mean, var, gamma, beta, 1e-3, axis, runtime='emulate')
    assert_close(out, twin.bn_infer_fwd(*_as64([x, mean, var, gamma, beta]), 1e-3, axis), dtype,
                 '%s bn_infer_fwd' % case)


@pytest.mark.emulate
def test_scratch_is_reused_and_outputs_are_fresh():
    rng = np.random.default_rng(3)
    x = rng.standard_normal((6, 4, 16)).astype(np.float32)
    first = batchnorm.bn_train_fwd(x, None, None, (0, 1), runtime='emulate')
    held = len(batchnorm_launch._BUFFERS)
    second = batchnorm.bn_train_fwd(x * 2, None, None, (0, 1), runtime='emulate')
    assert len(batchnorm_launch._BUFFERS) == held               # same shape: nothing new kept
    assert all(a is not b for a, b in zip(first, second))
    np.testing.assert_allclose(second[1], 2 * first[1], rtol=1e-6)   # the first outputs kept their values
    assert not np.shares_memory(first[0], second[0])


# ---------------------------------------------------------------- single-kernel training forward

@pytest.mark.emulate
@pytest.mark.parametrize('workers', [1, 3])
@pytest.mark.parametrize('dtype', [np.float16, np.float64])
def test_persistent_training_forward_is_one_launch_matching_twin(monkeypatch, workers, dtype):
    """Channels last within the L2: one bn_train_persistent launch, its blocks meeting at grid
    barriers (3 blocks resident at once on 3 emulator threads), with the twin's outputs,
    relu and moving averages included, and the split path's (single_kernel=False; same splits,
    the finalize adds them in 8 rows, not 16); the barrier state is left as it was found."""
    from gpuk.kernels.runtime import emulated_runtime, get_runtime
    monkeypatch.setenv('GPUK_EMULATE_THREADS', str(workers))
    monkeypatch.setattr(batchnorm_launch, 'MIN_ROWS_PER_SPLIT', 8)
    prepared.clear()   # the splits are worked out once per problem: not from an earlier test's
    rng = np.random.default_rng(workers)
    shape, axes = (40, 5, 12), (0, 1)
    x = (rng.standard_normal(shape) * 2 + 5).astype(dtype)
    gamma, beta = _params(rng, (12,), dtype)
    acc = np.float32 if dtype == np.float16 else dtype
    moving_mean, moving_var = rng.standard_normal(12).astype(acc), rng.uniform(0.5, 2, 12).astype(acc)
    rt = get_runtime('emulate')
    barrier = batchnorm_launch._barrier(batchnorm_launch._Buffers(rt))
    generation = int(barrier[1])
    for args in ((x, gamma, beta, axes, 1e-3, 'relu', moving_mean, moving_var, 0.01, 0.02, 1.25),
                 (x, gamma, beta, axes, 1e-3)):
        with emulated_runtime.counting() as launches:
            outs = batchnorm.bn_train_fwd(*args, runtime=rt)
        assert [(launch['kernel'], launch['grid'][0]) for launch in launches] == [('bn_train_persistent', workers)]
        for out, ref in zip(outs, twin.bn_train_fwd(*_as64(args))):
            assert_close(out, ref, dtype, 'bn_train_persistent')
        with emulated_runtime.counting() as launches:
            split = batchnorm.bn_train_fwd(*args, runtime=rt, single_kernel=False)
        assert 'bn_train_persistent' not in [launch['kernel'] for launch in launches]
        for out, split_path in zip(outs, split):
            assert_close(out, split_path, dtype, 'bn_train_persistent vs split path')
        generation += 2   # two grid barriers per launch
        assert list(barrier) == [0, generation]


@pytest.mark.emulate
def test_persistent_path_only_where_the_grid_is_resident_and_x_fits_in_l2(monkeypatch):
    from gpuk.kernels.runtime import emulated_runtime, get_runtime
    rt = get_runtime('emulate')
    module = rt.load(batchnorm_launch.SOURCE, batchnorm_launch.defines(np.float32))
    x = np.zeros((1000, 16), np.float32)
    last = batchnorm_launch._View(x.shape, twin._Layout(x.shape, (0,)))
    first = batchnorm_launch._View((10, 16, 100), twin._Layout((10, 16, 100), (0, 2)))
    tiles = batchnorm_launch._splits(last)[0]   # one 32-channel chunk
    assert tiles == 16
    monkeypatch.setenv('GPUK_EMULATE_THREADS', '1')
    assert batchnorm_launch._persistent_blocks(rt, module, last, x) == 1
    monkeypatch.setenv('GPUK_EMULATE_THREADS', '5')
    assert batchnorm_launch._persistent_blocks(rt, module, last, x) == 5         # the resident blocks, no more
    monkeypatch.setenv('GPUK_EMULATE_THREADS', '100')
    assert batchnorm_launch._persistent_blocks(rt, module, last, x) == tiles     # the split path's tiles, no more
    assert batchnorm_launch._persistent_blocks(rt, module, first, x) == 0        # channels first: the split path
    monkeypatch.setattr(rt, 'l2_bytes', 2 * x.nbytes - 1)
    assert batchnorm_launch._persistent_blocks(rt, module, last, x) == 0         # x past half the L2
    monkeypatch.setattr(rt, 'l2_bytes', 2 * x.nbytes)
    monkeypatch.setattr(emulated_runtime.EmulatedKernel, 'coresident_blocks', lambda self, threads, shared=0: 0)
    assert batchnorm_launch._persistent_blocks(rt, module, last, x) == 0         # no resident grid: never wait


def test_overlapping_launches_never_share_a_grid_barrier():
    """bn_train_persistent's barrier counts the arrivals of one launch: two launches that may
    overlap (two CUDA streams, two host threads) each get their own; one stream, whose
    launches run in order, reuses its barrier."""
    import threading
    import types
    stream = [1]
    cuda = types.SimpleNamespace(Device=lambda: types.SimpleNamespace(id=0),
                                 get_current_stream=lambda: types.SimpleNamespace(ptr=stream[0]))
    rt = types.SimpleNamespace(xp=types.SimpleNamespace(cuda=cuda, zeros=np.zeros))
    first = batchnorm_launch._barrier(batchnorm_launch._Buffers(rt))
    assert batchnorm_launch._barrier(batchnorm_launch._Buffers(rt)) is first
    stream[0] = 2
    second = batchnorm_launch._barrier(batchnorm_launch._Buffers(rt))
    assert second is not first
    other_thread = []
    worker = threading.Thread(target=lambda: other_thread.append(batchnorm_launch._barrier(batchnorm_launch._Buffers(rt))))
    worker.start()
    worker.join()
    assert other_thread[0] is not second and other_thread[0] is not first
    stream[0] = 1
    assert batchnorm_launch._barrier(batchnorm_launch._Buffers(rt)) is first


def test_cuda_coresident_blocks_from_occupancy():
    """A GPU's co-resident blocks: the occupancy rules for the kernel's registers and shared
    memory times the SMs; 0 (no grid barrier) where the registers or the arch are unknown."""
    import types
    from gpuk.kernels.inspect import occupancy
    from gpuk.kernels.runtime.cuda_runtime import CudaKernel
    rt = types.SimpleNamespace(arch='sm_90', multiprocessors=132)
    module = types.SimpleNamespace(runtime=rt)
    signature = types.SimpleNamespace(name='bn_train_persistent')
    function = types.SimpleNamespace(num_regs=40, shared_size_bytes=4224)
    blocks = CudaKernel(module, signature, function).coresident_blocks(256)
    assert blocks == occupancy.theoretical('sm_90', 256, 40, 4224).blocks_per_sm * 132 == 6 * 132
    assert CudaKernel(module, signature, types.SimpleNamespace()).coresident_blocks(256) == 0
    rt.arch = 'sm_75'
    assert CudaKernel(module, signature, function).coresident_blocks(256) == 0


def test_single_kernel_switch_must_be_a_bool():
    x = np.ones((4, 3), np.float32)
    with pytest.raises(TypeError, match="bn_train_fwd: single_kernel must be True or False, got 'no'"):
        batchnorm.bn_train_fwd(x, None, None, (0,), runtime='emulate', single_kernel='no')
