"""Expert parallelism (`parallel.expert` = ep): the routed experts sharded over groups of ep ranks, tokens sent to
the owning rank and back with all-to-all (GShard's dispatch and combine). The design (the groups, dispatch, the
gradient scale, canonical checkpoints): docs/parallel.md, "Design notes"."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import TYPE_CHECKING

import torch
import torch.distributed as dist
from torch import nn
from torch.distributed.tensor import DTensor, distribute_tensor

from ..model.moe import Experts, PairsByExpert, moe_layers
from ..plan.model_states import is_moe_dense
from .data_parts import DataParts
from .engines import DDP, FSDP, Parallelized, expert_placement, fsdp_options
from .mesh import Layout

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

    def forward(self, x, pairs: PairsByExpert):
        """x: (pairs, H), the tokens of `pairs` (all E experts', sorted by expert) -> (pairs, H). Each owner's
        rows are one slice of x only because the pairs are sorted by expert: the type says so, and the rows
        must be as many as the counts (checked on the host integers the all-to-all needs anyway)."""
        assert isinstance(pairs, PairsByExpert), f"MoE.route's pairs by expert, not {type(pairs).__name__}"
        n, counts = self.up.shape[0], pairs.counts
        assert counts.shape == (self.size * n,), f"pairs by expert of {self.size * n} experts, not {counts.shape}"
        received = torch.empty_like(counts).view(self.size, n)
        dist.all_to_all_single(received, counts.view(self.size, n), group=self.group)  # [source, own expert]
        # The all-to-all's split sizes are host integers: one copy for both, the layer's one wait on the device
        send, recv = torch.stack([counts.view(self.size, n).sum(1), received.sum(1)]).tolist()
        assert sum(send) == x.shape[0], f"{x.shape[0]} rows for {sum(send)} routed pairs: not MoE.route's pairs"
        rows = _AllToAll.apply(x, recv, send, self.group)  # ordered by source, then expert
        expert = torch.arange(n, device=x.device).repeat(self.size)
        expert = expert.repeat_interleave(received.flatten(), output_size=sum(recv))  # its size known: no wait
        order = expert.argsort(stable=True)  # by expert, then source
        out = self.compute(rows[order], received.sum(0))
        return _AllToAll.apply(out[order.argsort()], send, recv, self.group)


def expert_mesh(device_type: str, world: int, ep: int) -> DeviceMesh:
    """The (ranks/ep, ep) DeviceMesh of the MoE layer's ranks (all of them: MoE trains without a pipeline):
    mesh["ep"] this rank's expert-parallel group (neighbouring ranks), mesh["edp"] its expert-data-parallel group
    (every ep-th rank)."""
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
        layout = Layout.of(config.parallel, rt.world_size)
        self.ep, self.tensor, self.replicas = config.parallel.expert, layout.tensor, layout.data
        self.expert_mesh = expert_mesh(rt.device.type, rt.world_size, self.ep)
        self.ep_group, self.edp_group = self.expert_mesh["ep"].get_group(), self.expert_mesh["edp"].get_group()
        ep_rank = self.expert_mesh["ep"].get_local_rank()
        for moe in moe_layers(module):
            if self.ep > 1:
                moe.experts = ShardedExperts(moe.experts, self.ep_group, ep_rank, self.ep)
            moe.token_parts = self.tensor  # each tensor rank routes its part of the sequence
        self.experts = expert_names(module)
        # The router and shared experts beside tensor parallelism: each tensor rank's gradient is its tokens'.
        self.moe_dense = {n for n, _ in module.named_parameters() if is_moe_dense(n)} if self.tensor > 1 else set()
        # A model on the meta device (FSDP, tensor parallelism) is initialised after sharding: each expert tensor
        # with its own experts' rows of the full one, which come first in this order (model/transformer.py `_fill`).
        for name in self.experts if self.ep > 1 else ():
            rows = module.get_parameter(name).shape[0]
            module.row_orders[name] = torch.arange(rows * self.ep).roll(-ep_rank * rows)

    @property
    def row_orders(self) -> dict:
        # tensor parallelism's fused rows; the experts' are for initialisation only
        return {k: v for k, v in getattr(self.module, "row_orders", {}).items() if k not in self.experts}

    def _params(self, names: set[str], inside: bool) -> list:
        return [p for n, p in self.module.named_parameters() if (n in names) == inside and p.grad is not None]

    def clip(self, max_norm: float) -> torch.Tensor:
        """The global norm: each kind of gradient (the experts' shards, and the rest by the mesh it lies on:
        FSDP's, tensor parallelism's, plain) squared and summed, the experts' over the expert-parallel group."""
        kinds: dict = {}
        for p in self._params(self.experts, False):
            kinds.setdefault(p.grad.device_mesh if isinstance(p.grad, DTensor) else None, []).append(p)
        squares = [_full(torch.nn.utils.get_total_norm([p.grad for p in ps])) ** 2 for ps in kinds.values()]
        experts = self._params(self.experts, True)
        sq = _full(torch.nn.utils.get_total_norm([p.grad for p in experts])) ** 2
        dist.all_reduce(sq, group=self.ep_group)  # each shard once: the group holds every expert once
        norm = (torch.stack([*squares, sq]).sum()).sqrt()
        if max_norm > 0:
            for params in [*kinds.values(), experts]:  # each list's DTensors on one mesh
                torch.nn.utils.clip_grads_with_norm_([p.grad for p in params], max_norm, norm)
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
            for p in self._params(self.experts, True):
                dist.all_reduce(p.grad, group=self.edp_group)
                p.grad /= self.replicas


class ExpertFSDP(ExpertParallel, FSDP):
    """FSDP2 with expert parallelism (torchtitan's layout): each MoE layer's own experts sharded over the
    expert-data-parallel group (the ranks that hold the same experts; on dim 1 past the experts they hold,
    engines.expert_placement), beside tensor parallelism its router and shared experts over all ranks,
    everything else over the data ranks."""

    def __init__(self, module: Transformer, config: ResolvedConfig, rt: Runtime, mesh: DeviceMesh | None = None):
        from torch.distributed.fsdp import fully_shard

        self._shard_experts(module, config, rt)
        edp, options = self.expert_mesh["edp"], fsdp_options(config, rt.device)
        ranks = self.expert_mesh._flatten("moe") if self.tensor > 1 else None  # every rank: the MoE layer's
        for moe in moe_layers(module):  # before the blocks: a block's shard then leaves its experts out
            placement = expert_placement(moe.experts.parameters(), edp.size())
            units = [(fully_shard(moe.experts, mesh=edp, shard_placement_fn=placement, **options), edp)]
            if ranks is not None:  # the router and shared experts (the experts are sharded already)
                units.append((fully_shard(moe, mesh=ranks, **options), ranks))
            for unit, over in units:  # each the same module, now an FSDP one
                unit.set_gradient_divide_factor(self.replicas)  # the mean over the replicas, not over the group
                # gloo has no pre-multiplied sum: sum, then divide. Not at one rank, where torch 2.13 would divide
                # twice (its single-rank copy divides too).
                unit.set_force_sum_reduction_for_comms(over.size() > 1)
        super().__init__(module, config, rt, mesh)


class TensorExpertDDP(ExpertParallel, DataParts, Parallelized):
    """Tensor parallelism with MoE under ZeRO-0: attention and the dense blocks averaged over mesh["dp"] by hand
    (data_parts.py), the MoE layers' router and shared experts summed over every rank and their experts over
    their expert-data-parallel group, each then divided by the data-parallel degree."""

    def __init__(self, module: Transformer, config: ResolvedConfig, rt: Runtime, mesh: DeviceMesh | None = None):
        self._shard_experts(module, config, rt)
        super().__init__(module, config, rt, mesh)
        assert mesh is not None  # parallelize built it: tensor > 1
        dp = mesh["dp"]
        self.dp_group, self.data_parallel, self.data_rank = dp.get_group(), dp.size(), dp.get_local_rank()

    def build_optimizer(self, config: ResolvedConfig) -> torch.optim.Optimizer:
        self._same_start(self._params_named(self.experts, False))
        return super().build_optimizer(config)

    def _params_named(self, names: set[str], inside: bool) -> list:
        return [p for n, p in self.module.named_parameters() if (n in names) == inside]

    @contextlib.contextmanager
    def no_sync(self, last: bool) -> Iterator[None]:
        yield
        if last:
            self._settle_gradients()
            self._average_gradients(self._params(self.experts | self.moe_dense, False))
            self._average([p.grad for p in self._params(self.moe_dense, True)], dist.group.WORLD)
            self._average([p.grad for p in self._params(self.experts, True)], self.edp_group)
