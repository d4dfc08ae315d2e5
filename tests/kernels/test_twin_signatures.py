"""Every kernel family's CUDA launcher module (gpuk.kernels.<family>) offers its NumPy twin's
functions (gpuk.cpu_fallback.<family>) with the twin's parameters, defaults included, plus a
keyword-only ``runtime=None`` (and, after it, any launcher-only keyword-only switch with a
default, such as batch norm's ``single_kernel``): ops call either one through ``device.impl()``
with the same arguments, so a launcher that drifts from its twin breaks here, not on a GPU."""
import importlib
import inspect

import pytest

from gpuk.contracts.families import FAMILIES


def _public_functions(module):
    """The module's __all__, or (without one) the functions it defines whose names do not start
    with '_' and that are not argument checks (check_*: helpers the launcher imports)."""
    names = getattr(module, '__all__', None)
    if names is None:
        names = [name for name, value in vars(module).items()
                 if inspect.isfunction(value) and value.__module__ == module.__name__
                 and not name.startswith(('_', 'check_'))]
    return sorted(names)


@pytest.mark.parametrize('family', FAMILIES)
def test_launcher_has_its_twins_functions_and_signatures(family):
    twin = importlib.import_module('gpuk.cpu_fallback.' + family)
    launcher = importlib.import_module('gpuk.kernels.' + family)
    names = _public_functions(twin)
    assert names, 'gpuk.cpu_fallback.%s exports no functions' % family
    for name in names:
        assert callable(getattr(launcher, name, None)), 'gpuk.kernels.%s lacks %s' % (family, name)
        twin_params = list(inspect.signature(getattr(twin, name)).parameters.values())
        launcher_params = list(inspect.signature(getattr(launcher, name)).parameters.values())
        runtime = [p for p in launcher_params if p.name == 'runtime']
        assert runtime and runtime[0].kind is inspect.Parameter.KEYWORD_ONLY and runtime[0].default is None, \
            '%s.%s: no keyword-only runtime=None' % (family, name)
        index = launcher_params.index(runtime[0])
        switches = launcher_params[index + 1:]
        assert all(p.kind is inspect.Parameter.KEYWORD_ONLY and p.default is not p.empty for p in switches), \
            '%s.%s: launcher-only parameters after runtime must be keyword-only with defaults' % (family, name)
        assert launcher_params[:index] == twin_params, \
            '%s.%s: launcher %s, twin %s' % (family, name, inspect.signature(getattr(launcher, name)),
                                            inspect.signature(getattr(twin, name)))
