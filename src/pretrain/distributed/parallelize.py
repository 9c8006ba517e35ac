"""Make a plain model trainable on this process layout, in torchtitan's order:

  cast (pure bf16) -> tensor parallelism -> activation checkpointing -> compile (block by block) -> data
  parallelism -> materialise (a model built on the meta device gets its shard's values) -> optimizer

The process grid's DeviceMesh ("pp", "dp", "tp", distributed/mesh.py) is built once here, where a layout
splits over it: tensor parallelism splits each block over mesh["tp"] (tensor_parallel.py), FSDP and the
pipeline's engines work over mesh["dp"] (and "pp").

The engines (one process, DDP, ZeRO-1, FSDP2) are in engines.py; the pipeline's and data_parts.py's build on
them.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING

from .. import precision
from ..config import compile_enabled
from ..model.moe import MoE
from .engines import DDP, FSDP, FSDP_CPU_TORCH, Parallelized, ZeRO1
from .mesh import Layout
from .recompute import apply_activation_checkpointing
from .runtime import Runtime
from .tensor_parallel import apply_tensor_parallel, enable_async_tp, keep_own_vocabulary_rows

if TYPE_CHECKING:
    from torch.distributed.device_mesh import DeviceMesh

    from ..config.schema import ResolvedConfig
    from ..model.transformer import Transformer


def _mesh_and_tensor_parallel(
    model: Transformer, config: ResolvedConfig, layout: Layout, rt: Runtime, fp8: dict | None
) -> DeviceMesh | None:
    """The grid's DeviceMesh, where something splits over it (DDP and ZeRO-1 need none: each mesh dimension
    would make a process group, an NCCL communicator, at start-up), and the blocks split over its "tp" ranks."""
    wants_mesh = layout.tensor > 1 or layout.pipeline > 1 or (layout.data > 1 and config.parallel.fsdp)
    mesh = layout.build_mesh(rt.device.type) if rt.distributed and wants_mesh else None
    if config.parallel.tensor > 1:
        assert mesh is not None  # wants_mesh, and tensor > 1 means more than one process
        float8 = fp8 is not None and fp8["tensor_parallel"] == "float8"  # distributed/fp8.py says when
        apply_tensor_parallel(model, mesh["tp"], config.parallel.sequence_parallel, float8=float8)
        if config.parallel.async_tp:
            enable_async_tp(compile_enabled(config.train.compile, rt.device.type), rt.device.type)
    return mesh


def parallelize(model: Transformer, config: ResolvedConfig, rt: Runtime) -> Parallelized:
    """The plain `model` (on this device, or on the meta device under FSDP) made trainable here."""
    t = config.train
    if t.precision == "bf16":
        model = model.to(precision.weight_dtype(t.precision))
    layout = Layout.of(config.parallel, rt.world_size)
    fp8 = None
    if t.precision == "fp8":  # on the plain model: wrappers would rename the linears the filter chooses by
        from .fp8 import convert

        fp8 = convert(model, config, rt.device.type)
    mesh = _mesh_and_tensor_parallel(model, config, layout, rt, fp8)
    apply_activation_checkpointing(model, t.activation_checkpointing)
    model.fix_attention_kernel(rt.device, half=t.precision != "fp32")
    compiled = _compile(model, config, rt)
    kind = _engine_kind(config, layout)
    engine = kind(model, config, rt, mesh)
    engine.fp8 = fp8
    # The meter's hooks would break the compiled graphs; under tensor parallelism autograd saves DTensors,
    # whose storage the meter cannot read (the parameter, gradient and optimizer bytes are still measured).
    engine.measurable = engine.measurable and not compiled and config.parallel.tensor == 1
    if any(p.is_meta for p in engine.module.parameters()):
        # Each rank materialises only its shard: a 70B model never exists whole on one GPU. The per-parameter
        # seeded init gives every layout the same values.
        engine.module.to_empty(device=rt.device)
        model.reset_parameters(t.seed)
    if config.parallel.tensor > 1 and not config.parallel.fsdp:
        keep_own_vocabulary_rows(model)
    model.rotary(t.seq_len, rt.device)  # built before the first (compiled) forward, not inside it
    engine.optimizer = engine.build_optimizer(config)
    return engine


def _compile(model: Transformer, config: ResolvedConfig, rt: Runtime) -> bool:
    """train.compile: each block, and the output layer with the loss, compiled where it is on; whether it is."""
    compiled = compile_enabled(config.train.compile, rt.device.type)
    if compiled and config.parallel.tensor > 1:
        # AOTAutograd's on-disk cache hands a block compiled for one tensor-parallel layout to another with the
        # same shapes (with and without sequence parallelism, torch 2.13): measured, the run then trains wrong
        # (loss 6.04 for 5.71 after 10 steps of tests/distributed/test_tensor_parallel.py's run). Off here:
        # every run compiles its own blocks.
        import torch._functorch.config

        torch._functorch.config.enable_autograd_cache = False
    if compiled:
        # Block by block, before sharding (torchtitan's order): FSDP2's hooks sit at the block boundaries and
        # stay eager; a whole-model compile would meet them inside the loop over blocks and run all eager.
        # A block is one graph (tests/train/test_step_parts.py): fullgraph makes a future break an error, not
        # a silent slowdown; under FSDP the module call also runs its hooks, which dynamo may split off. An MoE
        # block breaks around its routed feed-forward, which runs eager (model/moe.py).
        for block in model.blocks:
            block.compile(fullgraph=not (config.parallel.fsdp or isinstance(block.mlp, MoE)))
        # The output layer and loss (`model.loss`, which takes the output weight as an argument) compiled on
        # their own: under FSDP only the blocks would be, and this is the step's largest matmul. No FSDP hooks
        # sit on it, so it is one graph in every layout (tests/model/test_loss.py).
        model.loss.compile(fullgraph=True)
    return compiled


def _engine_kind(config: ResolvedConfig, layout: Layout) -> Callable[..., Parallelized]:
    """What makes this layout's engine (engines.py and the modules beside it) of the model."""
    moe = config.model.num_experts > 0
    if config.parallel.pipeline > 1:
        from .pipeline import pipelined

        return pipelined
    if moe and layout.tensor > 1:  # the MoE layer data-parallel over data x tensor ranks (expert_parallel.py)
        from .expert_parallel import ExpertFSDP, TensorExpertDDP

        return ExpertFSDP if config.parallel.fsdp else TensorExpertDDP
    if layout.data > 1 and layout.tensor > 1 and not config.parallel.fsdp:
        from .data_parts import TensorDDP, TensorZeRO1

        return TensorZeRO1 if config.parallel.zero_stage == 1 else TensorDDP
    if moe and layout.data > 1 and config.parallel.expert > 1:
        from .expert_parallel import ExpertDDP, ExpertFSDP

        return ExpertFSDP if config.parallel.fsdp else ExpertDDP
    if layout.data > 1:
        return FSDP if config.parallel.fsdp else ZeRO1 if config.parallel.zero_stage == 1 else DDP
    return Parallelized


__all__ = ["parallelize", "Parallelized", "FSDP_CPU_TORCH"]
