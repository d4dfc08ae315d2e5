"""The process's place in the job: init(), rank(), size(), local_rank(), and the transport the
collectives run on (NCCL between GPUs, MPI between hosts' NumPy arrays, or the one-process
world when mpi4py is absent)."""
import atexit
import os
import sys
import time

from gpuk import device
from gpuk.distributed.errors import check_timeout, listen_for_peer_failure, timeout_from_env

TRANSPORTS = ('auto', 'mpi', 'nccl')
# The job size MPI launchers (MPICH's Hydra and Slurm's PMI, Open MPI) give the processes they start.
_LAUNCHER_SIZE_VARIABLES = ('PMI_SIZE', 'OMPI_COMM_WORLD_SIZE')

_world = {'transport': None, 'atexit': False}


def init(timeout=None, transport=None):
    """Joins the job started by ``mpirun``/``mpiexec``/``srun`` (or, started alone, a job of one
    process). Call it first, before creating variables: on a GPU it picks the GPU of
    ``local_rank()``. Calling it again does nothing.

    # Arguments
        timeout: seconds any collective may take before the job is declared broken
            (default: the GPUK_DIST_TIMEOUT environment variable, else 300).
        transport: 'nccl', 'mpi' or 'auto' (default: GPUK_DIST_TRANSPORT, else 'auto'):
            NCCL on the CUDA device, MPI on the NumPy and emulated devices. The MPI
            library is also what starts and bootstraps an NCCL job.
    """
    if _world['transport'] is not None:
        return
    timeout = timeout_from_env() if timeout is None else check_timeout(timeout, 'gpuk.distributed.init')
    if transport is None:
        transport = os.environ.get('GPUK_DIST_TRANSPORT', 'auto').strip().lower() or 'auto'
    if transport not in TRANSPORTS:
        raise ValueError('gpuk.distributed.init: transport must be one of %s, got %r'
                         % (TRANSPORTS, transport))
    on_cuda = device.kind() == 'cuda'
    if transport == 'auto':
        transport = 'nccl' if on_cuda else 'mpi'
    if transport == 'nccl' and not on_cuda:
        raise ValueError("gpuk.distributed.init: transport 'nccl' needs the CUDA device, but "
                         "gpuk runs on %r" % device.kind())
    if transport == 'mpi' and on_cuda:
        # The mpich wheel's MPI is not CUDA-aware: it cannot read CuPy arrays.
        raise ValueError("gpuk.distributed.init: transport 'mpi' moves host (NumPy) arrays; "
                         "gpuk runs on 'cuda', use transport 'nccl'")
    bootstrap = _mpi_transport(timeout)
    chosen = _nccl_transport(bootstrap) if transport == 'nccl' else bootstrap
    _world['transport'] = chosen
    listen_for_peer_failure()
    if not _world['atexit']:
        atexit.register(_abort_if_failed)
        _world['atexit'] = True


def is_initialized():
    return _world['transport'] is not None


def transport(where):
    """The transport, or a RuntimeError naming ``where`` when init() has not been called."""
    chosen = _world['transport']
    if chosen is None:
        raise RuntimeError('%s: gpuk.distributed is not initialized; call gpuk.distributed.init() '
                           'first' % where)
    return chosen


def rank():
    """This process's rank in the job, 0 .. size()-1."""
    return transport('gpuk.distributed.rank').rank


def size():
    """The number of processes in the job."""
    return transport('gpuk.distributed.size').size


def local_rank():
    """This process's rank among the job's processes on the same node (picks its GPU)."""
    return transport('gpuk.distributed.local_rank').local_rank


def local_size():
    """The number of the job's processes on this node."""
    return transport('gpuk.distributed.local_size').local_size


def shutdown():
    """Forgets the transport (tests; MPI itself is finalized by mpi4py at exit)."""
    _world['transport'] = None


def _mpi_transport(timeout):
    from gpuk.distributed.transport_mpi import LocalTransport, MpiTransport
    try:
        from mpi4py import MPI
    except ImportError as exc:
        if any(os.environ.get(name, '1').strip() not in ('', '1') for name in _LAUNCHER_SIZE_VARIABLES):
            raise ImportError('gpuk.distributed.init: this process was started by an MPI launcher '
                              'but mpi4py cannot be imported (%s); install gpuk[distributed]' % exc) from exc
        return LocalTransport(timeout)
    return MpiTransport(MPI, timeout)


def _nccl_transport(bootstrap):
    import cupy
    from cupy.cuda import nccl
    from gpuk.distributed.transport_nccl import NcclTransport
    if not getattr(nccl, 'available', False):
        raise ImportError('gpuk.distributed.init: CuPy was built without NCCL; install '
                          "nvidia-nccl-cu13 or pass transport='mpi'")
    cupy.cuda.Device(bootstrap.local_rank % cupy.cuda.runtime.getDeviceCount()).use()
    return NcclTransport(bootstrap, cupy, nccl)


def _abort_if_failed():
    """A collective failed: MPI_Finalize would wait on the dead peer, so abort the job (which
    also ends the workers still waiting) instead of exiting normally."""
    chosen = _world['transport']
    if chosen is not None and chosen.failed is not None:
        sys.stderr.flush()
        sys.stdout.flush()
        # The launcher forwards output asynchronously and MPI_Abort tears the job down at once:
        # a moment's grace lets the traceback reach the user.
        time.sleep(0.5)
        chosen.abort(1)


__all__ = ['init', 'is_initialized', 'rank', 'size', 'local_rank', 'local_size', 'shutdown']
