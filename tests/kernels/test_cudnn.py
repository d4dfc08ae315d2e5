"""gpuk.kernels.cudnn (library, conv): detection, fallback message, cache key and the translation of a
Keras convolution into cuDNN's terms (checked on the CPU by running a cuDNN-style
symmetric-padding NCHW convolution over the very buffers and strides cuDNN would get);
the real cuDNN calls are `gpu` tests against the NumPy twins."""
import warnings

import numpy as np
import pytest
from numpy.lib.stride_tricks import as_strided

from gpuk import config
from gpuk.cpu_fallback import conv as conv_ref
from gpuk.kernels.cudnn import conv as cudnn_conv
from gpuk.kernels.cudnn import library as cudnn_library


# ---------------------------------------------------------------- detection

@pytest.fixture
def fresh_probe():
    cudnn_library.reset_probe()
    saved = config.kernels()
    yield
    cudnn_library.reset_probe()
    config.set_kernels(**saved)


def test_library_path_finds_the_wheel_layout(tmp_path):
    lib = tmp_path / 'site' / 'nvidia' / 'cudnn' / 'lib'
    lib.mkdir(parents=True)
    (lib / 'libcudnn.so.9').write_bytes(b'')
    assert cudnn_library.library_path([str(tmp_path / 'empty'), str(tmp_path / 'site')]) == \
        str(lib / 'libcudnn.so.9')
    assert cudnn_library.library_path([str(tmp_path / 'empty')]) is None


def test_unavailable_without_gpu_says_why(fresh_probe, monkeypatch):
    monkeypatch.setattr(cudnn_library.runtime, 'gpu_unusable_reason', lambda: 'CUDA reports no GPU')
    assert cudnn_library.available() is False
    assert cudnn_library.why_unavailable() == 'CUDA reports no GPU'


def test_unavailable_without_frontend_names_the_package(fresh_probe, monkeypatch):
    monkeypatch.setattr(cudnn_library.runtime, 'gpu_unusable_reason', lambda: None)
    monkeypatch.setattr(cudnn_library, '_load_library', lambda: (object(), None))
    monkeypatch.setitem(__import__('sys').modules, 'cudnn', None)  # import cudnn fails
    assert not cudnn_library.available()
    assert 'nvidia-cudnn-frontend' in cudnn_library.why_unavailable()


def test_available_when_every_part_is_there(fresh_probe, monkeypatch):
    monkeypatch.setattr(cudnn_library.runtime, 'gpu_unusable_reason', lambda: None)
    monkeypatch.setattr(cudnn_library, '_load_library', lambda: (object(), None))
    monkeypatch.setattr(cudnn_library, '_import_frontend', lambda: (object(), None))
    assert cudnn_library.available() and cudnn_library.why_unavailable() == ''


def test_fallback_warns_once_per_family(fresh_probe, monkeypatch):
    monkeypatch.setattr(cudnn_library.runtime, 'gpu_unusable_reason', lambda: 'CUDA reports no GPU')
    config.set_kernels(conv='cudnn', pooling='auto')
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter('always')
        assert cudnn_library.choose('conv') == 'gpuk'
        assert cudnn_library.choose('conv') == 'gpuk'
        assert cudnn_library.choose('pooling') == 'gpuk'  # auto falls back silently
    messages = [str(w.message) for w in caught]
    assert messages == [cudnn_library.fallback_message('conv', 'CUDA reports no GPU')]
    assert "'conv'" in messages[0] and 'CUDA reports no GPU' in messages[0]


def test_choose_keeps_the_choice_when_available(fresh_probe, monkeypatch):
    monkeypatch.setattr(cudnn_library, '_probe', lambda: None)
    cudnn_library._state['reason'] = None
    config.set_kernels(conv='cudnn', ctc='auto')
    assert cudnn_library.choose('conv') == 'cudnn' and cudnn_library.choose('ctc') == 'auto'
    assert cudnn_library.choose('pooling') == 'gpuk'


# ---------------------------------------------------------------- translation

def test_split_pads():
    assert cudnn_conv.split_pads(((1, 2), (0, 0), (3, 1))) == ((1, 0, 1), ((0, 1), (0, 0), (2, 0)))


@pytest.mark.parametrize('channels_last', [True, False])
@pytest.mark.parametrize('shape', [(2, 5, 7, 3), (2, 4, 5, 6, 3)])
def test_layout_strides_match_numpy(shape, channels_last):
    array = np.empty(shape, np.float32)
    nc_view = np.moveaxis(array, -1, 1) if channels_last else array
    expected = tuple(s // array.itemsize for s in nc_view.strides)
    assert cudnn_conv.layout_strides(nc_view.shape, channels_last) == expected
    assert cudnn_conv.cudnn_dims(shape, channels_last) == nc_view.shape


@pytest.mark.parametrize('rank', [1, 2, 3])
@pytest.mark.parametrize('channels_last', [True, False])
def test_filter_axes_round_trip(rank, channels_last):
    shape = (2, 3, 4)[:rank] + (5, 6)  # (*k, Ci, Co)
    w = np.arange(np.prod(shape)).reshape(shape)
    forward = w.transpose(cudnn_conv.keras_to_cudnn_filter_axes(rank, channels_last))
    k = shape[:rank]
    assert forward.shape == ((6,) + k + (5,) if channels_last else (6, 5) + k)
    back = forward.transpose(cudnn_conv.cudnn_to_keras_filter_axes(rank, channels_last))
    np.testing.assert_array_equal(back, w)


def test_conv_problem_describes_shapes_and_padding():
    p = cudnn_conv.conv_problem('conv_fwd', (2, 9, 8, 3), (3, 2, 3, 4), (2, 1), (1, 2),
                           ((1, 2), (0, 1)), 'channels_last')
    assert p.y_shape == (2, 5, 7, 4)  # (9+3-3)//2+1, (8+1-3)//1+1 with extent (2-1)*2+1
    assert p.symmetric_pads == (1, 0) and p.explicit_pads == ((0, 1), (0, 1))
    assert p.padded_x_shape == (2, 10, 9, 3) and not p.lifted


def test_conv_problem_lifts_one_spatial_dim():
    p = cudnn_conv.conv_problem('conv_fwd', (2, 3, 11), (3, 3, 5), (2,), (1,), ((2, 0),),
                           'channels_first')
    assert p.lifted and p.rank == 2
    assert p.x_shape == (2, 3, 1, 11) and p.w_shape == (1, 3, 3, 5)
    assert p.y_shape == (2, 5, 1, 6) and p.strides == (1, 2)
    assert cudnn_conv.unlifted_shape(p.y_shape, p) == (2, 5, 6)


@pytest.mark.parametrize('kwargs, message', [
    (dict(data_format='nhwc'), "conv_fwd: data_format must be 'channels_first' or 'channels_last', got 'nhwc'"),
    (dict(w_shape=(3, 3, 4, 2)), 'conv_fwd: the channel count of x'),
    (dict(w_shape=(3, 3, 2)), 'conv_fwd: w must have rank 4'),
    (dict(dy_shape=(2, 5, 5, 2)), 'conv_fwd: dy must have the output shape (2, 6, 6, 2)'),
    (dict(pads=((0, 0),)), 'conv_fwd: pads must be a tuple of 2'),
    (dict(x_shape=(2, 1, 1, 3)), 'conv_fwd: padded input spatial size 1'),
])
def test_conv_problem_rejects_bad_input(kwargs, message):
    args = dict(x_shape=(2, 8, 8, 3), w_shape=(3, 3, 3, 2), strides=(1, 1), dilation=(1, 1),
                pads=((0, 0), (0, 0)), data_format='channels_last')
    args.update(kwargs)
    with pytest.raises(ValueError) as info:
        cudnn_conv.conv_problem('conv_fwd', **args)
    assert message in str(info.value)


def test_data_types_and_tensor_core_policy():
    assert cudnn_conv.data_type_names('float16', 'float32') == ('HALF', 'FLOAT', False)
    assert cudnn_conv.data_type_names('bfloat16', 'float32') == ('BFLOAT16', 'FLOAT', False)
    assert cudnn_conv.data_type_names('float32', 'float32') == ('FLOAT', 'FLOAT', True)
    assert cudnn_conv.data_type_names('float32', 'tf32') == ('FLOAT', 'FLOAT', False)
    assert cudnn_conv.data_type_names('float64', 'float32') == ('DOUBLE', 'DOUBLE', False)
    with pytest.raises(TypeError, match='cudnn: arrays must be float16, bfloat16, float32 or float64, got int32'):
        cudnn_conv.data_type_names('int32', 'float32')


def test_graph_cache_key_separates_what_matters():
    def key(**kw):
        args = dict(x_shape=(2, 8, 8, 3), w_shape=(3, 3, 3, 4), strides=(1, 1), dilation=(1, 1),
                    pads=((1, 1), (1, 1)), data_format='channels_last')
        op = kw.pop('op', 'fprop')
        dtype = kw.pop('dtype', 'float32')
        args.update(kw)
        return cudnn_conv.graph_cache_key(op, 0, cudnn_conv.conv_problem('f', **args), dtype, 'float32')

    base = key()
    assert key() == base
    variants = [key(op='dgrad'), key(dtype='float16'), key(strides=(2, 1)),
                key(dilation=(1, 2)), key(pads=((0, 2), (1, 1))), key(x_shape=(3, 8, 8, 3)),
                key(x_shape=(2, 3, 8, 8), data_format='channels_first')]
    assert len({base, *variants}) == len(variants) + 1


# ---- a cuDNN-style convolution on the CPU over the buffers cudnn/conv.py hands to cuDNN

def _nc_view(buffer, dims, channels_last):
    """The (N, C, *spatial) view cuDNN reads from `buffer` given dims and our strides."""
    strides = cudnn_conv.layout_strides(dims, channels_last)
    return as_strided(buffer, shape=dims, strides=[s * buffer.itemsize for s in strides])


def _cudnn_like_fprop(x_nc, w_kc, pads, strides, dilation):
    """Cross-correlation with symmetric pads in (N, C, *S) x (K, C, *k) order, float64."""
    rank = x_nc.ndim - 2
    x = np.pad(x_nc.astype(np.float64), [(0, 0), (0, 0)] + [(p, p) for p in pads])
    k = w_kc.shape[2:]
    out = [(x.shape[2 + i] - (k[i] - 1) * dilation[i] - 1) // strides[i] + 1 for i in range(rank)]
    y = np.zeros((x.shape[0], w_kc.shape[0], *out))
    for tap in np.ndindex(*k):
        window = x[(slice(None), slice(None)) + tuple(
            slice(t * d, t * d + s * (o - 1) + 1, s) for t, d, s, o in zip(tap, dilation, strides, out))]
        y += np.einsum('nc...,kc->nk...', window, w_kc[(slice(None), slice(None)) + tap])
    return y


CASES = [
    ('channels_last', (2, 9, 8, 3), (3, 2, 3, 4), (2, 1), (1, 2), ((1, 2), (0, 1))),
    ('channels_first', (2, 3, 7, 6), (2, 3, 3, 5), (1, 2), (2, 1), ((2, 0), (1, 1))),
    ('channels_last', (3, 11, 2), (3, 2, 4), (2,), (1,), ((0, 1),)),
    ('channels_first', (1, 2, 5, 4, 6), (2, 1, 3, 2, 3), (1, 1, 2), (1, 1, 1), ((1, 0), (0, 0), (1, 2))),
]


@pytest.mark.parametrize('data_format, x_shape, w_shape, strides, dilation, pads', CASES)
def test_translation_reproduces_conv_fwd_and_wgrad(rng, data_format, x_shape, w_shape, strides,
                                                   dilation, pads):
    x = rng.standard_normal(x_shape)
    w = rng.standard_normal(w_shape)
    p = cudnn_conv.conv_problem('conv_fwd', x.shape, w.shape, strides, dilation, pads, data_format)
    cl = p.channels_last
    x_buffer = cudnn_conv.pad_explicit(np, x, p)
    w_buffer = cudnn_conv.to_cudnn_filter(np, w, p)
    assert x_buffer.shape == p.padded_x_shape
    x_nc = _nc_view(x_buffer, cudnn_conv.cudnn_dims(p.padded_x_shape, cl), cl)
    w_kc = _nc_view(w_buffer, cudnn_conv.filter_dims(p.w_shape), cl)
    y_nc = _cudnn_like_fprop(x_nc, w_kc, p.symmetric_pads, p.strides, p.dilation)
    y_buffer = np.empty(p.y_shape)
    _nc_view(y_buffer, cudnn_conv.cudnn_dims(p.y_shape, cl), cl)[...] = y_nc
    y = y_buffer.reshape(cudnn_conv.unlifted_shape(p.y_shape, p))
    np.testing.assert_allclose(y, conv_ref.conv_fwd(x, w, strides, dilation, pads, data_format),
                               rtol=1e-12, atol=1e-12)

    # wgrad: dW[k, c, tap] = sum over n, out of dy * x window; written packed, then to Keras
    dy = rng.standard_normal(y.shape)
    dy_nc = _nc_view(dy.reshape(p.y_shape).copy(), cudnn_conv.cudnn_dims(p.y_shape, cl), cl)
    dw_kc = np.zeros(cudnn_conv.filter_dims(p.w_shape))
    eye = np.zeros(cudnn_conv.filter_dims(p.w_shape))
    for index in np.ndindex(*eye.shape):  # small: each basis filter's response gives dW
        eye[index] = 1
        dw_kc[index] = np.sum(_cudnn_like_fprop(x_nc, eye, p.symmetric_pads, p.strides, p.dilation) * dy_nc)
        eye[index] = 0
    dw_buffer = np.empty(cudnn_conv.cudnn_filter_memory_shape(p))
    _nc_view(dw_buffer, cudnn_conv.filter_dims(p.w_shape), cl)[...] = dw_kc
    dw = cudnn_conv.from_cudnn_filter(np, dw_buffer, p, w_shape)
    np.testing.assert_allclose(dw, conv_ref.conv_wgrad(x, dy, w_shape, strides, dilation, pads,
                                                       data_format), rtol=1e-10, atol=1e-10)


def _cudnn_like_grouped_fprop(x_nc, w_kc, groups, pads, strides, dilation):
    """_cudnn_like_fprop per group: group g reads channels g*C/G.. and writes outputs g*K/G.."""
    c, k = x_nc.shape[1] // groups, w_kc.shape[0] // groups
    return np.concatenate([_cudnn_like_fprop(x_nc[:, g * c:(g + 1) * c], w_kc[g * k:(g + 1) * k], pads, strides,
                                             dilation) for g in range(groups)], axis=1)


DEPTHWISE_CASES = [
    ('channels_last', (2, 7, 6, 3), (3, 3, 3, 2), (1, 2), (1, 1), ((1, 1), (1, 2))),   # multiplier 2, uneven pads
    ('channels_first', (2, 4, 6, 5), (2, 3, 4, 1), (2, 1), (1, 2), ((0, 1), (2, 2))),
    ('channels_last', (1, 9, 5), (3, 5, 1), (1,), (2,), ((2, 2),)),                     # 1-d, lifted
]


@pytest.mark.parametrize('data_format, x_shape, w_shape, strides, dilation, pads', DEPTHWISE_CASES)
def test_depthwise_translation_is_a_grouped_conv_with_one_group_per_channel(rng, data_format, x_shape, w_shape,
                                                                          strides, dilation, pads):
    """What cudnn.conv.depthwise_conv_fwd hands cuDNN (the (*k, 1, C*M) filter, groups = C),
    run as a grouped cuDNN-style convolution, is the twin's depthwise convolution."""
    x = rng.standard_normal(x_shape)
    w = rng.standard_normal(w_shape)
    channels = w_shape[-2]
    flat = w.reshape(cudnn_conv.depthwise_filter_shape('depthwise_conv_fwd', w.shape))
    p = cudnn_conv.conv_problem('depthwise_conv_fwd', x.shape, flat.shape, strides, dilation, pads, data_format,
                                groups=channels)
    cl = p.channels_last
    x_nc = _nc_view(cudnn_conv.pad_explicit(np, x, p), cudnn_conv.cudnn_dims(p.padded_x_shape, cl), cl)
    w_kc = _nc_view(cudnn_conv.to_cudnn_filter(np, flat, p), cudnn_conv.filter_dims(p.w_shape), cl)
    assert w_kc.shape[:2] == (channels * w_shape[-1], 1)     # K = C * M filters of one input channel each
    y_buffer = np.empty(p.y_shape)
    _nc_view(y_buffer, cudnn_conv.cudnn_dims(p.y_shape, cl), cl)[...] = _cudnn_like_grouped_fprop(
        x_nc, w_kc, channels, p.symmetric_pads, p.strides, p.dilation)
    y = y_buffer.reshape(cudnn_conv.unlifted_shape(p.y_shape, p))
    np.testing.assert_allclose(y, conv_ref.depthwise_conv_fwd(x, w, strides, dilation, pads, data_format),
                               rtol=1e-12, atol=1e-12)


def test_grouped_conv_problem_checks_the_channels():
    with pytest.raises(ValueError, match=r'depthwise_conv_fwd: the channel count of x .* is 6 but w .* has '
                                         r'C_in 1 x 4 groups'):
        cudnn_conv.conv_problem('depthwise_conv_fwd', (2, 5, 5, 6), (3, 3, 1, 8), (1, 1), (1, 1),
                                ((1, 1), (1, 1)), 'channels_last', groups=4)
    with pytest.raises(ValueError, match=r'C_out 6 of w .* is not a multiple of the 4 groups'):
        cudnn_conv.conv_problem('depthwise_conv_fwd', (2, 5, 5, 4), (3, 3, 1, 6), (1, 1), (1, 1),
                                ((1, 1), (1, 1)), 'channels_last', groups=4)


@pytest.mark.parametrize('data_format, x_shape, w_shape, strides, dilation, pads', CASES[:3])
def test_crop_explicit_is_the_adjoint_of_pad_explicit(rng, data_format, x_shape, w_shape, strides,
                                                      dilation, pads):
    p = cudnn_conv.conv_problem('conv_dgrad', x_shape, w_shape, strides, dilation, pads, data_format)
    x = rng.standard_normal(x_shape)
    g = rng.standard_normal(p.padded_x_shape)
    # <pad(x), g> == <x, crop(g)>: so dgrad of the padded x, cropped, is dgrad of x
    assert np.isclose(np.sum(cudnn_conv.pad_explicit(np, x, p) * g),
                      np.sum(x * cudnn_conv.crop_explicit(np, g, p, x_shape)))


def test_flops_conv():
    p = cudnn_conv.conv_problem('f', (2, 8, 8, 3), (3, 3, 3, 4), (1, 1), (1, 1),
                           ((1, 1), (1, 1)), 'channels_last')
    assert cudnn_conv.flops_conv(p) == 2 * 2 * 8 * 8 * 3 * 3 * 3 * 4


# ---------------------------------------------------------------- on a GPU with cuDNN

@pytest.mark.gpu
@pytest.mark.parametrize('dtype, tol', [('float32', 1e-5), ('float16', 2e-2), ('bfloat16', 1.5e-2),
                                        ('float64', 1e-12)])
@pytest.mark.parametrize('data_format, x_shape, w_shape, strides, dilation, pads', CASES)
def test_cudnn_conv_matches_numpy_twin(rng, dtype, tol, data_format, x_shape, w_shape, strides,
                                       dilation, pads):
    if not cudnn_library.available():
        pytest.skip('cuDNN unavailable: %s' % cudnn_library.why_unavailable())
    import cupy
    x = rng.standard_normal(x_shape).astype(dtype)
    w = rng.standard_normal(w_shape).astype(dtype)
    y_ref = conv_ref.conv_fwd(x.astype(np.float64), w.astype(np.float64), strides, dilation, pads,
                              data_format)
    dy = rng.standard_normal(y_ref.shape).astype(dtype)
    dx_ref = conv_ref.conv_dgrad(dy.astype(np.float64), w.astype(np.float64), x_shape, strides,
                                 dilation, pads, data_format)
    dw_ref = conv_ref.conv_wgrad(x.astype(np.float64), dy.astype(np.float64), w_shape, strides,
                                 dilation, pads, data_format)
    got = {
        'y': cudnn_conv.conv_fwd(cupy.asarray(x), cupy.asarray(w), strides, dilation, pads, data_format),
        'dx': cudnn_conv.conv_dgrad(cupy.asarray(dy), cupy.asarray(w), x_shape, strides, dilation, pads,
                               data_format),
        'dw': cudnn_conv.conv_wgrad(cupy.asarray(x), cupy.asarray(dy), w_shape, strides, dilation, pads,
                               data_format),
    }
    for name, ref in (('y', y_ref), ('dx', dx_ref), ('dw', dw_ref)):
        value = cupy.asnumpy(got[name])
        assert value.dtype == np.dtype(dtype) and value.shape == ref.shape, name
        error = np.linalg.norm(value.astype(np.float64) - ref) / np.linalg.norm(ref)
        assert error < tol, (name, error)


@pytest.mark.gpu
@pytest.mark.parametrize('dtype, tol', [('float32', 1e-5), ('bfloat16', 1.5e-2)])
@pytest.mark.parametrize('data_format, x_shape, w_shape, strides, dilation, pads', DEPTHWISE_CASES)
def test_cudnn_depthwise_matches_numpy_twin(rng, dtype, tol, data_format, x_shape, w_shape, strides, dilation,
                                            pads):
    if not cudnn_library.available():
        pytest.skip('cuDNN unavailable: %s' % cudnn_library.why_unavailable())
    import cupy
    x = rng.standard_normal(x_shape).astype(dtype)
    w = rng.standard_normal(w_shape).astype(dtype)
    x64, w64 = x.astype(np.float64), w.astype(np.float64)
    geometry = (strides, dilation, pads, data_format)
    y_ref = conv_ref.depthwise_conv_fwd(x64, w64, *geometry)
    dy = rng.standard_normal(y_ref.shape).astype(dtype)
    refs = {'y': y_ref,
            'dx': conv_ref.depthwise_conv_dgrad(dy.astype(np.float64), w64, x_shape, *geometry),
            'dw': conv_ref.depthwise_conv_wgrad(x64, dy.astype(np.float64), w_shape, *geometry)}
    got = {'y': cudnn_conv.depthwise_conv_fwd(cupy.asarray(x), cupy.asarray(w), *geometry),
           'dx': cudnn_conv.depthwise_conv_dgrad(cupy.asarray(dy), cupy.asarray(w), x_shape, *geometry),
           'dw': cudnn_conv.depthwise_conv_wgrad(cupy.asarray(x), cupy.asarray(dy), w_shape, *geometry)}
    for name, ref in refs.items():
        value = cupy.asnumpy(got[name])
        assert value.dtype == np.dtype(dtype) and value.shape == ref.shape, name
        error = np.linalg.norm(value.astype(np.float64) - ref) / np.linalg.norm(ref)
        assert error < tol, (name, error)
