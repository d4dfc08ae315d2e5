"""Keras 2.3.1's own test suite on gpuk: ``python -m tests.keras_upstream`` (``make keras-suite``).

Not part of ``make test`` (about 2 minutes a run on a 2-core CPU); the results are in
bench/RESULTS.md, "Keras 2.3.1's own test suite on gpuk".

What it does
- fetches the Keras 2.3.1 sdist from PyPI once (``pip download --no-binary``; checked against
  its sha256) into ``.keras-upstream/`` (ignored by git) and unpacks its ``tests/`` there;
  Keras itself is the installed ``keras==2.3.1``, never the sdist's copy;
- runs pytest in a subprocess on the directories that apply to a non-TensorFlow backend
  (DIRECTORIES below) with ``KERAS_BACKEND=gpuk.backend``, ``GPUK_DEVICE=cpu`` (``--device
  emulate``: the CUDA kernels on the emulated CUDA runtime; best on a subset, ``-k``), a private
  ``KERAS_HOME`` (``.keras-upstream/keras-home``: the datasets test_datasets.py downloads stay
  there), and this module as a pytest plugin (a per-test time limit, see below);
- reads the JUnit XML and prints passed / failed / errors / skipped per file, the failures'
  first lines (``--failures``), and the pass rate: passed / (passed + failed + errors).
  Tests upstream skips (``skipif(K.backend() != 'tensorflow')`` and the like) count as skipped,
  and so do files that import tensorflow at their top, the tests of NEEDS_THEANO (they call
  Keras's Theano backend module) and test_datasets.py where its hosts do not resolve;
- clears gpuk's session after each test, as upstream's conftest does on TensorFlow, and seeds
  NumPy's and Python's generators before each (repeatable runs); a test running past
  GPUK_KERAS_SUITE_TEST_LIMIT_S seconds (600) fails.

What upstream's tests need beyond gpuk's ``test`` extra: pandas (engine/test_training.py), flaky
(a decorator in four files) and requests (the RemoteMonitor tests): the ``keras-suite`` extra in
pyproject.toml. vis_utils_test.py also needs pydot and Graphviz (not in the extra: a system
package); without them its 2 tests fail.

backend_test.py compares "the backend" against Keras's NumPy reference by importing
``keras.backend.tensorflow_backend`` (or theano / cntk) as KTF; with gpuk, that import fails and
every comparison would call ``None``. The plugin puts gpuk.backend in that module's place
(``sys.modules``), so those tests compare gpuk against the NumPy reference, as they compare
TensorFlow on Keras's CI. ``--no-backend-alias`` turns that off.

``--tf-marked`` also runs the tests upstream skips on backends other than TensorFlow (a skip mark
whose reason names TensorFlow, or a bare one; not those that need a GPU or TensorBoard): how far
gpuk's TensorFlow semantics go, reported apart from the pass rate above.

Left out: tests/docs (Keras's documentation build: markdown, its docs/ folder) and
tests/test_api.py (pyux, the API signature of Keras itself); neither touches the backend.
engine/layer_subclassing_tests.py matches neither of pytest's file patterns, so it is not
collected from its directory (3 pass, 1 skipped when named).

    python -m tests.keras_upstream                       # everything, NumPy device
    python -m tests.keras_upstream tests/keras/layers --failures
    python -m tests.keras_upstream --device emulate tests/keras/layers/pooling_test.py
    python -m tests.keras_upstream --junit-only run.xml  # re-print a run's summary
"""
import argparse
import collections
import hashlib
import os
import signal
import socket
import subprocess
import sys
import tarfile
import time
import xml.etree.ElementTree as ElementTree

import pytest

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
CACHE = os.path.join(REPO, '.keras-upstream')
SDIST = 'Keras-2.3.1.tar.gz'
SDIST_SHA256 = '321d43772006a25a1d58eea17401ef2a34d388b588c9f7646c34796151ebc8cc'
# Relative to the sdist's root: what applies to a backend other than TensorFlow.
DIRECTORIES = ['tests/keras', 'tests/integration_tests', 'tests/test_dynamic_trainability.py',
               'tests/test_loss_masking.py', 'tests/test_loss_weighting.py',
               'tests/test_model_pickling.py', 'tests/test_model_saving.py',
               'tests/test_multiprocessing.py']
TEST_TIME_LIMIT_S = int(os.environ.get('GPUK_KERAS_SUITE_TEST_LIMIT_S', '600'))


# ---- the pytest plugin (loaded in the subprocess with -p tests.keras_upstream) ----

# Tests that call Keras's Theano backend module itself (`for k in [KTH, KTF]`: TensorFlow compared
# with Theano); without Theano, KTH is None. They count as skipped, like upstream's own skips.
NEEDS_THEANO = {
    'tests/keras/backend/backend_test.py::TestBackend::test_print_tensor',
    'tests/keras/backend/backend_test.py::TestBackend::test_gradient',
    'tests/keras/backend/backend_test.py::TestBackend::test_function',
    'tests/keras/backend/backend_test.py::TestBackend::test_resize_images_bilinear',
}


DATASET_HOSTS = ('s3.amazonaws.com', 'www.cs.toronto.edu', 'fashion-mnist.s3-website.eu-central-1.amazonaws.com')


def pytest_configure(config):
    if os.environ.get('GPUK_KERAS_SUITE_ALIAS', '1') == '1':
        import gpuk.backend
        # backend_test.py: `from keras.backend import tensorflow_backend as KTF`; the
        # comparisons then run on gpuk against keras.backend.numpy_backend.
        sys.modules.setdefault('keras.backend.tensorflow_backend', gpuk.backend)


def _keeps_for_tensorflow(mark):
    """A skip / skipif mark upstream sets for backends other than TensorFlow (not one that needs
    a GPU, CNTK, Theano or something else): its reason names TensorFlow, or it is bare."""
    if mark.name not in ('skip', 'skipif'):
        return False
    reason = str(mark.kwargs.get('reason', '') or (mark.args[0] if mark.name == 'skip' and mark.args else ''))
    if 'GPU' in reason or 'TensorBoard' in reason:
        return False
    return not reason or 'tensorflow' in reason.lower() or reason.startswith('TF') or 'tf' in reason.split()


def _resolves(host):
    try:
        socket.getaddrinfo(host, 443)
        return True
    except OSError:
        return False


def pytest_collection_modifyitems(config, items):
    skip = pytest.mark.skip(reason='calls the Theano backend module (KTH), not installed')
    # test_datasets.py downloads from these hosts in a random 20% of its runs (and passes having
    # tested nothing otherwise): where they do not resolve, its tests count as skipped.
    offline = None
    for item in items:
        if item.nodeid.split('[')[0] in NEEDS_THEANO:
            item.add_marker(skip)
        if item.nodeid.startswith('tests/integration_tests/test_datasets.py'):
            if offline is None:
                offline = [h for h in DATASET_HOSTS if not _resolves(h)]
            if offline:
                item.add_marker(pytest.mark.skip(reason='downloads datasets; %s do(es) not resolve here'
                                                 % ', '.join(offline)))
        if os.environ.get('GPUK_KERAS_SUITE_TF_MARKED') == '1':
            # --tf-marked: run what upstream keeps for TensorFlow, too.
            for node in item.listchain():
                node.own_markers[:] = [m for m in node.own_markers if not _keeps_for_tensorflow(m)]


@pytest.fixture(autouse=True)
def _clear_session_after_test():
    """Upstream's tests/conftest.py clears the session after each test on TensorFlow and CNTK
    only (the graph backends); gpuk is one too, and a learning phase a test sets
    (normalization_test.py: K.set_learning_phase(1)) would otherwise leak into later tests.
    Each test starts from seeded NumPy and random generators, so a run is repeatable (an
    unseeded shuffle in image_test.py comes out unshuffled about once in 300 runs)."""
    import random
    import numpy as np
    np.random.seed(1234)
    random.seed(1234)
    yield
    from gpuk.backend import clear_session
    clear_session()


@pytest.hookimpl(hookwrapper=True)
def pytest_make_collect_report(collector):
    """A test file that imports tensorflow at its top (TF-only files whose skip marker comes
    after the import: metrics_confusion_matrix_test.py, multi_gpu_test.py, ...) is skipped."""
    report = (yield).get_result()
    if report.failed and "No module named 'tensorflow'" in str(report.longrepr):
        report.outcome = 'skipped'
        report.longrepr = (str(collector.path), 0, 'Skipped: the file imports tensorflow')


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_call(item):
    """A test that runs past TEST_TIME_LIMIT_S fails (a hang must not stop the run)."""
    def too_long(signum, frame):
        raise TimeoutError('keras_upstream: test ran past %d s' % TEST_TIME_LIMIT_S)
    previous = signal.signal(signal.SIGALRM, too_long)
    signal.alarm(TEST_TIME_LIMIT_S)
    try:
        yield
    finally:
        signal.alarm(0)
        signal.signal(signal.SIGALRM, previous)


# ---- the runner ----

def fetch():
    """The unpacked sdist's root, fetched and unpacked on first use."""
    root = os.path.join(CACHE, 'Keras-2.3.1')
    if os.path.isdir(os.path.join(root, 'tests')):
        return root
    os.makedirs(CACHE, exist_ok=True)
    archive = os.path.join(CACHE, SDIST)
    if not os.path.exists(archive):
        subprocess.run([sys.executable, '-m', 'pip', 'download', '--quiet', '--no-deps',
                        '--no-binary=:all:', '--dest', CACHE, 'keras==2.3.1'], check=True)
    with open(archive, 'rb') as f:
        digest = hashlib.sha256(f.read()).hexdigest()
    if digest != SDIST_SHA256:
        raise RuntimeError('keras_upstream: %s has sha256 %s, expected %s' % (archive, digest, SDIST_SHA256))
    with tarfile.open(archive) as tar:
        members = [m for m in tar.getmembers()
                   if m.name.startswith('Keras-2.3.1/tests/') and (m.isfile() or m.isdir())]
        tar.extractall(CACHE, members=members)
    return root


def run(root, targets, device, junit, pytest_args, alias, tf_marked=False):
    # A KERAS_HOME of the suite's own (the user's ~/.keras untouched) that keeps the datasets
    # integration_tests/test_datasets.py downloads (keras.utils.get_file caches them there).
    keras_home = os.path.join(CACHE, 'keras-home')
    if os.path.exists(os.path.join(keras_home, 'keras.json')):
        os.remove(os.path.join(keras_home, 'keras.json'))   # Keras's defaults, written afresh
    os.makedirs(keras_home, exist_ok=True)
    env = dict(os.environ, KERAS_BACKEND='gpuk.backend', GPUK_DEVICE=device, KERAS_HOME=keras_home,
               MPLBACKEND='Agg', GPUK_KERAS_SUITE_ALIAS='1' if alias else '0',
               GPUK_KERAS_SUITE_TF_MARKED='1' if tf_marked else '0',
               PYTHONPATH=os.pathsep.join([REPO] + [p for p in os.environ.get('PYTHONPATH', '').split(os.pathsep) if p]))
    command = [sys.executable, '-m', 'pytest', '-q', '-rN', '-p', 'no:cacheprovider',
               '-p', 'tests.keras_upstream', '--import-mode=importlib', '--continue-on-collection-errors', '--rootdir', root,
               '-c', os.devnull, '-o', 'junit_family=xunit1', '--junitxml', junit,
               '-W', 'ignore::DeprecationWarning'] + pytest_args + targets
    return subprocess.run(command, cwd=root, env=env).returncode


def outcomes(junit):
    """{file: Counter(passed=, failed=, errors=, skipped=)}, [(test id, outcome, message)]."""
    per_file = collections.defaultdict(collections.Counter)
    problems, skips = [], collections.Counter()
    for case in ElementTree.parse(junit).getroot().iter('testcase'):
        path = case.get('file') or case.get('classname', '').replace('.', '/') + '.py'
        outcome, message = 'passed', ''
        for child in case:
            if child.tag in ('failure', 'error', 'skipped'):
                outcome = {'failure': 'failed', 'error': 'errors', 'skipped': 'skipped'}[child.tag]
                message = (child.get('message') or '').strip().splitlines()
                message = message[0][:160] if message else ''
                break
        per_file[path][outcome] += 1
        if outcome in ('failed', 'errors'):
            problems.append(('%s::%s' % (path, case.get('name')), outcome, message))
        elif outcome == 'skipped':
            skips[(path, message)] += 1
    return per_file, problems, skips


def report(junit, show_failures, out=sys.stdout):
    per_file, problems, skips = outcomes(junit)
    kinds = ('passed', 'failed', 'errors', 'skipped')
    width = max([len(p) for p in per_file] + [4])
    print('%-*s %7s %7s %7s %7s' % ((width, 'file') + kinds), file=out)
    total = collections.Counter()
    for path in sorted(per_file):
        total.update(per_file[path])
        print('%-*s %7d %7d %7d %7d' % ((width, path) + tuple(per_file[path][k] for k in kinds)), file=out)
    print('%-*s %7d %7d %7d %7d' % ((width, 'total') + tuple(total[k] for k in kinds)), file=out)
    ran = total['passed'] + total['failed'] + total['errors']
    rate = 100.0 * total['passed'] / ran if ran else 0.0
    print('pass rate: %d / %d = %.1f%% (skipped %d: see --failures for why)'
          % (total['passed'], ran, rate, total['skipped']), file=out)
    if show_failures:
        for (path, message), count in sorted(skips.items()):
            print('SKIPPED %d %s: %s' % (count, path, message), file=out)
        for test, outcome, message in problems:
            print('%s %s: %s' % (outcome.upper()[:6], test, message), file=out)
    return rate


def main(argv=None):
    parser = argparse.ArgumentParser(prog='python -m tests.keras_upstream', description=__doc__.split('\n')[0])
    parser.add_argument('targets', nargs='*', help='paths inside the sdist (default: %s)' % ' '.join(DIRECTORIES))
    parser.add_argument('--device', default='cpu', choices=['cpu', 'emulate'],
                        help="GPUK_DEVICE for the run (default cpu: the NumPy twins)")
    parser.add_argument('-k', dest='keyword', help="pytest's -k")
    parser.add_argument('--failures', action='store_true',
                        help='list each failure and error with its first line, and the skips by reason')
    parser.add_argument('--junit', default=None, help='where to keep the JUnit XML (default: .keras-upstream/last-<device>.xml)')
    parser.add_argument('--junit-only', metavar='XML', help='print the summary of an earlier run and exit')
    parser.add_argument('--tf-marked', action='store_true',
                        help='also run the tests upstream skips for backends other than TensorFlow '
                             '(skip marks naming TensorFlow, and bare ones; not those needing a GPU)')
    parser.add_argument('--no-backend-alias', action='store_true',
                        help='leave keras.backend.tensorflow_backend unimportable (backend_test.py errors)')
    args, pytest_args = parser.parse_known_args(argv)   # the rest goes to pytest (-x, --lf, ...)
    if args.junit_only:
        report(args.junit_only, args.failures)
        return 0
    root = fetch()
    junit = os.path.abspath(args.junit or os.path.join(CACHE, 'last-%s.xml' % args.device))
    targets = args.targets or DIRECTORIES
    extra = [a for a in pytest_args if a != '--'] + (['-k', args.keyword] if args.keyword else [])
    start = time.time()
    code = run(root, targets, args.device, junit, extra, not args.no_backend_alias, args.tf_marked)
    if not os.path.exists(junit):
        print('keras_upstream: pytest wrote no results (exit %d)' % code)
        return code or 1
    print('\nKeras 2.3.1 tests on gpuk (GPUK_DEVICE=%s%s), %s, %.0f s:' % (
        args.device, ', with the TensorFlow-marked tests' if args.tf_marked else '', ' '.join(targets), time.time() - start))
    report(junit, args.failures)
    return 0


if __name__ == '__main__':
    sys.exit(main())
