"""Bad input gives a clear error and changes nothing (issue 17): errors are ValueError or
TypeError naming the K function called; writing calls are all-or-nothing; arrays handed in
are copied."""
import re

import numpy as np
import pytest

import gpuk
from gpuk import backend as K


def test_batch_set_value_is_all_or_nothing():
    w, w2 = K.variable(np.zeros((2, 2))), K.variable(np.zeros(3))
    for bad in (np.ones(4), np.array(['a', 'b', 'c']), None):
        with pytest.raises((ValueError, TypeError), match='batch_set_value'):
            K.batch_set_value([(w, np.ones((2, 2))), (w2, bad)])
        np.testing.assert_array_equal(K.get_value(w), 0)
    iv = K.variable(np.zeros(2), dtype='int32')
    with pytest.raises(TypeError, match='batch_set_value'):
        K.batch_set_value([(w, np.ones((2, 2))), (iv, np.array([1.5, 2.0]))])
    np.testing.assert_array_equal(K.get_value(w), 0)


@pytest.mark.parametrize('make', [
    lambda a: K.variable(a),
    lambda a: K.constant(a),
    lambda a: _set(K.variable(np.zeros((2, 2))), a),
    lambda a: _updated_from_feed(a),
])
def test_arrays_handed_in_are_copied(make):
    a = np.ones((2, 2), dtype='float32')
    tensor = make(a)
    a[0, 0] = 42
    np.testing.assert_array_equal(K.eval(tensor), 1)


def _set(v, a):
    K.set_value(v, a)
    return v


def _updated_from_feed(a):
    v = K.variable(np.zeros((2, 2)))
    x = K.placeholder((2, 2))
    K.function([x], [], updates=[K.update(v, x)])([a])
    return v


def test_variable_refuses_none_and_values_its_dtype_cannot_hold():
    with pytest.raises(TypeError, match='variable: value must be a number.*got None'):
        K.variable(None)
    with pytest.raises(TypeError, match='variable: value holds 1.5, which dtype int32 cannot hold'):
        K.variable(1.5, dtype='int32')
    with pytest.raises(TypeError, match='variable: .*nan'):
        K.variable([np.nan], dtype='int64')
    np.testing.assert_array_equal(K.get_value(K.variable([2.0, 3.0], dtype='int32')), [2, 3])
    v = K.variable([1, 2], dtype='int32')
    with pytest.raises(TypeError, match='set_value'):
        K.set_value(v, [0.5, 1])
    np.testing.assert_array_equal(K.get_value(v), [1, 2])


@pytest.mark.parametrize('call', [
    lambda c: K.relu(c), lambda c: K.maximum(c, c), lambda c: K.max(c), lambda c: K.min(c),
    lambda c: K.greater(c, c), lambda c: K.clip(c, 0, 1), lambda c: K.var(c)])
def test_ordering_ops_never_see_complex_numbers(call):
    with pytest.raises(TypeError, match='must hold numbers'):
        call(np.array([1 + 2j, 3 - 1j]))
    with pytest.raises(TypeError, match='variable'):
        K.variable(np.array([1 + 2j]))
    with pytest.raises(TypeError, match='placeholder: dtype must be bool, an int or a float'):
        K.placeholder((2,), dtype='complex64')


def test_strings_and_objects_are_refused_everywhere():
    with pytest.raises(TypeError, match='^variable: .*dtype <U'):
        K.variable(['a', 'b'])
    with pytest.raises(TypeError, match='^constant: '):
        K.constant(np.array([object()]))
    with pytest.raises(TypeError, match='^sum: '):
        K.sum('abc')
    x = K.placeholder((None,))
    f = K.function([x], [x * 2])
    with pytest.raises(TypeError, match="^function: input .* must hold numbers"):
        f([np.array(['a'])])
    with pytest.raises(TypeError, match="^function: input .* holds 0.5"):
        K.function([K.placeholder((1,), dtype='int32')], [K.constant(1)])([np.array([0.5])])


SHAPE_MISMATCHES = [  # (K call on placeholders of unknown dims, name)
    (lambda a, b: K.dot(a, b), 'dot'),
    (lambda a, b: a + b, 'function: add'),
    (lambda a, b: K.maximum(a, b), 'maximum'),
    (lambda a, b: K.batch_dot(a, b), 'batch_dot'),
    (lambda a, b: K.concatenate([a, b], axis=0), 'concatenate'),
    (lambda a, b: K.stack([a, b]), 'stack'),
    (lambda a, b: K.switch(a > 0, a, b), 'switch'),
]


@pytest.mark.parametrize('build, name', SHAPE_MISMATCHES, ids=[n for _, n in SHAPE_MISMATCHES])
def test_run_time_shape_mismatches_name_the_k_function_and_both_shapes(build, name):
    a, b = K.placeholder((None, None)), K.placeholder((None, None))
    f = K.function([a, b], [build(a, b)])
    with pytest.raises(ValueError) as caught:
        f([np.ones((2, 3), 'float32'), np.ones((2, 4), 'float32')])
    message = str(caught.value)
    assert message.startswith(name + ':') and '(2, 3)' in message and '(2, 4)' in message


def test_rnn_checks_the_states_the_step_returns():
    x = K.placeholder((None, 4, 3))
    with pytest.raises(ValueError, match='rnn: step_function returned 2 new states for the 1'):
        K.rnn(lambda x_t, s: (x_t, [s[0], s[0]]), x, [K.zeros((2, 3))])
    with pytest.raises(ValueError, match='rnn: step_function returned new state 0 of shape'):
        K.rnn(lambda x_t, s: (x_t, [K.zeros((2, 5))]), x, [K.zeros((2, 3))])
    with pytest.raises(TypeError, match=r'rnn: step_function must return \(output, list'):
        K.rnn(lambda x_t, s: (x_t, s[0]), x, [K.zeros((2, 3))])


def test_map_fn_on_a_scalar_and_a_feed_dict_missing_a_placeholder():
    with pytest.raises(ValueError, match='map_fn: elems must have at least one axis'):
        K.map_fn(lambda x: x, K.variable(1.0))
    a, b = K.placeholder((1,)), K.placeholder((1,))
    with pytest.raises(ValueError, match='function: the input dict has no value for'):
        K.function([a, b], [a + b])({a: np.ones(1)})


def test_empty_sequences_give_empty_results():
    x = K.placeholder((None, 3))
    mapped, = K.function([x], [K.map_fn(lambda row: row * 2, x)])([np.zeros((0, 3))])
    assert mapped.shape == (0, 3)
    start = K.variable(np.ones(3))
    for fold in (K.foldl, K.foldr):
        total, = K.function([x], [fold(lambda acc, row: acc + row, x, initializer=start)])(
            [np.zeros((0, 3))])
        np.testing.assert_array_equal(total, 1)


@pytest.mark.parametrize('data_format', ['channels_last', 'channels_first'])
def test_empty_batches_through_convolutions_and_pooling(data_format):
    cf = data_format == 'channels_first'
    x = K.placeholder((None, 2, 6, 6) if cf else (None, 6, 6, 2))
    kernel, depthwise = K.variable(np.ones((3, 3, 2, 4))), K.variable(np.ones((3, 3, 2, 1)))
    outputs = [K.conv2d(x, kernel, data_format=data_format),
               K.depthwise_conv2d(x, depthwise, data_format=data_format),
               K.pool2d(x, (2, 2), (2, 2), data_format=data_format),
               K.pool2d(x, (2, 2), (2, 2), data_format=data_format, pool_mode='avg')]
    loss = sum(K.sum(o) for o in outputs)
    grads = K.gradients(loss, [kernel, depthwise])
    empty = np.zeros((0, 2, 6, 6) if cf else (0, 6, 6, 2), 'float32')
    values = K.function([x], outputs + grads)([empty])
    expected = [(0, 4, 4, 4), (0, 2, 4, 4), (0, 2, 3, 3), (0, 2, 3, 3)]
    if not cf:
        expected = [(0, h, w, c) for _, c, h, w in expected]
    assert [v.shape for v in values[:4]] == expected
    np.testing.assert_array_equal(values[4], 0)
    np.testing.assert_array_equal(values[5], 0)


def test_ints_out_of_their_dtype_range_are_refused_not_wrapped():
    with pytest.raises(TypeError, match=r'^variable: value holds 300, outside the range of dtype uint8'):
        K.variable(300, dtype='uint8')
    with pytest.raises(TypeError, match=r'^variable: value holds -1, outside .* uint8'):
        K.variable([-1, 0], dtype='uint8')
    with pytest.raises(TypeError, match=r'^constant: value holds 1099511627776, outside .* int32'):
        K.constant(2 ** 40, dtype='int32')
    with pytest.raises(TypeError, match=r'^variable: value holds 1e\+20, outside .* int64'):
        K.variable([1e20], dtype='int64')
    np.testing.assert_array_equal(K.get_value(K.variable([255, 0], dtype='uint8')), [255, 0])
    v, w = K.variable([1, 2], dtype='int32'), K.variable(np.zeros(2))
    for write in (lambda: K.set_value(v, np.array([2 ** 40, 0])),
                  lambda: K.batch_set_value([(w, np.ones(2)), (v, [0, 2 ** 31])]),
                  lambda: K.eval(K.update_add(v, np.array([2 ** 40, 0])))):
        with pytest.raises(TypeError, match='outside the range of dtype int32'):
            write()
    np.testing.assert_array_equal(K.get_value(v), [1, 2])
    np.testing.assert_array_equal(K.get_value(w), 0)
    x = K.placeholder((None,), dtype='int32')
    with pytest.raises(TypeError, match=r"^function: input .* holds 1099511627776, outside"):
        K.function([x], [x * 2])([np.array([2 ** 40])])


def test_float_values_are_not_truncated_into_int_variables():
    i = K.variable([0, 2, 1], dtype='int32')
    for name, make in [('update', lambda: K.update(i, K.constant([0.5, 1, 2]))),
                       ('update_add', lambda: K.update_add(i, 0.5)),
                       ('update_sub', lambda: K.update_sub(i, K.ones((3,)))),
                       ('function', lambda: K.function([], [], updates=[(i, i + 0.7)]))]:
        with pytest.raises(TypeError, match='^%s: the new value of variable .* has dtype float32, '
                                            'which its dtype int32 cannot hold' % name):
            make()
    K.function([], [], updates=[K.update_add(i, 1), (i, K.cast(K.round(K.cast(i, 'float32') * 2), 'int32'))])
    np.testing.assert_array_equal(K.get_value(i), [0, 2, 1])


def test_function_refuses_a_tuple_update_whose_static_shape_does_not_fit():
    m = K.variable(np.zeros((2, 3)))
    with pytest.raises(ValueError, match=r'^function: the new value of shape \(3, 2\) does not fit '
                                         r"variable .* of shape \(2, 3\)"):
        K.function([], [m], updates=[(m, K.ones((3, 2)))])
    np.testing.assert_array_equal(K.get_value(m), 0)


def test_placeholder_ndim_eval_batch_get_value_and_phase_arguments_are_checked():
    with pytest.raises(ValueError, match=r'^placeholder: ndim must be >= 0, got -1'):
        K.placeholder(ndim=-1)
    for ndim in (1.5, '2', [2]):
        with pytest.raises(TypeError, match=r'^placeholder: ndim must be an int, got'):
            K.placeholder(ndim=ndim)
    assert K.int_shape(K.placeholder(ndim=np.int64(2))) == (None, None)
    with pytest.raises(TypeError, match=r'^eval: x must hold numbers'):
        K.eval('abc')
    np.testing.assert_array_equal(K.eval(np.ones(2)), 1)
    with pytest.raises(TypeError, match=r"^batch_get_value: ops must be tensors, got 'a'"):
        K.batch_get_value([K.variable(1.0), 'a'])
    x, alt = K.variable(1.0), K.variable(2.0)
    for name in ('in_train_phase', 'in_test_phase'):
        with pytest.raises(TypeError, match=r"^%s: training must be None, a bool, 0 or 1, or a tensor, "
                                            r"got 'yes'" % name):
            getattr(K, name)(x, alt, training='yes')
    assert K.eval(K.in_test_phase(x, alt, training=np.bool_(False))) == 1.0


def test_object_arrays_of_numbers_are_read_as_numbers():
    """pandas' DataFrame.values of mixed columns is an object array; TensorFlow converts it."""
    x = K.placeholder((None, 3))
    f = K.function([x], [x * 2])
    np.testing.assert_array_equal(f([np.array([[1, 2.5, True]], dtype=object)])[0], [[2, 5, 2]])
    assert f([np.zeros((0, 3), dtype=object)])[0].shape == (0, 3)
    np.testing.assert_array_equal(K.get_value(K.variable(np.array([1, 2], dtype=object), dtype='int32')), [1, 2])
    for bad, shown in [('a', "'a'"), (None, 'None'), (2j, '2j')]:
        with pytest.raises(TypeError, match=r"^function: input .* must hold numbers .* dtype object \(e.g. %s\)"
                                            % re.escape(shown)):
            f([np.array([[1, bad, 3]], dtype=object)])


def test_python_operators_name_themselves_and_keep_tensorflows_dtypes():
    m, b = K.variable(np.ones((2, 3))), K.variable([True, False], dtype='bool')
    with pytest.raises(TypeError, match=r'^add: value must hold numbers'):
        m + 'a'
    with pytest.raises(TypeError, match=r'^multiply: value must be a number'):
        None * m
    with pytest.raises(TypeError, match=r'^maximum: value must hold numbers'):   # a K function: its name
        K.maximum(m, 'a')
    with pytest.raises(TypeError, match=r'^negative: -x of a bool tensor'):   # was NumPy's error at run time
        -b
    for make in (lambda: ~m, lambda: ~K.variable([1, 2], dtype='int32')):   # was logical not of numbers
        with pytest.raises(TypeError, match=r'^logical_not: ~x needs a bool tensor, got dtype (float|int)32'):
            make()
    with pytest.raises(TypeError, match=r'^logical_and: &, \| and \^ need bool tensors'):
        m & m
    with pytest.raises(TypeError, match=r'^logical_or: .* got dtypes bool and int32'):
        b | K.variable([1, 0], dtype='int32')
    np.testing.assert_array_equal(K.eval(~b & (b | True)), [False, True])


def test_rnn_list_arguments_mask_steps_eye_size_and_tensor_values_get_clear_errors():
    seq = K.variable(np.ones((2, 4, 3)))
    step = lambda x_t, states: (x_t + states[0], [x_t + states[0]])   # noqa: E731
    with pytest.raises(TypeError, match=r'^rnn: constants must be a list of tensors, got <gpuk.Tensor'):
        K.rnn(step, seq, [K.zeros((2, 3))], constants=K.zeros((2, 3)))   # was "has no truth value"
    with pytest.raises(TypeError, match=r'^rnn: initial_states must be a list of tensors'):
        K.rnn(step, seq, K.zeros((2, 3)))
    for unroll in (False, True):   # unrolled, a longer mask was cut silently
        with pytest.raises(ValueError, match=r'^rnn: mask has 5 time steps, inputs have 4'):
            K.rnn(step, seq, [K.zeros((2, 3))], mask=K.ones((2, 5)), unroll=unroll)
    with pytest.raises(TypeError, match=r"^eye: size must be an int or a \(rows, cols\) pair of ints"):
        K.eye(K.constant(3, dtype='int32'))   # was "'Constant' object cannot be interpreted as an integer"
    with pytest.raises(ValueError, match=r'^eye: size must not be negative'):
        K.eye((2, -1))
    assert K.int_shape(K.eye(np.array([2, 3]))) == (2, 3)   # a shape read off an array still works
    v = K.variable(np.zeros(2))
    with pytest.raises(TypeError, match=r"^set_value: value must be .* got tensor 'Variable.*': evaluate it first"):
        K.set_value(v, K.variable(np.ones(2)))   # was "must hold numbers ... dtype object"
    np.testing.assert_array_equal(K.get_value(v), 0)


@pytest.mark.parametrize('top_paths', [1, 2])
def test_beam_search_decoding_of_an_empty_batch_gives_empty_paths(on_device, top_paths):
    x, lengths = K.placeholder((None, None, 3)), K.placeholder((None,), dtype='int32')
    f = K.function([x, lengths], K.ctc_decode(x, lengths, greedy=False, beam_width=3, top_paths=top_paths)[0])
    paths = f([np.zeros((0, 4, 3), 'float32'), np.zeros((0,), 'int32')])   # was NumPy's reshape error
    assert [p.shape for p in paths] == [(0, 0)] * top_paths


def test_rnn_over_zero_time_steps_says_so():
    step = lambda x_t, states: (x_t + states[0], [x_t + states[0]])   # noqa: E731
    for unroll in (False, True):   # was "getitem: index -1 is out of range for axis 0 of size 0"
        with pytest.raises(ValueError, match=r'^rnn: inputs must have at least one time step, got shape \(2, 0, 3\)'):
            K.rnn(step, K.zeros((2, 0, 3)), [K.zeros((2, 3))], unroll=unroll)


def test_rnn_last_output_over_zero_time_steps_fed_at_run_time_says_so():
    # an empty loop keeps its states as given (test_scan_gradients.py), but has no last output
    x, h0, w = K.placeholder((2, None, 3)), K.placeholder((2, 4)), K.variable(np.ones((3, 4)))
    step = lambda x_t, states: (2 * states[0], [K.dot(x_t, w) + states[0]])   # noqa: E731
    last, outputs, states = K.rnn(step, x, [h0])
    fed = [np.ones((2, 0, 3), np.float32), np.ones((2, 4), np.float32)]
    for targets in ([last], K.gradients(K.sum(last), [w])):   # was NumPy's "index -1 is out of bounds for axis 0
        with pytest.raises(ValueError, match=r'^rnn: inputs must have at least one time step, got a sequence '   # with
                                             r'of 0 time steps \(at run time, on inputs of shapes \(2, 0, 3\), '   # size 0"
                                             r'\(2, 4\)\)'):
            K.function([x, h0], targets)(fed)
    got_outputs, got_state = K.function([x, h0], [outputs, states[0]])(fed)
    assert got_outputs.shape == (2, 0, 4)
    np.testing.assert_array_equal(got_state, fed[1])
    np.testing.assert_array_equal(K.function([x, h0], [last])([np.ones((2, 1, 3)), fed[1]])[0], 2 * fed[1])


def test_in_top_k_refuses_a_negative_k():
    with pytest.raises(ValueError, match=r'^in_top_k: k must be >= 0, got -1'):   # was all False
        K.in_top_k(K.variable([[0.1, 0.9]]), K.constant([1], dtype='int32'), -1)
    np.testing.assert_array_equal(K.eval(K.in_top_k(K.variable([[0.1, 0.9]]), K.constant([1], dtype='int32'), 0)),
                                  [False])


def test_allocations_too_large_name_the_k_function():
    huge = (2 ** 40, 2 ** 20)   # 4 EiB of float32: refused under any overcommit policy
    for name in ('zeros', 'ones'):   # variables, allocated by the call itself (was NumPy's bare MemoryError)
        with pytest.raises(gpuk.OutOfMemoryError, match=r'^%s: out of memory: ' % name) as caught:
            getattr(K, name)(huge)
        assert caught.value.requested_bytes == 4 * 2 ** 60, caught.value.requested_bytes   # NumPy's size kept
    with pytest.raises(MemoryError, match=r'^random_normal: out of host memory \(at run time, with no inputs\)'):
        K.eval(K.random_normal(huge))   # was "(at run time, on inputs )"


def test_errors_while_folding_constants_name_the_k_function():
    v = K.variable(np.zeros(2))
    ones = K.constant([1, 2], dtype='int32')
    for build, name, inputs in ((lambda: K.one_hot(ones, 2 ** 40), 'one_hot', r'int32 \(2,\)'),
                                (lambda: K.arange(K.constant(2 ** 50, dtype='int64')), 'arange', None)):
        with pytest.raises(MemoryError, match=r'^%s: out of host memory \(at run time, on inputs %s' % (
                name, inputs or '.*')):   # was "function: out of host memory (at run time, with no inputs)"
            K.function([], [build()], updates=[K.update_add(v, 1)])([])
    np.testing.assert_array_equal(K.get_value(v), 0)
    with pytest.raises(ValueError, match=r'^gather: indices must lie in \[0, 3\), got values from 5 to 5 '
                                         r'\(at run time, on inputs of shapes \(3, 2\), \(1,\)\)$'):
        K.eval(K.gather(K.constant(np.ones((3, 2))), K.constant([5], dtype='int32')))


def test_function_updates_must_be_a_list():
    v = K.variable(np.ones(2))
    for updates, kind in [(K.update(v, v + 1), 'Update'), ({v: v + 1}, 'dict')]:   # was "'Update' object is
        with pytest.raises(TypeError, match=r'^function: updates must be a list .* got %s' % kind):   # not iterable"
            K.function([], [v], updates=updates)
    K.function([], [], updates=(K.update(v, v + 1),))([])
    np.testing.assert_array_equal(K.get_value(v), 2)


def test_function_says_how_many_inputs_came_and_what_dict_keys_must_be():
    x, y = K.placeholder((None, 2)), K.placeholder((None, 2))
    f = K.function([x, y], [x + y])
    with pytest.raises(ValueError, match=r'^function: expected a list of 2 input values \(one per placeholder\), '
                                         r'got a list of 1$'):   # was "got '1 values'"
        f([np.ones((1, 2))])
    with pytest.raises(ValueError, match=r'got NoneType$'):
        f(None)
    with pytest.raises(ValueError, match=r"no value for placeholder\(s\) .* \(its keys must be the placeholders "
                                         r"themselves, got 'a'\)"):
        f({'a': np.ones((1, 2))})


def test_temporal_padding_shows_the_padding_given():
    for padding in ((1.5, 1), (-1, 1), (1,)):   # was shown wrapped in another tuple: ((1.5, 1),)
        with pytest.raises(ValueError, match=r'^temporal_padding: padding must be a \(before, after\) pair of '
                                             r'ints >= 0, got %s$' % re.escape(repr(padding))):
            K.temporal_padding(K.ones((1, 3, 2)), padding)
    assert K.int_shape(K.temporal_padding(K.ones((1, 3, 2)), (1, 2))) == (1, 6, 2)


def test_variable_of_a_tensor_that_needs_inputs_says_which():
    x = K.placeholder((2,), name='fed_later')
    with pytest.raises(ValueError, match=r"^variable: value .* depends on placeholder\(s\) 'fed_later'"):
        K.variable(x * 2)   # was "variable: function: placeholder ... is needed but is not among the inputs"
    np.testing.assert_array_equal(K.get_value(K.variable(K.ones(2) * 3)), 3)


def test_floats_just_past_an_int_dtype_range_are_refused_not_wrapped():
    """2.0 ** 63 compared as float64 with int64's max (2 ** 63 - 1, which rounds to 2.0 ** 63)
    looked in range, and astype wrapped it to -2 ** 63."""
    with pytest.raises(TypeError, match=r'^variable: value holds 9.223372036854776e\+18, outside .* int64'):
        K.variable([2.0 ** 63], dtype='int64')
    with pytest.raises(TypeError, match=r'^variable: value holds 1.8446744073709552e\+19, outside .* uint64'):
        K.variable([2.0 ** 64], dtype='uint64')
    x = K.placeholder((None,), dtype='int64')
    with pytest.raises(TypeError, match=r'^function: input .* holds 9.223372036854776e\+18, outside'):
        K.function([x], [x])([np.array([2.0 ** 63])])
    np.testing.assert_array_equal(K.get_value(K.variable([-2.0 ** 63, 2.0 ** 62], dtype='int64')),
                                  [-2 ** 63, 2 ** 62])
