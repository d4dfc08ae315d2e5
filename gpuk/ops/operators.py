"""What Python operators on tensors call (graph.Tensor imports this lazily)."""
from gpuk.ops.elementwise import binary as _binary
from gpuk.ops.elementwise import unary  # noqa: F401  (graph.Tensor calls operators.unary)


def binary(name, a, b):
    if name == 'matmul':
        from gpuk.ops.linalg import matmul
        return matmul(a, b)
    return _binary(name, a, b)


def getitem(x, key):
    from gpuk.ops.shape import getitem as _getitem
    return _getitem(x, key)
