import json
import sys
import types

import pytest

from gpuk import config
from gpuk import backend as K


def _write(tmp_path, text):
    (tmp_path / 'keras.json').write_text(text)


def test_keras_json_is_read(tmp_path, monkeypatch):
    _write(tmp_path, json.dumps({'floatx': 'float64', 'epsilon': 1e-4, 'image_data_format': 'channels_first'}))
    monkeypatch.setenv('KERAS_HOME', str(tmp_path))
    assert config._read_keras_json() == {'floatx': 'float64', 'epsilon': 1e-4,
                                         'image_data_format': 'channels_first'}


@pytest.mark.parametrize('text', ['{not json', '[1, 2]', json.dumps({'floatx': 'int8', 'epsilon': 'x',
                                                                    'image_data_format': 'nhwc'})])
def test_malformed_keras_json_gives_defaults(tmp_path, monkeypatch, text):
    _write(tmp_path, text)
    monkeypatch.setenv('KERAS_HOME', str(tmp_path))
    assert config._read_keras_json() == {'floatx': 'float32', 'epsilon': 1e-7,
                                         'image_data_format': 'channels_last'}


def test_missing_keras_json_gives_defaults(tmp_path, monkeypatch):
    monkeypatch.setenv('KERAS_HOME', str(tmp_path / 'absent'))
    assert config._read_keras_json()['floatx'] == 'float32'


def test_setters_validate_and_round_trip(monkeypatch):
    # gpuk's own settings (Keras's, once Keras is imported by other tests, must stay untouched)
    monkeypatch.delitem(sys.modules, 'keras.backend.common', raising=False)
    monkeypatch.setattr(config, '_settings', dict(config._settings))
    K.set_floatx('float64')
    assert K.floatx() == 'float64'
    assert K.cast_to_floatx([1, 2]).dtype.name == 'float64'
    with pytest.raises(ValueError, match="set_floatx: floatx must be one of .* got 'int32'"):
        K.set_floatx('int32')
    K.set_epsilon(1e-3)
    assert K.epsilon() == 1e-3
    with pytest.raises(TypeError, match='set_epsilon'):
        K.set_epsilon('small')
    K.set_image_data_format('channels_first')
    assert K.image_data_format() == 'channels_first' and K.image_dim_ordering() == 'th'
    K.set_image_dim_ordering('tf')
    assert K.image_data_format() == 'channels_last'
    with pytest.raises(ValueError, match="set_image_data_format: data_format must be one of"):
        K.set_image_data_format('nhwc')
    with pytest.raises(ValueError, match="set_image_dim_ordering"):
        K.set_image_dim_ordering('xy')
    assert K.normalize_data_format(None) == 'channels_last'
    assert K.normalize_data_format('Channels_First') == 'channels_first'
    with pytest.raises(ValueError, match='normalize_data_format'):
        K.normalize_data_format('nchw')


def test_settings_follow_keras_common_when_loaded(monkeypatch):
    state = {'floatx': 'float16', 'epsilon': 0.5, 'fmt': 'channels_first'}
    common = types.SimpleNamespace(
        floatx=lambda: state['floatx'], set_floatx=lambda v: state.update(floatx=v),
        epsilon=lambda: state['epsilon'], set_epsilon=lambda v: state.update(epsilon=v),
        image_data_format=lambda: state['fmt'], set_image_data_format=lambda v: state.update(fmt=v))
    monkeypatch.setitem(sys.modules, 'keras.backend.common', common)
    monkeypatch.setattr(config, '_settings', dict(config._settings))
    assert K.floatx() == 'float16' and K.epsilon() == 0.5 and K.image_data_format() == 'channels_first'
    K.set_floatx('float64')  # through gpuk, seen by Keras
    assert state['floatx'] == 'float64'
    state['epsilon'] = 0.25  # through Keras, seen by gpuk
    assert K.epsilon() == 0.25


def test_kernel_selection(monkeypatch):
    monkeypatch.setattr(config, '_kernels', dict(config._kernels))
    config.set_kernels('conv=auto,ctc=gpuk', pooling='cudnn')
    assert config.kernels('conv') == 'auto' and config.kernels('pooling') == 'cudnn'
    assert config.kernels()['ctc'] == 'gpuk'
    with pytest.raises(ValueError, match='GPUK_KERNELS'):
        config.set_kernels('conv=fast')
    with pytest.raises(ValueError, match='set_kernels: family must be one of'):
        config.set_kernels(attention='gpuk')
    with pytest.raises(ValueError, match="set_kernels: conv must be one of"):
        config.set_kernels(conv='triton')


def test_precision_policy(monkeypatch):
    monkeypatch.setattr(config, '_precision', {'value': 'float32'})
    assert config.precision() == 'float32'
    config.set_precision('tf32')
    assert config.precision() == 'tf32'
    with pytest.raises(ValueError, match='set_precision'):
        config.set_precision('fp8')
