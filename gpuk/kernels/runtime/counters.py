"""Host-side counters of a training step: launches, time inside device calls, syncs, allocations.

    with counters.counting() as c:
        train_step()
    c.launches, c.device_s, c.host_syncs, c.allocations

What is counted, and where (the runtime boundary, so every implementation is measured alike):

- ``launches``: calls into the device through gpuk: CudaKernel.launch (a gpuk kernel) and
  cuBLAS GEMMs (gpuk/kernels/matmul.py); CuPy's own elementwise kernels (ops computed with
  ``xp``) are not seen here.
- ``device_s``: seconds spent *inside* those calls (the RawKernel call, the cuBLAS call). On a
  GPU that is the driver's enqueue time; in the GPU rehearsal it is the emulator's run time,
  which is not host overhead, so ``wall - device_s`` is what gpuk's Python (and the array
  library's, for ops computed with ``xp``) costs around the launches.
- ``host_syncs``: device-to-host copies that wait for the stream, made through
  ``runtime.to_host`` or ``device.to_host`` (the step's final output copies included; the
  Plan reports its own in-step figure separately, ``in_step_syncs``).
- ``allocations``: outputs of a plan's steps in memory no earlier counted step saw
  (``new_buffers``, called by Plan.run: a step's reused buffers are not new; NumPy scalar
  results are, as CuPy's 0-d arrays would be). Where a real CuPy reports them (a MemoryHook): ``pool_mallocs``, every request
  to the memory pool (each new array, served from the pool's cache or not), and
  ``device_allocs``, the pool's own device allocations (cudaMalloc: a request its cache
  could not serve). A steady-state step of a plan has 0 of these (docs/architecture.md,
  "memory plan").

Counting costs two perf_counter calls per launch and is off unless ``counting()`` is active.
"""
import contextlib
import sys
import weakref
from time import perf_counter

import numpy as np


class Counters:
    def __init__(self, count_calls=False):
        self.launches = 0
        self.device_s = 0.0
        self.host_syncs = 0
        self.in_step_syncs = 0
        self.allocations = 0
        self.pool_mallocs = None     # set where a real CuPy memory hook counted them
        self.device_allocs = None    # likewise: the pool's cudaMalloc calls
        self.graph_replays = 0
        self.replayed_launches = 0   # gpuk launches the replayed graphs hold (each graph launch counts 1)
        self.replayed_xp_steps = 0   # and their steps computed with xp (at least one CuPy kernel each)
        # Plan steps, each timed exclusively of the plan steps nested in it (a scan's step plan):
        self.launching_steps = 0     # steps that launched something through gpuk
        self.launching_host_s = 0.0  # their time outside the device calls: gpuk's Python per launch
        self.launching_launches = 0
        self.xp_steps = 0            # steps that launched nothing of gpuk's (ops computed with xp)
        self.xp_steps_s = 0.0        # on a GPU CuPy's host time; in the rehearsal NumPy's compute
        self._recorded = [0.0, 0, 0.0]   # exclusive time, launches, device time recorded so far
        # count_calls: Python function calls (Python and C, sys.setprofile) inside the calls (an
        # op's forward, or the kept runner a plan calls in its place) of the outermost plan steps
        # that launch, device calls left out: a load-free measure of the Python per launch (a
        # scan's step plans count in the scan). It slows the step: a separate step from the
        # timed ones.
        self.count_calls = count_calls
        self.launching_calls = 0      # those calls
        self.counted_launches = 0     # the launches of the steps they were counted in
        self._calls = [0, 0]          # calls seen, depth inside device calls and the bookkeeping

    def as_dict(self):
        return {k: v for k, v in vars(self).items() if not k.startswith('_')}

    def step(self, call, args, count_allocations=None):
        """call(*args), one plan step, timed and attributed (see the fields above);
        ``count_allocations(result)``, when given, adds the step's new buffers to
        ``allocations``. The bookkeeping before and after the call is counting overhead:
        recorded as time the enclosing step (a scan around a step plan) leaves out, like a
        nested step's, and left out of count_calls' count."""
        entered = perf_counter()
        depth = self._calls
        depth[1] += 1
        recorded = self._recorded
        r0, r1, r2 = recorded
        l0, d0 = self.launches, self.device_s
        calls = self.count_calls and sys.getprofile() is None   # the outermost step counts
        depth[1] -= 1
        t0 = perf_counter()
        result = self._profiled(call, args) if calls else call(*args)
        t1 = perf_counter()
        depth[1] += 1
        if calls and self.launches != l0:
            self.counted_launches += self.launches - l0
        own_s = t1 - t0 - (recorded[0] - r0)
        own_launches = self.launches - l0 - (recorded[1] - r1)
        own_device = self.device_s - d0 - (recorded[2] - r2)
        recorded[1] += own_launches
        recorded[2] += own_device
        if own_launches:
            self.launching_steps += 1
            self.launching_launches += own_launches
            self.launching_host_s += own_s - own_device
        else:
            self.xp_steps += 1
            self.xp_steps_s += own_s
        if count_allocations is not None:
            self.allocations += count_allocations(result)
        depth[1] -= 1
        recorded[0] += own_s + (t0 - entered) + (perf_counter() - t1)
        return result

    def _profiled(self, call, args):
        """call(*args) with its Python calls counted (see count_calls)."""
        seen = self._calls
        before = seen[0]

        def profile(frame, event, arg):
            if (event == 'call' or event == 'c_call') and not seen[1]:
                seen[0] += 1
        sys.setprofile(profile)
        launches = self.launches
        try:
            return call(*args)
        finally:
            sys.setprofile(None)
            if self.launches != launches:
                self.launching_calls += seen[0] - before


_active = []   # the Counters of the innermost counting() block, if any


def active():
    """The Counters being filled now, or None (the fast path: nothing is counted)."""
    return _active[-1] if _active else None


@contextlib.contextmanager
def counting(count_calls=False):
    """Count launches, device time, syncs and allocations of the code in the block (and with
    ``count_calls`` the Python calls of its launching plan steps, see Counters)."""
    counters = Counters(count_calls)
    _active.append(counters)
    hook = _pool_hook(counters)
    try:
        if hook is not None:
            with hook:
                yield counters
        else:
            yield counters
    finally:
        _active.remove(counters)


def _pool_hook(counters):
    """A CuPy MemoryHook counting pool mallocs, on a real CuPy only (the GPU rehearsal's
    stand-in has no memory pool)."""
    import sys
    cupy = sys.modules.get('cupy')
    hook_class = getattr(getattr(cupy, 'cuda', None), 'MemoryHook', None)
    if cupy is None or getattr(cupy, 'STANDIN', False) or hook_class is None:
        return None

    class PoolMallocs(hook_class):
        name = 'gpuk-step-counter'

        def malloc_preprocess(self, device_id, size, mem_size):
            counters.pool_mallocs = (counters.pool_mallocs or 0) + 1

        def alloc_preprocess(self, device_id, mem_size):
            counters.device_allocs = (counters.device_allocs or 0) + 1

    counters.pool_mallocs = counters.device_allocs = 0
    return PoolMallocs()


def device_call(call, *args, **kwargs):
    """``call(*args, **kwargs)``, a launch into the device: counted, and timed while counting
    (the bookkeeping sits outside the timed window as little as it can: it is counted as the
    host time of the step around the launch)."""
    if not _active:
        return call(*args, **kwargs)
    counters = _active[-1]
    depth = counters._calls
    depth[1] += 1   # a profiled step leaves the device call out of its count
    started = perf_counter()
    try:
        return call(*args, **kwargs)
    finally:
        counters.device_s += perf_counter() - started
        depth[1] -= 1
        counters.launches += 1


# Every buffer a counted plan step returned or read: id -> a weak reference to the array owning
# the memory (no reference keeps a buffer alive or changes what prepared.StepBuffers sees, and
# no callback runs when one dies: that would be counting's work inside the steps it times;
# dead entries are dropped when there are many)
_known_buffers = {}
_KNOWN_LIMIT = 1 << 16


def new_buffers(outputs, inputs):
    """How many of a plan step's ``outputs`` are memory the step allocated, as a CuPy run would
    request it from its pool: an array (or a view of one) whose memory no array known before
    the step owns (the step's inputs, and what earlier counted steps returned or read: a buffer
    a step reuses from one call to the next, prepared.StepBuffers, is known), and each NumPy
    scalar (the rehearsal's 0-d results, 0-d device arrays on CuPy). Memory a step allocates
    and frees inside itself is not seen here (on a GPU ``pool_mallocs`` counts it)."""
    known = _known_buffers
    for a in inputs:
        root = _owner(a)
        if root is not None:
            _remember(known, root)
    count = 0
    for value in outputs:
        if isinstance(value, np.generic):
            count += 1
            continue
        root = _owner(value)
        if root is None:
            continue
        seen = known.get(id(root))
        if seen is None or seen() is not root:
            count += 1
            _remember(known, root)
    return count


def allocated(count=1):
    """Records ``count`` arrays a step allocated for its own use (a launcher's contiguous copy
    of a strided input), which ``new_buffers`` does not see among its outputs."""
    if _active:
        _active[-1].allocations += count


def _owner(value):
    """The array owning ``value``'s memory (itself, or the base of a view); None for a value
    that is not an array."""
    if not hasattr(value, 'shape') or isinstance(value, np.generic):
        return None
    while getattr(value, 'base', None) is not None and hasattr(value.base, 'shape'):
        value = value.base
    return value


def _remember(known, root):
    try:
        known[id(root)] = weakref.ref(root)
    except TypeError:   # an array type without weak references: counted as new each time
        return
    if len(known) > _KNOWN_LIMIT:
        for key in [key for key, ref in known.items() if ref() is None]:
            del known[key]


_total_host_syncs = [0]


def total_host_syncs():
    """Every device-to-host sync recorded since import, counting or not (cuda_graph reads it
    to tell whether a step can be captured)."""
    return _total_host_syncs[0]


def host_sync():
    """Record one device-to-host copy that waits for the stream."""
    _total_host_syncs[0] += 1
    counters = active()
    if counters is not None:
        counters.host_syncs += 1
