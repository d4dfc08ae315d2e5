"""K's shape manipulation against NumPy: reshape and flatten, axes, joining, tile and
repeat, reverse, padding, resizing, pattern_broadcast, size. Static shapes (K.int_shape)
are checked against evaluated shapes, with None dims fed real arrays; every
differentiable op has a finite-difference gradient check, the linear ones also a second
derivative check; bad arguments raise errors naming the function and the argument."""
import numpy as np
import pytest

from gpuk import backend as K
from tests.gradcheck import check_gradients
from tests.keras_reference import numpy_backend

RNG = np.random.default_rng(11)
A = RNG.standard_normal((2, 3, 4)).astype(np.float32)


def evaluate(outputs, feeds):
    """Runs ``outputs`` (a tensor or a list) on ``feeds`` {placeholder: array}; checks each
    result's shape against K.int_shape (None matches anything)."""
    single = not isinstance(outputs, (list, tuple))
    outputs = [outputs] if single else list(outputs)
    placeholders = list(feeds)
    values = K.function(placeholders, outputs)([feeds[p] for p in placeholders])
    for tensor, value in zip(outputs, values):
        static = K.int_shape(tensor)
        assert static is not None and len(static) == value.ndim, (static, value.shape)
        assert all(s is None or s == d for s, d in zip(static, value.shape)), (static, value.shape)
    return values[0] if single else values


def unknown(array, known_axes=()):
    """A placeholder for ``array`` whose dims are None except ``known_axes``."""
    array = np.asarray(array)
    return K.placeholder(tuple(d if i in known_axes else None for i, d in enumerate(array.shape)),
                         dtype=array.dtype.name)


def runtime_int(value, anchor):
    """A scalar int32 tensor equal to ``value`` that the graph cannot know statically (it
    depends on the float tensor ``anchor``), so run-time code paths are exercised."""
    return K.cast(K.sum(anchor * 0.0), 'int32') + value


def second_order(op):
    """x -> d/dx sum(sin(op(x))): checking its gradient checks the gradient of op's gradient."""
    def build(x):
        return K.gradients(K.sum(K.sin(op(x))), [x])[0]
    return build


# --- reshape, flatten, size ------------------------------------------------------------------

def test_reshape_mixed_symbolic_entries(on_device):
    x = unknown(A)
    out = K.reshape(x, (K.shape(x)[0], -1, 2))
    assert K.int_shape(out) == (None, None, 2)
    np.testing.assert_array_equal(evaluate(out, {x: A}), A.reshape(2, -1, 2))
    static = K.placeholder((2, 3, 4))
    assert K.int_shape(K.reshape(static, [-1, np.int64(4)])) == (6, 4)
    assert K.int_shape(K.reshape(static, np.array([4, 6]))) == (4, 6)
    np.testing.assert_array_equal(evaluate(K.reshape(x, K.shape(x)[::-1]), {x: A}), A.reshape(4, 3, 2))


def test_reshape_int_and_bool(on_device):
    ints = np.arange(12, dtype=np.int32).reshape(3, 4)
    x = unknown(ints)
    np.testing.assert_array_equal(evaluate(K.reshape(x, (2, 6)), {x: ints}), ints.reshape(2, 6))
    flags = ints % 3 == 0
    b = unknown(flags)
    out = evaluate(K.flatten(b), {b: flags})
    assert out.dtype == np.bool_ and np.array_equal(out, flags.reshape(-1))


@pytest.mark.parametrize('known_axes', [(0, 1, 2), (0,), (1, 2), ()])
def test_flatten_and_batch_flatten(on_device, known_axes):
    x = unknown(A, known_axes)
    flat, batch_flat = K.flatten(x), K.batch_flatten(x)
    got_flat, got_batch = evaluate([flat, batch_flat], {x: A})
    np.testing.assert_array_equal(got_flat, A.reshape(-1))
    np.testing.assert_array_equal(got_batch, A.reshape(2, -1))
    if known_axes == (1, 2):
        assert K.int_shape(batch_flat) == (None, 12)
    if known_axes == (0, 1, 2):
        assert K.int_shape(flat) == (24,) and K.int_shape(batch_flat) == (2, 12)


def test_size(on_device):
    x = unknown(A)
    size = K.size(x)
    assert K.int_shape(size) == () and K.dtype(size) == 'int32'
    assert evaluate(size, {x: A}) == 24
    assert K.eval(K.size(K.constant(np.zeros((3, 0, 2))))) == 0
    assert K.eval(K.size(K.variable(np.ones((2, 5))))) == 10


def test_reshape_flatten_gradients():
    check_gradients(lambda x: K.reshape(x, (4, -1)) * K.reshape(x, (4, 6)), A)
    check_gradients(lambda x: K.batch_flatten(K.reshape(x, (runtime_int(2, x), 3, 4))) ** 2, A)
    check_gradients(lambda x: K.flatten(x) * K.flatten(x), A)


# --- axes --------------------------------------------------------------------------------------

def test_permute_expand_squeeze_transpose(on_device):
    x = unknown(A, (1,))
    permuted, t = K.permute_dimensions(x, (2, -3, 1)), K.transpose(x)
    expanded, expanded_front = K.expand_dims(x), K.expand_dims(x, -4)
    squeezed = K.squeeze(K.expand_dims(x, 2), -2)
    assert K.int_shape(permuted) == (None, None, 3) and K.int_shape(t) == (None, 3, None)
    assert K.int_shape(expanded) == (None, 3, None, 1) and K.int_shape(expanded_front) == (1, None, 3, None)
    got = evaluate([permuted, t, expanded, expanded_front, squeezed], {x: A})
    for g, want in zip(got, [A.transpose(2, 0, 1), A.T, A[..., None], A[None], A]):
        np.testing.assert_array_equal(g, want)


def test_squeeze_of_unknown_dim_checks_at_run_time(on_device):
    x = unknown(A)
    with pytest.raises(ValueError, match='squeeze: axis 1'):
        evaluate(K.squeeze(x, 1), {x: A})


def test_axes_gradients():
    check_gradients(lambda x: K.permute_dimensions(x, (2, 0, 1)) * K.transpose(K.permute_dimensions(x, (1, 0, 2))), A)
    check_gradients(lambda x: K.squeeze(K.expand_dims(x, -1), 3) * K.expand_dims(x, 0)[0], A)


# --- concatenate and stack ---------------------------------------------------------------------

def test_concatenate_and_stack(on_device):
    b = RNG.standard_normal((2, 5, 4)).astype(np.float32)
    x, y = unknown(A, (1,)), unknown(b, (1, 2))
    joined = K.concatenate([x, y], axis=-2)
    assert K.int_shape(joined) == (None, 8, 4)
    stacked = K.stack([x, x * 2, x + 1], axis=-1)
    stacked_front = K.stack([A, A], axis=0)  # arrays are accepted too
    assert K.int_shape(stacked) == (None, 3, None, 3) and K.int_shape(stacked_front) == (2, 2, 3, 4)
    got = evaluate([joined, stacked, stacked_front, K.concatenate([x])], {x: A, y: b})
    np.testing.assert_array_equal(got[0], np.concatenate([A, b], axis=1))
    np.testing.assert_array_equal(got[1], np.stack([A, A * 2, A + 1], axis=-1))
    np.testing.assert_array_equal(got[2], np.stack([A, A]))
    np.testing.assert_array_equal(got[3], A)


def test_concatenate_ints_and_stack_of_scalars(on_device):
    ints = np.arange(6, dtype=np.int32).reshape(2, 3)
    x = unknown(ints)
    got = evaluate(K.concatenate([x, x * 2], axis=0), {x: ints})
    assert got.dtype == np.int32 and np.array_equal(got, np.concatenate([ints, ints * 2]))
    scalars = K.stack([K.shape(x)[0], K.shape(x)[1], K.constant(7, dtype='int32')])
    assert K.int_shape(scalars) == (3,)
    np.testing.assert_array_equal(evaluate(scalars, {x: ints}), [2, 3, 7])


def test_concatenate_stack_gradients():
    b = RNG.standard_normal((2, 2, 4))
    check_gradients(lambda x, y: K.concatenate([x, y * y, x], axis=1), A, b)
    check_gradients(lambda x, y: K.stack([x[:, :2], y], axis=-2) ** 2, A, b)


# --- tile and repeat -------------------------------------------------------------------------------

def test_tile_static_symbolic_and_tensor_n(on_device):
    x = unknown(A, (1, 2))
    by_list = K.tile(x, [1, K.shape(x)[0], 2])
    by_short = K.tile(x, (3, 1))  # padded with 1s in front, like Keras
    by_int = K.tile(x, 2)
    by_tensor = K.tile(x, K.constant([2, 1, 1], dtype='int32'))
    by_runtime = K.tile(x, K.stack([runtime_int(1, x), K.constant(2, 'int32'), runtime_int(1, x)]))
    assert K.int_shape(by_short) == (None, 9, 4) and K.int_shape(by_int) == (None, 3, 8)
    assert K.int_shape(by_list) == (None, None, 8) and K.int_shape(by_tensor) == (None, 3, 4)
    assert K.int_shape(by_runtime) == (None, None, None)
    got = evaluate([by_list, by_short, by_int, by_tensor, by_runtime], {x: A})
    for g, reps in zip(got, [(1, 2, 2), (1, 3, 1), (1, 1, 2), (2, 1, 1), (1, 2, 1)]):
        np.testing.assert_array_equal(g, np.tile(A, reps))


def test_tile_of_zero_and_bool(on_device):
    flags = A > 0
    x = unknown(flags)
    got = evaluate([K.tile(x, [2, 0, 1]), K.tile(x, [1, 2, 1])], {x: flags})
    assert got[0].shape == (4, 0, 4) and got[1].dtype == np.bool_
    np.testing.assert_array_equal(got[1], np.tile(flags, (1, 2, 1)))


def test_repeat_and_repeat_elements(on_device):
    m = A[0]
    x = unknown(m, (1,))
    repeated = K.repeat(x, 3)
    repeated_symbolic = K.repeat(x, K.shape(x)[0])
    assert K.int_shape(repeated) == (None, 3, 4) and K.int_shape(repeated_symbolic) == (None, None, 4)
    y = unknown(A, (2,))
    by_axis = [K.repeat_elements(y, 2, axis) for axis in (0, 1, -1)]
    assert K.int_shape(by_axis[2]) == (None, None, 8)
    got = evaluate([repeated, repeated_symbolic] + by_axis, {x: m, y: A})
    np.testing.assert_array_equal(got[0], np.repeat(m[:, None], 3, axis=1))
    np.testing.assert_array_equal(got[1], np.repeat(m[:, None], 3, axis=1))
    for g, axis in zip(got[2:], (0, 1, 2)):
        np.testing.assert_array_equal(g, np.repeat(A, 2, axis=axis))
    ints = np.arange(6, dtype=np.int64).reshape(2, 3)
    z = unknown(ints)
    np.testing.assert_array_equal(evaluate(K.repeat_elements(z, 3, 0), {z: ints}), np.repeat(ints, 3, 0))


def test_tile_repeat_gradients():
    check_gradients(lambda x: K.tile(x, [2, 1, 3]), A)
    check_gradients(lambda x: K.tile(x, [1, runtime_int(2, x), 1]), A)
    check_gradients(lambda x: K.repeat(x[0], 3) + K.repeat(x[1], runtime_int(3, x)), A)
    check_gradients(lambda x: K.repeat_elements(x, 3, 1) * K.repeat_elements(x, 3, -2), A)
    check_gradients(second_order(lambda x: K.tile(x, [1, runtime_int(2, x), 2])), A)
    check_gradients(second_order(lambda x: K.repeat_elements(x, 2, -1)), A)


# --- reverse ---------------------------------------------------------------------------------------

def test_reverse(on_device):
    x = unknown(A, (0,))
    outs = [K.reverse(x, 0), K.reverse(x, [-1, 1]), K.reverse(x, (0, 1, 2)), K.reverse(x, [])]
    got = evaluate(outs, {x: A})
    for g, want in zip(got, [A[::-1], A[:, ::-1, ::-1], A[::-1, ::-1, ::-1], A]):
        np.testing.assert_array_equal(g, want)
    ints = np.arange(5, dtype=np.int32)
    z = unknown(ints)
    np.testing.assert_array_equal(evaluate(K.reverse(z, 0), {z: ints}), ints[::-1])


def test_reverse_gradient():
    check_gradients(lambda x: K.reverse(x, [0, 2]) * x, A)


# --- padding -----------------------------------------------------------------------------------

IMAGES = RNG.standard_normal((2, 3, 4, 2)).astype(np.float32)
VOLUMES = RNG.standard_normal((1, 2, 3, 2, 2)).astype(np.float32)


def _spatial(array_cl, data_format):
    """channels_last array moved to ``data_format``."""
    if data_format == 'channels_last':
        return array_cl
    return np.moveaxis(array_cl, -1, 1)


def test_temporal_padding(on_device):
    x = unknown(A, (1,))
    default, asymmetric = K.temporal_padding(x), K.temporal_padding(x, (0, 3))
    assert K.int_shape(default) == (None, 5, None) and K.int_shape(asymmetric) == (None, 6, None)
    got = evaluate([default, asymmetric], {x: A})
    np.testing.assert_array_equal(got[0], np.pad(A, [(0, 0), (1, 1), (0, 0)]))
    np.testing.assert_array_equal(got[1], np.pad(A, [(0, 0), (0, 3), (0, 0)]))


@pytest.mark.parametrize('data_format', ['channels_last', 'channels_first'])
def test_spatial_padding(on_device, data_format):
    images, volumes = _spatial(IMAGES, data_format), _spatial(VOLUMES, data_format)
    x, v = unknown(images, (1, 2, 3)), unknown(volumes, (1, 2, 3, 4))
    pads2, pads3 = ((2, 0), (1, 3)), ((0, 1), (2, 0), (1, 1))
    padded2 = K.spatial_2d_padding(x, pads2, data_format)
    padded3 = K.spatial_3d_padding(v, pads3, data_format=data_format)
    default2 = K.spatial_2d_padding(x, data_format=data_format)
    full2 = [(0, 0)] + list(pads2) + [(0, 0)]
    full3 = [(0, 0)] + list(pads3) + [(0, 0)]
    if data_format == 'channels_first':
        full2, full3 = [full2[0], full2[3]] + full2[1:3], [full3[0], full3[4]] + full3[1:4]
    assert K.int_shape(padded2) == (None,) + tuple(d + sum(p) for d, p in zip(images.shape[1:], full2[1:]))
    got = evaluate([padded2, padded3, default2], {x: images, v: volumes})
    np.testing.assert_array_equal(got[0], np.pad(images, full2))
    np.testing.assert_array_equal(got[1], np.pad(volumes, full3))
    spatial = (1, 2) if data_format == 'channels_last' else (2, 3)
    np.testing.assert_array_equal(got[2], np.pad(images, [(1, 1) if i in spatial else (0, 0) for i in range(4)]))


def test_padding_uses_image_data_format_and_ints(on_device):
    previous = K.image_data_format()
    K.set_image_data_format('channels_first')
    try:
        ints = np.arange(8, dtype=np.int32).reshape(1, 1, 2, 4)
        x = unknown(ints)
        np.testing.assert_array_equal(evaluate(K.spatial_2d_padding(x, ((0, 1), (1, 0))), {x: ints}),
                                      np.pad(ints, [(0, 0), (0, 0), (0, 1), (1, 0)]))
    finally:
        K.set_image_data_format(previous)


def test_padding_gradients():
    check_gradients(lambda x: K.temporal_padding(x, (2, 1)), A)
    check_gradients(lambda x: K.spatial_2d_padding(x, ((1, 0), (0, 2)), 'channels_first'), IMAGES[:1])
    check_gradients(lambda x: K.spatial_3d_padding(x, ((1, 0), (0, 1), (1, 1)), 'channels_last'), VOLUMES[..., :1])
    check_gradients(second_order(lambda x: K.spatial_2d_padding(x, ((1, 2), (0, 1)), 'channels_last')), IMAGES[:1])


# --- resizing ------------------------------------------------------------------------------------

def tf_legacy_bilinear(images, height_factor, width_factor):
    """TensorFlow's ResizeBilinear CPU kernel (align_corners=False, half_pixel_centers=False),
    which Keras 2.3.1 calls, on NHWC float64 images: float32 scale in / out, input position
    o * scale, lower floor, upper min(ceil, in - 1), lerps top/bottom then vertical."""
    def taps(in_size, out_size):
        scale = np.float32(in_size / out_size)
        position = np.arange(out_size, dtype=np.float32) * scale
        lower = np.floor(position).astype(np.int64)
        upper = np.minimum(np.ceil(position).astype(np.int64), in_size - 1)
        return lower, upper, (position - np.floor(position)).astype(np.float64)
    _, h, w, _ = images.shape
    y0, y1, ylerp = taps(h, h * height_factor)
    x0, x1, xlerp = taps(w, w * width_factor)
    xlerp, ylerp = xlerp[None, None, :, None], ylerp[None, :, None, None]
    top = images[:, y0][:, :, x0] + (images[:, y0][:, :, x1] - images[:, y0][:, :, x0]) * xlerp
    bottom = images[:, y1][:, :, x0] + (images[:, y1][:, :, x1] - images[:, y1][:, :, x0]) * xlerp
    return top + (bottom - top) * ylerp


@pytest.mark.parametrize('data_format', ['channels_last', 'channels_first'])
@pytest.mark.parametrize('factors', [(2, 3), (1, 2), (3, 1)])
def test_resize_images(on_device, data_format, factors):
    images = _spatial(IMAGES, data_format)
    x = unknown(images, (1,) if data_format == 'channels_first' else (3,))
    nearest = K.resize_images(x, factors[0], factors[1], data_format)
    bilinear = K.resize_images(x, factors[0], factors[1], data_format, interpolation='bilinear')
    got = evaluate([nearest, bilinear], {x: images})
    want_nearest = np.repeat(np.repeat(IMAGES, factors[0], 1), factors[1], 2)
    want_bilinear = tf_legacy_bilinear(IMAGES.astype(np.float64), *factors)
    np.testing.assert_array_equal(got[0], _spatial(want_nearest, data_format))
    assert got[1].dtype == np.float32
    np.testing.assert_allclose(got[1], _spatial(want_bilinear, data_format), rtol=1e-5, atol=1e-6)
    static = K.placeholder(images.shape)
    want_shape = want_nearest.shape if data_format == 'channels_last' else _spatial(want_nearest, data_format).shape
    assert K.int_shape(K.resize_images(static, factors[0], factors[1], data_format, 'bilinear')) == want_shape


def test_resize_images_float16_and_ints(on_device):
    half = IMAGES.astype(np.float16)
    x = unknown(half)
    got = evaluate(K.resize_images(x, 2, 2, 'channels_last', 'bilinear'), {x: half})
    assert got.dtype == np.float16
    np.testing.assert_allclose(got.astype(np.float64), tf_legacy_bilinear(half.astype(np.float64), 2, 2),
                               rtol=2e-3, atol=2e-3)
    ints = np.arange(12, dtype=np.int32).reshape(1, 3, 4, 1)
    z = unknown(ints)
    nearest, bilinear = evaluate([K.resize_images(z, 2, 1, 'channels_last'),
                                  K.resize_images(z, 2, 1, 'channels_last', 'bilinear')], {z: ints})
    assert nearest.dtype == np.int32 and bilinear.dtype == np.float32
    np.testing.assert_allclose(bilinear, tf_legacy_bilinear(ints.astype(np.float64), 2, 1), rtol=1e-6)


@pytest.mark.parametrize('data_format', ['channels_last', 'channels_first'])
def test_resize_volumes(on_device, data_format):
    volumes = _spatial(VOLUMES, data_format)
    x = unknown(volumes)
    got = evaluate(K.resize_volumes(x, 2, 1, 3, data_format), {x: volumes})
    want = np.repeat(np.repeat(VOLUMES, 2, 1), 3, 3)
    np.testing.assert_array_equal(got, _spatial(want, data_format))


def test_resize_gradients():
    small = IMAGES[:1, :, :3, :1]
    check_gradients(lambda x: K.resize_images(x, 2, 3, 'channels_last'), small)
    check_gradients(lambda x: K.resize_images(x, 3, 2, 'channels_first', 'bilinear'), np.moveaxis(small, -1, 1))
    check_gradients(second_order(lambda x: K.resize_images(x, 2, 2, 'channels_last', 'bilinear')), small)
    check_gradients(lambda x: K.resize_volumes(x, 1, 2, 2, 'channels_first'), VOLUMES[:, :1])


# --- pattern_broadcast ----------------------------------------------------------------------------

def test_pattern_broadcast_returns_x_after_checking():
    x = K.placeholder((None, 1, 4))
    assert K.pattern_broadcast(x, [True, True, False]) is x
    with pytest.raises(ValueError, match='pattern_broadcast: axis 2 is marked broadcastable but has size 4'):
        K.pattern_broadcast(x, [False, False, True])
    with pytest.raises(ValueError, match='pattern_broadcast: broadcastable has 2 entries'):
        K.pattern_broadcast(x, [True, False])


# --- against Keras 2.3.1's NumPy reference backend ---------------------------------------------

@pytest.mark.parametrize('name, args', [
    ('flatten', ()), ('batch_flatten', ()), ('repeat_elements', (2, 1)), ('tile', ((2, 1, 3),)),
    ('reverse', ([0, 2],)), ('temporal_padding', ((2, 1),)), ('slice', ((1, 0, 1), (1, 2, 3))),
    ('spatial_2d_padding', (((1, 0), (2, 1)), 'channels_first')),
    ('resize_images', (2, 3, 'channels_first')),
])
def test_matches_keras_numpy_backend(on_device, name, args):
    reference = numpy_backend()
    array = A if name not in ('spatial_2d_padding', 'resize_images') else IMAGES
    x = unknown(array, (1,))
    np.testing.assert_array_equal(evaluate(getattr(K, name)(x, *args), {x: array}),
                                  getattr(reference, name)(array, *args))


# --- bad arguments ---------------------------------------------------------------------------------

X3 = K.placeholder((None, 3, 4))
X4 = K.placeholder((None, 3, 4, 2))
BAD_CALLS = [
    (lambda: K.reshape(X3, (2, 5)), ValueError, 'reshape: cannot reshape'),
    (lambda: K.reshape(K.placeholder((2, 3)), (4, 2)), ValueError, 'reshape: cannot reshape'),
    (lambda: K.reshape(X3, (-1, -1)), ValueError, 'reshape: at most one -1'),
    (lambda: K.reshape(X3, (None, 12)), ValueError, 'reshape: shape .* has None entries'),
    (lambda: K.reshape(X3, (1.5, 8)), TypeError, 'reshape: shape entries'),
    (lambda: K.reshape(X3, K.constant([2.0, 6.0])), TypeError, 'reshape: a shape tensor must have an int dtype'),
    (lambda: K.permute_dimensions(X3, (0, 1)), ValueError, 'permute_dimensions: pattern'),
    (lambda: K.permute_dimensions(X3, (0, 1, 1)), ValueError, 'permute_dimensions: pattern'),
    (lambda: K.permute_dimensions(X3, 'abc'), TypeError, 'permute_dimensions: pattern must be a tuple'),
    (lambda: K.expand_dims(X3, 4), ValueError, 'expand_dims: axis 4 is out of range'),
    (lambda: K.expand_dims(X3, 1.0), TypeError, 'expand_dims: axis must be an int'),
    (lambda: K.squeeze(X3, 1), ValueError, 'squeeze: axis 1 of shape'),
    (lambda: K.squeeze(X3, -4), ValueError, 'squeeze: axis -4 is out of range'),
    (lambda: K.concatenate([X3, K.placeholder((None, 3))]), ValueError, 'concatenate: all tensors need the same rank'),
    (lambda: K.concatenate([X3, K.placeholder((None, 2, 4))], axis=-1), ValueError, 'concatenate: shapes'),
    (lambda: K.concatenate([]), ValueError, 'concatenate: needs at least one tensor'),
    (lambda: K.concatenate(X3), TypeError, 'concatenate: tensors must be a list'),
    (lambda: K.stack([X3, K.placeholder((None, 2, 4))]), ValueError, 'stack: all tensors need the same shape'),
    (lambda: K.stack([]), ValueError, 'stack: x must be a non-empty list'),
    (lambda: K.stack([X3], axis=4), ValueError, 'stack: axis 4 is out of range'),
    (lambda: K.tile(X3, [1, 2, 3, 4]), ValueError, 'tile: n has 4 entries'),
    (lambda: K.tile(X3, [1, -2, 1]), ValueError, 'tile: n must be non-negative'),
    (lambda: K.tile(X3, [1, 2.0, 1]), TypeError, 'tile: n entries must be ints'),
    (lambda: K.tile(X3, K.constant([2, 2], dtype='int32')), ValueError, 'tile: n has 2 entries'),
    (lambda: K.repeat(X3, 2), ValueError, 'repeat: expected a tensor of rank 2'),
    (lambda: K.repeat(X3[:, 0], 2.5), TypeError, 'repeat: n must be an int'),
    (lambda: K.repeat_elements(X3, -1, 1), ValueError, 'repeat_elements: rep must be >= 0'),
    (lambda: K.repeat_elements(X3, 2, 3), ValueError, 'repeat_elements: axis 3 is out of range'),
    (lambda: K.reverse(X3, 3), ValueError, 'reverse: axis 3 is out of range'),
    (lambda: K.reverse(X3, [1, -2]), ValueError, 'reverse: axes .* name an axis twice'),
    (lambda: K.reverse(X3, 'x'), TypeError, 'reverse: axes must be an int or a list'),
    (lambda: K.temporal_padding(X3, (1,)), ValueError, 'temporal_padding: padding must be'),
    (lambda: K.temporal_padding(X3, (1, -1)), ValueError, 'temporal_padding: padding must be'),
    (lambda: K.temporal_padding(X4), ValueError, 'temporal_padding: expected a tensor of rank 3'),
    (lambda: K.spatial_2d_padding(X4, ((1, 1),)), ValueError, 'spatial_2d_padding: padding must be'),
    (lambda: K.spatial_2d_padding(X4, data_format='nhwc'), ValueError, 'spatial_2d_padding: data_format'),
    (lambda: K.spatial_2d_padding(X3), ValueError, 'spatial_2d_padding: expected a tensor of rank 4'),
    (lambda: K.spatial_3d_padding(X4), ValueError, 'spatial_3d_padding: expected a tensor of rank 5'),
    (lambda: K.resize_images(X4, 2, 2, 'channels_last', 'bicubic'), ValueError, 'resize_images: interpolation'),
    (lambda: K.resize_images(X4, 0, 2, 'channels_last'), ValueError, 'resize_images: height_factor must be >= 1'),
    (lambda: K.resize_images(X4, 2, 1.5, 'channels_last'), TypeError, 'resize_images: width_factor must be an int'),
    (lambda: K.resize_images(X4, 2, 2, 'nchw'), ValueError, 'resize_images: data_format'),
    (lambda: K.resize_images(X3, 2, 2, 'channels_last'), ValueError, 'resize_images: expected a tensor of rank 4'),
    (lambda: K.resize_volumes(X4, 2, 2, 2, 'channels_last'), ValueError, 'resize_volumes: expected a tensor of rank 5'),
    (lambda: K.pattern_broadcast(X3, 'yes'), TypeError, 'pattern_broadcast: broadcastable must be a list'),
    (lambda: K.batch_flatten(K.constant(1.0)), ValueError, 'batch_flatten: x needs at least one axis'),
    (lambda: K.size('abc'), TypeError, 'size: x must be a tensor'),
]


@pytest.mark.parametrize('call, error, match', BAD_CALLS, ids=[m.split(':')[0] + str(i) for i, (_, _, m) in
                                                              enumerate(BAD_CALLS)])
def test_bad_arguments(call, error, match):
    with pytest.raises(error, match=match):
        call()
