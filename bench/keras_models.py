"""The Keras models of the training-step benchmarks, written once for Keras 2.3.1 and Keras 3.

    net = keras_models.build(keras, 'bn_cnn'); x, y = keras_models.data('bn_cnn', batch=8)
    net.train_on_batch(x, y)

The Sequential models end in a 10-way softmax, trained with Adam(1e-3) on categorical
cross-entropy. Their builders take the ``keras`` module and use only what both Keras versions
have (Sequential, these layers, ``input_shape`` on the first layer, Adam, a loss by name), so
bench/bench_keras.py, bench/host_overhead.py and bench/rnn_cpu.py (Keras 2.3.1 on gpuk) and
bench/keras3_jax.py (Keras 3 on JAX, in a process of its own) train the same networks;
``torch_step`` builds each one's PyTorch twin (torch.nn, torch.optim.Adam) for the PyTorch rows
beside them, fed by ``torch_inputs``. PARAMS is each model's parameter count (trainable and
not), which both versions report alike for the same network:
tests/keras/test_benchmark_models.py checks it on Keras 2.3.1 and on the PyTorch twins, and
bench/keras3_jax.py on Keras 3 before timing.

- mlp: Dense 784-256-256-10 (relu, softmax);
- cnn: Conv2D(16, 3) + MaxPool + Conv2D(32, 3) + MaxPool + Dense(10) on 28x28x1;
- bn_cnn: Conv2D(8, 3, no bias) + BatchNormalization + relu + MaxPool, then 16 filters the
  same, Dense(10), on 16x16x1;
- lstm, gru: LSTM(128) or GRU(128) over 50 steps of 32 features, Dense(10) on the last state;
- ctc: the OCR demo's model (gpuk.demo.network, at the demo's default settings): two
  Conv2D + BatchNormalization + relu + MaxPool blocks on 12x72x1 digit-string images, Dense(64)
  over 36 time steps, a bidirectional GRU(48) (reset_after=False), a per-step 11-way softmax,
  trained on the CTC loss of the demo's rendered strings with Adam(3e-3). Its inputs are the
  demo's four (image, labels, input_length, label_length), its output the loss; the Keras 2.3.1
  side is the demo's own gpuk.demo.model.build_models.
"""
import numpy as np

from gpuk.demo import network
from gpuk.demo.data import make_dataset
from gpuk.demo.settings import TrainConfig

CLASSES = 10
RNN_STEPS, RNN_FEATURES, RNN_UNITS = 50, 32, 128
DEMO = TrainConfig()   # the ctc model's images, network and batch: the demo's defaults


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


# name -> (input shape of one sample, the layers) of the Sequential models; 'ctc' is the demo's
MODELS = {
    'mlp': ((784,), _mlp),
    'cnn': ((28, 28, 1), _cnn),
    'bn_cnn': ((16, 16, 1), _bn_cnn),
    'lstm': ((RNN_STEPS, RNN_FEATURES), _rnn('LSTM')),
    'gru': ((RNN_STEPS, RNN_FEATURES), _rnn('GRU')),
}
# Keras 3's GRU has reset_after=True (two bias rows) where 2.3.1's default is False: not the same
# network, so the GRU is left out of the comparison between the two.
PARAMS = {'mlp': 269322, 'cnn': 12810, 'bn_cnn': 1970, 'lstm': 83722, 'ctc': 44763}
# torch.nn.LSTM keeps two bias vectors (b_ih + b_hh) where Keras keeps their sum: the same
# network, with 4 * units more parameters on the torch side. The others' counts are alike.
TORCH_EXTRA_PARAMS = {'lstm': 4 * RNN_UNITS}
# The models of the training-step benchmark (bench_keras.py, keras3_jax.py), and their batch.
BATCH = {'mlp': 128, 'cnn': 64, 'bn_cnn': 64, 'lstm': 32, 'ctc': DEMO.batch_size}


def input_shape(name):
    return MODELS[name][0]


def build(keras, name):
    """Model ``name`` built and compiled with ``keras`` (2.3.1 or 3)."""
    if name == 'ctc':
        return _ctc(keras)
    shape, layers_of = MODELS[name]
    net = keras.models.Sequential(layers_of(keras.layers, shape))
    net.compile(keras.optimizers.Adam(1e-3), 'categorical_crossentropy')
    return net


def _ctc(keras):
    """The demo's training model: on Keras 2.3.1 the demo's own builder, on Keras 3 the same
    layers (gpuk.demo.network) around keras.ops.ctc_loss."""
    render = DEMO.render
    if not keras.__version__.startswith('3.'):
        from gpuk.demo import model   # imports Keras: 2.3.1 in this process
        return model.build_models(render.height, render.width, render.max_len, DEMO.model)[0]
    ops = keras.ops

    def ctc_batch_cost(labels, y_pred, input_length, label_length):
        # K.ctc_batch_cost's arguments and (batch, 1) result. keras.ops.ctc_loss wants logits and
        # takes their log_softmax; log(y_pred + epsilon), what K.ctc_batch_cost takes the CTC of,
        # is already log-probabilities (up to epsilon), which log_softmax leaves as they are: the
        # same loss of the same softmax. Padding past label_length (-1) is ignored by both.
        loss = ops.ctc_loss(ops.cast(labels, 'int32'), ops.log(y_pred + keras.config.epsilon()),
                            ops.cast(label_length[:, 0], 'int32'), ops.cast(input_length[:, 0], 'int32'),
                            mask_index=network.BLANK)
        return ops.expand_dims(loss, -1)
    return network.build_models(keras, render.height, render.width, render.max_len, ctc_batch_cost,
                                DEMO.model)[0]


def data(name, batch, seed=0):
    """(x, y) of one batch: standard normal float32 inputs, one-hot float32 targets; for 'ctc'
    the demo's rendered digit strings as its training model's four inputs, and zero targets
    (its output is the loss)."""
    if name == 'ctc':
        dataset = make_dataset(batch, seed, DEMO.render)
        return (network.model_inputs(dataset, network.time_steps(DEMO.render.width)),
                np.zeros((batch, 1), np.float32))
    rng = np.random.default_rng(seed)
    x = rng.standard_normal((batch,) + input_shape(name)).astype(np.float32)
    y = np.eye(CLASSES, dtype=np.float32)[rng.integers(0, CLASSES, batch)]
    return x, y


def torch_inputs(torch, name, x, y, device='cpu'):
    """data()'s batch as torch_step's (x, target) on ``device``: images in NCHW (torch's layout),
    sequences as they are, class indices for the one-hot targets; for 'ctc' the images, and
    (labels, input lengths, label lengths) for nn.CTCLoss."""
    def tensor(array):
        return torch.from_numpy(np.ascontiguousarray(array)).to(device)
    if name == 'ctc':
        images, labels, input_length, label_length = x
        # nn.CTCLoss reads only the first label_length labels; the demo's padding (-1) becomes
        # 0 all the same, an index every torch kernel accepts
        return tensor(images.transpose(0, 3, 1, 2)), (tensor(np.maximum(labels, 0).astype(np.int64)),
                                                      tensor(input_length[:, 0]), tensor(label_length[:, 0]))
    return tensor(x.transpose(0, 3, 1, 2) if x.ndim == 4 else x), tensor(y.argmax(axis=1))


def torch_model(torch, name):
    """Model ``name``'s PyTorch twin (a torch.nn.Module): what build() builds, in torch.nn, with
    the last layer's softmax left to the loss."""
    nn = torch.nn
    if name == 'mlp':
        return nn.Sequential(nn.Linear(784, 256), nn.ReLU(), nn.Linear(256, 256), nn.ReLU(), nn.Linear(256, CLASSES))
    if name == 'cnn':
        return nn.Sequential(nn.Conv2d(1, 16, 3), nn.ReLU(), nn.MaxPool2d(2), nn.Conv2d(16, 32, 3),
                             nn.ReLU(), nn.MaxPool2d(2), nn.Flatten(), nn.Linear(32 * 5 * 5, CLASSES))
    if name == 'bn_cnn':   # Keras's BatchNormalization: epsilon 1e-3, moving averages at 0.99
        return nn.Sequential(nn.Conv2d(1, 8, 3, bias=False), nn.BatchNorm2d(8, 1e-3, 0.01), nn.ReLU(),
                             nn.MaxPool2d(2), nn.Conv2d(8, 16, 3, bias=False), nn.BatchNorm2d(16, 1e-3, 0.01),
                             nn.ReLU(), nn.MaxPool2d(2), nn.Flatten(), nn.Linear(16 * 2 * 2, CLASSES))
    if name == 'ctc':
        return _torch_ocr(torch)
    return _torch_rnn(torch, getattr(nn, name.upper()))


def torch_loss(torch, name):
    """Model ``name``'s loss in torch: loss(output of its torch_model, target of torch_inputs)."""
    if name != 'ctc':
        return torch.nn.CrossEntropyLoss()
    # per-sample CTC, blank last, averaged over the batch as Keras averages ctc_batch_cost's
    # (nn.CTCLoss's 'mean' would divide each by its label length first)
    ctc = torch.nn.CTCLoss(blank=network.BLANK, reduction='none')

    def loss(logits, target):
        return ctc(logits.log_softmax(-1).transpose(0, 1), *target).mean()
    return loss


def torch_step(torch, name, device='cpu'):
    """A train step of model ``name``'s PyTorch twin on ``device``: step(x, target) (torch_inputs)
    -> the loss, read on the host (as Keras's train_on_batch does, so a GPU step is waited for)."""
    net = torch_model(torch, name).to(device)
    optimizer = torch.optim.Adam(net.parameters(), lr=DEMO.model.learning_rate if name == 'ctc' else 1e-3)
    loss_fn = torch_loss(torch, name)

    def step(x, target):
        optimizer.zero_grad()
        loss = loss_fn(net(x), target)
        loss.backward()
        optimizer.step()
        return loss.item()
    return step


def _torch_rnn(torch, cell):
    """``cell`` (torch.nn.LSTM or GRU) over the sequence, Linear on its last output. torch's GRU
    applies its reset gate after the recurrent product (Keras's reset_after=True, not 2.3.1's
    default): the same work per step as the Keras GRU, not the same function (rnn_cpu.py's GRU
    rows; the ctc model's twin has an exact Keras 2.3.1 GRU cell instead)."""
    class Net(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.rnn = cell(RNN_FEATURES, RNN_UNITS, batch_first=True)
            self.out = torch.nn.Linear(RNN_UNITS, CLASSES)

        def forward(self, x):
            return self.out(self.rnn(x)[0][:, -1])
    return Net()


def _torch_keras_gru(torch, features, units):
    """Keras 2.3.1's GRU cell (reset_after=False, sigmoid gates, z r h order, one bias row) over a
    (batch, time, features) sequence, step by step in eager torch. torch.nn.GRU applies the reset
    gate after the recurrent product, with two bias rows (Keras's reset_after=True): another
    network, with 3 * units more parameters a direction."""
    nn = torch.nn

    class KerasGRU(nn.Module):
        def __init__(self):
            super().__init__()
            self.kernel = nn.Parameter(torch.empty(features, 3 * units))
            self.recurrent_kernel = nn.Parameter(torch.empty(units, 3 * units))
            self.bias = nn.Parameter(torch.zeros(3 * units))
            nn.init.xavier_uniform_(self.kernel)          # Keras's glorot_uniform,
            nn.init.orthogonal_(self.recurrent_kernel)    # orthogonal and zeros
            self.units = units

        def forward(self, x, reverse=False):
            u = self.units
            projected = x @ self.kernel + self.bias       # every step's input part at once
            recurrent_zr, recurrent_h = self.recurrent_kernel.split([2 * u, u], dim=1)
            h = x.new_zeros(x.shape[0], u)
            outputs = [None] * x.shape[1]
            for t in (reversed(range(x.shape[1])) if reverse else range(x.shape[1])):
                input_zr, input_h = projected[:, t].split([2 * u, u], dim=1)
                z, r = torch.sigmoid(input_zr + h @ recurrent_zr).chunk(2, dim=1)
                h = z * h + (1 - z) * torch.tanh(input_h + (r * h) @ recurrent_h)
                outputs[t] = h
            return torch.stack(outputs, dim=1)
    return KerasGRU()


def _torch_ocr(torch):
    """gpuk.demo.network's OCR network at the demo's settings, in torch.nn (NCHW), ending in
    logits: conv blocks, the width as time axis, Dense, the (bidirectional) Keras GRU, Dense."""
    nn = torch.nn
    spec, render = DEMO.model, DEMO.render

    class Net(nn.Module):
        def __init__(self):
            super().__init__()
            blocks, channels = [], 1
            for i, filters in enumerate(spec.conv_filters):   # Keras's BatchNormalization epsilon 1e-3
                blocks += [nn.Conv2d(channels, filters, 3, padding=1, bias=False),
                           nn.BatchNorm2d(filters, 1e-3, 1 - network.BN_MOMENTUM), nn.ReLU()]
                if i < len(network.POOLS):
                    blocks.append(nn.MaxPool2d(network.POOLS[i]))
                channels = filters
            self.conv = nn.Sequential(*blocks)
            self.features = nn.Linear(network.pooled_height(render.height, spec) * channels, spec.dense_units)
            directions = 2 if spec.bidirectional else 1
            self.forward_gru = _torch_keras_gru(torch, spec.dense_units, spec.rnn_units)
            self.backward_gru = _torch_keras_gru(torch, spec.dense_units, spec.rnn_units) if directions == 2 else None
            self.out = nn.Linear(spec.rnn_units * directions, network.NUM_CLASSES)

        def forward(self, images):
            x = self.conv(images)                          # (batch, channels, height, width)
            # Keras's Permute((2, 1, 3)) + Reshape of NHWC: (batch, width, height * channels),
            # height-major
            x = x.permute(0, 3, 2, 1).flatten(2)
            x = torch.relu(self.features(x))
            sequence = self.forward_gru(x)
            if self.backward_gru is not None:              # Keras's Bidirectional: concatenated
                sequence = torch.cat([sequence, self.backward_gru(x, reverse=True)], dim=-1)
            return self.out(sequence)
    return Net()
