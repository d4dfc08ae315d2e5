"""The mixed-precision policies below Keras: the setting, the half-precision GEMM (NumPy
twin, and the cuBLAS launcher where a GPU or the GPU rehearsal is at hand), which plan steps
run in which dtype, results against float64 references of the rounded operands, the
emulated kernels against the NumPy device, and dynamic loss scaling."""
import os
import subprocess
import sys

import ml_dtypes
import numpy as np
import pytest

from gpuk import autodiff, config, device, loss_scaling, mixed_precision
from gpuk import backend as K
from gpuk.cpu_fallback import matmul as twin
from gpuk.kernels import runtime

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
BF16 = np.dtype(ml_dtypes.bfloat16)
HALF = {'mixed_bfloat16': BF16, 'mixed_float16': np.dtype(np.float16)}
# One rounding to the half dtype (plus float32 sums): 2^-8 for bfloat16, 2^-11 for float16.
ULP = {BF16: 2.0 ** -8, np.dtype(np.float16): 2.0 ** -11}


pytestmark = pytest.mark.usefixtures('restore_precision')


def _rounded(array, dtype):
    return np.asarray(array).astype(dtype).astype(np.float64)


# --- the setting ----------------------------------------------------------------------------

def test_set_precision_takes_the_four_policies_and_names_itself_on_bad_input():
    for policy in config.PRECISIONS:
        config.set_precision(policy)
        assert config.precision() == policy
    with pytest.raises(ValueError, match=r"set_precision: precision must be one of .*mixed_float16.*got 'bf16'"):
        config.set_precision('bf16')
    assert config.precision() == config.PRECISIONS[-1]


def _python(code, **env):
    environment = dict(os.environ, PYTHONPATH=REPO, **env)
    return subprocess.run([sys.executable, '-c', code], capture_output=True, text=True, env=environment,
                          timeout=60)


def test_gpuk_precision_environment_variable():
    done = _python('from gpuk import config; print(config.precision())', GPUK_PRECISION='mixed_bfloat16')
    assert done.returncode == 0 and done.stdout.strip() == 'mixed_bfloat16', done.stderr
    done = _python('import gpuk.config', GPUK_PRECISION='half')
    assert done.returncode != 0 and "GPUK_PRECISION: precision must be one of" in done.stderr


# --- the half-precision GEMM ------------------------------------------------------------------

GEMM_SHAPES = [((5, 7), (7, 3)), ((2, 4, 6), (6, 5)), ((3, 1, 4, 6), (2, 6, 5)), ((4, 6), (3, 6, 2))]


@pytest.mark.parametrize('dtype', [np.float16, ml_dtypes.bfloat16], ids=['float16', 'bfloat16'])
@pytest.mark.parametrize('a_shape,b_shape', GEMM_SHAPES)
def test_twin_multiplies_half_operands_and_sums_in_float32(rng, dtype, a_shape, b_shape):
    a = rng.standard_normal(a_shape).astype(dtype)
    b = rng.standard_normal(b_shape).astype(dtype)
    got = twin.matmul(a, b)
    exact = np.matmul(a.astype(np.float64), b.astype(np.float64))
    assert got.dtype == np.dtype(dtype) and got.shape == exact.shape
    # the exact sum of the products, rounded once to the half dtype
    scale = np.matmul(np.abs(a.astype(np.float64)), np.abs(b.astype(np.float64)))
    assert np.all(np.abs(got.astype(np.float64) - exact) <= ULP[np.dtype(dtype)] * np.abs(exact) + 1e-6 * scale)


def test_twin_refuses_mixed_dtypes_and_mismatched_shapes():
    a = np.ones((2, 3), np.float16)
    with pytest.raises(TypeError, match='matmul: a and b must have the same dtype, got float16 and bfloat16'):
        twin.matmul(a, np.ones((3, 2), BF16))
    with pytest.raises(ValueError, match=r'matmul: inner dimensions differ: shapes \(2, 3\) and \(2, 2\)'):
        twin.matmul(a, np.ones((2, 2), np.float16))
    with pytest.raises(TypeError, match='matmul: a must be a float16, bfloat16, float32 or float64 array'):
        twin.matmul(np.ones((2, 3), np.int16), np.ones((3, 2), np.int16))


@pytest.mark.gpu
@pytest.mark.parametrize('dtype', [np.float16, ml_dtypes.bfloat16], ids=['float16', 'bfloat16'])
@pytest.mark.parametrize('a_shape,b_shape', GEMM_SHAPES)
def test_cublas_gemm_matches_the_twin(rng, dtype, a_shape, b_shape):
    """cublasGemmStridedBatchedEx (row-major as column-major, broadcast batch strides) against
    the twin: the same products, float32 sums in another order, one rounding apart at most."""
    from gpuk.kernels import matmul as launcher
    rt = runtime.get_runtime('cuda')
    a = rng.standard_normal(a_shape).astype(dtype)
    b = rng.standard_normal(b_shape).astype(dtype)
    got = launcher.matmul(rt.xp.asarray(a), rt.xp.asarray(b), runtime=rt)
    want = twin.matmul(a, b)
    assert got.dtype == want.dtype and tuple(got.shape) == want.shape
    got = device.to_host(got).astype(np.float64)
    np.testing.assert_allclose(got, want.astype(np.float64), rtol=2 * ULP[np.dtype(dtype)], atol=1e-3)


# --- the plan pass ----------------------------------------------------------------------------

def _dense_and_conv(x, w, images, kernel, depthwise_kernel):
    dense = K.dot(x, w)
    batched = K.batch_dot(K.reshape(x, (2, 3, 4)), K.reshape(x, (2, 3, 4)), axes=(2, 2))
    conv = K.conv2d(images, kernel, padding='same')
    depthwise = K.depthwise_conv2d(images, depthwise_kernel)
    return [dense, batched, conv, depthwise]


def _arrays(rng):
    return [rng.standard_normal(s).astype(np.float32)
            for s in [(6, 4), (4, 5), (2, 5, 5, 3), (3, 3, 3, 4), (3, 3, 3, 2)]]


@pytest.mark.parametrize('policy', ['mixed_bfloat16', 'mixed_float16'])
def test_products_and_convolutions_round_their_operands_and_results(rng, policy):
    arrays = _arrays(rng)
    placeholders = [K.placeholder(a.shape) for a in arrays]
    function = K.function(placeholders, _dense_and_conv(*placeholders))
    full = function(arrays)
    config.set_precision(policy)
    half = HALF[policy]
    mixed = function(arrays)        # the same function, recompiled for the new policy
    x, w, images, kernel, depthwise_kernel = [_rounded(a, half) for a in arrays]
    x3 = x.reshape(2, 3, 4)
    from gpuk.cpu_fallback import conv as conv_twin
    references = [x @ w, np.einsum('bij,bkj->bik', x3, x3),
                  conv_twin.conv_fwd(images, kernel, (1, 1), (1, 1), ((1, 1), (1, 1)), 'channels_last'),
                  conv_twin.depthwise_conv_fwd(images, depthwise_kernel, (1, 1), (1, 1), ((0, 0), (0, 0)),
                                               'channels_last')]
    for got, want, f32 in zip(mixed, references, full):
        assert got.dtype == np.float32
        np.testing.assert_array_equal(got, want.astype(half).astype(np.float32))
        assert not np.array_equal(got, f32)      # the policy did reach it
    config.set_precision('float32')
    for got, want in zip(function(arrays), full):
        np.testing.assert_array_equal(got, want)


def test_the_plan_says_which_step_runs_in_which_dtype(rng):
    config.set_precision('mixed_bfloat16')
    placeholders = [K.placeholder(a.shape) for a in _arrays(rng)]
    outputs = _dense_and_conv(*placeholders)
    loss = sum(K.sum(K.square(y)) for y in outputs)
    function = K.function(placeholders, [K.softmax(outputs[0]), loss] + K.gradients(loss, placeholders))
    steps = mixed_precision.step_dtypes(function)
    half_steps = sorted(name for name, dtype in steps if dtype == 'bfloat16')
    # forward and both gradients of dot, batch_dot (2 operands, one tensor: 2 gradient
    # products), conv and depthwise conv
    assert half_steps == sorted(['MatMul'] * 6 + ['ConvFwd', 'ConvDgrad', 'ConvWgrad'] * 2), steps
    assert all(dtype in ('float32', 'int32', 'int64', 'bool') for name, dtype in steps if dtype != 'bfloat16')


def test_float64_and_float16_graphs_keep_their_precision(rng):
    config.set_precision('mixed_bfloat16')
    for dtype in ('float64', 'float16'):
        a, b = rng.standard_normal((3, 4)).astype(dtype), rng.standard_normal((4, 2)).astype(dtype)
        x, y = K.placeholder((3, 4), dtype=dtype), K.placeholder((4, 2), dtype=dtype)
        function = K.function([x, y], [K.dot(x, y)])
        got = function([a, b])[0]
        assert got.dtype == dtype
        assert mixed_precision.step_dtypes(function) == [('MatMul', dtype)]
        np.testing.assert_allclose(got, a.astype(np.float64) @ b, rtol=2e-3 if dtype == 'float16' else 1e-12)


@pytest.mark.parametrize('policy', ['mixed_bfloat16', 'mixed_float16'])
def test_emulated_kernels_match_the_numpy_device(on, rng, policy):
    """The tensor-core convolution kernels (bfloat16 / float16 MMA, float32 accumulation) on
    the emulated CUDA runtime against the NumPy twins, forward and both gradients."""
    config.set_precision(policy)
    x, kernel = rng.standard_normal((2, 6, 5, 3)).astype(np.float32), rng.standard_normal((3, 3, 3, 8)).astype(np.float32)
    weights = rng.standard_normal((2, 6, 5, 8)).astype(np.float32)

    def run(kind):
        on(kind)
        xp, kp = K.placeholder(x.shape), K.placeholder(kernel.shape)
        y = K.conv2d(xp, kp, padding='same')
        return K.function([xp, kp], [y] + K.gradients(K.sum(y * K.constant(weights)), [xp, kp]))([x, kernel])

    on_cpu, emulated = run('cpu'), run('emulate')
    for want, got in zip(on_cpu, emulated):
        # float32 sums in another order: results one half-precision rounding apart at most
        np.testing.assert_allclose(got, want, rtol=2 * ULP[HALF[policy]], atol=1e-2)


# --- loss scaling -----------------------------------------------------------------------------

def test_loss_scaler_backs_off_and_grows_like_grad_scaler():
    scaler = loss_scaling.LossScaler(growth_interval=3)
    assert scaler.scale == 2.0 ** 16 and float(scaler.scale_variable.value) == 2.0 ** 16
    scaler.update(False)
    assert scaler.scale == 2.0 ** 15
    for _ in range(2):
        scaler.update(True)
    scaler.update(False)          # the count restarts
    for _ in range(2):
        scaler.update(True)
    assert scaler.scale == 2.0 ** 14
    scaler.update(True)
    assert scaler.scale == 2.0 ** 15 and float(scaler.scale_variable.value) == 2.0 ** 15


def test_loss_scaling_keeps_small_float16_gradients_from_flushing_to_zero(rng):
    """d/dw of 1e-8 * sum(x @ w) is 1e-8 * column sums of x: below float16's smallest
    subnormal (6e-8) in the product's backward, so unscaled it is 0; scaled by 2^16 it survives."""
    config.set_precision('mixed_float16')
    a = rng.uniform(0.5, 1.0, (4, 3)).astype(np.float32)
    x, w = K.placeholder((4, 3)), K.variable(np.ones((3, 2)))
    loss = K.sum(K.dot(x, w)) * 1e-8
    scaled = K.gradients(loss, [w])[0]
    unscaled = autodiff.gradients(loss, [w])[0]
    got_scaled, got_unscaled = K.function([x], [scaled, unscaled])([a])
    want = np.repeat(1e-8 * a.sum(axis=0, dtype=np.float64)[:, None], 2, axis=1)
    np.testing.assert_allclose(got_scaled, want, rtol=4 * ULP[np.dtype(np.float16)])
    assert not got_unscaled.any()
    assert loss_scaling.loss_scaler(scaled) is not None and loss_scaling.loss_scaler(unscaled) is None


def test_a_step_with_an_overflowing_gradient_is_skipped_and_the_next_applies():
    config.set_precision('mixed_float16')
    x, w = K.placeholder((2, 2)), K.variable(np.ones((2, 2)))
    steps = K.variable(0.0)
    loss = K.sum(K.dot(x, w))
    g = K.gradients(loss, [w])[0]
    step = K.function([x], [loss], updates=[K.update(w, w - 0.5 * g), K.update_add(steps, 1.0)])
    scaler = loss_scaling.loss_scaler(g)
    a = np.full((2, 2), 1e-3, np.float32)
    with np.errstate(over='ignore', invalid='ignore'):
        step([a])     # the seed 2^16 itself is inf in float16 (max 65504): skipped
    assert float(steps.value) == 0 and scaler.scale == 2.0 ** 15
    np.testing.assert_array_equal(w.value, np.ones((2, 2)))
    step([a])         # 2^15 fits: applied, with the unscaled gradient (column sums of a)
    assert float(steps.value) == 1 and scaler.scale == 2.0 ** 15
    np.testing.assert_allclose(w.value, 1 - 0.5 * 2e-3, rtol=1e-3)
    with np.errstate(over='ignore', invalid='ignore'):
        step([np.full((2, 2), 1e4, np.float32)])   # 2^15 * 2e4 overflows float16: skipped
    assert float(steps.value) == 1 and scaler.scale == 2.0 ** 14
    np.testing.assert_allclose(w.value, 1 - 0.5 * 2e-3, rtol=1e-3)
    # a function without updates is not a training step: no guard, nothing skipped
    assert K.function([x], [g])._guard is None
