"""Training: `pretrain.train.train(config)` runs a pretraining job (also under torchrun)."""

from __future__ import annotations


def train(config) -> dict:
    """Train from a resolved Config; returns a summary (steps, tokens, final validation loss, run_dir)."""
    from ..distributed.runtime import init_runtime, shutdown
    from .trainer import Trainer

    rt = init_runtime(config.train.device)
    try:
        return Trainer(config, rt).fit()
    finally:
        shutdown(rt)


def load_model(path, device: str = "cpu"):
    """Our torch.nn.Module from a run directory or a checkpoint, in eval mode."""
    from .checkpoint import load_model as _load

    return _load(path, device=device)
