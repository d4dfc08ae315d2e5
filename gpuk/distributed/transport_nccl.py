"""Collectives between GPUs over NCCL, one process per GPU.

MPI starts the processes and bootstraps NCCL: rank 0 makes the NCCL unique id, MPI broadcasts
it (under the deadline), every rank joins the communicator on its own GPU. All-reduces run on
a communication stream of their own, so a bucket's all-reduce overlaps with the backward
kernels the compute stream is still running: ``start_allreduce`` makes the communication
stream wait for the bucket to be written (an event), ``finish_allreduce`` makes the compute
stream wait for the sum. The host polls the sum's event under the deadline, checking NCCL's
asynchronous error state, and aborts the communicator when a peer is gone (a blocking wait
would hang for ever: NCCL's kernels spin until the peer's data arrives).

``cupy`` and ``nccl`` are passed in, so the bootstrap and the stream/event choreography are
tested on a CPU with stand-ins (tests/distributed/test_nccl_transport.py).
"""
import numpy as np

from gpuk.distributed.errors import DistributedError, FailsForGood
from gpuk.distributed.transport_mpi import PendingAllreduce

NCCL_UNIQUE_ID_BYTES = 128


def nccl_dtype(nccl, dtype, where):
    table = {np.dtype(np.float16): 'NCCL_FLOAT16', np.dtype(np.float32): 'NCCL_FLOAT32',
             np.dtype(np.float64): 'NCCL_FLOAT64', np.dtype(np.int32): 'NCCL_INT32',
             np.dtype(np.int64): 'NCCL_INT64', np.dtype(np.uint8): 'NCCL_UINT8'}
    name = table.get(np.dtype(dtype))
    if name is None:
        raise TypeError('%s: NCCL reduces float16/32/64, int32, int64 and uint8 arrays, got %s'
                        % (where, np.dtype(dtype).name))
    return getattr(nccl, name)


def device_pointer(array):
    """The device address of a CuPy array's first element (NCCL takes raw pointers)."""
    return array.data.ptr


def exchange_unique_id(bootstrap, nccl):
    """Rank 0's NCCL unique id, on every rank (a tuple of 128 signed bytes, as CuPy takes it)."""
    buffer = np.zeros(NCCL_UNIQUE_ID_BYTES, dtype=np.int8)
    if bootstrap.rank == 0:
        unique_id = nccl.get_unique_id()
        if len(unique_id) != NCCL_UNIQUE_ID_BYTES:
            raise DistributedError('gpuk.distributed.init: NCCL returned a unique id of %d bytes, '
                                   'expected %d' % (len(unique_id), NCCL_UNIQUE_ID_BYTES))
        buffer[:] = np.asarray(unique_id, dtype=np.int64).astype(np.int8)
    buffer = bootstrap.broadcast(buffer, 0, 'the NCCL unique id broadcast')
    return tuple(int(b) for b in buffer)


class NcclTransport(FailsForGood):
    name = 'nccl'

    def __init__(self, bootstrap, cupy, nccl):
        self.bootstrap = bootstrap
        self.cupy = cupy
        self.nccl = nccl
        self.timeout = bootstrap.timeout
        self.rank, self.size = bootstrap.rank, bootstrap.size
        self.local_rank, self.local_size = bootstrap.local_rank, bootstrap.local_size
        unique_id = exchange_unique_id(bootstrap, nccl)
        # ncclCommInitRank blocks until every rank has joined: a barrier under the deadline
        # first, so a rank that died before this point is an error here, not a hang inside NCCL.
        bootstrap.allreduce_host(np.ones(1, np.int32), 'the barrier before NCCL init')
        self.comm = nccl.NcclCommunicator(self.size, unique_id, self.rank)
        self.stream = cupy.cuda.Stream(non_blocking=True)

    def wire_dtype(self, dtype):
        nccl_dtype(self.nccl, dtype, 'gpuk.distributed')
        return np.dtype(dtype)

    def start_allreduce(self, buffer, what):
        self._check_usable(what)
        self._after_compute()
        self._nccl_call(what, lambda: self.comm.allReduce(
            device_pointer(buffer), device_pointer(buffer), buffer.size,
            nccl_dtype(self.nccl, buffer.dtype, what), self.nccl.NCCL_SUM, self.stream.ptr))
        return PendingAllreduce(self._record(), buffer, what)

    def finish_allreduce(self, pending):
        self._wait(pending.request, pending.what)
        self.cupy.cuda.get_current_stream().wait_event(pending.request)
        return pending.buffer

    def progress(self):
        pass  # NCCL moves on its own stream

    def broadcast(self, buffer, root, what):
        self._check_usable(what)
        self._after_compute()
        self._nccl_call(what, lambda: self.comm.bcast(
            device_pointer(buffer), buffer.size, nccl_dtype(self.nccl, buffer.dtype, what), root,
            self.stream.ptr))
        done = self._record()
        self._wait(done, what)
        self.cupy.cuda.get_current_stream().wait_event(done)
        return buffer

    def allreduce_host(self, array, what, op='sum'):
        return self.bootstrap.allreduce_host(array, what, op)

    def broadcast_host(self, array, root, what):
        return self.bootstrap.broadcast_host(array, root, what)

    def abort(self, code=1):
        self._abort_comm()
        self.bootstrap.abort(code)

    # --- internals ----------------------------------------------------------------------

    def _after_compute(self):
        """The communication stream waits for what the compute stream has queued so far."""
        ready = self.cupy.cuda.Event(disable_timing=True)
        ready.record(self.cupy.cuda.get_current_stream())
        self.stream.wait_event(ready)

    def _record(self):
        done = self.cupy.cuda.Event(disable_timing=True)
        done.record(self.stream)
        return done

    def _nccl_call(self, what, call):
        try:
            return call()
        except self.nccl.NcclError as exc:
            self._fail('%s failed in NCCL: %s' % (what, exc), exc)

    def _done(self, event, what):
        self._nccl_call(what, self.comm.check_async_error)
        return event.done

    def _wait(self, event, what):
        self._wait_until(lambda: self._done(event, what), what, on_timeout=self._abort_comm)

    def _abort_comm(self):
        # ncclCommAbort stops the spinning kernels, so the process can exit.
        if self.comm is not None:
            self.comm.abort()
            self.comm = None

    def _on_failure(self):
        self._abort_comm()
