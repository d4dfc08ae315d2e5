"""Plan-time simplification of gradient plumbing: the steps autodiff adds to route
gradients (to a broadcast input, to the parts of a sliced tensor) where the plan's static
shapes show they are not needed or can be one step.

Identity broadcasts (``identity_sources``, ``drop_identity_broadcasts``): the gradient of a
broadcasting op sums it back to each input's shape with SumToShapeOf(g, like), and broadcasts
with BroadcastLike(x, like); when both shapes are fully known at plan time and equal (a Scan's
step plan is compiled for the shapes it runs with, gpuk/ops/scan.py), the step is the
identity: its readers read g (or x) instead, and elementwise chains around it can fuse. A
plan target computed by one is the source's slot (the Plan renames its target slots first),
so a Scan's step plan returns one slot for a new state or output and the gradient it equals
(and the Scan stacks that value once).

Slice gradients (``merge_slice_gradients``): slicing one tensor into parts (an LSTM's or
GRU's gate pre-activations ``z[:, :units]``, ``z[:, units:2 * units]``, ...) has as gradient
one ScatterSlice per part (zeros of z's shape with the part's gradient written in) and the
sum of those: per part a zero-filled buffer of the whole tensor's size, and one add per
part. When the slices are static and disjoint, the sum is one buffer with each gradient
written at its slice: ScatterSlices (gpuk/ops/shape.py). The pass rewrites ``add(a, b)``
where a and b are each a ScatterSlice (no dynamic index) or an already merged ScatterSlices
of the same ``like`` slot, with disjoint keys, and each has that add as its only reader (and
is not a plan target): the add's step becomes the merged ScatterSlices (all its inputs were
computed before the add), the two scatters go away. Chains ``add(add(s1, s2), s3)`` merge
step by step.
"""
from collections import Counter

from gpuk.ops.elementwise import Binary, BroadcastLike, SumToShapeOf
from gpuk.ops.shape import ScatterSlice, ScatterSlices


def identity_sources(steps, slot_shapes):
    """{output slot: source slot} of the steps that are a SumToShapeOf / BroadcastLike between
    equal, fully known shapes (``slot_shapes``: slot -> static shape); a chain of them maps to
    the first source."""
    sources = {}
    for op, ins, outs in steps:
        if type(op) in (SumToShapeOf, BroadcastLike):
            shape, like = slot_shapes.get(ins[0]), slot_shapes.get(ins[1])
            if shape is not None and shape == like and None not in shape:
                sources[outs[0]] = sources.get(ins[0], ins[0])
    return sources


def drop_identity_broadcasts(steps, protected, slot_shapes):
    """The steps without the identity broadcasts (identity_sources) whose output is not
    ``protected``; their readers read the source instead. A broadcast's ``like`` is read
    for its shape alone: a pure step computing one for nothing else (an LSTM gradient's
    product of two gates, the like of the add's gradient) goes too (_drop_unread), or the
    step plan would compute it per time step for no reader."""
    rename = {s: source for s, source in identity_sources(steps, slot_shapes).items() if s not in protected}
    if not rename:
        return steps
    kept = [(op, [rename.get(s, s) for s in ins], outs) for op, ins, outs in steps if outs[0] not in rename]
    likes = {ins[1] for op, ins, outs in steps if outs[0] in rename}
    return _drop_unread(kept, protected, likes)


def _drop_unread(steps, protected, candidates):
    """``steps`` without the pure (foldable) steps whose outputs no step reads and that are
    not ``protected``, starting from the producers of ``candidates`` and following their
    inputs (a step whose only reader went may go next). Steps that were unread before the
    rewrite are not touched (a plan holds none: it is built from its targets)."""
    readers = Counter(s for _, ins, _ in steps for s in ins)
    producer = {s: i for i, (_, _, outs) in enumerate(steps) for s in outs}
    removed, pending = set(), [s for s in candidates if s in producer]
    while pending:
        i = producer[pending.pop()]
        op, ins, outs = steps[i]
        if (i in removed or not op.foldable or any(readers[s] or s in protected for s in outs)):
            continue
        removed.add(i)
        for s in ins:
            readers[s] -= 1
            if s in producer:
                pending.append(s)
    return [step for i, step in enumerate(steps) if i not in removed]


def merge_slice_gradients(steps, protected):
    """The steps with each add of disjoint-slice scatters merged (see the module docstring)."""
    steps = list(steps)
    readers = Counter(s for _, ins, _ in steps for s in ins)
    producer = {s: i for i, (_, _, outs) in enumerate(steps) for s in outs}
    removed = set()
    for i, (op, ins, outs) in enumerate(steps):
        if type(op) is not Binary or op.name != 'add' or len(set(ins)) != 2:
            continue
        parts = [_scatters(steps, producer, readers, protected, s) for s in ins]
        if None in parts or parts[0][2] != parts[1][2]:
            continue
        templates = parts[0][0] + parts[1][0]
        if not _disjoint(templates):
            continue
        steps[i] = (ScatterSlices(templates), parts[0][1] + parts[1][1] + [parts[0][2]], outs)
        removed.update(producer[s] for s in ins)
    return [step for i, step in enumerate(steps) if i not in removed]


def _scatters(steps, producer, readers, protected, slot):
    """(templates, gradient slots, like slot) of the scatter writing ``slot`` when the merge
    may remove it, else None."""
    if slot in protected or readers[slot] != 1 or slot not in producer:
        return None
    op, ins, _ = steps[producer[slot]]
    if type(op) is ScatterSlice and len(ins) == 2:   # no dynamic index
        return [op.template], [ins[0]], ins[1]
    if type(op) is ScatterSlices:
        return list(op.templates), list(ins[:-1]), ins[-1]
    return None


def _interval(key):
    """(start, stop) of a static slice with step 1 and non-negative bounds, else None."""
    if not isinstance(key, slice) or key.step not in (None, 1):
        return None
    start = 0 if key.start is None else key.start
    stop = float('inf') if key.stop is None else key.stop
    if not isinstance(start, int) or not (stop == float('inf') or isinstance(stop, int)) or start < 0 or stop < 0:
        return None
    return start, stop


def _disjoint(templates):
    """Whether the keys select disjoint parts: equal everywhere but one axis, where each is a
    static slice not overlapping any other."""
    if len({len(t) for t in templates}) != 1:
        return False
    differing = [axis for axis in range(len(templates[0])) if len({repr(t[axis]) for t in templates}) > 1]
    if len(differing) != 1 or any(k is not None and not isinstance(k, slice) for k in templates[0]):
        return False
    intervals = [_interval(t[differing[0]]) for t in templates]
    if None in intervals:
        return False
    intervals.sort()
    return all(stop <= next_start for (_, stop), (next_start, _) in zip(intervals, intervals[1:]))
