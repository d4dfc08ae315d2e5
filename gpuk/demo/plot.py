"""The training curves as a PNG (matplotlib's Agg backend: no display needed)."""
import os


def plot_history(history, path, title='gpuk OCR demo'):
    """Writes loss (training and held-out) and held-out sequence accuracy per epoch to ``path``.

    # Arguments
        history: dict of per-epoch lists: 'loss', and optionally 'val_loss' and 'val_seq_acc'.
        path: PNG file to write (its folder is created).
    # Returns
        path.
    """
    if not isinstance(history, dict) or not history.get('loss'):
        raise ValueError("plot_history: history must be a dict with a non-empty 'loss' list, got %r" % (history,))
    import matplotlib
    matplotlib.use('Agg')
    import matplotlib.pyplot as plt
    from matplotlib.ticker import MaxNLocator

    epochs = range(1, len(history['loss']) + 1)
    figure, (loss_axes, accuracy_axes) = plt.subplots(1, 2, figsize=(10, 4))
    loss_axes.plot(epochs, history['loss'], 'o-', label='training')
    if history.get('val_loss'):
        loss_axes.plot(epochs, history['val_loss'], 's-', label='held-out')
    loss_axes.set(xlabel='epoch', ylabel='CTC loss', title='loss', yscale='log')
    loss_axes.legend()
    if history.get('val_seq_acc'):
        accuracy_axes.plot(epochs, [100 * a for a in history['val_seq_acc']], 'o-', color='tab:green')
    accuracy_axes.set(xlabel='epoch', ylabel='% strings read exactly', title='held-out sequence accuracy (greedy)',
                      ylim=(0, 100))
    accuracy_axes.grid(alpha=0.3)
    for axes in (loss_axes, accuracy_axes):
        axes.xaxis.set_major_locator(MaxNLocator(integer=True))   # epochs are whole numbers
    figure.suptitle(title)
    figure.tight_layout()
    folder = os.path.dirname(os.path.abspath(path))
    os.makedirs(folder, exist_ok=True)
    figure.savefig(path, dpi=100)
    plt.close(figure)
    return path
