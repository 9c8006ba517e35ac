"""Tensor parallelism (Megatron-LM's split of each block over `t` ranks) and sequence parallelism, with
`torch.distributed.tensor.parallel` on the mesh's "tp" dimension. The design (which projections split how, the
vocabulary-parallel embedding, MoE blocks, the fused rows in rank order): docs/parallel.md, "Design notes"."""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch
from torch import nn
from torch.distributed.tensor import DTensor, Replicate, Shard, distribute_module, distribute_tensor
from torch.distributed.tensor.parallel import (
    ColwiseParallel,
    ParallelStyle,
    PrepareModuleInput,
    RowwiseParallel,
    SequenceParallel,
    parallelize_module,
)

from ..errors import ConfigError
from ..model.moe import MoE
from ..plan.model_states import is_moe_dense
from ..plan.params import fused_rows

if TYPE_CHECKING:
    from torch.distributed.device_mesh import DeviceMesh

    from ..model.transformer import Transformer


def rank_order(segments: list[int], tp: int) -> torch.Tensor:
    """Row i of the rank-ordered tensor is row order[i] of the canonical one: for each rank in turn, its
    1/tp of every segment."""
    starts = [sum(segments[:i]) for i in range(len(segments))]
    rows = [
        torch.arange(start + r * (size // tp), start + (r + 1) * (size // tp))
        for r in range(tp)
        for start, size in zip(starts, segments)
    ]
    return torch.cat(rows)


class Replicated(ParallelStyle):
    """The module's parameters replicated on every tensor rank, as DTensors; plain tensors in and out (a norm
    without sequence parallelism)."""

    def _apply(self, module: nn.Module, device_mesh: DeviceMesh) -> nn.Module:
        def inputs(mod: nn.Module, args: tuple, mesh: DeviceMesh) -> tuple:
            return tuple(
                DTensor.from_local(a, mesh, [Replicate()], run_check=False) if isinstance(a, torch.Tensor) else a
                for a in args
            )

        def output(mod: nn.Module, out: DTensor, mesh: DeviceMesh) -> torch.Tensor:
            return out.to_local()

        # input_fn is declared to return None, yet its result is the module's inputs (a forward pre-hook's)
        return distribute_module(module, device_mesh, input_fn=inputs, output_fn=output)  # pyright: ignore[reportArgumentType]


class VocabularyParallelEmbedding(RowwiseParallel):
    """RowwiseParallel on an embedding (each rank looks up the ids of its vocabulary rows), its output
    redistributed synchronously: RowwiseParallel's asynchronous one hands the next module a waiting tensor,
    and the backward of a block compiled around it fails (torch 2.13)."""

    @staticmethod
    def _prepare_output_fn(output_layouts, use_local_output, mod, outputs, device_mesh):
        out = outputs.redistribute(placements=output_layouts)
        return out.to_local() if use_local_output else out


def _linear_split(linear: nn.Module, by: str, float8: bool, **layouts) -> ParallelStyle:
    """ColwiseParallel (`by` "rows" of the weight) or RowwiseParallel ("columns"); torchao's float8 styles for a
    Float8Linear when `float8` (plan/fp8.py: float8_tensor_parallel says when and why)."""
    if float8:
        from torchao.float8.float8_linear import Float8Linear
        from torchao.float8.float8_tensor_parallel import Float8ColwiseParallel, Float8RowwiseParallel

        if isinstance(linear, Float8Linear):  # a linear the filter left bf16 keeps torch's style
            return (Float8ColwiseParallel if by == "rows" else Float8RowwiseParallel)(**layouts)
    return (ColwiseParallel if by == "rows" else RowwiseParallel)(**layouts)


def apply_tensor_parallel(model: Transformer, mesh: DeviceMesh, sequence_parallel: bool, float8: bool = False) -> None:
    """Split `model` (our LLaMA Transformer, on the meta device or holding its canonical values) over the
    1-D tensor mesh `mesh`, in place. `model.row_orders` keeps each fused parameter's rank order (for the
    per-parameter init, which fills the canonical tensor and takes this rank's rows, and for checkpoints).
    `float8`: the Float8Linears' collectives in float8 (torchao's styles)."""
    tp = mesh.size()
    orders = {
        name: rank_order(segments, tp)
        for name, _ in model.named_parameters()
        if (segments := fused_rows(name, model.config)) and not is_moe_dense(name)  # an MoE layer is not split
    }
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name in orders and not p.is_meta:  # values already there (init, or init_from): into rank order
                p.copy_(p[orders[name].to(p.device)])
    model.row_orders = orders
    # Between sub-layers: the sequence split across ranks (sequence parallel) or whole on every rank.
    between = Shard(1) if sequence_parallel else Replicate()

    def norm():
        return SequenceParallel() if sequence_parallel else Replicated()

    for block in model.blocks:
        feed_forward = (
            {  # whole experts (parallel.expert_tensor 1): the MoE layer takes this rank's part of the sequence
                "mlp": PrepareModuleInput(input_layouts=between, desired_input_layouts=between, use_local_output=True)
            }
            if isinstance(block.mlp, MoE)
            else {
                "mlp.up": _linear_split(block.get_submodule("mlp.up"), "rows", float8, input_layouts=between),
                "mlp.down": _linear_split(block.get_submodule("mlp.down"), "columns", float8, output_layouts=between),
            }
        )
        parallelize_module(
            block,
            mesh,
            {
                "attn_norm": norm(),
                "attn.qkv": _linear_split(block.get_submodule("attn.qkv"), "rows", float8, input_layouts=between),
                "attn.proj": _linear_split(block.get_submodule("attn.proj"), "columns", float8, output_layouts=between),
                "mlp_norm": norm(),
                **feed_forward,
            },
        )
    tied = model.lm_head.weight is model.embed.weight
    parallelize_module(
        model,
        mesh,
        {
            "embed": VocabularyParallelEmbedding(input_layouts=Replicate(), output_layouts=between),
            "norm": norm(),
            # Called as a module only for logits (`model(tokens)`: the downstream tasks, run.eval_tasks): the
            # final norm's output in, each rank's vocabulary rows multiplied, the whole logits out on every
            # rank. Training never calls it: the loss takes its weight.
            "lm_head": ColwiseParallel(input_layouts=between, output_layouts=Replicate()),
            # The loss module takes (final-norm output, output weight, targets): the whole sequence and the whole
            # weight on every rank, as plain tensors, so both losses run unchanged.
            "loss": PrepareModuleInput(
                input_layouts=(between, Shard(0), None),
                desired_input_layouts=(Replicate(), Replicate(), None),
                use_local_output=True,
            ),
        },
    )
    if tied:
        model.lm_head.weight = model.embed.weight


def keep_own_vocabulary_rows(model: Transformer) -> None:
    """Both vocabulary-split weights get gradients for the whole vocabulary, the same on every tensor rank (the
    embedding's backward is computed replicated; the gathered output weight's comes back as a view of the
    whole): keep a copy of this rank's rows only, so the whole one is freed at once. Hooks on the parameters
    as they are at the end (moving a model from the meta device replaces them); under FSDP its reduce-scatter
    makes each rank's own gradient shard anyway."""

    def own_rows(grad):
        return grad.redistribute(grad.device_mesh, [Shard(0)]).clone()

    for p in {model.embed.weight, model.lm_head.weight}:
        p.register_hook(own_rows)


def _reordered(t, order: torch.Tensor):
    """`t`'s rows taken in `order`, laid out (sharded or replicated) as `t` is."""
    if not isinstance(t, DTensor):
        return t[order.to(t.device)]
    full = t.full_tensor()[order.to(t.device)]
    return distribute_tensor(full, t.device_mesh, t.placements, src_data_rank=None)


def _convert(sd: dict, orders: dict, canonical: bool) -> dict:
    """The model and optimizer state dict (get_state_dict's, keyed by parameter name) with every fused
    tensor put in canonical order (or back into rank order), new tensors in place of those."""
    if not orders:
        return sd
    order = {name: torch.argsort(o) if canonical else o for name, o in orders.items()}
    model = {k: _reordered(v, order[k]) if k in order else v for k, v in sd["model"].items()}
    flat = {}  # every engine's optimizer state is flattened: {"state.NAME.exp_avg": ...}
    for key, v in sd["optimizer"].items():
        name = key[len("state.") :].rsplit(".", 1)[0] if key.startswith("state.") else None
        flat[key] = _reordered(v, order[name]) if name in order and isinstance(v, torch.Tensor) and v.dim() else v
    return {**sd, "model": model, "optimizer": flat}


def to_canonical(sd: dict, orders: dict) -> dict:
    """For a checkpoint: fused tensors in the single-process row order, the same in every layout."""
    return _convert(sd, orders, canonical=True)


def from_canonical(sd: dict, orders: dict) -> dict:
    return _convert(sd, orders, canonical=False)


__all__ = ["apply_tensor_parallel", "keep_own_vocabulary_rows", "rank_order", "to_canonical", "from_canonical"]


def enable_async_tp(compiled: bool, device_type: str) -> None:
    """Async tensor parallelism (parallel.async_tp): inductor's micro-pipeline pass rewrites each compiled
    all-gather + matmul and matmul + reduce-scatter of sequence parallelism into chunks over symmetric memory,
    so a chunk moves while the matmul of the one before runs (torch.distributed._symmetric_memory; what
    torchtitan's enable_async_tensor_parallel switches on). A compiler pass on NCCL's CUDA buffers: eager
    blocks or a CPU would silently keep the plain collectives, so they are refused."""
    if not compiled or device_type != "cuda":
        raise ConfigError(
            f"parallel.async_tp: needs compiled blocks on CUDA GPUs (this run: {device_type}, "
            f"{'compiled' if compiled else 'eager'}); use parallel.async_tp=false here"
        )
    import torch._inductor.config

    torch._inductor.config._micro_pipeline_tp = True
