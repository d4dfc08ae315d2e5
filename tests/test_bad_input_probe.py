"""A generated probe of bad input over the K API (issue 17).

Each case calls one K function with one argument replaced by a value it cannot take (a
string, None, a complex or object array, a wrong rank, a negative or fractional size, ...),
evaluating the result when the call itself accepted it. Every case must end in a ValueError
or TypeError whose message starts with the K function's name, and no failed call may change
a variable. ``test_probe_figures`` states how many cases ran.
"""
import numpy as np
import pytest

from gpuk import backend as K

NOT_TENSORS = [None, 'abc', np.array([1 + 2j, 3j]), np.array([object()]), {'a': 1}, len]
NOT_INTS = ['2', 1.5, np.array([1, 2]), 1 + 1j, None]
NOT_AXES = ['0', 1.5, 7, -7, 1 + 1j]
NOT_SHAPES = [(-2, 3), ('a', 2), (1.5,), 'shape', ((2,), 3)]
NOT_FLOATS = ['x', 1 + 1j, np.array([1.0, 2.0]), None]
NOT_DATA_FORMATS = ['NHWC', 'channels_middle', 3]
NOT_PADDINGS = ['full', 'samee', 0]


def _variables():
    rng = np.random.RandomState(0)
    return dict(
        m=K.variable(rng.rand(2, 3), name='probe_m'),        # a float matrix
        v=K.variable(rng.rand(3), name='probe_v'),           # a float vector
        i=K.variable([0, 2, 1], dtype='int32', name='probe_i'),
        img=K.variable(rng.rand(1, 5, 5, 2), name='probe_img'),
        ker=K.variable(rng.rand(3, 3, 2, 4), name='probe_ker'),
        seq=K.variable(rng.rand(2, 4, 3), name='probe_seq'),
        p=K.variable(rng.dirichlet(np.ones(3), 2), name='probe_p'),
    )


def _specs(V):
    """(name, good arguments, {argument index: bad values}) for K functions."""
    m, v, i, img, ker, seq, p = (V[k] for k in ('m', 'v', 'i', 'img', 'ker', 'seq', 'p'))
    unary = ['abs', 'square', 'sqrt', 'exp', 'log', 'round', 'sign', 'cos', 'sin', 'sigmoid',
             'hard_sigmoid', 'tanh', 'softplus', 'softsign', 'relu', 'elu', 'softmax',
             'transpose', 'flatten', 'batch_flatten', 'zeros_like', 'ones_like', 'stop_gradient',
             'identity', 'cumsum', 'cumprod', 'argmax', 'argmin', 'shape', 'size', 'l2_normalize']
    reductions = ['max', 'min', 'sum', 'prod', 'mean', 'var', 'std', 'any', 'all', 'logsumexp']
    binary = ['maximum', 'minimum', 'equal', 'not_equal', 'greater', 'greater_equal', 'less',
              'less_equal', 'dot', 'batch_dot']
    specs = [(name, (m,), {0: NOT_TENSORS}) for name in unary]
    specs += [(name, (m, 1), {0: NOT_TENSORS, 1: NOT_AXES}) for name in reductions]
    specs += [(name, (m, m if name not in ('dot', 'batch_dot') else K.transpose(m)),
               {0: NOT_TENSORS, 1: NOT_TENSORS}) for name in binary]
    specs += [
        ('pow', (m, 2), {0: NOT_TENSORS, 1: ['2', None, 1 + 1j]}),
        ('clip', (m, 0.2, 0.8), {0: NOT_TENSORS, 1: NOT_FLOATS[:-1], 2: NOT_FLOATS[:-1]}),  # None: no bound
        ('cast', (m, 'int32'), {0: NOT_TENSORS, 1: ['complex64', 'str', 'float7', object]}),
        ('reshape', (m, (3, 2)), {0: NOT_TENSORS, 1: NOT_SHAPES + [(4, 2)]}),
        ('permute_dimensions', (m, (1, 0)), {0: NOT_TENSORS, 1: [(0, 0), (0,), ('a', 0), (0, 2)]}),
        ('expand_dims', (m, 0), {0: NOT_TENSORS, 1: NOT_AXES}),
        ('squeeze', (K.expand_dims(m, 0), 0), {0: NOT_TENSORS, 1: NOT_AXES + [1]}),
        ('repeat', (m, 2), {0: NOT_TENSORS + [v], 1: NOT_INTS + [-1]}),
        ('repeat_elements', (m, 2, 1), {0: NOT_TENSORS, 1: NOT_INTS + [-1], 2: NOT_AXES}),
        ('tile', (m, (2, 1)), {0: NOT_TENSORS, 1: NOT_SHAPES}),
        ('reverse', (m, 1), {0: NOT_TENSORS, 1: NOT_AXES}),
        ('concatenate', ([m, m], 0), {0: [[m, 'a'], [m, None], [m, v], [m, i]], 1: NOT_AXES}),
        ('stack', ([m, m], 0), {0: [[m, 'a'], [m, v], [], 'ab'], 1: NOT_AXES}),
        ('gather', (m, i[:2]), {0: NOT_TENSORS, 1: NOT_TENSORS + [K.constant([0.5])]}),
        ('one_hot', (i, 3), {0: NOT_TENSORS + [m], 1: NOT_INTS + [-1]}),
        ('arange', (0, 5), {0: ['a', None, 1 + 1j], 1: ['b', 1 + 1j]}),
        ('slice', (m, (0, 0), (1, 2)), {0: NOT_TENSORS, 1: [(0,), ('a', 0), (-1, 0)],
                                        2: [(1,), (5, 5), ('a', 1)]}),
        ('switch', (K.greater(m, 0.5), m, m), {0: NOT_TENSORS, 1: NOT_TENSORS, 2: NOT_TENSORS}),
        ('in_top_k', (p, i[:2], 1), {0: NOT_TENSORS, 1: NOT_TENSORS + [K.constant([0.5, 1.0])],
                                     2: NOT_INTS}),
        ('bias_add', (m, v, None), {0: NOT_TENSORS, 1: NOT_TENSORS + [K.constant(np.ones(4))],
                              2: NOT_DATA_FORMATS}),
        ('categorical_crossentropy', (p, p), {0: NOT_TENSORS, 1: NOT_TENSORS + [i]}),
        ('sparse_categorical_crossentropy', (i[:2], p), {0: NOT_TENSORS, 1: NOT_TENSORS + [i]}),
        ('binary_crossentropy', (p, p), {0: NOT_TENSORS, 1: NOT_TENSORS}),
        ('dropout', (m, 0.5), {0: NOT_TENSORS, 1: NOT_FLOATS + [1.5, -0.1]}),
        ('conv2d', (img, ker, (1, 1)), {0: NOT_TENSORS + [m], 1: NOT_TENSORS + [m],
                                2: [(0, 1), (-1, 1), 'a', (1.5, 1)]}),
        ('depthwise_conv2d', (img, K.variable(np.ones((3, 3, 2, 1)))),
         {0: NOT_TENSORS + [m], 1: NOT_TENSORS + [m]}),
        ('pool2d', (img, (2, 2), (1, 1), 'valid'), {0: NOT_TENSORS + [m], 1: [(0, 2), (-1, 2), 'a', (9, 9)],
                                   2: [(0, 1), 'a'], 3: NOT_PADDINGS}),
        ('spatial_2d_padding', (img, ((1, 1), (1, 1))), {0: NOT_TENSORS + [m],
                                                         1: [((-1, 1), (1, 1)), 'a', ((1,), (1,))]}),
        ('resize_images', (img, 2, 2, 'channels_last'), {0: NOT_TENSORS + [m], 1: NOT_INTS + [0],
                                                         3: NOT_DATA_FORMATS}),
        ('random_normal', ((2, 3),), {0: NOT_SHAPES}),
        ('random_uniform', ((2, 3),), {0: NOT_SHAPES}),
        ('random_binomial', ((2, 3), 0.5), {0: NOT_SHAPES, 1: NOT_FLOATS + [1.5]}),
        ('zeros', ((2, 3),), {0: NOT_SHAPES}),
        ('ones', ((2, 3),), {0: NOT_SHAPES}),
        ('eye', (3,), {0: NOT_INTS[:2] + [-1]}),
        ('constant', (1.0,), {0: NOT_TENSORS}),
        ('variable', (1.0,), {0: NOT_TENSORS}),
        ('placeholder', ((2, 3),), {0: NOT_SHAPES}),
        ('map_fn', (K.sum, m), {1: NOT_TENSORS + [K.constant(1.0)]}),
        ('foldl', (lambda a, x: a + x, m), {1: NOT_TENSORS + [K.constant(1.0)]}),
        ('rnn', (lambda x, s: (x, s), seq, [m]), {1: NOT_TENSORS + [m], 2: [[m, 'a'], ['a']]}),
        ('ctc_batch_cost', (K.constant([[0, 1]]), seq[:1], K.constant([[4]]), K.constant([[2]])),
         {0: NOT_TENSORS, 1: NOT_TENSORS + [m], 2: NOT_TENSORS + [K.constant([[9]])],
          3: NOT_TENSORS + [K.constant([[-1]])]}),
    ]
    return specs


def _cases(V):
    for name, good, bad_by_index in _specs(V):
        for index, bad_values in bad_by_index.items():
            for bad in bad_values:
                args = list(good)
                args[index] = bad
                yield name, index, bad, args


def _writing_cases(V):
    """Writes that must fail whole: (name, call)."""
    m, v, i = V['m'], V['v'], V['i']
    bad_values = [np.ones((3, 2)), 'abc', None, np.array([1 + 1j] * 6).reshape(2, 3),
                  np.array([[object()] * 3] * 2)]
    for bad in bad_values:
        yield 'set_value', lambda bad=bad: K.set_value(m, bad)
        yield 'batch_set_value', lambda bad=bad: K.batch_set_value([(v, np.zeros(3)), (m, bad)])
        yield 'update_add', lambda bad=bad: K.eval(K.update_add(m, bad))
        yield 'update_sub', lambda bad=bad: K.eval(K.update_sub(m, bad))
        yield 'update', lambda bad=bad: K.eval(K.update(m, bad))
        yield 'moving_average_update', lambda bad=bad: K.eval(K.moving_average_update(m, bad, 0.9))
    for bad in (np.array([0.5, 1, 2]), np.array([np.nan, 1, 2]), 'abc'):
        yield 'set_value', lambda bad=bad: K.set_value(i, bad)
        yield 'batch_set_value', lambda bad=bad: K.batch_set_value([(v, np.zeros(3)), (i, bad)])
    yield 'batch_set_value', lambda: K.batch_set_value([(v, np.zeros(3)), ('not a variable', 1)])
    yield 'set_value', lambda: K.set_value(m + 1, np.ones((2, 3)))
    yield 'update_add', lambda: K.update_add(m + 1, 1.0)


def _run_probe():
    V = _variables()
    snapshot = {k: K.get_value(x).copy() for k, x in V.items()}
    figures = dict(tried=0, clear=0)
    unclear = []

    def attempt(name, call, label):
        figures['tried'] += 1
        try:
            result = call()
            if K.is_tensor(result):
                K.eval(result)
            elif isinstance(result, (list, tuple)) and all(K.is_tensor(r) for r in result):
                [K.eval(r) for r in result]
        except (ValueError, TypeError) as error:
            if str(error).startswith(name + ':'):
                figures['clear'] += 1
                return
            unclear.append('%s: %s -> %s: %s' % (name, label, type(error).__name__, error))
        except Exception as error:  # noqa: BLE001 - the probe reports every kind of failure
            unclear.append('%s: %s -> %s: %s' % (name, label, type(error).__name__, error))
        else:
            unclear.append('%s: %s -> accepted' % (name, label))

    for name, index, bad, args in _cases(V):
        attempt(name, lambda: getattr(K, name)(*args), 'argument %d = %r' % (index, bad))
    for name, call in _writing_cases(V):
        attempt(name, call, 'write')
    changed = [k for k, x in V.items() if not np.array_equal(K.get_value(x), snapshot[k])]
    return figures, unclear, changed


@pytest.fixture(scope='module')
def probe():
    return _run_probe()


def test_every_bad_input_gets_a_clear_error(probe):
    figures, unclear, _ = probe
    assert not unclear, '%d of %d cases without a clear error:\n%s' % (
        len(unclear), figures['tried'], '\n'.join(unclear[:40]))


def test_no_failed_call_changed_a_variable(probe):
    _, _, changed = probe
    assert not changed


def test_probe_figures(probe):
    figures, unclear, changed = probe
    print('bad-input probe: %d cases tried, %d clear errors, %d variables changed'
          % (figures['tried'], figures['clear'], len(changed)))
    assert figures['tried'] >= 500
