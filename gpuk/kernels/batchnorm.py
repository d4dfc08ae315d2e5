"""Launchers for batchnorm.cu: fused batch normalization (training, inference, backward).

Same names and signatures as gpuk/cpu_fallback/batchnorm.py, plus a keyword-only `runtime`
(None: runtime.current(); 'cuda', 'emulate', or a runtime object); the same checks and
messages, before any launch. On the CUDA runtime each call goes through
``dispatch.run('batchnorm', ...)``, which may pick the cuDNN Frontend graphs in
gpuk/kernels/cudnn/batchnorm.py (``GPUK_KERNELS=batchnorm=cudnn|auto``).

Layouts: x is viewed as (outer, C, inner) when the kept (non-reduced) axes are one
contiguous run: channels last (inner == 1) and channels first (N, C, H, W...) run natively.
Any other set of reduced axes (kept axes not contiguous, e.g. axes=(1,) of a 3-d x) is
transposed here to a channels-last (count, C) copy, computed, and transposed back: two
extra copies of x (and dy) for a case no Keras layer produces.
Float16 accumulates in float32; statistics and dgamma / dbeta are float32 then, like the twin.

Fusions (see the twin): ``activation='relu'`` is bn_apply's relu flag (training and inference)
and the *_relu backward kernels, which mask dy by the fused output y (plans call them where
gpuk/fusion.py folds the relu's gradient into BnGrad: no learning-phase switch between
them); the moving-average update is bn_stats_finalize_moving, the training forward's
finalize launch itself.

This module checks and prepares; the launch set-up (tile constants, grids and splits, reused
buffers, the per-problem launch objects) is gpuk/kernels/batchnorm_launch.py.
"""
import functools
import math

import numpy as np

from gpuk.contracts import batchnorm_checks
from gpuk.contracts.dtypes import FLOAT_DTYPES_NO_BFLOAT16, accumulation_dtype
from . import dispatch
from .batchnorm_launch import (_BwdLaunches, _InferLaunches, _InferPlan, _TrainLaunches, _View, _contiguous,
                               _flat_param, _flat_params, _host_number, _is_host_number)
from .cudnn import batchnorm as cudnn_batchnorm
from .runtime import prepared, resolve

__all__ = ['bn_train_fwd', 'bn_infer_fwd', 'bn_bwd', 'bn_train_fwd_runner', 'bn_infer_fwd_runner', 'bn_bwd_runner']


# ---------------------------------------------------------------- checks (xp arrays)

def _float_array(fn, name, value, xp):
    array = value if isinstance(value, xp.ndarray) else xp.asarray(value)
    if array.dtype.kind != 'f' or array.dtype not in FLOAT_DTYPES_NO_BFLOAT16:
        raise TypeError('%s: %s must be a float16, float32 or float64 array, got dtype %s'
                        % (fn, name, array.dtype))
    return array


def _kept_param(fn, name, value, layout, acc, xp):
    """None, or any array with the kept size, as a flat contiguous acc-dtype array."""
    if value is None:
        return None
    array = _float_array(fn, name, value, xp)
    if array.shape != layout.kept_shape and array.size != math.prod(layout.kept_shape):
        raise ValueError('%s: %s must have shape %s (x shape %s without the reduced axes %s), '
                         'got shape %s' % (fn, name, layout.kept_shape, layout.shape, layout.axes, array.shape))
    return xp.ascontiguousarray(array.reshape(-1), dtype=acc)


def _with_step_buffers(run_with, launches):
    """The runner ``run_with(gpuk_fn)``, gpuk's launches taking their outputs from new arrays, or
    in a plan step's variant from its reused buffers (prepared.with_step_buffers)."""
    return prepared.with_step_buffers(lambda outputs: run_with(functools.partial(launches.run, outputs=outputs)),
                                      launches.outputs)


# ---------------------------------------------------------------- training forward

def bn_train_fwd(x, gamma, beta, axes, epsilon=1e-3, activation='linear', moving_mean=None, moving_var=None,
                 decay=None, var_decay=None, var_factor=None, *, runtime=None, single_kernel=True):
    """Batch statistics over `axes`, then normalize, scale and shift [and relu]
    -> (y, mean, var, inv_std[, next_moving_mean, next_moving_var]).

    ``single_kernel``: True takes bn_train_persistent where it fits (channels last, x within
    PERSISTENT_L2_FRACTION of the L2, a resident grid); False always takes the split path
    (sums, finalize, apply), as activations past the L2 do (the inspect report measures both)."""
    return bn_train_fwd_runner(x, gamma, beta, axes, epsilon, activation, moving_mean, moving_var, decay, var_decay,
                               var_factor, runtime=runtime, single_kernel=single_kernel)(
        x, gamma, beta, moving_mean, moving_var, decay, var_decay, var_factor)


def bn_train_fwd_runner(x, gamma, beta, axes, epsilon=1e-3, activation='linear', moving_mean=None, moving_var=None,
                        decay=None, var_decay=None, var_factor=None, *, runtime=None, single_kernel=True):
    """``run(x, gamma, beta, moving_mean=None, moving_var=None, decay=None, var_decay=None,
    var_factor=None)``, bn_train_fwd with these axes, epsilon and activation for arguments of the
    types, shapes and dtypes of these: checked and set up once per problem signature
    (runtime/prepared.py); a BnTrain plan step keeps it (prepared.Kept)."""
    fn = 'bn_train_fwd'
    if not isinstance(single_kernel, bool):
        raise TypeError('%s: single_kernel must be True or False, got %r' % (fn, single_kernel))
    rt = resolve(runtime)
    xp = rt.xp

    def prepare():   # once per problem signature (runtime/prepared.py)
        checked = _float_array(fn, 'x', x, xp)
        checked_epsilon = batchnorm_checks.check_epsilon(fn, epsilon)
        batchnorm_checks.check_activation(fn, activation)
        moving = batchnorm_checks.check_moving_args(fn, moving_mean, moving_var, decay, var_decay, var_factor)
        checked_axes = batchnorm_checks.normalize_axes(fn, axes, checked.ndim)
        layout = batchnorm_checks.Layout(checked.shape, checked_axes)
        if layout.count == 0:
            raise ValueError('%s: x must have elements along the reduced axes %s, got shape %s'
                             % (fn, checked_axes, checked.shape))
        acc = accumulation_dtype(checked.dtype)
        for name, value in (('gamma', gamma), ('beta', beta)) + (
                (('moving_mean', moving_mean), ('moving_var', moving_var)) if moving else ()):
            _kept_param(fn, name, value, layout, acc, xp)
        view = _View(checked.shape, layout)
        key = ('train', checked.dtype, view.key(), gamma is None, beta is None, activation, moving)
        # host numbers stay host numbers (reused buffers in scalars; cuDNN takes them by value),
        # device values become (1,) acc arrays: which is which is part of the signature
        scalars = (decay, decay if var_decay is None else var_decay, 1 if var_factor is None else var_factor)
        scalar_slots = tuple(_is_host_number(v) for v in scalars)
        device_scalars = not all(scalar_slots)
        numbers = None if device_scalars else tuple(float if getattr(v, 'ndim', 0) == 0 else _host_number
                                                    for v in scalars)
        launches = _TrainLaunches(rt, view, layout, checked.dtype, activation, moving, single_kernel,
                                  gamma is not None, beta is not None, numbers)
        to_x = None if type(x) is xp.ndarray else xp.asarray
        flat = [_flat_param(xp, p, acc) for p in (gamma, beta, moving_mean, moving_var)]
        converters = [f for f, _ in flat]
        direct = to_x is None and all(d for _, d in flat)

        def scalar(value, host):
            return value if host else xp.asarray(value, dtype=acc).reshape(1)

        def run_with(gpuk_fn):
            def run(x, gamma, beta, moving_mean=None, moving_var=None, decay=None, var_decay=None, var_factor=None):
                params = (gamma, beta, moving_mean, moving_var)
                if not (direct and _contiguous(params)):   # which conversions: per problem, or a strided view
                    x = x if to_x is None else to_x(x)
                    gamma, beta, moving_mean, moving_var = _flat_params(converters, params)
                if moving:
                    var_decay = decay if var_decay is None else var_decay
                    var_factor = 1 if var_factor is None else var_factor
                    if device_scalars:
                        decay, var_decay, var_factor = (scalar(v, host) for v, host in
                                                        zip((decay, var_decay, var_factor), scalar_slots))
                return dispatch.run(rt, 'batchnorm', key, gpuk_fn, cudnn_batchnorm.bn_train_fwd, x, gamma, beta,
                                    checked_axes, checked_epsilon, activation, moving_mean, moving_var, decay,
                                    var_decay, var_factor)
            return run
        return _with_step_buffers(run_with, launches)
    return prepared.get(rt, fn, (x, gamma, beta, moving_mean, moving_var, decay, var_decay, var_factor),
                        (axes, epsilon, activation, single_kernel), prepare)


# ---------------------------------------------------------------- inference forward

def _channel_param(fn, name, value, x, axis, acc, xp):
    """The twin's rule: 1-D of x.shape[axis] values goes on `axis`; else it must broadcast to x."""
    array = _float_array(fn, name, value, xp)
    if array.ndim == 1 and array.shape[0] == x.shape[axis] and x.ndim > 1:
        shape = [1] * x.ndim
        shape[axis] = array.shape[0]
        return array.astype(acc, copy=False).reshape(shape)
    try:
        full = np.broadcast_shapes(array.shape, x.shape)
    except ValueError:
        raise ValueError('%s: %s must have shape (%d,) (x.shape[axis] with axis=%d) or broadcast '
                         'to x shape %s, got shape %s'
                         % (fn, name, x.shape[axis], axis, x.shape, array.shape)) from None
    if full != x.shape:
        raise ValueError('%s: %s of shape %s would broadcast x shape %s to a larger shape'
                         % (fn, name, array.shape, x.shape))
    return array.astype(acc, copy=False).reshape((1,) * (x.ndim - array.ndim) + array.shape)


def bn_infer_fwd(x, mean, var, gamma, beta, epsilon=1e-3, axis=-1, activation='linear', *, runtime=None):
    """Keras `batch_normalization`: (x - mean) / sqrt(var + epsilon) * gamma + beta [then relu]."""
    return bn_infer_fwd_runner(x, mean, var, gamma, beta, epsilon, axis, activation, runtime=runtime)(
        x, mean, var, gamma, beta)


def bn_infer_fwd_runner(x, mean, var, gamma, beta, epsilon=1e-3, axis=-1, activation='linear', *, runtime=None):
    """``run(x, mean, var, gamma, beta)``, bn_infer_fwd with this epsilon, axis and activation for
    arguments of the types, shapes and dtypes of these: checked and set up once per problem
    signature (runtime/prepared.py); a BnInfer plan step keeps it (prepared.Kept)."""
    fn = 'bn_infer_fwd'
    rt = resolve(runtime)
    xp = rt.xp

    named = (('mean', mean), ('var', var), ('gamma', gamma), ('beta', beta))

    def prepare():   # once per problem signature (runtime/prepared.py)
        checked = _float_array(fn, 'x', x, xp)
        checked_epsilon = batchnorm_checks.check_epsilon(fn, epsilon)
        batchnorm_checks.check_activation(fn, activation)
        checked_axis = batchnorm_checks.check_channel_axis(fn, axis, checked.ndim)
        acc = accumulation_dtype(checked.dtype)
        # the parameters are part of the signature: their shapes (checked once) set their layout
        shapes = tuple(None if p is None else _channel_param(fn, n, p, checked, checked_axis, acc, xp).shape
                       for n, p in named)
        key = ('infer', checked.dtype, checked.shape, shapes, activation)
        launches = _InferLaunches(rt, _InferPlan(checked.shape, shapes, checked.dtype, activation), checked.dtype,
                                  [p for _, p in named], shapes)

        def cudnn_fn(x, *rest):   # cuDNN takes the parameters in their broadcastable shapes
            params = [None if p is None else (p if type(p) is xp.ndarray else xp.asarray(p)).astype(
                acc, copy=False).reshape(shape) for p, shape in zip(rest[:4], shapes)]
            return cudnn_batchnorm.bn_infer_fwd(x, *params, *rest[4:])

        def run_with(gpuk_fn):
            def run(x, mean, var, gamma, beta):
                return dispatch.run(rt, 'batchnorm', key, gpuk_fn, cudnn_fn,
                                    x if type(x) is xp.ndarray else xp.asarray(x),
                                    mean, var, gamma, beta, checked_epsilon, checked_axis, activation)
            return run
        return _with_step_buffers(run_with, launches)
    return prepared.get(rt, fn, (x, mean, var, gamma, beta), (epsilon, axis, activation), prepare)


# ---------------------------------------------------------------- backward

def bn_bwd(dy, x, gamma, mean, inv_std, axes, dmean=None, dvar=None, activation='linear', y=None, *,
           runtime=None):
    """Gradients of bn_train_fwd -> (dx, dgamma, dbeta), in two passes over x and dy (and y, the
    fused forward's output, with activation='relu': dy counts only where y > 0)."""
    return bn_bwd_runner(dy, x, gamma, mean, inv_std, axes, dmean, dvar, activation, y, runtime=runtime)(
        dy, x, gamma, mean, inv_std, dmean, dvar, y)


def bn_bwd_runner(dy, x, gamma, mean, inv_std, axes, dmean=None, dvar=None, activation='linear', y=None, *,
                  runtime=None):
    """``run(dy, x, gamma, mean, inv_std, dmean=None, dvar=None, y=None)``, bn_bwd with these axes
    and activation for arguments of the types, shapes and dtypes of these: checked and set up
    once per problem signature (runtime/prepared.py); a BnGrad plan step keeps it (prepared.Kept)."""
    fn = 'bn_bwd'
    rt = resolve(runtime)
    xp = rt.xp

    def prepare():   # once per problem signature (runtime/prepared.py)
        checked_x, checked_dy = _float_array(fn, 'x', x, xp), _float_array(fn, 'dy', dy, xp)
        if checked_dy.shape != checked_x.shape:
            raise ValueError('%s: dy must have the shape of x, got dy %s and x %s'
                             % (fn, checked_dy.shape, checked_x.shape))
        batchnorm_checks.check_relu_output(fn, activation, None if y is None else _float_array(fn, 'y', y, xp),
                                           checked_x)
        checked_axes = batchnorm_checks.normalize_axes(fn, axes, checked_x.ndim)
        layout = batchnorm_checks.Layout(checked_x.shape, checked_axes)
        if layout.count == 0:
            raise ValueError('%s: x must have elements along the reduced axes %s, got shape %s'
                             % (fn, checked_axes, checked_x.shape))
        if mean is None or inv_std is None:
            raise ValueError('%s: mean and inv_std (outputs of bn_train_fwd) are required' % fn)
        acc = accumulation_dtype(checked_x.dtype)
        for name, value in (('mean', mean), ('inv_std', inv_std), ('gamma', gamma), ('dmean', dmean),
                            ('dvar', dvar)):
            _kept_param(fn, name, value, layout, acc, xp)
        view = _View(checked_x.shape, layout)
        key = ('bwd', checked_x.dtype, view.key(), gamma is None, dmean is None, dvar is None, activation)
        launches = _BwdLaunches(rt, view, layout, checked_x.dtype, y is not None, gamma is not None)
        dtype = checked_x.dtype
        flat = [_flat_param(xp, p, acc) for p in (gamma, mean, inv_std, dmean, dvar)]
        converters = [f for f, _ in flat]
        # dy in x's precision: the twin computes in it too
        direct = (all(type(a) is xp.ndarray for a in (dy, x) + (() if y is None else (y,))) and dy.dtype == dtype
                  and all(d for _, d in flat))

        def run_with(gpuk_fn):
            def run(dy, x, gamma, mean, inv_std, dmean=None, dvar=None, y=None):
                params = (gamma, mean, inv_std, dmean, dvar)
                if not (direct and _contiguous(params)):   # which conversions: per problem, or a strided view
                    dy = (dy if type(dy) is xp.ndarray else xp.asarray(dy)).astype(dtype, copy=False)
                    x = x if type(x) is xp.ndarray else xp.asarray(x)
                    y = y if y is None or type(y) is xp.ndarray else xp.asarray(y)
                    gamma, mean, inv_std, dmean, dvar = _flat_params(converters, params)
                return dispatch.run(rt, 'batchnorm', key, gpuk_fn, cudnn_batchnorm.bn_bwd, dy, x, gamma, mean,
                                    inv_std, checked_axes, dmean, dvar, activation, y)
            return run
        return _with_step_buffers(run_with, launches)
    return prepared.get(rt, fn, (dy, x, gamma, mean, inv_std, dmean, dvar, y), (axes, activation), prepare)
