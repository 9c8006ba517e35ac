"""Training: `pretrain.train.train(config)` runs a pretraining job (also under torchrun)."""

from __future__ import annotations

import os
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from ..config.schema import ResolvedConfig

# PyTorch's CUDA allocator then grows segments in place instead of caching blocks of fixed sizes: less memory
# lost to fragmentation as the batch ramp and evaluation change the shapes (torchtitan sets it too).
ALLOCATOR_CONF = "expandable_segments:True"


def use_expandable_segments() -> None:
    """Set PYTORCH_CUDA_ALLOC_CONF for this process unless the user set it (or its newer name,
    PYTORCH_ALLOC_CONF). The allocator reads it once, when CUDA starts: call this before any CUDA call."""
    if "PYTORCH_CUDA_ALLOC_CONF" not in os.environ and "PYTORCH_ALLOC_CONF" not in os.environ:
        os.environ["PYTORCH_CUDA_ALLOC_CONF"] = ALLOCATOR_CONF


def train(config: ResolvedConfig) -> dict:
    """Train from a loaded (resolved) config; returns a summary (steps, tokens, final validation loss, run_dir)."""
    use_expandable_segments()
    from ..distributed.runtime import init_runtime, shutdown
    from ..files import write_error
    from .trainer import Trainer

    rt = init_runtime(config.train.device)
    try:
        return Trainer(config, rt).fit()
    except OSError as e:  # a full disk or a read-only run.dir anywhere in the run: one line (checkpoints are atomic)
        error = write_error(
            e,
            f"run.dir {config.run.dir}",
            "the run",
            kept=(
                "its complete checkpoints are intact (free space or fix the permissions, then `pretrain train "
                f"--resume {config.run.dir}`)"
            ),
        )
        if error is None:
            raise
        raise error from None
    finally:
        shutdown(rt)
