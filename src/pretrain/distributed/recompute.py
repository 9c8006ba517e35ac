"""Activation checkpointing (`train.activation_checkpointing`), applied from outside a plain model.

  full       each block keeps only its input; backward runs the block again (Chen et al. 2016, "Training Deep
             Nets with Sublinear Memory Cost").
  selective  operator-level, as torchtitan's op policy (selective_ac_option "op"): each block keeps its input,
             the attention kernel's outputs (SDPA's output and log-sum-exp) and every other matmul's output,
             counted per block (ours: qkv and the MLP's fused gate|up); backward recomputes the rest: the
             norms, rotary, casts, the activation and the other matmuls (the attention output projection,
             needed again for the second norm's input; the MLP's down projection only makes the block's
             output, which backward never needs: non-reentrant checkpoint stops recomputing before it).
             Korthikanti et al. 2022 recompute attention's core instead; SDPA has no seq x seq scores to drop.
             An MoE block keeps its top-k choice and remakes the whole routed part: the router, the
             permutation, the experts' GEMMs and SwiGLU, the combine (and, under expert parallelism, its
             all-to-alls run again); its shared experts are counted as an MLP's matmuls.

How: each block's `forward` is replaced, on the instance, by a call of the same forward through
`torch.utils.checkpoint.checkpoint(..., use_reentrant=False)`. The module tree, and so every parameter name
(per-parameter init, optimizer groups, DCP checkpoints, export), stays exactly as it is, unlike a wrapper
module (torch's `checkpoint_wrapper` adds `_checkpoint_wrapped_module.` to the names). torch's composable
`torch.distributed._composable.checkpoint` keeps the names too, but runs as forward hooks that torch.compile
cannot trace into one graph (a `fullgraph=True` compile of a block fails on its context manager, torch 2.13);
`torch.utils.checkpoint` is traced (a higher-order op) and composes with FSDP2 the same way
(FSDP's hooks stay on the block; its parameters are gathered again before backward reaches the recomputation).
Selective passes `torch.utils.checkpoint.create_selective_checkpoint_contexts(policy)` (torch 2.4 on) as the
checkpoint's context: in eager mode it caches the saved ops' outputs in forward and hands them back in the
recomputation; under torch.compile the policy tags the graph's nodes and the min-cut partitioner honours them.
"""

from __future__ import annotations

import types
from collections.abc import Callable
from typing import Any

import torch
import torch.utils.checkpoint
from torch import nn
from torch.utils.checkpoint import CheckpointPolicy, create_selective_checkpoint_contexts

from ..model.moe import in_routed_part

MODES = ("none", "selective", "full")

_aten = torch.ops.aten
# Attention kernels whose outputs selective recomputation keeps (those this torch has): SDPA's fused kernels
# on CUDA and the CPU, and FlexAttention (a higher-order op) for document masks.
ATTENTION_OPS = frozenset(
    getattr(_aten, name).default
    for name in (
        "_scaled_dot_product_flash_attention",
        "_scaled_dot_product_efficient_attention",
        "_scaled_dot_product_cudnn_attention",
        "_scaled_dot_product_flash_attention_for_cpu",
    )
    if hasattr(_aten, name)
) | ({torch.ops.higher_order.flex_attention} if hasattr(torch.ops.higher_order, "flex_attention") else set())
# A linear layer is one of these (with a bias addmm, else mm, over the tokens flattened to rows).
MATMUL_OPS = frozenset((_aten.mm.default, _aten.addmm.default))


def _ignore_profiler_ranges() -> None:
    """Selective checkpointing replays a block's ops by their invocation count; the profiler's range ops that
    FSDP2 wraps its hooks in (record_function "FSDP::pre_forward", "FSDP::all_gather") run a different number
    of times in forward and in the recomputation when an FSDP unit sits inside the block (an MoE layer's
    experts: expert_parallel.py), and torch 2.13 then fails the backward ("invocation index N encountered
    during backward but not found in storage"). They carry no tensor to keep: in SAC_IGNORED_OPS (torch's
    public set of ops SAC runs without counting) they still run, uncounted."""
    from torch.utils.checkpoint import SAC_IGNORED_OPS

    profiler = torch.ops.profiler
    for name in ("_record_function_enter", "_record_function_enter_new", "_record_function_exit"):
        packet = getattr(profiler, name, None)
        for overload in packet.overloads() if packet is not None else ():
            SAC_IGNORED_OPS.add(getattr(packet, overload))


def selective_policy() -> Callable[..., CheckpointPolicy]:
    """A policy for one checkpointed block call: keep (MUST_SAVE) the attention kernels' outputs and every
    other matmul's (the 1st, 3rd, ... of the block: torchtitan's `mm_count % 2`), recompute the rest. The
    matmuls are counted apart in forward and in the recomputation, so that both decide alike. An MoE layer's
    routed part (model/moe.py `routed_part`) keeps only its top-k choice: its router matmul, permutation,
    experts (grouped GEMMs or their loop's matmuls) and combine are remade, as torchtitan's policy does (its
    router forced to recompute, the grouped GEMM not among its saved ops); its shared experts count as an MLP."""
    counts = {False: 0, True: 0}

    def policy(ctx, op, *args, **kwargs):
        if op in ATTENTION_OPS:
            return CheckpointPolicy.MUST_SAVE
        if in_routed_part():  # the choice kept, so the recomputation routes every token as forward did
            return CheckpointPolicy.MUST_SAVE if op == _aten.topk.default else CheckpointPolicy.PREFER_RECOMPUTE
        if op in MATMUL_OPS:
            counts[ctx.is_recompute] += 1
            if counts[ctx.is_recompute] % 2:
                return CheckpointPolicy.MUST_SAVE
        return CheckpointPolicy.PREFER_RECOMPUTE

    return policy


def _selective_contexts():
    return create_selective_checkpoint_contexts(selective_policy())


def _recomputed_forward(module: nn.Module, *args, **kwargs):
    """A module's own (class) forward, run under activation checkpointing: nothing it computes is kept for
    backward but its inputs, and backward runs it again. One function bound to every checkpointed module:
    torch.compile guards a bound method by its function, so the blocks compiled one by one share one graph
    (a callable object per module would be guarded by its id: a recompilation per block)."""
    return torch.utils.checkpoint.checkpoint(type(module).forward, module, *args, use_reentrant=False, **kwargs)


def _selectively_recomputed_forward(module: nn.Module, *args, **kwargs):
    """As _recomputed_forward, but what `selective_policy` saves is kept from forward and not recomputed."""
    return torch.utils.checkpoint.checkpoint(
        type(module).forward, module, *args, use_reentrant=False, context_fn=_selective_contexts, **kwargs
    )


_FORWARDS = {"full": _recomputed_forward, "selective": _selectively_recomputed_forward}


def _checkpoint(module: nn.Module, mode: str) -> None:
    if not is_checkpointed(module):
        module.forward = types.MethodType(_FORWARDS[mode], module)


def apply_activation_checkpointing(model: nn.Module, mode: str) -> nn.Module:
    """Checkpoint `model`'s blocks for `mode` (none | selective | full), in place; returns the model. `model`:
    a pretrain Transformer, or one Block (`pretrain bench` measures one). Call it before torch.compile and
    before DDP / FSDP wrap the model (torchtitan's order)."""
    if mode not in MODES:
        raise ValueError(f"activation checkpointing {mode!r}: one of {', '.join(MODES)}")
    blocks = getattr(model, "blocks", [model])  # a Transformer's blocks, or the one Block given
    if mode == "selective":
        _ignore_profiler_ranges()
    if mode != "none":
        for block in blocks:
            _checkpoint(block, mode)
    return model


def checkpoint_mode(module: nn.Module) -> str:
    """none | selective | full: how `module`'s forward is checkpointed."""
    forward = getattr(module.__dict__.get("forward"), "__func__", None)
    return next((mode for mode, f in _FORWARDS.items() if f is forward), "none")


def is_checkpointed(module: nn.Module) -> bool:
    return checkpoint_mode(module) != "none"


def checkpointed_modules(model: nn.Module) -> list[nn.Module]:
    """The modules whose forward runs under activation checkpointing."""
    return [m for m in model.modules() if is_checkpointed(m)]


def forward_without_checkpoint(module: nn.Module, *args: Any, **kwargs: Any) -> Any:
    """Run a checkpointed module's own forward, keeping its tensors (what its recomputation holds in backward)."""
    return type(module).forward(module, *args, **kwargs)
