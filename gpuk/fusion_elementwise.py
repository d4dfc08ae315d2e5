"""Plan-time fusion of elementwise chains into one step: the optimizers' update arithmetic
(Adam's m, v and parameter updates), activations, loss arithmetic, an LSTM/GRU cell's gates.

A step is fusable when its op has an element expression (``c_expression()``: UNARY_C /
BINARY_C in gpuk/ops/elementwise.py, Cast, Clip, the plain relu and its gradient in
gpuk/ops/activation.py). Walking the plan in order, a fusable step joins the group(s) of the
fusable steps producing its inputs, so a group is a connected piece of elementwise arithmetic
(chains, and trees whose shared values stay inside). A group runs as one FusedElementwise
step at the place of its last member; that is legal when no step outside the group, placed
before that point, reads a value of the group (it would read it before it is computed).
The group's outputs are its values read outside it or kept by the plan (targets, inputs);
every other intermediate disappears. Groups are capped at the kernel's 16 inputs and 4
outputs (gpuk/kernels/fused_elementwise.cu). Plans of the NumPy device have no kernel to fit
(``kernel_limits=False``): their groups take any inputs and outputs, join unconnected groups,
and hold slices and linear bias adds too (``fusable``): fewer plan steps per RNN time step.

The step computes with the elementwise family's ``fused``: on the CUDA and emulated runtimes
one generated kernel (the template .cu with the ops' expressions #define'd in, broadcasting
by per-input strides, each op in its dtype's compute type), on the NumPy device the ops'
own forwards one after the other (so CPU results are the unfused plan's, bit for bit). Shapes
and dtypes are only known per call: the program is built from the arrays' dtypes with the
ops' own ``infer`` (so dtype promotion is the ops'), and a call the kernel cannot take (int
values, outputs of different shapes) runs the ops one by one. Where kernels run the groups, a
step reading or writing a value whose static dtype the kernel does not take (an optimizer's
int64 iteration count, its cast to float) joins no group: it stays its own step (an xp op
writing into its step's reused buffer), so the float arithmetic around it still fuses into a
kernel instead of the whole group running op by op, allocating each result.
"""
import functools
from collections import defaultdict

import numpy as np

from gpuk.contracts.fused_program import (KERNEL_DTYPES, MAX_INPUTS, MAX_OUTPUTS, FusedProgram, Instruction,
                                          is_view_template, viewed_layout)
from gpuk.graph import Meta
from gpuk.kernels.runtime import prepared
from gpuk.ops.base import Op
from gpuk.ops.bias import BiasAct
from gpuk.ops.elementwise import Unary
from gpuk.ops.shape import Getitem

MAX_MEMBERS = 48   # ops per fused step: bounds the kernel's source and registers


class FusedElementwise(Op):
    """Elementwise ops run as one step: ``members`` are ``(op, args)`` with args numbering
    the step's inputs (0..n_inputs-1) and then the members' results; ``outputs`` the values
    returned. A plan-only op: it never appears in a graph, so it has no gradient."""
    foldable = False
    differentiable = False

    def __init__(self, members, n_inputs, outputs, input_views=()):
        self.members = tuple((op, tuple(args)) for op, args in members)
        self.n_inputs = n_inputs
        self.outputs = tuple(outputs)
        # per input None or a slice template the step reads it through (FusedProgram.input_views)
        self.input_views = tuple(input_views) if any(input_views) else ()
        # a member whose output shape is read from a value (a Getitem's run-time bounds, in a
        # NumPy-device group): so is the step's, and its plan's layouts need not repeat per run
        # (Op.shape_from_values, gpuk/function.py _layouts_repeat)
        if any(args[op.shape_from_values] for op, args in self.members):
            self.shape_from_values = slice(0, None)
        self._last = None   # (implementation, the program last built for it)
        self.kept = prepared.Kept()

    @property
    def name(self):
        return 'fused(%s)' % ', '.join(getattr(op, 'name', type(op).__name__) for op, _ in self.members)

    def __repr__(self):
        return 'FusedElementwise(%d ops: %s)' % (len(self.members), self.name)

    def program(self, impl, arrays):
        """The FusedProgram for these inputs' dtypes (the last one built is kept: a plan's step
        sees the same implementation and dtypes call after call)."""
        last = self._last
        if last is not None and last[0] is impl and last[1].takes(arrays):
            return last[1]
        views = self.input_views or (None,) * len(arrays)
        metas = [Meta(tuple(a.shape) if view is None else viewed_layout(tuple(a.shape), view)[0], a.dtype.name)
                 for a, view in zip(arrays, views)]
        instructions = []
        for op, args in self.members:
            meta = op.infer(*[metas[a] for a in args])
            metas.append(meta)
            operand_dtype = np.result_type(*[_dtype(metas[a].dtype) for a in args])
            instructions.append(Instruction(_expression(op), args, _dtype(meta.dtype), operand_dtype,
                                            _bound_forward(op, impl)))
        program = FusedProgram(tuple(_dtype(a.dtype) for a in arrays), tuple(instructions), self.outputs,
                               self.input_views)
        program = _interned(impl, program)
        self._last = (impl, program)   # its forwards are bound to impl
        return program

    def forward(self, impl, *arrays):
        # plan values are arrays or NumPy scalars (0-d NumPy results): both have dtype and shape.
        # The step keeps the runner of its last problem (checked and set up once: prepared.Kept),
        # which returns the step's result (the one output, or a tuple)
        return self.kept.run(impl, arrays, self._runner)

    def _runner(self, impl, *arrays):
        return impl.elementwise.fused_runner(self.program(impl, arrays), arrays)


_INTERNED = {}   # (impl, program) -> the first equal program built for that implementation


def _interned(impl, program):
    """One object per distinct program and implementation: the steps of a plan that compute the
    same thing (Adam's update of each weight, a bidirectional RNN's two directions) share it,
    so the launcher's tables keyed by it compare it by identity, not field by field. Equal
    programs compute the same: every instruction's element expression, operands and dtypes are
    equal (an instruction without an expression would compare equal on its evaluate callable
    alone, which the comparison leaves out: such programs are not shared)."""
    if any(i.expression is None for i in program.instructions):
        return program
    if len(_INTERNED) >= 4096:   # programs of plans long gone: start over
        _INTERNED.clear()
    return _INTERNED.setdefault((impl, program), program)


def _dtype(name):
    return np.dtype(name)


def _bound_forward(op, impl):
    """The op's forward on ``impl`` as one callable: its own ``bound_forward`` where it has
    one (fewer Python calls per op in the NumPy twin's loop), else forward with impl bound."""
    bind = getattr(op, 'bound_forward', None)
    return bind(impl) if bind is not None else functools.partial(op.forward, impl)


def _expression(op):
    """The op's C element expression, None when it has none (a NumPy-only member)."""
    expression = getattr(op, 'c_expression', None)
    return None if expression is None else expression()


def fusable(op, kernel_limits=True):
    """Whether ``op`` may join an elementwise group: it has an element expression, or the
    group runs on the NumPy device (no kernel limits) and ``op`` is a slice (Getitem) or a
    linear bias add. There the twin calls each member's forward in turn, so those two (a
    view, a broadcast add: between an RNN cell's GEMMs and its gate arithmetic) cost one
    call in the group instead of one plan step each."""
    if _expression(op) is not None:
        return True
    return not kernel_limits and (type(op) is Getitem or (type(op) is BiasAct and op.activation == 'linear'))


def _same_shapes(shapes):
    """Whether static shapes (None: unknown, a None dim: known only at run time) may be one."""
    known = [s for s in shapes if s is not None]
    return all(len(s) == len(known[0]) and all(a is None or b is None or a == b for a, b in zip(s, known[0]))
               for s in known)


def fuse_elementwise(steps, protected, slot_shapes=None, kernel_limits=True, slot_dtypes=None):
    """The steps ``(op, input_slots, output_slots)`` with their elementwise groups fused.
    With ``slot_shapes`` (slot -> static shape), a group's outputs all have one shape (the
    kernel writes every output at every index): a scalar computed once for many readers,
    like an optimizer's step size, stays its own group instead of joining a consumer's.
    ``kernel_limits``: groups keep to what one generated kernel takes (inputs, outputs, one
    output shape). Without them (the NumPy device, whose twin runs the ops one by one and
    takes any number and shape of values) groups are bounded only by MAX_MEMBERS: fewer,
    larger steps, each one plan dispatch (an LSTM's backward cell: 7 steps become 1). With
    ``slot_dtypes`` (slot -> static dtype) and kernel limits, a step with a value of a dtype the
    kernel does not take stays out of every group (see the module docstring)."""
    slot_shapes = slot_shapes or {}
    kernel_dtypes = {}
    if kernel_limits and slot_dtypes:
        kernel_dtypes = {s: np.dtype(d) in KERNEL_DTYPES for s, d in slot_dtypes.items()}
    producer = {s: i for i, (_, _, outs) in enumerate(steps) for s in outs}
    readers = defaultdict(list)
    for i, (_, ins, _) in enumerate(steps):
        for s in ins:
            readers[s].append(i)
    group_of, groups = {}, {}

    def io(members):
        """(inputs, outputs) slots of a group: read from outside / seen outside."""
        inside = set(members)
        produced = {s for m in members for s in steps[m][2]}
        inputs = list(dict.fromkeys(s for m in members for s in steps[m][1] if s not in produced))
        outputs = [s for m in members for s in steps[m][2]
                   if s in protected or any(r not in inside for r in readers[s])]
        return inputs, outputs

    def legal(members, last):
        inside = set(members)
        for m in members:
            for s in steps[m][2]:
                if any(r not in inside and r < last for r in readers[s]):
                    return False
        if len(members) > MAX_MEMBERS:
            return False
        if not kernel_limits:
            return True
        inputs, outputs = io(members)
        return (len(inputs) <= MAX_INPUTS and len(outputs) <= MAX_OUTPUTS
                and _same_shapes([slot_shapes.get(s) for s in outputs]))

    for i, (op, ins, outs) in enumerate(steps):
        if len(outs) != 1 or not fusable(op, kernel_limits) or not all(kernel_dtypes.get(s, True) for s in ins + outs):
            continue
        candidates = list(dict.fromkeys(group_of[producer[s]] for s in ins
                                        if producer.get(s) in group_of))
        # joins each producing group that it can take along (greedily, in input order)
        members = [i]
        for g in candidates:
            merged = sorted(set(members) | set(groups[g]))
            if legal(merged, i):
                del groups[g]
                members = merged
        groups[i] = members
        for m in members:
            group_of[m] = i
    if not kernel_limits:
        # no kernel to fit: a group also joins the next one when that is legal, connected or
        # not (the LSTM backward step's two lone multiplies, state gradients no other step reads)
        order = sorted(groups)
        for first, then in zip(order, order[1:]):
            merged = sorted(set(groups[first]) | set(groups[then]))
            if legal(merged, then):
                groups[then] = merged
                del groups[first]

    fused_at, removed = {}, set()
    for last, members in groups.items():
        if len(members) < 2:
            continue
        inputs, outputs = io(members)
        member_steps = [steps[m] for m in members]
        if not kernel_limits:
            member_steps = one_unary_per_span(member_steps, set(outputs), slot_shapes)
        number = {s: k for k, s in enumerate(inputs)}
        fused_members = []
        for op, ins, outs in member_steps:
            fused_members.append((op, [number[s] for s in ins]))
            number[outs[0]] = len(number)
        views = [None] * len(inputs)
        if kernel_limits:   # gate slices read in place by the kernel, not copied per call
            inputs, views, folded = _fold_slices(steps, producer, readers, protected, set(members), inputs)
            removed.update(folded)
        op = FusedElementwise(fused_members, len(inputs), [number[s] for s in outputs], views)
        fused_at[last] = (op, inputs, outputs)
        removed.update(members)
    return [fused_at.get(i, step) for i, step in enumerate(steps) if i not in removed or i in fused_at]


def _fold_slices(steps, producer, readers, protected, members, inputs):
    """(inputs, views, folded steps) of a kernel group whose inputs include static slices
    (Getitem steps with slice templates, read by this group alone: a GRU's or LSTM's gates
    sliced off its matrix products): each such input becomes the sliced tensor read through
    the slice (FusedProgram.input_views: the kernel reads it in place at the view's strides
    and offset, where the launcher would otherwise copy every non-contiguous input per call),
    and its Getitem step goes. A tensor read through several views is several inputs."""
    views, folded, new_inputs = [], [], []
    for s in inputs:
        i = producer.get(s)
        step = steps[i] if i is not None else None
        if (step is not None and type(step[0]) is Getitem and len(step[1]) == 1 and s not in protected
                and is_view_template(step[0].template) and all(r in members for r in readers[s])):
            new_inputs.append(step[1][0])
            views.append(step[0].template)
            folded.append(i)
        else:
            new_inputs.append(s)
            views.append(None)
    return new_inputs, views, folded


# The unaries computed on a span: on elements nobody asked for too, so only those defined,
# finite and silent on every float (no invalid-value or overflow warning, nothing raised under
# np.seterr(all='raise'): sigmoid's exp overflows inside its own errstate).
_SILENT_UNARIES = ('sigmoid', 'tanh')


def one_unary_per_span(members, kept, slot_shapes):
    """A NumPy group's ``members`` (``(op, input_slots, output_slots)`` in order) with each
    family of one unary op applied to slices of one value along one axis (an LSTM's sigmoid
    on its i, f and o gates, sliced off the gates' pre-activations) computed once, on the
    slice spanning the family, each member's result a view of that. On (32, 128) arrays a
    ufunc call costs about what its arithmetic does, and a sigmoid is four of them plus an
    ``np.errstate``: three sigmoids on (32, 128) take 22 µs, one on (32, 512) 16 µs. Only
    where the span is at most 4/3 of the family's slices (the LSTM's: 512 columns for 384,
    the tanh gate's computed for nothing). The values are the same, bit for bit: each element
    goes through the same ufuncs as in its own slice. Only sigmoid and tanh (_SILENT_UNARIES:
    the extra elements must not warn or raise). Slices (Getitem members) that no member
    reads any more, and that the group does not return (``kept``), are dropped. New internal
    values are named by tuples, never by a plan slot (ints)."""
    producer = {outs[0]: k for k, (_, _, outs) in enumerate(members)}
    families = defaultdict(list)
    for k, (op, ins, _) in enumerate(members):
        source = producer.get(ins[0]) if type(op) is Unary and op.name in _SILENT_UNARIES else None
        if source is None or type(members[source][0]) is not Getitem or len(members[source][1]) != 1:
            continue
        template, sliced = members[source][0].template, members[source][1][0]
        interval = _axis_interval(template, slot_shapes.get(sliced))
        if interval is not None:
            axis, start, stop = interval
            families[(op.name, sliced, axis, len(template))].append((k, start, stop))
    replaced, inserted = {}, {}
    for (name, sliced, axis, rank), family in families.items():
        low, high = min(f[1] for f in family), max(f[2] for f in family)
        if len(family) < 2 or 3 * (high - low) > 4 * sum(stop - start for _, start, stop in family):
            continue
        span, values = ('span', sliced, name, axis, low), ('unary', sliced, name, axis, low)
        template = tuple(slice(low, high) if d == axis else slice(None) for d in range(rank))
        inserted[family[0][0]] = [(Getitem(template), [sliced], [span]), (Unary(name), [span], [values])]
        for k, start, stop in family:
            view = tuple(slice(start - low, stop - low) if d == axis else slice(None) for d in range(rank))
            replaced[k] = (Getitem(view), [values], members[k][2])
    if not replaced:
        return members
    rewritten = []
    for k, step in enumerate(members):
        rewritten.extend(inserted.get(k, ()))
        rewritten.append(replaced.get(k, step))
    read = {s for _, ins, _ in rewritten for s in ins}
    return [step for step in rewritten
            if not (type(step[0]) is Getitem and step[2][0] not in read and step[2][0] not in kept)]


def _axis_interval(template, shape):
    """(axis, start, stop) of a static slice template selecting a range of one axis and all
    of every other (``shape``: the sliced value's static shape, for an open stop), else None."""
    if shape is None or len(template) != len(shape) or not all(type(k) is slice for k in template):
        return None
    partial = [d for d, k in enumerate(template) if k != slice(None)]
    if len(partial) != 1:
        return None
    axis = partial[0]
    key, dim = template[axis], shape[axis]
    start = 0 if key.start is None else key.start
    stop = dim if key.stop is None else key.stop
    if (key.step not in (None, 1) or type(start) is not int or type(stop) is not int or dim is None
            or not 0 <= start < stop <= dim):
        return None
    return axis, start, stop
