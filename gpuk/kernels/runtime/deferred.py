"""Deferred device-side argument checks: validate data-dependent arguments without a host sync.

A check of *values* (labels in range, lengths within the time steps) needs the data; on a GPU,
reading it at the call is a device-to-host copy that stalls the stream, two or three of them
per CTC or sparse cross-entropy call. Instead the launcher (or op) computes a 0-d *flag* on
the device ("some value is bad": a few small reductions, queued like any kernel, or one
kernel's output: the CTC loss's ctc_check.cu writes a nonzero int64) and registers it here
with a *recheck*: a callable that runs the eager check on host copies and raises its
ValueError. The flags are read later, all in one copy, where the results are read anyway:
`raise_pending()`, which K.function calls where it copies the step's outputs to the host
(after the plan ran: no sync inside the step) and before it commits any variable update, so
a failed call still changes no variable.

A captured CUDA Graph (gpuk/cuda_graph.py) keeps the checks its capture registered
(`collecting()`): the graph recomputes their flags and their union (`any_failed`) on each
replay, masks its in-place update copies with the union, and the replay hands them back as one
check on the union (`add_combined`) to be read with the outputs like a plain run's.

Only a set flag costs more: its recheck copies the inputs to the host and raises the very
message the eager check raised (same text, naming the K function and the argument). The
kernels never fault on bad values meanwhile: they guard every data-dependent index.

Eager instead of deferred: on NumPy arrays of the 'cpu' device (the twins check eagerly;
nothing to save there), and under GPUK_SYNC_LAUNCHES=1 (debugging: the error at its call).
The emulated runtime defers like the CUDA runtime, so the tests exercise this path.
"""
import contextlib
import os
import threading

import numpy as np

from . import to_host

_local = threading.local()
# Pending checks hold their inputs alive until read; past this many they are read at once.
MAX_PENDING = 256


def _pending():
    if not hasattr(_local, 'checks'):
        _local.checks = []
    return _local.checks


def eager():
    """True when checks run at their call (GPUK_SYNC_LAUNCHES=1)."""
    return os.environ.get('GPUK_SYNC_LAUNCHES') == '1'


def defer(rt, flag, recheck):
    """Registers `flag` (a 0-d or 1-element boolean or integer array of rt.xp, true / nonzero
    when some value is bad) with `recheck` (raises the eager check's error on host copies).

    Under GPUK_SYNC_LAUNCHES=1 the flag is read now and recheck runs at once when it is set."""
    if eager():
        if bool(to_host(rt, flag).reshape(-1)[0]):
            _run_recheck(recheck)
        return
    checks = _pending()
    checks.append((rt, flag, recheck))
    if len(checks) >= MAX_PENDING:   # kernel-API callers that never read: bound what is held
        raise_pending()


@contextlib.contextmanager
def collecting():
    """Checks registered inside the block go to the list it yields instead of the pending ones
    (a graph capture keeps its checks for its replays; a warm-up reads its own)."""
    outer = _pending()
    _local.checks = collected = []
    try:
        yield collected
    finally:
        _local.checks = outer


def add_combined(checks, failed):
    """Makes ``checks`` (from ``collecting()``, their flags recomputed by a replay) pending
    again as one check: ``failed`` (their ``any_failed`` flag, computed inside the replay) is
    the one flag read, so a replay's read allocates nothing on the device; when it is set the
    checks are read one by one and the first failed one raises its error."""
    _pending().append((checks[0][0], failed, lambda: read(checks)))


def any_failed(checks):
    """One 1-element boolean device array: True when some flag of ``checks`` (a non-empty list
    from ``collecting()``, one runtime's) is set; no host read."""
    rt = checks[0][0]
    return rt.xp.any(_flags(rt, [flag for _, flag, _ in checks])).reshape(1)


def _flags(rt, flags):
    return rt.xp.concatenate([rt.xp.asarray(flag, dtype=bool).reshape(-1)[:1] for flag in flags])


def pending_count():
    """How many checks wait to be read (for tests)."""
    return len(_pending())


def discard():
    """Forgets every pending check (a call that failed otherwise must not leave its flags to
    the next one)."""
    _pending().clear()


def raise_pending():
    """Reads every pending flag, in one device-to-host copy per runtime, and raises the first
    failed check's ValueError (the checks are forgotten either way)."""
    checks = _pending()
    if not checks:
        return
    _local.checks = []
    read(checks)


def read(checks):
    """Reads the flags of ``checks`` (one device-to-host copy per runtime) and raises the first
    failed check's ValueError."""
    by_runtime = {}
    for rt, flag, recheck in checks:
        by_runtime.setdefault(id(rt), (rt, []))[1].append((flag, recheck))
    for rt, entries in by_runtime.values():
        flags = [flag for flag, _ in entries]
        joined = flags[0] if len(flags) == 1 else _flags(rt, flags)   # one flag: read as it is
        bad = np.asarray(to_host(rt, joined), dtype=bool).reshape(-1)[:len(flags)]
        for is_bad, (_, recheck) in zip(bad, entries):
            if is_bad:
                _run_recheck(recheck)


def _run_recheck(recheck):
    recheck()
    # the device flag and the host check disagree: say so rather than pass bad data silently
    raise ValueError('%s: an argument failed its device-side check, but the host check '
                     'found no error' % getattr(recheck, '__qualname__', recheck))
