"""Synthetic OCR data: strings of digits rendered with the embedded font, jitter and noise.

Everything is drawn from one ``numpy.random.Generator``, so a seed fixes the data set.
Rendering is vectorized over samples and characters (one scatter for the whole batch).
"""
from dataclasses import dataclass

import numpy as np

from gpuk.demo.glyphs import DIGITS, GLYPH_HEIGHT, GLYPH_WIDTH, glyph_bitmaps

LABEL_PADDING = -1  # dense labels past a string's length (ignored by CTC, as in Keras's OCR example)


@dataclass(frozen=True)
class RenderSpec:
    """Image geometry and the variation the renderer draws from."""
    height: int = 12
    width: int = 72
    min_len: int = 3
    max_len: int = 7
    scale: int = 1           # font magnification
    max_jitter: int = 2      # per-character vertical shift, in pixels (either way)
    min_gap: int = 0         # horizontal space between characters, in pixels
    max_gap: int = 3
    min_ink: float = 0.7     # per-character stroke intensity drawn from [min_ink, 1]
    max_blur: float = 0.3    # per-image weight, drawn from [0, max_blur], of a 3x3 box blur
    noise: float = 0.2       # standard deviation of the additive Gaussian pixel noise

    def validate(self, where='RenderSpec'):
        """Raises ValueError when the parameters are inconsistent or the longest string cannot fit."""
        for name in ('height', 'width', 'min_len', 'max_len', 'scale'):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value < 1:
                raise ValueError('%s: %s must be an int >= 1, got %r' % (where, name, value))
        for name in ('max_jitter', 'min_gap', 'max_gap'):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value < 0:
                raise ValueError('%s: %s must be an int >= 0, got %r' % (where, name, value))
        if self.min_len > self.max_len:
            raise ValueError('%s: min_len (%d) must not exceed max_len (%d)' % (where, self.min_len, self.max_len))
        if self.min_gap > self.max_gap:
            raise ValueError('%s: min_gap (%d) must not exceed max_gap (%d)' % (where, self.min_gap, self.max_gap))
        if not 0.0 <= self.min_ink <= 1.0:
            raise ValueError('%s: min_ink must be in [0, 1], got %r' % (where, self.min_ink))
        if not 0.0 <= self.max_blur <= 1.0:
            raise ValueError('%s: max_blur must be in [0, 1], got %r' % (where, self.max_blur))
        if not self.noise >= 0.0:
            raise ValueError('%s: noise must be >= 0, got %r' % (where, self.noise))
        glyph_h, glyph_w = GLYPH_HEIGHT * self.scale, GLYPH_WIDTH * self.scale
        if self.height < glyph_h + 2 * self.max_jitter:
            raise ValueError('%s: height %d cannot hold a %d-pixel glyph jittered by +-%d'
                             % (where, self.height, glyph_h, self.max_jitter))
        widest = self.max_len * glyph_w + (self.max_len - 1) * self.max_gap
        if self.width < widest:
            raise ValueError('%s: width %d cannot hold %d characters (%d pixels with the widest gaps)'
                             % (where, self.width, self.max_len, widest))


@dataclass(frozen=True)
class Dataset:
    """Images (N, height, width, 1) in [0, 1], dense labels (N, max_len) padded with
    LABEL_PADDING, label lengths (N,), and the strings themselves."""
    images: np.ndarray
    labels: np.ndarray
    label_lengths: np.ndarray
    texts: tuple

    def __len__(self):
        return len(self.texts)


def random_digit_strings(count, min_len, max_len, rng):
    """``count`` strings of digits with lengths uniform in [min_len, max_len]."""
    lengths = rng.integers(min_len, max_len + 1, size=count)
    digits = rng.integers(0, 10, size=(count, max_len))
    return tuple(''.join(DIGITS[d] for d in row[:n]) for row, n in zip(digits, lengths))


def encode_labels(texts, max_len):
    """Dense int32 labels (N, max_len) padded with LABEL_PADDING, and int32 lengths (N,)."""
    labels = np.full((len(texts), max_len), LABEL_PADDING, dtype=np.int32)
    lengths = np.zeros(len(texts), dtype=np.int32)
    for row, text in enumerate(texts):
        if not text or len(text) > max_len or not text.isdigit() or not text.isascii():
            raise ValueError('encode_labels: texts must be strings of 1 to %d digits, got %r' % (max_len, text))
        labels[row, :len(text)] = [DIGITS.index(c) for c in text]
        lengths[row] = len(text)
    return labels, lengths


def _box_blur3(images):
    """Mean over each pixel's 3x3 neighbourhood (zero outside the image), for (N, H, W)."""
    padded = np.pad(images, ((0, 0), (1, 1), (1, 1)))
    rows = padded[:, :-2] + padded[:, 1:-1] + padded[:, 2:]
    return (rows[:, :, :-2] + rows[:, :, 1:-1] + rows[:, :, 2:]) / np.float32(9)


def render_digit_strings(texts, rng, spec=RenderSpec()):
    """Renders each string into a (height, width) image; returns float32 (N, height, width) in [0, 1].

    Each string starts at a random column; each character gets its own gap, vertical
    jitter and ink intensity; each image gets a random amount of blur; then Gaussian
    noise is added and the result clipped.
    """
    spec.validate('render_digit_strings')
    labels, lengths = encode_labels(texts, spec.max_len)
    count, slots = labels.shape
    bitmaps = glyph_bitmaps(spec.scale)
    glyph_h, glyph_w = bitmaps.shape[1:]

    used = np.arange(slots)[None, :] < lengths[:, None]                      # (N, L)
    gaps = rng.integers(spec.min_gap, spec.max_gap + 1, size=(count, slots))
    advance = glyph_w + gaps
    x_in_string = np.concatenate([np.zeros((count, 1), np.int64), np.cumsum(advance, axis=1)[:, :-1]], axis=1)
    string_width = lengths * glyph_w + np.where(np.arange(slots)[None, :] < lengths[:, None] - 1, gaps, 0).sum(1)
    start = (rng.random(count) * (spec.width - string_width + 1)).astype(np.int64)
    x0 = start[:, None] + x_in_string                                           # (N, L)
    top = (spec.height - glyph_h) // 2
    y0 = top + rng.integers(-spec.max_jitter, spec.max_jitter + 1, size=(count, slots))
    y0 = np.clip(y0, 0, spec.height - glyph_h)
    ink = rng.uniform(spec.min_ink, 1.0, size=(count, slots)).astype(np.float32)

    # One scatter of every inked pixel of every character; characters never overlap
    # (advance >= glyph width), so plain assignment is exact.
    values = bitmaps[np.where(used, labels, 0)] * (ink * used)[:, :, None, None]  # (N, L, gh, gw)
    sample = np.broadcast_to(np.arange(count)[:, None, None, None], values.shape)
    rows = np.broadcast_to(y0[:, :, None, None] + np.arange(glyph_h)[None, None, :, None], values.shape)
    cols = np.broadcast_to(x0[:, :, None, None] + np.arange(glyph_w)[None, None, None, :], values.shape)
    inked = values > 0
    images = np.zeros((count, spec.height, spec.width), dtype=np.float32)
    images[sample[inked], rows[inked], cols[inked]] = values[inked]
    if spec.max_blur > 0:
        blur = rng.uniform(0.0, spec.max_blur, size=(count, 1, 1)).astype(np.float32)
        images = (1 - blur) * images + blur * _box_blur3(images)
    if spec.noise > 0:
        images += rng.normal(0.0, spec.noise, size=images.shape).astype(np.float32)
    return np.clip(images, 0.0, 1.0, out=images)


def make_dataset(count, seed, spec=RenderSpec()):
    """``count`` random digit strings and their renderings, fully determined by ``seed``."""
    if isinstance(count, bool) or not isinstance(count, (int, np.integer)) or count < 1:
        raise ValueError('make_dataset: count must be an int >= 1, got %r' % (count,))
    spec.validate('make_dataset')
    rng = np.random.default_rng(seed)
    texts = random_digit_strings(count, spec.min_len, spec.max_len, rng)
    images = render_digit_strings(texts, rng, spec)
    labels, lengths = encode_labels(texts, spec.max_len)
    return Dataset(images[..., None], labels, lengths, texts)
