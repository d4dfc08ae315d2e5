"""Global settings: floatx, epsilon, image data format (Keras 2 semantics), kernel
selection per family and the precision policy (float32 math, or mixed precision).

Keras keeps floatx/epsilon/image_data_format in ``keras.backend.common``. When Keras has
loaded gpuk as its backend that module is the single source of truth, so a
``K.set_floatx`` done through Keras reaches gpuk; otherwise gpuk keeps its own copy,
initialised from ``$KERAS_HOME/keras.json`` (or ``~/.keras/keras.json``) like Keras does.
"""
import json
import os
import sys

from gpuk.contracts.families import SELECTABLE_FAMILIES

_FLOAT_TYPES = ('float16', 'float32', 'float64')
_DATA_FORMATS = ('channels_first', 'channels_last')
KERNEL_FAMILIES = SELECTABLE_FAMILIES
KERNEL_CHOICES = ('gpuk', 'cudnn', 'auto')
PRECISIONS = ('float32', 'tf32', 'mixed_bfloat16', 'mixed_float16')


def _keras_config_path():
    if 'KERAS_HOME' in os.environ:
        keras_dir = os.environ['KERAS_HOME']
    else:
        base = os.path.expanduser('~')
        if not os.access(base, os.W_OK):
            base = '/tmp'
        keras_dir = os.path.join(base, '.keras')
    return os.path.join(keras_dir, 'keras.json')


def _read_keras_json():
    """Settings from keras.json; anything missing or malformed gives the default."""
    settings = {'floatx': 'float32', 'epsilon': 1e-7,
                'image_data_format': 'channels_last'}
    try:
        with open(_keras_config_path()) as f:
            stored = json.load(f)
    except (OSError, ValueError):
        return settings
    if not isinstance(stored, dict):
        return settings
    if stored.get('floatx') in _FLOAT_TYPES:
        settings['floatx'] = stored['floatx']
    if isinstance(stored.get('epsilon'), (int, float)) and not isinstance(stored.get('epsilon'), bool):
        settings['epsilon'] = float(stored['epsilon'])
    if stored.get('image_data_format') in _DATA_FORMATS:
        settings['image_data_format'] = stored['image_data_format']
    return settings


_settings = _read_keras_json()


def _keras_common():
    """keras.backend.common once Keras is (being) imported, else None."""
    return sys.modules.get('keras.backend.common')


def _setting(name):
    """The setting ``name``: Keras's (its getter of that name) once Keras is imported, else ours."""
    common = _keras_common()
    return getattr(common, name)() if common is not None else _settings[name]


def _store(name, value, stored):
    """Keeps ``stored`` as our setting ``name`` and, once Keras is imported, sets ``value``
    through Keras's set_<name> too."""
    _settings[name] = stored
    common = _keras_common()
    if common is not None:
        getattr(common, 'set_' + name)(value)


def floatx():
    """Returns the default float type, as a string ('float16', 'float32' or 'float64')."""
    return _setting('floatx')


def set_floatx(floatx):
    """Sets the default float type."""
    if floatx not in _FLOAT_TYPES:
        raise ValueError('set_floatx: floatx must be one of %s, got %r' % (_FLOAT_TYPES, floatx))
    _store('floatx', floatx, str(floatx))


def epsilon():
    """Returns the fuzz factor used in numeric expressions."""
    return _setting('epsilon')


def set_epsilon(e):
    """Sets the fuzz factor used in numeric expressions."""
    if isinstance(e, bool) or not isinstance(e, (int, float)):
        raise TypeError('set_epsilon: e must be a float, got %r' % (e,))
    _store('epsilon', e, float(e))


def image_data_format():
    """Returns the default image data format ('channels_first' or 'channels_last')."""
    return _setting('image_data_format')


def set_image_data_format(data_format):
    """Sets the default image data format."""
    if data_format not in _DATA_FORMATS:
        raise ValueError('set_image_data_format: data_format must be one of %s, got %r'
                         % (_DATA_FORMATS, data_format))
    _store('image_data_format', data_format, str(data_format))


def image_dim_ordering():
    """Legacy setting: 'tf' for channels_last, 'th' for channels_first."""
    return 'th' if image_data_format() == 'channels_first' else 'tf'


def set_image_dim_ordering(dim_ordering):
    """Legacy setter: 'tf' means channels_last, 'th' channels_first."""
    if dim_ordering not in ('tf', 'th'):
        raise ValueError("set_image_dim_ordering: dim_ordering must be 'tf' or 'th', got %r"
                         % (dim_ordering,))
    set_image_data_format('channels_first' if dim_ordering == 'th' else 'channels_last')


def normalize_data_format(value):
    """Checks a data_format argument; None means the global default."""
    if value is None:
        value = image_data_format()
    data_format = value.lower() if isinstance(value, str) else value
    if data_format not in _DATA_FORMATS:
        raise ValueError('normalize_data_format: data_format must be one of %s, got %r'
                         % (_DATA_FORMATS, value))
    return data_format


# --- kernel selection and precision -------------------------------------------------

def _parse_kernel_spec(spec):
    """'conv=auto,ctc=gpuk' -> {'conv': 'auto', 'ctc': 'gpuk'}."""
    choices = {}
    for item in filter(None, (part.strip() for part in spec.split(','))):
        family, sep, choice = item.partition('=')
        family, choice = family.strip(), choice.strip()
        if not sep or family not in KERNEL_FAMILIES or choice not in KERNEL_CHOICES:
            raise ValueError('GPUK_KERNELS: expected comma-separated family=choice with family in %s '
                             'and choice in %s, got %r' % (KERNEL_FAMILIES, KERNEL_CHOICES, item))
        choices[family] = choice
    return choices


_kernels = dict.fromkeys(KERNEL_FAMILIES, 'gpuk')
_kernels.update(_parse_kernel_spec(os.environ.get('GPUK_KERNELS', '')))


def _checked_precision(value, where):
    if value not in PRECISIONS:
        raise ValueError('%s: precision must be one of %s, got %r' % (where, PRECISIONS, value))
    return value


_precision = {'value': _checked_precision(os.environ.get('GPUK_PRECISION', '').strip() or 'float32',
                                          'GPUK_PRECISION')}


def set_kernels(spec=None, **families):
    """Chooses the implementation per kernel family: 'gpuk' (handwritten), 'cudnn' or 'auto'.

    # Arguments
        spec: optional string like ``'conv=auto,ctc=gpuk'`` (the GPUK_KERNELS syntax).
        **families: e.g. ``conv='cudnn'``.
    """
    choices = _parse_kernel_spec(spec) if spec else {}
    for family, choice in families.items():
        if family not in KERNEL_FAMILIES:
            raise ValueError('set_kernels: family must be one of %s, got %r' % (KERNEL_FAMILIES, family))
        if choice not in KERNEL_CHOICES:
            raise ValueError('set_kernels: %s must be one of %s, got %r' % (family, KERNEL_CHOICES, choice))
        choices[family] = choice
    _kernels.update(choices)


def kernels(family=None):
    """The implementation chosen for ``family``, or a dict of all choices."""
    if family is None:
        return dict(_kernels)
    if family not in KERNEL_FAMILIES:
        raise ValueError('kernels: family must be one of %s, got %r' % (KERNEL_FAMILIES, family))
    return _kernels[family]


def set_precision(value):
    """Sets the precision policy (also ``GPUK_PRECISION``, read at import).

    - 'float32' (the default): float32 math, strict FFMA in the convolution kernels;
    - 'tf32': float32 convolutions on tensor cores with TF32 inputs (opt-in);
    - 'mixed_bfloat16' / 'mixed_float16': convolutions and matrix products of float32
      tensors compute in bfloat16 / float16 with float32 accumulation; variables, every
      other op and what the user reads stay float32 (gpuk/mixed_precision.py);
      'mixed_float16' also scales the loss in K.gradients (gpuk/loss_scaling.py).

    Read when a K.function is compiled (a changed policy recompiles it) and, for the loss
    scaling, when K.gradients builds gradients: set it before building the training step.
    """
    _precision['value'] = _checked_precision(value, 'set_precision')


def precision():
    """The precision policy: 'float32', 'tf32', 'mixed_bfloat16' or 'mixed_float16'."""
    return _precision['value']


# ---------------------------------------------------------------- device request

DEVICE_KINDS = ('auto', 'cuda', 'cpu', 'emulate')


def requested_device():
    """GPUK_DEVICE, parsed: 'auto' (the default), 'cuda', 'cpu' or 'emulate'. The one reader of
    the variable: gpuk.device picks the device from it, the kernels' runtime.current() its runtime."""
    requested = os.environ.get('GPUK_DEVICE', 'auto').strip().lower() or 'auto'
    if requested not in DEVICE_KINDS:
        raise ValueError('GPUK_DEVICE must be one of %s, got %r' % (DEVICE_KINDS, requested))
    return requested
