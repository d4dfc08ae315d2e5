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
