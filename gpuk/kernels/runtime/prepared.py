"""Launches prepared once per problem: a launcher's checks and launch set-up run on its first
call for a problem signature, and later calls for it go straight to the launch.

    problem = prepared.get(rt, 'avg_pool_fwd', (x,), (window, strides, pads, data_format),
                           lambda: <the checks, then the kernel, grid, block, scalar arguments>)

A launcher's argument checks (dtypes, ranks, shapes, geometry) and its launch set-up (kernel
name and defines, grid, block, scalar arguments, output shapes) read only the *signature* of
its arrays (type, shape, dtype) and its other parameters. ``get`` keeps what ``prepare()``
returned per (runtime, launcher, parameters and their types, array signatures): the first
call of a problem checks it and raises the user's error; every later call of the same problem
(each step of a K.function plan for the same input shapes: the same launches with the same
signatures) skips both. What ``prepare()`` returns holds sizes, names, numpy scalars, the kernel launches
themselves (``rt.kernel_launch``: the loaded kernel with its grid, block and shared memory
checked) and at most constant device tables no call writes (the fused kernel's index
strides), or a *runner* closing over those (``fused_runner``, ``bias_act_fwd_runner``, the
cross-entropy runners: ``run(*arrays)`` is the per-call part); never a caller's array: the
per-call part still does the array work (contiguous copies, casts, outputs, the launch). A
plan step that calls a runner launcher keeps its last runner itself (``Kept`` below).

Checked on every call instead:
- with GPUK_CHECK_LAUNCHES=1 (the debug flag; read at import and by each
  ``runtime.prepared_launches()`` block, i.e. each K.function call), which also keeps the
  runtimes' per-launch argument checks on;
- when a parameter is unhashable (a list of pads) or an "array" is neither one of the
  runtime's arrays, None nor a host number (a NumPy array handed to the CUDA runtime, a
  list): those are converted and checked per call, so their errors and conversions stay
  exactly as before. Host numbers among the arrays (batch norm's decay) key by their type
  only: a check that reads a number's value takes it among the parameters (epsilon).

Values (labels in range, lengths) are not part of a signature: runtime/deferred.py checks them
on the device on every call.
"""
import contextlib
import operator
import os
import threading
import weakref
from sys import getrefcount as _getrefcount

import numpy as np

from . import _forced

_PREPARED = {}
_generation = [0]   # bumped by clear(): what Kept instances kept is forgotten with the table
LIMIT = 4096   # problems kept before the table starts over (shapes churn in no real training loop)


def get(rt, launcher, arrays, params, prepare):
    """``prepare()``'s result for this problem: computed on its first call, kept after (see the
    module docstring for when it runs on every call)."""
    if _forced[0]:   # runtime.check_launches_forced(), read per launcher call
        return prepare()
    array_type = rt.xp.ndarray
    try:   # the runtime's arrays inline: this runs per launcher call
        # the parameters' types too: 1, 1.0 and True are equal keys, and a check that refuses
        # axis=1.0 must not be skipped because axis=1 was prepared (nested tuples are not
        # typed: their checks run in the ops, before any launcher sees them)
        key = (rt, launcher, params, tuple(map(type, params)),
               *[(a.shape, a.dtype) if type(a) is array_type else _signature(a, array_type) for a in arrays])
        found = _PREPARED.get(key)
    except (TypeError, _NotAnArray):
        return prepare()
    if found is None:
        if len(_PREPARED) >= LIMIT:
            _PREPARED.clear()
        found = _PREPARED[key] = prepare()
    return found


def clear():
    """Forgets every prepared problem (tests that change what a preparation reads)."""
    _PREPARED.clear()
    _generation[0] += 1


class Kept:
    """What one call site prepared for its last problem: a plan step's op sees the same problem
    call after call, so it keeps the prepared value (a launcher's runner) with its arrays'
    layouts (type, shape, strides, dtype) and finds it again by comparing them, without building
    and hashing ``get``'s key or going through the launcher's own lookups. The one way an op
    does it:

        def forward(self, impl, x, bias):
            return self.kept.run(impl, (x, bias), self._runner)

        def _runner(self, impl, x, bias):   # on a miss: the launcher's runner for this problem
            return impl.<family>.<launcher>_runner(..., x, bias)

    ``run`` calls the kept runner with the arrays (``run(*arrays)``), making it first with
    ``make(owner, *arrays)`` when the arrays' layouts or ``owner`` (the implementation, the same
    object) changed. The comparison is one C-level list comparison (``LAYOUT`` mapped over the
    arrays). Because it includes the strides, a runner may offer a faster variant for exactly
    these layouts: a runner with a ``specialized(arrays)`` attribute is kept as what that
    returns (the fused runner's variant knows which inputs are strided, so it tests none per
    call), and such a variant, being this call site's own, may own the step's output buffers
    (``StepBuffers``: the plan's memory arena for plain launches). Inside a plan run whose input
    layouts repeat (``LayoutToken``), a Kept called once per run skips even the comparison, and
    the plan calls the runner it kept directly from the next run of that token on
    (``runner_of_run``).

    Values without a shape and dtype are never kept, and a value of another type misses (a NumPy
    array where the CUDA runtime's was kept goes through ``get`` and its checks, as before);
    ``keeps=False`` keeps nothing (a result shape read from a shape vector's values). Bypassed
    like ``get`` under GPUK_CHECK_LAUNCHES=1, and forgotten by ``clear()``. The hit path is this
    one call between the op's forward and the runner."""
    __slots__ = ('_last', '_keeps', '_run', '_repeats', '__weakref__')

    def __init__(self, keeps=True):
        # (owner, generation, layouts, value, token): replaced in one assignment, so a thread
        # sharing the step never reads half of one problem and half of another; ``token`` is
        # the LayoutToken of the plan run that found these layouts (None: none, or this call
        # site's layouts need not repeat per run), kept in the same tuple so that a runner is
        # never skipped to under a token other than its own
        self._last = None
        self._keeps = keeps
        # the run number of the last call in a plan run; _repeats: False once this call site
        # was called twice in one run (its layouts need not repeat per run)
        self._run, self._repeats = -1, True
        _EVERY_KEPT.add(self)

    def run(self, owner, arrays, make):
        """The kept runner's result on ``arrays`` (see the class docstring)."""
        last = self._last
        token = _plan_run.token
        if token is not None and last is not None and last[4] is token:
            run = token.runs
            if self._run == run - 1 and owner is last[0] and last[1] == _generation[0] and not _forced[0]:
                # called in the previous run of a plan with the same input layouts, once: these
                # arrays have the kept layouts (LayoutToken), nothing to compare
                self._run = run
                return last[3](*arrays)
            if self._run == run:   # a second call in this run: layouts need not repeat
                self._repeats = False
        mine = token if self._repeats else None
        found = None
        if last is not None and owner is last[0] and last[1] == _generation[0] and not _forced[0]:
            try:
                if [*map(LAYOUT, arrays)] == last[2]:
                    found = last[3]
                    if last[4] is not mine:   # the same layouts in another plan run
                        self._last = (*last[:4], mine)
            except AttributeError:   # not an array
                pass
        if found is None:
            found = make(owner, *arrays)
            if self._keeps:
                found = self._keep(owner, arrays, found, mine)
        if token is not None:
            self._run = token.runs
        return found(*arrays)

    def runner_of_run(self, owner, token):
        """The runner this call site called, with ``owner``, exactly once in the current run of
        ``token`` and kept for that run's layouts, or None: in the later runs of ``token`` the
        step's arrays have those layouts again (LayoutToken), so a plan may call it in place
        of the op's forward (Plan.run). None after ``clear()`` or ``forget_kept()``, and under
        GPUK_CHECK_LAUNCHES=1."""
        last = self._last
        if (last is None or token is None or last[4] is not token or self._run != token.runs or not self._repeats
                or owner is not last[0] or last[1] != _generation[0] or _forced[0]):
            return None
        return last[3]

    def _keep(self, owner, arrays, value, token):
        """Keeps ``value`` (its variant for these layouts, where it has one) for ``arrays``'
        layouts, found in a plan run of ``token``, and returns what it kept (nothing, when one
        has no shape or dtype)."""
        try:
            layouts = [*map(LAYOUT, arrays)]
        except AttributeError:   # not arrays: nothing kept, the call site asks each time
            self._last = None
            return value
        specialized = getattr(value, 'specialized', None)
        if specialized is not None:
            value = specialized(arrays)
        self._last = (owner, _generation[0], layouts, value, token)
        return value


class LayoutToken:
    """The runs of one plan whose inputs (fed arrays and variables) had the same layouts (type,
    shape, strides, dtype): Plan.run makes a new one when its inputs' layouts change and passes
    the same one otherwise, counting its runs. In such a plan every step's output layouts follow
    from its input layouts (a plan with a step whose output shape is read from a value that is
    not a constant gets no token: Op.shape_from_values), so a step sees in one run the layouts
    it saw in the previous run of the same token, and a Kept called once per run skips its
    comparison (Kept.run). Set per thread by ``enter_run``; None outside plan runs."""
    __slots__ = ('runs',)

    def __init__(self):
        self.runs = 0


class _PlanRun(threading.local):
    token = None


_plan_run = _PlanRun()


def enter_run(token):
    """Marks the start of a plan run under ``token`` (or None) on this thread; returns what
    ``leave_run`` restores (a scan's step plan runs inside a step of its outer plan)."""
    previous = _plan_run.token
    if token is not None:
        token.runs += 1
    _plan_run.token = token
    return previous


def leave_run(previous):
    _plan_run.token = previous


def run_stamp():
    """(LayoutToken, run number) of the plan run on this thread, or None: equal stamps are
    the same run of a plan, in which no step changes a value another step reads (a value
    checked once in a run stays checked for the rest of it)."""
    token = _plan_run.token
    return None if token is None else (token, token.runs)


# What Kept compares per array: its type, shape, strides (so its contiguity) and dtype, read in C
LAYOUT = operator.attrgetter('__class__', 'shape', 'strides', 'dtype')


class StepBuffers:
    """The output buffers of plan steps, reused across calls: the plan's memory arena for plain
    launches (a replayed CUDA Graph has its private pool instead, gpuk/cuda_graph.py). A step's
    runner kept by a ``Kept`` (its ``specialized`` variant) makes one for its outputs;
    ``take(k)`` is a buffer for output ``k`` (of the problem's shape and dtype) that nothing else
    holds. The buffers are not the step's own: every StepBuffers of one shape and dtype (made by
    the same ``empty``, in the same thread, between two ``forget_kept()``) takes from one shared
    list of them, the arena's blocks of that shape and dtype (``_blocks``). So a value the plan
    frees after its last reader gives its buffer to the next step of that shape and dtype, in
    the same call (a backward pass's activation gradients, dead before the next layer's are
    made) as in the next: the arena holds, per shape and dtype, as many buffers as values of it
    were ever alive together, where one buffer per step output held them all.

    Reuse is decided per take by reference count, so it can never alias a value still in use:
    a buffer is handed out again only when the arena's list holds the last reference to it (the
    plan freed it after its last reader, K.function copied it to the host). Anything else
    holding it (a plan slot not yet freed, a step's input, a variable whose new value it became,
    a view of it, a scan's stacked history, a caller that kept the array, an output taken
    before it in the same step) makes ``take`` go on to the next buffer or allocate. The order of
    launches on one stream makes a freed buffer safe to write by a later launch, as it does for
    CuPy's pool, whose free lists are per stream; step buffers made by different threads (whose
    plans may run on different streams) never share blocks. (The thread is the one that made the
    runner: a runner two threads share, one op run by both, takes from its maker's lists in
    either, as it reused its own buffers before they were shared; right while the threads launch
    on one stream, CuPy's default, not where each has a stream of its own.) A step output tries
    first the buffers it took in its last two calls (``take``), and goes through the list only
    when both are held. A new buffer joins the list; the list keeps at most two per step output using it
    (an optimizer's update that becomes a variable's value and outlives the call needs a
    second), dropping its oldest when every one is held elsewhere (a caller keeping every step's
    value). Graph capture must not reuse a buffer from before it
    (its replays would keep writing there after the arena let it go), nor may a plain run after
    it be handed one of the graph's: gpuk/cuda_graph.py calls ``forget_kept()`` before and after
    the capture, which starts new lists, and keeps none inside it (below). Under
    GPUK_CHECK_LAUNCHES=1, where runners are made per call, each StepBuffers has lists of its
    own, as fresh as its runner.

    Values of different shapes never share a buffer, and a buffer holds one value at a time
    (a view or a slice of a larger buffer would be held through the larger buffer's base, and
    NumPy and CuPy point a view of a view at the first base, so a held slice could not be told
    from a free one): the arena holds the sum over shapes and dtypes of the most values alive
    together, which is more than the most bytes alive together that the memory pool's splitting
    gives (measured in the GPU rehearsal, ``python -m bench.host_overhead --peak-memory``:
    docs/architecture.md "The memory plan"). So buffers are kept only while
    ``keeps_step_buffers()``: not inside a graph capture (``buffers_not_kept``: the graph's
    private pool reuses blocks within the step, and a replay allocates nothing anyway), and not
    after an allocation failure (``stop_keeping_buffers``, for the rest of the process) or under
    GPUK_STEP_BUFFERS=0; then ``take`` hands out a new buffer and keeps none, and reuse is the
    pool's, as for any allocation."""
    __slots__ = ('_kept', '_firsts', '_lasts', '_empty', '_shapes', '_dtypes')

    def __init__(self, empty, shape, dtypes, shapes=None):
        """Buffers of ``shape`` and each of ``dtypes`` (or of ``shapes[k]`` and ``dtypes[k]``),
        made by ``empty(shape, dtype)``."""
        self._empty, self._dtypes = empty, tuple(dtypes)
        self._shapes = tuple(shapes) if shapes is not None else (shape,) * len(self._dtypes)
        # per output: the arena's buffers of its shape and dtype (_blocks), and the positions
        # there of the buffers it took in its last two calls, the one before the last tried
        # first: a steady step finds it free again at the same point of a later call (the same
        # values are alive there; an update that outlives the call alternates between two, so
        # the one before the last is the free one) without going through the buffers other
        # steps hold. Positions, not buffers: a reference would count as a holder.
        self._kept = [_blocks(empty, s, d) for s, d in zip(self._shapes, self._dtypes)]
        self._firsts = [0] * len(self._dtypes)
        self._lasts = [0] * len(self._dtypes)

    def __del__(self):
        for blocks in getattr(self, '_kept', ()):   # (none where __init__ failed)
            blocks.users -= 1

    def take(self, k):
        blocks = self._kept[k]
        try:
            first, last = self._firsts[k], self._lasts[k]
            buffer = blocks[first]
            # a buffer cut from a block it does not own (the emulated runtime's aligned arrays)
            # is free only when nothing else holds the block: NumPy points a view of the
            # buffer at the block, so the buffer's own count misses its views
            if _getrefcount(buffer) <= SOLE_HOLDER_REFCOUNT and (
                    buffer.base is None or _getrefcount(buffer.base) <= SOLE_BASE_REFCOUNT):
                self._firsts[k], self._lasts[k] = last, first
                return buffer
            buffer = blocks[last]
            if _getrefcount(buffer) <= SOLE_HOLDER_REFCOUNT and (
                    buffer.base is None or _getrefcount(buffer.base) <= SOLE_BASE_REFCOUNT):
                self._firsts[k] = last
                return buffer
        except IndexError:   # none yet, or the list dropped one (_new)
            pass
        buffer = None   # (a local reference would make it look held in _found)
        return self._found(k, blocks)

    def take_all(self):
        """A buffer for each output (``take(k)`` for every k), as a tuple: take's tests for each
        output in this one call (a fused step's up to 4 outputs: no call per output). Two
        outputs of one shape and dtype get two buffers: the first taken is held in ``taken``."""
        taken = []
        firsts, lasts = self._firsts, self._lasts
        for k, blocks in enumerate(self._kept):
            try:
                first, last = firsts[k], lasts[k]
                buffer = blocks[first]
                if _getrefcount(buffer) <= SOLE_HOLDER_REFCOUNT and (
                        buffer.base is None or _getrefcount(buffer.base) <= SOLE_BASE_REFCOUNT):
                    firsts[k], lasts[k] = last, first
                    taken.append(buffer)
                    continue
                buffer = blocks[last]
                if _getrefcount(buffer) <= SOLE_HOLDER_REFCOUNT and (
                        buffer.base is None or _getrefcount(buffer.base) <= SOLE_BASE_REFCOUNT):
                    firsts[k] = last
                    taken.append(buffer)
                    continue
            except IndexError:
                pass
            buffer = None   # (a local reference would make it look held in _found)
            taken.append(self._found(k, blocks))
        return tuple(taken)

    def _found(self, k, blocks):
        """Output ``k``'s buffer when the two it took last are held: the first free one among
        ``blocks`` (the oldest first; an index per buffer, not ``enumerate``, whose reused tuple
        would hold the buffer), else a new one."""
        for position in range(len(blocks)):
            buffer = blocks[position]
            if _getrefcount(buffer) <= SOLE_HOLDER_REFCOUNT and (
                    buffer.base is None or _getrefcount(buffer.base) <= SOLE_BASE_REFCOUNT):
                self._firsts[k], self._lasts[k] = self._lasts[k], position
                return buffer
        buffer = None   # (not held while the new one is made)
        return self._new(k)

    def _new(self, k):
        """A new buffer for output ``k``, put in the arena's blocks of its shape and dtype (while
        buffers are kept at all): they keep at most two per step output using them, the oldest
        dropped first when every one is held elsewhere (as a caller keeping each step's output)."""
        buffer = self._empty(self._shapes[k], self._dtypes[k])
        if _not_kept[0]:
            return buffer
        blocks = self._kept[k]
        if len(blocks) >= 2 * blocks.users:
            del blocks[0]
        blocks.append(buffer)
        self._firsts[k], self._lasts[k] = self._lasts[k], len(blocks) - 1
        return buffer


class _Blocks(list):
    """The arena's buffers of one (generation, thread, empty, shape, dtype), the oldest first: a
    list that lives as long as a StepBuffers using it (``users`` of them)."""
    __slots__ = ('users', '__weakref__')

    def __init__(self, *buffers):
        super().__init__(*buffers)
        self.users = 0


# The arena of plain launches: (generation, thread, empty, shape, dtype) -> _Blocks, held by
# the StepBuffers that use them (a new generation, forget_kept(), starts new ones; a runner made
# for other layouts lets go of its StepBuffers, and the lists no step uses go with them)
_ARENA = weakref.WeakValueDictionary()


def _blocks(empty, shape, dtype):
    """The arena's blocks for one output of a new StepBuffers: shared, except under
    GPUK_CHECK_LAUNCHES=1, where runners are made per call and so are their buffers."""
    if _forced[0]:
        blocks = _Blocks()
    else:
        key = (_generation[0], threading.get_ident(), empty, tuple(shape), np.dtype(dtype))
        blocks = _ARENA.get(key)
        if blocks is None:
            blocks = _ARENA[key] = _Blocks()
    blocks.users += 1
    return blocks


class Outputs:
    """The output arrays of one launcher problem (the same shapes and dtypes on every call):
    ``new()`` allocates them, as a plain call does; ``reused()`` is what a plan step's variant
    (a runner's ``specialized``) calls instead: ``take_all`` of a StepBuffers of its own (whose
    buffers are the arena's: ``_blocks``)."""
    __slots__ = ('_empty', 'shapes', 'dtypes')

    def __init__(self, empty, shapes, dtypes):
        self._empty, self.shapes, self.dtypes = empty, tuple(map(tuple, shapes)), tuple(dtypes)

    def new(self):
        return tuple(map(self._empty, self.shapes, self.dtypes))

    def reused(self):
        return StepBuffers(self._empty, None, self.dtypes, shapes=self.shapes).take_all


def with_step_buffers(run_with, outputs):
    """A launcher problem's runner, ``run_with(outputs.new)``, with a ``specialized`` variant for a
    plan step (Kept): ``run_with(outputs.reused())``, the launches writing into the step's reused
    buffers (StepBuffers). ``run_with(make_outputs)`` builds the run whose launches take their outputs
    from ``make_outputs()`` (a cuDNN call, where the family chooses it, makes its own)."""
    run = run_with(outputs.new)
    run.specialized = lambda arrays: run_with(outputs.reused())
    return run


def reordered(runner, order):
    """``run(*arrays)``: ``runner(*order(*arrays))``, a launcher's runner called by an op whose
    arrays come in another order (or with optional ones left out), keeping the runner's
    ``specialized`` variant (reordered alike): the op's Kept keeps the variant, not the plain run."""
    def run(*arrays):
        return runner(*order(*arrays))
    specialized = getattr(runner, 'specialized', None)
    if specialized is not None:
        run.specialized = lambda arrays: reordered(specialized(order(*arrays)), order)
    return run


def xp_step_runner(empty, compute):
    """The kept runner (for a ``Kept``) of an op computed with xp: ``run(*arrays)`` is
    ``compute(*arrays)``, and its ``specialized`` variant writes the result into the step's
    reused buffer, ``compute(*arrays, out=take(0))`` (StepBuffers made by ``empty``). ``compute``
    returns ``out`` only where it wrote its result there (a ufunc's or reduction's ``out=``) and
    its usual result otherwise (a view of an input, a cast ``out=`` cannot express). Its result's
    shape and dtype on the kept layouts are read from one plain call, and one call into a buffer
    must return that buffer, or the step keeps the plain run: so the variant gives the plain
    run's values, shape and dtype, written into reused memory (a 0-d array where NumPy's plain
    call returns a NumPy scalar, as CuPy's always does). (Those two extra calls run once per
    kept layouts, not per step; per call under GPUK_CHECK_LAUNCHES=1, which makes runners per call.)"""
    def run(*arrays):
        return compute(*arrays)

    def specialized(arrays):
        probe = compute(*arrays)
        if not hasattr(probe, 'dtype'):
            return run
        take = StepBuffers(empty, probe.shape, (probe.dtype,)).take
        first = take(0)
        if compute(*arrays, out=first) is not first:
            return run

        def run_into(*arrays):
            return compute(*arrays, out=take(0))
        return run_into
    run.specialized = specialized
    return run


def layout_constant_runner(compute):
    """The kept runner of an op whose result follows from its arrays' layouts alone (K.shape,
    K.size of a tensor: the shape is part of the layout): ``run(*arrays)`` is ``compute(*arrays)``,
    and its ``specialized`` variant computes it once for the kept layouts and returns that array
    on every call, like a constant the plan folded (no step writes its inputs): no allocation,
    and on a GPU no host-to-device copy per call (CuPy cannot set a device array from a host
    sequence in place)."""
    def run(*arrays):
        return compute(*arrays)

    def specialized(arrays):
        value = compute(*arrays)
        return lambda *arrays: value
    run.specialized = specialized
    return run


# StepBuffers keep no buffer while this is non-zero: 1 after an allocation failure or under
# GPUK_STEP_BUFFERS=0 (stop_keeping_buffers), plus 1 inside each graph capture (buffers_not_kept)
_not_kept = [int(os.environ.get('GPUK_STEP_BUFFERS', '1').strip() == '0')]
_stopped = [bool(_not_kept[0])]


def keeps_step_buffers():
    """Whether StepBuffers keep their buffers for the next call (see StepBuffers)."""
    return not _not_kept[0]


def stop_keeping_buffers():
    """StepBuffers keep no buffer from now on, for the rest of the process: called after an
    allocation failure (device.release_memory, which also drops the kept ones), where the pool's
    reuse of blocks between values never alive together is what lets a step fit."""
    if not _stopped[0]:
        _stopped[0] = True
        _not_kept[0] += 1


@contextlib.contextmanager
def buffers_not_kept():
    """StepBuffers keep no buffer inside this block (a graph capture: its warm-up and capture
    runs take their steps' outputs from the graph's private pool, which reuses a block once its
    value is dead, as it would for any allocation)."""
    _not_kept[0] += 1
    try:
        yield
    finally:
        _not_kept[0] -= 1


def _sole_holder_count():
    """What getrefcount says of an object that one container (a list, a dict) and the calling
    function's one local name hold, read from an arena list by index as ``StepBuffers.take`` and
    ``_found`` read it (``buffer = blocks[position]``): the container, the local,
    getrefcount's argument. Measured, not assumed, as the interpreter's counting of borrowed
    references differs between versions (3.14 counts fewer)."""
    kept = _Blocks([object()])
    position = 0
    buffer = kept[position]
    return _getrefcount(buffer)


SOLE_HOLDER_REFCOUNT = _sole_holder_count()


def _sole_base_count():
    """What getrefcount says of the block an array is cut from (its ``base``, read in the call)
    when that array alone holds it: the array's base reference and getrefcount's argument."""
    cut = np.empty(8, np.uint8)[:4]
    return _getrefcount(cut.base)


SOLE_BASE_REFCOUNT = _sole_base_count()


def kept_state():
    """What every kept runner's validity depends on besides its layouts: None under
    GPUK_CHECK_LAUNCHES=1 (none may be used), else the generation that ``clear()`` and
    ``forget_kept()`` move on. A plan's steps calling kept runners are valid while it stays
    the same (Plan.run)."""
    return None if _forced[0] else _generation[0]


def forget_kept():
    """Every Kept forgets its runner (and the step buffers that runner owns) without clearing
    the prepared problems: a Kept's next call makes its runner again from ``get``'s table."""
    _generation[0] += 1


_EVERY_KEPT = weakref.WeakSet()   # for release_kept (a Kept lives as long as its op)


def release_kept():
    """``forget_kept()``, and every Kept drops its runner at once rather than at its next call:
    the step buffers those runners own go back to the memory pool now (device.release_memory,
    after an allocation failure; a Kept not called again would hold them for good)."""
    forget_kept()
    while True:
        try:
            every = list(_EVERY_KEPT)
            break
        except RuntimeError:   # another thread made an op (a Kept) while the set was read: again
            continue
    for kept in every:
        kept._last = None


class _NotAnArray(Exception):
    pass


def _signature(value, array_type):
    """What the checks read of one argument: a runtime array's shape and dtype; of an absent
    one (None) or a host number (a NumPy scalar is also a NumPy-backed runtime's 0-d result)
    only its type. A value a check reads belongs in ``params``."""
    if type(value) is array_type:
        return value.shape, value.dtype
    if value is None or isinstance(value, (int, float, np.generic)):
        return type(value)
    raise _NotAnArray


class Launches:
    """The kernel launches of one prepared problem, made on first use and kept with it:
    ``launches(name, grid, block, args)`` launches kernel ``name`` of ``source`` built with
    ``defines``; the first call of each (name, grid, block, shared_mem) loads the kernel and
    checks the configuration (``rt.kernel_launch``), later ones go straight to the launch.
    A launcher's prepare() makes one per module its problem uses and returns it with the rest."""
    __slots__ = ('_rt', '_source', '_defines', '_arch', '_made', '_kept')

    def __init__(self, rt, source, defines, arch=None):
        self._rt, self._source, self._defines, self._arch = rt, source, dict(defines), arch
        self._made, self._kept = {}, {}

    def __call__(self, name, grid, block, args, shared_mem=0):
        key = (name, grid, block, shared_mem)
        try:
            launch = self._made[key]
        except KeyError:
            launch = self._made[key] = self._rt.kernel_launch(self._source, self._defines, name, grid, block,
                                                              shared_mem, arch=self._arch)
        except TypeError:   # a list for a grid: made for this call only
            launch = self._rt.kernel_launch(self._source, self._defines, name, grid, block, shared_mem,
                                            arch=self._arch)
        launch(args)

    def kernel(self, name):
        """The loaded kernel ``name`` (for what a launcher asks of it, like co-resident blocks)."""
        return self._rt.load(self._source, self._defines, self._arch).kernel(name)

    def kept(self, key, make):
        """``make()``, computed once per key for this problem (a value the launches derive from
        the problem alone, like a grid that asks the kernel for its occupancy). On the emulator
        such values follow its switches of the moment (GPUK_EMULATE_THREADS): computed per call."""
        if self._rt.kind != 'cuda':
            return make()
        try:
            return self._kept[key]
        except KeyError:
            value = self._kept[key] = make()
            return value
