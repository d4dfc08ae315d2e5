"""A training step that runs out of memory (a batch too large for the device) raises
gpuk.OutOfMemoryError naming the K function and its inputs' shapes, changes no variable,
releases what it allocated, and the next, smaller step runs (gpuk/device.py, gpuk/function.py).

On the NumPy device an op's computation raises NumPy's own MemoryError for a large batch; on
the CUDA path (a GPU, or the GPU rehearsal's stand-in with its pool limit) CuPy's pool refuses
an allocation past ``set_limit``."""
import re
import sys
import types
import weakref

import numpy as np
import pytest

import gpuk
from gpuk import backend as K
from gpuk import config, device
from gpuk.cpu_fallback import batchnorm as bn_twin
from gpuk.cpu_fallback import conv as conv_twin
from gpuk.kernels import runtime
from gpuk.kernels.runtime import counters, deferred
from tests import gpu_rehearsal

BIG, SMALL = 64, 8


def _training_step(rng, sparse=False):
    """A conv net's SGD-with-momentum step as Keras builds one: the function, its variables."""
    x = K.placeholder((None, 6, 6, 2))
    labels = K.placeholder((None,) if sparse else (None, 3))
    w = K.variable(0.3 * rng.standard_normal((3, 3, 2, 4)), name='w')
    d = K.variable(0.3 * rng.standard_normal((64, 3)), name='d')
    velocities = [K.variable(np.zeros(K.int_shape(v)), name='v_' + v.name) for v in (w, d)]
    iterations = K.variable(0, dtype='int64', name='iterations')
    logits = K.dot(K.batch_flatten(K.relu(K.conv2d(x, w))), d)
    if sparse:   # its label-range check is deferred on the CUDA path (runtime/deferred.py)
        loss = K.mean(K.sparse_categorical_crossentropy(labels, logits, from_logits=True))
    else:
        loss = K.mean(K.categorical_crossentropy(labels, K.softmax(logits)))
    updates = [K.update_add(iterations, 1)]
    for v, velocity, g in zip((w, d), velocities, K.gradients(loss, [w, d])):
        new_velocity = 0.9 * velocity - 0.1 * g
        updates += [K.update(velocity, new_velocity), K.update(v, v + new_velocity)]
    step = K.function([x, labels], [loss], updates=updates)
    return step, [w, d, iterations] + velocities


def _batch(rng, n, sparse=False):
    labels = rng.integers(0, 3, n)
    return [rng.standard_normal((n, 6, 6, 2)).astype(np.float32),
            labels.astype(np.float32) if sparse else np.eye(3, dtype=np.float32)[labels]]


def _values(variables):
    return [K.get_value(v).copy() for v in variables]


def _assert_unchanged(variables, before):
    for v, value in zip(variables, before):
        np.testing.assert_array_equal(K.get_value(v), value, err_msg=v.name)   # bit for bit


def test_a_step_out_of_memory_changes_nothing_and_a_smaller_one_runs(rng, conv_runs_out_of_memory_past):
    step, variables = _training_step(rng)
    small = _batch(rng, SMALL)
    step(small)                       # a step that fits; then the memory gets short
    conv_runs_out_of_memory_past[0] = SMALL
    before = _values(variables)
    with pytest.raises(gpuk.OutOfMemoryError) as caught:
        step(_batch(rng, BIG))
    error = caught.value
    assert isinstance(error, MemoryError) and str(error.__cause__).startswith('Unable to allocate')
    assert str(error).startswith('conv2d: out of host memory (at run time, on inputs float32 (64, 6, 6, 2), '
                                 'float32 (3, 3, 2, 4)): Unable to allocate 8.00 PiB'), str(error)
    assert 'try a smaller batch' in str(error)
    assert error.requested_bytes == BIG << 47
    with counters.counting(), pytest.raises(gpuk.OutOfMemoryError, match=r'^conv2d: out of host memory'):
        step(_batch(rng, BIG))        # the counted run (bench.host_overhead's) too
    _assert_unchanged(variables, before)
    _assert_runs_like_a_step_that_never_failed(step, variables, before, small)


def _assert_runs_like_a_step_that_never_failed(step, variables, before, batch, sparse=False):
    """``step`` on ``batch`` gives the outputs, variables (and loss scale) of the same step
    built afresh from the values ``before``."""
    twin, twin_variables = _training_step(np.random.default_rng(0), sparse)
    for v, value in zip(twin_variables, before):
        K.set_value(v, value)
    np.testing.assert_array_equal(step(batch), twin(batch))
    for v, t in zip(variables, twin_variables):
        np.testing.assert_array_equal(K.get_value(v), K.get_value(t), err_msg=v.name)
    if step._guard is not None:
        scaler, twin_scaler = step._guard.scalers[0], twin._guard.scalers[0]
        assert (scaler.scale, scaler.growth_tracker) == (twin_scaler.scale, twin_scaler.growth_tracker)


def test_a_loss_scaled_step_out_of_memory_keeps_its_loss_scale(rng, conv_runs_out_of_memory_past,
                                                                restore_precision):
    config.set_precision('mixed_float16')
    step, variables = _training_step(rng)
    scaler, = step._guard.scalers
    conv_runs_out_of_memory_past[0] = SMALL
    before, scale = _values(variables), (scaler.scale, scaler.growth_tracker)
    with pytest.raises(MemoryError, match='^conv2d: out of host memory'):
        step(_batch(rng, BIG))
    _assert_unchanged(variables, before)
    assert (scaler.scale, scaler.growth_tracker) == scale
    _assert_runs_like_a_step_that_never_failed(step, variables, before, _batch(rng, SMALL))


def test_copying_the_inputs_to_the_device_out_of_memory_names_the_function(rng, monkeypatch):
    step, variables = _training_step(rng)
    before = _values(variables)
    to_device = device.to_device

    def short_of_memory(value, dtype=None):
        if getattr(value, 'shape', ())[:1] == (BIG,):
            raise MemoryError('Unable to allocate the batch')
        return to_device(value, dtype)

    monkeypatch.setattr(device, 'to_device', short_of_memory)
    with pytest.raises(gpuk.OutOfMemoryError, match=r'^function: out of host memory \(at run time, on inputs '
                                                    r'float32 \(64, 6, 6, 2\), float32 \(64, 3\)\): Unable'):
        step(_batch(rng, BIG))
    _assert_unchanged(variables, before)
    _assert_runs_like_a_step_that_never_failed(step, variables, before, _batch(rng, SMALL))


def test_a_scans_step_out_of_memory_names_the_loop_and_the_op_inside(rng, conv_runs_out_of_memory_past):
    x = K.placeholder((None, 6, 6, 2))
    w = K.variable(0.3 * rng.standard_normal((3, 3, 2, 4)), name='w')
    f = K.function([x], [K.map_fn(lambda image: K.sum(K.conv2d(K.expand_dims(image, 0), w)), x)])
    conv_runs_out_of_memory_past[0] = 0
    with pytest.raises(gpuk.OutOfMemoryError) as caught:
        f([np.ones((3, 6, 6, 2), np.float32)])
    # the K call running the loop, then the step plan's error (its nodes name no K call of their
    # own: the user's call was map_fn's), as for any other run-time error
    assert str(caught.value).startswith('map_fn: function: ConvFwd: out of host memory (at run time, on inputs '
                                        'float32 (1, 6, 6, 2), float32 (3, 3, 2, 4)): Unable'), str(caught.value)
    assert caught.value.requested_bytes == 1 << 47
    conv_runs_out_of_memory_past[0] = None
    assert f([np.ones((3, 6, 6, 2), np.float32)])[0].shape == (3,)


def test_only_allocation_failures_become_out_of_memory_errors(rng, monkeypatch):
    step, variables = _training_step(rng)

    def broken(*args, **kwargs):
        raise RuntimeError('conv: not a memory problem')

    monkeypatch.setattr(conv_twin, 'conv_fwd', broken)
    with pytest.raises(RuntimeError, match='^conv: not a memory problem$'):
        step(_batch(rng, SMALL))
    assert deferred.pending_count() == 0


@pytest.fixture
def pool_limit():
    """``limit(headroom)``: CuPy's default pool refuses what would take it more than
    ``headroom`` bytes past what it holds now (``set_limit``, as in CuPy; the GPU rehearsal's
    stand-in counts its allocations the same way); no limit after the test."""
    pool = device.xp().get_default_memory_pool()

    def limit(headroom):
        pool.set_limit(size=pool.total_bytes() + headroom)
        return pool

    yield limit
    pool.set_limit(size=0)


@pytest.mark.gpu
def test_a_step_past_the_pool_limit_on_the_cuda_path_changes_nothing_and_a_smaller_one_runs(
        on, rng, deferred_checks, pool_limit, monkeypatch):
    on('cuda')
    step, variables = _training_step(rng, sparse=True)
    small = _batch(rng, SMALL, sparse=True)
    step(small)
    # SMALL's steps take under 4 KB more than the pool holds after one, BIG's 16 KB for the
    # convolution's output, then 16 KB more for the gradient of the flattened activations (in
    # the rehearsal: after the cross-entropy deferred its label check, to be dropped unread)
    pool = pool_limit(17 << 10)
    held, before = pool.used_bytes(), _values(variables)
    discarded = []
    monkeypatch.setattr(deferred, 'discard', lambda discard=deferred.discard: (
        discarded.append(deferred.pending_count()), discard())[1])
    big = _batch(rng, BIG, sparse=True)
    big[1][0] = 3                     # a label out of range: a check that is dropped, not raised
    with pytest.raises(gpuk.OutOfMemoryError) as caught:
        step(big)
    error = caught.value
    assert type(error.__cause__) is device.xp().cuda.memory.OutOfMemoryError
    assert re.match(r'^\w+: out of GPU memory \(at run time, on inputs float32 \(64, .*\): Out of memory '
                    r'allocating [\d,]+ bytes .*\. No variable was updated .*: try a smaller batch\.$',
                    str(error)), error
    assert error.requested_bytes == error.__cause__._size
    assert deferred.pending_count() == 0
    if gpu_rehearsal.active():        # sizes as counted by the stand-in
        # SMALL's steps keep their reused buffers (the memory plan) until each step makes BIG's:
        # the limit is reached at the cross-entropy's step or at the gradients', a label check
        # deferred either way
        assert str(error).split(':')[0] in ('gradients', 'sparse_categorical_crossentropy') and discarded[0] > 0, (
            str(error), discarded)
    # released although the error (its traceback's frames) is still held here
    assert pool.used_bytes() <= held
    _assert_unchanged(variables, before)
    _assert_runs_like_the_numpy_device(on, step, variables, before, small)


def _assert_runs_like_the_numpy_device(on, step, variables, before, small, build=_training_step):
    """``step`` (sparse labels, on the CUDA path) on ``small`` gives the outputs and variables
    of the same step (``build``'s) on the NumPy device, built afresh from the values ``before``."""
    out = step(small)
    on('cpu')
    twin, twin_variables = build(np.random.default_rng(0), sparse=True)
    for v, value in zip(twin_variables, before):
        K.set_value(v, value)
    np.testing.assert_allclose(out, twin(small), rtol=1e-5)
    for v, t in zip(variables, twin_variables):
        np.testing.assert_allclose(K.get_value(v), K.get_value(t), rtol=1e-5, atol=1e-6, err_msg=v.name)


# ---------------------------------------------------------------- the cuDNN path

# What the cuDNN Frontend's Python binding raises when a cuDNN call fails: a RuntimeError whose
# message is the call, "failed with" and cudnnGetErrorString's name of the status (frontend
# utils' CHECK_CUDNN_ERROR, python throw_if)
_FRONTEND_ALLOCATION_FAILED = ('cudnnBackendExecute(handle, plan->get_raw_desc(), variant_pack_descriptor.get_ptr()) '
                               'failed with CUDNN_STATUS_INTERNAL_ERROR_DEVICE_ALLOCATION_FAILED')


class _CudnnGraph:
    """A built cuDNN Frontend graph (the ``_build`` of conv.py or batchnorm.py) for the tests: it
    runs a NumPy twin (a subclass's ``outputs``) on the arrays behind the pointers of its variant
    pack, and where ``rows`` is above ``cudnn.limit`` (None: never) raises what the frontend
    raises when cuDNN cannot allocate (cuDNN's own device memory, beside the workspace gpuk
    gives it). ``cudnn`` is the state of ``_standing_in_for_cudnn_graphs``; ``tensors`` the
    BuiltGraph's: the names of the variant pack's buffers, in the form the module reads them."""

    def __init__(self, cudnn, op, rows, tensors):
        self.cudnn, self.op, self.rows, self.tensors = cudnn, op, rows, tensors

    def execute(self, pack, workspace, handle=None):
        arrays = {name: self.cudnn.arrays_at.pop(pack[name]) for name in self.tensors}
        self.cudnn.arrays_at.pop(workspace)
        if self.cudnn.limit is not None and self.rows > self.cudnn.limit:
            raise RuntimeError(_FRONTEND_ALLOCATION_FAILED)
        self.cudnn.executed.append(self.op)
        inputs = {name: device.to_host(array) for name, array in arrays.items()}
        for name, result in self.outputs(inputs).items():
            arrays[name][...] = device.xp().asarray(np.reshape(result, arrays[name].shape))


class _CudnnConvGraph(_CudnnGraph):
    """conv.py's graphs (fprop, dgrad, wgrad); ``rows``: the batch."""

    def __init__(self, cudnn, op, problem, dtype_name):
        super().__init__(cudnn, op, problem.x_shape[0], ('a', 'b', 'out'))
        self.problem = problem

    def outputs(self, inputs):
        p, a, b = self.problem, inputs['a'], inputs['b']
        geometry = (p.strides, p.dilation, tuple((s, s) for s in p.symmetric_pads),
                    'channels_last' if p.channels_last else 'channels_first')
        from gpuk.kernels.cudnn import conv as cudnn_conv
        if self.op == 'fprop':
            return {'out': conv_twin.conv_fwd(a, cudnn_conv.from_cudnn_filter(np, b, p, p.w_shape), *geometry)}
        if self.op == 'dgrad':
            return {'out': conv_twin.conv_dgrad(a, cudnn_conv.from_cudnn_filter(np, b, p, p.w_shape),
                                                p.padded_x_shape, *geometry)}
        return {'out': cudnn_conv.to_cudnn_filter(np, conv_twin.conv_wgrad(a, b, p.w_shape, *geometry), p)}


class _CudnnBatchnormGraph(_CudnnGraph):
    """batchnorm.py's 'train' and 'bwd' graphs (no relu; the training graph without moving
    averages) on x viewed as (outer, C, inner); ``rows``: outer."""
    TENSORS = {'train': ('x', 'scale', 'bias', 'epsilon', 'running_mean', 'running_var', 'momentum', 'y', 'mean',
                         'inv_var', 'next_running_mean', 'next_running_var'),
               'bwd': ('dy', 'x', 'scale', 'mean', 'inv_var', 'dx', 'dscale', 'dbias')}

    def __init__(self, cudnn, op, dtype_name, view):
        super().__init__(cudnn, op, view[0], {name: name for name in self.TENSORS[op]})
        self.view = view

    def outputs(self, inputs):
        x, axes = inputs['x'].reshape(self.view), (0, 2)

        def stat(name):   # (C,) -> the kept shape of x's view
            return inputs[name].reshape(1, -1, 1)
        if self.op == 'train':
            assert inputs['momentum'][0] == 0     # the running statistics are throwaway ones
            y, mean, _, inv_std = bn_twin.bn_train_fwd(x, stat('scale'), stat('bias'), axes,
                                                       float(inputs['epsilon'][0]))
            return {'y': y, 'mean': mean, 'inv_var': inv_std, 'next_running_mean': inputs['running_mean'],
                    'next_running_var': inputs['running_var']}
        dx, dscale, dbias = bn_twin.bn_bwd(inputs['dy'].reshape(self.view), x, stat('scale'), stat('mean'),
                                           stat('inv_var'), axes)
        return {'dx': dx, 'dscale': dscale, 'dbias': dbias}


def _standing_in_for_cudnn_graphs(monkeypatch, family, module, graph):
    """``family`` takes the cuDNN path (GPUK_KERNELS <family>=cudnn), with cuDNN present: the
    Frontend graphs ``module._build`` builds are ``graph(cudnn, op, *its problem)`` (a _CudnnGraph),
    which run out of memory above ``cudnn.limit`` (None: never). Returns ``cudnn``, whose
    ``executed`` lists the ops run."""
    from gpuk.kernels.cudnn import library
    # arrays_at: the variant pack's "pointers", to the arrays, held by the call only
    cudnn = types.SimpleNamespace(limit=None, executed=[], arrays_at=weakref.WeakValueDictionary())

    def pointer(array):
        cudnn.arrays_at[id(array)] = array
        return id(array)

    def build(frontend, handle, op, *problem):
        made = graph(cudnn, op, *problem)
        return library.BuiltGraph(made, made.tensors, 1024)

    monkeypatch.setattr(library, 'available', lambda: True)
    monkeypatch.setattr(library, 'frontend', lambda: 'the cuDNN Frontend')
    monkeypatch.setattr(library, 'frontend_handle', lambda frontend, cupy: (0, 'its handle'))
    monkeypatch.setattr(library, 'device_pointer', pointer)
    monkeypatch.setattr(module, '_build', build)
    monkeypatch.setattr(module, '_graphs', {})
    monkeypatch.setattr(config, '_kernels', dict(config._kernels, **{family: 'cudnn'}))
    monkeypatch.setenv('GPUK_CUDA_GRAPHS', '0')   # the twin's NumPy work would not replay
    return cudnn


@pytest.fixture
def cudnn_conv_runs_out_of_memory_past(monkeypatch):
    """Convolutions on cuDNN's (stand-in) graphs: ``_standing_in_for_cudnn_graphs``'s state;
    ``limit``: the batch."""
    from gpuk.kernels.cudnn import conv
    return _standing_in_for_cudnn_graphs(monkeypatch, 'conv', conv, _CudnnConvGraph)


@pytest.fixture
def cudnn_batchnorm_runs_out_of_memory_past(monkeypatch):
    """Batch normalization on cuDNN's (stand-in) graphs: ``_standing_in_for_cudnn_graphs``'s
    state; ``limit``: x's rows (outer: batch times height times width, channels last)."""
    from gpuk.kernels.cudnn import batchnorm
    return _standing_in_for_cudnn_graphs(monkeypatch, 'batchnorm', batchnorm, _CudnnBatchnormGraph)


def _assert_cudnn_out_of_memory_changes_nothing(on, rng, pool_limit, cudnn, build, limit, ran, message):
    """``build``'s step (sparse labels) on cuDNN's stand-in graphs (``cudnn``, which run out of
    memory past ``limit``): a small step runs there (``ran(cudnn.executed)``); a big one raises
    gpuk.OutOfMemoryError for cuDNN's failed allocation, its message matching ``message`` (the K
    call, the step's inputs, then the cuDNN call with its problem's sizes and cuDNN's reason),
    changes no variable and releases its memory; the small step then runs as on the NumPy device,
    on cuDNN again."""
    on('cuda')
    step, variables = build(rng, sparse=True)
    small = _batch(rng, SMALL, sparse=True)
    step(small)
    assert ran(cudnn.executed), cudnn.executed     # the step ran on the cuDNN path
    pool = pool_limit(1 << 30)        # (a limit, so that the rehearsal's stand-in counts what is allocated)
    held, before = pool.used_bytes(), _values(variables)
    cudnn.limit = limit
    with pytest.raises(gpuk.OutOfMemoryError) as caught:
        step(_batch(rng, BIG, sparse=True))
    error = caught.value
    from gpuk.kernels.cudnn import library
    assert type(error.__cause__) is library.AllocationFailed and error.requested_bytes is None
    assert re.match(message, str(error)), str(error)
    assert pool.used_bytes() <= held  # released although the error is still held here
    _assert_unchanged(variables, before)
    cudnn.executed.clear()
    _assert_runs_like_the_numpy_device(on, step, variables, before, small, build)
    assert ran(cudnn.executed), cudnn.executed


@pytest.mark.gpu
def test_cudnn_out_of_memory_changes_nothing_and_a_smaller_step_runs(on, rng, pool_limit,
                                                                     cudnn_conv_runs_out_of_memory_past):
    _assert_cudnn_out_of_memory_changes_nothing(
        on, rng, pool_limit, cudnn_conv_runs_out_of_memory_past, _training_step, SMALL,
        lambda executed: 'fprop' in executed and 'wgrad' in executed,
        r'^conv2d: out of GPU memory \(at run time, on inputs float32 \(64, 6, 6, 2\), float32 '
        r'\(3, 3, 2, 4\)\): conv_fwd: cuDNN fprop failed for x \(64, 6, 6, 2\), w \(3, 3, 2, 4\), '
        r'dtype float32 \(RuntimeError: .* failed with CUDNN_STATUS_INTERNAL_ERROR_DEVICE_ALLOCATION_FAILED'
        r'\)\. No variable was updated .*: try a smaller batch\.$')


def _batchnorm_step(rng, sparse=True):
    """A step normalizing its input with K.normalize_batch_in_training (batch norm's training
    forward and backward), then a dense layer and sparse cross-entropy: the function, its
    variables."""
    x = K.placeholder((None, 6, 6, 2))
    labels = K.placeholder((None,))
    gamma = K.variable(1 + 0.1 * rng.standard_normal(2), name='gamma')
    beta = K.variable(0.1 * rng.standard_normal(2), name='beta')
    d = K.variable(0.3 * rng.standard_normal((72, 3)), name='d')
    normalized, _, _ = K.normalize_batch_in_training(x, gamma, beta, [0, 1, 2])
    logits = K.dot(K.batch_flatten(normalized), d)
    loss = K.mean(K.sparse_categorical_crossentropy(labels, logits, from_logits=True))
    variables = [gamma, beta, d]
    updates = [K.update_sub(v, 0.1 * g) for v, g in zip(variables, K.gradients(loss, variables))]
    return K.function([x, labels], [loss], updates=updates), variables


@pytest.mark.gpu
def test_cudnn_batchnorm_out_of_memory_changes_nothing_and_a_smaller_step_runs(
        on, rng, pool_limit, cudnn_batchnorm_runs_out_of_memory_past):
    _assert_cudnn_out_of_memory_changes_nothing(
        on, rng, pool_limit, cudnn_batchnorm_runs_out_of_memory_past, _batchnorm_step, SMALL * 36,
        lambda executed: executed == ['train', 'bwd'],
        r'^normalize_batch_in_training: out of GPU memory \(at run time, on inputs float32 '
        r'\(64, 6, 6, 2\), float32 \(2,\), float32 \(2,\)\): bn_train_fwd: cuDNN failed running the '
        r'batchnorm train graph for x \(64, 6, 6, 2\) as \(outer, C, inner\) \(2304, 2, 1\), dtype float32 '
        r'\(RuntimeError: .* failed with CUDNN_STATUS_INTERNAL_ERROR_DEVICE_ALLOCATION_FAILED\)\. '
        r'No variable was updated .*: try a smaller batch\.$')


@pytest.mark.parametrize('status, name', [(4003, 'CUDNN_STATUS_INTERNAL_ERROR_HOST_ALLOCATION_FAILED'),
                                          (4004, 'CUDNN_STATUS_INTERNAL_ERROR_DEVICE_ALLOCATION_FAILED')])
def test_cudnn_statuses_of_a_failed_allocation_are_memory_errors(status, name):
    """The legacy calls (pooling, softmax, CTC) check their status: one of a failed allocation
    raises AllocationFailed, a MemoryError (device.out_of_memory: K.function's OutOfMemoryError)
    that is a RuntimeError like cuDNN's other failures; those keep their type."""
    from gpuk.kernels.cudnn import library
    names = {status: name, 4000: 'CUDNN_STATUS_INTERNAL_ERROR', 5000: 'CUDNN_STATUS_EXECUTION_FAILED'}
    lib = types.SimpleNamespace(cudnnGetErrorString=lambda code: names[code].encode())
    described = library.describe('avg_pool_fwd', x=(64, 6, 6, 2), dtype='float32')
    with pytest.raises(library.AllocationFailed) as caught:
        library.check(lib, status, 'cudnnPoolingForward', described)
    assert str(caught.value) == ('avg_pool_fwd: cuDNN cudnnPoolingForward failed for x (64, 6, 6, 2), dtype float32 '
                                 '(status %d: %s)' % (status, name))
    assert caught.value.status == status and isinstance(caught.value, RuntimeError)
    assert device.out_of_memory(caught.value)
    for other in (4000, 5000):        # may stem from memory, but do not say so
        with pytest.raises(RuntimeError) as caught:
            library.check(lib, other, 'cudnnPoolingForward', described)
        assert type(caught.value) is RuntimeError and not device.out_of_memory(caught.value)


@pytest.mark.parametrize('raised', [
    RuntimeError(_FRONTEND_ALLOCATION_FAILED),
    RuntimeError('cudnnBackendFinalize(get_ptr()) failed with CUDNN_STATUS_INTERNAL_ERROR_HOST_ALLOCATION_FAILED'),
    RuntimeError('cudaMalloc(&ptr, size) failed with out of memory'),
    MemoryError('std::bad_alloc'),    # pybind11's translation of a failed host allocation
])
def test_cudnn_frontend_errors_of_a_failed_allocation_are_memory_errors(raised, monkeypatch):
    """Building (not kept: the next call builds again) and running a Frontend graph."""
    from gpuk.kernels.cudnn import library
    monkeypatch.setitem(sys.modules, 'cupy', types.SimpleNamespace(empty=np.empty, uint8=np.uint8))
    monkeypatch.setattr(library, 'device_pointer', lambda array: array.ctypes.data)

    def fail(*args, **kwargs):
        raise raised

    cache = {}
    with pytest.raises(library.AllocationFailed,
                       match=r'^conv_fwd: cuDNN could not build .* \((Runtime|Memory)Error: '):
        library.cached_graph(cache, 'key', fail, 'conv_fwd: cuDNN could not build a fprop graph')
    assert not cache
    built = library.cached_graph(cache, 'key', lambda: library.BuiltGraph(types.SimpleNamespace(execute=fail), (), 64),
                                 'conv_fwd: cuDNN could not build a fprop graph')
    with pytest.raises(library.AllocationFailed) as caught:
        library.execute_graph(built, {}, 'handle', 'conv_fwd: cuDNN fprop failed for x (64, 6, 6, 2)')
    assert caught.value.__cause__ is raised and device.out_of_memory(caught.value)
    not_memory = RuntimeError('cudnnBackendExecute(...) failed with CUDNN_STATUS_EXECUTION_FAILED')
    with pytest.raises(RuntimeError) as caught:
        library.execute_graph(library.BuiltGraph(types.SimpleNamespace(execute=lambda *a, **k: _raise(not_memory)),
                                                 (), 64), {}, 'handle', 'conv_fwd: cuDNN fprop failed')
    assert type(caught.value) is RuntimeError and not device.out_of_memory(caught.value)


def _kernel_step(rng):
    """A step made of gpuk's kernels (the stand-in's graphs replay those only): the function,
    its CUDA graphs."""
    x = K.placeholder((None, 8, 8, 3))
    w = K.variable(rng.standard_normal((3, 3, 3, 4)).astype(np.float32))
    b = K.variable(rng.standard_normal(4).astype(np.float32))
    f = K.function([x], [K.pool2d(K.relu(K.bias_add(K.conv2d(x, w), b)), (2, 2), strides=(2, 2))])
    return f, f._compiled().graphs


@pytest.mark.gpu
def test_a_step_out_of_memory_leaves_the_graphs_captured_for_other_shapes_valid(on, rng, pool_limit,
                                                                                monkeypatch):
    on('cuda')
    monkeypatch.setenv('GPUK_CUDA_GRAPHS', '1')
    f, graphs = _kernel_step(rng)
    small = rng.standard_normal((2, 8, 8, 3)).astype(np.float32)
    expected = [f([small]) for _ in range(3)]      # plain, capture and replay, replay
    assert len(graphs.captured) == 1
    pool_limit(4 << 10)
    # on a GPU the input's copy fails; in the rehearsal (which counts no copy of a host array)
    # the fused convolution's output (its step named after its last K call)
    with pytest.raises(gpuk.OutOfMemoryError, match=r'^(function|relu): out of GPU memory .* float32 \(64, 8, 8, 3\)'):
        f([rng.standard_normal((64, 8, 8, 3)).astype(np.float32)])
    with counters.counting() as counted:
        out = f([small])
    assert counted.graph_replays == 1 and len(graphs.captured) == 1 and not graphs.refused
    np.testing.assert_array_equal(out, expected[0])


def test_a_call_out_of_memory_drops_its_deferred_checks_unread(deferred_checks):
    """Other failures raise a failed check's error instead (a bad value explains them best);
    no bad value explains a failed allocation."""
    rt = runtime.get_runtime('emulate')

    def failing(error):
        deferred.defer(rt, np.array(True), lambda: _raise(ValueError('sparse_categorical_crossentropy: label 3')))
        raise error

    with pytest.raises(ValueError, match='label 3'):
        device.run_deferring(failing, RuntimeError('not a memory problem'))
    with pytest.raises(gpuk.OutOfMemoryError):
        device.run_deferring(failing, gpuk.OutOfMemoryError('dot: out of GPU memory'))
    assert deferred.pending_count() == 0


def _raise(error):
    raise error


def _skip_unless_captures_count_against_the_pool_limit():
    if not gpu_rehearsal.active():
        pytest.skip('the stand-in counts a capture against the default pool\'s limit; CuPy gives it a '
                    'private pool, which that limit does not bound')


@pytest.mark.gpu
@pytest.mark.parametrize('memory_comes_free', [True, False])
def test_a_capture_out_of_memory_is_released_the_step_runs_plain_and_capture_is_tried_again(
        on, rng, pool_limit, monkeypatch, memory_comes_free):
    """The signature is not refused for good: a later call may fit (memory came free since), so
    it is captured then; a signature whose captures keep running out of memory is refused after
    MAX_CAPTURE_TRIES_OUT_OF_MEMORY of them."""
    _skip_unless_captures_count_against_the_pool_limit()
    from gpuk import cuda_graph
    on('cuda')
    monkeypatch.setenv('GPUK_CUDA_GRAPHS', '1')
    f, graphs = _kernel_step(rng)
    small = rng.standard_normal((2, 8, 8, 3)).astype(np.float32)
    key = cuda_graph.signature([small])
    expected = f([small])                        # plain: 1.5 KB for the step, the capture needs more
    pool = pool_limit(2 << 10)
    held = pool.used_bytes()
    np.testing.assert_array_equal(f([small]), expected)     # the capture fails, the plain run fits
    tries, reason = graphs.short_of_memory[key]
    assert tries == 1 and reason.startswith('capture failed: OutOfMemoryError: '), reason
    assert not graphs.captured and not graphs.refused
    assert pool.used_bytes() <= held
    if memory_comes_free:
        pool.set_limit(size=0)
        with counters.counting() as counted:
            np.testing.assert_array_equal(f([small]), expected)   # captured, then replayed
        assert counted.graph_replays == 1 and list(graphs.captured) == [key]
        assert not graphs.short_of_memory and not graphs.refused
        return
    for tries in range(2, cuda_graph.MAX_CAPTURE_TRIES_OUT_OF_MEMORY + 1):
        np.testing.assert_array_equal(f([small]), expected)
        assert pool.used_bytes() <= held
    reason = graphs.refused[key]
    assert reason.startswith('capture failed: OutOfMemoryError: ') and reason.endswith(
        '(out of memory in %d captures)' % cuda_graph.MAX_CAPTURE_TRIES_OUT_OF_MEMORY), reason
    assert not graphs.short_of_memory and not graphs.captured
    monkeypatch.setattr(cuda_graph, 'CapturedStep', lambda *args: pytest.fail('tried to capture a refused step'))
    np.testing.assert_array_equal(f([small]), expected)


def test_a_capture_out_of_memory_is_tried_again_only_after_a_plain_run_fits(monkeypatch):
    """When the plain run after a failed capture runs out of memory too, the next call runs plain
    (a step that does not fit plainly is not captured); the capture after that one finished."""
    from gpuk import cuda_graph
    graphs = cuda_graph.PlanGraphs(plan=None)
    monkeypatch.setattr(graphs, 'blocked', lambda: None)
    calls = []

    def capture(plan, fed, updates):
        calls.append('capture')
        raise MemoryError('Out of memory allocating 2,048 bytes')

    def run_plain(fed):
        calls.append('plain')
        if fed == 'too large now':
            raise MemoryError('Out of memory allocating 1,024 bytes')
        return ['values']

    monkeypatch.setattr(cuda_graph, 'CapturedStep', capture)
    assert graphs.run('key', 'inputs', [], run_plain) == (['values'], False)        # the first run: plain
    with pytest.raises(MemoryError, match='1,024 bytes'):
        graphs.run('key', 'too large now', [], run_plain)
    assert calls == ['plain', 'capture', 'plain'] and graphs.short_of_memory['key'][0] == 1
    for _ in range(3):
        graphs.run('key', 'inputs', [], run_plain)
    assert calls[3:] == ['plain', 'capture', 'plain', 'capture', 'plain']   # the third capture refuses it
    assert graphs.refused['key'].endswith('(out of memory in 3 captures)') and not graphs.short_of_memory
    graphs.run('key', 'inputs', [], run_plain)
    assert calls[8:] == ['plain']


@pytest.mark.gpu
def test_cuda_errors_saying_out_of_memory_are_allocation_failures(on):
    on('cuda')
    cuda = device.xp().cuda

    def error(kind, status):   # (CuPy's take the status, the stand-in's a message)
        made = kind.__new__(kind)
        made.status = status
        return made

    launch = runtime.KernelLaunchError('conv_fwd: launch failed')
    launch.__cause__ = error(cuda.driver.CUDADriverError, 2)          # CUDA_ERROR_OUT_OF_MEMORY
    assert device.out_of_memory(error(cuda.runtime.CUDARuntimeError, 2))   # cudaErrorMemoryAllocation
    assert device.out_of_memory(launch)
    assert device.out_of_memory(error(cuda.cublas.CUBLASError, 3))          # CUBLAS_STATUS_ALLOC_FAILED
    assert device.out_of_memory(cuda.memory.OutOfMemoryError(512, 0))
    assert not device.out_of_memory(error(cuda.runtime.CUDARuntimeError, 1))
    assert not device.out_of_memory(error(cuda.cublas.CUBLASError, 7))
    assert not device.out_of_memory(runtime.KernelLaunchError('conv_fwd: launch failed'))


@pytest.mark.gpu
def test_asking_about_an_error_where_cublas_does_not_load_raises_nothing(on, monkeypatch):
    """out_of_memory runs in the plan's except clause: an error of its own would replace the
    step's (CuPy imports cupy.cuda.cublas on first access, and that can fail)."""
    on('cuda')
    cuda = device.xp().cuda

    class NoCublas(type(cuda)):
        def __getattr__(self, name):
            if name == 'cublas':
                raise ImportError('libcublas.so: cannot open shared object file')
            return getattr(cuda, name)

    monkeypatch.setattr(device.xp(), 'cuda', NoCublas('cupy.cuda'))
    assert not device.out_of_memory(RuntimeError('conv: not a memory problem'))



def _train(step, batch):   # the user's code calling the step: its frame keeps its locals
    marker = 'the caller\'s'
    return step(batch), marker


def test_release_clears_only_the_frames_of_the_failed_call(rng, conv_runs_out_of_memory_past):
    """The frames from K.function's call inward lose their locals (what they held on the device
    goes); the callers' frames, the test's and pytest's, are left as they are."""
    step, _ = _training_step(rng)
    conv_runs_out_of_memory_past[0] = SMALL
    with pytest.raises(gpuk.OutOfMemoryError) as caught:
        _train(step, _batch(rng, BIG))
    frames, tb = {}, caught.tb
    while tb is not None:
        frames.setdefault(tb.tb_frame.f_code.co_name, tb.tb_frame)
        tb = tb.tb_next
    assert frames['_train'].f_locals['marker'] == 'the caller\'s'
    assert 'caught' in frames['test_release_clears_only_the_frames_of_the_failed_call'].f_locals
    assert frames['_step'].f_locals == {}
    assert 'self' in frames['__call__'].f_locals    # running when it released: not cleared


def test_release_kept_reads_the_kept_runners_again_when_another_thread_adds_one(monkeypatch):
    """A WeakSet read while another thread adds to it raises RuntimeError; release_memory must
    not let that replace the OutOfMemoryError it is handling."""
    from gpuk.kernels.runtime import prepared
    kept = prepared.Kept()
    kept._last = ('owner', 0, [], None, None)

    class AddedTo(list):
        reads = 0

        def __iter__(self):
            AddedTo.reads += 1
            if AddedTo.reads == 1:
                raise RuntimeError('Set changed size during iteration')
            return super().__iter__()

    monkeypatch.setattr(prepared, '_EVERY_KEPT', AddedTo([kept]))
    prepared.release_kept()
    assert kept._last is None and AddedTo.reads == 2


def test_an_inputs_cast_out_of_memory_names_the_function(rng, monkeypatch):
    """Checking the inputs casts them (a device array of another dtype: on the device); a
    failed allocation there is an OutOfMemoryError of K.function's too."""
    from gpuk import function
    step, variables = _training_step(rng)
    before = _values(variables)

    def short_of_memory(value, dtype, fn, what):
        raise MemoryError('Unable to allocate the cast input')

    monkeypatch.setattr(function, 'checked_array', short_of_memory)
    x, labels = _batch(rng, BIG)
    with pytest.raises(gpuk.OutOfMemoryError, match=r'^function: out of host memory \(at run time, on inputs '
                                                    r'float64 \(64, 6, 6, 2\), float32 \(64, 3\)\): Unable'):
        step([x.astype(np.float64), labels])
    _assert_unchanged(variables, before)


# A chain of products, output k of shape (ROWS, UNITS - k) float32 (16 KB and a little less):
# kept step buffers hold all CHAIN of them between calls (shapes that differ never share one),
# while at most three are alive at once in a call, which the pool's reuse needs
ROWS, UNITS, CHAIN = 64, 64, 6
OUTPUT_BYTES = ROWS * UNITS * 4


def _product_chain(rng):
    """(K.function of x -> x·W1·...·W_CHAIN, its NumPy float64 reference for an input)."""
    x = K.placeholder((None, UNITS))
    weights = [rng.standard_normal((UNITS - max(k - 1, 0), UNITS - k)).astype(np.float32) / 8 for k in range(CHAIN)]
    y = x
    for w in weights:
        y = K.dot(y, K.variable(w))

    def reference(value):
        out = value.astype(np.float64)
        for w in weights:
            out = out @ w
        return out
    return K.function([x], [y]), reference


@pytest.mark.gpu
def test_a_call_that_fits_only_without_kept_step_buffers_runs_without_them(on, rng, pool_limit, monkeypatch):
    """Kept step buffers hold every step's output between calls; a call they make run out of
    memory runs again without them (the pool's reuse alone), and none are kept from then on."""
    from gpuk.kernels.runtime import prepared
    on('cuda')
    monkeypatch.setenv('GPUK_CUDA_GRAPHS', '0')
    f, reference = _product_chain(rng)
    x = rng.standard_normal((ROWS, UNITS)).astype(np.float32)
    f([x[:2]])
    prepared.release_kept()   # what the small call kept is not counted below
    pool_limit(4 * OUTPUT_BYTES)   # all CHAIN outputs do not fit, three alive at once do
    assert prepared.keeps_step_buffers()
    out, = f([x])
    np.testing.assert_allclose(out, reference(x), rtol=1e-5, atol=1e-5)
    assert not prepared.keeps_step_buffers()
    out, = f([x])   # and the next call as well
    np.testing.assert_allclose(out, reference(x), rtol=1e-5, atol=1e-5)


@pytest.mark.gpu
def test_a_capture_keeps_no_step_buffers(on, rng, pool_limit, monkeypatch):
    """A graph's steps take their outputs from its pool, which hands a dead value's block to a
    later output: the capture needs the step's peak, not all its outputs at once."""
    _skip_unless_captures_count_against_the_pool_limit()
    from gpuk import cuda_graph
    from gpuk.kernels.runtime import prepared
    on('cuda')
    monkeypatch.setenv('GPUK_CUDA_GRAPHS', '1')
    f, reference = _product_chain(rng)
    x = rng.standard_normal((ROWS, UNITS)).astype(np.float32)
    f([x])                      # plain: the signature's first call
    prepared.release_kept()     # what it kept is not counted below
    pool_limit(4 * OUTPUT_BYTES)
    out, = f([x])               # captured, then replayed
    graphs = f._compiled().graphs
    assert list(graphs.captured) == [cuda_graph.signature([x])] and not graphs.short_of_memory
    assert prepared.keeps_step_buffers()   # no allocation failed
    np.testing.assert_allclose(out, reference(x), rtol=1e-5, atol=1e-5)


def test_a_loss_scale_that_cannot_be_stored_changes_nothing_and_the_call_runs_once(restore_precision, monkeypatch):
    """The loss scale's new device value is made before any variable is assigned: an allocation
    failure there leaves the step unapplied, so K.function's run without kept step buffers
    applies it once (not a second time over the first's updates)."""
    from gpuk import loss_scaling
    config.set_precision('mixed_float16')
    x, w = K.placeholder((2, 2)), K.variable(np.ones((2, 2)))
    steps = K.variable(0.0)
    g = K.gradients(K.sum(K.dot(x, w)), [w])[0]
    step = K.function([x], [], updates=[K.update(w, w - 0.5 * g), K.update_add(steps, 1.0)])
    scaler = loss_scaling.loss_scaler(g)
    scaler.growth_interval = 1                  # every finite step grows the scale: a new device value
    a = np.full((2, 2), 1e-3, np.float32)
    with np.errstate(over='ignore', invalid='ignore'):
        step([a])                               # the seed 2^16 is inf in float16: skipped, 2^15
    assert float(steps.value) == 0 and scaler.scale == 2.0 ** 15
    failures = [MemoryError('Unable to allocate 4 bytes')]

    def to_device(value, dtype=None):          # the scale's one allocation fails, once
        if failures:
            raise failures.pop()
        return device.to_device(value, dtype)
    monkeypatch.setattr(loss_scaling, 'device', types.SimpleNamespace(to_device=to_device, to_host=device.to_host))
    step([a])
    assert not failures
    assert float(steps.value) == 1 and scaler.scale == 2.0 ** 16 and scaler.growth_tracker == 0
    np.testing.assert_allclose(w.value, 1 - 0.5 * 2e-3, rtol=1e-3)


def test_a_replayed_call_that_then_runs_out_of_memory_is_not_run_again(monkeypatch):
    """A replayed CUDA Graph writes the variables itself: an allocation failure after it (the
    outputs' copies to the host) is raised, not answered by running the call once more, which
    would apply its updates a second time."""
    from gpuk import cuda_graph, function
    from gpuk.kernels.runtime import prepared
    x = K.placeholder((2,))
    total = K.variable(np.zeros(2, np.float32))
    f = K.function([x], [x * 2.0], updates=[K.update_add(total, x)])
    f([np.ones(2, np.float32)])
    replays = []

    class Replaying:   # a captured signature's replay: the update written by the graph
        @staticmethod
        def run(key, fed, updates, run_plain):
            values = run_plain(fed)
            replays.append(key)
            total.value = total.value + fed[0]
            return values, True
    monkeypatch.setattr(f._compiled(), 'graphs', Replaying)
    monkeypatch.setattr(cuda_graph, 'enabled', lambda: True)
    monkeypatch.setattr(function, '_host_copy', lambda value: _raise(MemoryError('Unable to allocate 8 bytes')))
    assert prepared.keeps_step_buffers()
    with pytest.raises(gpuk.OutOfMemoryError) as caught:
        f([np.ones(2, np.float32)])
    assert len(replays) == 1 and np.array_equal(K.get_value(total), [2, 2])
    # the error says what happened: the updates were applied, the outputs were lost
    assert 'No variable was updated' not in str(caught.value), str(caught.value)
    assert str(caught.value).endswith('The step\'s updates were applied (a replayed CUDA Graph writes them '
                                      'itself) and its outputs lost; the call\'s memory was released.'), str(caught.value)


@pytest.mark.gpu
def test_a_replayed_call_whose_outputs_fail_to_reach_the_host_leaves_no_value_check_pending(on, rng, monkeypatch):
    """A replay hands its value checks to K.function, which reads them with the outputs: when
    the outputs' host copies run out of memory, the checks go unread with the failed call (as a
    plain call's do, device.run_deferring) instead of being read by the next call."""
    from gpuk import function
    on('cuda')
    monkeypatch.setenv('GPUK_CUDA_GRAPHS', '1')
    x, labels = K.placeholder((2, 8, 8, 3)), K.placeholder((None,), dtype='int32')
    w = K.variable(rng.standard_normal((3, 3, 3, 4)).astype(np.float32))
    y = K.pool2d(K.relu(K.conv2d(x, w)), (2, 2), strides=(2, 2))
    loss = K.sparse_categorical_crossentropy(labels, K.reshape(y, (-1, 4)), from_logits=True)
    v = K.variable(np.zeros(18, np.float32))
    f = K.function([x, labels], [loss], updates=[K.update(v, loss)])
    good = np.arange(18, dtype=np.int32) % 4
    batch = rng.standard_normal((2, 8, 8, 3)).astype(np.float32)
    for _ in range(2):                         # plain, then captured and replayed
        f([batch, good])
    assert len(f._compiled().graphs.captured) == 1 and deferred.pending_count() == 0
    host_copy = function._host_copy
    monkeypatch.setattr(function, '_host_copy', lambda value: _raise(MemoryError('Unable to allocate 72 bytes')))
    with counters.counting() as counted, pytest.raises(gpuk.OutOfMemoryError):
        f([batch, good])
    assert counted.graph_replays == 1
    assert deferred.pending_count() == 0
    monkeypatch.setattr(function, '_host_copy', host_copy)
    out, = f([batch, good])
    np.testing.assert_array_equal(K.get_value(v), out)
