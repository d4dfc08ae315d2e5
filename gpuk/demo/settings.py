"""The demo's tunable settings (no Keras import, so the command line can show the defaults)."""
from dataclasses import dataclass, field

from gpuk.demo.data import RenderSpec


@dataclass(frozen=True)
class ModelSpec:
    """Layer widths; the defaults train to >90% sequence accuracy in a few CPU minutes."""
    conv_filters: tuple = (16, 32)
    dense_units: int = 64
    rnn_units: int = 48
    bidirectional: bool = True
    learning_rate: float = 3e-3


@dataclass(frozen=True)
class TrainConfig:
    """Everything a run depends on; the defaults are the tuned `make demo` settings."""
    epochs: int = 4
    batch_size: int = 32
    train_size: int = 6000
    val_size: int = 500
    seed: int = 0
    beam_width: int = 10
    render: RenderSpec = field(default_factory=RenderSpec)
    model: ModelSpec = field(default_factory=ModelSpec)
