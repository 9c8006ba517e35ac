"""Training: `pretrain.train.train(config)` runs a pretraining job (also under torchrun)."""

from __future__ import annotations


def train(config) -> dict:
    """Train from a resolved Config; returns a summary (steps, tokens, final validation loss, run_dir)."""
    import gc

    from ..distributed.runtime import init_runtime, shutdown
    from .loop import Trainer

    rt = init_runtime(config.train.device)
    try:
        return Trainer(config, rt).run()
    finally:
        shutdown(rt)
        # The trainer sits in reference cycles (modules, hooks): collect it now, while the interpreter is
        # whole. Left to interpreter shutdown, freeing FSDP's tensors and gloo's last work objects there
        # can abort the process ("terminate called without an active exception") after a finished run.
        gc.collect()


def load_model(path, device: str = "cpu"):
    """Our torch.nn.Module from a run directory or a checkpoint, in eval mode."""
    from .checkpoint import load_model as _load

    return _load(path, device=device)
