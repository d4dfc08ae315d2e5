"""Plan-time passes over Scan steps.

Merging (``merge_residual_scans``, run on every plan): a Scan's gradient reads the forward
step's values (gate activations, ...) from a ResidualScan, the forward Scan with those values
as more stacked outputs (gpuk/ops/scan.py). A plan holding both the Scan and its
ResidualScan on the same inputs runs the ResidualScan alone in the Scan's place: one forward
loop, and the backward step recomputes nothing of the forward.

Pruning: stacked per-step outputs that nothing in the plan reads are dropped from the step
graph, so the loop does not compute them, and state histories nothing reads are not recorded
(a gradient's weight-gradient accumulators would copy a (time, in, out) history per step).

The gradient of a Scan computes, per time step, the gradient of every float sequence it
read: for ``K.rnn`` over a model's input that is d(loss)/d(inputs), a (batch, features) GEMM
per step that a training plan never reads (Keras asks for the weights' gradients only). The
Scan is rebuilt with the step outputs the plan reads (same inputs, states and captured
tensors); its step plan, compiled from the remaining outputs, has no node for the others.
"""
from gpuk.ops.scan import ResidualScan, Scan


def merge_residual_scans(steps, protected):
    """The steps with each ResidualScan that extends a Scan of the plan (same inputs) run in
    that Scan's place, writing its output slots and the residuals (see the module docstring).
    A ResidualScan may extend another (a second derivative): each merges with the nearest
    Scan of its chain of bases in the plan, one merge at a time."""
    while True:
        merged = _merge_one(steps, protected)
        if merged is None:
            return steps
        steps = merged


def _merge_one(steps, protected):
    position = {(id(op), tuple(ins)): i for i, (op, ins, _) in enumerate(steps) if isinstance(op, Scan)}
    for j, (op, ins, outs) in enumerate(steps):
        base = getattr(op, 'base', None)
        while base is not None and (id(base), tuple(ins)) not in position:
            base = getattr(base, 'base', None)
        if base is None:
            continue
        i = position[(id(base), tuple(ins))]
        n_out = len(base.step_outputs)   # op's step outputs: base's, then the residuals
        n_residual = len(op.step_outputs) - n_out
        base_outs = steps[i][2]
        duplicates = outs[:n_out] + outs[n_out + n_residual:]   # the base's outputs, computed again
        if any(s in protected for s in duplicates):
            continue
        rename = dict(zip(duplicates, base_outs))
        # at the earlier of the two places: the inputs are ready there, and the readers of
        # either Scan's outputs all come after it
        merged = (op, ins, base_outs[:n_out] + outs[n_out:n_out + n_residual] + base_outs[n_out:])
        return [(step_op, [rename.get(s, s) for s in step_ins], step_outs)
                for k, (step_op, step_ins, step_outs) in ((k, merged if k == min(i, j) else step)
                                                          for k, step in enumerate(steps))
                if k != max(i, j)]
    return None


def prune_scan_outputs(steps, protected):
    """The steps with each Scan's unread stacked outputs and state histories removed (see the
    module docstring); an unrecorded history's slot holds None, which nothing reads."""
    read = {s for _, ins, _ in steps for s in ins} | set(protected)
    pruned = []
    for op, ins, outs in steps:
        if isinstance(op, Scan):
            n_out, n_state = len(op.step_outputs), len(op.state_inputs)
            keep = tuple(i for i in range(n_out) if outs[i] in read)
            history = tuple(i for i in range(n_state) if outs[n_out + n_state + i] in read)
            if len(keep) < n_out or history != op.recorded_history:
                op = _without_outputs(op, keep, history)
                outs = [outs[i] for i in keep] + list(outs[n_out:])
        pruned.append((op, ins, outs))
    return pruned


def _without_outputs(scan, keep, history):
    """The Scan computing only the stacked outputs ``keep`` and the histories of the states
    ``history`` (memoized on the original, so a plan compiled again reuses the pruned Scan's
    compiled step plan)."""
    cache = scan.__dict__.setdefault('_pruned', {})
    if (keep, history) not in cache:
        cache[keep, history] = Scan(
            scan.seq_inputs, scan.state_inputs, scan.captured_inputs, [scan.step_outputs[i] for i in keep],
            scan.state_outputs, scan.reverse, scan.where,
            [k for k, i in enumerate(keep) if i in scan.shape_only_outputs], history)
    return cache[keep, history]
