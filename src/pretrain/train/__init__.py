"""Training: `pretrain.train.train(config)` runs a pretraining job (also under torchrun)."""

from __future__ import annotations


def train(config) -> dict:
    """Train from a resolved Config; returns a summary (steps, tokens, final validation loss, run_dir)."""
    from ..distributed.runtime import init_runtime, shutdown
    from ..files import write_error
    from .trainer import Trainer

    rt = init_runtime(config.train.device)
    try:
        return Trainer(config, rt).fit()
    except OSError as e:  # a full disk or a read-only run.dir anywhere in the run: one line (checkpoints are atomic)
        error = write_error(e, f"run.dir {config.run.dir}", "the run", kept=(
            "its complete checkpoints are intact (free space or fix the permissions, then `pretrain train "
            f"--resume {config.run.dir}`)"))
        if error is None:
            raise
        raise error from None
    finally:
        shutdown(rt)


def load_model(path, device: str = "cpu"):
    """Our torch.nn.Module from a run directory or a checkpoint, in eval mode."""
    from .resume import load_model as _load

    return _load(path, device=device)
