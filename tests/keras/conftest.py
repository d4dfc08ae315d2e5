"""Real Keras 2.3.1 on gpuk: the environment is set before anything imports keras.

Keras reads ``KERAS_BACKEND`` and ``$KERAS_HOME/keras.json`` once, when ``keras`` is first
imported, and may write keras.json there: a private temporary KERAS_HOME keeps the user's
~/.keras untouched. Other test files of the same pytest process import gpuk directly and
never keras, so setting these variables does not change them; the fixture below restores
the global settings Keras tests change (data format, floatx, epsilon, learning phase).
"""
import atexit
import os
import shutil
import sys
import tempfile

import numpy as np
import pytest

os.environ['KERAS_BACKEND'] = 'gpuk.backend'
os.environ['KERAS_HOME'] = tempfile.mkdtemp(prefix='gpuk-keras-home-')
atexit.register(shutil.rmtree, os.environ['KERAS_HOME'], ignore_errors=True)   # leave no folder in /tmp

if 'keras.backend' in sys.modules and sys.modules['keras.backend'].backend() != 'gpuk.backend':
    raise RuntimeError('tests/keras: keras was imported with backend %r before these tests '
                       'could select gpuk.backend' % sys.modules['keras.backend'].backend())


@pytest.fixture(scope='session')
def keras():
    import keras as keras_module
    return keras_module


@pytest.fixture(autouse=True)
def _keras_state(keras):
    """Seeds NumPy (gpuk's unseeded random ops draw their seeds from it, as Keras's
    TensorFlow backend does) and restores the global Keras settings after each test."""
    from gpuk import config
    from gpuk.backend import clear_session  # keras.backend (2.3.1) does not re-export it
    K = keras.backend
    saved = (K.image_data_format(), K.floatx(), K.epsilon())
    np.random.seed(1234)
    clear_session()
    yield
    clear_session()
    config.set_image_data_format(saved[0])
    config.set_floatx(saved[1])
    config.set_epsilon(saved[2])


@pytest.fixture
def tmp_h5(tmp_path):
    """A function giving paths inside the test's temporary directory."""
    return lambda name: str(tmp_path / name)
