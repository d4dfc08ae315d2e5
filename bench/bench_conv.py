"""Convolution: gpuk's kernels against cuDNN (and NumPy on small problems), forward, data
gradient and filter gradient, NHWC (channels_last).

Suites: the ResNet-50 layers at N=32 and N=256, MobileNetV2 depthwise 3x3 layers, a
stride-2 transpose conv (= conv_dgrad), conv1d (T=1024, k=3 and 11) and conv3d. Each row
reports TFLOP/s (2 * N * output pixels * prod(k) * C_in * C_out per pass; depthwise
2 * N * output pixels * prod(k) * C) and, once the cudnn row of the case has run, the ratio
to cuDNN. NumPy rows run only where one pass is under ``NUMPY_MAX_FLOPS`` (the CPU would
take minutes otherwise) and skip with that reason elsewhere. Depthwise's cuDNN rows run it
as a grouped convolution, one group per channel (gpuk/kernels/cudnn/conv.py).

Precision modes: the ResNet-50 layers run three times, each gpuk row against the cuDNN row
of its own case: float32 strict (``test_conv``: FFMA, no TF32; with the other float32
cases), TF32 (``test_conv_tf32``: float32 arrays under ``config.set_precision('tf32')``,
tensor cores with TF32 inputs on both sides; case names end in ' tf32') and bfloat16
(``test_conv_bfloat16``: bfloat16 arrays, float32 accumulation; ' bfloat16'). Their rows
carry the suite 'resnet50 fp32 strict', 'resnet50 tf32' or 'resnet50 bf16', and the
depthwise rows 'mobilenetv2 depthwise': the report averages gpuk / cuDNN per family over
each suite on its own (bench/rows.py suite_summary), the figures the convolution targets
are stated in.

``test_channels_first_transpose`` times the layout transposes a channels_first convolution
adds around the implicit GEMM (gpuk/kernels/layout.py) against CuPy's transpose copy.
"""
import math

import ml_dtypes  # noqa: F401  (registers the 'bfloat16' dtype name with NumPy)
import numpy as np
import pytest

from bench import harness as h
from gpuk import config
from gpuk.cpu_fallback import conv as twin
from gpuk.contracts import geometry
from gpuk.kernels.cudnn import conv as cudnn_conv

NUMPY_MAX_FLOPS = 2e9
PASSES = ('fwd', 'dgrad', 'wgrad')


def _resnet(n):
    """(name, spatial, C_in, C_out, kernel, stride) of the ResNet-50 convolutions at batch n."""
    layers = [('conv1 7x7/2', 224, 3, 64, 7, 2), ('res2 3x3', 56, 64, 64, 3, 1), ('res2 1x1 64-256', 56, 64, 256, 1, 1),
              ('res2 1x1 256-64', 56, 256, 64, 1, 1), ('res3 3x3', 28, 128, 128, 3, 1),
              ('res3 1x1 512-128', 28, 512, 128, 1, 1), ('res4 3x3', 14, 256, 256, 3, 1),
              ('res4 1x1 1024-256', 14, 1024, 256, 1, 1), ('res5 3x3', 7, 512, 512, 3, 1),
              ('res5 1x1 2048-512', 7, 2048, 512, 1, 1),
              ('down3 1x1/2 256-512', 56, 256, 512, 1, 2), ('down4 1x1/2 512-1024', 28, 512, 1024, 1, 2),
              ('down5 1x1/2 1024-2048', 14, 1024, 2048, 1, 2)]
    return [('resnet50 N=%d %s' % (n, name), n, (s, s), c_in, c_out, (k, k), (st, st))
            for name, s, c_in, c_out, k, st in layers]


# (case, N, spatial, C_in, C_out, kernel, strides) for ordinary convolutions ('same' padding).
CONV_CASES = (_resnet(32) + _resnet(256) + [
    ('conv1d N=32 T=1024 256-256 k=3', 32, (1024,), 256, 256, (3,), (1,)),
    ('conv1d N=32 T=1024 256-256 k=11', 32, (1024,), 256, 256, (11,), (1,)),
    ('conv3d N=2 32^3 32-64 k=3', 2, (32, 32, 32), 32, 64, (3, 3, 3), (1, 1, 1)),
    ('conv3d N=2 64^3 32-64 k=3', 2, (64, 64, 64), 32, 64, (3, 3, 3), (1, 1, 1)),
])
# The transpose conv 32^2 x 256 -> 128, stride 2 (output 64^2) is conv_dgrad of a conv
# 64^2 x 128 -> 256 with stride 2; its other passes are that conv's fwd and wgrad.
TRANSPOSE_CASES = [('conv_transpose N=32 32^2 256-128 k=3/2', 32, (64, 64), 128, 256, (3, 3), (2, 2))]
# (case, N, spatial, C) MobileNetV2 depthwise 3x3, stride 1, multiplier 1.
DEPTHWISE_CASES = [('mobilenetv2 dw N=32 %d^2x%d' % (s, c), 32, (s, s), c) for s, c in
                   [(112, 32), (56, 144), (28, 240), (14, 672)]]


def _same_pads(spatial, kernel, strides):
    return geometry.conv_pads(spatial, kernel, strides, (1,) * len(spatial), 'same')


def _conv_problem(n, spatial, c_in, c_out, kernel, strides):
    pads = _same_pads(spatial, kernel, strides)
    out = tuple(geometry.conv_output_length(s, k, 'same', st) for s, k, st in zip(spatial, kernel, strides))
    flops = 2 * n * math.prod(out) * math.prod(kernel) * c_in * c_out
    return pads, out, flops


def _inputs(xp_random, dtype, shapes):
    return tuple(xp_random.standard_normal(s, dtype=np.float32).astype(dtype) for s in shapes)


def _conv_row(impl, pass_name, n, spatial, c_in, c_out, kernel, strides, dtype):
    """(fn, make_inputs, set_bytes, bytes_moved, flops) of one conv row."""
    pads, out, flops = _conv_problem(n, spatial, c_in, c_out, kernel, strides)
    itemsize = np.dtype(dtype).itemsize
    x_shape, w_shape, y_shape = (n, *spatial, c_in), (*kernel, c_in, c_out), (n, *out, c_out)
    geometry_args = (strides, (1,) * len(spatial), pads, 'channels_last')
    shapes = {'fwd': (x_shape, w_shape), 'dgrad': (y_shape, w_shape), 'wgrad': (x_shape, y_shape)}[pass_name]
    result = {'fwd': y_shape, 'dgrad': x_shape, 'wgrad': w_shape}[pass_name]
    set_bytes = sum(math.prod(s) for s in shapes) * itemsize
    bytes_moved = set_bytes + math.prod(result) * itemsize
    if impl == 'numpy':
        module, make = twin, lambda i: _inputs(np.random.default_rng(i), dtype, shapes)
    else:
        import cupy
        from gpuk.kernels import conv as gpuk_conv
        module = gpuk_conv if impl == 'gpuk' else cudnn_conv

        def make(i):
            return _inputs(cupy.random.RandomState(i), dtype, shapes)
    extra = {'fwd': (), 'dgrad': (x_shape,), 'wgrad': (w_shape,)}[pass_name]
    function = getattr(module, 'conv_' + pass_name)
    kwargs = {'runtime': 'cuda'} if impl == 'gpuk' else {}

    def fn(a, b):
        return function(a, b, *extra, *geometry_args, **kwargs)
    return fn, make, set_bytes, bytes_moved, flops


def _params(cases, impls):
    return [pytest.param(impl, pass_name, case, id='%s-%s-%s' % (case[0], pass_name, impl))
            for case in cases for pass_name in PASSES for impl in impls]


def _skip_numpy_if_large(impl, flops):
    if impl == 'numpy' and flops > NUMPY_MAX_FLOPS:
        pytest.skip('numpy: %.1f GFLOP per pass is too slow on the CPU (limit %.1f)' % (flops / 1e9,
                                                                                         NUMPY_MAX_FLOPS / 1e9))


def _run_conv(benchmark, harness, impl, pass_name, case, dtype, suite=None):
    name, n, spatial, c_in, c_out, kernel, strides = case
    h.require(impl)
    _, _, flops = _conv_problem(n, spatial, c_in, c_out, kernel, strides)
    _skip_numpy_if_large(impl, flops)
    fn, make, set_bytes, bytes_moved, flops = _conv_row(impl, pass_name, n, spatial, c_in, c_out, kernel, strides,
                                                        dtype)
    info = harness.run(benchmark, family='conv_' + pass_name, case=name, impl=impl, fn=fn, make_inputs=make,
                       set_bytes=set_bytes, bytes_moved=bytes_moved, flops=flops, dtype=dtype, suite=suite)
    assert info['tflops'] > 0


RESNET_CASES = _resnet(32) + _resnet(256)
RESNET_NAMES = {case[0] for case in RESNET_CASES}


@pytest.mark.parametrize('impl, pass_name, case', _params(CONV_CASES + TRANSPOSE_CASES, ('gpuk', 'cudnn', 'numpy')))
def test_conv(benchmark, harness, impl, pass_name, case):
    _run_conv(benchmark, harness, impl, pass_name, case, 'float32',
              suite='resnet50 fp32 strict' if case[0] in RESNET_NAMES else None)


BFLOAT16_CASES = [(name + ' bfloat16', *rest) for name, *rest in RESNET_CASES]


@pytest.mark.parametrize('impl, pass_name, case', _params(BFLOAT16_CASES, ('gpuk', 'cudnn')))
def test_conv_bfloat16(benchmark, harness, impl, pass_name, case):
    _run_conv(benchmark, harness, impl, pass_name, case, 'bfloat16', suite='resnet50 bf16')


TF32_CASES = [(name + ' tf32', *rest) for name, *rest in RESNET_CASES]


@pytest.fixture
def tf32_precision():
    """config.precision() 'tf32' for the row (gpuk's tensor-core tiles, cuDNN's TF32 engines)."""
    saved = config.precision()
    config.set_precision('tf32')
    yield
    config.set_precision(saved)


@pytest.mark.parametrize('impl, pass_name, case', _params(TF32_CASES, ('gpuk', 'cudnn')))
def test_conv_tf32(benchmark, harness, tf32_precision, impl, pass_name, case):
    _run_conv(benchmark, harness, impl, pass_name, case, 'float32', suite='resnet50 tf32')


def _depthwise_row(impl, pass_name, n, spatial, channels, dtype):
    kernel, strides = (3, 3), (1, 1)
    pads = _same_pads(spatial, kernel, strides)
    flops = 2 * n * math.prod(spatial) * 9 * channels
    itemsize = np.dtype(dtype).itemsize
    x_shape, w_shape = (n, *spatial, channels), (*kernel, channels, 1)
    shapes = {'fwd': (x_shape, w_shape), 'dgrad': (x_shape, w_shape), 'wgrad': (x_shape, x_shape)}[pass_name]
    set_bytes = sum(math.prod(s) for s in shapes) * itemsize
    bytes_moved = set_bytes + math.prod(x_shape if pass_name != 'wgrad' else w_shape) * itemsize
    extra = {'fwd': (), 'dgrad': (x_shape,), 'wgrad': (w_shape,)}[pass_name]
    geometry_args = (strides, (1, 1), pads, 'channels_last')
    if impl == 'numpy':
        function, kwargs = getattr(twin, 'depthwise_conv_' + pass_name), {}

        def make(i):
            return _inputs(np.random.default_rng(i), dtype, shapes)
    else:
        import cupy
        from gpuk.kernels import conv as gpuk_conv
        module = gpuk_conv if impl == 'gpuk' else cudnn_conv
        function = getattr(module, 'depthwise_conv_' + pass_name)
        kwargs = {'runtime': 'cuda'} if impl == 'gpuk' else {}

        def make(i):
            return _inputs(cupy.random.RandomState(i), dtype, shapes)

    def fn(a, b):
        return function(a, b, *extra, *geometry_args, **kwargs)
    return fn, make, set_bytes, bytes_moved, flops


@pytest.mark.parametrize('impl, pass_name, case', _params(DEPTHWISE_CASES, ('gpuk', 'cudnn', 'numpy')))
def test_depthwise(benchmark, harness, impl, pass_name, case):
    name, n, spatial, channels = case
    h.require(impl)
    _skip_numpy_if_large(impl, 2 * n * math.prod(spatial) * 9 * channels)
    fn, make, set_bytes, bytes_moved, flops = _depthwise_row(impl, pass_name, n, spatial, channels, 'float32')
    info = harness.run(benchmark, family='depthwise_' + pass_name, case=name, impl=impl, fn=fn, make_inputs=make,
                       set_bytes=set_bytes, bytes_moved=bytes_moved, flops=flops, dtype='float32',
                       suite='mobilenetv2 depthwise')
    assert info['tflops'] > 0


# (case, shape (N, C, H, W), dtype) of the transposes a channels_first convolution adds around
# the implicit GEMM (gpuk/kernels/layout.py): a ResNet-50 stage-2 activation each way, an RGB
# input (the thin-plane kernel), and bfloat16. gpuk's kernel against CuPy's generic transpose
# copy; bytes are counted read + write.
TRANSPOSE_CASES_NCHW = [('NCHW->NHWC N=32 256x56x56', (32, 256, 56, 56), 'float32', 'last'),
                        ('NHWC->NCHW N=32 56x56x256', (32, 256, 56, 56), 'float32', 'first'),
                        ('NCHW->NHWC N=32 3x224x224', (32, 3, 224, 224), 'float32', 'last'),
                        ('NCHW->NHWC N=32 256x56x56 bfloat16', (32, 256, 56, 56), 'bfloat16', 'last')]


@pytest.mark.parametrize('impl, case', [pytest.param(impl, case, id='%s-%s' % (case[0], impl))
                                        for case in TRANSPOSE_CASES_NCHW for impl in ('gpuk', 'cupy')])
def test_channels_first_transpose(benchmark, harness, impl, case):
    name, (n, c, height, width), dtype, to = case
    h.require(impl)
    import cupy
    from gpuk.kernels import layout
    shape = (n, c, height, width) if to == 'last' else (n, height, width, c)
    if impl == 'gpuk':
        function = layout.to_channels_last if to == 'last' else layout.to_channels_first

        def fn(x):
            return function(x, runtime='cuda')
    else:
        axes = (0, 2, 3, 1) if to == 'last' else (0, 3, 1, 2)

        def fn(x):
            return cupy.ascontiguousarray(x.transpose(axes))
    nbytes = math.prod(shape) * np.dtype(dtype).itemsize
    info = harness.run(benchmark, family='layout_transpose', case=name, impl=impl, fn=fn,
                       make_inputs=lambda i: _inputs(cupy.random.RandomState(i), dtype, [shape]),
                       set_bytes=nbytes, bytes_moved=2 * nbytes, dtype=dtype)
    assert info['gbps'] > 0
