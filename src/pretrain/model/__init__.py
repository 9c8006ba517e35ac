"""Models built from the `model:` config section (the same section the planner reads)."""

from __future__ import annotations

import torch

from .transformer import Transformer


def build_model(model_cfg, attention: str = "sdpa", device=None, init: bool = True, seed: int = 0) -> Transformer:
    """A Transformer for `model_cfg` (a resolved ModelConfig). On the meta device nothing is allocated."""
    with torch.device(device or "cpu"):
        model = Transformer(model_cfg, attention=attention)
    if init and str(device) != "meta":
        model.reset_parameters(seed)
    return model


def count_parameters(model: torch.nn.Module) -> int:
    """Unique parameters (a tied output layer counts once)."""
    return sum(p.numel() for p in model.parameters())


__all__ = ["Transformer", "build_model", "count_parameters"]
