"""Activation checkpointing (`train.activation_checkpointing`), applied from outside a plain model.

  full       each block keeps only its input; backward runs the block again (Chen et al. 2016, "Training Deep
             Nets with Sublinear Memory Cost").
  selective  the two norms and the MLP activation of each block are recomputed: they keep large fp32 /
             intermediate tensors for few FLOPs, while matmul inputs and the attention output stay
             (Korthikanti et al. 2022 recompute attention's core instead; ours has no seq x seq scores to drop).

How: the chosen modules' `forward` is replaced, on the instance, by a call of the same forward through
`torch.utils.checkpoint.checkpoint(..., use_reentrant=False)`. The module tree, and so every parameter name
(per-parameter init, optimizer groups, DCP checkpoints, export), stays exactly as it is, unlike a wrapper
module (torch's `checkpoint_wrapper` adds `_checkpoint_wrapped_module.` to the names). torch's composable
`torch.distributed._composable.checkpoint` keeps the names too, but runs as forward hooks that torch.compile
cannot trace into one graph (a `fullgraph=True` compile of a block fails on its context manager, torch 2.13);
`torch.utils.checkpoint` is traced (a higher-order op) and composes with FSDP2 the same way
(FSDP's hooks stay on the block; its parameters are gathered again before backward reaches the recomputation).
"""

from __future__ import annotations

import types

import torch
import torch.utils.checkpoint
from torch import nn

MODES = ("none", "selective", "full")


def _recomputed_forward(module: nn.Module, *args, **kwargs):
    """A module's own (class) forward, run under activation checkpointing: nothing it computes is kept for
    backward but its inputs, and backward runs it again. One function bound to every checkpointed module:
    torch.compile guards a bound method by its function, so the blocks compiled one by one share one graph
    (a callable object per module would be guarded by its id: a recompilation per block)."""
    return torch.utils.checkpoint.checkpoint(type(module).forward, module, *args, use_reentrant=False, **kwargs)


def _checkpoint(module: nn.Module) -> None:
    if not is_checkpointed(module):
        module.forward = types.MethodType(_recomputed_forward, module)


def apply_activation_checkpointing(model: nn.Module, mode: str) -> nn.Module:
    """Checkpoint `model`'s blocks for `mode` (none | selective | full), in place; returns the model. `model`:
    a pretrain Transformer, or one Block (`pretrain bench` measures one). Call it before torch.compile and
    before DDP / FSDP wrap the model (torchtitan's order)."""
    if mode not in MODES:
        raise ValueError(f"activation checkpointing {mode!r}: one of {', '.join(MODES)}")
    blocks = model.blocks if hasattr(model, "blocks") else [model]
    for block in blocks:
        if mode == "full":
            _checkpoint(block)
        elif mode == "selective":
            for module in (block.attn_norm, block.mlp_norm, block.mlp.act):
                _checkpoint(module)
    return model


def is_checkpointed(module: nn.Module) -> bool:
    return getattr(module.__dict__.get("forward"), "__func__", None) is _recomputed_forward


def checkpointed_modules(model: nn.Module) -> list[nn.Module]:
    """The modules whose forward runs under activation checkpointing."""
    return [m for m in model.modules() if is_checkpointed(m)]


def forward_without_checkpoint(module: nn.Module, *args, **kwargs):
    """Run a checkpointed module's own forward, keeping its tensors (what its recomputation holds in backward)."""
    return type(module).forward(module, *args, **kwargs)
