"""Turning CTC decoder output into strings and scoring them (no Keras needed)."""
import numpy as np

from gpuk.demo.glyphs import DIGITS

INVALID_SYMBOL = '?'  # a decoded class that is not a digit (the blank must never come out of a decoder)


def decoded_to_strings(decoded):
    """Rows of class indices padded with -1 (``K.ctc_decode``'s output) -> digit strings.

    Each row is read up to its first -1; a class outside 0-9 becomes INVALID_SYMBOL so a
    malformed decoding counts as wrong instead of passing silently.
    """
    decoded = np.asarray(decoded)
    if decoded.ndim != 2 or decoded.dtype.kind not in 'iu':
        raise ValueError('decoded_to_strings: decoded must be a 2-D integer array, got %s %s'
                         % (decoded.dtype, decoded.shape))
    texts = []
    for row in decoded:
        ends = np.flatnonzero(row == -1)
        row = row[:ends[0]] if ends.size else row
        texts.append(''.join(DIGITS[c] if 0 <= c < 10 else INVALID_SYMBOL for c in row))
    return texts


def _check_pairs(where, predicted, truth):
    predicted, truth = list(predicted), list(truth)
    if len(predicted) != len(truth):
        raise ValueError('%s: predicted and truth must have the same length, got %d and %d'
                         % (where, len(predicted), len(truth)))
    if not truth:
        raise ValueError('%s: predicted and truth must not be empty' % where)
    return predicted, truth


def sequence_accuracy(predicted, truth):
    """Fraction of strings predicted exactly (every character, nothing missing or extra)."""
    predicted, truth = _check_pairs('sequence_accuracy', predicted, truth)
    return sum(p == t for p, t in zip(predicted, truth)) / len(truth)


def edit_distance(a, b):
    """Levenshtein distance between two strings (insertions, deletions, substitutions)."""
    previous = list(range(len(b) + 1))
    for i, ca in enumerate(a, 1):
        current = [i]
        for j, cb in enumerate(b, 1):
            current.append(min(previous[j] + 1, current[j - 1] + 1, previous[j - 1] + (ca != cb)))
        previous = current
    return previous[-1]


def character_error_rate(predicted, truth):
    """Total edit distance over total truth length (can exceed 1 for long garbage)."""
    predicted, truth = _check_pairs('character_error_rate', predicted, truth)
    total = sum(len(t) for t in truth)
    if total == 0:
        raise ValueError('character_error_rate: truth strings are all empty')
    return sum(edit_distance(p, t) for p, t in zip(predicted, truth)) / total
