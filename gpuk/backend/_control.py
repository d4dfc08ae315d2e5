"""Control flow: switch, train/test phase selection, rnn, map_fn, foldl, foldr."""
import numpy as np

from gpuk import graph
from gpuk.graph import Placeholder, Tensor, as_tensor
from gpuk.ops import elementwise as ew
from gpuk.ops import shape as shape_ops
from gpuk.ops.scan import LastStep, scan

__all__ = ['switch', 'in_train_phase', 'in_test_phase', 'rnn', 'map_fn', 'foldl', 'foldr']


def _value(expression):
    return expression() if callable(expression) else expression


def switch(condition, then_expression, else_expression):
    """Selects ``then_expression`` where ``condition`` holds, else ``else_expression``.

    A scalar condition picks one whole expression; a condition of lower rank than the
    expressions is expanded with trailing axes (like Keras's tensorflow backend).
    """
    then_t = as_tensor(_value(then_expression))
    else_t = as_tensor(_value(else_expression), then_t.dtype)
    if isinstance(condition, (bool, int, float, np.bool_, np.number)):  # a fixed choice
        return then_t if bool(condition) else else_t
    condition = ew.cast(as_tensor(condition), 'bool')  # refuses None, strings, objects
    cond_ndim, expr_ndim = condition.ndim, then_t.ndim
    if cond_ndim is not None and expr_ndim is not None:
        if cond_ndim > expr_ndim:
            raise ValueError('switch: rank of condition (%d) must not exceed the rank of the expressions (%d)'
                             % (cond_ndim, expr_ndim))
        for _ in range(expr_ndim - cond_ndim):
            condition = shape_ops.expand_dims(condition, -1)
    return ew.where(condition, then_t, else_t)


def in_train_phase(x, alt, training=None):
    """``x`` in the training phase, ``alt`` otherwise (``training`` defaults to the learning phase)."""
    return _in_phase(x, alt, training, 'in_train_phase')


def in_test_phase(x, alt, training=None):
    """``x`` in the test phase, ``alt`` otherwise."""
    return _in_phase(alt, x, training, 'in_test_phase')


def _in_phase(x, alt, training, where):
    from gpuk.backend._core import learning_phase
    uses_learning_phase = training is None
    if training is None:
        training = learning_phase()
    if not isinstance(training, Tensor):  # a fixed phase (Python int or bool)
        if not isinstance(training, (bool, int, np.bool_, np.integer)):
            raise TypeError('%s: training must be None, a bool, 0 or 1, or a tensor, got %r' % (where, training))
        return _value(x) if training else _value(alt)
    out = switch(training, x, alt)
    if uses_learning_phase:
        out._uses_learning_phase = True
    return out


def _step_placeholder(tensor, drop_leading, name):
    shape = tensor.shape[1:] if drop_leading else tensor.shape
    return Placeholder(shape, tensor.dtype, name=name)


def _expand_mask(mask_t, like):
    """(batch,) bool mask reshaped to broadcast against ``like`` (batch, ...)."""
    for _ in range((like.ndim or 1) - 1):
        mask_t = shape_ops.expand_dims(mask_t, -1)
    return mask_t


def _time_major(x):
    return shape_ops.transpose(x, (1, 0) + tuple(range(2, x.ndim)))


def rnn(step_function, inputs, initial_states, go_backwards=False, mask=None, constants=None,
        unroll=False, input_length=None):
    """Iterates ``step_function`` over the time axis of ``inputs``.

    # Arguments
        step_function: ``(input_t, states + constants) -> (output_t, new_states)``.
        inputs: tensor (samples, time, ...).
        initial_states: list of tensors (samples, ...).
        go_backwards: iterate from the last step to the first (outputs come reversed).
        mask: optional (samples, time) tensor; masked steps keep the previous output and states.
        constants: list of tensors passed to every step.
        unroll: build one graph copy per step (needs a static time dimension).
        input_length: the static number of steps, if known.
    # Returns
        (last_output, outputs (samples, time, ...), new_states)
    """
    inputs = as_tensor(inputs)
    if inputs.ndim is None or inputs.ndim < 3:
        raise ValueError('rnn: inputs must have at least 3 dims (samples, time, ...), got shape %s' % (inputs.shape,))
    if inputs.shape[1] == 0:   # as in TensorFlow's backend: no step, no last output
        raise ValueError('rnn: inputs must have at least one time step, got shape %s' % (inputs.shape,))
    initial_states = [as_tensor(s) for s in _tensor_list(initial_states, 'initial_states')]
    constants = _tensor_list(constants, 'constants')
    if mask is not None:
        if not initial_states:
            raise ValueError('rnn: a mask needs at least one state')
        mask = ew.cast(mask, 'bool')
        if mask.ndim == 3:
            mask = shape_ops.squeeze(mask, -1)
        if mask.ndim != 2:
            raise ValueError('rnn: mask must be (samples, time), got shape %s' % (mask.shape,))
        if None not in (mask.shape[1], inputs.shape[1]) and mask.shape[1] != inputs.shape[1]:
            raise ValueError('rnn: mask has %d time steps, inputs have %d (mask shape %s, inputs shape %s)'
                             % (mask.shape[1], inputs.shape[1], mask.shape, inputs.shape))
    if unroll:
        return _rnn_unrolled(step_function, inputs, initial_states, go_backwards, mask, constants)

    x_seq = _time_major(inputs)
    if go_backwards:
        x_seq = x_seq[::-1]
    x_t = _step_placeholder(x_seq, True, 'rnn_input_t')
    states_t = [_step_placeholder(s, False, 'rnn_state_t') for s in initial_states]
    output_t, new_states_t = step_function(x_t, states_t + constants)
    new_states_t = _checked_states(new_states_t, initial_states)
    output_t = as_tensor(output_t)
    sequences = [x_seq]
    seq_ph = [x_t]
    state_ph, init = list(states_t), list(initial_states)
    if mask is not None:
        mask_seq = _time_major(mask)
        if go_backwards:
            mask_seq = mask_seq[::-1]
        mask_t = _step_placeholder(mask_seq, True, 'rnn_mask_t')
        prev_output = Placeholder(output_t.shape, output_t.dtype, name='rnn_prev_output')
        output_t = ew.where(_expand_mask(mask_t, output_t), output_t, prev_output)
        new_states_t = [ew.where(_expand_mask(mask_t, new), new, old) for new, old in zip(new_states_t, states_t)]
        sequences.append(mask_seq)
        seq_ph.append(mask_t)
        state_ph.append(prev_output)
        init.append(_zeros_output_like(output_t, inputs))
        new_states_t = new_states_t + [output_t]
    (outputs,), final = scan((seq_ph, state_ph), ([output_t], new_states_t), sequences, init,
                             where='rnn')
    final = final[:len(initial_states)]
    # a step output that is one of the step's new states (Keras's cells return h, [h, c])
    # has that state's final value as its last: read so, a layer without return_sequences
    # reads no stacked output, and the plan drops it (fusion_scan.prune_scan_outputs): no
    # per-step copy forward, no stacked zero gradient added per step backward
    same_state = [k for k, s in enumerate(new_states_t) if s is output_t] if mask is None else []
    last_output = final[same_state[0]] if same_state else graph.apply(LastStep(outputs.ndim, 'rnn'), outputs)
    outputs = _time_major(outputs)
    _mark_learning_phase(last_output, outputs)
    return last_output, outputs, final


def _checked_states(new_states, states):
    """The step's new states as tensors, as many as the states it was given, each of its
    state's shape where both are known."""
    if not isinstance(new_states, (list, tuple)):
        raise TypeError('rnn: step_function must return (output, list of new states), got new '
                        'states %r' % (new_states,))
    if len(new_states) != len(states):
        raise ValueError('rnn: step_function returned %d new states for the %d initial states'
                         % (len(new_states), len(states)))
    new_states = [as_tensor(s) for s in new_states]
    for i, (new, old) in enumerate(zip(new_states, states)):
        if new.shape is not None and old.shape is not None and (len(new.shape) != len(old.shape) or any(
                a is not None and b is not None and a != b for a, b in zip(new.shape, old.shape))):
            raise ValueError('rnn: step_function returned new state %d of shape %s for a state of '
                             'shape %s' % (i, new.shape, old.shape))
    return new_states


def _sequence(elems, where):
    """``elems`` as a tensor with at least one axis (the one iterated over)."""
    elems = as_tensor(elems)
    if elems.ndim == 0:
        raise ValueError('%s: elems must have at least one axis to iterate over, got a scalar' % where)
    return elems


def _zeros_output_like(output_t, inputs):
    """Zeros of the step output's shape, with the batch size of ``inputs`` (the initial
    'previous output' masked steps fall back to)."""
    dims = [shape_ops.shape(inputs)[0]] + [
        d if d is not None else None for d in output_t.shape[1:]]
    if None in dims[1:]:
        raise ValueError('rnn: with a mask, the step output needs a static shape beyond the batch, got %s'
                         % (output_t.shape,))
    return shape_ops.fill_shape(dims, 0, output_t.dtype)


def _mark_learning_phase(*tensors):
    from gpuk.backend._core import _session
    phase = _session['learning_phase']
    if phase is None:
        return
    if any(leaf is phase for leaf in graph.leaves(list(tensors))):
        for t in tensors:
            t._uses_learning_phase = True


def _tensor_list(values, argument):
    """rnn's list arguments (None: empty): a tensor alone is not a list."""
    if values is None:
        return []
    if isinstance(values, Tensor) or not isinstance(values, (list, tuple)):
        raise TypeError('rnn: %s must be a list of tensors, got %r' % (argument, values))
    return list(values)


def _rnn_unrolled(step_function, inputs, states, go_backwards, mask, constants):
    steps = inputs.shape[1]
    if steps is None:
        raise ValueError('rnn: unroll=True needs a static number of time steps, got input shape %s'
                         % (inputs.shape,))
    order = range(steps - 1, -1, -1) if go_backwards else range(steps)
    outputs, prev_output = [], None
    for t in order:
        output, new_states = step_function(inputs[:, t], list(states) + constants)
        output = as_tensor(output)
        new_states = _checked_states(new_states, states)
        if mask is not None:
            mask_t = mask[:, t]
            if prev_output is None:
                prev_output = ew.zeros_like(output)
            output = ew.where(_expand_mask(mask_t, output), output, prev_output)
            new_states = [ew.where(_expand_mask(mask_t, n), n, o) for n, o in zip(new_states, states)]
            prev_output = output
        outputs.append(output)
        states = new_states
    stacked = shape_ops.concatenate([shape_ops.expand_dims(o, 1) for o in outputs], axis=1)
    _mark_learning_phase(outputs[-1], stacked)
    return outputs[-1], stacked, list(states)


def map_fn(fn, elems, name=None, dtype=None):
    """Applies ``fn`` to each element of ``elems`` along axis 0 and stacks the results."""
    elems = _sequence(elems, 'map_fn')
    x_t = _step_placeholder(elems, True, 'map_fn_elem')
    out_t = as_tensor(fn(x_t))
    if dtype is not None:
        out_t = ew.cast(out_t, dtype)
    (outputs,), _ = scan(([x_t], []), ([out_t], []), [elems], [], where='map_fn')
    _mark_learning_phase(outputs)
    return outputs


def _fold(fn, elems, initializer, reverse, where):
    elems = _sequence(elems, where)
    if initializer is None:
        first = elems[-1] if reverse else elems[0]
        rest = elems[:-1] if reverse else elems[1:]
        acc0, elems = first, rest
    else:
        acc0 = as_tensor(initializer)
    x_t = _step_placeholder(elems, True, where + '_elem')
    acc_t = Placeholder(acc0.shape, acc0.dtype, name=where + '_acc')
    new_acc = ew.cast(as_tensor(fn(acc_t, x_t)), acc0.dtype)
    _, (final,) = scan(([x_t], [acc_t]), ([], [new_acc]), [elems], [acc0], reverse=reverse, where=where)
    _mark_learning_phase(final)
    return final


def foldl(fn, elems, initializer=None, name=None):
    """Reduces ``elems`` along axis 0 with ``fn(acc, x)``, left to right."""
    return _fold(fn, elems, initializer, False, 'foldl')


def foldr(fn, elems, initializer=None, name=None):
    """Reduces ``elems`` along axis 0 with ``fn(acc, x)``, right to left."""
    return _fold(fn, elems, initializer, True, 'foldr')
