"""Plan-time pruning of Scan steps: stacked per-step outputs that nothing in the plan reads
are dropped from the step graph, so the loop does not compute them.

The gradient of a Scan computes, per time step, the gradient of every float sequence it
read: for ``K.rnn`` over a model's input that is d(loss)/d(inputs), a (batch, features) GEMM
per step that a training plan never reads (Keras asks for the weights' gradients only). The
Scan is rebuilt with the step outputs the plan reads (same inputs, states and captured
tensors); its step plan, compiled from the remaining outputs, has no node for the others.
"""
from gpuk.ops.scan import Scan


def prune_scan_outputs(steps, protected):
    """The steps with each Scan's unread stacked outputs removed (see the module docstring)."""
    read = {s for _, ins, _ in steps for s in ins} | set(protected)
    pruned = []
    for op, ins, outs in steps:
        if type(op) is Scan:
            n_out = len(op.step_outputs)
            keep = tuple(i for i in range(n_out) if outs[i] in read)
            if len(keep) < n_out:
                op = _without_outputs(op, keep)
                outs = [outs[i] for i in keep] + list(outs[n_out:])
        pruned.append((op, ins, outs))
    return pruned


def _without_outputs(scan, keep):
    """The Scan computing only the stacked outputs ``keep`` (memoized on the original, so a
    plan compiled again reuses the pruned Scan's compiled step plan)."""
    cache = scan.__dict__.setdefault('_pruned', {})
    if keep not in cache:
        cache[keep] = Scan(scan.seq_inputs, scan.state_inputs, scan.captured_inputs,
                           [scan.step_outputs[i] for i in keep], scan.state_outputs, scan.reverse, scan.where)
    return cache[keep]
