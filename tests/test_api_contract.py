"""The API contract: every backend name exists, with Keras 2.3.1 tensorflow_backend's signature."""
import ast
import functools
import inspect
import os

import pytest

from gpuk import backend as K
from tests.keras_reference import keras_directory

NAMES = open(os.path.join(os.path.dirname(__file__), 'backend_api_names.txt')).read().split()


@functools.lru_cache(maxsize=None)
def _tensorflow_backend_signatures():
    path = os.path.join(keras_directory(), 'backend', 'tensorflow_backend.py')
    tree = ast.parse(open(path).read())
    signatures = {}
    for node in tree.body:
        if isinstance(node, ast.FunctionDef):
            args = node.args
            names = [a.arg for a in args.args]
            defaults = [ast.literal_eval(d) if not isinstance(d, ast.Name) or d.id in ('None', 'True', 'False')
                        else d.id for d in args.defaults]
            signatures[node.name] = (names, dict(zip(names[len(names) - len(defaults):], defaults)),
                                     args.vararg is not None, args.kwarg is not None)
    return signatures


def test_every_contract_name_exists_and_is_callable():
    missing = [name for name in NAMES if not callable(getattr(K, name, None))]
    assert not missing, 'missing from gpuk.backend: %s' % missing


@pytest.mark.parametrize('name', NAMES)
def test_signature_matches_keras_tensorflow_backend(name):
    reference = _tensorflow_backend_signatures().get(name)
    if reference is None:  # a Theano-backend name (ctc helpers, pattern_broadcast): checked by its tests
        return
    names, defaults, has_varargs, has_kwargs = reference
    parameters = inspect.signature(getattr(K, name)).parameters
    ours = [p for p in parameters.values() if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)]
    assert [p.name for p in ours][:len(names)] == names, name
    for p in ours[len(names):]:
        assert p.default is not p.empty, '%s: extra parameter %s needs a default' % (name, p.name)
    for arg, default in defaults.items():
        assert parameters[arg].default == default or (
            isinstance(default, str) and not isinstance(parameters[arg].default, str)), \
            '%s: default of %s is %r, Keras has %r' % (name, arg, parameters[arg].default, default)
    if has_kwargs:
        assert any(p.kind == p.VAR_KEYWORD for p in parameters.values()), '%s takes **kwargs in Keras' % name
