"""K.function's CUDA Graph path: a plan captured once per input signature and replayed.

Per (plan, input shapes and dtypes), on the CUDA runtime:

1. the first call runs the plan with plain launches (it also checks every launch, see
   Function._run_plan) and counts its device-to-host syncs: a step that reads device values
   on the host (print_tensor, a loss-scaling decision) cannot be captured, and
   neither can one with random ops (a replay would repeat the same numbers) — those keep
   plain launches for good, and say why in ``refused``;
2. the second call captures: inputs go into fixed buffers, one warm-up run on a side stream
   with a private memory pool fills the pool, then the plan runs again under
   ``stream.begin_capture()`` with the same pool (so every intermediate gets the same
   address on every replay, and nothing outside the graph can be handed those blocks: the
   pool is the per-plan arena), followed by the copies of the updates' new values into the
   variables' own buffers. Any failure (a sync the counters did not see, an unsupported call)
   ends the capture and the signature falls back to plain launches; one that ran out of
   memory runs plain and is tried again later, a few times (PlanGraphs.run). The ops'
   device-side value checks (runtime/deferred.py: label ranges, CTC lengths) are not host
   reads: the warm-up's are read once, the capture's stay with the graph, which recomputes
   their flags, copies the updates only when none is set, and hands them to K.function to
   read with the outputs, so a bad value raises the op's own error after a replay too;
3. later calls copy their inputs into the fixed buffers and launch the graph: no Python per
   kernel, no allocation. Outputs are the graph's fixed output buffers (K.function copies
   them to the host at once).

Variables keep their buffers: a graph writes updates in place, into buffers the capture gave
each variable it reads or updates (copies: a value shared with another variable, a plan
constant or a view of one must never be written), after copying aside any target that reads
them (an output that is an updated variable is its value before the update); a variable whose
value was replaced since the capture (K.set_value, another function's update) is copied into
the graph's buffer before the replay. No other variable comes to hold a graph's buffer: a plain
step's update value that is one (``owns``) is copied first (gpuk/function.py). Up to
MAX_GRAPHS signatures are kept per plan; a new shape beyond them runs plain.
``GPUK_CUDA_GRAPHS=0`` turns the path off (read per call).
"""
import contextlib
import os
import weakref
from collections import OrderedDict

import numpy as np

from gpuk import device
from gpuk.kernels import runtime
from gpuk.kernels.runtime import counters, deferred, prepared
from gpuk.ops.base import Op
from gpuk.ops.random import RandomOp

MAX_GRAPHS = 8
# Captures of one signature that may run out of memory before it keeps plain launches for good.
# Each try costs a warm-up run in a private pool, the release and a plain run; memory may have
# come free since the last (what another call held, a raised pool limit), and a capture needs
# more than a plain step (its pool's blocks are its own): three tries bound the cost at a few
# steps' time over the function's life.
MAX_CAPTURE_TRIES_OUT_OF_MEMORY = 3
_RELAXED_CAPTURE = 2   # cudaStreamCaptureModeRelaxed: a cudaMalloc in the pool may happen while capturing


def enabled():
    return os.environ.get('GPUK_CUDA_GRAPHS', '1').strip() != '0'


def supported(impl):
    """The CUDA runtime with stream capture (CuPy's Stream.begin_capture)."""
    return impl.kind == 'cuda' and hasattr(getattr(impl.xp.cuda, 'Stream', None), 'begin_capture')


def _random_ops(op, seen):
    """True when ``op`` is, or holds (a scan's step plans, a wrapped op), a random op."""
    if id(op) in seen:
        return False
    seen.add(id(op))
    if isinstance(op, RandomOp):
        return True
    for value in vars(op).values():
        nested = value.values() if isinstance(value, dict) else (value,)
        for item in nested:
            if isinstance(item, Op) and _random_ops(item, seen):
                return True
            steps = getattr(item, 'steps', None)   # a scan's step Plan
            if isinstance(steps, list) and any(_random_ops(step[0].__self__, seen) for step in steps
                                               if hasattr(step[0], '__self__')):
                return True
    return False


# id(buffer) -> a weak reference to the CapturedStep whose graph reads or writes that variable
# buffer in place (the step holds the buffer, so the id is that buffer's while the step lives)
_owned = {}


def _own(buffers, step):
    ids = {id(buffer) for buffer in buffers}

    def forget(ref):   # runs as the step dies, before its buffers do
        for key in ids:
            if _owned.get(key) is ref:
                del _owned[key]
    ref = weakref.ref(step, forget)
    for key in ids:
        _owned[key] = ref


def owns(array):
    """Whether ``array`` is, or is a view of, a variable buffer a captured graph reads or writes
    in place: K.function copies such an update value before another variable may hold it."""
    if not _owned:
        return False
    for candidate in (array, getattr(array, 'base', None)):
        ref = _owned.get(id(candidate))
        if ref is not None and ref() is not None:
            return True
    return False


class CaptureRefused(Exception):
    """This signature keeps plain launches (the message says why)."""


class BadValues(Exception):
    """The capture's warm-up found a bad argument value (a device-side check): this call runs
    plain and raises the check's error; the signature may still be captured later."""


class CapturedStep:
    """One plan captured for one input signature."""

    def __init__(self, plan, fed, updates):
        xp = plan.impl.xp
        self.xp = xp
        self.stream = xp.cuda.Stream(non_blocking=False)   # ordered with the legacy default stream
        self.pool = xp.cuda.MemoryPool()
        # The graph reads the variables in place and writes the updated ones in place: each gets
        # a contiguous copy of its own here (keeping 0-d shapes), the graph's buffer. Its value
        # may be shared with another variable (K.update(a, x) and K.update(b, x) in a plain step,
        # K.update(a, b)), a plan's folded constant or K.shape array, or a view of any of them,
        # which a replay must never write: neither its update copies nor its copy of a variable
        # replaced since the capture (a plain step assigns a new array instead). A plain step
        # that would make another variable hold a graph's buffer copies it (owns()).
        copied = set()
        for variable in [v for _, v in plan.variables] + [v for v, _ in updates]:
            if id(variable) not in copied:   # once, however many reads and updates it has
                copied.add(id(variable))
                variable.value = xp.array(variable.value, dtype=variable.dtype, order='C')
        self.variables = [(variable, variable.value) for _, variable in plan.variables]
        self.updates = [(variable, variable.value, index) for variable, index in updates]
        # the plan steps' reused output buffers (prepared.StepBuffers) start over, here and after
        # the capture: a graph writes only into its private pool, which nothing outside it is
        # ever handed; and they keep none while it runs, so the pool hands a dead value's block
        # to a later step's output (the graph's memory is the step's peak, not all its outputs)
        prepared.forget_kept()
        try:
            with self._private_pool(), prepared.buffers_not_kept():
                self.inputs = [xp.empty(a.shape, a.dtype) for a in fed]
                self._copy_in(fed)
                with self.stream:
                    with runtime.prepared_launches(), deferred.collecting() as warm_up_checks:
                        plan.run(self.inputs)                 # warm-up: fills the private pool
                    self.stream.synchronize()
                    try:   # a bad value in this call's data: the plain run raises its error
                        deferred.read(warm_up_checks)
                    except ValueError as error:
                        raise BadValues(error) from error
                    self.stream.begin_capture(getattr(xp.cuda.runtime, 'streamCaptureModeRelaxed',
                                                      _RELAXED_CAPTURE))
                    try:
                        with runtime.prepared_launches(), counters.counting() as held, \
                                deferred.collecting() as self.checks:
                            self.values = list(plan.run(self.inputs))
                            # the device-side value checks: their flags are recomputed by each
                            # replay and gate its update copies
                            self.failed = deferred.any_failed(self.checks) if self.checks else None
                            self._write_updates(self.failed)
                    finally:
                        graph = self.stream.end_capture()   # raises when the capture was invalidated
                    self.graph = graph
                    _own([buffer for _, buffer in self.variables] + [buffer for _, buffer, _ in self.updates], self)
                    # what the graph holds: gpuk's launches, and the steps computed with xp (CuPy's kernels)
                    self.launches, self.xp_steps = held.launches, held.xp_steps
        finally:
            # and again, however it ended: what the warm-up's and the capture's steps made in the
            # graph's pool (their buffers, K.shape's arrays) is the graph's, which its replays
            # write, or went with the pool of a capture that failed; a later plain run (another
            # plan sharing an op) must not be handed any of it
            prepared.forget_kept()

    def _write_updates(self, failed):
        """Captures the copies of the updates' new values into the variables' buffers. All new
        values are computed from the old ones first, as in a plain call: a value that may
        share memory with an updated variable (update(a, b) with update(b, a)) is copied aside
        before any variable is written. ``failed`` (a device bool, or None): a replay whose
        value checks fail copies nothing, so the error K.function then raises leaves every
        variable as it was."""
        xp = self.xp
        buffers = [buffer for _, buffer, _ in self.updates]
        for variable, _, index in self.updates:
            value = self.values[index]
            if tuple(value.shape) != tuple(variable.shape):   # a plain call raises the user's error
                raise CaptureRefused('update of %r has shape %s, variable has %s'
                                     % (variable.name, tuple(value.shape), variable.shape))
        # every target that reads an updated buffer (an update's new value, an output that is a
        # variable or a view of one) is copied aside first: outputs are the values before the
        # updates, as in a plain call
        aside = {}
        for index, value in enumerate(self.values):
            if hasattr(value, 'shape') and any(xp.may_share_memory(value, other) for other in buffers):
                if id(value) not in aside:
                    copy = xp.empty(value.shape, value.dtype)
                    xp.copyto(copy, value)
                    aside[id(value)] = copy
                self.values[index] = aside[id(value)]
        staged = [self.values[index] for _, _, index in self.updates]
        keep = None if failed is None else xp.logical_not(failed).reshape(())
        for (variable, buffer, _), value in zip(self.updates, staged):
            value = value.astype(variable.dtype, copy=False)
            if keep is None:
                xp.copyto(buffer, value)
            else:
                xp.copyto(buffer, value, where=keep)

    @contextlib.contextmanager
    def _private_pool(self):
        using = getattr(self.xp.cuda, 'using_allocator', None)
        with using(self.pool.malloc) if using is not None else contextlib.nullcontext():
            yield

    def _copy_in(self, fed):
        """The inputs into the graph's buffers: device arrays by a device copy, host arrays by
        a host-to-device copy into the buffer (no device allocation either way)."""
        xp = self.xp
        for buffer, value in zip(self.inputs, fed):
            if isinstance(value, xp.ndarray):
                xp.copyto(buffer, value)
            else:
                buffer.set(np.ascontiguousarray(value))

    def replay(self, fed):
        xp = self.xp
        self._copy_in(fed)
        for variable, buffer in self.variables:
            if variable.value is not buffer:   # replaced since the capture: the graph reads this buffer
                xp.copyto(buffer, variable.value)
                variable.value = buffer
        for variable, buffer, _ in self.updates:
            if variable.value is not buffer:
                variable.value = buffer        # written by the graph's last copies
        counters.device_call(self.graph.launch, self.stream)
        if self.checks:   # read by K.function with the outputs
            deferred.add_combined(self.checks, self.failed)
        counting = counters.active()
        if counting is not None:
            counting.graph_replays += 1
            counting.replayed_launches += self.launches
            counting.replayed_xp_steps += self.xp_steps
        return list(self.values)


class PlanGraphs:
    """A plan's captured steps per input signature, the signatures refused (with why), and
    those whose capture ran out of memory (``short_of_memory``: how many times, the last error),
    to be tried again."""

    def __init__(self, plan):
        self.plan = plan
        self.captured = OrderedDict()
        self.refused = {}
        self.short_of_memory = {}
        self._waiting = set()   # short of memory: a plain run must finish before the next try
        self._seen = set()
        self._blocked = None   # known after a first run, which builds the scans' step plans

    def blocked(self):
        """Why no signature of this plan can be captured, or None."""
        if self._blocked is None:
            steps = [step[0].__self__ for step in self.plan.steps if hasattr(step[0], '__self__')]
            seen = set()
            self._blocked = 'the step draws random numbers' if any(_random_ops(op, seen) for op in steps) else ''
        return self._blocked or None

    def run(self, key, fed, updates, run_plain):
        """The plan's target values for ``fed`` (the inputs: device or NumPy arrays): a replay,
        a capture then replay, or ``run_plain(fed)``. Returns (values, replayed): a replay
        applied the updates already.

        A capture that runs out of memory is released (its warm-up's buffers, its private pool),
        the call runs plain, and the signature is tried again after a plain run of it finished
        (that call's, or, where that one ran out of memory too, a later one's: a step that does
        not fit plainly is not captured), up to MAX_CAPTURE_TRIES_OUT_OF_MEMORY times; then it
        is refused. Other capture failures refuse it at once."""
        step = self.captured.get(key)
        if step is not None:
            self.captured.move_to_end(key)
            return step.replay(fed), True
        if key in self.refused or len(self.captured) >= MAX_GRAPHS:
            return run_plain(fed), False
        if key not in self._seen:
            return self._first_run(key, fed, run_plain), False
        if self.blocked():
            self.refused[key] = self.blocked()
            return run_plain(fed), False
        if key in self._waiting:
            return self._plain_after_short_of_memory(key, fed, run_plain), False
        try:
            step = CapturedStep(self.plan, fed, updates)
        except BadValues:
            step = None
        except Exception as exc:   # an invalidated capture, a sync, an unsupported call, out of memory
            reason = 'capture failed: %s: %s' % (type(exc).__name__, exc)
            if device.out_of_memory(exc):   # its warm-up's buffers and its private pool go
                device.release_memory(exc)
                self._short_of_memory(key, reason)
            else:
                self.refused[key] = reason
            step = None
        if step is None:   # run past the except clause: nothing of the failed capture is held
            if key in self._waiting:
                return self._plain_after_short_of_memory(key, fed, run_plain), False
            return run_plain(fed), False
        self.short_of_memory.pop(key, None)
        self.captured[key] = step
        return step.replay(fed), True

    def _short_of_memory(self, key, reason):
        tries = self.short_of_memory.get(key, (0, None))[0] + 1
        if tries >= MAX_CAPTURE_TRIES_OUT_OF_MEMORY:
            self.short_of_memory.pop(key, None)
            self.refused[key] = '%s (out of memory in %d captures)' % (reason, tries)
        else:
            self.short_of_memory[key] = (tries, reason)
            self._waiting.add(key)

    def _plain_after_short_of_memory(self, key, fed, run_plain):
        values = run_plain(fed)   # raises (and the signature waits on) when it does not fit either
        self._waiting.discard(key)
        return values

    def _first_run(self, key, fed, run_plain):
        before = counters.total_host_syncs()
        values = run_plain(fed)
        self._seen.add(key)
        syncs = counters.total_host_syncs() - before
        if syncs:
            self.refused[key] = '%d device-to-host syncs inside the step' % syncs
        return values


def signature(fed):
    return tuple((a.shape, np.dtype(a.dtype).str) for a in fed)
