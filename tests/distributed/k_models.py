"""A Keras-style optimizer and a small MLP written on the K module alone (no Keras import),
shared by the one-process and the NCCL tests."""
import numpy as np

from gpuk import backend as K


class SGD:
    """A Keras-style optimizer on the K module (Keras itself is not imported here)."""

    def __init__(self, lr, clipnorm=0):
        self.lr = lr
        if clipnorm:
            self.clipnorm = clipnorm

    def get_gradients(self, loss, params):
        return K.gradients(loss, params)

    def get_updates(self, loss, params):
        return [K.update(p, p - self.lr * g) for p, g in zip(params, self.get_gradients(loss, params))]

    def get_config(self):
        return dict(lr=self.lr, clipnorm=getattr(self, 'clipnorm', 0))

    @classmethod
    def from_config(cls, config):
        return cls(**config)


def mlp():
    rng = np.random.RandomState(3)
    params = [K.variable(rng.normal(size=(5, 8))), K.variable(rng.normal(size=8)),
              K.variable(rng.normal(size=(8, 2))), K.variable(rng.normal(size=2))]
    x, y = K.placeholder(shape=(None, 5)), K.placeholder(shape=(None, 2))
    out = K.dot(K.tanh(K.dot(x, params[0]) + params[1]), params[2]) + params[3]
    return params, x, y, K.mean(K.square(out - y))
