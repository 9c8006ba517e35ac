"""Models built from the `model:` config section (the same section the planner reads)."""

from __future__ import annotations

import torch

from .documents import Documents
from .transformer import Transformer


def build_model(
    model_cfg,
    attention: str = "sdpa",
    device=None,
    seed: int = 0,
    loss: str = "chunked",
    loss_chunk_tokens: int = 4096,
    documents: Documents | None = None,
) -> Transformer:
    """A Transformer for `model_cfg` (a resolved ModelConfig). On the meta device nothing is allocated.
    `loss`, `loss_chunk_tokens`: train.loss and train.loss_chunk_tokens (pretrain.model.loss); `documents`: how
    it reads the documents of a window (pretrain.model.documents; None: packing as is)."""
    with torch.device(device or "cpu"):
        model = Transformer(model_cfg, attention=attention, loss=loss, loss_chunk_tokens=loss_chunk_tokens)
    model.documents = documents
    if str(device) != "meta":
        model.reset_parameters(seed)
    return model


def count_parameters(model: torch.nn.Module) -> int:
    """Unique parameters (a tied output layer counts once)."""
    return sum(p.numel() for p in model.parameters())


__all__ = ["Documents", "Transformer", "build_model", "count_parameters"]
