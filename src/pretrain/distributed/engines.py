"""The data-parallel engines that parallelize.py chooses from: one process's view of the model being trained.

Data parallelism with PyTorch's own engines, chosen by `parallel.zero_stage` (the planner's key):
  0  DistributedDataParallel: every rank holds everything; gradients all-reduced in buckets, which are the
     gradients themselves (`gradient_as_bucket_view`: no second copy of every gradient).
  1  DDP + ZeroRedundancyOptimizer: optimizer states sharded over ranks (parameters and gradients whole).
  2  FSDP2 (`fully_shard` per block) without resharding after forward: parameters, gradients and optimizer
     states sharded; gathered parameters stay until backward.
  3  FSDP2 resharding after forward (ZeRO-3): only the blocks in flight are gathered.
Under FSDP, mixed precision is FSDP's policy (bf16 compute, fp32 master weights and gradient reduction), not
autocast. One process gets the same interface with no communication.

With tensor parallelism the data-parallel engine is FSDP2 over mesh["dp"] for ZeRO 2/3 (2-D: each parameter
is a DTensor sharded over "dp" and split or replicated over "tp"); for ZeRO 0/1 it is data_parts.py's, by hand
over each rank's parts (DDP and ZeroRedundancyOptimizer take no DTensor parameters); none when all ranks are
tensor ranks (data = 1).
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, cast

import torch
from torch.distributed.tensor import DTensor

from .. import precision
from ..errors import ConfigError
from ..gpus import caches_weight_casts, mixed_precision
from ..plan.kernels import torch_version_tuple
from ..plan.model_states import expert_shard_dim, is_expert
from .optim import build_optimizer
from .runtime import Runtime
from .tensor_parallel import from_canonical, to_canonical

if TYPE_CHECKING:
    from torch.distributed.device_mesh import DeviceMesh

    from ..config.schema import ResolvedConfig
    from ..model.transformer import Transformer

FSDP_CPU_TORCH = (2, 9)  # gloo: FSDP2 fails on CPU streams in torch 2.6 and sums instead of averaging in 2.7


class Parallelized:
    """One process's view of the model being trained.

    `module` is our Transformer (its parameters, possibly sharded, are what the optimizer updates); `forward`
    is what a training micro-batch calls (DDP's wrapper, or the module itself)."""

    autocast: bool = True  # False under FSDP: its mixed-precision policy casts instead
    measurable: bool = True  # saved-tensor hooks see plain tensors (not FSDP's gathered parameters)
    fp8: dict | None = None  # train.precision=fp8: {"recipe", "linears", "skipped"} (fp8.py), for plan_vs_run.json
    module: Any  # the Transformer (model/), or a pipeline stage's part of it; Any: each engine wraps its own
    forward: Callable[..., torch.Tensor]  # (inputs, targets) -> the micro-batch's loss
    rt: Runtime
    optimizer: Any  # built by parallelize() once the weights are on the device (None until then)
    cache_casts: bool
    autocast_context: Callable[[], contextlib.AbstractContextManager]

    def __init__(self, module: torch.nn.Module, config: ResolvedConfig, rt: Runtime, mesh: DeviceMesh | None = None):
        self.module, self.forward, self.rt = module, module, rt
        self.optimizer = None
        # train.cache_weight_casts: one autocast context over a step's micro-batches (`step_context`) keeps the
        # casts of the weights, the nested per-micro-batch ones use them
        self.cache_casts = self.autocast and caches_weight_casts(config.train, config.parallel)
        self.autocast_context = (
            precision.autocast(config.train.precision, rt.device, self.cache_casts)
            if self.autocast
            else contextlib.nullcontext
        )

    def step_context(self) -> contextlib.AbstractContextManager:
        """The context around all micro-batches of a step: with the weight-cast cache, the autocast context that
        holds it until the last backward is done; nothing otherwise."""
        return self.autocast_context() if self.cache_casts else contextlib.nullcontext()

    def no_sync(self, last: bool) -> contextlib.AbstractContextManager:
        """The context of one micro-batch's forward and backward: gradients are communicated now, or deferred
        to the step's last micro-batch."""
        return contextlib.nullcontext()

    def after_optimizer_step(self) -> None:
        """What the engine does once the weights have changed (FSDP2 with float8 all-gather: their scales)."""

    def build_optimizer(self, config: ResolvedConfig) -> torch.optim.Optimizer:
        return build_optimizer(self.module, config.model, config.train)

    def set_training(self, on: bool) -> None:
        """Training mode (dropout on) or evaluation mode."""
        self.module.train(on)

    def clip(self, max_norm: float) -> torch.Tensor:
        """Global L2 norm of the gradients before clipping, as a 0-d tensor on the device (no host sync);
        clipping only when max_norm > 0."""
        params = [p for p in self.module.parameters() if p.grad is not None]
        norm = torch.nn.utils.clip_grad_norm_(params, max_norm if max_norm > 0 else float("inf"))
        return norm.full_tensor() if isinstance(norm, DTensor) else norm

    def state_dict(self) -> dict:
        """Model and optimizer state keyed by parameter names (sharded tensors stay sharded), for DCP. The
        optimizer's is flattened ("state.NAME.exp_avg", "param_groups.NAME.lr"): every key names one
        parameter, so pipeline stages, which hold different parameters in their groups, save disjoint keys and
        a checkpoint loads whatever groups the loading layout has."""
        from torch.distributed.checkpoint.state_dict import get_state_dict

        fresh = not self.optimizer.state
        model_sd, nested = get_state_dict(self.module, self.optimizer, options=_flat_options())
        # flattened ({"state.NAME.step": value}), not the nested form get_state_dict's return type declares
        optim_sd = cast(dict[str, Any], nested)
        if fresh:  # get_state_dict made the states with a zero-gradient step: make them as a new optimizer's
            _zero_step_counters(self.optimizer.state.values())
            for key, value in optim_sd.items():
                if key.startswith("state.") and key.endswith(".step"):
                    optim_sd[key] = value.zero_() if isinstance(value, torch.Tensor) else 0
        # Fused projections in their single-process row order (tensor parallelism holds them in rank order):
        # a checkpoint is the same in every layout.
        return to_canonical({"model": model_sd, "optimizer": optim_sd}, self.row_orders)

    @property
    def row_orders(self) -> dict:
        """Tensor parallelism's row order of each fused parameter of `module` (the whole model's, or a
        pipeline stage's own; none without tensor parallelism)."""
        return getattr(self.module, "row_orders", {})

    def load_state_dict(self, sd: dict) -> None:
        from torch.distributed.checkpoint.state_dict import set_state_dict

        sd = from_canonical(sd, self.row_orders)
        set_state_dict(
            self.module,
            self.optimizer,
            model_state_dict=sd["model"],
            optim_state_dict=sd["optimizer"],
            options=_flat_options(),
        )


class DDP(Parallelized):
    def __init__(self, module: torch.nn.Module, config: ResolvedConfig, rt: Runtime, mesh: DeviceMesh | None = None):
        super().__init__(module, config, rt, mesh)
        from torch.nn.parallel import DistributedDataParallel

        ids = [rt.device.index] if rt.device.type == "cuda" else None
        self.ddp = DistributedDataParallel(module, device_ids=ids, gradient_as_bucket_view=True)
        self.forward = self.ddp

    def set_training(self, on: bool) -> None:
        self.ddp.train(on)

    def no_sync(self, last: bool) -> contextlib.AbstractContextManager:
        # Gradient accumulation: all-reduce once, on the last micro-batch (the gradients are whole anyway).
        return contextlib.nullcontext() if last else self.ddp.no_sync()


class ZeRO1(DDP):
    """DDP + ZeroRedundancyOptimizer. Its checkpoint holds, per rank, the states of the parameters that
    rank owns, under the parameters' names: the same layout `get_state_dict` gives for every other mode, so
    a checkpoint loads on any number of ranks and in any mode."""

    def build_optimizer(self, config: ResolvedConfig) -> torch.optim.Optimizer:
        from torch.distributed.optim import ZeroRedundancyOptimizer

        from .optim import optimizer_class, param_groups

        groups = param_groups(self.module, config.model, config.train.weight_decay, config.train.optimizer)
        cls, kwargs = optimizer_class(config.train, self.rt.device)
        first = {k: v for k, v in groups[0].items() if k != "params"}  # its weight decay (muon: its kind too)
        optimizer = ZeroRedundancyOptimizer(groups[0]["params"], optimizer_class=cls, **kwargs, **first)
        for group in groups[1:]:
            optimizer.add_param_group(group)
        return optimizer

    def state_dict(self) -> dict:
        from torch.distributed.checkpoint.state_dict import get_model_state_dict

        local = self.optimizer.optim
        if not local.state:
            _materialize(self.optimizer)
        names = {p: n for n, p in self.module.named_parameters()}
        optim = {
            f"state.{names[p]}.{k}": v
            for g in local.param_groups
            for p in g["params"]
            for k, v in local.state[p].items()
        }
        optim.update(
            {
                f"param_groups.{names[p]}.{k}": v
                for g in self.optimizer.param_groups
                for p in g["params"]
                for k, v in g.items()
                if k != "params"
            }
        )  # the flattened layout, as get_state_dict's
        return {"model": get_model_state_dict(self.module), "optimizer": optim}

    def load_state_dict(self, sd: dict) -> None:
        from torch.distributed.checkpoint.state_dict import set_model_state_dict

        set_model_state_dict(self.module, sd["model"])  # the optimizer's state tensors were filled in place
        names = {p: n for n, p in self.module.named_parameters()}
        for group in self.optimizer.param_groups:
            first = names[group["params"][0]]
            group.update({k: sd["optimizer"][f"param_groups.{first}.{k}"] for k in group if k != "params"})


class FSDP(Parallelized):
    autocast = False
    measurable = False

    def __init__(self, module: Transformer, config: ResolvedConfig, rt: Runtime, mesh: DeviceMesh | None = None):
        super().__init__(module, config, rt, mesh)
        from torch.distributed.fsdp import fully_shard

        assert mesh is not None  # parallelize built it: data > 1, so more than one process

        options = fsdp_options(config, rt.device)
        experts = [p for n, p in module.named_parameters() if is_expert(n)]  # none left under expert parallelism
        placement = expert_placement(experts, mesh["dp"].size())
        for block in module.blocks:
            fully_shard(block, mesh=mesh["dp"], shard_placement_fn=placement, **options)
        fully_shard(module, mesh=mesh["dp"], **options)
        # micro_batch: reduce-scatter after every micro-batch, so only sharded gradients are ever held; step:
        # defer to the last micro-batch, holding every block's unsharded fp32 gradient in between.
        self.defer = config.parallel.grad_sync == "step"

    def no_sync(self, last: bool) -> contextlib.AbstractContextManager:
        self.module.set_requires_gradient_sync(last or not self.defer)
        return contextlib.nullcontext()

    def after_optimizer_step(self) -> None:
        if self.fp8 and self.fp8.get("fsdp_float8_all_gather"):
            from .fp8 import precompute_scales

            precompute_scales(self.module)


def expert_placement(experts, ranks: int) -> Callable[[torch.nn.Parameter], Any]:
    """fully_shard's shard_placement_fn for a module holding the stacked expert tensors `experts` [E/ep, ...]
    sharded over `ranks`: dim 0 while the ranks are at most the experts, dim 1 past them (plan/model_states.py's
    expert_shard_dim, the planner's rule: torchtitan's); None (dim 0) for every other parameter."""
    from torch.distributed.tensor import Shard

    ids = {id(p) for p in experts}

    def placement(p: torch.nn.Parameter) -> Any:
        return Shard(expert_shard_dim(p.shape[0], ranks)) if id(p) in ids else None

    return placement


def fsdp_options(config: ResolvedConfig, device: torch.device) -> dict:
    """fully_shard's keyword arguments for this run: resharding after forward (ZeRO-3) and the
    mixed-precision policy."""
    version = torch_version_tuple(torch.__version__)
    assert version is not None  # torch's own version string starts with major.minor
    if device.type == "cpu" and version < FSDP_CPU_TORCH:
        raise ConfigError(
            f"parallel.zero_stage: FSDP (stages 2 and 3) on CPUs needs torch >= 2.9, this is "
            f"{torch.__version__}; use parallel.zero_stage=1 or a newer torch"
        )
    from torch.distributed.fsdp import MixedPrecisionPolicy

    mp = MixedPrecisionPolicy()
    if mixed_precision(config.train.precision):
        mp = MixedPrecisionPolicy(param_dtype=precision.half_dtype(config.train.precision), reduce_dtype=torch.float32)
    return {"reshard_after_forward": config.parallel.zero_stage == 3, "mp_policy": mp}


def _flat_options():
    from torch.distributed.checkpoint.state_dict import StateDictOptions

    return StateDictOptions(flatten_optimizer_state_dict=True)


def _materialize(optimizer) -> None:
    """Create ZeroRedundancyOptimizer's states (as the first step would) without changing a weight: a step on
    zero gradients with a learning rate of 0. Loading a checkpoint needs tensors to load into."""
    params = [p for g in optimizer.param_groups for p in g["params"]]
    lrs = [g["lr"] for g in optimizer.param_groups]
    for p in params:
        if p.grad is None:
            p.grad = torch.zeros_like(p)
    for g in optimizer.param_groups:
        g["lr"] = 0.0
    optimizer.step()
    for g, lr in zip(optimizer.param_groups, lrs):
        g["lr"] = lr
    optimizer.zero_grad(set_to_none=True)
    _zero_step_counters(optimizer.optim.state.values())


def _zero_step_counters(states) -> None:
    """A zero-gradient step leaves zero moments but counts a step, which would shift Adam's and Adafactor's
    bias correction for the whole run; back to 0 the states equal those a first real step creates."""
    for state in states:
        step = state.get("step") if isinstance(state, dict) else None
        if isinstance(step, torch.Tensor):
            step.zero_()
        elif step is not None:
            state["step"] = 0


__all__ = ["Parallelized", "DDP", "ZeRO1", "FSDP", "FSDP_CPU_TORCH", "expert_placement", "fsdp_options"]
