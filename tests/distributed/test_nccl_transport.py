"""NcclTransport on stand-ins for CuPy and NCCL (standin_nccl.py): the unique-id exchange over
MPI, the barrier before joining, which streams wait for which events, the NCCL calls' arguments,
and failure: a collective that never completes, or NCCL's asynchronous error, aborts the
communicator and raises. What only a GPU shows is in test_nccl_gpu.py."""
import numpy as np
import pytest

from gpuk.distributed import buckets
from gpuk.distributed.errors import DistributedError
from gpuk.distributed.transport_nccl import NcclTransport
from tests.distributed import standin_nccl as standin

# NCCL's ids are signed chars: negative bytes must survive the MPI broadcast
ROOT_ID = tuple((i * 37) % 256 - 128 for i in range(128))


def transport(rank=0, size=2, events_complete=lambda: True, async_error=None):
    log = []
    cupy = standin.make_cupy(log, events_complete)
    nccl = standin.make_nccl(log, ROOT_ID, async_error)
    made = NcclTransport(standin.Bootstrap(log, rank, size, root_id=ROOT_ID), cupy, nccl)
    return made, log, cupy


def test_root_makes_the_unique_id_and_mpi_broadcasts_it():
    made, log, _ = transport(rank=0)
    assert log[0] == ('get_unique_id',)
    assert log[1] == ('mpi_broadcast', 'int8', 128, 0, 'the NCCL unique id broadcast')
    assert log[2] == ('mpi_allreduce', 'the barrier before NCCL init')
    assert log[3] == ('init', 2, ROOT_ID, 0)


def test_other_ranks_join_with_the_id_root_broadcast():
    made, log, _ = transport(rank=1)
    assert ('get_unique_id',) not in log
    assert log[-1] == ('init', 2, ROOT_ID, 1)


def test_allreduce_runs_on_the_communication_stream_between_two_events():
    made, log, cupy = transport()
    grads = [np.ones((2, 3), np.float32), np.full(4, 2.0, np.float32)]
    buffer = standin.Array(buckets.flatten(grads, np.float32, np))
    del log[:]
    pending = made.start_allreduce(buffer, 'bucket 0')
    compute, comm = cupy.compute_stream.ptr, made.stream.ptr
    # the communication stream waits for the bucket to be written on the compute stream ...
    assert log[0] == ('record', compute, 0) and log[1] == ('wait_event', comm, 0)
    # ... reduces in place (sum of float32) ...
    assert log[2] == ('allReduce', buffer.data.ptr, buffer.data.ptr, 10, 7, 0, comm)
    # ... and marks its end, which the compute stream waits for before reading the sums
    assert log[3] == ('record', comm, 1)
    assert made.finish_allreduce(pending) is buffer
    assert log[4] == ('wait_event', compute, 1)


def test_broadcast_goes_through_nccl_too():
    made, log, _ = transport()
    buffer = standin.Array(np.zeros(5, np.float64))
    del log[:]
    made.broadcast(buffer, 1, 'the broadcast')
    assert ('bcast', buffer.data.ptr, 5, 8, 1, made.stream.ptr) in log


def test_a_collective_that_never_completes_aborts_the_communicator_and_raises():
    made, log, _ = transport(events_complete=lambda: False)
    pending = made.start_allreduce(standin.Array(np.zeros(3, np.float32)), 'bucket 2')
    with pytest.raises(DistributedError, match='bucket 2 on rank 0 of 2 did not complete within 0.05 s'):
        made.finish_allreduce(pending)
    assert ('abort',) in log
    with pytest.raises(DistributedError, match='cannot run bucket 3: an earlier collective failed'):
        made.start_allreduce(standin.Array(np.zeros(3, np.float32)), 'bucket 3')


def test_an_nccl_asynchronous_error_aborts_and_raises():
    made, log, _ = transport(async_error='NCCL_ERROR_REMOTE_ERROR: a peer is gone')
    pending = made.start_allreduce(standin.Array(np.zeros(3, np.float32)), 'bucket 0')
    with pytest.raises(DistributedError, match='bucket 0 failed in NCCL: NCCL_ERROR_REMOTE_ERROR'):
        made.finish_allreduce(pending)
    assert ('abort',) in log


def test_nccl_refuses_dtypes_it_cannot_reduce():
    made, _, _ = transport()
    with pytest.raises(TypeError, match='NCCL reduces float16/32/64, int32, int64 and uint8 arrays, got bool'):
        made.start_allreduce(standin.Array(np.zeros(3, bool)), 'flags')
