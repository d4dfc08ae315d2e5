"""The Keras models of the training-step benchmarks, written once for Keras 2.3.1 and Keras 3.

    net = keras_models.build(keras, 'bn_cnn'); x, y = keras_models.data('bn_cnn', batch=8)

Each model is a Sequential stack that ends in a 10-way softmax, trained with Adam(1e-3) on
categorical cross-entropy. The builders take the ``keras`` module and use only what both
Keras versions have (Sequential, these layers, ``input_shape`` on the first layer, Adam, a
loss by name), so bench/bench_keras.py, bench/host_overhead.py and bench/rnn_cpu.py (Keras
2.3.1 on gpuk) and bench/keras3_jax.py (Keras 3 on JAX, in a process of its own) train the
same networks; ``torch_net`` builds each one's PyTorch twin (torch.nn; ``torch_step`` trains it
with torch.optim.Adam) for the PyTorch rows beside them. PARAMS is each model's parameter count
(trainable and not), which both versions report alike for the same network:
tests/keras/test_benchmark_models.py checks it on Keras 2.3.1 and on the PyTorch twins, and
bench/keras3_jax.py on Keras 3 before timing.

- mlp: Dense 784-256-256-10 (relu, softmax);
- cnn: Conv2D(16, 3) + MaxPool + Conv2D(32, 3) + MaxPool + Dense(10) on 28x28x1;
- bn_cnn: Conv2D(8, 3, no bias) + BatchNormalization + relu + MaxPool, then 16 filters the
  same, Dense(10), on 16x16x1;
- lstm, gru: LSTM(128) or GRU(128) over 50 steps of 32 features, Dense(10) on the last state.
"""
import numpy as np

CLASSES = 10
RNN_STEPS, RNN_FEATURES, RNN_UNITS = 50, 32, 128


def _mlp(layers, input_shape):
    return [layers.Dense(256, activation='relu', input_shape=input_shape), layers.Dense(256, activation='relu'),
            layers.Dense(CLASSES, activation='softmax')]


def _cnn(layers, input_shape):
    return [layers.Conv2D(16, 3, activation='relu', input_shape=input_shape), layers.MaxPooling2D(),
            layers.Conv2D(32, 3, activation='relu'), layers.MaxPooling2D(), layers.Flatten(),
            layers.Dense(CLASSES, activation='softmax')]


def _bn_cnn(layers, input_shape):
    return [layers.Conv2D(8, 3, use_bias=False, input_shape=input_shape), layers.BatchNormalization(),
            layers.Activation('relu'), layers.MaxPooling2D(),
            layers.Conv2D(16, 3, use_bias=False), layers.BatchNormalization(), layers.Activation('relu'),
            layers.MaxPooling2D(), layers.Flatten(), layers.Dense(CLASSES, activation='softmax')]


def _rnn(cell):
    def stack(layers, input_shape):
        return [getattr(layers, cell)(RNN_UNITS, input_shape=input_shape),
                layers.Dense(CLASSES, activation='softmax')]
    return stack


# name -> (input shape of one sample, the layers)
MODELS = {
    'mlp': ((784,), _mlp),
    'cnn': ((28, 28, 1), _cnn),
    'bn_cnn': ((16, 16, 1), _bn_cnn),
    'lstm': ((RNN_STEPS, RNN_FEATURES), _rnn('LSTM')),
    'gru': ((RNN_STEPS, RNN_FEATURES), _rnn('GRU')),
}
# Keras 3's GRU has reset_after=True (two bias rows) where 2.3.1's default is False: not the same
# network, so the GRU is left out of the comparison between the two.
PARAMS = {'mlp': 269322, 'cnn': 12810, 'bn_cnn': 1970, 'lstm': 83722}
# The models of the training-step benchmark (bench_keras.py, keras3_jax.py), and their batch.
BATCH = {'mlp': 128, 'cnn': 64, 'bn_cnn': 64, 'lstm': 32}


def input_shape(name):
    return MODELS[name][0]


def build(keras, name):
    """Model ``name`` built and compiled with ``keras`` (2.3.1 or 3)."""
    shape, layers_of = MODELS[name]
    net = keras.models.Sequential(layers_of(keras.layers, shape))
    net.compile(keras.optimizers.Adam(1e-3), 'categorical_crossentropy')
    return net


def data(name, batch, seed=0):
    """(x, y) of one batch: standard normal float32 inputs, one-hot float32 targets."""
    rng = np.random.default_rng(seed)
    x = rng.standard_normal((batch,) + input_shape(name)).astype(np.float32)
    y = np.eye(CLASSES, dtype=np.float32)[rng.integers(0, CLASSES, batch)]
    return x, y


def torch_net(torch, name):
    """Model ``name``'s PyTorch twin (torch.nn, on the CPU), logits out (CrossEntropyLoss applies
    the softmax). Its parameters and BatchNorm running statistics count PARAMS[name], but for
    the recurrent layers: torch's have two bias vectors per gate where Keras 2.3.1's have one,
    and torch's GRU applies its reset gate after the recurrent product (Keras's reset_after=True,
    not 2.3.1's default): the same work per step, not the same function."""
    nn = torch.nn
    if name == 'mlp':
        net = nn.Sequential(nn.Linear(784, 256), nn.ReLU(), nn.Linear(256, 256), nn.ReLU(), nn.Linear(256, CLASSES))
    elif name == 'cnn':
        net = nn.Sequential(nn.Conv2d(1, 16, 3), nn.ReLU(), nn.MaxPool2d(2), nn.Conv2d(16, 32, 3),
                            nn.ReLU(), nn.MaxPool2d(2), nn.Flatten(), nn.Linear(32 * 5 * 5, CLASSES))
    elif name == 'bn_cnn':   # Keras's BatchNormalization: epsilon 1e-3, moving averages at 0.99
        net = nn.Sequential(nn.Conv2d(1, 8, 3, bias=False), nn.BatchNorm2d(8, 1e-3, 0.01), nn.ReLU(),
                            nn.MaxPool2d(2), nn.Conv2d(8, 16, 3, bias=False), nn.BatchNorm2d(16, 1e-3, 0.01),
                            nn.ReLU(), nn.MaxPool2d(2), nn.Flatten(), nn.Linear(16 * 2 * 2, CLASSES))
    else:
        net = _torch_rnn(torch, getattr(nn, name.upper()))
    return net


def torch_step(torch, name, device='cpu'):
    """A train step of model ``name`` (torch_net) on ``device``: step(x, labels) -> the loss, read
    on the host (as Keras's train_on_batch does, so a GPU step is waited for). Images go in NCHW
    (torch's layout: ``x.transpose(0, 3, 1, 2)`` of data()'s), sequences as data() gives them."""
    nn = torch.nn
    net = torch_net(torch, name).to(device)
    optimizer = torch.optim.Adam(net.parameters(), lr=1e-3)
    loss_fn = nn.CrossEntropyLoss()

    def step(x, labels):
        optimizer.zero_grad()
        loss = loss_fn(net(x), labels)
        loss.backward()
        optimizer.step()
        return loss.item()
    return step


def _torch_rnn(torch, cell):
    """``cell`` (torch.nn.LSTM or GRU) over the sequence, Linear on its last output."""
    class Net(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.rnn = cell(RNN_FEATURES, RNN_UNITS, batch_first=True)
            self.out = torch.nn.Linear(RNN_UNITS, CLASSES)

        def forward(self, x):
            return self.out(self.rnn(x)[0][:, -1])
    return Net()
