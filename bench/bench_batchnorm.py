"""Batch normalization: gpuk's fused kernels vs cuDNN Frontend graphs vs the NumPy twin.

Cases: training forward, inference and backward on ResNet-50's activation shapes at N=256
(112^2 x 64, 56^2 x 256, 28^2 x 512, 14^2 x 1024, 7^2 x 2048), an N=8 latency case
(56^2 x 256) and a >= 1 GB case (112^2 x 64 at N=512, 1.6 GB of float32 x); float32 and
float16; NHWC and NCHW. NumPy rows run each shape at N=2.

Bytes are the fewest a call must move: forward and inference read x and write y;
backward reads x and dy and writes dx (statistics are negligible); the fused BN + ReLU
backward also reads y, the forward's output (its mask). Fused rows: BN + ReLU (train,
infer, bwd: '_relu') and training with the moving averages ('train_moving', momentum 0.99
and Keras's variance correction), the same calls the graph's fusions make. gpuk's training
forward reads x twice (statistics, then normalize), so it tops out near 2/3 of the copy
ceiling by this count; so does any two-pass implementation.
"""
import math

import numpy as np
import pytest

from bench import harness as h

SHAPES = [(256, 112, 64), (256, 56, 256), (256, 28, 512), (256, 14, 1024), (256, 7, 2048), (8, 56, 256),
          (512, 112, 64)]
CPU_N = 2
OPS = ['train', 'infer', 'bwd', 'train_relu', 'infer_relu', 'bwd_relu', 'train_moving']
DTYPES = ['float32', 'float16']
FORMATS = ['channels_last', 'channels_first']
ROWS = [(s, op, d, f, impl) for s in SHAPES for op in OPS for d in DTYPES for f in FORMATS
        for impl in ('gpuk', 'cudnn')]
# NumPy: each distinct spatial x channel shape once, float32 (both formats).
ROWS += [(s, op, 'float32', f, 'numpy') for s in SHAPES[:5] for op in OPS for f in FORMATS]


def _row_id(row):
    (n, hw, c), op, dtype, data_format, impl = row
    return '%s-%dx%dx%dx%d-%s-%s-%s' % (op, n, hw, hw, c, dtype, 'nhwc' if data_format == 'channels_last' else 'nchw',
                                      impl)


def bn_row(shape, op, dtype, data_format, impl):
    """(fn, make_inputs, set_bytes, bytes_moved, case label) of one row."""
    n, hw, c = shape
    if impl == 'numpy':
        n = CPU_N
    base, _, fusion = op.partition('_')
    activation = 'relu' if fusion == 'relu' else 'linear'
    channels_last = data_format == 'channels_last'
    x_shape = (n, hw, hw, c) if channels_last else (n, c, hw, hw)
    axes = (0, 1, 2) if channels_last else (0, 2, 3)
    axis = 3 if channels_last else 1
    x_bytes = math.prod(x_shape) * np.dtype(dtype).itemsize
    reads = {'bwd': 3, 'bwd_relu': 4}.get(op, 2)
    moved = reads * x_bytes
    label = 'bn %s %dx%dx%dx%d %s %s' % (op, n, hw, hw, c, 'NHWC' if channels_last else 'NCHW', dtype)
    stat = 'float32'
    if impl == 'numpy':
        from gpuk.cpu_fallback import batchnorm as module
        xp, run = np, {}
    else:
        import cupy as xp
        from gpuk.kernels import batchnorm
        from gpuk.kernels.cudnn import batchnorm as cudnn_batchnorm
        module = batchnorm if impl == 'gpuk' else cudnn_batchnorm
        run = {'runtime': 'cuda'} if impl == 'gpuk' else {}

    def make_inputs(i):
        rng = np.random.default_rng(i)
        x = xp.asarray(rng.standard_normal(x_shape, dtype=np.float32).astype(dtype))
        gamma = xp.asarray(rng.uniform(0.5, 1.5, c).astype(stat))
        beta = xp.asarray(rng.standard_normal(c).astype(stat))
        mean = xp.asarray(rng.standard_normal(c).astype(stat))
        spread = xp.asarray(rng.uniform(0.5, 2.0, c).astype(stat))
        if base == 'train':
            return (x, gamma, beta, mean, spread) if fusion == 'moving' else (x, gamma, beta)
        if base == 'infer':
            return x, mean, spread, gamma, beta
        dy = xp.asarray(rng.standard_normal(x_shape, dtype=np.float32).astype(dtype))
        if fusion == 'relu':   # the mask the fused forward's output gives (about half zeros)
            return dy, x, gamma, mean, spread, xp.maximum(x, 0)
        return dy, x, gamma, mean, spread
    count = math.prod(x_shape) // c
    keras_factor = count / (count - 1.001)   # BatchNormalization's variance correction
    if op == 'train_moving':
        fn = lambda x, g, b, m, v: module.bn_train_fwd(   # noqa: E731
            x, g, b, axes, 1e-3, 'linear', m, v, 0.01, 0.01, keras_factor, **run)
    elif base == 'train':
        fn = lambda x, g, b: module.bn_train_fwd(x, g, b, axes, 1e-3, activation, **run)   # noqa: E731
    elif base == 'infer':
        if impl == 'cudnn':   # the launcher places 1-D parameters on `axis` before calling cuDNN
            shape = [1] * 4
            shape[axis] = c
            fn = lambda x, m, v, g, b: module.bn_infer_fwd(   # noqa: E731
                x, m.reshape(shape), v.reshape(shape), g.reshape(shape), b.reshape(shape), 1e-3, axis, activation)
        else:
            fn = lambda x, m, v, g, b: module.bn_infer_fwd(x, m, v, g, b, 1e-3, axis, activation, **run)   # noqa: E731
    elif fusion == 'relu':
        fn = lambda dy, x, g, m, s, y: module.bn_bwd(   # noqa: E731
            dy, x, g, m, s, axes, activation='relu', y=y, **run)
    else:
        fn = lambda dy, x, g, m, s: module.bn_bwd(dy, x, g, m, s, axes, **run)   # noqa: E731
    set_bytes = reads * x_bytes
    return fn, make_inputs, set_bytes, moved, label


@pytest.mark.parametrize('shape, op, dtype, data_format, impl', ROWS, ids=[_row_id(r) for r in ROWS])
def test_batchnorm(benchmark, harness, shape, op, dtype, data_format, impl):
    h.require(impl)
    fn, make_inputs, set_bytes, moved, label = bn_row(shape, op, dtype, data_format, impl)
    info = harness.run(benchmark, family='batchnorm', case=label, impl=impl, fn=fn, make_inputs=make_inputs,
                       set_bytes=set_bytes, bytes_moved=moved, dtype=dtype)
    assert info['gbps'] > 0
