"""Pipeline parallelism: the model split by layers into `parallel.pipeline` stages, one per rank of the mesh's
"pp" dimension, run by torch.distributed.pipelining's 1F1B schedule (Narayanan et al. 2021, "Efficient
Large-Scale Language Model Training on GPU Clusters", section 2.2.1; PyTorch's pipelining docs).

A step's micro-batches (train.grad_accum_steps, or the batch ramp's count) are the pipeline's: stage 0
embeds them and runs its blocks, sends each micro-batch's activations on and receives its gradient back;
the last stage runs the final norm and the output layer with the loss (the whole-model `model.loss`, given
the output weight). 1F1B alternates one forward and one backward once the pipeline is full, so stage k holds
at most p - k micro-batches' activations; the bubble is (p - 1) / (m + p - 1) of the step.

Each stage is a `StageModule` whose parameters keep their whole-model names: the optimizer, DCP checkpoints
(each stage saves its own tensors; together they are the whole model, which loads at any other layout) and
`pretrain export` see the model's own keys. Data parallelism runs per stage over the mesh's "dp" dimension:
the replicas of a stage average their gradients with one all-reduce after the step's last backward (what DDP
does on the last micro-batch of an accumulation; DDP itself under this runtime fails on torch 2.13's second
step, rebuilding its buckets from both micro-batches' gradients), then ZeRO-0 steps every parameter and ZeRO-1
each rank its share, which it then broadcasts.

With tensor parallelism (a 3-D mesh) the whole model is split over mesh["tp"] first (tensor_parallel.py) and
each stage takes its parts: a tensor rank of stage k sends its activations to the same tensor rank of stage
k + 1, plain tensors either way (whole on every tensor rank, or under sequence parallelism each rank's part
of the sequence, which is all the next stage's first norm needs). Gradients, their norm, the data-parallel
mean and ZeRO-1's broadcasts act on each rank's local part of its DTensor parameters.
"""

from __future__ import annotations

import functools
from typing import TYPE_CHECKING

import torch
import torch.distributed as dist
from torch import nn
from torch.distributed.tensor import DTensor

from ..plan.stages import chunk_indices, chunks_per_stage, stage_layers
from .data_parts import DataParts
from .data_parts import local as _local
from .engines import Parallelized

if TYPE_CHECKING:
    from torch.distributed.device_mesh import DeviceMesh
    from torch.distributed.pipelining.schedules import PipelineScheduleMulti, PipelineScheduleSingle
    from torch.distributed.pipelining.stage import _PipelineStageBase

    from ..config.schema import ResolvedConfig
    from ..model.transformer import Transformer
    from .runtime import Runtime


class StageModule(nn.Module):
    """The part of `model` that pipeline stage `index` of `stages` runs, under the whole model's names.

    Under interleaved 1F1B (`chunks` > 1) the stage holds its chunks' layers and `chunks` lists one
    StageModule per chunk (over the same blocks, not registered twice), which the schedule runs; a stage of
    one chunk is its own."""

    def __init__(self, model: Transformer, index: int, stages: int, chunks: int = 1):
        super().__init__()
        ids = chunk_indices(index, stages, chunks)
        self.first, self.last = 0 in ids, stages * chunks - 1 in ids
        split = stage_layers(len(model.blocks), stages * chunks)
        layers = [i for c in ids for i in split[c]]
        self.embed = model.embed if self.first else None
        self.pos_embed = model.pos_embed if self.first else None
        # A dict keyed by the block's index in the whole model: "blocks.5.attn.qkv.weight" on every layout.
        self.blocks = nn.ModuleDict({str(i): model.blocks[i] for i in layers})
        self.norm = model.norm if self.last else None
        self.lm_head = model.lm_head if self.last else None
        self.whole = [model]  # the embedding's and rotary tables' code; a list, so not a registered submodule
        # Tensor parallelism's row order of this stage's fused parameters (checkpoints save them canonical).
        own = {name for name, _ in self.named_parameters()}
        self.row_orders = {name: order for name, order in model.row_orders.items() if name in own}
        self.chunks = [self] if chunks == 1 else [StageModule(model, c, stages * chunks) for c in ids]

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """Stage 0: token ids -> hidden states; later stages: hidden states -> hidden states (the last one's
        after the final norm: the loss takes them with the output weight)."""
        model = self.whole[0]
        if self.first:
            x = model.embed_tokens(x)
        rope = model.rotary(x.shape[1], x.device)
        for block in self.blocks.values():
            x = block(x, rope)
        x = self.norm(x) if self.norm is not None else x  # the last stage's
        # Under tensor parallelism the residual stream is a plain tensor (whole on every tensor rank, or this
        # rank's part of the sequence under sequence parallelism), but the final norm's sequence-parallel
        # output is a DTensor: the schedule wants plain tensors. The loss's input hook reads it as the
        # sequence part it is (tensor_parallel.py).
        return x.to_local() if isinstance(x, DTensor) else x


class Pipelined(DataParts, Parallelized):
    """This rank's pipeline stage, data parallel over its "dp" group, and the schedules that run it.

    `module` is the StageModule (what the optimizer updates and a checkpoint saves); `forward(x, y)` is the
    validation loss of one batch through the whole pipeline, the same on every rank of it."""

    measurable = False  # activations are held per micro-batch by the schedule, not by one forward

    def __init__(self, model: Transformer, config: ResolvedConfig, rt: Runtime, mesh: DeviceMesh):
        self.index, self.stages = mesh["pp"].get_local_rank(), mesh["pp"].size()
        self.pp_group, self.dp_group = mesh["pp"].get_group(), mesh["dp"].get_group()
        self.data_parallel, self.data_rank = mesh["dp"].size(), mesh["dp"].get_local_rank()
        # Ranks holding the same stage's loss and gradient norm: its data-parallel replicas and, under tensor
        # parallelism, each replica's tensor ranks (which compute the same loss and norm together).
        self.replicas = self.data_parallel * mesh["tp"].size()
        self.chunks = chunks_per_stage(config.parallel)
        stage = StageModule(model, self.index, self.stages, self.chunks)
        super().__init__(stage, config, rt)
        self.model = model
        # Only this stage's tensors are made (parallelize materialises the module, the stage, from the meta
        # device); the rest of the model stays there, or goes there when a model.init_from checkpoint was read.
        mine = set(stage.modules())
        for part in [*model.blocks, model.embed, model.pos_embed, model.norm, model.lm_head]:
            if part is not None and part not in mine:
                part.to("meta")
        self.forward = self.validation_loss
        self.schedules: dict[tuple[int, bool, int], PipelineScheduleSingle | PipelineScheduleMulti] = {}

    def build_optimizer(self, config: ResolvedConfig) -> torch.optim.Optimizer:
        self._same_start()
        return super().build_optimizer(config)

    def set_training(self, on: bool) -> None:
        self.module.train(on)
        self.model.train(on)  # the embedding's dropout is the whole model's

    def _schedule(
        self, micro_batches: int, training: bool, rows: int
    ) -> PipelineScheduleSingle | PipelineScheduleMulti:
        """The schedule of `micro_batches` per step of `rows` sequences in all, made once per shape (a stage
        sizes its buffers on first use; the batch ramp and a short last validation batch change it): 1F1B;
        GPipe (every forward, then every backward) for evaluation, which has no backward, and for fewer
        micro-batches than stages (a batch ramp's first steps), where 1F1B's warm-up is all of them anyway.
        With chunks, their multi-stage forms: interleaved 1F1B, and looped BFS (GPipe's order per chunk)
        where interleaved 1F1B does not take the count (torch's takes m with m % max(1, m // p) == 0)."""
        key = (micro_batches, training, rows)
        if key not in self.schedules:
            from torch.distributed.pipelining import (
                PipelineStage,
                Schedule1F1B,
                ScheduleGPipe,
                ScheduleInterleaved1F1B,
                ScheduleLoopedBFS,
            )

            total = self.stages * self.chunks
            stages: list[_PipelineStageBase] = [  # the schedules' declared type of a stage
                PipelineStage(chunk, c, total, self.rt.device, group=self.pp_group)
                for chunk, c in zip(self.module.chunks, chunk_indices(self.index, self.stages, self.chunks))
            ]
            model = self.model

            def loss_fn(h, targets):
                # Each micro-batch's mean loss / m: the step's gradient is that of the mean over the step's
                # micro-batches, as in train_step (scale_grads=False: nothing divides again).
                return model.loss(h, model.lm_head.weight, targets) / micro_batches

            if self.chunks > 1:  # the multi-stage schedules take the list of this rank's stages
                one_f_one_b = functools.partial(ScheduleInterleaved1F1B, stages)
                gpipe = functools.partial(ScheduleLoopedBFS, stages)
            else:
                one_f_one_b, gpipe = (
                    functools.partial(Schedule1F1B, stages[0]),
                    functools.partial(ScheduleGPipe, stages[0]),
                )
            if not training:  # forward only: the last stage's output comes back, and the loss is taken here
                self.schedules[key] = gpipe(micro_batches)
            else:
                takes = micro_batches >= self.stages and (
                    self.chunks == 1 or micro_batches % max(1, micro_batches // self.stages) == 0
                )
                kind = one_f_one_b if takes else gpipe
                self.schedules[key] = kind(micro_batches, loss_fn=loss_fn, scale_grads=False)
        return self.schedules[key]

    def run_step(self, tokens: torch.Tensor, targets: torch.Tensor, micro_batches: int) -> torch.Tensor:
        """Forward and backward of `micro_batches` micro-batches (stacked along the batch dimension, split
        back by the schedule); returns the sum of their losses / micro_batches on the last stage, 0 on the
        others (the step's all-reduce makes it every rank's)."""
        schedule = self._schedule(micro_batches, training=True, rows=tokens.shape[0])
        losses: list[torch.Tensor] = []
        with self.autocast_context():
            schedule.step(
                *((tokens,) if self.index == 0 else ()),
                target=targets if self.is_last else None,
                losses=losses,
                return_outputs=False,
            )
        self._settle_gradients()
        self._average_gradients()
        if not losses:
            return torch.zeros((), device=self.rt.device)
        return torch.stack([x.detach().float() for x in losses]).sum()

    @property
    def is_last(self) -> bool:
        return self.index == self.stages - 1

    def grad_norm_squared(self) -> torch.Tensor:
        """Sum of this stage's squared gradient elements (fp32): the stages' sums add up to the model's. Over
        DTensor gradients the norm is the whole stage's, the same on each of its tensor ranks."""
        grads = [p.grad for p in self.module.parameters() if p.grad is not None]
        if not grads:
            return torch.zeros((), device=self.rt.device)
        norm = torch.nn.utils.get_total_norm(grads)
        return (norm.full_tensor() if isinstance(norm, DTensor) else norm).float() ** 2

    def clip_to(self, total_norm: float, max_norm: float) -> None:
        """Scale this stage's gradients by max_norm / total_norm when the model's norm exceeds max_norm
        (torch's clip_grad_norm_ rule, with the norm of all stages), each rank its local part."""
        grads = [_local(p.grad) for p in self.module.parameters() if p.grad is not None]
        if max_norm > 0 and grads:
            coef = max_norm / (torch.tensor(total_norm, device=self.rt.device) + 1e-6)  # clip_grads_with_norm_'s
            # what clip_grads_with_norm_ calls, on each rank's local parts; torch names it in no __all__
            torch._foreach_mul_(grads, coef.clamp(max=1.0))  # pyright: ignore[reportPrivateImportUsage]

    @torch.no_grad()
    def last_hidden(self, tokens: torch.Tensor) -> torch.Tensor | None:
        """The final norm's output for one batch, run forward through every stage (every rank of the pipeline
        calls it with a batch of the same shape; the first stage's tokens are the ones read): on the last stage,
        None on the others."""
        schedule = self._schedule(1, training=False, rows=tokens.shape[0])
        h = schedule.step(*((tokens,) if self.index == 0 else ()))
        return h if self.is_last else None

    @torch.no_grad()
    def validation_loss(self, tokens: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        """The mean loss of one batch, run forward through every stage; every rank of the pipeline returns it."""
        with self.autocast_context():
            h = self.last_hidden(tokens)
            model = self.model
            loss = (
                model.loss(h, model.lm_head.weight, targets).float()
                if self.is_last
                else torch.zeros((), device=self.rt.device)
            )
        dist.broadcast(loss, group=self.pp_group, group_src=self.stages - 1)
        return loss


class PipelinedZeRO1(Pipelined):
    """ZeRO-1 per stage (data_parts.py): each data-parallel replica of a stage keeps the optimizer states of,
    and updates, only the parameters it owns, then broadcasts its parts of them over its "dp" group."""

    def build_optimizer(self, config: ResolvedConfig) -> torch.optim.Optimizer:
        return self._zero1_optimizer(config)


def pipelined(model: Transformer, config: ResolvedConfig, rt: Runtime, mesh: DeviceMesh | None) -> Pipelined:
    """The engine for `mesh` (config/trainable.py: check_pipelinable has passed)."""
    assert mesh is not None  # parallelize built it: pipeline > 1, so more than one process
    engine = PipelinedZeRO1 if config.parallel.zero_stage == 1 and mesh["dp"].size() > 1 else Pipelined
    return engine(model, config, rt, mesh)
