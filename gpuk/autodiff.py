"""Symbolic reverse-mode differentiation: gradients are graph nodes, so they can be
differentiated again and compiled like any other graph."""
from gpuk.graph import Tensor, topological_nodes


def _depends_on(nodes, targets):
    """The set of tensor ids that depend on any tensor in ``targets`` (the targets included)."""
    dependent = {id(t) for t in targets}
    for node in nodes:
        if any(id(t) in dependent for t in node.inputs):
            dependent.update(id(t) for t in node.outputs)
    return dependent


def _accumulate(grads, tensor, g):
    previous = grads.get(tensor)
    grads[tensor] = g if previous is None else previous + g


def gradients(loss, variables):
    """Gradients of ``loss`` with respect to each tensor of ``variables``.

    A non-scalar loss is summed (like TensorFlow). Returns a list with one tensor per
    variable, or None where the loss does not depend on it (or only through integer ops).
    """
    from gpuk.ops.elementwise import ones_like
    if not isinstance(loss, Tensor):
        raise TypeError('gradients: loss must be a tensor, got %r' % (loss,))
    return vector_jacobian_products([loss], [ones_like(loss)], variables, 'gradients')


def vector_jacobian_products(outputs, output_grads, variables, where='vector_jacobian_products'):
    """sum over i of output_grads[i] . d outputs[i] / d v, for each tensor v of ``variables``:
    the gradients of ``outputs`` seeded with ``output_grads`` (TensorFlow's grad_ys) instead
    of with ones. Each seed has its output's shape and dtype. None where nothing depends on v.
    """
    from gpuk.ops.elementwise import zeros_like
    variables = list(variables) if isinstance(variables, (list, tuple)) else [variables]
    for v in variables:
        if not isinstance(v, Tensor):
            raise TypeError('%s: variables must be tensors, got %r' % (where, v))
    nodes = topological_nodes(list(outputs))
    dependent = _depends_on(nodes, variables)
    grads = {}
    for output, seed in zip(outputs, output_grads):
        if id(output) in dependent:
            _accumulate(grads, output, seed)
    for node in reversed(nodes):
        if not any(id(t) in dependent for t in node.inputs):
            continue
        node_grads = [grads.get(t) for t in node.outputs]
        if all(g is None for g in node_grads):
            continue
        node_grads = [zeros_like(t) if g is None else g for t, g in zip(node.outputs, node_grads)]
        input_grads = node.op.grad(node.inputs, node.outputs, node_grads)
        for tensor, g in zip(node.inputs, input_grads):
            if g is not None and id(tensor) in dependent:
                _accumulate(grads, tensor, g)
    return [grads.get(v) for v in variables]
