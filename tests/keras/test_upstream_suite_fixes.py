"""Regression tests for what Keras 2.3.1's own test suite found on gpuk
(python -m tests.keras_upstream; bench/RESULTS.md, "Keras 2.3.1's own tests")."""


def test_h5dict_list_attributes_read_back_as_lists_of_bytes(keras, tmp_h5):
    """keras tests/keras/utils/io_utils_test.py (test_H5Dict_attrs, test_H5Dict_groups): a list
    stored in an H5Dict comes back as the list of bytes it was stored as, as under h5py 2
    (h5py 3 reads it as an array of str); scalar strings stay str."""
    from keras.utils.io_utils import H5Dict
    path = tmp_h5('dict.h5')
    stored = H5Dict(path, mode='w')
    stored['names'] = [b'efg', b'hij', b'klmn']
    stored['tuple'] = (b'asd', b'sdf')
    stored['text'] = ['ab', 'cd']          # Keras encodes str items to bytes on the way in
    stored['group']['names'] = [b'x', b'yz']
    stored['name'] = 'abcd'
    stored.close()
    loaded = H5Dict(path, mode='r')
    try:
        assert loaded['names'] == [b'efg', b'hij', b'klmn']
        assert loaded['tuple'] == [b'asd', b'sdf']
        assert loaded['text'] == [b'ab', b'cd']
        assert loaded['group']['names'] == [b'x', b'yz']
        assert loaded['name'] == 'abcd' and isinstance(loaded['name'], str)
    finally:
        loaded.close()


def test_model_saved_to_h5dict_loads_by_its_byte_layer_names(keras, tmp_h5):
    """_deserialize_model looks each layer up by the bytes of layer_names (saving.py:286-299)."""
    import numpy as np
    layers = keras.layers
    model = keras.models.Sequential([layers.Dense(2, input_shape=(3,)), layers.Dense(1)])
    model.compile('adam', 'mse')
    model.fit(np.ones((4, 3)), np.ones((4, 1)), verbose=0)
    path = tmp_h5('model.h5')
    model.save(path)
    again = keras.models.load_model(path)
    x = np.random.rand(5, 3).astype('float32')
    np.testing.assert_array_equal(again.predict(x), model.predict(x))
    for a, b in zip(again.optimizer.get_weights(), model.optimizer.get_weights()):
        np.testing.assert_array_equal(a, b)


def test_function_takes_symbolic_tensors_as_input_values():
    """TensorFlow's Function computes a symbolic tensor fed to an input in the same run
    (tensorflow_backend.py, Function._call); gpuk computes it first, on every call."""
    import numpy as np
    import pytest
    from gpuk import backend as K
    x = K.placeholder(shape=(None, 3))
    f = K.function([x], [2.0 * x])
    v = K.variable(np.arange(6, dtype='float32').reshape(2, 3))
    np.testing.assert_array_equal(f([v])[0], 2.0 * np.arange(6).reshape(2, 3))
    fed = v + 1.0                       # computed again on each call: it sees the new value
    K.set_value(v, np.ones((2, 3)))
    np.testing.assert_array_equal(f([fed])[0], np.full((2, 3), 4.0))
    K.set_value(v, np.zeros((2, 3)))
    np.testing.assert_array_equal(f([fed])[0], np.full((2, 3), 2.0))
    np.testing.assert_array_equal(f([K.constant(np.ones((1, 3)))])[0], np.full((1, 3), 2.0))
    with pytest.raises(ValueError, match=r"function: input .* expects shape \(None, 3\), got \(3,\)"):
        f([K.constant(np.ones(3))])
    with pytest.raises(TypeError, match=r"function: input .* was fed placeholder"):
        f([K.placeholder(shape=(None, 3))])


def test_model_trains_and_predicts_on_symbolic_tensors(keras):
    """Keras 2.3.1's test_training.py, test_training_and_eval_methods_on_symbolic_tensors_*
    (upstream runs them on TensorFlow only): fit / evaluate / predict / train_on_batch on
    K.variable data, with steps."""
    import numpy as np
    K = keras.backend
    x = keras.layers.Input(shape=(3,))
    model = keras.Model(x, keras.layers.Dense(4)(x))
    model.compile('rmsprop', 'mse', metrics=['mae'])
    data = np.random.rand(10, 3).astype('float32')
    inputs, targets = K.variable(data), K.zeros(shape=(10, 4))
    history = model.fit(inputs, targets, epochs=2, steps_per_epoch=2, verbose=0,
                        validation_data=(inputs, targets), validation_steps=1)
    assert history.history['loss'][-1] < history.history['loss'][0]
    model.evaluate(inputs, targets, steps=2, verbose=0)
    model.train_on_batch(inputs, targets)
    model.test_on_batch(inputs, targets)
    np.testing.assert_allclose(model.predict(inputs, steps=1), model.predict(data), atol=1e-6)


def test_evaluating_a_result_built_under_control_dependencies_applies_the_update():
    """TensorFlow runs an update op before the ops made inside control_dependencies([update]):
    evaluating them applies it, once per run; an update the function lists itself is not
    applied twice."""
    import numpy as np
    from gpuk import backend as K
    total = K.variable(1.0)
    update = K.update_add(total, 2.0)
    with K.control_dependencies([update]):
        after = total * 10
    assert K.eval(after) == 30.0 and K.get_value(total) == 3.0
    assert K.eval(after) == 50.0 and K.get_value(total) == 5.0
    f = K.function([], [after], updates=[update])
    assert f([]) == [70.0] and K.get_value(total) == 7.0
    assert K.eval(total * 10) == 70.0 and K.get_value(total) == 7.0   # built outside: no update
    x = K.placeholder(shape=())
    count = K.variable(0.0)
    with K.control_dependencies([K.update_add(count, x)]):
        doubled = count * 2
    g = K.function([x], [doubled])
    assert g([np.float32(3)]) == [6.0] and g([np.float32(1)]) == [8.0]
    np.testing.assert_array_equal(K.get_value(count), 4.0)


def test_standalone_keras_metric_accumulates_when_evaluated(keras):
    """Keras 2.3.1's metrics_test.py (upstream runs it on TensorFlow only): K.eval(metric(y))
    updates the metric's state, metrics.py:80-82."""
    import numpy as np
    K = keras.backend
    mean = keras.metrics.Mean()
    assert K.eval(mean(100.0)) == 100 and K.eval(mean.total) == 100 and K.eval(mean.count) == 1
    assert K.eval(mean([1.0, 5.0])) == np.float32(106.0 / 3) and K.eval(mean.count) == 3
    accuracy = keras.metrics.BinaryAccuracy()
    K.eval(accuracy(K.constant([[1.0], [0.0]]), K.constant([[0.9], [0.8]])))
    assert K.eval(accuracy(K.constant([[1.0], [1.0]]), K.constant([[0.9], [0.7]]))) == 0.75
    mean.reset_states()
    assert K.eval(mean.total) == 0 and K.eval(mean(4.0)) == 4.0
