"""Data parallelism over the parts of tensor-parallel parameters, by hand: DDP and ZeroRedundancyOptimizer take
no DTensor parameters (and ZeroRedundancyOptimizer broadcasts whole parameters, which a DTensor cannot), so
each rank acts on its own local part over the mesh's "dp" group, which holds the same part of every replica.

  ZeRO-0  every replica starts from its "dp" rank 0's values (as DDP makes sure); after the step's last
          backward the gradients are averaged with one all-reduce per bucket (what DDP does on the last
          micro-batch of an accumulation); every rank steps every parameter.
  ZeRO-1  (Rajbhandari et al. 2020, "ZeRO", section 5.1, P_os) each replica keeps the optimizer states of, and
          updates, only the parameters it owns, then each owner broadcasts its parts to the other replicas.
          The partition is the planner's (plan.model_states.zero1_partition, the one ZeroRedundancyOptimizer
          makes), over this rank's parts. A checkpoint holds each state once, saved by its owner, under the
          parameter's name (the flattened layout of every engine).

Used by each pipeline stage (pipeline.py: Pipelined) and by tensor parallelism beside ZeRO 0/1 without a
pipeline (TensorDDP, TensorZeRO1 below; FSDP2 is the engine for ZeRO 2/3, engines.py).
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import TYPE_CHECKING, Any

import torch
import torch.distributed as dist
from torch.distributed.tensor import DTensor

from .engines import Parallelized

if TYPE_CHECKING:
    from torch.distributed.device_mesh import DeviceMesh

    from ..config.schema import ResolvedConfig
    from .runtime import Runtime

# Gradient elements per data-parallel all-reduce (64 MB in fp32): messages this large run at a link's full
# bandwidth (DDP's own buckets are 25 MB), and the copy each needs stays a small part of a rank's gradients.
BUCKET_ELEMENTS = 1 << 24


def local(t: torch.Tensor) -> torch.Tensor:
    """This rank's part of a tensor-parallel DTensor (a plain tensor is its own)."""
    return t.to_local() if isinstance(t, DTensor) else t


class DataParts:
    """Data parallelism over local parts, for an engine with `module`, `rt`, `dp_group`, `data_parallel` and
    `data_rank`."""

    # What the engine it is mixed into holds (Parallelized: module, rt; the engine's __init__: the rest).
    module: Any
    rt: Runtime
    dp_group: dist.ProcessGroup
    data_parallel: int
    data_rank: int

    def _same_start(self, params: list | None = None) -> None:
        """Every replica starts from its rank 0's values, as DDP makes sure (called once the module holds its
        values, before the optimizer is built); `params`: those of them only (default all)."""
        if self.data_parallel > 1:
            for p in self.module.parameters() if params is None else params:
                dist.broadcast(local(p.data), group=self.dp_group, group_src=0)

    def _settle_gradients(self) -> None:
        """Each tensor-parallel gradient laid out as its parameter (a replicated norm weight's gradient under
        sequence parallelism comes back as partial sums over the sequence parts): then every rank's local
        gradient is its own part of the whole, which the data-parallel mean and the clipping act on."""
        for p in self.module.parameters():
            if isinstance(p.grad, DTensor) and p.grad.placements != p.placements:
                p.grad = p.grad.redistribute(placements=p.placements)

    def _average_gradients(self, params: list | None = None) -> None:
        """The mean of the gradients (of `params`, default all) over the data-parallel replicas: an all-reduce
        per bucket of about BUCKET_ELEMENTS (a few large messages, as DDP sends; one flat copy of all of a large
        model's gradients would be a second copy of them)."""
        if self.data_parallel == 1:
            return
        bucket, size = [], 0
        for g in [
            local(p.grad) for p in (self.module.parameters() if params is None else params) if p.grad is not None
        ]:
            bucket.append(g)
            size += g.numel()
            if size >= BUCKET_ELEMENTS:
                self._average(bucket)
                bucket, size = [], 0
        if bucket:
            self._average(bucket)

    def _average(self, grads: list[torch.Tensor], group: Any = None) -> None:
        """Sum `grads` over `group` (default the data-parallel one), divided by the data-parallel degree."""
        if not grads:
            return
        flat = torch.cat([g.reshape(-1) for g in grads])
        dist.all_reduce(flat, group=self.dp_group if group is None else group)
        flat /= self.data_parallel
        for g, part in zip(grads, flat.split([g.numel() for g in grads])):
            g.copy_(part.view_as(g))

    def _zero1_optimizer(self, config: ResolvedConfig) -> torch.optim.Optimizer:
        """ZeRO-1: the optimizer of the parameters this replica owns, broadcasting them after each step."""
        from ..plan.model_states import zero1_partition
        from ..plan.optimizer_groups import optimizer_groups
        from ..plan.params import param_shapes
        from .optim import optimizer_class, param_groups

        self._same_start()

        named = dict(self.module.named_parameters())
        names = [n for n, _ in param_shapes(config.model) if n in named]  # param_groups' order
        shapes = [(n, tuple(local(named[n]).shape)) for n in names]
        t = config.train
        owned = zero1_partition(shapes, self.data_parallel, optimizer_groups(t.optimizer, config.model, shapes))
        self.owner = {names[i]: rank for rank, indices in enumerate(owned) for i in indices}
        name_of = {id(p): n for n, p in named.items()}
        groups = [
            {**g, "params": [p for p in g["params"] if self.owner[name_of[id(p)]] == self.data_rank]}
            for g in param_groups(self.module, config.model, t.weight_decay, t.optimizer)
        ]
        cls, kwargs = optimizer_class(config.train, self.rt.device)
        optimizer = cls([g for g in groups if g["params"]], **kwargs)
        optimizer.register_step_post_hook(lambda *_: self._broadcast_owned())
        return optimizer

    def _broadcast_owned(self) -> None:
        """Every replica gets each parameter's new values from the replica that owns it."""
        for name, p in self.module.named_parameters():
            dist.broadcast(local(p.data), group=self.dp_group, group_src=self.owner[name])


class TensorDDP(DataParts, Parallelized):
    """Tensor parallelism over mesh["tp"] with ZeRO-0 over mesh["dp"] (Megatron-LM's standard layout)."""

    def __init__(self, module: torch.nn.Module, config: ResolvedConfig, rt: Runtime, mesh: DeviceMesh | None = None):
        super().__init__(module, config, rt, mesh)
        assert mesh is not None  # parallelize built it: tensor > 1, so more than one process
        dp = mesh["dp"]
        self.dp_group, self.data_parallel, self.data_rank = dp.get_group(), dp.size(), dp.get_local_rank()

    def build_optimizer(self, config: ResolvedConfig) -> torch.optim.Optimizer:
        self._same_start()
        return super().build_optimizer(config)

    @contextlib.contextmanager
    def no_sync(self, last: bool) -> Iterator[None]:
        """Gradient accumulation: the replicas average once, after the step's last backward."""
        yield
        if last:
            self._settle_gradients()
            self._average_gradients()


class TensorZeRO1(TensorDDP):
    """Tensor parallelism with ZeRO-1 over the data ranks: each replica updates the parameter parts it owns."""

    def build_optimizer(self, config: ResolvedConfig) -> torch.optim.Optimizer:
        return self._zero1_optimizer(config)
