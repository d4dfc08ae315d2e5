"""gpuk.distributed in one process (no launcher: a world of one), and its parts alone: argument
checks, bucketing, the plan order that overlaps all-reduces with the backward, the deadline."""
import os
import signal

import numpy as np
import pytest

import gpuk.distributed as hvd
from gpuk import backend as K
from gpuk.distributed import buckets, errors, world
from gpuk.distributed.graph_ops import BucketFinish, BucketStart, allreduce_gradients
from gpuk.distributed.transport_mpi import MpiTransport
from tests.distributed.k_models import SGD, mlp


@pytest.fixture
def fresh_world():
    saved = world._world['transport']
    world.shutdown()
    yield
    world._world['transport'] = saved


@pytest.fixture
def one_process(fresh_world):
    hvd.init()
    yield


@pytest.mark.parametrize('call', [
    hvd.rank, hvd.size, hvd.local_rank,
    lambda: hvd.allreduce(1.0),
    lambda: hvd.broadcast_variables([], 0),
    lambda: hvd.DistributedOptimizer(object()),
])
def test_every_name_says_to_call_init_first(fresh_world, call):
    with pytest.raises(RuntimeError, match=r'call gpuk.distributed.init\(\) first'):
        call()


def test_init_alone_is_a_world_of_one(one_process):
    assert (hvd.rank(), hvd.size(), hvd.local_rank(), hvd.local_size()) == (0, 1, 0, 1)
    hvd.init()  # again: nothing changes
    assert hvd.size() == 1
    np.testing.assert_array_equal(hvd.allreduce(np.array([1.5, -2.0])), [1.5, -2.0])
    mean = hvd.allreduce(np.array([3, 4]))
    assert mean.dtype == np.float64 and mean.tolist() == [3.0, 4.0]
    assert hvd.allreduce(np.array([3, 4]), average=False).dtype == np.array([3, 4]).dtype


@pytest.mark.parametrize('kwargs, message', [
    (dict(timeout=0), 'timeout must be a positive number of seconds, got 0'),
    (dict(timeout='10'), "timeout must be a positive number of seconds, got '10'"),
    (dict(timeout=float('inf')), 'timeout must be a positive number'),
    (dict(transport='gloo'), "transport must be one of .*got 'gloo'"),
])
def test_init_rejects_bad_arguments(fresh_world, kwargs, message):
    with pytest.raises(ValueError, match='gpuk.distributed.init: ' + message):
        hvd.init(**kwargs)
    assert not hvd.is_initialized()


def test_init_rejects_a_bad_timeout_variable(fresh_world, monkeypatch):
    monkeypatch.setenv('GPUK_DIST_TIMEOUT', 'soon')
    with pytest.raises(ValueError, match="GPUK_DIST_TIMEOUT must be a positive number of seconds, got 'soon'"):
        hvd.init()


def test_nccl_transport_needs_the_cuda_device(fresh_world, monkeypatch):
    monkeypatch.setattr('gpuk.device.kind', lambda: 'cpu')
    with pytest.raises(ValueError, match="transport 'nccl' needs the CUDA device, but gpuk runs on 'cpu'"):
        hvd.init(transport='nccl')


def test_bad_values_name_the_function_and_argument(one_process):
    with pytest.raises(TypeError, match='allreduce: value must hold numbers, got dtype <U1'):
        hvd.allreduce(np.array(['a']))
    with pytest.raises(TypeError, match='allreduce: average must be True or False'):
        hvd.allreduce(1.0, average='yes')
    with pytest.raises(TypeError, match='allreduce: graph tensors must be float16/32/64, got int32'):
        hvd.allreduce(K.placeholder(shape=(2,), dtype='int32'))
    v = K.variable(np.zeros(2))
    with pytest.raises(TypeError, match='broadcast_variables: variables must be gpuk variables, got 3 at position 1'):
        hvd.broadcast_variables([v, 3], 0)
    with pytest.raises(ValueError, match=r'broadcast_variables: root_rank must be an int in \[0, 1\), got 1'):
        hvd.broadcast_variables([v], 1)
    with pytest.raises(TypeError, match='DistributedOptimizer: optimizer must be a Keras optimizer instance'):
        hvd.DistributedOptimizer(SGD)
    with pytest.raises(ValueError, match='DistributedOptimizer: bucket_bytes must be a positive int, got 0'):
        hvd.DistributedOptimizer(SGD(0.1), bucket_bytes=0)
    with pytest.raises(ValueError, match='already distributed'):
        hvd.DistributedOptimizer(hvd.DistributedOptimizer(SGD(0.1)))


# --- buckets ---------------------------------------------------------------------------------

def test_buckets_fill_up_to_the_size_and_keep_one_dtype():
    f32, f64 = np.float32, np.float64
    # 100-byte buckets: 10+10 floats (80 B) fit, the 3rd would pass 100 B
    assert buckets.plan_buckets([10, 10, 10], [f32] * 3, 100) == [[0, 1], [2]]
    assert buckets.plan_buckets([25, 1], [f32, f32], 100) == [[0], [1]]       # exactly full
    assert buckets.plan_buckets([100, 1, 1], [f32] * 3, 100) == [[0], [1, 2]]  # oversized alone
    assert buckets.plan_buckets([1, 1, 1], [f32, f64, f64], 100) == [[0], [1, 2]]
    assert buckets.plan_buckets([1, None, 1], [f32] * 3, 100) == [[0], [1], [2]]
    assert buckets.plan_buckets([], [], 100) == []


def test_flatten_then_unflatten_gives_each_array_back_as_a_new_array():
    arrays = [np.arange(6, dtype=np.float16).reshape(2, 3), np.float16(7.0) * np.ones(()), np.arange(2, dtype=np.float16)]
    flat = buckets.flatten(arrays, np.float32, np)
    assert flat.dtype == np.float32 and flat.shape == (9,)
    back = buckets.unflatten(flat, [a.shape for a in arrays], [a.dtype for a in arrays], 2)
    for a, b in zip(arrays, back):
        assert b.dtype == a.dtype and b.shape == a.shape
        np.testing.assert_array_equal(b, a / 2)
    kept = buckets.unflatten(flat, [(9,)], [np.float32], 1)[0]
    kept[0] = 99
    assert flat[0] == 0  # not a view


# --- the training step -------------------------------------------------------------------------

def test_plan_starts_each_bucket_before_the_backward_of_the_next_and_waits_after(one_process):
    params, x, y, loss = mlp()
    grads = allreduce_gradients(K.gradients(loss, params), bucket_bytes=100)
    f = K.function([x, y], [loss], updates=[(p, p - 0.1 * g) for p, g in zip(params, grads)])
    ops = [forward.__self__ for forward, _, _, _ in f._compiled().steps]
    starts = [i for i, op in enumerate(ops) if isinstance(op, BucketStart)]
    finishes = {op.index: i for i, op in enumerate(ops) if isinstance(op, BucketFinish)}
    assert [ops[i].index for i in starts] == [0, 1, 2]  # b2+W2 (72 B), b1 (32 B), W1 (160 B)
    assert sorted(finishes) == [0, 1, 2]
    for k in range(2):
        # backward steps (the next bucket's gradients) run while bucket k is in flight ...
        assert any(not isinstance(op, (BucketStart, BucketFinish)) for op in ops[starts[k] + 1:starts[k + 1]])
        # ... and bucket k is waited for only once bucket k+1 is in flight too
        assert finishes[k] > starts[k + 1]


def test_distributed_optimizer_of_one_worker_steps_like_the_plain_one(one_process):
    results = []
    for wrap in (False, True):
        params, x, y, loss = mlp()
        opt = SGD(0.1, clipnorm=0.5)
        if wrap:
            opt = hvd.DistributedOptimizer(opt, bucket_bytes=64)
            assert type(opt).__name__ == 'SGD' and isinstance(opt, SGD)
        else:  # the same clipping, written out
            grads = K.gradients(loss, params)
            norm = K.sqrt(sum(K.sum(K.square(g)) for g in grads))
            opt.get_gradients = lambda loss, params, grads=grads, norm=norm: [
                K.switch(norm >= 0.5, g * 0.5 / norm, g) for g in grads]
        gradient_norm = K.sqrt(sum(K.sum(K.square(g)) for g in K.gradients(loss, params)))
        f = K.function([x, y], [loss, gradient_norm], updates=opt.get_updates(loss, params))
        rng = np.random.RandomState(0)
        for _ in range(3):
            _, norm = f([rng.normal(size=(4, 5)), rng.normal(size=(4, 2))])
            assert norm > 0.5  # so clipping acts
        results.append([K.get_value(p) for p in params])
    for plain, distributed in zip(*results):
        np.testing.assert_allclose(distributed, plain, rtol=1e-6)


def test_graph_allreduce_and_its_gradient_in_one_process(one_process):
    x = K.placeholder(shape=(3,))
    y = hvd.allreduce(x * 3.0, name='tripled')
    g = K.gradients(K.sum(y), [x])[0]
    value, grad = K.function([x], [y, g])([np.array([1.0, 2.0, 3.0], dtype='float32')])
    np.testing.assert_allclose(value, [3.0, 6.0, 9.0])
    np.testing.assert_allclose(grad, [3.0, 3.0, 3.0])


def test_broadcast_variables_in_one_process_keeps_values(one_process):
    v, w = K.variable(np.arange(4.0).reshape(2, 2)), K.variable(np.array([1, 2]), dtype='int32')
    hvd.broadcast_variables([v, w], 0)
    np.testing.assert_array_equal(K.get_value(v), np.arange(4.0).reshape(2, 2))
    np.testing.assert_array_equal(K.get_value(w), [1, 2])


# --- the deadline ----------------------------------------------------------------------------

def test_wait_past_the_deadline_cancels_and_raises():
    cancelled = []
    with pytest.raises(errors.DistributedError, match='the thing on rank 0 did not complete within 0.05 s'):
        errors.wait_until(lambda: False, 0.05, lambda: 'the thing on rank 0', lambda: cancelled.append(1))
    assert cancelled == [1]


def test_launcher_notice_of_a_dead_worker_fails_the_wait_at_once():
    saved = signal.getsignal(signal.SIGUSR1)
    signal.signal(signal.SIGUSR1, signal.SIG_DFL)
    try:
        errors.listen_for_peer_failure()
        os.kill(os.getpid(), signal.SIGUSR1)
        with pytest.raises(errors.DistributedError, match='reports that a worker process died'):
            errors.wait_until(lambda: False, 60, lambda: 'the all-reduce')
    finally:
        errors._peer_failure.clear()
        signal.signal(signal.SIGUSR1, saved)


class NeverDone:
    def Test(self):
        return False


def test_a_failed_collective_makes_later_ones_fail_at_once():
    from mpi4py import MPI
    transport = MpiTransport(MPI, timeout=0.05)
    pending = transport.start_allreduce(np.zeros(2), 'bucket 0')
    pending.request = NeverDone()
    with pytest.raises(errors.DistributedError, match='bucket 0 on rank 0 of 1 did not complete within 0.05 s'):
        transport.finish_allreduce(pending)
    with pytest.raises(errors.DistributedError, match='cannot run bucket 1: an earlier collective failed'):
        transport.start_allreduce(np.zeros(2), 'bucket 1')


def test_mpi_transport_refuses_the_cuda_device(fresh_world, monkeypatch):
    monkeypatch.setattr('gpuk.device.kind', lambda: 'cuda')
    with pytest.raises(ValueError, match="transport 'mpi' moves host .NumPy. arrays; gpuk runs on 'cuda'"):
        hvd.init(transport='mpi')


def test_without_mpi4py_and_without_a_launcher_the_world_is_one_process(fresh_world, monkeypatch):
    monkeypatch.setitem(__import__('sys').modules, 'mpi4py', None)  # import fails
    for name in ('PMI_SIZE', 'OMPI_COMM_WORLD_SIZE'):
        monkeypatch.delenv(name, raising=False)
    hvd.init()
    assert world.transport('test').name == 'local' and hvd.size() == 1
    np.testing.assert_array_equal(hvd.allreduce(np.array([2.0])), [2.0])
    world.shutdown()
    monkeypatch.setenv('PMI_SIZE', '4')
    with pytest.raises(ImportError, match='started by an MPI launcher but mpi4py cannot be imported'):
        hvd.init()
