"""An embedded 5x7 bitmap font for the digits 0-9 (written as data, so nothing is downloaded)."""
import numpy as np

GLYPH_HEIGHT = 7
GLYPH_WIDTH = 5
DIGITS = '0123456789'

# One string per digit, rows top to bottom, '#' = ink. Kept in the classic 5x7 dot-matrix
# style, with a few strokes differing between look-alikes (6/8/9, 3/5) so that the
# digits stay distinguishable under noise.
_FONT = {
    '0': ('.###.', '#...#', '#..##', '#.#.#', '##..#', '#...#', '.###.'),
    '1': ('..#..', '.##..', '..#..', '..#..', '..#..', '..#..', '.###.'),
    '2': ('.###.', '#...#', '....#', '...#.', '..#..', '.#...', '#####'),
    '3': ('#####', '...#.', '..#..', '...#.', '....#', '#...#', '.###.'),
    '4': ('...#.', '..##.', '.#.#.', '#..#.', '#####', '...#.', '...#.'),
    '5': ('#####', '#....', '####.', '....#', '....#', '#...#', '.###.'),
    '6': ('..##.', '.#...', '#....', '####.', '#...#', '#...#', '.###.'),
    '7': ('#####', '....#', '...#.', '..#..', '.#...', '.#...', '.#...'),
    '8': ('.###.', '#...#', '#...#', '.###.', '#...#', '#...#', '.###.'),
    '9': ('.###.', '#...#', '#...#', '.####', '....#', '...#.', '.##..'),
}


def glyph_bitmaps(scale=1):
    """The font as a (10, 7*scale, 5*scale) float32 array of 0/1, indexed by digit value.

    # Arguments
        scale: integer magnification (each font dot becomes a scale x scale block).
    """
    if isinstance(scale, bool) or not isinstance(scale, (int, np.integer)) or scale < 1:
        raise ValueError('glyph_bitmaps: scale must be an int >= 1, got %r' % (scale,))
    bitmaps = np.array([[[dot == '#' for dot in row] for row in _FONT[d]] for d in DIGITS],
                       dtype=np.float32)
    if scale > 1:
        bitmaps = bitmaps.repeat(scale, axis=1).repeat(scale, axis=2)
    return bitmaps
