"""What identifies a benchmark run: its file names, the `latest` pointer, thread settings, load;
and the scripts' comma-separated arguments (``comma_list``).

Stdlib only, so ``python -m bench`` can set the thread variables before NumPy (or torch)
is first imported: OpenBLAS, MKL and OpenMP read them once, when they load.

- Every run writes ``<device>-<date>-<time>-<mode>.json`` (mode quick, full or partial)
  and its report beside it under the same stem; nothing is ever overwritten (a second run
  in the same second gets a ``-2`` suffix).
- ``bench/results/latest`` is a one-line text file naming the newest results JSON;
  ``python -m bench.report latest`` and friends accept the word ``latest``.
"""
import datetime
import os
import platform
import re

RESULTS_DIR = os.path.join(os.path.dirname(os.path.abspath(__file__)), 'results')
LATEST_NAME = 'latest'
# The libraries' own variables; GPUK_CPU_THREADS sizes the NumPy twins' block pool.
THREAD_VARIABLES = ('OMP_NUM_THREADS', 'OPENBLAS_NUM_THREADS', 'MKL_NUM_THREADS', 'GPUK_CPU_THREADS')
DEFAULT_THREADS = 1   # one thread each: the comparison is per core, and a shared host stays usable
MODES = ('quick', 'full', 'partial')


def apply_thread_env(threads, environ=None):
    """Sets every thread variable to ``threads`` (must run before NumPy/torch load)."""
    if not isinstance(threads, int) or threads < 1:
        raise ValueError('apply_thread_env: threads must be an int >= 1, got %r' % (threads,))
    environ = os.environ if environ is None else environ
    for name in THREAD_VARIABLES:
        environ[name] = str(threads)
    # torch's OpenMP threads spin at barriers by default; on a shared host a spinning thread
    # waits for a descheduled one (small ops measured 30-80x slower). Passive is its best setting.
    environ.setdefault('OMP_WAIT_POLICY', 'PASSIVE')
    return {name: environ[name] for name in THREAD_VARIABLES + ('OMP_WAIT_POLICY',)}


def comma_list(text):
    """The items of a comma-separated argument (``--models mlp,lstm``), stripped, empty ones
    dropped: what every bench script's list option takes (bench/keras3_jax.py, which runs in a
    site of its own, can import this stdlib-only module too)."""
    return [item for item in (part.strip() for part in text.split(',')) if item]


def slug(text):
    return re.sub(r'[^A-Za-z0-9]+', '-', text).strip('-').lower()


def run_stem(device, mode, when=None):
    """``<device slug>-<YYYY-MM-DD>-<HHMMSS>-<mode>`` for a run started at ``when`` (UTC)."""
    if mode not in MODES:
        raise ValueError('run_stem: mode must be one of %s, got %r' % (MODES, mode))
    when = when or datetime.datetime.now(datetime.timezone.utc)
    return '%s-%s-%s' % (slug(device), when.strftime('%Y-%m-%d-%H%M%S'), mode)


def new_results_path(device, mode, folder=RESULTS_DIR, when=None):
    """A results JSON path under ``folder`` that no earlier run used."""
    stem = run_stem(device, mode, when)
    path = os.path.join(folder, stem + '.json')
    n = 2
    while os.path.exists(path):
        path = os.path.join(folder, '%s-%d.json' % (stem, n))
        n += 1
    return path


def write_latest(results_path, folder=None):
    """Points ``folder/latest`` (default: the JSON's folder) at ``results_path``."""
    folder = folder or os.path.dirname(os.path.abspath(results_path))
    pointer = os.path.join(folder, LATEST_NAME)
    partial = pointer + '.tmp'
    with open(partial, 'w') as f:
        f.write(os.path.relpath(os.path.abspath(results_path), folder) + '\n')
    os.replace(partial, pointer)
    return pointer


def read_latest(folder=RESULTS_DIR):
    """The results JSON ``folder/latest`` names, or None when there is no pointer yet."""
    pointer = os.path.join(folder, LATEST_NAME)
    try:
        with open(pointer) as f:
            name = f.read().strip()
    except FileNotFoundError:
        return None
    return os.path.join(folder, name) if name else None


def resolve(path, folder=RESULTS_DIR):
    """``path`` itself; for the word 'latest' the run bench/results/latest names, and for a
    path to another `latest` pointer the run that one names."""
    if path != LATEST_NAME and not (os.path.basename(path) == LATEST_NAME and os.path.isfile(path)):
        return path
    if path != LATEST_NAME:
        folder = os.path.dirname(os.path.abspath(path))
    target = read_latest(folder)
    if target is None:
        raise ValueError("no 'latest' run: %s does not exist yet (run python -m bench first)"
                         % os.path.join(folder, LATEST_NAME))
    return target


def load_average():
    """(1, 5, 15)-minute load averages, or None where the OS has none."""
    try:
        return tuple(round(x, 2) for x in os.getloadavg())
    except (AttributeError, OSError):
        return None


def cpu_name():
    """The CPU's model name (/proc/cpuinfo), else what platform says."""
    try:
        with open('/proc/cpuinfo') as f:
            for line in f:
                if line.startswith('model name'):
                    return line.split(':', 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine() or 'CPU'


def usable_cpus():
    return len(os.sched_getaffinity(0)) if hasattr(os, 'sched_getaffinity') else os.cpu_count()
