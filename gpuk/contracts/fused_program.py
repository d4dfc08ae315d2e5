"""The program a fused elementwise step hands to its implementation (the NumPy twin or the
generated kernel): what both agree on, built by gpuk/fusion_elementwise.py.

Values are numbered: the inputs first (0 .. n_inputs-1), then one per instruction, in order.
An instruction is one op of the fused chain: its C element expression (a template over the
operands ``{0}``, ``{1}`` and their compute type ``{T}``), the values it reads, its result
dtype, the dtype its operands are promoted to (NumPy's result_type of theirs: the result's,
except for comparisons and where's bool condition), and ``evaluate(*arrays)``, the op's own forward (the twin's path, and the kernel launcher's
when a call cannot take the kernel). ``outputs`` are the values the step returns. ``input_views``, when given, holds per input
None or a static slice template (a tuple of slices) applied to that input before the ops
read it: a gate slice of a matrix product folded into the step (the kernel reads it in
place at its strides and offset; the twin slices a view).
"""
from dataclasses import dataclass, field
from typing import Callable, Optional, Tuple

import numpy as np

KERNEL_DTYPES = (np.dtype(np.bool_), np.dtype(np.float16), np.dtype(np.float32), np.dtype(np.float64))
MAX_INPUTS, MAX_OUTPUTS, MAX_RANK = 16, 4, 8   # fused_elementwise.cu's FUSED_MAX_*


@dataclass(frozen=True)
class Instruction:
    expression: Optional[str]        # None: no element expression (the step runs unfused)
    args: Tuple[int, ...]
    dtype: np.dtype
    operand_dtype: np.dtype
    evaluate: Callable = field(compare=False)


@dataclass(frozen=True)
class FusedProgram:
    input_dtypes: Tuple[np.dtype, ...]
    instructions: Tuple[Instruction, ...]
    outputs: Tuple[int, ...]
    input_views: Tuple[Optional[tuple], ...] = ()   # per input: None or a slice template (see above)

    def __post_init__(self):
        _check_input_views(self.input_views, len(self.input_dtypes))
        # Both kept, computed once: a program keys the launcher's kernel and prepared-problem
        # tables on every call (hashing an optimizer update's instructions costs tens of µs),
        # and run_unfused's loop is flattened to (evaluate, first arg, second arg or -1, all
        # args when more than two) per instruction (no attribute reads per op and call).
        views = tuple(None if v is None else tuple((k.start, k.stop, k.step) for k in v) for v in self.input_views)
        object.__setattr__(self, '_hash', hash((self.input_dtypes, self.instructions, self.outputs, views)))
        # each intermediate is dropped after its last read (unless returned): a long group
        # then reuses a few hot buffers, as the unfused plan's frees do, instead of keeping
        # every intermediate alive to the end (measured: a 25-op LSTM backward cell 10% slower)
        last_read = {a: k for k, i in enumerate(self.instructions) for a in i.args}
        n_inputs, kept = len(self.input_dtypes), set(self.outputs)
        dead_after = [[] for _ in self.instructions]
        for value, k in last_read.items():
            if value >= n_inputs and value not in kept:
                dead_after[k].append(value)
        code = tuple((i.evaluate, i.args[0] if i.args else 0, i.args[1] if len(i.args) == 2 else -1,
                      i.args if len(i.args) not in (1, 2) else None, tuple(dead))
                     for i, dead in zip(self.instructions, dead_after))
        object.__setattr__(self, '_code', code)
        object.__setattr__(self, '_views', tuple(enumerate(self.input_views)) if any(self.input_views) else ())

    def __hash__(self):
        return self._hash

    @property
    def n_inputs(self):
        return len(self.input_dtypes)

    def dtype(self, value):
        if value < self.n_inputs:
            return self.input_dtypes[value]
        return self.instructions[value - self.n_inputs].dtype

    def takes(self, inputs):
        """Whether ``inputs`` are as many as the program's, of its input dtypes (one tuple
        comparison: it runs per call of a fused step)."""
        try:
            return tuple([a.dtype for a in inputs]) == self.input_dtypes
        except AttributeError:   # not an array
            return False

    def kernel_ready(self):
        """Whether the generated kernel can run this program: every value a bool or a
        float16/32/64 (int arithmetic stays with the ops), every op with an expression, the
        inputs and outputs within the kernel's pointer slots."""
        values = range(self.n_inputs + len(self.instructions))
        return (all(self.dtype(v) in KERNEL_DTYPES for v in values)
                and all(i.expression is not None for i in self.instructions)
                and 1 <= self.n_inputs <= MAX_INPUTS and 1 <= len(self.outputs) <= MAX_OUTPUTS)

    def input_dependencies(self):
        """For each output, the inputs it depends on (its shape is their broadcast shape)."""
        deps = [frozenset([v]) for v in range(self.n_inputs)]
        for instruction in self.instructions:
            deps.append(frozenset().union(*(deps[a] for a in instruction.args)))
        return [deps[v] for v in self.outputs]

    def step_result(self, outputs):
        """``outputs`` (one per program output) as a plan step returns them, and so a fused
        runner: the one output itself, or a tuple of them."""
        return outputs[0] if len(outputs) == 1 else tuple(outputs)

    def output_list(self, result):
        """A runner's ``result`` (step_result) as the list ``fused()`` returns."""
        return [result] if len(self.outputs) == 1 else list(result)

    def run_unfused(self, inputs):
        """The outputs computed op by op with each op's own forward (a tight loop: on the
        NumPy device it runs per step, and its overhead is what fusing there costs)."""
        values = list(inputs)
        for k, view in self._views:
            if view is not None:
                values[k] = values[k][view]
        append = values.append
        for evaluate, first, second, args, dead in self._code:
            if args is not None:
                append(evaluate(*[values[a] for a in args]))
            elif second < 0:
                append(evaluate(values[first]))
            else:
                append(evaluate(values[first], values[second]))
            for v in dead:
                values[v] = None
        return [values[v] for v in self.outputs]


def viewed_layout(shape, template):
    """(shape, element strides, element offset) of ``template`` (a tuple of slices, as in
    FusedProgram.input_views) applied to a C-contiguous array of ``shape``."""
    strides, step = [], 1
    for dim in reversed(shape):
        strides.append(step)
        step *= dim
    strides.reverse()
    out_shape, out_strides, offset = [], [], 0
    for d, dim in enumerate(shape):
        key = template[d] if d < len(template) else slice(None)
        start, stop, stride = key.indices(dim)
        out_shape.append(len(range(start, stop, stride)))
        out_strides.append(strides[d] * stride)
        offset += start * strides[d]
    return tuple(out_shape), tuple(out_strides), offset


def is_view_template(template, rank=None):
    """Whether ``template`` (a Getitem's) can be an input view: static slices only, with
    forward steps, at most one per dim of a ``rank``-dim input."""
    return (isinstance(template, tuple) and all(type(k) is slice for k in template)
            and all(v is None or type(v) is int for k in template for v in (k.start, k.stop, k.step))
            and all(k.step is None or k.step > 0 for k in template)
            and (rank is None or len(template) <= rank))


def _check_input_views(views, n_inputs):
    if views and len(views) != n_inputs:
        raise ValueError(f"FusedProgram: input_views must hold one entry per input ({n_inputs}), got {len(views)}")
    for k, view in enumerate(views):
        if view is not None and not is_view_template(view):
            raise ValueError(f"FusedProgram: input_views[{k}] must be None or a tuple of slices with int (or "
                             f"None) bounds and positive steps, got {view!r}")


def check_fused_args(program, inputs, fn='fused'):
    """The arguments of ``fused(program, inputs)``: a FusedProgram, its inputs' dtypes, and
    inputs with the dims their views slice (the kernel would skip a slice the twin refuses)."""
    if type(program) is FusedProgram and program.takes(inputs) and not program.input_views:
        return   # the common case, checked without building messages (it runs per step)
    if not isinstance(program, FusedProgram):
        raise TypeError(f"{fn}: program must be a FusedProgram, got {type(program).__name__}")
    if len(inputs) != program.n_inputs:
        raise ValueError(f"{fn}: the program takes {program.n_inputs} inputs, got {len(inputs)}")
    for k, (a, dtype) in enumerate(zip(inputs, program.input_dtypes)):
        if np.dtype(getattr(a, 'dtype', type(a))) != dtype:
            raise TypeError(f"{fn}: input {k} must have dtype {dtype} (the program was built for it), "
                            f"got {getattr(a, 'dtype', type(a).__name__)}")
    for k, (a, view) in enumerate(zip(inputs, program.input_views)):
        if view is not None and len(view) > np.ndim(a):
            raise ValueError(f"{fn}: input {k} is read through a view of {len(view)} slices but has {np.ndim(a)} "
                             f"dims (shape {np.shape(a)})")
