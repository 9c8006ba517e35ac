"""Expert parallelism (`parallel.expert` = ep): the routed experts sharded over groups of ep data-parallel
ranks, each rank holding E/ep of every MoE layer's experts, tokens sent to the owning rank and back with
all-to-all (GShard's dispatch and combine, Lepikhin et al. 2020).

Groups (data ranks numbered 0..dp-1; tensor and pipeline are 1 with MoE):
  expert-parallel group        ranks g*ep .. g*ep + ep-1: together they hold all E experts, rank i of the
                               group experts i*E/ep .. (i+1)*E/ep - 1;
  expert-data-parallel group   the dp/ep ranks with the same experts (rank % ep equal): they average those
                               experts' gradients.
Everything but the routed experts is data-parallel over all dp ranks: DDP (which ignores the expert tensors),
or FSDP2 (ZeRO-2/3, torchtitan's recipe): the experts sharded over their expert-data-parallel group, the rest
over all dp ranks.

Dispatch, per MoE layer: the router runs on every rank over all E experts and sorts its (token, expert) pairs
by expert (model/moe.py), so the pairs for each owning rank are one contiguous slice; one all-to-all of the
per-expert counts tells every rank how many rows it receives, a second moves the rows, the owner runs its
experts on them (re-sorted by expert), and a third all-to-all sends the outputs back in the sender's order.
The all-to-all is differentiable (its backward is the reverse all-to-all), so an expert's gradient sums every
group rank's tokens' contributions.

Gradient scale: DDP and FSDP average each gradient over the dp ranks. An expert's gradient on its owner
already sums the ep ranks of its group; summed over the expert-data-parallel group it sums all dp ranks, so
it is divided by dp (not by that group's size): the same mean as one process over the global batch. The
global norm for clipping counts each expert shard once: the replicated parameters' squared norm plus the sum
over the expert-parallel group of the shards' squared norms.

Checkpoints stay canonical: `state_dict` gathers every expert tensor (weights and optimizer moments) to the
full [E, ...], over the expert-data-parallel group (FSDP's shards) and the expert-parallel group, and
`load_state_dict` keeps this rank's slice, so a checkpoint written at one ep loads at any other (and in one
process).
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import TYPE_CHECKING

import torch
import torch.distributed as dist
from torch import nn
from torch.distributed.tensor import DTensor, distribute_tensor

from ..model.moe import Experts, moe_layers
from .engines import DDP, FSDP, Parallelized, fsdp_options

if TYPE_CHECKING:
    from torch.distributed.device_mesh import DeviceMesh

    from ..config.schema import ResolvedConfig
    from ..model.transformer import Transformer
    from .runtime import Runtime


class _AllToAll(torch.autograd.Function):
    """all_to_all_single of rows with uneven splits; backward is the same exchange reversed."""

    @staticmethod
    def forward(ctx, x, out_splits, in_splits, group):
        ctx.splits, ctx.group = (out_splits, in_splits), group
        out = x.new_empty((sum(out_splits), *x.shape[1:]))
        dist.all_to_all_single(out, x.contiguous(), out_splits, in_splits, group=group)
        return out

    @staticmethod
    def backward(ctx, *grad_outputs):
        (grad,) = grad_outputs  # forward returns one tensor
        out_splits, in_splits = ctx.splits
        return _AllToAll.apply(grad, in_splits, out_splits, ctx.group), None, None, None


class ShardedExperts(Experts):
    """This rank's E/ep experts of one layer (the same parameter names as `Experts`), called with every
    expert's pairs of this rank: it dispatches them to their owners and returns their outputs in order."""

    def __init__(self, full: Experts, group, rank: int, size: int):
        nn.Module.__init__(self)
        n = full.up.shape[0] // size
        own = slice(rank * n, (rank + 1) * n)
        self.up = nn.Parameter(full.up.detach()[own].clone())
        self.down = nn.Parameter(full.down.detach()[own].clone())
        self.grouped, self.group, self.size = full.grouped, group, size

    def forward(self, x, counts):
        """x: (pairs, H) sorted by expert over all E, counts[e] of them expert e's -> (pairs, H)."""
        n = self.up.shape[0]
        received = torch.empty_like(counts).view(self.size, n)
        dist.all_to_all_single(received, counts.view(self.size, n), group=self.group)  # [source, own expert]
        # The all-to-all's split sizes are host integers: one copy for both, the layer's one wait on the device
        send, recv = torch.stack([counts.view(self.size, n).sum(1), received.sum(1)]).tolist()
        rows = _AllToAll.apply(x, recv, send, self.group)  # ordered by source, then expert
        expert = torch.arange(n, device=x.device).repeat(self.size)
        expert = expert.repeat_interleave(received.flatten(), output_size=sum(recv))  # its size known: no wait
        order = expert.argsort(stable=True)  # by expert, then source
        out = super().forward(rows[order], received.sum(0))
        return _AllToAll.apply(out[order.argsort()], send, recv, self.group)


def expert_mesh(device_type: str, world: int, ep: int) -> DeviceMesh:
    """The (dp/ep, ep) DeviceMesh of the data ranks: mesh["ep"] this rank's expert-parallel group (neighbouring
    ranks), mesh["edp"] its expert-data-parallel group (every ep-th rank)."""
    from torch.distributed.device_mesh import init_device_mesh

    return init_device_mesh(device_type, (world // ep, ep), mesh_dim_names=("edp", "ep"))


def expert_names(module: nn.Module) -> set[str]:
    return {n for n, p in module.named_parameters() if ".experts." in n}


def _full(t: torch.Tensor) -> torch.Tensor:
    return t.full_tensor() if isinstance(t, DTensor) else t


class ExpertParallel(Parallelized):
    """What DDP and FSDP share under expert parallelism: the sharded experts, the gradient norm, the canonical
    checkpoint (see the module docstring). Mixed in before the data-parallel engine (its base here names what
    it reads and extends: `module`, `rt`, state_dict, which the engine after it in the MRO provides)."""

    def _shard_experts(self, module: Transformer, config: ResolvedConfig, rt: Runtime) -> None:
        self.ep = config.parallel.expert
        self.expert_mesh = expert_mesh(rt.device.type, rt.world_size, self.ep)
        self.ep_group, self.edp_group = self.expert_mesh["ep"].get_group(), self.expert_mesh["edp"].get_group()
        ep_rank = self.expert_mesh["ep"].get_local_rank()
        for moe in moe_layers(module):
            moe.experts = ShardedExperts(moe.experts, self.ep_group, ep_rank, self.ep)
        self.experts = expert_names(module)
        # A model on the meta device (FSDP) is initialised after sharding: each expert tensor with its own
        # experts' rows of the full one, which come first in this order (model/transformer.py `_fill`).
        for name in self.experts:
            rows = module.get_parameter(name).shape[0]
            module.row_orders[name] = torch.arange(rows * self.ep).roll(-ep_rank * rows)

    @property
    def row_orders(self) -> dict:
        return {}  # the experts' are for initialisation only; tensor parallelism is refused with MoE

    def _expert_params(self, want: bool) -> list:
        return [p for n, p in self.module.named_parameters() if (n in self.experts) == want and p.grad is not None]

    def clip(self, max_norm: float) -> torch.Tensor:
        dense, experts = self._expert_params(False), self._expert_params(True)
        sq = _full(torch.nn.utils.get_total_norm([p.grad for p in experts])) ** 2
        dist.all_reduce(sq, group=self.ep_group)  # each shard once: the group holds every expert once
        norm = (_full(torch.nn.utils.get_total_norm([p.grad for p in dense])) ** 2 + sq).sqrt()
        if max_norm > 0:
            for grads in (dense, experts):  # FSDP: each list's DTensors on one mesh
                torch.nn.utils.clip_grads_with_norm_(grads, max_norm, norm)
        return norm

    def state_dict(self) -> dict:
        sd = super().state_dict()
        for part in sd.values():
            for key, value in part.items():
                if self._is_expert(key, value):
                    value = _full(value).contiguous()
                    shards = [torch.empty_like(value) for _ in range(self.ep)]
                    dist.all_gather(shards, value, group=self.ep_group)
                    part[key] = torch.cat(shards)
        return sd

    def load_state_dict(self, sd: dict) -> None:
        rank = dist.get_rank(self.ep_group)
        sharded = {n: p for n, p in self.module.named_parameters() if n in self.experts and isinstance(p, DTensor)}
        for part in sd.values():
            for key, value in part.items():
                if self._is_expert(key, value):
                    n = value.shape[0] // self.ep
                    own = value[rank * n : (rank + 1) * n].clone()
                    p = sharded.get(self._param_name(key))
                    part[key] = (
                        own if p is None else distribute_tensor(own, p.device_mesh, p.placements, src_data_rank=None)
                    )
        super().load_state_dict(sd)

    @staticmethod
    def _param_name(key: str) -> str:
        return key.removeprefix("state.").rsplit(".", 1)[0] if key.startswith("state.") else key

    def _is_expert(self, key: str, value) -> bool:
        """A model or optimizer-state tensor of a routed-expert parameter ("state.NAME.exp_avg", "NAME")."""
        return self._param_name(key) in self.experts and isinstance(value, torch.Tensor) and value.dim() > 0


class ExpertDDP(ExpertParallel, DDP):
    """DDP over all ranks for everything but the routed experts, which are sharded over expert-parallel
    groups; their gradients are summed over the expert-data-parallel group by hand."""

    def __init__(self, module: Transformer, config: ResolvedConfig, rt: Runtime, mesh: DeviceMesh | None = None):
        self._shard_experts(module, config, rt)
        from torch.nn.parallel import DistributedDataParallel

        DistributedDataParallel._set_params_and_buffers_to_ignore_for_model(module, sorted(self.experts))
        super().__init__(module, config, rt, mesh)

    @contextlib.contextmanager
    def no_sync(self, last: bool) -> Iterator[None]:
        with super().no_sync(last):
            yield
        if last:  # DDP averaged the rest; the experts: summed over their data-parallel group, over dp
            for p in self._expert_params(True):
                dist.all_reduce(p.grad, group=self.edp_group)
                p.grad /= self.rt.world_size


class ExpertFSDP(ExpertParallel, FSDP):
    """FSDP2 with expert parallelism (torchtitan's layout): each MoE layer's own experts sharded over the
    expert-data-parallel group (the ranks that hold the same experts), everything else over all dp ranks."""

    def __init__(self, module: Transformer, config: ResolvedConfig, rt: Runtime, mesh: DeviceMesh | None = None):
        from torch.distributed.fsdp import fully_shard

        self._shard_experts(module, config, rt)
        edp = self.expert_mesh["edp"]
        for moe in moe_layers(module):  # before the blocks: a block's shard then leaves its experts out
            experts = fully_shard(moe.experts, mesh=edp, **fsdp_options(config, rt.device))  # the same module
            experts.set_gradient_divide_factor(rt.world_size)  # the mean over dp, not over edp
            # gloo has no pre-multiplied sum: sum, then divide. Not at one rank, where torch 2.13 would divide
            # twice (its single-rank copy divides too).
            experts.set_force_sum_reduction_for_comms(edp.size() > 1)
        super().__init__(module, config, rt, mesh)
