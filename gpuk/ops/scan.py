"""Scan: a loop over the leading (time) axis running a step subgraph.

``K.rnn``, ``map_fn``, ``foldl`` and ``foldr`` trace their step function once into a
subgraph and run it as one Scan node. The node's inputs are the sequences (time-major),
the initial states and the captured outer tensors the step reads (weights, constants, the
learning phase). Its outputs are the per-step outputs stacked over time, the final states,
and the state history (the state entering each step), which the gradient needs.

The gradient of a Scan is another Scan running the other way over the vector-Jacobian
product of the step, so gradients through time are graph nodes and differentiate again.
"""

import numpy as np

from gpuk import config, device
from gpuk.graph import Constant, Meta, Placeholder, Tensor, apply, clone, topological_nodes
from gpuk.kernels.runtime import counters, prepared
from gpuk.ops.base import Op
from gpuk.ops.elementwise import Unary
from gpuk.ops.fused import is_zero
from gpuk.ops.shape import Getitem


def compile_plan(inputs, outputs, impl):
    """The step graph compiled into an execution plan: gpuk.function's Plan, which registers
    itself here when it is imported (it sits above the ops: a Scan runs inside a Plan, so the
    plan machinery is always loaded by then, and ops never import upwards)."""
    if _plan_class[0] is None:
        raise RuntimeError('Scan: gpuk.function is not loaded, so no plan compiles the step graph')
    return _plan_class[0](inputs, outputs, impl)


_plan_class = [None]


def register_plan_class(plan_class):
    _plan_class[0] = plan_class


def _is_float(tensor):
    return np.dtype(tensor.dtype).kind == 'f'


def find_captured(outputs, inner_inputs):
    """The outer tensors the step graph reads: the tensors feeding step nodes that do not
    themselves depend on the step's own inputs (constants excepted: they stay inside)."""
    inner = set(inner_inputs)
    nodes = topological_nodes(outputs, stop_at=inner)
    dependent = {id(t) for t in inner}
    for node in nodes:
        if any(id(t) in dependent for t in node.inputs):
            dependent.update(id(t) for t in node.outputs)
    captured, seen = [], set()

    def capture(t):
        if id(t) not in dependent and not isinstance(t, Constant) and id(t) not in seen:
            seen.add(id(t))
            captured.append(t)
    for node in nodes:
        if any(id(t) in dependent for t in node.outputs):
            for t in node.inputs:
                capture(t)
    for t in outputs:
        capture(t)
    return captured


def proxy_for(tensor):
    proxy = Placeholder(tensor.shape, tensor.dtype, name='scan_captured')
    return proxy


class Scan(Op):
    """Runs the step graph ``seq_inputs + state_inputs + captured_inputs -> step_outputs +
    state_outputs`` over time. Attributes are the (immutable) step graph; compiled step plans
    are cached per implementation."""
    foldable = False  # the step may hold stateful ops (dropout noise)

    def __init__(self, seq_inputs, state_inputs, captured_inputs, step_outputs, state_outputs,
                 reverse=False, where='scan', shape_only_outputs=(), recorded_history=None):
        # step outputs whose readers want only their shape: stacked as a zero-strided stand-in
        self.shape_only_outputs = frozenset(shape_only_outputs)
        # the states whose history is recorded (the others' history output is None: a plan
        # prunes those it does not read, fusion_scan.prune_scan_outputs)
        self.recorded_history = (tuple(range(len(state_inputs))) if recorded_history is None
                                 else tuple(recorded_history))
        self.seq_inputs = list(seq_inputs)
        self.state_inputs = list(state_inputs)
        self.captured_inputs = list(captured_inputs)
        self.step_outputs = list(step_outputs)
        self.state_outputs = list(state_outputs)
        self.reverse = reverse
        self.where = where
        self._plans = {}       # input signature -> step plan
        self._prologues = {}   # input signature -> the plan of the loop invariants, or None
        # the stacked results' reused buffers, kept for the last layouts of the sequences and
        # states (what their shapes follow from): _Stacks, through a Kept so that graph capture
        # and an allocation failure forget them as they do every step's buffers
        self._stacks = prepared.Kept()
        for placeholder, new_state in zip(self.state_inputs, self.state_outputs):
            if placeholder.dtype != new_state.dtype:
                raise ValueError('%s: the step returns a state of dtype %s for a state of dtype %s'
                                 % (where, new_state.dtype, placeholder.dtype))
            if placeholder.ndim is not None and new_state.ndim is not None and placeholder.ndim != new_state.ndim:
                raise ValueError('%s: the step returns a state of shape %s for a state of shape %s'
                                 % (where, new_state.shape, placeholder.shape))

    def __repr__(self):
        return 'Scan(%s, %d seqs, %d states, %d captured, reverse=%s)' % (
            self.where, len(self.seq_inputs), len(self.state_inputs), len(self.captured_inputs), self.reverse)

    def infer(self, *metas):
        n_seq, n_state = len(self.seq_inputs), len(self.state_inputs)
        lengths = {m.shape[0] for m in metas[:n_seq] if m.shape and m.shape[0] is not None}
        if len(lengths) > 1:
            raise ValueError('%s: sequences of different lengths %s' % (self.where, sorted(lengths)))
        steps = lengths.pop() if lengths else None
        stacked = [Meta((steps,) + tuple(t.shape), t.dtype) for t in self.step_outputs]
        finals = [Meta(m.shape, m.dtype) for m in metas[n_seq:n_seq + n_state]]
        history = [Meta((steps,) + tuple(m.shape), m.dtype) for m in metas[n_seq:n_seq + n_state]]
        return tuple(stacked + finals + history)

    def _plan(self, impl, arrays):
        """(prologue, step plan) for step inputs of these shapes (``arrays``: one step's
        sequence slices, the states, the captured tensors).

        The step graph is copied with inputs of these shapes, so that the plan knows every
        shape (a gradient's SumToShapeOf between equal shapes drops out, and a new state or
        output that is one is its input's plan slot: gpuk/fusion_gradients.py). Its loop
        invariants (pure ops reading only captured tensors, like the transposed recurrent kernel
        a gradient step multiplies by) move to the prologue, a plan run once per loop whose
        results the step plan reads as inputs.
        One pair per implementation and input signature, like a K.function's CUDA graphs;
        the step plans stay in ``_plans`` (the plan reports read them there)."""
        signature = (id(impl),) + tuple((tuple(a.shape), a.dtype.name) for a in arrays)
        plan = self._plans.get(signature)
        if plan is None or plan.impl is not impl or plan.precision != config.precision():
            inner = self.seq_inputs + self.state_inputs + self.captured_inputs
            shaped = [Placeholder(tuple(a.shape), t.dtype, name='scan_step_input') for t, a in zip(inner, arrays)]
            outputs = clone(self.step_outputs + self.state_outputs, dict(zip(inner, shaped)))
            n_varying = len(self.seq_inputs) + len(self.state_inputs)
            invariants = _loop_invariants(outputs, shaped[:n_varying], shaped[n_varying:])
            self._prologues[signature] = (compile_plan(shaped[n_varying:], invariants, impl)
                                          if invariants else None)
            plan = compile_plan(shaped + invariants, outputs, impl)
            self._plans[signature] = plan
        return self._prologues[signature], plan

    def forward(self, impl, *arrays):
        xp = impl.xp
        n_seq, n_state = len(self.seq_inputs), len(self.state_inputs)
        sequences, states = arrays[:n_seq], list(arrays[n_seq:n_seq + n_state])
        captured = list(arrays[n_seq + n_state:])
        steps = sequences[0].shape[0]
        if any(s.shape[0] != steps for s in sequences):
            raise ValueError('%s: sequences of different lengths %s' % (self.where, [s.shape[0] for s in sequences]))
        if steps == 0:
            return self._no_steps(xp, states)
        first = steps - 1 if self.reverse else 0
        prologue, plan = self._plan(impl, [s[first] for s in sequences] + states + captured)
        stacks = self._stacks.run(impl, (*sequences, *states), _stacks_runner)
        # loop invariants computed once, contiguous (a transposed matrix is a faster GEMM
        # operand copied than as a strided view; the matmul family copies it)
        captured = captured + ([] if prologue is None else [impl.matmul.contiguous_operand(v)
                                                             for v in prologue.run(captured)])
        n_out = len(self.step_outputs)
        # each step's values are written into the stacked results at once (no list of
        # per-step arrays kept alive until a final stack)
        history = [stacks(('history', i), (steps,) + tuple(s.shape), s.dtype)
                   if i in self.recorded_history else None for i, s in enumerate(states)]
        recorded = [(i, history[i]) for i in self.recorded_history]
        outputs = None
        # outputs the step plan returns from one slot (factors a gradient step reads as
        # different tensors that are the same value at these shapes): stacked once
        aliases = _aliased_outputs(plan.target_slots[:n_out], self.shape_only_outputs)
        written = [i for i in range(n_out) if i not in self.shape_only_outputs and i not in aliases]
        state_shapes = [s.shape for s in states]
        array_type = xp.ndarray
        # only the sequences the step plan reads are sliced per step (a gradient step gets
        # every forward sequence and state history; the others are None)
        read = _read_inputs(plan)
        sliced = [(k, _steps_contiguous(impl, stacks, k, s)) for k, s in enumerate(sequences) if k in read]
        step_slices = [None] * n_seq
        for t in (range(steps - 1, -1, -1) if self.reverse else range(steps)):
            for i, stacked in recorded:
                stacked[t] = states[i]
            for k, s in sliced:
                step_slices[k] = s[t]
            values = plan.run(step_slices + states + captured)
            if outputs is None:
                outputs = [None if i in aliases else self._stacked_like(xp, stacks, i, steps, values[i])
                           for i in range(n_out)]
                for i, first in aliases.items():
                    outputs[i] = outputs[first]
                # (stacked, output, one step's shape and dtype): checked per step, then written
                targets = [(outputs[i], i, outputs[i].shape[1:], outputs[i].dtype) for i in written]
            for stacked, i, shape, dtype in targets:
                value = values[i]
                if value.shape != shape or value.dtype != dtype:
                    self._step_output_error(t, value, shape, dtype)
                stacked[t] = value
            states = values[n_out:]
            for s, shape in zip(states, state_shapes):   # a loop without calls while all is well
                if type(s) is not array_type or s.shape != shape:
                    states = [xp.asarray(s) for s in states]
                    if [s.shape for s in states] != state_shapes:
                        self._check_states(state_shapes, states)
                    break
        results = outputs + states + history
        return results[0] if len(results) == 1 else tuple(results)

    def _stacked_like(self, xp, stacks, i, steps, value):
        """The stacked result for step output ``i`` from its first step's ``value``: a buffer
        to fill (``stacks``), or for a shape-only output zeros broadcast to the stacked shape
        (no memory)."""
        value = xp.asarray(value)
        shape = (steps,) + tuple(value.shape)
        if i in self.shape_only_outputs:
            return xp.broadcast_to(xp.zeros((), value.dtype), shape)
        return stacks(('output', i), shape, value.dtype)

    def _check_states(self, shapes, states):
        for shape, new in zip(shapes, states):
            if new.shape != shape:
                raise ValueError('%s: the step changed a state of shape %s into shape %s'
                                 % (self.where, shape, new.shape))

    def _step_output_error(self, t, value, shape, dtype):
        raise ValueError('%s: step %d gave an output of shape %s and dtype %s, the steps before %s and %s'
                         % (self.where, t, tuple(value.shape), value.dtype, shape, dtype))

    def _no_steps(self, xp, states):
        """The results of looping over empty sequences, as TensorFlow's: no outputs stacked
        (shape (0,) + the step output's, which must then be static), the states as given."""
        stacked = []
        for t in self.step_outputs:
            if t.shape is None or None in t.shape:
                raise ValueError('%s: cannot stack the outputs of a sequence of length 0: the '
                                 'step output shape %s is not fully known' % (self.where, t.shape))
            stacked.append(xp.zeros((0,) + tuple(t.shape), t.dtype))
        history = [xp.zeros((0,) + tuple(s.shape), s.dtype) for s in states]
        results = stacked + list(states) + history
        return results[0] if len(results) == 1 else tuple(results)

    def _residuals(self, backward_outputs):
        """(residuals, the positions of those read for their shape alone): the forward step's
        values that the backward step graph ``backward_outputs`` reads and that change from
        step to step, except the step's inputs and what is cheap to recompute (elementwise
        ops and slices, Op.cheap_to_recompute: the backward step computes them again from
        the residuals). Values computed from the captured tensors alone are loop
        invariants: recomputed too."""
        inner = self.seq_inputs + self.state_inputs + self.captured_inputs
        forward_nodes = topological_nodes(self.step_outputs + self.state_outputs, stop_at=set(inner))
        varying = {id(t) for t in self.seq_inputs + self.state_inputs}
        for node in forward_nodes:
            if any(id(t) in varying for t in node.inputs):
                varying.update(id(t) for t in node.outputs)
        kept = {t for node in forward_nodes if not _recomputed(node.op)
                for t in node.outputs if id(t) in varying}
        shape_only = {}   # residual -> whether every read wants its shape alone
        for node in topological_nodes(backward_outputs, stop_at=kept | set(inner)):
            for position, t in enumerate(node.inputs):
                if t in kept:
                    shape_only[t] = shape_only.get(t, True) and position in node.op.shape_only_inputs
        shape_only.update((t, False) for t in backward_outputs if t in kept)
        return list(shape_only), [i for i, flag in enumerate(shape_only.values()) if flag]

    def _stacked_residuals(self, inputs, residuals, shape_only):
        """The ``residuals`` stacked over time: the outputs of this Scan extended with them as
        more step outputs (ResidualScan), applied to the same inputs. A plan holding both
        runs the extended Scan alone (fusion_scan.merge_residual_scans). The residuals
        numbered in ``shape_only`` are read for their shape alone: zero-strided stand-ins."""
        if not residuals:
            return []
        extended = ResidualScan(self, residuals, shape_only)
        results = apply(extended, *inputs)
        n_out = len(self.step_outputs)
        return list(results[n_out:n_out + len(residuals)])

    def grad(self, inputs, outputs, output_grads):
        n_seq, n_state = len(self.seq_inputs), len(self.state_inputs)
        n_out = len(self.step_outputs)
        seqs = list(inputs[:n_seq])
        captured = list(inputs[n_seq + n_state:])
        d_stacked = output_grads[:n_out]
        d_final = output_grads[n_out:n_out + n_state]
        d_history = output_grads[n_out + n_state:]
        history = outputs[n_out + n_state:]

        # a stacked output nothing differentiates (its gradient zeros by construction, like
        # the sequence of a layer returning only its last output) seeds nothing per step
        float_outs = [i for i, t in enumerate(self.step_outputs) if _is_float(t) and not is_zero(d_stacked[i])]
        float_states = [i for i, t in enumerate(self.state_inputs) if _is_float(t)]
        float_caps = [i for i, t in enumerate(self.captured_inputs) if _is_float(t)]
        float_seqs = [i for i, t in enumerate(self.seq_inputs) if _is_float(t)]

        # The backward step: vector-Jacobian product of the forward step.
        dy = [Placeholder(self.step_outputs[i].shape, self.step_outputs[i].dtype, name='scan_dy') for i in float_outs]
        ds = [Placeholder(self.state_inputs[i].shape, self.state_inputs[i].dtype, name='scan_ds') for i in float_states]
        # a state history's gradient is zeros unless something besides this gradient reads the
        # history (a second-order gradient): zeros are not added per step
        dh = [None if is_zero(d_history[i]) else
              Placeholder(self.state_inputs[i].shape, self.state_inputs[i].dtype, name='scan_dh')
              for i in float_states]
        dc = [Placeholder(self.captured_inputs[i].shape, self.captured_inputs[i].dtype, name='scan_dc')
              for i in float_caps]
        # seeded with dy / ds directly (not as gradients of sum(output * seed)), so the step's
        # backward has no broadcast-and-multiply of a scalar seed per output
        from gpuk.autodiff import vector_jacobian_products
        from gpuk.ops.elementwise import zeros_like
        seeded = ([self.step_outputs[i] for i in float_outs] + [self.state_outputs[i] for i in float_states])
        wrt = ([self.seq_inputs[i] for i in float_seqs] + [self.state_inputs[i] for i in float_states]
               + [self.captured_inputs[i] for i in float_caps])
        local = (vector_jacobian_products(seeded, dy + ds, wrt, where=self.where + ' gradient')
                 if seeded else [None] * len(wrt))
        local = [zeros_like(w) if g is None else g for w, g in zip(wrt, local)]
        g_seq = local[:len(float_seqs)]
        g_state = local[len(float_seqs):len(float_seqs) + len(float_states)]
        g_cap = local[len(float_seqs) + len(float_states):]
        # weight gradients of the form sum over time of A_t^T B_t (or of B_t's column sums)
        # are computed after the loop as one product of the stacked A and B: no accumulator
        # state, transposes, small GEMMs and adds per step (_time_summed_factors)
        factors = [_time_summed_factors(g, self.captured_inputs[i]) for g, i in zip(g_cap, float_caps)]
        summed = [k for k, f in enumerate(factors) if f is not None]
        outer_of = dict(zip(self.seq_inputs, seqs))
        outer_of.update((self.state_inputs[i], history[i]) for i in range(n_state))
        stacked_factors = list(dict.fromkeys(t for k in summed for t in factors[k][1:]
                                           if t is not None and t not in outer_of))
        dc = [d for k, d in enumerate(dc) if k not in summed]
        step_outputs = g_seq + stacked_factors
        state_outputs = ([g if h is None else g + h for g, h in zip(g_state, dh)]
                         + [acc + g for acc, g in zip(dc, [g for k, g in enumerate(g_cap) if k not in summed])])
        # the forward values the backward step reads come from the forward Scan, stacked
        residuals, shape_only = self._residuals(step_outputs + state_outputs)
        residual_ph = [Placeholder(t.shape, t.dtype, name='scan_residual') for t in residuals]
        backward = clone(step_outputs + state_outputs, dict(zip(residuals, residual_ph)))
        back = Scan(
            seq_inputs=(list(self.seq_inputs) + list(self.state_inputs) + dy + [h for h in dh if h is not None]
                        + residual_ph),
            state_inputs=ds + dc,
            captured_inputs=self.captured_inputs,
            step_outputs=backward[:len(step_outputs)],
            state_outputs=backward[len(step_outputs):],
            reverse=not self.reverse,
            where=self.where + ' gradient')
        back_inputs = (seqs + list(history) + [d_stacked[i] for i in float_outs]
                       + [d_history[i] for i, h in zip(float_states, dh) if h is not None]
                       + self._stacked_residuals(inputs, residuals, shape_only)
                       + [d_final[i] for i in float_states]
                       + [zeros_like(captured[i]) for k, i in enumerate(float_caps) if k not in summed]
                       + captured)
        results = apply(back, *back_inputs)
        results = results if isinstance(results, tuple) else (results,)
        n_gseq = len(float_seqs)
        stacked_of = dict(outer_of)
        stacked_of.update(zip(stacked_factors, results[n_gseq:len(step_outputs)]))
        finals = iter(results[len(step_outputs):])
        grads = [None] * len(inputs)
        for k, i in enumerate(float_seqs):
            grads[i] = results[k]
        for k, i in enumerate(float_states):
            grads[n_seq + i] = next(finals)
        for k, i in enumerate(float_caps):
            grads[n_seq + n_state + i] = (_summed_over_time(factors[k], stacked_of) if k in summed
                                          else next(finals))
        return grads


class ResidualScan(Scan):
    """A Scan with more stacked outputs: ``base``'s step outputs, then ``residuals`` (values
    of its step graph that its gradient's step reads). Its outputs extend ``base``'s, so a
    plan running both runs this one alone, in place of ``base``."""

    def __init__(self, base, residuals, shape_only=()):
        n_out = len(base.step_outputs)
        super().__init__(base.seq_inputs, base.state_inputs, base.captured_inputs,
                         base.step_outputs + list(residuals), base.state_outputs, base.reverse, base.where,
                         base.shape_only_outputs | {n_out + i for i in shape_only})
        self.base = base


class _Stacks:
    """The stacked results of one Scan step, in reused buffers: ``stacks(key, shape, dtype)`` is
    an empty stacked result for ``key`` (a state's history, a step output) that nothing else
    holds (prepared.StepBuffers: not a view, a variable, a plan slot, a caller), the plan's
    arena for plain launches as every step's buffers. Besides the allocation, a fresh multi-MB
    buffer costs page faults on every first touch (measured on the NumPy device: 2/3 of the
    per-step writes' time on the LSTM benchmark); a reused one is already mapped."""
    __slots__ = ('_empty', '_by_key')

    def __init__(self, empty):
        self._empty, self._by_key = empty, {}

    def __call__(self, key, shape, dtype):
        found = self._by_key.get(key)
        if found is None or found[0] != (shape, dtype):   # (a step output's dtype is known per call)
            found = self._by_key[key] = ((shape, dtype), prepared.StepBuffers(self._empty, shape, (dtype,)).take)
        return found[1](0)


def _stacks_runner(impl, *arrays):
    """The runner a Scan's Kept keeps for its sequences' and states' layouts: it returns the
    _Stacks of those layouts."""
    stacks = _Stacks(impl.xp.empty)
    return lambda *arrays: stacks


def _read_inputs(plan):
    """The positions of the step inputs that the step plan reads (or returns)."""
    used = {s for _, ins, _, _ in plan.steps for s in ins} | set(plan.target_slots)
    return {k for k, s in enumerate(plan.input_slots) if s in used}


def _steps_contiguous(impl, stacks, k, sequence):
    """``sequence`` with C-contiguous per-step slices where the elementwise family's step
    kernels would copy a strided operand on every call (COPIES_STRIDED_OPERANDS: the kernel
    runtimes): a sequence whose slices are strided (a time-major view of a batch-major array:
    the gradient of a Keras RNN's outputs) is copied once per loop instead of once per time
    step, into the step's reused buffer for sequence ``k`` (``stacks``, _Stacks: written again
    only when nothing holds it, as every step buffer); a new one is counted as the launchers'
    copies are. The NumPy device's ufuncs read strided slices in place: nothing is copied. Nor
    is a broadcast (a zero stride: the stacked stand-in of a value read for its shape alone,
    _stacked_like), which would become a whole sequence of memory."""
    if (not impl.elementwise.COPIES_STRIDED_OPERANDS or sequence[0].flags.c_contiguous
            or 0 in sequence.strides):
        return sequence
    copy = stacks(('contiguous', k), tuple(sequence.shape), sequence.dtype)
    if counters.active() is not None:   # a buffer no counted step saw before: an allocation
        counters.allocated(counters.new_buffers((copy,), ()))
    copy[...] = sequence   # (NumPy and CuPy alike: a strided to contiguous copy)
    return copy


def _aliased_outputs(target_slots, shape_only):
    """{output: the first output read from the same plan slot} over the stacked (not
    shape-only) step outputs whose slot an earlier one has already."""
    first_of, aliases = {}, {}
    for i, slot in enumerate(target_slots):
        if i in shape_only:
            continue
        if slot in first_of:
            aliases[i] = first_of[slot]
        else:
            first_of[slot] = i
    return aliases


# Recomputed by a Scan's backward step or kept, stacked, from its forward loop, as the
# elementwise family says (RECOMPUTES_STEP_ACTIVATIONS: cheap in a kernel device's fused cell
# kernel, several ufunc calls each on the NumPy device).
_STEP_ACTIVATIONS = ('sigmoid', 'tanh')


def _recomputed(op):
    """Whether a Scan's backward step computes ``op``'s value again instead of reading it
    stacked from the forward loop (see Scan._residuals).

    Decided when the gradient graph is built (K.gradients), by the implementation of the
    device in use then (device.impl()), not when a plan is compiled for a device: the choice
    fixes the graph itself (which values the ResidualScan stacks, which placeholders the
    backward step reads), shared by every plan compiled from it, and a plan-time choice would
    have to rewrite the forward and the backward Scan of the outer plan together. Build time
    is right because it cannot change values, only cost: both forms compute the same gradients on any device (on the NumPy
    device bit for bit: the same ufuncs on the same stacked inputs; the test
    test_activations_are_kept_on_the_numpy_device_and_recomputed_for_kernels). And the
    device of a graph's build is the device it runs on: device.impl() pins GPUK_DEVICE on
    first use, and set_device must come before any variable is created (variables keep the
    arrays of their device), so the graphs of a model are built and run on one device. A
    graph built on one device and run on another (only by switching devices between
    building and running, as tests do) computes the same numbers with the other form's
    cost: kept activations on a kernel device split the forward cell kernel (more than 4
    outputs), recomputed ones on the NumPy device cost a few ufunc calls each."""
    if not op.cheap_to_recompute():
        return False
    return not (isinstance(op, Unary) and op.name in _STEP_ACTIVATIONS
                and not device.impl().elementwise.RECOMPUTES_STEP_ACTIVATIONS)


def _time_summed_factors(g, captured):
    """('matmul', A, B) when the step's gradient ``g`` of the 2-D ``captured`` tensor is
    A^T B (MatMul's gradient for its right operand: x_t^T dz for x_t W), ('sum', None, B)
    when it is B's column sums (a bias's gradient); else None. Both A and B are 2-D values
    of the step with static last dims, of the captured tensor's dtype."""
    from gpuk.ops.linalg import MatMul
    from gpuk.ops.reduction import Reduce
    from gpuk.ops.shape import Transpose
    node = g.node
    if node is None or g.dtype != captured.dtype:
        return None
    if isinstance(node.op, MatMul) and len(node.inputs) == 2:
        a_t, b = node.inputs
        if (a_t.node is not None and isinstance(a_t.node.op, Transpose) and a_t.node.op.perm == (1, 0)
                and _matrix_of(a_t.node.inputs[0], g.dtype) and _matrix_of(b, g.dtype)):
            a = a_t.node.inputs[0]
            return 'matmul', a, _unbroadcast_rows(b, a)
    if (isinstance(node.op, Reduce) and node.op.kind == 'sum' and node.op.axes == (0,)
            and not node.op.keepdims and _matrix_of(node.inputs[0], g.dtype)):
        return 'sum', None, _unbroadcast_rows(node.inputs[0], None)
    return None


def _unbroadcast_rows(b, a):
    """``b`` without a SumToShapeOf(g, like) between equal static shapes (an add's gradient
    in z = x W + h U + bias) where that cannot change the result, so that one stacked g
    serves every factor: for column sums always (summing g's rows or its rows summed to
    like's gives the same). For A^T B only when the rows are known to be the same at build
    time (like is A times a matrix and the row count is a static number): with a batch
    known only at run time, A may broadcast a single row against more rows of the step's
    states (batch-1 inputs, batch-n initial states), and then B must be g summed to like's
    one row. There the SumToShapeOf stays in the step graph: a step plan compiled for equal
    run-time shapes returns its input's slot for it (gpuk/fusion_gradients.py), and the Scan
    then writes the one stacked value once for all the factors that are the same plan slot
    (_aliased_outputs)."""
    from gpuk.ops.elementwise import SumToShapeOf
    from gpuk.ops.linalg import MatMul
    node = b.node
    if node is None or not isinstance(node.op, SumToShapeOf):
        return b
    g, like = node.inputs
    if g.shape != like.shape or g.dtype != b.dtype:
        return b
    if a is None or (like.node is not None and isinstance(like.node.op, MatMul) and like.node.inputs[0] is a
                     and g.shape[0] is not None and g.shape[0] == a.shape[0]):
        return g
    return b


def _matrix_of(t, dtype):
    return t.shape is not None and len(t.shape) == 2 and t.shape[1] is not None and t.dtype == dtype


def _summed_over_time(factors, stacked_of):
    """The gradient ``factors`` (_time_summed_factors) summed over time: one product (or one
    reduction) of the factors stacked over time (``stacked_of``: step value -> stacked)."""
    from gpuk.ops.linalg import matmul
    from gpuk.ops.reduction import reduce
    from gpuk.ops.shape import reshape, transpose
    kind, a, b = factors
    b_rows = reshape(stacked_of[b], (-1, b.shape[1]))
    if kind == 'sum':
        return reduce('sum', b_rows, 0)
    return matmul(transpose(reshape(stacked_of[a], (-1, a.shape[1])), (1, 0)), b_rows)


def _loop_invariants(outputs, varying, captured):
    """The tensors of the step graph ``outputs`` computed by pure (foldable) ops from the
    ``captured`` inputs and constants alone, that a step-dependent op (or the step's
    outputs) reads: what a loop can compute once before its first step."""
    nodes = topological_nodes(outputs, stop_at=set(varying) | set(captured))
    invariant = set(captured)
    for node in nodes:
        if node.op.foldable and all(t in invariant or (t.node is None and isinstance(t, Constant))
                                    for t in node.inputs):
            invariant.update(node.outputs)
    frontier = {}
    for node in nodes:
        if not all(t in invariant for t in node.outputs):
            frontier.update((t, None) for t in node.inputs if t in invariant and t.node is not None)
    frontier.update((t, None) for t in outputs if t in invariant and t.node is not None)
    return list(frontier)


class LastStep(Getitem):
    """The last step of stacked step outputs (K.rnn's last output, ``outputs[-1]``), refusing
    a sequence of length 0 that only the run time shows, as ``where`` refuses a static one
    (an empty loop keeps its states as given, but has no last output)."""

    def __init__(self, ndim, where):
        super().__init__((-1,) + (slice(None),) * (ndim - 1))
        self.where = where

    def forward(self, impl, x, *dynamic):
        if x.shape[0] == 0:
            raise ValueError('%s: inputs must have at least one time step, got a sequence of 0 time steps'
                             % self.where)
        return super().forward(impl, x, *dynamic)


def scan(step_graph_inputs, step_graph_outputs, sequences, initial_states, reverse=False, where='scan'):
    """Builds a Scan node from a traced step graph.

    ``step_graph_inputs``: (sequence placeholders, state placeholders) the step was traced
    on; ``step_graph_outputs``: (per-step outputs, new states). Outer tensors read by the
    step are found and replaced by proxies. Returns (stacked outputs, final states).
    """
    seq_ph, state_ph = step_graph_inputs
    step_outs, new_states = step_graph_outputs
    outs = list(step_outs) + list(new_states)
    captured = find_captured(outs, list(seq_ph) + list(state_ph))
    proxies = [proxy_for(t) for t in captured]
    outs = clone(outs, dict(zip(captured, proxies)))
    node = Scan(seq_ph, state_ph, proxies, outs[:len(step_outs)], outs[len(step_outs):], reverse, where)
    for s in sequences:
        if not isinstance(s, Tensor):
            raise TypeError('%s: sequences must be tensors, got %r' % (where, s))
    results = apply(node, *(list(sequences) + list(initial_states) + captured))
    results = results if isinstance(results, tuple) else (results,)
    n_out = len(step_outs)
    return list(results[:n_out]), list(results[n_out:n_out + len(state_ph)])
