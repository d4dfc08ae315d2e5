"""The errors of gpuk.distributed, and the deadline every blocking wait runs under."""
import os
import signal
import threading
import time


class DistributedError(RuntimeError):
    """A collective failed or did not finish in time: a worker died, hung, or stopped issuing
    the same collectives in the same order. The job cannot go on; at exit the process aborts
    the MPI job so that no worker is left waiting."""


def timeout_from_env():
    """Seconds a collective may take before it is declared failed (GPUK_DIST_TIMEOUT, default
    300: long enough for a slow step or a checkpoint on another worker, short enough that a
    dead job does not hold its machines for hours)."""
    raw = os.environ.get('GPUK_DIST_TIMEOUT', '300')
    try:
        value = float(raw)
    except ValueError:
        value = None
    if value is None or not value > 0 or value == float('inf'):
        raise ValueError('gpuk.distributed.init: GPUK_DIST_TIMEOUT must be a positive number of '
                         'seconds, got %r' % raw)
    return value


def check_timeout(timeout, where):
    if isinstance(timeout, bool) or not isinstance(timeout, (int, float)) or not timeout > 0 \
            or timeout == float('inf'):
        raise ValueError('%s: timeout must be a positive number of seconds, got %r' % (where, timeout))
    return float(timeout)


# Set when the launcher reports that a worker died: MPICH's Hydra, started with
# -disable-auto-cleanup, sends SIGUSR1 to the survivors instead of killing them.
_peer_failure = []


def _note_peer_failure(signum, frame):
    _peer_failure.append(signum)


def listen_for_peer_failure():
    """Turns the launcher's failure notice (SIGUSR1) into a DistributedError at the next wait,
    unless the program handles SIGUSR1 itself (or this is not the main thread)."""
    if threading.current_thread() is threading.main_thread() \
            and signal.getsignal(signal.SIGUSR1) is signal.SIG_DFL:
        signal.signal(signal.SIGUSR1, _note_peer_failure)


def wait_until(is_done, timeout, describe, on_timeout=None):
    """Polls ``is_done()`` until it returns True; past ``timeout`` seconds, or when the launcher
    has reported a dead worker, calls ``on_timeout`` (to cancel what is in flight) and raises
    DistributedError with ``describe()``.

    Polling (not a blocking wait) is the point: MPI's and NCCL's blocking collectives wait
    forever on a dead peer. The first polls spin, since most collectives finish within
    microseconds; later ones sleep up to a millisecond so a long wait costs no CPU.
    """
    start = time.monotonic()
    deadline = start + timeout
    spins = 0
    while not is_done():
        if _peer_failure:
            if on_timeout is not None:
                on_timeout()
            raise DistributedError(
                'gpuk.distributed: %s cannot complete: the MPI launcher reports that a worker '
                'process died; the job is being aborted' % describe())
        spins += 1
        if spins > 200:
            time.sleep(min(1e-3, 1e-5 * (spins - 200)))
        if time.monotonic() > deadline:
            if on_timeout is not None:
                on_timeout()
            raise DistributedError(
                'gpuk.distributed: %s did not complete within %g s (GPUK_DIST_TIMEOUT): a worker '
                'has died, hung, or is not running the same collectives in the same order; the '
                'job is being aborted' % (describe(), timeout))


class FailsForGood:
    """What the MPI and NCCL transports share about failure: the first failed collective is kept
    in ``failed`` and every later one raises at once (the peers are out of step for good). The
    transport sets ``rank``, ``size`` and ``timeout``."""
    failed = None

    def _check_usable(self, what):
        if self.failed is not None:
            raise DistributedError('gpuk.distributed: cannot run %s: an earlier collective failed '
                                   '(%s)' % (what, self.failed))

    def _wait_until(self, is_done, what, on_timeout=None):
        """wait_until under the transport's deadline; a wait that fails marks the transport failed."""
        try:
            wait_until(is_done, self.timeout, lambda: '%s on rank %d of %d' % (what, self.rank, self.size),
                       on_timeout=on_timeout)
        except DistributedError as exc:
            self.failed = str(exc)
            raise

    def _fail(self, message, cause):
        self.failed = message
        self._on_failure()
        raise DistributedError('gpuk.distributed: %s (rank %d of %d): a worker has probably died; '
                               'the job is being aborted' % (message, self.rank, self.size)) from cause

    def _on_failure(self):
        """What the transport stops before _fail raises (nothing, unless it says otherwise)."""
