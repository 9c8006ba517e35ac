"""The optimizer's parameter groups, as indices into a list of (name, shape): the order ZeRO-1 partitions
them in (model_states.zero1_partition) and the groups the trainer builds (distributed/optim.py). Pure Python."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from . import muon

if TYPE_CHECKING:
    from ..config.model_section import ModelConfig
    from ..config.schema import ResolvedModelConfig


def optimizer_groups(optimizer: str, m: ResolvedModelConfig, shapes: list[Any]) -> list[list[int]]:
    """The optimizer's parameter groups as indices into `shapes` (ZeRO-1 partitions them group by group)."""
    return muon.muon_groups(m, shapes) if optimizer == "muon" else decay_groups(m, shapes)


def decay_groups(m: ModelConfig, shapes: list[Any]) -> list[list[int]]:
    """AdamW's two parameter groups: [with weight decay (matrices), without (norms, biases, tied embedding)]."""
    decay: list[int] = []
    no_decay: list[int] = []
    for i, (name, shape) in enumerate(shapes):
        tied_embedding = m.tie_embeddings and name == "embed.weight"
        (decay if len(shape) >= 2 and not tied_embedding else no_decay).append(i)
    return [g for g in (decay, no_decay) if g]
