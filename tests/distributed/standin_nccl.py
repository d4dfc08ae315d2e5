"""Stand-ins for the parts of CuPy and its NCCL bindings that NcclTransport uses, recording
every call, so the NCCL path's bootstrap and stream/event choreography run on a CPU.

The arrays are NumPy arrays wrapped to show ``.data.ptr`` (their host address); the
communicator is of ``size`` ranks but reduces nothing: a 1-rank all-reduce and broadcast
leave the buffer as it is, which is what a real 1-rank NCCL communicator does.
"""
import types

import numpy as np


class Array:
    def __init__(self, array):
        self.array = np.ascontiguousarray(array)
        self.size, self.dtype = self.array.size, self.array.dtype
        self.data = types.SimpleNamespace(ptr=self.array.__array_interface__['data'][0])


class Stream:
    count = 0

    def __init__(self, non_blocking=False, log=None):
        Stream.count += 1
        self.ptr = 0x1000 + Stream.count
        self.log = log

    def wait_event(self, event):
        self.log.append(('wait_event', self.ptr, event.id))


class Event:
    def __init__(self, log, complete):
        self.log, self.complete = log, complete
        self.id = len([entry for entry in log if entry[0] == 'record'])

    def record(self, stream):
        self.log.append(('record', stream.ptr, self.id))

    @property
    def done(self):
        return self.complete()


def make_cupy(log, events_complete=lambda: True):
    compute = Stream(log=log)
    cuda = types.SimpleNamespace(
        Stream=lambda non_blocking=False: Stream(non_blocking, log),
        Event=lambda disable_timing=False: Event(log, events_complete),
        get_current_stream=lambda: compute)
    return types.SimpleNamespace(cuda=cuda, compute_stream=compute)


class NcclError(RuntimeError):
    pass


def make_nccl(log, unique_id, async_error=None):
    class NcclCommunicator:
        def __init__(self, ndev, comm_id, rank):
            log.append(('init', ndev, comm_id, rank))
            self.aborted = False

        def allReduce(self, send, recv, count, datatype, op, stream):
            log.append(('allReduce', send, recv, count, datatype, op, stream))

        def bcast(self, buff, count, datatype, root, stream):
            log.append(('bcast', buff, count, datatype, root, stream))

        def check_async_error(self):
            if async_error is not None:
                raise NcclError(async_error)

        def abort(self):
            log.append(('abort',))

    def get_unique_id():
        log.append(('get_unique_id',))
        return unique_id

    return types.SimpleNamespace(
        NcclCommunicator=NcclCommunicator, NcclError=NcclError, get_unique_id=get_unique_id,
        NCCL_SUM=0, NCCL_FLOAT16=6, NCCL_FLOAT32=7, NCCL_FLOAT64=8, NCCL_INT32=2, NCCL_INT64=4,
        NCCL_UINT8=1)


class Bootstrap:
    """The MPI side as NcclTransport sees it: rank facts, the id broadcast and a barrier.
    ``root_id`` is what root's broadcast delivers to a non-root rank."""

    def __init__(self, log, rank, size, root_id=None, timeout=0.05):
        self.log, self.rank, self.size, self.root_id, self.timeout = log, rank, size, root_id, timeout
        self.local_rank, self.local_size = rank, size

    def broadcast(self, buffer, root, what):
        self.log.append(('mpi_broadcast', buffer.dtype.name, buffer.size, root, what))
        if self.rank != root:
            buffer[:] = self.root_id
        return buffer

    def allreduce_host(self, array, what, op='sum'):
        self.log.append(('mpi_allreduce', what))
        return np.array(array) * self.size

    def abort(self, code=1):
        self.log.append(('mpi_abort', code))
