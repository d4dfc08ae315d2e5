"""Dynamic loss scaling for the 'mixed_float16' policy, torch.amp.GradScaler's rule, inside
K.gradients and K.function so Keras 2.3.1's optimizers work unchanged.

float16 keeps 5 exponent bits: gradients below 2^-24 flush to zero in the float16
convolutions and products of the backward pass. So under 'mixed_float16' K.gradients
seeds the backward pass with the loss scale S instead of 1 (the gradient of S * loss),
and divides each gradient by S in float32 before returning it (S is a power of two, so
that division is exact). What the optimizer sees are the true gradients.

A scale too large overflows a float16 result to inf. A K.function whose updates read such
gradients (a training step) also computes whether they are all finite, and when they are
not it applies none of its updates (weights, moments, ``iterations``, the batch norm's
moving averages: nothing changes) and halves S; after ``growth_interval`` finite steps
in a row S doubles. The check costs one bool read from the device per step.
"""
import numpy as np

from gpuk import device
from gpuk.autodiff import vector_jacobian_products
from gpuk.graph import Meta, Variable, apply, topological_nodes
from gpuk.ops import elementwise as ew
from gpuk.ops.base import Op

INIT_SCALE = 2.0 ** 16
GROWTH_FACTOR = 2.0
BACKOFF_FACTOR = 0.5
GROWTH_INTERVAL = 2000


class LossScaler:
    """The scale S (a float32 scalar variable the gradient graphs read) and the count of
    finite steps since it last changed."""

    def __init__(self, init_scale=INIT_SCALE, growth_factor=GROWTH_FACTOR,
                 backoff_factor=BACKOFF_FACTOR, growth_interval=GROWTH_INTERVAL):
        self.scale_variable = Variable(np.float32(init_scale), 'float32', name='loss_scale')
        self.growth_factor, self.backoff_factor = growth_factor, backoff_factor
        self.growth_interval = growth_interval
        self.growth_tracker = 0
        self._scale = float(init_scale)     # host mirror: reading S needs no device sync

    @property
    def scale(self):
        return self._scale

    def update(self, finite):
        """After a step: back off (and restart the count) on a non-finite gradient, grow
        after ``growth_interval`` finite steps in a row."""
        self.apply(self.next_state(finite))

    def next_state(self, finite):
        """What ``update(finite)`` sets: (scale, growth count, the scale's device value or None
        where it stays), made without changing anything, as the device value's allocation may
        fail (K.function makes it before it assigns any variable)."""
        if not finite:
            scale, tracker = self._scale * self.backoff_factor, 0
        else:
            scale, tracker = self._scale, self.growth_tracker + 1
            if tracker == self.growth_interval:
                scale, tracker = scale * self.growth_factor, 0
        value = None if scale == self._scale else device.to_device(np.float32(scale), 'float32')
        return scale, tracker, value

    def apply(self, state):
        """Sets a ``next_state``; allocates nothing."""
        scale, self.growth_tracker, value = state
        if value is not None:
            self._scale, self.scale_variable.value = float(scale), value


def scaled_gradients(loss, variables, scaler=None):
    """K.gradients under 'mixed_float16': the gradients of ``scaler``'s S * loss divided by S
    (a new LossScaler when none is given). Each returned gradient remembers its scaler
    (``loss_scaler(g)``), which is how K.function finds the steps to guard."""
    scaler = LossScaler() if scaler is None else scaler
    seed = ew.ones_like(loss) * scaler.scale_variable
    grads = vector_jacobian_products([loss], [seed], variables, 'gradients')
    unscaled = []
    for g in grads:
        if g is not None:
            g = g / ew.cast(scaler.scale_variable, g.dtype)
            g._loss_scaler = scaler
        unscaled.append(g)
    return unscaled


def loss_scaler(tensor):
    """The LossScaler whose scaled gradient ``tensor`` is, or None."""
    return getattr(tensor, '_loss_scaler', None)


class AllFinite(Op):
    """A bool scalar: every element of every input is finite."""
    differentiable = False

    def infer(self, *metas):
        return Meta((), 'bool')

    def forward(self, impl, *arrays):
        xp = impl.xp
        return xp.all(xp.stack([xp.isfinite(a).all() for a in arrays]))


class StepGuard:
    """What a K.function with updates reading scaled gradients computes and does per call."""

    def __init__(self, scalers, gradients):
        self.scalers = scalers
        self.finite = apply(AllFinite(), *gradients)

    @staticmethod
    def read_finite(finite_value):
        """The computed flag on the host: True when the step's updates may be applied."""
        return bool(device.to_host(finite_value))

    def next_states(self, finite):
        """Each scaler's ``next_state`` after a step (nothing changes yet): made before the
        step's updates are assigned, so that an allocation failure leaves everything as it was."""
        return [scaler.next_state(finite) for scaler in self.scalers]

    def step_finished(self, states):
        """Sets the scales (``next_states``) once the step's updates are applied (or skipped)."""
        for scaler, state in zip(self.scalers, states):
            scaler.apply(state)


def step_guard(update_values):
    """A StepGuard for the scaled gradients that ``update_values`` read, or None (no
    update reads one: nothing to guard)."""
    gradients, scalers = [], []
    for node in topological_nodes(list(update_values)):
        for t in node.outputs:
            scaler = loss_scaler(t)
            if scaler is not None:
                gradients.append(t)
                if scaler not in scalers:
                    scalers.append(scaler)
    return StepGuard(scalers, gradients) if gradients else None
