"""A plan step's reused output buffers (prepared.StepBuffers, docs/architecture.md "The memory
plan") never alias a value still in use. K.function's outputs are copies; what a caller can hold
of a step's memory is a variable's value (an update's new value is the step's buffer), so an old
value held must keep its values through later steps (the GPU rehearsal's tests are in
test_host_overhead.py)."""
import os

import numpy as np

from gpuk import backend as K
from gpuk.kernels.runtime import prepared


def test_a_variable_value_a_caller_keeps_is_never_written_by_later_steps(on_device):
    x = K.placeholder((None, 4, 4, 2))
    pooled = K.pool2d(x, (2, 2), strides=(2, 2))                      # a launcher's step (pooling)
    totals = K.variable(np.zeros(2, np.float32))
    peak = K.variable(np.zeros((2, 2, 2), np.float32))
    # the new values: xp steps (a reduction; a binary op) and the pooling step's own output
    f = K.function([x], [K.shape(x)], updates=[K.update(totals, K.sum(pooled, axis=(0, 1, 2))),
                                               K.update(peak, pooled[0] * 2.0)])
    rng = np.random.default_rng(0)
    batches = [rng.standard_normal((3, 4, 4, 2)).astype(np.float32) for _ in range(5)]
    held = []
    for value in batches:
        shape, = f([value])
        assert list(shape) == [3, 4, 4, 2]
        held.append((totals.value, peak.value))                      # the step buffers themselves
    for value, (total, top) in zip(batches, held):
        expected = value.reshape(3, 2, 2, 2, 2, 2).max(axis=(2, 4))
        assert np.allclose(np.asarray(total), expected.sum(axis=(0, 1, 2)), rtol=1e-5)
        assert np.array_equal(np.asarray(top), expected[0] * 2.0)


def test_an_xp_step_writes_into_its_buffer_only_where_out_gives_the_plain_result():
    """prepared.xp_step_runner keeps the plain run where ``compute`` does not return the buffer
    (a view of an input, a dtype ``out=`` cannot express), and otherwise writes into a buffer
    only StepBuffers holds: one the caller still holds is never written."""
    run = prepared.xp_step_runner(np.empty, lambda a, out=None: a.T if out is None else np.copyto(out, a.T))
    assert run.specialized((np.ones((2, 3)),)) is run               # copyto returns None: the plain run
    run = prepared.xp_step_runner(np.empty, lambda a, out=None: np.negative(a, out=out))
    variant = run.specialized((np.ones((2, 3)),))
    first = variant(np.ones((2, 3)))
    assert variant is not run and np.array_equal(first, -np.ones((2, 3)))
    second = variant(np.full((2, 3), 2.0))                           # first still held: the other buffer
    assert second is not first and np.array_equal(first, -np.ones((2, 3)))
    first_id = id(first)
    del first
    assert id(variant(np.full((2, 3), 3.0))) == first_id             # freed: it comes back


def test_a_buffer_whose_view_is_held_is_not_handed_out_again():
    """The emulated runtime's arrays are cut from page-aligned blocks, and NumPy points a view
    of one at the block, not at the array: the block's holders count too (a variable whose new
    value is a reshaped step output holds only such a view)."""
    from gpuk.kernels import runtime
    buffers = prepared.StepBuffers(runtime.get_runtime('emulate').xp.empty, (2, 3), [np.float32])
    view = buffers.take(0).reshape(6)
    view[...] = 1.0
    assert buffers.take(0).base is not view.base                    # not the one the view reads
    assert np.array_equal(view, np.ones(6))
    del view
    kept = buffers.take(0)
    assert kept.base is not None and buffers.take(0) is not kept    # held: the other buffer


def test_steps_of_one_shape_and_dtype_share_the_buffers_their_values_give_back():
    """The arena (prepared.StepBuffers): a buffer one step's value held goes, once freed, to
    the next step of its shape and dtype, in the same call as in the next; a held buffer, one of
    another shape or dtype, or one from before ``forget_kept()`` is never handed out."""
    prepared.forget_kept()   # lists of their own: a live runner of an earlier test may share the key
    first = prepared.StepBuffers(np.empty, (2, 3), [np.float32])
    second = prepared.StepBuffers(np.empty, (2, 3), [np.float32, np.float32])
    other = prepared.StepBuffers(np.empty, (3, 2), [np.float32])
    value = first.take(0)                          # a plan slot holds it
    a, b = second.take_all()
    assert a is not value and b is not value and a is not b
    value_id, a_id = id(value), id(a)
    del value, b                                   # freed after their last readers
    assert id(second.take(0)) == value_id          # the other step's freed buffer
    assert id(other.take(0)) not in (value_id, a_id)   # another shape: never shared
    held = a                                       # a caller keeps it
    assert all(buffer is not held for buffer in second.take_all())
    del a, held
    prepared.forget_kept()                         # a capture starts: nothing from before it
    later = prepared.StepBuffers(np.empty, (2, 3), [np.float32])
    assert id(later.take(0)) not in (value_id, a_id)
    with prepared.buffers_not_kept():              # inside it, nothing is kept for later
        inside = prepared.StepBuffers(np.empty, (4,), [np.float32])
        inside.take(0)
        assert not inside._kept[0]


def test_the_arena_keeps_at_most_two_buffers_per_step_output_held_elsewhere():
    """A caller keeping every value (a variable's old values) does not make the arena keep
    them all: at most two per step output using a list, the oldest dropped."""
    prepared.forget_kept()   # lists of their own: a live runner of an earlier test may share the key
    steps = [prepared.StepBuffers(np.empty, (5,), [np.float64]) for _ in range(2)]
    held = [steps[k % 2].take(0) for k in range(10)]
    assert len({id(h) for h in held}) == 10
    assert len(steps[0]._kept[0]) == 4 and steps[0]._kept[0] is steps[1]._kept[0]
    assert all(buffer is h for buffer, h in zip(steps[0]._kept[0], held[-4:]))


def test_release_kept_drops_the_buffers_of_xp_steps_and_scans():
    """device.release_memory after an allocation failure (prepared.release_kept) lets go of every
    step buffer: those of steps computed with xp and a Scan's stacked results too."""
    x = K.placeholder((2, 3, 4))

    def step(x_t, states):
        y = states[0] * 0.5 + x_t
        return y, [y]
    _, outputs, _ = K.rnn(step, x, [K.zeros((2, 4))])
    f = K.function([x], [K.sum(outputs, axis=1)])
    value = np.ones((2, 3, 4), np.float32)
    before = f([value])[0]
    ops = [getattr(step[0], '__self__', step[0]) for step in f._compiled().steps]   # (bound forwards)
    kepts = [op.kept for op in ops if getattr(op, 'kept', None) is not None]
    kepts += [op._stacks for op in ops if hasattr(op, '_stacks')]
    assert any(k._last is not None for k in kepts) and any(hasattr(op, '_stacks') for op in ops)
    prepared.release_kept()
    assert all(k._last is None for k in kepts)
    assert np.array_equal(f([value])[0], before)


def test_step_buffers_are_not_kept_under_GPUK_STEP_BUFFERS_0():
    """The memory-lean setting: each step output comes from the memory pool, none is kept."""
    import subprocess
    import sys
    code = ('from gpuk.kernels.runtime import prepared; import numpy as np, weakref; '
            'buffers = prepared.StepBuffers(np.empty, (2,), [np.float32]); '
            'taken = weakref.ref(buffers.take(0)); '   # alive only while the step buffers keep it
            'print(prepared.keeps_step_buffers(), taken() is not None)')
    for setting, expected in (('0', 'False False'), ('1', 'True True')):
        env = dict(os.environ, GPUK_STEP_BUFFERS=setting)
        out = subprocess.run([sys.executable, '-c', code], env=env, capture_output=True, text=True, timeout=120)
        assert out.stdout.split() == expected.split(), out.stderr


def _operands(rng, dtype, shape):
    return (rng.standard_normal(shape) * 5).astype(dtype)


def _xp_ops_and_operands():
    """(op, operands) for the ops computed with xp over NumPy's dtype kinds: bool, signed and
    unsigned ints, float16/32/64; 0-d, broadcast and reduced shapes."""
    from gpuk.ops import elementwise as ew
    from gpuk.ops import reduction as red
    rng = np.random.default_rng(0)
    dtypes = [np.bool_, np.int8, np.int32, np.uint8, np.float16, np.float32, np.float64]
    for name in ew.BINARY:
        for a, b in [(a, b) for a in dtypes for b in dtypes]:
            for shapes in [((), ()), ((2, 3), (3,)), ((), (2, 3))]:
                yield ew.Binary(name), [_operands(rng, d, s) for d, s in zip((a, b), shapes)]
    for source in dtypes:
        for target in dtypes:
            yield ew.Cast(np.dtype(target).name), [_operands(rng, source, (2, 3))]
        for kind in ('sum', 'mean', 'max', 'min', 'prod', 'any', 'all', 'var'):
            for axes, keepdims in [((0,), False), ((0, 1), False), ((1,), True)]:
                yield red.Reduce(kind, axes, keepdims), [_operands(rng, source, (2, 3))]
        for condition in (np.bool_, np.int32):
            yield ew.Where(), [_operands(rng, condition, (2, 3)), _operands(rng, source, (2, 3)),
                               _operands(rng, np.float32, ())]
        for g, like in [((2, 3), (1, 3)), ((4, 2, 3), (2, 1)), ((2, 3), ())]:
            yield ew.SumToShapeOf(), [_operands(rng, source, g), np.empty(like)]
        for kind in ('sum', 'mean'):
            yield red.ReduceGrad(kind, (0,), False), [_operands(rng, source, (3,)), np.empty((2, 3))]


def test_xp_steps_into_their_buffers_give_the_plain_results_for_every_dtype_and_shape():
    """prepared.xp_step_runner's variant (compute(..., out=buffer)) against the op's plain
    computation, twice (the second call writes into a reused buffer): the same values, shape and
    dtype, or the variant is the plain run itself."""
    written = 0
    for op, operands in _xp_ops_and_operands():
        with np.errstate(all='ignore'):
            try:
                plain = np.asarray(op.compute(np, *operands))
            except (ValueError, TypeError):   # the op refuses these operands: nothing to compare
                continue
            run = prepared.xp_step_runner(np.empty, lambda *arrays, out=None: op.compute(np, *arrays, out=out))
            variant = run.specialized(operands)
            written += variant is not run
            for _ in range(2):
                got = np.asarray(variant(*operands))
                assert (got.dtype, got.shape) == (plain.dtype, plain.shape), (op, [a.dtype for a in operands])
                np.testing.assert_array_equal(got, plain, err_msg=repr(op))
    assert written > 1000   # most of them write into their buffers (not all fall back to the plain run)
