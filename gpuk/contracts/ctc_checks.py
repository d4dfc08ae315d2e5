"""Argument checks of the CTC family, shared by the NumPy twins (gpuk/cpu_fallback/ctc.py)
and the CUDA / cuDNN launchers (gpuk/kernels/ctc.py, gpuk/kernels/cudnn/ctc.py), so both
raise the same errors, with the same messages, before any work."""
import os

import numpy as np

from gpuk.contracts import softmax_xent_checks
from gpuk.contracts.dtypes import FLOAT_DTYPES_NO_BFLOAT16


def stand_in(array):
    """Zero-stride zeros of ``array``'s shape and dtype (a NumPy or CuPy array): the checks
    here see the shapes and dtypes without a host copy of the values (zeros pass every value
    check). The graph ops and the launchers run them on these before any work."""
    return np.broadcast_to(np.zeros((), dtype=array.dtype), array.shape)


def int_array(fn, name, value, ndim):
    """Integer dtypes, or floats holding whole numbers (Keras feeds float labels)."""
    array = np.asarray(value)
    if array.ndim != ndim:
        raise ValueError('%s: %s must have rank %d, got shape %s' % (fn, name, ndim, array.shape))
    if np.issubdtype(array.dtype, np.integer):
        return array.astype(np.int64, copy=False)
    if np.issubdtype(array.dtype, np.floating):
        if not np.all(np.isfinite(array)) or np.any(array != np.round(array)):
            raise ValueError('%s: %s must hold integers, got non-integer values' % (fn, name))
        return array.astype(np.int64)
    raise ValueError('%s: %s must be an integer array, got dtype %s' % (fn, name, array.dtype))


def float_array(fn, name, value):
    """A float16, float32 or float64 array: the CTC kernels have no bfloat16 variant, so the
    twin refuses bfloat16 too (the softmax family takes it)."""
    return softmax_xent_checks.float_array(fn, name, value, bfloat16=False)


def check_logits(fn, name, value):
    array = float_array(fn, name, value)
    if array.ndim != 3:
        raise ValueError('%s: %s must have rank 3 (batch, time, classes), got shape %s'
                         % (fn, name, array.shape))
    if array.shape[2] == 0:
        raise ValueError('%s: %s must have at least one class, got shape %s'
                         % (fn, name, array.shape))
    return array


def check_blank(fn, blank, classes):
    if blank is None:
        return classes - 1
    if isinstance(blank, bool) or not isinstance(blank, (int, np.integer)) \
            or not 0 <= blank < classes:
        raise ValueError('%s: blank must be None or an int in [0, %d), got %r'
                         % (fn, classes, blank))
    return int(blank)


def check_lengths(fn, name, value, batch, upper, upper_name):
    lengths = int_array(fn, name, value, 1)
    if lengths.shape[0] != batch:
        raise ValueError('%s: %s must have shape (%d,) (the batch size), got %s'
                         % (fn, name, batch, lengths.shape))
    if lengths.size and (lengths.min() < 0 or lengths.max() > upper):
        raise ValueError('%s: %s must lie in [0, %d] (%s), got values in [%d, %d]'
                         % (fn, name, upper, upper_name, lengths.min(), lengths.max()))
    return lengths


def check_loss_inputs(fn, logits, labels, input_lengths, label_lengths, blank):
    logits = check_logits(fn, 'logits', logits)
    batch, steps, classes = logits.shape
    blank = check_blank(fn, blank, classes)
    labels = int_array(fn, 'labels', labels, 2)
    if labels.shape[0] != batch:
        raise ValueError('%s: labels must have the batch size of logits %s, got shape %s'
                         % (fn, logits.shape, labels.shape))
    input_lengths = check_lengths(fn, 'input_lengths', input_lengths, batch, steps,
                                  'the time steps of logits')
    label_lengths = check_lengths(fn, 'label_lengths', label_lengths, batch, labels.shape[1],
                                  'the width of labels')
    used = np.arange(labels.shape[1]) < label_lengths[:, None]
    values = labels[used]
    if values.size and (values.min() < 0 or values.max() >= classes or np.any(values == blank)):
        raise ValueError('%s: labels must lie in [0, %d) without the blank index %d, got %s'
                         % (fn, classes, blank, np.unique(values).tolist()))
    return logits, labels, input_lengths, label_lengths, blank


def not_integral(xp, values):
    """Elementwise: a float that is not a whole number (NaN and inf included)."""
    if values.dtype.kind != 'f':
        return xp.zeros(values.shape, dtype=bool)
    return ~xp.isfinite(values) | (values != xp.round(values))


def bad_lengths(xp, lengths, upper):
    """Elementwise: True where a length (checked by check_lengths) is not allowed."""
    return not_integral(xp, lengths) | (lengths < 0) | (lengths > upper)


def lengths_flag(xp, input_lengths, label_lengths, steps, width):
    """A 0-d boolean array of xp: True when an input length is not allowed for ``steps`` time
    steps or a label length for labels ``width`` wide (bad_lengths)."""
    return xp.any(bad_lengths(xp, input_lengths, steps)) | xp.any(bad_lengths(xp, label_lengths, width))


def loss_values_flag(xp, labels, input_lengths, label_lengths, steps, classes, blank):
    """A 0-d boolean array of xp, computed on the arrays' device without reading them back:
    True when check_loss_inputs would reject a value (inputs whose shapes and dtypes it
    accepted). gpuk/kernels/ctc.py reads it later (runtime/deferred.py)."""
    width = labels.shape[1]
    bad = lengths_flag(xp, input_lengths, label_lengths, steps, width)
    used = xp.arange(width)[None, :] < label_lengths[:, None]
    # int_array rejects a non-integral float anywhere in labels, padding included
    out_of_range = (labels < 0) | (labels >= classes) | (labels == blank)
    return bad | xp.any(not_integral(xp, labels)) | xp.any(used & out_of_range)


def lengths_to_first_blank(xp, labels, label_lengths, classes):
    """Each label length cut at the first label >= classes - 1 (the blank or beyond), which
    ends that sample's label sequence as in TensorFlow (Keras's ctc_batch_cost, gpuk/ops/ctc.py):
    Keras's OCR example (image_ocr.py) labels its blank images with the blank, length 1, and
    trains on them."""
    if classes is None or labels.ndim != 2 or labels.shape[0] != label_lengths.shape[0]:
        return label_lengths  # the caller's label check reports the shape error
    if labels.shape[1] == 0:
        return label_lengths.astype(np.int64)   # no label to cut at (argmax refuses an empty axis)
    used = xp.arange(labels.shape[1])[None, :] < label_lengths[:, None]
    ends = used & (labels >= classes - 1)
    return xp.where(xp.any(ends, axis=1), xp.argmax(ends, axis=1), label_lengths).astype(np.int64)


def labels_after_the_cut(xp, labels, label_lengths, cut, classes):
    """Elementwise (N, L): True at a label past its sample's first-blank ``cut`` (see
    lengths_to_first_blank) but within its label length that is not a blank (>= classes - 1;
    NaN is not). TensorFlow's CTC loss refuses these ("Saw a non-null label (index >=
    num_classes - 1) following a null label"): the usual cause is labels that use every class of
    y_pred, so that the last one collides with the blank. None where the shapes do not fit
    (the caller's checks report them)."""
    if classes is None or labels.ndim != 2 or labels.shape[0] != label_lengths.shape[0] \
            or cut.shape != label_lengths.shape:
        return None
    position = xp.arange(labels.shape[1])[None, :]
    return (position >= cut[:, None]) & (position < label_lengths[:, None]) & ~(labels >= classes - 1)


def check_value_arrays(fn, labels, input_lengths, label_lengths):
    """ctc_check_loss_values's arrays: labels (N, L) and two lengths vectors (N,), each of an
    integer or float16/32/64 dtype (the element types ctc_check.cu reads)."""
    if labels.ndim != 2:
        raise ValueError('%s: labels must have rank 2 (batch, max_label_length), got shape %s' % (fn, labels.shape))
    for name, lengths in (('input_lengths', input_lengths), ('label_lengths', label_lengths)):
        if lengths.shape != labels.shape[:1]:
            raise ValueError('%s: %s must have shape (%d,) (the batch size), got %s'
                             % (fn, name, labels.shape[0], lengths.shape))
    for name, array in (('labels', labels), ('input_lengths', input_lengths), ('label_lengths', label_lengths)):
        if array.dtype.kind not in 'iu' and array.dtype not in FLOAT_DTYPES_NO_BFLOAT16:
            raise TypeError('%s: %s must be an integer or float16/32/64 array, got dtype %s' % (fn, name, array.dtype))


def check_decode_inputs(fn, log_probs, input_lengths, blank):
    log_probs = check_logits(fn, 'log_probs', log_probs)
    batch, steps, classes = log_probs.shape
    input_lengths = check_lengths(fn, 'input_lengths', input_lengths, batch, steps,
                                  'the time steps of log_probs')
    return log_probs, input_lengths, check_blank(fn, blank, classes)


def positive_int(fn, name, value, upper=None):
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value < 1 \
            or (upper is not None and value > upper):
        bound = '>= 1' if upper is None else 'in [1, %d]' % upper
        raise ValueError('%s: %s must be an int %s, got %r' % (fn, name, bound, value))
    return int(value)


def _bytes_text(count):
    for unit, size in (('TiB', 1 << 40), ('GiB', 1 << 30), ('MiB', 1 << 20), ('KiB', 1 << 10)):
        if count >= size:
            return '%.2f %s' % (count / size, unit)
    return '%d bytes' % count


def host_bytes_available():
    """The host memory the kernel says a process can still allocate without swapping
    (/proc/meminfo's MemAvailable), else the free physical pages, else None (unknown)."""
    try:
        with open('/proc/meminfo') as meminfo:
            for line in meminfo:
                if line.startswith('MemAvailable:'):
                    return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        pass
    try:
        return os.sysconf('SC_AVPHYS_PAGES') * os.sysconf('SC_PAGE_SIZE')
    except (AttributeError, OSError, ValueError):
        return None


def check_beam_scratch(fn, beam_width, needed_bytes, available_bytes, memory, shape):
    """Refuses, before anything is allocated, a beam_width whose beam search needs more
    scratch (``needed_bytes``, the caller's own formula for its arrays) than the
    ``available_bytes`` of ``memory`` ('host' or 'GPU'; None: not known, no check), for
    log_probs of ``shape``: a MemoryError (what a failed allocation raises; K.function
    reports it as gpuk.OutOfMemoryError naming the K function), not the OOM killer."""
    if available_bytes is not None and needed_bytes > available_bytes:
        raise MemoryError('%s: beam_width %d needs %s of %s memory for its beam search scratch on log_probs of '
                          'shape (batch, time, classes) = %s, more than the %s available: use a smaller beam_width'
                          % (fn, beam_width, _bytes_text(needed_bytes), memory, tuple(shape),
                             _bytes_text(available_bytes)))


def useful_beam_width(beam_width, steps, classes):
    """``beam_width``, or the number of distinct prefixes ``steps`` frames of ``classes``
    classes (one a blank) can spell, 1 + L + L^2 + ... + L^steps for L labels, where that is
    smaller: a wider beam holds only prefixes of probability 0 beyond them, so a beam search
    of this width finds the same prefixes with the same scores."""
    labels, count, power = classes - 1, 1, 1
    for _ in range(steps):
        if count >= beam_width or labels == 0:
            break
        power *= labels
        count += power
    return min(beam_width, count)
