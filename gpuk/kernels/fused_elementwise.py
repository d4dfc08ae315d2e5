"""Launcher of the generated fused elementwise kernels (fused_elementwise.cu, a template whose
body, input/output types and rank the launcher #defines from a FusedProgram).

``fused(program, inputs)`` returns the program's outputs; gpuk/kernels/elementwise.py exports
it as the elementwise family's ``fused`` (the twin's is gpuk/cpu_fallback/elementwise.py).
A call the kernel cannot take (a bool/int value, outputs of different shapes, rank > 8)
runs the program's ops one by one on the runtime's arrays instead, with the same results.
Inputs that are static slices of a group input (``FusedProgram.input_views``: a GRU's or
LSTM's gate slices of its matrix products, folded into the fused step by the fusion pass) are
read in place: their element strides and first-element offsets are index tables set up once
per problem, and the sliced array is passed once per view, as it is. A plan step's variant for
its kept layouts (``specialized``) reads a strided input whose memory is one dense block (a
transpose, a K.permute_dimensions, K.rnn's batch-major outputs, a broadcast) in place too: the
block is passed as a C-contiguous view of it (_dense_block), and the input's element strides go
into the index tables; other strided inputs are copied.
"""
import functools
from collections import OrderedDict
from pathlib import Path

import numpy as np

from gpuk.contracts.dtypes import ELEMENT_TYPES, accumulation_dtype
from gpuk.contracts.fused_program import MAX_INPUTS, MAX_OUTPUTS, MAX_RANK, check_fused_args, viewed_layout
from .runtime import counters, prepared, register_build, resolve

SOURCE = Path(__file__).with_name('fused_elementwise.cu')
FUSED_THREADS = 256        # block size: #defined into the .cu and used for the grid below
FUSED_MAX_BLOCKS = 8192
_CACHE_ENTRIES = 512       # (shapes) index tables kept

# The template with its default one-input copy body, so `python -m gpuk.kernels.build --check`
# compiles (and register-checks) the template itself.
register_build(SOURCE, {'FUSED_THREADS': FUSED_THREADS}, ['fused_elementwise'])


def kernel_body(program):
    """FUSED_BODY: one C statement per input load, op and output store, on one line."""
    lines = []
    for k in range(program.n_inputs):
        lines.append('const %s v%d = LOAD(%d);' % (_compute_type(program.dtype(k)), k, k))
    for j, instruction in enumerate(program.instructions):
        value = program.n_inputs + j
        compute, operand = _compute_type(instruction.dtype), _compute_type(instruction.operand_dtype)
        operands = ['((%s)v%d)' % (operand, a) for a in instruction.args]
        expression = instruction.expression.format(*operands, T=operand)
        if instruction.dtype == np.float16:   # NumPy rounds each float16 op's result
            expression = 'round_to<__half, float>(%s)' % expression
        lines.append('const %s v%d = (%s)(%s);' % (compute, value, compute, expression))
    for k, value in enumerate(program.outputs):
        lines.append('STORE(%d, v%d);' % (k, value))
    return ' '.join(lines)


def _compute_type(dtype):
    return 'bool' if dtype == np.bool_ else ELEMENT_TYPES[accumulation_dtype(dtype)]


def _element_type(dtype):
    return 'bool' if dtype == np.bool_ else ELEMENT_TYPES[dtype]


def kernel_defines(program, rank, offsets=False):
    """The template's #defines for ``program`` at output ``rank``; ``offsets``: its inputs start
    at element offsets of their pointers (views read in place, FUSED_OFFSETS)."""
    defines = {'FUSED_THREADS': FUSED_THREADS, 'FUSED_N_IN': program.n_inputs,
               'FUSED_N_OUT': len(program.outputs), 'FUSED_RANK': rank, 'FUSED_BODY': kernel_body(program)}
    if offsets:
        defines['FUSED_OFFSETS'] = 1
    for k, dtype in enumerate(program.input_dtypes):
        defines['IN%d_T' % k] = _element_type(dtype)
    for k, value in enumerate(program.outputs):
        defines['OUT%d_T' % k] = _element_type(program.dtype(value))
    return defines


class _Lru(OrderedDict):
    def get_or(self, key, make):
        if key in self:
            self.move_to_end(key)
            return self[key]
        value = self[key] = make()
        if len(self) > _CACHE_ENTRIES:
            self.popitem(last=False)
        return value


_tables, _dummies = _Lru(), {}


def collapsed_index(out_shape, shapes, element_strides=None):
    """(dims, strides): the output's dims and each input's element strides (0 along a
    broadcast dim), with size-1 dims dropped and neighbouring dims merged wherever every
    input steps through them contiguously (or not at all), so inputs of the output's shape
    index as one flat dim and the kernel does no division (FUSED_RANK 1).
    ``element_strides``: per input, the strides (in elements, over its own dims) of an input
    read in place, or None for a C-contiguous one (the default for all)."""
    rank = len(out_shape)
    full = []
    for k, shape in enumerate(shapes):
        own = element_strides[k] if element_strides is not None else None
        pad = rank - len(shape)
        shape = (1,) * pad + tuple(shape)
        strides, step = [0] * rank, 1
        for d in range(rank - 1, -1, -1):
            stride = step if own is None else (own[d - pad] if d >= pad else 0)
            strides[d] = stride if shape[d] != 1 else 0
            step *= shape[d]
        full.append(strides)
    dims, strides = [], [[] for _ in shapes]   # innermost first while merging
    for d in range(rank - 1, -1, -1):
        if out_shape[d] == 1:
            continue
        if dims and all(s[d] == merged[-1] * dims[-1] for s, merged in zip(full, strides)):
            dims[-1] *= out_shape[d]
            continue
        dims.append(out_shape[d])
        for s, merged in zip(full, strides):
            merged.append(s[d])
    if not dims:
        dims, strides = [1], [[0] for _ in shapes]
    return tuple(reversed(dims)), [tuple(reversed(s)) for s in strides]


def _index_tables(rt, out_shape, shapes, layout=None):
    """(rank, dims, strides): collapsed_index as device int64 arrays (dims (rank,), strides
    (n_inputs * rank,), then with a ``layout`` of inputs read in place (per input its element
    strides or None, and the first elements' offsets, or None where every input starts at its
    pointer: _viewed_shapes, _read_in_place) the n_inputs offsets), memoized per shapes and
    layout."""
    def make():
        dims, strides = collapsed_index(out_shape, shapes, None if layout is None else layout[0])
        table = np.array(strides, dtype=np.int64).reshape(-1)
        if layout is not None and layout[1] is not None:
            table = np.concatenate([table, np.array(layout[1], dtype=np.int64)])
        return len(dims), rt.xp.asarray(np.array(dims, dtype=np.int64)), rt.xp.asarray(table)
    return _tables.get_or((rt.kind, out_shape, tuple(shapes), layout), make)


def _dummy(rt):
    if rt.kind not in _dummies:
        _dummies[rt.kind] = rt.xp.zeros(1, dtype=np.float32)
    return _dummies[rt.kind]


def _contiguous(xp, a):
    """``a`` as a C-contiguous array of the runtime's xp, of its own shape (ascontiguousarray,
    which makes 0-d arrays 1-d, never sees one: a 0-d array is always C-contiguous). A copy of
    a strided array is counted as an allocation of the step (counters.allocated: the step's
    outputs alone would not show it); a NumPy scalar made an array is not: it is the GPU
    rehearsal's 0-d result (counted where it was made), a 0-d device array on CuPy."""
    if type(a) is not xp.ndarray:
        a = xp.asarray(a)
    if a.flags.c_contiguous:
        return a
    counters.allocated()
    return xp.ascontiguousarray(a)


def _dense_block(a):
    """(index, order) such that ``a[index].transpose(order)`` is a C-contiguous view of exactly
    the memory strided array ``a`` reads, starting at its first element, or None where there is
    none (gaps, negative strides, strides that are no multiple of the item size). ``index`` (None
    when there is no such dim) keeps the first element along each broadcast dim (stride 0 along
    more than one element: a gradient broadcast from a sum); ``order`` sorts the
    other dims by stride (a transpose, a K.permute_dimensions, K.rnn's batch-major view of its
    time-major outputs). The kernel then reads that view at ``a``'s own element strides."""
    strides = a.strides
    if a.ndim < 1 or any(s % a.itemsize for s in strides):
        return None
    broadcast = [d for d, (n, s) in enumerate(zip(a.shape, strides)) if s == 0 and n > 1]
    index = tuple(slice(0, 1) if d in broadcast else slice(None) for d in range(a.ndim)) if broadcast else None
    order = tuple(sorted(range(a.ndim), key=lambda d: -strides[d]))
    block = a if index is None else a[index]
    return (index, order) if block.transpose(order).flags.c_contiguous else None


def _read_in_place(layout, n_inputs, dense):
    """``layout`` (_viewed_shapes': the input views, or None) with the inputs of ``dense``
    ({input: a strided array read in place}) read at their own element strides from their
    first element."""
    strides = list(layout[0]) if layout is not None else [None] * n_inputs
    for k, a in dense.items():
        strides[k] = tuple(s // a.itemsize for s in a.strides)
    return tuple(strides), None if layout is None else layout[1]


def _launch_of(rt, program, shapes, out_shape, n, layout=None):
    """(launch, the arguments after the pointers): the kernel of ``program`` for these shapes
    (and ``layout`` of inputs read in place) with its grid, and its index tables and size;
    (None, None) for an empty output."""
    if not n:
        return None, None
    rank, dims, strides = _index_tables(rt, out_shape, shapes, layout)
    blocks = max(1, min(-(-n // FUSED_THREADS), FUSED_MAX_BLOCKS))
    offsets = layout is not None and layout[1] is not None
    launch = rt.kernel_launch(SOURCE, kernel_defines(program, rank, offsets), 'fused_elementwise',
                              blocks, FUSED_THREADS)
    return launch, (dims, strides, np.int64(n))


def _viewed_shapes(program, shapes):
    """(the shapes the program's ops read, the layout of its input views or None): an input
    with a view (FusedProgram.input_views) is read at the view's shape, element strides and
    first-element offset in the C-contiguous array passed for it (viewed_layout), fixed per
    problem: the kernel reads the gate slices of a matrix product in place."""
    if not any(program.input_views):
        return shapes, None
    viewed, strides, offsets = [], [], []
    for shape, view in zip(shapes, program.input_views):
        if view is None:
            viewed.append(shape)
            strides.append(None)
            offsets.append(0)
        else:
            shape, element_strides, offset = viewed_layout(shape, view)
            viewed.append(shape)
            strides.append(element_strides)
            offsets.append(offset)
    return viewed, (tuple(strides), tuple(offsets))


def fused(program, inputs, *, runtime=None):
    """The outputs (a list) of ``program`` (gpuk.contracts.fused_program) on ``inputs``."""
    run = fused_runner(program, inputs, runtime=runtime)   # (checks the program first)
    return program.output_list(run(*inputs))


def fused_runner(program, inputs, *, runtime=None):
    """``run(*inputs)``, ``fused(program, inputs)`` as a plan step returns it (the one output, or
    a tuple: FusedProgram.step_result) for inputs of the shapes and dtypes of these ``inputs``:
    checked and set up once per problem signature (runtime/prepared.py); a fused plan step
    keeps it for its next calls (prepared.Kept)."""
    rt = resolve(runtime)
    return prepared.get(rt, 'fused', inputs, (program,), lambda: _prepare(rt, program, inputs))


def _prepare(rt, program, inputs):
    """``run(*inputs)`` for inputs of this problem's signature: the checks and every choice that
    reads only the signature (kernel or op-by-op, output shape and dtypes, the kernel launch
    with its grid, index tables and padding arguments) are made here, once; ``run`` does the
    per-call array work (contiguous inputs, outputs, the launch)."""
    check_fused_args(program, inputs)
    xp = rt.xp
    array_type, empty = xp.ndarray, xp.empty
    shapes, layout = _viewed_shapes(program, [tuple(np.shape(a)) for a in inputs])
    out_shape = tuple(np.broadcast_shapes(*shapes))
    same_shape = all(tuple(np.broadcast_shapes(*[shapes[k] for k in deps])) == out_shape
                     for deps in program.input_dependencies())

    def contiguous(inputs):
        for a in inputs:
            if type(a) is not array_type or not a.flags.c_contiguous:
                # only those are converted (a gate sliced off a matmul result, a host number):
                # the others pass as they are, without a call each
                return [a if type(a) is array_type and a.flags.c_contiguous else _contiguous(xp, a) for a in inputs]
        return inputs

    step_result = program.step_result
    if not (program.kernel_ready() and same_shape and len(out_shape) <= MAX_RANK):
        return lambda *inputs: step_result([xp.asarray(v) for v in program.run_unfused(contiguous(inputs))])
    n = int(np.prod(out_shape, dtype=np.int64))
    launch, tail = _launch_of(rt, program, shapes, out_shape, n, layout)
    dummy = _dummy(rt)
    out_dtypes = tuple(program.dtype(v) for v in program.outputs)
    input_pads = (dummy,) * (MAX_INPUTS - len(inputs))
    tail = (dummy,) * (MAX_OUTPUTS - len(out_dtypes)) + (tail or ())

    if launch is None:   # an empty output: nothing to launch
        return lambda *inputs: step_result([empty(out_shape, dtype) for dtype in out_dtypes])
    # (contiguous() inlined in the runs below: a loop, no call, when every input is contiguous)
    if len(out_dtypes) == 1:   # the common case, without a loop over the outputs
        out_dtype = out_dtypes[0]

        def run(*inputs):
            for a in inputs:
                if type(a) is not array_type or not a.flags.c_contiguous:
                    inputs = contiguous(inputs)
                    break
            out = empty(out_shape, out_dtype)
            launch((*inputs, *input_pads, out, *tail))
            return out
    else:
        empty_output = functools.partial(empty, out_shape)   # one per output dtype, mapped (no Python frame)

        def run(*inputs):
            for a in inputs:
                if type(a) is not array_type or not a.flags.c_contiguous:
                    inputs = contiguous(inputs)
                    break
            outputs = (*map(empty_output, out_dtypes),)
            launch((*inputs, *input_pads, *outputs, *tail))
            return outputs

    def specialized(inputs):
        """The run of one plan step (prepared.Kept) for inputs of exactly these layouts (the
        Kept compared their strides): the inputs that are not C-contiguous (a gate sliced off a
        matrix product, a transposed value, a host number) are known, so the others are passed
        without a test; the outputs are written into reused buffers (prepared.StepBuffers, shared with the
        plan's other steps of their shape and dtype: a buffer anything else still holds is never
        written again).
        A strided input that is one dense block of memory (_dense_block) is read in place: the
        kernel gets the block as its C-contiguous view and the input's element strides in its
        index tables (no copy, no allocation, the same values). The other strided inputs (gaps,
        negative strides, an input that has a view of its own) are copied to new contiguous
        arrays, as before: copying them into reused buffers too (xp.copyto) made the GRU's steps
        slower in the rehearsal."""
        # the positions of the inputs that are not C-contiguous arrays of the runtime
        converted = [k for k, a in enumerate(inputs) if type(a) is not array_type or not a.flags.c_contiguous]
        dense = {}
        for k in converted:
            if type(inputs[k]) is array_type and (layout is None or layout[0][k] is None):   # no view
                block = _dense_block(inputs[k])
                if block is not None:
                    dense[k] = block
        copied = [k for k in converted if k not in dense]
        sliced = tuple((k, index) for k, (index, _) in dense.items() if index is not None)
        reordered = tuple((k, order) for k, (_, order) in dense.items() if order != tuple(range(len(order))))
        kernel, kernel_tail = launch, tail
        if dense:
            kernel, own_tail = _launch_of(rt, program, shapes, out_shape, n,
                                          _read_in_place(layout, len(inputs), {k: inputs[k] for k in dense}))
            kernel_tail = tail[:MAX_OUTPUTS - len(out_dtypes)] + own_tail
        buffers = prepared.StepBuffers(empty, out_shape, out_dtypes)
        take_outputs = buffers.take_all
        if converted:
            def run_converting(*inputs):
                inputs = list(inputs)
                for k, index in sliced:
                    inputs[k] = inputs[k][index]             # one element along its broadcast dims
                for k, order in reordered:
                    inputs[k] = inputs[k].transpose(order)   # its memory as a C-contiguous view
                for k in copied:
                    inputs[k] = _contiguous(xp, inputs[k])   # (a strided copy is counted there)
                outputs = take_outputs()
                kernel((*inputs, *input_pads, *outputs, *kernel_tail))
                return step_result(outputs)
            return run_converting
        if len(out_dtypes) == 1:
            take = buffers.take

            def run_one(*inputs):
                out = take(0)
                launch((*inputs, *input_pads, out, *tail))
                return out
            return run_one

        def run_several(*inputs):
            outputs = take_outputs()
            launch((*inputs, *input_pads, *outputs, *tail))
            return outputs
        return run_several

    run.specialized = specialized
    return run
