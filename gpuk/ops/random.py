"""Random ops: normal, truncated normal, uniform and Bernoulli draws, and the dropout mask.

Each op owns its generator: a ``xp.random.default_rng(seed)`` Generator (numpy on the host,
cupy on the GPU) made on first use from the array namespace in use, one per namespace. So a
freshly built graph replays the same sequence for a given seed while every run of a compiled
function draws new values (TensorFlow's op-seed semantics). Random ops are stateful: they
are never constant-folded and have no gradient (dropout's gradient flows through the
multiply by the mask, which is drawn once per run).

Shapes are static tuples (None where only known at run time); a runtime shape arrives as
an int vector input (see ``shape.resolve_shape``).
"""
import numpy as np

from gpuk.graph import Meta, Tensor, apply
from gpuk.ops.base import Op
from gpuk.ops.shape import resolve_shape

# Generators of numpy and cupy draw float32 and float64 only.
_DRAWN_FLOATS = ('float32', 'float64')
_SEED_BOUND = 2 ** 62


def unseeded():
    """A seed for an op built without one. Taken from NumPy's global generator, as Keras's
    TensorFlow backend does, so ``np.random.seed`` makes whole models reproducible."""
    return int(np.random.randint(_SEED_BOUND, dtype=np.int64))


def normalize_seed(seed, where):
    """A non-negative int seed (a fresh one for None); TypeError for non-integers."""
    if seed is None:
        return unseeded()
    if isinstance(seed, bool) or not isinstance(seed, (int, np.integer)):
        raise TypeError('%s: seed must be an int or None, got %r' % (where, seed))
    return int(seed) % _SEED_BOUND  # TensorFlow takes negative seeds too


def sample_shape(spec, where):
    """(static shape, runtime int vector tensor or None) for a shape given to a random op."""
    if isinstance(spec, np.ndarray):
        spec = tuple(spec.tolist())
    if isinstance(spec, Tensor) and np.dtype(spec.dtype).kind not in 'iu':
        raise TypeError('%s: a shape tensor must have an integer dtype, got %s' % (where, spec.dtype))
    static, vector = resolve_shape(spec, where)
    if static is not None and any(d is not None and d < 0 for d in static):
        raise ValueError('%s: shape entries must be non-negative, got %s' % (where, static))
    return static, vector


class RandomOp(Op):
    """Base of the random ops: a generator per array namespace, a static or runtime shape."""
    shape_from_values = slice(0, None)   # the shape vector, when there is one
    foldable = False
    differentiable = False

    def __init__(self, static_shape, dtype, seed):
        self.static_shape = static_shape
        self.dtype = dtype
        self.seed = seed
        self._generators = {}

    def infer(self, *shape_vector):
        return Meta(self.static_shape, self.dtype)

    def generator(self, xp):
        rng = self._generators.get(xp)
        if rng is None:
            rng = self._generators[xp] = xp.random.default_rng(self.seed)
        return rng

    def forward(self, impl, *shape_vector):
        xp = impl.xp
        if shape_vector:
            shape = tuple(int(d) for d in shape_vector[0].tolist())
        else:
            shape = self.static_shape
        return xp.asarray(self.draw(xp, self.generator(xp), shape))

    def draw(self, xp, rng, shape):
        raise TypeError('%s does not define draw()' % type(self).__name__)

    def __repr__(self):
        attrs = ', '.join('%s=%r' % kv for kv in sorted(vars(self).items()) if kv[0] != '_generators')
        return '%s(%s)' % (type(self).__name__, attrs)


def _drawn_dtype(dtype):
    """The dtype the generator draws in: float16 draws float32 and rounds afterwards."""
    return dtype if dtype in _DRAWN_FLOATS else 'float32'


class Normal(RandomOp):
    """``mean + stddev * N(0, 1)``; with ``truncate``, draws beyond 2 stddev are re-drawn."""

    def __init__(self, static_shape, dtype, seed, mean=0.0, stddev=1.0, truncate=False):
        super().__init__(static_shape, dtype, seed)
        self.mean, self.stddev, self.truncate = float(mean), float(stddev), bool(truncate)

    def draw(self, xp, rng, shape):
        work = _drawn_dtype(self.dtype)
        z = rng.standard_normal(shape, dtype=work)
        if self.truncate:
            # About 4.6% of draws fall outside; each pass re-draws only those.
            outside = xp.abs(z) > 2
            count = int(xp.count_nonzero(outside))
            while count:
                z[outside] = rng.standard_normal(count, dtype=work)
                outside = xp.abs(z) > 2
                count = int(xp.count_nonzero(outside))
        if self.stddev != 1.0:
            z *= self.stddev
        if self.mean != 0.0:
            z += self.mean
        return z.astype(self.dtype, copy=False)


class Uniform(RandomOp):
    """Floats in [minval, maxval), or integers in [minval, maxval) for integer dtypes."""

    def __init__(self, static_shape, dtype, seed, minval=0.0, maxval=1.0):
        super().__init__(static_shape, dtype, seed)
        self.minval, self.maxval = minval, maxval

    def draw(self, xp, rng, shape):
        if np.dtype(self.dtype).kind in 'iu':
            return rng.integers(int(self.minval), int(self.maxval), size=shape,
                                dtype=np.int64).astype(self.dtype, copy=False)
        u = rng.random(shape, dtype=_drawn_dtype(self.dtype))
        span = self.maxval - self.minval
        if span != 1.0:
            u *= span
        if self.minval != 0.0:
            u += self.minval
        if self.dtype in _DRAWN_FLOATS:
            return u
        out = u.astype(self.dtype)
        # Rounding to float16 can reach maxval; keep the interval half-open.
        # (numpy scalars, not 0-d arrays: cupy ufuncs take the former only)
        scalar = np.dtype(self.dtype).type
        top = scalar(self.maxval)
        below_top = np.nextafter(top, scalar(self.minval))
        if below_top >= self.minval and top == self.maxval:
            out = xp.minimum(out, below_top)
        return out


class Bernoulli(RandomOp):
    """1 with probability ``p``, else 0, in ``dtype``."""

    def __init__(self, static_shape, dtype, seed, p):
        super().__init__(static_shape, dtype, seed)
        self.p = float(p)

    def draw(self, xp, rng, shape):
        # '<' so that p=0 never gives a 1 and p=1 always does (the draw is in [0, 1)).
        return (rng.random(shape, dtype='float64') < self.p).astype(self.dtype)


class DropoutMask(RandomOp):
    """``1 / (1 - level)`` where an entry is kept (probability 1 - level), else 0."""

    def __init__(self, static_shape, dtype, seed, level):
        super().__init__(static_shape, dtype, seed)
        self.level = float(level)

    def draw(self, xp, rng, shape):
        keep = rng.random(shape, dtype='float32') >= self.level
        mask = keep.astype(self.dtype)
        mask *= np.dtype(self.dtype).type(1.0 / (1.0 - self.level))
        return mask


def random_tensor(op_class, shape, dtype, seed, where, **params):
    """A node drawing from ``op_class``: ``shape`` may mix ints and symbolic scalars or be
    an int vector tensor; ``seed`` None draws one (see ``unseeded``)."""
    static, vector = sample_shape(shape, where)
    op = op_class(static, dtype, normalize_seed(seed, where), **params)
    return apply(op) if vector is None else apply(op, vector)
