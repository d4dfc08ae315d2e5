"""Keras 2.3.1 loads gpuk as its backend, and the K behaviours Keras's layers rely on hold."""
import os
import re
import subprocess
import sys

import numpy as np
import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def _keras_source_files(keras):
    root = os.path.dirname(keras.__file__)
    for directory, _, files in os.walk(root):
        if os.sep + 'backend' in directory[len(root):]:
            continue  # the other backends' own modules
        for name in files:
            if name.endswith('.py'):
                yield os.path.join(directory, name)


def test_gpuk_does_not_import_keras():
    code = ('import sys; import gpuk.backend as K; import gpuk.function, gpuk.graph; '
            'print(sorted(m for m in sys.modules if m == "keras" or m.startswith("keras.")))')
    out = subprocess.run([sys.executable, '-c', code], cwd=ROOT, capture_output=True, text=True,
                         env=dict(os.environ, PYTHONPATH=ROOT), check=True).stdout
    assert out.strip() == '[]'


def test_keras_reports_gpuk_backend(keras):
    assert keras.__version__ == '2.3.1'
    assert keras.backend.backend() == 'gpuk.backend'
    import gpuk.backend
    assert keras.backend.placeholder is gpuk.backend.placeholder


def test_every_name_keras_takes_from_the_backend_exists(keras):
    import gpuk.backend as K
    init = open(os.path.join(os.path.dirname(keras.__file__), 'backend', '__init__.py')).read()
    wanted = set(re.findall(r'from \.load_backend import (\w+)', init))
    for path in _keras_source_files(keras):
        wanted.update(re.findall(r'\bK\.([a-z_][a-z0-9_]*)\b', open(path).read()))
    # Not backend API: wrappers.py:328 calls a Layer method on K (a Keras bug on every
    # backend), callbacks/__init__.py:19 and multi_gpu_utils.py:16 reach
    # K.tensorflow_backend only under TensorFlow, base_layer.py:71 names a function in a
    # docstring that no backend has.
    wanted -= {'compute_output_shape', 'tensorflow_backend', 'in_training_phase'}
    assert len(wanted) > 150
    missing = sorted(name for name in wanted if not hasattr(K, name))
    assert missing == []


def test_keras_imports_when_gpuk_was_imported_first():
    """gpuk.backend already in sys.modules: the compat shims must still be installed."""
    code = ('import gpuk.backend, keras, collections; from gpuk.backend import _keras_compat as c; '
            'print(keras.backend.backend(), "collections.Container" in c._installed or '
            'hasattr(collections, "Container"), "keras.engine.saving.load_weights_from_hdf5_group" '
            'in c._installed)')
    env = dict(os.environ, PYTHONPATH=ROOT, KERAS_BACKEND='gpuk.backend')
    out = subprocess.run([sys.executable, '-c', code], cwd=ROOT, capture_output=True, text=True,
                         env=env, check=True).stdout
    assert out.split()[-3:] == ['gpuk.backend', 'True', 'True']


def test_compat_off_leaves_keras_unpatched():
    code = ('import keras')
    env = dict(os.environ, PYTHONPATH=ROOT, KERAS_BACKEND='gpuk.backend', GPUK_KERAS_COMPAT='0')
    result = subprocess.run([sys.executable, '-c', code], cwd=ROOT, capture_output=True, text=True,
                            env=env)
    # Keras 2.3.1 needs collections.Iterable (callbacks.py:19), gone in Python 3.10.
    assert result.returncode != 0 and 'Iterable' in result.stderr


def test_is_tensor_and_is_keras_tensor(keras):
    K = keras.backend
    assert not K.is_tensor(np.zeros(3))
    assert K.is_tensor(K.placeholder((2,)))
    with pytest.raises(ValueError, match='is_keras_tensor'):
        K.is_keras_tensor(np.zeros(3))
    assert not K.is_keras_tensor(K.placeholder((2,)))
    assert K.is_keras_tensor(keras.layers.Input((3,)))


def test_int_shape_honours_keras_shape(keras):
    K = keras.backend
    x = K.placeholder(ndim=2)
    x._keras_shape = (None, 7)
    assert K.int_shape(x) == (None, 7)
    assert K.int_shape(keras.layers.Dense(4)(keras.layers.Input((3,)))) == (None, 4)


def test_variable_names_are_unique_bidirectional_included(keras):
    layers = keras.layers
    x = layers.Input((None, 3))
    h = layers.Bidirectional(layers.LSTM(4, return_sequences=True))(x)
    h = layers.Bidirectional(layers.GRU(2))(h)
    model = keras.models.Model(x, layers.Dense(1)(layers.Dense(2)(h)))
    names = [w.name for w in model.weights]
    assert len(names) == len(set(names)) == 16
    assert any(n.startswith('bidirectional_1/forward_lstm_1/') for n in names)
    assert any(n.startswith('bidirectional_1/backward_lstm_1/') for n in names)


def test_python_scalar_as_function_input(keras):
    K = keras.backend
    x, scale = K.placeholder((None, 2)), K.placeholder(())
    f = K.function([x, scale], [x * scale])
    np.testing.assert_array_equal(f([np.ones((3, 2)), 2.5])[0], np.full((3, 2), 2.5, 'float32'))
    f_phase = K.function([x, K.learning_phase()], [K.in_train_phase(x * 2, x)])
    np.testing.assert_array_equal(f_phase([np.ones((1, 2)), 1])[0], [[2, 2]])
    np.testing.assert_array_equal(f_phase([np.ones((1, 2)), 0])[0], [[1, 1]])


def test_prod_of_a_list_of_symbolic_scalars(keras):
    """keras/layers/normalization.py builds the sample size this way."""
    K = keras.backend
    x = K.placeholder((None, None, 5))
    n = K.prod([K.shape(x)[axis] for axis in (0, 1)])
    assert K.function([x], [n])([np.zeros((3, 4, 5))])[0] == 12
    mixed = K.cast(K.prod([K.shape(x)[0], 5]), 'float32')
    assert K.function([x], [mixed])([np.zeros((3, 4, 5))])[0] == 15.0


def test_random_normal_of_a_symbolic_shape(keras):
    K = keras.backend
    x = K.placeholder((None, 3))
    noise = K.random_normal(shape=K.shape(x), mean=1.0, stddev=0.5, seed=3)
    assert K.int_shape(noise) == (None, 3)
    value = K.function([x], [noise])([np.zeros((4000, 3))])[0]
    assert value.shape == (4000, 3)
    assert abs(value.mean() - 1.0) < 0.03 and abs(value.std() - 0.5) < 0.03


def test_dropout_noise_shape_with_symbolic_dims(keras):
    K = keras.backend
    x = K.placeholder((None, 6, 4))
    y = K.dropout(x, 0.5, noise_shape=(K.shape(x)[0], 1, 4), seed=1)
    out = K.function([x], [y])([np.ones((50, 6, 4))])[0]
    assert out.shape == (50, 6, 4)
    assert np.all(out == out[:, :1, :])  # one mask per (sample, feature), shared along axis 1
    assert set(np.unique(out)) == {0.0, 2.0}


def test_conv2d_transpose_with_symbolic_output_shape(keras):
    K = keras.backend
    x = K.placeholder((None, 4, 4, 2))
    kernel = K.variable(np.random.rand(3, 3, 5, 2))
    y = K.conv2d_transpose(x, kernel, (K.shape(x)[0], 8, 8, 5), strides=(2, 2), padding='same')
    assert K.int_shape(y)[1:] == (8, 8, 5)
    assert K.function([x], [y])([np.ones((3, 4, 4, 2))])[0].shape == (3, 8, 8, 5)


def test_rnn_with_unknown_time_dimension_and_mask(keras):
    K = keras.backend
    x, mask = K.placeholder((None, None, 2)), K.placeholder((None, None))

    def step(inputs, states):
        total = states[0] + inputs
        return total, [total]
    last, outputs, states = K.rnn(step, x, [K.zeros_like(x[:, 0, :])], mask=mask)
    assert K.int_shape(outputs) == (None, None, 2)
    xv = np.arange(16, dtype='float32').reshape(2, 4, 2)
    mv = np.array([[1, 1, 0, 0], [1, 1, 1, 1]], 'float32')
    last_v, outputs_v = K.function([x, mask], [last, outputs])([xv, mv])
    np.testing.assert_array_equal(last_v, [xv[0, :2].sum(0), xv[1].sum(0)])
    # masked steps repeat the previous output (TensorFlow backend semantics)
    np.testing.assert_array_equal(outputs_v[0, 2], outputs_v[0, 1])
    np.testing.assert_array_equal(outputs_v[1], np.cumsum(xv[1], axis=0))


def test_metric_result_reads_the_updated_state(keras):
    """base_layer.py:1258 reads total / count under K.control_dependencies(update_op)."""
    K = keras.backend
    metric = keras.metrics.Mean()
    x = K.placeholder((None,))
    updates = metric.update_state(x)
    with K.control_dependencies(updates):
        result = metric.result()
    f = K.function([x], [result], updates=updates)
    assert f([np.array([1.0, 3.0])])[0] == 2.0  # not 0/0: the first batch counts
    assert f([np.array([8.0])])[0] == 4.0
