"""K.function: a graph compiled into a flat execution plan.

The plan is made once per function: nodes in topological order, each tensor given a slot,
constant subgraphs folded, chains fused (gpuk/fusion.py), the precision policy applied to the
tensor-core steps (gpuk/mixed_precision.py), every slot freed after its last use. Running it
feeds the placeholders, reads the variables, executes the plan, copies the outputs to the host
and reads the ops' device-side value checks with them (runtime/deferred.py: no host sync inside
the step; a failed check raises before any update), then applies the updates, all of whose new
values are computed (from the old values) before any is assigned; under loss scaling
(gpuk/loss_scaling.py) none is applied when a scaled gradient is not finite.

Per input signature (shapes and dtypes): the first run checks every launch, later runs skip
the per-call argument checks (runtime.prepared_launches), and on the CUDA runtime a signature
called again replays a captured CUDA Graph (gpuk/cuda_graph.py) instead of running the plan.
"""
import collections
import functools
import itertools
import operator

import numpy as np

from gpuk import config, cuda_graph, device, fusion, fusion_gradients, fusion_scan, loss_scaling, mixed_precision
from gpuk.kernels import runtime
from gpuk.kernels.runtime import counters, deferred, prepared
from gpuk.graph import (Constant, Placeholder, Tensor, Variable, checked_array, static_value,
                        topological_nodes)
from gpuk.ops import scan
from gpuk.ops.shape import Shape, Size


class Update:
    """What K.update returns: assign ``value`` to ``variable`` when a function runs it."""

    def __init__(self, variable, value):
        self.variable = variable
        self.value = value


def check_update_value(variable, value, where):
    """Raises when tensor ``value`` cannot be assigned to ``variable`` by its static dtype or
    shape: floats into an int or bool variable would be truncated (TensorFlow refuses them),
    and a value that only broadcasts to another shape would fail when the update runs."""
    if np.dtype(variable.dtype).kind in 'biu' and np.dtype(value.dtype).kind == 'f':
        raise TypeError('%s: the new value of variable %r has dtype %s, which its dtype %s cannot '
                        'hold; cast it (K.cast, K.round) first' % (where, variable.name, value.dtype,
                                                                    variable.dtype))
    shape = value.shape
    if shape is not None and (len(shape) != len(variable.shape) or any(
            d is not None and d != e for d, e in zip(shape, variable.shape))):
        raise ValueError('%s: the new value of shape %s does not fit variable %r of shape %s'
                         % (where, shape, variable.name, variable.shape))


def normalize_update(update, where='function'):
    if isinstance(update, Update):
        return update.variable, update.value
    if isinstance(update, (tuple, list)) and len(update) == 2:
        variable, value = update
        if not isinstance(variable, Variable):
            raise TypeError('%s: updates must assign to variables, got %r' % (where, variable))
        from gpuk.graph import as_tensor
        value = as_tensor(value, variable.dtype)
        check_update_value(variable, value, where)
        return variable, value
    raise TypeError('%s: each update must be K.update(...) or a (variable, value) tuple, got %r'
                    % (where, update))


def _input_array(placeholder, value):
    """``value`` with the placeholder's dtype, checked against its static shape: a device array
    stays one, anything else becomes a NumPy array (K.function copies it to the device, or
    straight into a replayed CUDA Graph's input buffer)."""
    if hasattr(value, 'toarray') and hasattr(value, 'tocoo'):  # scipy.sparse input
        value = value.toarray()
    xp = device.xp()
    if xp is not np and isinstance(value, xp.ndarray):   # already on the device
        array = xp.asarray(value, dtype=placeholder.dtype)
    elif isinstance(value, np.ndarray) and value.dtype == placeholder.dtype:
        array = value
    else:
        array = checked_array(value, placeholder.dtype, 'function', 'input %r' % placeholder.name)
    shape = placeholder.shape
    if shape is not None and (array.ndim != len(shape) or any(
            d is not None and d != a for d, a in zip(shape, array.shape))):
        raise ValueError('function: input %r expects shape %s, got %s'
                         % (placeholder.name, shape, tuple(array.shape)))
    return array


def _constant_value(constant, impl):
    cached = constant._device_value
    if cached is None or cached[0] is not impl:
        constant._device_value = cached = (impl, device.to_device(constant.value))
    return cached[1]


class Plan:
    """Instructions ``(forward, input_slots, output_slots, slots_to_free)`` over a slot list.

    ``inputs`` are the tensors fed at run time: placeholders, or any tensors (a scan's step
    graph is fed its per-step slices this way); the graph is not followed past them.
    """

    def __init__(self, inputs, targets, impl):
        self.impl = impl
        self.precision = config.precision()
        self.checked_shapes = set()   # input (shape, dtype)s whose launches passed their checks
        nodes = topological_nodes(targets, stop_at=set(inputs))
        slot_of = {}

        def slot(t):
            if t not in slot_of:
                slot_of[t] = len(slot_of)
            return slot_of[t]

        self.input_slots = [slot(t) for t in inputs]
        self.variables, self.fixed = [], []
        # The leaves: the graph's, then the targets returned directly (a variable or constant).
        for t in itertools.chain((t for node in nodes for t in node.inputs), targets):
            if t.node is not None or t in slot_of:
                continue
            if isinstance(t, Variable):
                self.variables.append((slot(t), t))
            elif isinstance(t, Constant):
                self.fixed.append((slot(t), _constant_value(t, impl)))
            else:  # a placeholder not fed: its default value, or an error
                self._feed_default(t, slot(t))
        self.target_slots = [slot(t) for t in targets]
        self.steps = [(node.op, [slot(t) for t in node.inputs], [slot(t) for t in node.outputs])
                      for node in nodes]
        # the K call that built each slot's node, for run-time errors (fusion keeps out slots)
        self._k_call_of = {slot_of[t]: node.k_call for node in nodes for t in node.outputs
                           if node.k_call is not None}
        self._slot_of = slot_of
        self.n_slots = len(slot_of)
        self.slot_dtypes = {s: t.dtype for t, s in slot_of.items()}
        self._fold_constants(nodes)
        # one forward loop for a Scan and its gradient's residuals, fused or not
        self.steps = fusion_scan.merge_residual_scans(self.steps, set(self.target_slots) | set(self.input_slots))
        if fusion.enabled():
            shapes = {s: t.shape for t, s in slot_of.items()}
            # a target that is an identity broadcast is its source's slot; fuse drops the step
            sources = fusion_gradients.identity_sources(self.steps, shapes)
            self.target_slots = [sources.get(s, s) for s in self.target_slots]
            # elementwise groups within one generated kernel's limits where kernels run them
            self.steps = fusion.fuse(self.steps, set(self.target_slots) | set(self.input_slots), shapes,
                                     kernel_limits=getattr(impl, 'kind', None) != 'cpu', slot_dtypes=self.slot_dtypes)
        self.steps = mixed_precision.apply_policy(self.steps, self.slot_dtypes, self.precision)
        self._plan_frees()
        self._env_template = [None] * self.n_slots   # the folded constants in place (_initial_env)
        for slot, value in self.fixed:
            self._env_template[slot] = value
        self._targets = _gather(self.target_slots)
        self._inputs_leading = self.input_slots == list(range(len(self.input_slots)))
        # CUDA Graph capture and replay per input signature (gpuk/cuda_graph.py)
        self.graphs = cuda_graph.PlanGraphs(self) if cuda_graph.supported(impl) else None

    def _feed_default(self, placeholder, slot):
        if slot in self.input_slots:
            return
        default = getattr(placeholder, 'default_value', None)
        if default is None:
            raise ValueError('function: placeholder %r is needed but is not among the inputs'
                             % placeholder.name)
        self.fixed.append((slot, device.to_device(default, placeholder.dtype)))

    def _fold_constants(self, nodes):
        """Runs now the steps whose inputs are all constants, and takes the graph's static
        values (e.g. K.shape of a tensor whose dims are all known); their outputs become fixed."""
        known = {slot: value for slot, value in self.fixed}
        remaining = []
        for node, (op, ins, outs) in zip(nodes, self.steps):
            try:
                values = self._folded(node, op, ins, known)
            except Exception as error:
                failed = self._fold_failure(node, error, [known.get(s) for s in ins], known)
                if failed is None:
                    raise
                raise failed from error
            if values is None:
                remaining.append((op, ins, outs))
            else:
                known.update(zip(outs, values))
        needed = {s for _, ins, _ in remaining for s in ins} | set(self.target_slots)
        self.fixed = [(s, v) for s, v in known.items() if s in needed]
        self.steps = remaining

    def _folded(self, node, op, ins, known):
        """The output values of ``node`` (``op`` reading slots ``ins``) when its inputs are all
        constants or its outputs have static values, else None."""
        static = [static_value(t) for t in node.outputs] if op.foldable else [None]
        if op.foldable and all(s in known for s in ins):
            values = op.forward(self.impl, *[known[s] for s in ins])
            return values if isinstance(values, tuple) else (values,)
        if all(v is not None for v in static):
            return tuple(self.impl.xp.asarray(v) for v in static)
        return None

    def _fold_failure(self, node, error, arrays, known):
        """What _step_failure gives for ``error``, raised by ``node``'s op given ``arrays`` while
        its constant inputs were being folded: named after the K call that built the node (the
        values of that call's arguments, constants too, are in ``known``)."""
        call = node.k_call
        name = _error_name(call, getattr(node.op, 'name', type(node.op).__name__))
        if device.out_of_memory(error):
            return _named_out_of_memory(name, error, arrays)
        if not isinstance(error, (ValueError, TypeError, IndexError)):
            return None
        slots = [self._slot_of.get(t) for t in call.args] if call is not None and call.args else []
        values = [known.get(s) for s in slots]
        shapes = ([tuple(v.shape) for v in values] if values and all(hasattr(v, 'shape') for v in values) else
                  [tuple(a.shape) if hasattr(a, 'shape') else a for a in arrays])
        return _at_run_time(error, _named_message(name, error), shapes)

    def _plan_frees(self):
        keep = set(self.target_slots)
        last_use = {}
        for i, (_, ins, _) in enumerate(self.steps):
            for s in ins:
                last_use[s] = i
        frees = [[] for _ in self.steps]
        for s, i in last_use.items():
            if s not in keep:
                frees[i].append(s)
        self.step_calls = [next((self._k_call_of[s] for s in outs if s in self._k_call_of), None)
                           for _, _, outs in self.steps]
        self.step_op_names = [getattr(op, 'name', type(op).__name__) for op, _, _ in self.steps]
        self._repeats_layouts = _layouts_repeat(self.steps, {s for s, _ in self.fixed})
        self._layouts = None   # (the inputs' and variables' layouts, their LayoutToken) of the last run
        # the fed inputs and variables that steps read: one only returned (or, in a scan's
        # gradient step plan, a sequence slice the step does not read and is fed None for)
        # makes no step's layout
        read = {s for _, ins, _ in self.steps for s in ins}
        self._layout_slots = _gather([s for s in self.input_slots + [s for s, _ in self.variables] if s in read])
        self._step_kepts = _sole_kepts([getattr(op, 'kept', None) for op, _, _ in self.steps])
        self._kept_steps = None   # (LayoutToken, prepared.kept_state(), steps calling kept runners)
        self.steps = [(op.forward, ins, outs, frees[i]) for i, (op, ins, outs) in enumerate(self.steps)]
        self._bound_steps = [_bound_step(self.impl, *step) for step in self.steps]

    def _initial_env(self, fed_arrays):
        """Slot values before the first step: folded constants, variables and the fed inputs
        (the constants' slots are filled once, in a template copied per run: a scan runs its
        step plan once per time step)."""
        env = self._env_template[:]
        for slot, variable in self.variables:
            env[slot] = variable.value
        if self._inputs_leading and len(fed_arrays) == len(self.input_slots):
            env[:len(fed_arrays)] = fed_arrays   # the inputs hold the first slots, in order: one C call
        else:
            for slot, value in zip(self.input_slots, fed_arrays):
                env[slot] = value
        return env

    def _layout_token(self, env):
        """The LayoutToken of this run (runtime/prepared.py): the last run's when the inputs and
        variables have the layouts they had then, a new one when not, None when this plan's
        layouts need not repeat (a shape read from a value that is not a constant)."""
        if not self._repeats_layouts:
            return None
        try:
            layouts = [*map(prepared.LAYOUT, self._layout_slots(env))]
        except AttributeError:   # a value that is not an array
            return None
        last = self._layouts
        if last is not None and last[0] == layouts:
            return last[1]
        token = prepared.LayoutToken()
        self._layouts = (layouts, token)
        return token

    def run(self, fed_arrays):
        env = self._initial_env(fed_arrays)
        token = self._layout_token(env)
        previous = prepared.enter_run(token)
        try:
            steps = self._steps_of_run(token)
            values = self._run(env, fed_arrays, steps)
            if steps is self._bound_steps:
                self._resolve_kept_runners(token)
            return values
        finally:
            prepared.leave_run(previous)

    def _steps_of_run(self, token):
        """The bound steps, or in a run of a token whose earlier run they were made from, the
        steps calling their op's kept runner in place of its forward (_resolve_kept_runners).
        Kept steps no later run can use are dropped, as their runners hold step buffers (after
        an allocation failure, prepared.release_kept leaves these the only holders): those of
        another token (one whose layouts changed never comes back) or of an older generation
        of kept runners (not of a run under GPUK_CHECK_LAUNCHES=1, whose state is None)."""
        kept = self._kept_steps
        if kept is not None:
            state = prepared.kept_state()
            if kept[0] is token and kept[1] == state:
                return kept[2]
            if kept[0] is not token or state is not None:
                self._kept_steps = None
        return self._bound_steps

    def _resolve_kept_runners(self, token):
        """After a run of ``token`` through the ops' forwards, from its second run on (the first
        may have compared and made runners): each step whose op's Kept called a runner once in
        it calls that runner itself in the next runs of the token (its arrays have the layouts
        the runner was kept for: prepared.LayoutToken), one Python frame and the Kept's checks
        fewer per step; the other steps stay as they are. Valid until prepared.clear() or
        forget_kept(), unused under GPUK_CHECK_LAUNCHES=1 (and not made then: its runners
        would be none)."""
        state = prepared.kept_state()
        if token is None or token.runs < 2 or state is None:
            return
        steps = []
        for kept, step in zip(self._step_kepts, self._bound_steps):
            runner = None if kept is None else kept.runner_of_run(self.impl, token)
            steps.append(step if runner is None else (runner, *step[1:]))
        self._kept_steps = (token, state, steps)

    def _run(self, env, fed_arrays, steps):
        counting = counters.active()
        if counting is not None:
            return self._run_counted(env, fed_arrays, counting, steps)
        # each step's slots were resolved when the plan was built (_bound_step): per step one C
        # call gathers its arguments, one stores its result, frees run only where there are any
        for i, (call, arguments, out, outs, frees) in enumerate(steps):
            try:
                result = call(*arguments(env))
            except Exception as error:   # (no cost per step: a try costs only when it catches)
                failed = self._step_failure(i, error, arguments(env), fed_arrays)
                if failed is None:
                    raise
                raise failed from error
            if out is not None:
                env[out] = result
            else:
                for s, value in zip(outs, result):
                    env[s] = value
            if frees:
                for s in frees:
                    env[s] = None
        return list(self._targets(env))

    def _run_counted(self, env, fed_arrays, counting, steps):
        """run() inside counters.counting(): each step timed and its new buffers counted. A loop
        of its own, not a wrapper around each step's call in run()'s: a scan's step plan runs
        once per time step inside the scan step being counted, and whatever Python the counted
        run adds per step outside counting.step (which leaves its own bookkeeping out) would be
        counted and timed as the scan's (bench.host_overhead --calls)."""
        for i, (call, arguments, out, outs, frees) in enumerate(steps):
            args = arguments(env)
            try:
                result = counting.step(call, args, _NewBuffers(len(outs) > 1, args))
            except Exception as error:
                failed = self._step_failure(i, error, args, fed_arrays)
                if failed is None:
                    raise
                raise failed from error
            if out is not None:
                env[out] = result
            else:
                for s, value in zip(outs, result):
                    env[s] = value
            for s in frees:
                env[s] = None
        return list(self._targets(env))

    def _step_failure(self, step, error, arrays, fed_arrays):
        """What a run raises for ``error``, raised by ``step`` given ``arrays``: a _run_error
        for a ValueError, TypeError or IndexError, an OutOfMemoryError for an allocation
        failure (_named_out_of_memory), else None (``error`` itself propagates)."""
        if isinstance(error, (ValueError, TypeError, IndexError)):
            return self._run_error(step, error, arrays, fed_arrays)
        if device.out_of_memory(error):
            return _named_out_of_memory(self._step_name(step), error, arrays)
        return None

    def _step_name(self, step):
        """What a run-time error of ``step`` starts with (_error_name)."""
        return _error_name(self.step_calls[step], self.step_op_names[step])

    def _run_error(self, step, error, arrays, fed_arrays):
        """``error`` (raised by a step at run time, when the shapes are known) naming the K
        function that built the step and the shapes of the tensors that call was given."""
        call, message = self.step_calls[step], _named_message(self._step_name(step), error)
        shapes = self._call_arg_shapes(call, step, fed_arrays) or [
            tuple(a.shape) if hasattr(a, 'shape') else a for a in arrays]
        return _at_run_time(error, message, shapes)

    def _call_arg_shapes(self, call, step, fed_arrays):
        """The run-time shapes of the tensors given to the K call ``call``: the steps before
        ``step`` run again, keeping every value (only when reporting an error)."""
        if call is None or not call.args or any(t not in self._slot_of for t in call.args):
            return None
        env = self._initial_env(fed_arrays)
        previous = prepared.enter_run(None)   # a second call of the same steps in this run
        try:
            for forward, ins, outs, _ in self.steps[:step]:
                result = forward(self.impl, *[env[s] for s in ins])
                for s, value in zip(outs, (result,) if len(outs) == 1 else result):
                    env[s] = value
        except Exception:  # noqa: BLE001 - a report of the first error must not raise another
            return None
        finally:
            prepared.leave_run(previous)
        values = [env[self._slot_of[t]] for t in call.args]
        return None if any(v is None for v in values) else [tuple(v.shape) for v in values]


def _error_name(call, op_name):
    """What a run-time error of a step starts with: the K function that built it (``call``),
    or for a step built by a Python operator on tensors (x + y), 'function: ' and the op."""
    return call.name if call is not None else 'function: %s' % op_name


def _named_message(name, error):
    """``error``'s message with ``name`` in front, unless it starts with it already."""
    message = str(error)
    return message if message.startswith(name + ':') else '%s: %s' % (name, message)


def _named_out_of_memory(name, error, arrays):
    """The OutOfMemoryError of ``error``, an allocation failure of a step named ``name`` given
    ``arrays``; one a scan's step plan raised keeps its message (naming the step inside the
    loop) with ``name`` in front."""
    if not isinstance(error, device.OutOfMemoryError):
        return device.OutOfMemoryError.of(name, error, arrays)
    return device.OutOfMemoryError(_named_message(name, error), error.requested_bytes)


def _at_run_time(error, message, shapes):
    """A ValueError (TypeError for one) of ``message`` and the run-time input ``shapes``."""
    kind = TypeError if isinstance(error, TypeError) else ValueError
    return kind('%s (at run time, on inputs of shapes %s)' % (message, ', '.join(str(s) for s in shapes)))


def _layouts_repeat(steps, fixed_slots):
    """Whether each step's output layouts follow from its input layouts alone: no step reads
    an output shape from the value of an input (Op.shape_from_values; a wrapper's inner op,
    LowPrecision's, counts too) that is not itself a function of layouts: a constant, K.shape
    or K.size of a value, or a pure op on such values (Keras's batch-size reshapes)."""
    from_layouts = set(fixed_slots)
    for op, ins, outs in steps:
        for candidate in (op, getattr(op, 'op', None)):
            positions = getattr(candidate, 'shape_from_values', None)
            if positions is not None and any(s not in from_layouts for s in ins[positions]):
                return False
            if candidate is not None and _step_graph_reads_shape_values(candidate):
                return False
        if isinstance(op, (Shape, Size)) or getattr(op, 'foldable', False) and all(
                s in from_layouts or k in op.shape_only_inputs for k, s in enumerate(ins)):
            from_layouts.update(outs)
    return True


def _step_graph_reads_shape_values(op):
    """Whether a scan's step graph (``op.step_outputs``...) has a step reading an output shape
    from a value that is not a constant (its stacked outputs' layouts need not repeat then)."""
    outputs = list(getattr(op, 'step_outputs', ())) + list(getattr(op, 'state_outputs', ()))
    if not outputs:
        return False
    given = set(op.seq_inputs) | set(op.state_inputs) | set(op.captured_inputs)
    for node in topological_nodes(outputs, stop_at=given):
        if any(not isinstance(t, Constant) for t in node.inputs[node.op.shape_from_values]):
            return True
        if _step_graph_reads_shape_values(node.op):
            return True
    return False


def _bound_step(impl, forward, ins, outs, frees):
    """(call, arguments, out, outs, frees): one plan step with its slots resolved for Plan.run.
    ``call(*arguments(env))`` is ``forward(impl, ...)`` (a partial: no Python frame of its own);
    ``arguments(env)`` gathers the step's argument values in one C call (an itemgetter; a slice
    for fewer than two, as itemgetter of one index returns the bare value); ``out`` is the one
    output slot, or None when the step returns a tuple for ``outs``; ``frees`` the slots whose
    last reader this step is (a tuple, empty when none)."""
    return (functools.partial(forward, impl), _gather(ins), outs[0] if len(outs) == 1 else None, tuple(outs),
            tuple(frees))


def _sole_kepts(kepts):
    """Each step's prepared.Kept (Op.kept; None for a plan-only wrapper, which is no Op), or
    None where the op is in several steps: one Kept at two call sites keeps one runner, made for
    the layouts of whichever called it last, so neither may call it directly."""
    uses = collections.Counter(id(kept) for kept in kepts)
    return [kept if kept is not None and uses[id(kept)] == 1 else None for kept in kepts]


def _gather(slots):
    """``gather(env)``: the values of ``slots`` as a sequence, in one C call (an itemgetter; a
    slice for fewer than two slots, as an itemgetter of one index returns the bare value)."""
    if len(slots) > 1:
        return operator.itemgetter(*slots)
    if slots:
        return operator.itemgetter(slice(slots[0], slots[0] + 1))
    return operator.itemgetter(slice(0, 0))


class _NewBuffers:
    """count_allocations for counters.step: the new buffers among a step's result."""
    __slots__ = ('several', 'inputs')

    def __init__(self, several, inputs):
        self.several, self.inputs = several, inputs

    def __call__(self, result):
        return counters.new_buffers(result if self.several else (result,), self.inputs)


def control_updates(targets, updated_variables):
    """The updates that nodes computing ``targets`` read under K.control_dependencies
    (Node.control_updates), for variables not in ``updated_variables``: as TensorFlow runs an
    update op before the ops made inside ``control_dependencies([update])``, a function
    computing such a node applies the update (Keras 2.3.1's metrics: ``K.eval(metric(y))``
    accumulates, metrics.py:80-82). The first update found for a variable is kept."""
    found, seen = [], set(updated_variables)
    for node in topological_nodes(targets):
        for variable, value in node.control_updates:
            if variable not in seen:
                seen.add(variable)
                found.append((variable, value))
    return found


class Function:
    """A compiled graph: call it with a list of input values, get a list of NumPy arrays."""

    def __init__(self, inputs, outputs, updates=None, name=None):
        if not isinstance(inputs, (list, tuple)):
            raise TypeError('function: inputs must be a list of placeholders, got %r' % (inputs,))
        for x in inputs:
            if not isinstance(x, Placeholder):
                raise TypeError('function: inputs must be placeholders, got %r' % (x,))
        self.single_output = not isinstance(outputs, (list, tuple))
        outputs = [outputs] if self.single_output else list(outputs)
        for y in outputs:
            if not isinstance(y, Tensor):
                raise TypeError('function: outputs must be tensors, got %r' % (y,))
        self.inputs = list(inputs)
        self.outputs = outputs
        if updates is not None and not isinstance(updates, (list, tuple)):   # a lone Update, a dict
            raise TypeError('function: updates must be a list of K.update(...) results or (variable, '
                            'value) tuples, got %s' % (type(updates).__name__,))
        self.updates = [normalize_update(u) for u in (updates or [])]
        self.updates += control_updates(self.outputs + [value for _, value in self.updates],
                                        {variable for variable, _ in self.updates})
        self.name = name
        # mixed_float16: a step whose updates read loss-scaled gradients is skipped when one
        # is not finite (gpuk/loss_scaling.py); its finite flag is the plan's last target
        self._guard = loss_scaling.step_guard([value for _, value in self.updates])
        self._plan = None
        self._fed_tensors = None   # (tensors, Function computing them): _symbolic_values

    def _symbolic_values(self, inputs):
        """``inputs`` with each gpuk tensor among them replaced by its value. TensorFlow's
        Function computes a symbolic tensor fed to an input within the same run
        (tensorflow_backend.py, Function._call: 'feeding symbolic tensor'), so Keras 2.3.1's
        fit / evaluate / predict / train_on_batch take K.variable or K.constant data; here the
        tensors are computed first, by one function kept for the last set of them."""
        tensors = [v for v in inputs if isinstance(v, Tensor)]
        if not tensors:
            return inputs
        for placeholder, value in zip(self.inputs, inputs):
            if isinstance(value, Placeholder):
                raise TypeError('function: input %r was fed placeholder %r, which has no value; '
                                'feed an array or a tensor computed from variables and constants'
                                % (placeholder.name, value.name))
        cached = self._fed_tensors
        if cached is None or len(cached[0]) != len(tensors) or any(a is not b for a, b in zip(cached[0], tensors)):
            self._fed_tensors = cached = (tensors, Function([], tensors))
        values = iter(cached[1]([]))
        return [next(values) if isinstance(v, Tensor) else v for v in inputs]

    def _compiled(self):
        impl = device.impl()
        if self._plan is None or self._plan.impl is not impl or self._plan.precision != config.precision():
            targets = self.outputs + [value for _, value in self.updates]
            targets += [self._guard.finite] if self._guard is not None else []
            self._plan = Plan(self.inputs, targets, impl)
        return self._plan

    @staticmethod
    def _run_plan(plan, fed):
        """Runs the plan; a run for input shapes and dtypes it already ran with skips the
        launches' per-call checks (they passed for these shapes: same kernels, dims and
        argument types; GPUK_CHECK_LAUNCHES=1 keeps them)."""
        shapes = tuple((a.shape, a.dtype) for a in fed)
        checked = shapes in plan.checked_shapes
        with runtime.prepared_launches(checked):
            values = plan.run(fed)
        plan.checked_shapes.add(shapes)
        return values

    def __call__(self, inputs):
        if isinstance(inputs, dict):
            missing = [x.name for x in self.inputs if x not in inputs]
            if missing:
                others = [k for k in inputs if not isinstance(k, Tensor)]
                raise ValueError('function: the input dict has no value for placeholder(s) %s%s'
                                 % (', '.join(repr(name) for name in missing),
                                    ' (its keys must be the placeholders themselves, got %r)' % (others[0],)
                                    if others else ''))
            inputs = [inputs[x] for x in self.inputs]
        if not isinstance(inputs, (list, tuple)) or len(inputs) != len(self.inputs):
            raise ValueError('function: expected a list of %d input values (one per placeholder), got %s'
                             % (len(self.inputs), type(inputs).__name__ if not isinstance(inputs, (list, tuple))
                                else 'a %s of %d' % (type(inputs).__name__, len(inputs))))
        inputs = self._symbolic_values(inputs)
        kept_buffers = prepared.keeps_step_buffers()
        replayed_graphs = []   # (_step's: a replay wrote the variables)
        try:
            return self._checked_step(inputs, replayed_graphs)
        except device.OutOfMemoryError:
            # release_memory stopped keeping step buffers (prepared.stop_keeping_buffers): a call
            # that ran with them runs once more without, with only the memory pool's reuse, which
            # lets values never alive together share blocks. The failed call changed no variable,
            # unless a replayed graph wrote them before the failure (its outputs' host copies):
            # that one is not run again, which would apply its updates twice.
            if replayed_graphs or not kept_buffers or prepared.keeps_step_buffers():
                raise
        return self._checked_step(inputs, [])

    def _checked_step(self, inputs, replayed_graphs):
        """``_step`` on ``inputs`` made device arrays; an allocation failure raises
        gpuk.OutOfMemoryError after releasing the call's memory (device.release_memory) and
        dropping the call's deferred value checks unread (as device.run_deferring does for a
        plain run's steps): a replayed graph's combined check, pending from the replay until the
        outputs' host copies, must not be read by the next call."""
        arrays = None
        try:
            arrays = [_input_array(p, v) for p, v in zip(self.inputs, inputs)]
            return self._step(arrays, replayed_graphs)
        except device.OutOfMemoryError as error:   # a plan step's, named after its K function
            deferred.discard()
            device.release_memory(error)
            raise
        except Exception as error:   # outside the steps: an input's cast, its copy in, the outputs'
            if not device.out_of_memory(error):   # host copies, an update's cast
                raise
            deferred.discard()
            failed = device.OutOfMemoryError.of(self.name or 'function', error, inputs if arrays is None else arrays,
                                                replayed=bool(replayed_graphs))
            device.release_memory(error)
            raise failed from error

    def _step(self, arrays, replayed_graphs):
        """Runs the plan on ``arrays`` (the checked inputs) and commits the updates; returns
        the outputs on the host. A replayed graph (which applies the updates itself) is appended
        to ``replayed_graphs`` before anything else may fail."""
        counting = counters.active()
        syncs_before = counting.host_syncs if counting is not None else 0
        plan = self._compiled()
        n_out = len(self.outputs)

        def run_plain(arrays):   # the ops' deferred argument checks stay pending (read below)
            return device.run_deferring(self._run_plan, plan, [device.to_device(a) for a in arrays])

        if plan.graphs is not None and self._guard is None and cuda_graph.enabled():
            updates = [(variable, n_out + i) for i, (variable, _) in enumerate(self.updates)]
            values, replayed = plan.graphs.run(cuda_graph.signature(arrays), arrays, updates, run_plain)
            if replayed:
                replayed_graphs.append(plan.graphs)
        else:
            values, replayed = run_plain(arrays), False
        try:
            finite = self._guard.read_finite(values.pop()) if self._guard is not None else True
        except BaseException:
            deferred.discard()
            raise
        if counting is not None:   # the step proper: everything before the outputs go to the host
            counting.in_step_syncs += counting.host_syncs - syncs_before
        results = [_host_copy(v) for v in values[:n_out]]
        # The ops' device-side value checks, read where the outputs are (no sync inside the
        # step) and before any update is committed: a failed check changes no variable (a
        # replayed graph masked its in-place update copies with the same flags).
        deferred.raise_pending()
        # a replayed graph wrote the updates into the variables' buffers itself
        new_values = values[n_out:] if finite and not replayed else []
        for (variable, _), value in zip(self.updates, new_values):
            if tuple(value.shape) != variable.shape:
                raise ValueError('function: update of %r has shape %s, variable has %s'
                                 % (variable.name, tuple(value.shape), variable.shape))
        # every new value made (a cast or a copy allocates, and may fail) before any is assigned
        staged = []
        for (variable, _), value in zip(self.updates, new_values):
            value = value.astype(variable.dtype, copy=False)
            if isinstance(value, np.ndarray) and any(np.may_share_memory(value, a) for a in arrays):
                value = value.copy()  # a fed array: the caller may change it later
            elif cuda_graph.owns(value):
                value = value.copy()  # a captured graph's variable buffer, which its replays write
            staged.append(value)
        # and the loss scales' (their device values allocate too): an allocation failure up to
        # here changed nothing, so Function.__call__ may run the call again
        scales = self._guard.next_states(finite) if self._guard is not None else None
        for (variable, _), value in zip(self.updates, staged):
            variable.value = value
        if self._guard is not None:
            self._guard.step_finished(scales)
        return results


def _host_copy(array):
    """A NumPy array the caller may modify without touching gpuk's state (a variable's
    value, a constant or a view of one)."""
    if isinstance(array, np.ndarray) or np.isscalar(array):
        if device.xp() is not np and isinstance(array, device.xp().ndarray):
            counters.host_sync()   # the GPU rehearsal's device arrays are NumPy's
        return np.array(array, copy=True)
    return device.to_host(array)


scan.register_plan_class(Plan)   # Scan nodes compile their step graphs with Plan
