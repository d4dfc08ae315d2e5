"""Collectives over MPI (mpi4py) on host (NumPy) arrays, each one non-blocking and polled
under the deadline (errors.wait_until), so a dead or hung peer gives an error, not a hang.

Also the process facts every transport needs from MPI: rank, size and local rank (the rank
among the processes on the same node, which picks the GPU).
"""
import numpy as np

from gpuk.distributed.errors import FailsForGood

# MPI reductions have no half-precision type: float16 buckets travel as float32.
_WIRE_DTYPES = {np.dtype(np.float16): np.dtype(np.float32)}


class PendingAllreduce:
    """A started all-reduce: ``buffer`` holds the sum once ``request`` has completed."""

    def __init__(self, request, buffer, what):
        self.request = request
        self.buffer = buffer
        self.what = what


class MpiTransport(FailsForGood):
    name = 'mpi'

    def __init__(self, MPI, timeout):
        self.MPI = MPI
        self.comm = MPI.COMM_WORLD
        # Errors (a peer's connection lost, ...) come back as exceptions instead of killing
        # the process, so they can be turned into a DistributedError naming the collective.
        self.comm.Set_errhandler(MPI.ERRORS_RETURN)
        self.timeout = timeout
        self.rank = self.comm.Get_rank()
        self.size = self.comm.Get_size()
        node = self.comm.Split_type(MPI.COMM_TYPE_SHARED, key=self.rank)
        self.local_rank = node.Get_rank()
        self.local_size = node.Get_size()
        node.Free()
        self._in_flight = []

    # --- the transport interface (also NcclTransport's) ---------------------------------

    def wire_dtype(self, dtype):
        dtype = np.dtype(dtype)
        return _WIRE_DTYPES.get(dtype, dtype)

    def start_allreduce(self, buffer, what):
        """Starts summing ``buffer`` (a contiguous 1-D NumPy array) across ranks, in place."""
        self._check_usable(what)
        request = self._call(what, lambda: self.comm.Iallreduce(
            self.MPI.IN_PLACE, buffer, op=self.MPI.SUM))
        pending = PendingAllreduce(request, buffer, what)
        self._in_flight.append(pending)
        return pending

    def finish_allreduce(self, pending):
        """Waits (under the deadline) for a started all-reduce; returns its buffer."""
        self._wait(pending.request, pending.what)
        self._in_flight.remove(pending)
        return pending.buffer

    def progress(self):
        """Lets MPI move in-flight all-reduces on (MPICH progresses only inside MPI calls)."""
        for pending in self._in_flight:
            self._call(pending.what, pending.request.Test)

    def broadcast(self, buffer, root, what):
        """Overwrites ``buffer`` (contiguous) with root's, on every rank."""
        self._check_usable(what)
        # As bytes: a broadcast does no arithmetic, and MPI has no type for some dtypes.
        raw = buffer.reshape(-1).view(np.uint8)
        request = self._call(what, lambda: self.comm.Ibcast(raw, root=root))
        self._wait(request, what)
        return buffer

    def allreduce_host(self, array, what, op='sum'):
        """Blocking all-reduce of a small host array (metrics, flags); returns a new array."""
        self._check_usable(what)
        buffer = np.ascontiguousarray(array).copy()
        mpi_op = {'sum': self.MPI.SUM, 'min': self.MPI.MIN, 'max': self.MPI.MAX}[op]
        request = self._call(what, lambda: self.comm.Iallreduce(self.MPI.IN_PLACE, buffer, op=mpi_op))
        self._wait(request, what)
        return buffer

    def broadcast_host(self, array, root, what):
        return self.broadcast(np.ascontiguousarray(array).copy(), root, what)

    def abort(self, code=1):
        self.comm.Abort(code)

    # --- internals ----------------------------------------------------------------------

    def _call(self, what, call):
        try:
            return call()
        except self.MPI.Exception as exc:
            self._fail('%s failed in MPI: %s' % (what, exc.Get_error_string()), exc)

    def _wait(self, request, what):
        self._wait_until(lambda: self._call(what, request.Test), what)


class LocalTransport:
    """The one-process world when mpi4py is not installed: every collective is the identity."""
    name = 'local'
    rank, size, local_rank, local_size = 0, 1, 0, 1
    failed = None

    def __init__(self, timeout):
        self.timeout = timeout  # unused by its own collectives; NcclTransport reads it

    def wire_dtype(self, dtype):
        return np.dtype(dtype)

    def start_allreduce(self, buffer, what):
        return PendingAllreduce(None, buffer, what)

    def finish_allreduce(self, pending):
        return pending.buffer

    def progress(self):
        pass

    def broadcast(self, buffer, root, what):
        return buffer

    def allreduce_host(self, array, what, op='sum'):
        return np.array(array, copy=True)

    def broadcast_host(self, array, root, what):
        return np.array(array, copy=True)

    def abort(self, code=1):
        raise SystemExit(code)
