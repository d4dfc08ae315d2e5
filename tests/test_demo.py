"""The OCR demo (gpuk.demo): renderer, scoring, and a tiny end-to-end training run of the CLI."""
import json
import os
import subprocess
import sys

import numpy as np
import pytest

from gpuk.demo import metrics
from gpuk.demo.data import LABEL_PADDING, RenderSpec, encode_labels, make_dataset, render_digit_strings
from gpuk.demo.glyphs import GLYPH_HEIGHT, GLYPH_WIDTH, glyph_bitmaps

REPO_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


# --- glyphs and renderer ------------------------------------------------------------------

def test_glyphs_are_distinct_binary_bitmaps():
    bitmaps = glyph_bitmaps()
    assert bitmaps.shape == (10, GLYPH_HEIGHT, GLYPH_WIDTH)
    assert set(np.unique(bitmaps)) == {0.0, 1.0}
    flat = bitmaps.reshape(10, -1)
    assert len({row.tobytes() for row in flat}) == 10
    assert glyph_bitmaps(2).shape == (10, 2 * GLYPH_HEIGHT, 2 * GLYPH_WIDTH)
    with pytest.raises(ValueError, match='glyph_bitmaps: scale'):
        glyph_bitmaps(0)


def test_dataset_shapes_ranges_and_labels():
    spec = RenderSpec()
    data = make_dataset(300, seed=3, spec=spec)
    assert data.images.shape == (300, spec.height, spec.width, 1)
    assert data.images.dtype == np.float32
    assert data.images.min() >= 0.0 and data.images.max() <= 1.0
    lengths = np.array([len(t) for t in data.texts])
    assert lengths.min() == spec.min_len and lengths.max() == spec.max_len
    np.testing.assert_array_equal(data.label_lengths, lengths)
    for text, row, n in zip(data.texts, data.labels, data.label_lengths):
        assert ''.join(str(d) for d in row[:n]) == text
        assert (row[n:] == LABEL_PADDING).all()


def test_render_is_deterministic_given_the_seed():
    first, again, other = make_dataset(50, 7), make_dataset(50, 7), make_dataset(50, 8)
    np.testing.assert_array_equal(first.images, again.images)
    assert first.texts == again.texts
    assert first.texts != other.texts


def test_noiseless_render_places_exactly_the_glyph_ink():
    spec = RenderSpec(height=7, width=17, min_len=3, max_len=3, max_jitter=0, min_gap=1, max_gap=1,
                      min_ink=1.0, max_blur=0.0, noise=0.0)
    image = render_digit_strings(['307'], np.random.default_rng(0), spec)[0]
    bitmaps = glyph_bitmaps()
    expected = np.concatenate([bitmaps[3], np.zeros((7, 1)), bitmaps[0], np.zeros((7, 1)), bitmaps[7]], axis=1)
    np.testing.assert_array_equal(image, expected.astype(np.float32))


def test_noise_and_blur_stay_in_range_and_change_pixels():
    rng = np.random.default_rng(1)
    clean = render_digit_strings(['12345'] * 4, rng, RenderSpec(noise=0.0, max_blur=0.0, max_jitter=0))
    noisy = render_digit_strings(['12345'] * 4, np.random.default_rng(1), RenderSpec(max_jitter=0))
    assert noisy.min() >= 0.0 and noisy.max() <= 1.0
    assert np.abs(noisy - clean).mean() > 0.05
    # Same rng stream: positions and ink agree, so the ink still dominates where the glyphs are.
    assert noisy[clean > 0].mean() > noisy[clean == 0].mean() + 0.3


def test_bad_render_arguments_raise_value_errors():
    with pytest.raises(ValueError, match='width 20 cannot hold 7 characters'):
        make_dataset(4, 0, RenderSpec(width=20))
    with pytest.raises(ValueError, match='min_len'):
        make_dataset(4, 0, RenderSpec(min_len=5, max_len=4))
    with pytest.raises(ValueError, match='encode_labels: texts'):
        encode_labels(['12a'], 4)
    with pytest.raises(ValueError, match='make_dataset: count'):
        make_dataset(0, 0)


# --- scoring ------------------------------------------------------------------------------

def test_decoded_to_strings_reads_up_to_padding_and_flags_non_digits():
    decoded = np.array([[1, 2, 3, -1], [9, -1, -1, -1], [-1, -1, -1, -1], [0, 10, 4, 5]])
    assert metrics.decoded_to_strings(decoded) == ['123', '9', '', '0?45']
    with pytest.raises(ValueError, match='decoded_to_strings'):
        metrics.decoded_to_strings(np.zeros((2, 3), np.float32))


def test_sequence_accuracy_and_character_error_rate():
    truth = ['123', '4567', '89', '000']
    predicted = ['123', '4557', '89', '00']
    assert metrics.sequence_accuracy(predicted, truth) == 0.5
    assert metrics.character_error_rate(predicted, truth) == pytest.approx(2 / 12)
    assert metrics.edit_distance('kitten', 'sitting') == 3
    assert metrics.edit_distance('', '123') == 3
    with pytest.raises(ValueError, match='sequence_accuracy: predicted and truth must have the same length'):
        metrics.sequence_accuracy(['1'], ['1', '2'])
    with pytest.raises(ValueError, match='must not be empty'):
        metrics.character_error_rate([], [])


# --- end to end ---------------------------------------------------------------------------

def _run_demo(out, *flags):
    """Runs `python -m gpuk.demo` in a fresh process (it sets KERAS_BACKEND itself) on the CPU."""
    env = dict(os.environ, PYTHONPATH=REPO_ROOT + os.pathsep + os.environ.get('PYTHONPATH', ''))
    env.pop('KERAS_BACKEND', None)
    command = [sys.executable, '-m', 'gpuk.demo', '--device', 'cpu', '--out', str(out)] + list(flags)
    finished = subprocess.run(command, cwd=str(out), env=env, capture_output=True, text=True, timeout=300)
    assert finished.returncode == 0, finished.stdout[-3000:] + finished.stderr[-3000:]
    return finished.stdout, json.loads((out / 'results.json').read_text())


def test_demo_cli_trains_and_decodes(tmp_path):
    stdout, results = _run_demo(tmp_path, '--epochs', '2', '--batch-size', '32', '--train-size', '384',
                                '--val-size', '64', '--seed', '5')
    assert 'device: cpu' in stdout
    assert 'sequence accuracy: greedy' in stdout
    # stdout is a pipe: one progress line per epoch, not a redrawn bar per batch
    assert '\r' not in stdout and '[====' not in stdout
    assert sum(line.startswith('Epoch ') for line in stdout.splitlines()) == 2
    losses = results['history']['loss']
    assert len(losses) == 2 and losses[1] < losses[0]
    assert len(results['history']['val_seq_acc']) == 2
    assert len(results['held_out']) == 64
    for truth, greedy, beam in results['held_out']:
        for text in (greedy, beam):
            assert text == '' or text.isdigit(), (truth, greedy, beam)
    assert 0.0 <= results['greedy_accuracy'] <= 1.0 and 0.0 <= results['beam_accuracy'] <= 1.0
    png = (tmp_path / 'training.png').read_bytes()
    assert png.startswith(b'\x89PNG')


def test_demo_is_deterministic_given_the_seed(tmp_path):
    flags = ('--epochs', '1', '--train-size', '96', '--val-size', '16', '--seed', '11')
    (tmp_path / 'a').mkdir()
    (tmp_path / 'b').mkdir()
    _, first = _run_demo(tmp_path / 'a', *flags)
    _, again = _run_demo(tmp_path / 'b', *flags)
    assert first['history'] == again['history']
    assert first['held_out'] == again['held_out']


def test_demo_rejects_bad_flags(tmp_path):
    env = dict(os.environ, PYTHONPATH=REPO_ROOT)
    finished = subprocess.run([sys.executable, '-m', 'gpuk.demo', '--kernels', 'conv=fast'], cwd=str(tmp_path),
                              env=env, capture_output=True, text=True, timeout=60)
    assert finished.returncode == 2
    assert 'conv=fast' in finished.stderr
    finished = subprocess.run([sys.executable, '-m', 'gpuk.demo', '--precision', 'bf16'], cwd=str(tmp_path),
                              env=env, capture_output=True, text=True, timeout=60)
    assert finished.returncode == 2
    assert "--precision: invalid choice: 'bf16'" in finished.stderr
