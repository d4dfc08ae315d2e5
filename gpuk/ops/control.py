"""Ops that shape the flow of values and gradients: identity, stop_gradient, print."""
import sys

from gpuk import device
from gpuk.graph import Meta
from gpuk.ops.base import Op


class Identity(Op):
    def infer(self, x):
        return Meta(x.shape, x.dtype)

    def forward(self, impl, x):
        return x

    def grad(self, inputs, outputs, output_grads):
        return [output_grads[0]]


class StopGradient(Op):
    """Passes values through; no gradient flows back."""
    differentiable = False

    def infer(self, x):
        return Meta(x.shape, x.dtype)

    def forward(self, impl, x):
        return x


class PrintTensor(Op):
    """Identity that prints ``message`` and the value each time it runs."""
    foldable = False

    def __init__(self, message):
        self.message = message

    def infer(self, x):
        return Meta(x.shape, x.dtype)

    def forward(self, impl, x):
        print(self.message, device.to_host(x), file=sys.stdout)
        return x

    def grad(self, inputs, outputs, output_grads):
        return [output_grads[0]]
