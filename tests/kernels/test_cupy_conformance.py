"""gpuk's use of CuPy checked against the installed CuPy, without a GPU.

The CUDA paths (gpuk/kernels/runtime/cuda_runtime.py, gpuk/device.py, the launchers on 'cuda',
bench/) only run where there is a GPU; these tests check what can be checked without one:

- every ``cupy.<a>.<b>...`` attribute chain in gpuk/ and bench/ (and every ``xp.<name>``,
  which is CuPy on the GPU) resolves in the installed CuPy, and keyword arguments of calls
  to CuPy name parameters it has;
- the objects cuda_runtime.py uses by duck typing (RawModule, RawKernel) have the
  attributes it reads and sets;
- kernel arguments: CuPy converts each scalar the launchers pass (``np.int64`` for
  ``long long``, ...) to exactly the parameter's C type, and real ``cupy.ndarray`` objects
  (over fake device addresses, never dereferenced) pass the runtime's argument checks;
- a dry launch through CudaRuntime and the elementwise launcher with real CuPy arrays, the
  cubin compiled by gpuk's NVRTC, and a stand-in only where the driver would be called.

Skipped where CuPy is not importable (CI); a GPU host and /tmp/gpuenv-style venvs run them.
"""
import ast
import ctypes
import inspect
import re
from pathlib import Path

import numpy as np
import pytest

cupy = pytest.importorskip('cupy', reason='CuPy is not installed: nothing to check the CUDA paths against')
REAL_RAW_MODULE = cupy.RawModule   # the fixture below replaces cupy.RawModule

from gpuk.kernels import elementwise, runtime   # noqa: E402
from gpuk.kernels.runtime import cuda_runtime
from gpuk.kernels.runtime.kernel_source import SCALAR_DTYPES, parse_kernel_signatures   # noqa: E402

REPO = Path(__file__).resolve().parents[2]
SOURCE_DIRS = ('gpuk', 'bench')
# Calls whose result the walk follows: a function's return type, from its docstring.
RETURN_TYPES = {
    'cupy.cuda.get_current_stream': 'cupy.cuda.Stream',
    'cupy.get_default_memory_pool': 'cupy.cuda.MemoryPool',
}


# ---------------------------------------------------------------- the AST walk

def _dotted(node):
    """'a.b.c' for a Name/Attribute chain, else None."""
    parts = []
    while isinstance(node, ast.Attribute):
        parts.append(node.attr)
        node = node.value
    if isinstance(node, ast.Name):
        return '.'.join([node.id] + parts[::-1])
    return None


def _cupy_aliases(tree):
    """Names bound to cupy or its submodules by imports: {'cp': 'cupy', 'cuda': 'cupy.cuda'}."""
    aliases = {'cupy': 'cupy'}   # also a parameter named cupy: cudnn/conv.py passes the module around
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for name in node.names:
                if name.name == 'cupy' or name.name.startswith('cupy.'):
                    aliases[name.asname or name.name.split('.')[0]] = name.name if name.asname else 'cupy'
        elif isinstance(node, ast.ImportFrom) and node.module and node.module.split('.')[0] == 'cupy':
            for name in node.names:
                aliases[name.asname or name.name] = node.module + '.' + name.name
    return aliases


def _chain_of(node, aliases):
    """The CuPy dotted path an expression denotes ('cupy.cuda.Device().id' -> 'cupy.cuda.Device().id'),
    or None when it does not start at cupy. A call of a class continues with the class."""
    if isinstance(node, ast.Name):
        return aliases.get(node.id)
    if isinstance(node, ast.Attribute):
        base = _chain_of(node.value, aliases)
        return None if base is None else base + '.' + node.attr
    if isinstance(node, ast.Call):
        base = _chain_of(node.func, aliases)
        return None if base is None else base + '()'
    return None


def _xp_chain(node):
    """'xp.name...' for attribute chains on `xp` or `<anything>.xp` (CuPy on the GPU), else None."""
    parts = []
    while isinstance(node, ast.Attribute):
        parts.append(node.attr)
        if isinstance(node.value, ast.Name) and node.value.id == 'xp' or \
                isinstance(node.value, ast.Attribute) and node.value.attr == 'xp':
            return 'cupy.' + '.'.join(parts[::-1])
        node = node.value
    return None


def cupy_chains(text, filename='<source>'):
    """[(line, chain, call)] for CuPy in ``text``: every maximal attribute chain (call None), and
    for every call of a CuPy callable the callee's chain with the call node (for its keywords)."""
    tree = ast.parse(text, filename)
    aliases = _cupy_aliases(tree)
    inner = set()   # nodes another attribute or call continues: their chain is not maximal
    for node in ast.walk(tree):
        if isinstance(node, ast.Attribute):
            inner.add(id(node.value))
        elif isinstance(node, ast.Call):
            inner.add(id(node.func))
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Call):
            chain, call = _chain_of(node.func, aliases) or _xp_chain(node.func), node
        elif isinstance(node, ast.Attribute) and id(node) not in inner:
            chain, call = _chain_of(node, aliases) or _xp_chain(node), None
        else:
            continue
        if chain and '.' in chain:
            found.append((node.lineno, chain, call))
    return found


def _documented_instance_attribute(cls, name):
    """True when a class's docstring lists ``name`` under Attributes ('~Stream.ptr (intptr_t): ...'):
    attributes set in __init__ (Stream.ptr, Event.ptr) are not on the class itself."""
    for klass in inspect.getmro(cls):
        doc = klass.__doc__ or ''
        if 'Attributes:' in doc and re.search(rf'(?m)^\s*(~[\w.]+\.)?{re.escape(name)}\s*\(', doc.split('Attributes:', 1)[1]):
            return True
    return False


def resolve_chain(chain):
    """The object a chain names in the installed CuPy (a class stands for its instances after a
    call), or None where a call's result is unknown; AssertionError naming a missing link."""
    obj, walked, instance = None, '', False
    for part in chain.split('.'):
        calls = part.count('()')
        name = part.replace('()', '')
        if obj is None:
            if name != 'cupy':
                raise AssertionError(f"{chain}: does not start at cupy")
            obj, walked = cupy, 'cupy'
        else:
            if hasattr(obj, name):
                obj = getattr(obj, name)
            elif instance and _documented_instance_attribute(obj, name):
                return None                             # an instance attribute: its type is not known
            else:
                raise AssertionError(f"{chain}: {walked} has no attribute {name!r}")
            walked, instance = walked + '.' + name, False
        for _ in range(calls):
            if isinstance(obj, type):
                instance = True                         # an instance: look attributes up on the class
            elif walked in RETURN_TYPES:
                obj, instance = resolve_chain(RETURN_TYPES[walked]), True
            else:
                return None                             # an unknown return value: stop checking here
            walked += '()'
    return obj


def documented_parameters(obj):
    """Parameter names of a CuPy callable, from inspect or the Cython signature line of its
    docstring ('RawModule(str code=None, *, str path=None, ...)'); None when neither says
    clearly, or when it takes **kwargs."""
    try:
        params = inspect.signature(obj).parameters.values()
        if any(p.kind is inspect.Parameter.VAR_KEYWORD for p in params):
            return None
        return {p.name for p in params}
    except (TypeError, ValueError):
        pass
    doc = (getattr(obj, '__doc__', None) or '').strip()
    match = re.match(r'[\w.]+\((.*?)\)\s*(->.*)?$', doc.splitlines()[0] if doc else '')
    if not match:
        return None
    names = set()
    for item in match.group(1).replace('\\', '').split(','):
        item = item.split('=')[0].strip()
        if item in ('*', '/', 'self', ''):
            continue
        if item.startswith('**'):
            return None
        name = item.split()[-1].lstrip('*')
        if not name.isidentifier():
            return None   # a default with a comma in it: too unclear to judge keywords by
        names.add(name)
    return names


def check_source(text, filename='<source>'):
    """Problems with the CuPy use in ``text``: unresolved chains, unknown keyword arguments."""
    problems = []
    for line, chain, call in cupy_chains(text, filename):
        try:
            obj = resolve_chain(chain)
        except AssertionError as exc:
            problems.append(f"{filename}:{line}: {exc}")
            continue
        keywords = [k.arg for k in call.keywords if k.arg is not None] if call is not None else []
        accepted = documented_parameters(obj) if keywords and obj is not None else None
        for keyword in keywords:
            if accepted is not None and keyword not in accepted:
                problems.append(f"{filename}:{line}: {chain}(...) takes no keyword {keyword!r} "
                                f"(CuPy documents {sorted(accepted)})")
    return problems


def project_sources():
    return sorted(p for d in SOURCE_DIRS for p in (REPO / d).rglob('*.py'))


# ---------------------------------------------------------------- attribute chains

def test_every_cupy_attribute_chain_in_gpuk_and_bench_resolves():
    problems, checked = [], 0
    for path in project_sources():
        text = path.read_text()
        checked += len(cupy_chains(text, str(path)))
        problems += check_source(text, str(path.relative_to(REPO)))
    assert checked > 50, f"the walk found only {checked} CuPy chains: is it still looking at the sources?"
    assert not problems, 'CuPy API mismatches:\n' + '\n'.join(problems)


@pytest.mark.parametrize('snippet, expected', [
    ('import cupy\ncupy.cuda.get_curent_stream().synchronize()\n', "cupy.cuda has no attribute 'get_curent_stream'"),
    ('import cupy as cp\ncp.cuda.runtime.cudaDevAttrL2CacheSiz\n', "has no attribute 'cudaDevAttrL2CacheSiz'"),
    ('def f(rt):\n    return rt.xp.emtpy(3)\n', "cupy has no attribute 'emtpy'"),
    ('import cupy\ncupy.cuda.Device().atributes\n', "cupy.cuda.Device() has no attribute 'atributes'"),
    ('import cupy\ncupy.cuda.get_current_stream().synchronise()\n', "get_current_stream() has no attribute 'synchronise'"),
    ('import cupy\ncupy.RawModule(source="x")\n', "takes no keyword 'source'"),
    ('import cupy\ncupy.random.RandomState(0).standard_normal(3, dtyp=cupy.float32)\n', "takes no keyword 'dtyp'"),
    ('import cupy\ncupy.cuda.Event().record(strem=None)\n', "takes no keyword 'strem'"),
    ('import cupy\ncupy.cuda.get_current_stream().pointer\n', "get_current_stream() has no attribute 'pointer'"),
])
def test_the_walk_catches_misspelt_cupy_names(snippet, expected):
    problems = check_source(snippet)
    assert any(expected in p for p in problems), problems


def test_the_walk_accepts_correct_use():
    assert check_source('import cupy\ns = cupy.cuda.get_current_stream()\ns.synchronize()\n'
                        'e = cupy.cuda.Event()\ncupy.cuda.get_elapsed_time(e, e)\n'
                        'cupy.RawModule(code="", options=("-std=c++17",))\ncupy.RawModule(path="k.cubin")\n'
                        'cupy.cuda.runtime.deviceGetAttribute(cupy.cuda.runtime.cudaDevAttrL2CacheSize, 0)\n'
                        'cupy.cuda.get_current_stream().ptr\ncupy.cuda.Event().ptr\ncupy.cuda.Device().id\n') == []


# ---------------------------------------------------------------- duck-typed objects

def test_raw_module_and_raw_kernel_have_what_cuda_runtime_uses():
    assert {'code', 'path', 'options'} <= documented_parameters(cupy.RawModule)
    assert callable(getattr(cupy.RawModule, 'get_function'))
    kernel = cupy.RawKernel
    for attribute in ('shared_size_bytes', 'max_dynamic_shared_size_bytes'):
        assert hasattr(kernel, attribute), attribute
    assert hasattr(type(kernel.__dict__['max_dynamic_shared_size_bytes']), '__set__'), \
        'RawKernel.max_dynamic_shared_size_bytes must be settable (the opt-in above 48 KB)'
    assert 'shared_mem' in kernel.__call__.__doc__     # __call__(grid, block, args, *, shared_mem=0)
    assert issubclass(cupy.cuda.compiler.CompileException, Exception)
    assert issubclass(cupy.cuda.driver.CUDADriverError, Exception)
    assert issubclass(cupy.cuda.runtime.CUDARuntimeError, Exception)


def test_device_compute_capability_is_documented_as_digits():
    # runtime.normalize_arch turns CuPy's '90' into 'sm_90'
    assert "'35'" in cupy.cuda.Device.compute_capability.__doc__
    assert runtime.normalize_arch('90') == 'sm_90'


# ---------------------------------------------------------------- kernel arguments

def _kernel_scalar_dtypes():
    """{dtype: 'source:kernel(param)'} for every scalar parameter of every registered kernel."""
    found = {}
    for spec in runtime.registered_builds():
        signatures = parse_kernel_signatures(spec.source_file, spec.defines_dict)
        for name in spec.kernels:
            for p in signatures[name].params:
                if not p.is_pointer:
                    found.setdefault(p.dtype, f"{Path(spec.source_file).name}:{name}({p.name})")
    return found


def _bytes_cupy_passes(value):
    """The bytes CuPy hands the driver for a by-value kernel argument (cupy/cuda/function.pyx
    converts every non-array argument with cupy._core._scalar.CScalar)."""
    from cupy._core._scalar import CScalar
    converted = CScalar(value)
    return converted.dtype, ctypes.string_at(converted.ptr, converted.dtype.itemsize)


@pytest.mark.parametrize('dtype', sorted({np.dtype(t) for t in SCALAR_DTYPES.values()}, key=str))
def test_cupy_passes_numpy_scalars_by_value_with_their_exact_type(dtype):
    value = dtype.type(-3 if dtype.kind in 'if' else 3)
    passed_dtype, passed = _bytes_cupy_passes(value)
    assert passed_dtype == dtype
    assert passed == value.tobytes()


def test_every_kernel_scalar_parameter_type_is_one_cupy_passes_exactly():
    dtypes = _kernel_scalar_dtypes()
    assert np.dtype(np.int64) in dtypes and np.dtype(np.int32) in dtypes
    for dtype, where in dtypes.items():
        value = dtype.type(7)
        passed_dtype, passed = _bytes_cupy_passes(value)
        assert (passed_dtype, passed) == (dtype, value.tobytes()), where


def test_python_scalars_would_change_size_so_the_runtime_rejects_them():
    # why runtime.check_args insists on NumPy scalars: CuPy sends a Python float as a double
    assert _bytes_cupy_passes(1.5)[0] == np.float64
    assert _bytes_cupy_passes(1)[0] == np.int64


FAKE_ADDRESS = 0x7f0000000000   # never dereferenced: nothing here touches a device


def fake_device_array(shape, dtype):
    """A real cupy.ndarray over a made-up device address (no GPU, no allocation)."""
    nbytes = max(int(np.prod(shape)) * np.dtype(dtype).itemsize, 1)
    memory = cupy.cuda.memory.UnownedMemory(FAKE_ADDRESS, nbytes, None, device_id=0)
    return cupy.ndarray(shape, dtype, memptr=cupy.cuda.memory.MemoryPointer(memory, 0))


def test_cupy_arrays_pass_the_runtime_argument_checks():
    signature = parse_kernel_signatures(elementwise.SOURCE, elementwise.defines(np.float32))['bias_act_fwd']
    x, bias, y = (fake_device_array(s, np.float32) for s in ((4, 3), (3,), (4, 3)))
    args = (x, bias, y, np.int64(12), np.int64(3), np.int64(1), np.int32(1))
    runtime.check_args(signature, args, cupy.ndarray)   # reads dtype, flags.c_contiguous, flags.writeable
    with pytest.raises(ValueError, match='C-contiguous'):
        runtime.check_args(signature, (x, bias, fake_device_array((4, 6), np.float32)[:, ::2]) + args[3:],
                           cupy.ndarray)
    with pytest.raises(TypeError, match='must be a cupy.ndarray'):
        runtime.check_args(signature, (np.zeros((4, 3), np.float32),) + args[1:], cupy.ndarray)


# ---------------------------------------------------------------- a dry launch

class RecordingRawKernel:
    """Stands in for cupy.RawKernel where the driver would be called; converts arguments
    as CuPy's launch does (cupy/cuda/function.pyx, _pointer) and records each launch."""

    def __init__(self, name):
        self.name, self.launches = name, []
        self.shared_size_bytes = 0
        self.max_dynamic_shared_size_bytes = 48 * 1024

    def __call__(self, grid, block, args, *, shared_mem=0):
        assert isinstance(grid, tuple) and isinstance(block, tuple), 'CuPy takes grid and block as tuples'
        assert isinstance(args, tuple), 'CuPy takes the kernel arguments as a tuple'
        converted = []
        for a in args:
            if isinstance(a, cupy.ndarray):
                converted.append(('pointer', a.data.ptr))
            elif isinstance(a, np.ndarray):
                raise TypeError('CuPy passes only size-1 NumPy arrays by value')
            else:
                converted.append(_bytes_cupy_passes(a))
        self.launches.append((grid, block, converted, shared_mem))


class RecordingRawModule:
    """Stands in for cupy.RawModule, accepting exactly the keywords CuPy documents."""
    created = []

    def __init__(self, code=None, **kwargs):
        unknown = set(kwargs) - documented_parameters(REAL_RAW_MODULE)
        assert not unknown, f"cupy.RawModule takes no {sorted(unknown)}"
        self.code, self.kwargs, self.kernels = code, kwargs, {}
        RecordingRawModule.created.append(self)

    def get_function(self, name):
        return self.kernels.setdefault(name, RecordingRawKernel(name))


class FakeDevice:
    """cupy.cuda.Device() of an sm_90 card, without a driver."""
    id = 0
    compute_capability = '90'


@pytest.fixture
def dry_cuda(monkeypatch, tmp_path):
    """A CudaRuntime whose arrays sit at fake addresses and whose modules record launches."""
    monkeypatch.setenv('GPUK_CACHE_DIR', str(tmp_path / 'cache'))
    monkeypatch.setenv('GPUK_CUBIN_DIR', str(tmp_path / 'prebuilt'))
    monkeypatch.setattr(cupy.cuda, 'Device', FakeDevice)
    attributes = {cupy.cuda.runtime.cudaDevAttrMaxSharedMemoryPerBlockOptin: 227 * 1024}
    monkeypatch.setattr(cupy.cuda.runtime, 'deviceGetAttribute', lambda attr, dev: attributes[attr])
    monkeypatch.setattr(cupy, 'RawModule', RecordingRawModule)
    monkeypatch.setattr(RecordingRawModule, 'created', [])
    previous_allocator = cupy.cuda.get_allocator()
    cupy.cuda.set_allocator(lambda nbytes: cupy.cuda.memory.MemoryPointer(
        cupy.cuda.memory.UnownedMemory(FAKE_ADDRESS, max(nbytes, 1), None, device_id=0), 0))
    try:
        yield cuda_runtime.CudaRuntime()
    finally:
        cupy.cuda.set_allocator(previous_allocator)


def test_a_launcher_runs_through_the_cuda_runtime_up_to_the_driver(dry_cuda):
    pytest.importorskip('cuda.bindings', reason="gpuk's NVRTC (cuda-bindings) compiles the cubin")
    x = fake_device_array((5, 7), np.float32)
    y = elementwise.copy(x, runtime=dry_cuda)
    assert isinstance(y, cupy.ndarray) and y.shape == x.shape
    (module,) = RecordingRawModule.created
    cubin = Path(module.kwargs['path'])
    assert module.code is None and cubin.is_file() and cubin.parent.name == 'cubin'   # gpuk's NVRTC, cached
    grid, block, args, shared_mem = module.kernels['copy_bytes'].launches[0]
    assert grid == (1, 1, 1) and block == (elementwise.COPY_THREADS, 1, 1) and shared_mem == 0
    assert args == [('pointer', x.data.ptr), ('pointer', y.data.ptr),
                    (np.dtype(np.int64), np.int64(x.nbytes).tobytes())]


def test_dynamic_shared_memory_opts_in_once_and_respects_the_device_limit(dry_cuda):
    pytest.importorskip('cuda.bindings', reason="gpuk's NVRTC (cuda-bindings) compiles the cubin")
    kernel = dry_cuda.load(elementwise.SOURCE, elementwise.defines(np.float32)).kernel('copy_bytes')
    src, dst = fake_device_array((64,), np.uint8), fake_device_array((64,), np.uint8)
    kernel.launch(1, 32, (src, dst, np.int64(64)), shared_mem=40 * 1024)
    assert kernel._function.max_dynamic_shared_size_bytes == 48 * 1024   # within CUDA's default
    kernel.launch(1, 32, (src, dst, np.int64(64)), shared_mem=100 * 1024)
    assert kernel._function.max_dynamic_shared_size_bytes == 100 * 1024
    with pytest.raises(ValueError, match=r'shared_mem must be an int in \[0, 232448\]'):
        kernel.launch(1, 32, (src, dst, np.int64(64)), shared_mem=228 * 1024)
