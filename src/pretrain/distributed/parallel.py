"""Data parallelism with PyTorch's own engines, chosen by `parallel.zero_stage` (the planner's key):

  0  DistributedDataParallel: every rank holds everything; gradients all-reduced in buckets.
  1  DDP + ZeroRedundancyOptimizer: optimizer states sharded over ranks (parameters and gradients whole).
  2  FSDP2 (`fully_shard` per block) without resharding after forward: parameters, gradients and optimizer
     states sharded; gathered parameters stay until backward.
  3  FSDP2 resharding after forward (ZeRO-3): only the blocks in flight are gathered.
Under FSDP, mixed precision is FSDP's policy (bf16 compute, fp32 master weights and gradient reduction), not
autocast. A single process gets a thin wrapper with the same interface.
"""

from __future__ import annotations

import contextlib

import torch

from ..errors import ConfigError
from ..plan.kernels import torch_version_tuple
from ..train.optim import build_optimizer, param_groups
from .runtime import Runtime, all_reduce_mean

FSDP_CPU_TORCH = (2, 9)  # gloo: FSDP2 fails on CPU streams in torch 2.6 and sums instead of averaging in 2.7


class Single:
    """One process: no communication."""

    autocast = True
    measurable = True  # saved-tensor hooks see plain tensors (not FSDP's gathered parameters)

    def __init__(self, model, rt: Runtime):
        self.model, self.rt = model, rt
        self.module_for_forward = model

    def sync_context(self, last: bool):
        return contextlib.nullcontext()

    def build_optimizer(self, config):
        return build_optimizer(self.model, config.model, config.train)

    def clip_grad_norm(self, max_norm: float) -> float:
        """Global L2 norm of the gradients before clipping (clipping only when max_norm > 0)."""
        params = [p for p in self.model.parameters() if p.grad is not None]
        norm = torch.nn.utils.clip_grad_norm_(params, max_norm if max_norm > 0 else float("inf"))
        return float(norm.full_tensor() if hasattr(norm, "full_tensor") else norm)

    def mean_over_ranks(self, value: float) -> float:
        return all_reduce_mean(value, self.rt)

    def state_dict(self, optimizer) -> dict:
        """Model and optimizer state keyed by parameter names (sharded tensors stay sharded), for DCP."""
        from torch.distributed.checkpoint.state_dict import get_state_dict

        fresh = not optimizer.state
        model_sd, optim_sd = get_state_dict(self.model, optimizer)
        if fresh:  # get_state_dict made the states with a zero-gradient step: make them as a new optimizer's
            _zero_step_counters(optimizer.state.values())
            _zero_step_counters(optim_sd["state"].values())
        return {"model": model_sd, "optimizer": optim_sd}

    def load_state_dict(self, optimizer, sd: dict) -> None:
        from torch.distributed.checkpoint.state_dict import set_state_dict

        set_state_dict(self.model, optimizer, model_state_dict=sd["model"], optim_state_dict=sd["optimizer"])


class DDP(Single):
    def __init__(self, model, rt: Runtime):
        super().__init__(model, rt)
        from torch.nn.parallel import DistributedDataParallel

        ids = [rt.device.index] if rt.device.type == "cuda" else None
        self.module_for_forward = DistributedDataParallel(model, device_ids=ids)

    def sync_context(self, last: bool):
        # Gradient accumulation: all-reduce once, on the last micro-batch.
        return contextlib.nullcontext() if last else self.module_for_forward.no_sync()


class ZeRO1(DDP):
    """DDP + ZeroRedundancyOptimizer. Its checkpoint holds, per rank, the states of the parameters that
    rank owns, under the parameters' names: the same layout `get_state_dict` gives for every other mode, so
    a checkpoint loads on any number of ranks and in any mode."""

    def state_dict(self, optimizer) -> dict:
        from torch.distributed.checkpoint.state_dict import get_model_state_dict

        local = optimizer.optim
        if not local.state:
            _materialize(optimizer)
        names = {p: n for n, p in self.model.named_parameters()}
        state = {names[p]: local.state[p] for g in local.param_groups for p in g["params"]}
        groups = [{**{k: v for k, v in g.items() if k != "params"}, "params": [names[p] for p in g["params"]]}
                  for g in optimizer.param_groups]
        return {"model": get_model_state_dict(self.model), "optimizer": {"state": state, "param_groups": groups}}

    def load_state_dict(self, optimizer, sd: dict) -> None:
        from torch.distributed.checkpoint.state_dict import set_model_state_dict

        set_model_state_dict(self.model, sd["model"])  # the optimizer's state tensors were filled in place
        for group, saved in zip(optimizer.param_groups, sd["optimizer"]["param_groups"]):
            group.update({k: v for k, v in saved.items() if k != "params"})

    def build_optimizer(self, config):
        from torch.distributed.optim import ZeroRedundancyOptimizer

        t = config.train
        groups = param_groups(self.model, config.model, t.weight_decay)
        cls, kwargs = {"adamw": (torch.optim.AdamW, dict(betas=tuple(t.betas), eps=t.eps)),
                       "sgd": (torch.optim.SGD, dict(momentum=t.momentum)),
                       "adafactor": (torch.optim.Adafactor, {})}[t.optimizer]
        optimizer = ZeroRedundancyOptimizer(groups[0]["params"], optimizer_class=cls, lr=t.lr,
                                            weight_decay=groups[0]["weight_decay"], **kwargs)
        for group in groups[1:]:
            optimizer.add_param_group(group)
        return optimizer


def _materialize(optimizer) -> None:
    """Create optimizer states (as the first step would) without changing a weight: a step on zero
    gradients with a learning rate of 0. Loading a checkpoint needs tensors to load into."""
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


class FSDP(Single):
    autocast = False  # FSDP's MixedPrecisionPolicy casts the parameters instead
    measurable = False

    def __init__(self, model, rt: Runtime, config):
        super().__init__(model, rt)
        if rt.device.type == "cpu" and torch_version_tuple(torch.__version__) < FSDP_CPU_TORCH:
            raise ConfigError(f"parallel.zero_stage: FSDP (stages 2 and 3) on CPUs needs torch >= 2.9, this is "
                              f"{torch.__version__}; use parallel.zero_stage=1 or a newer torch")
        from torch.distributed.device_mesh import init_device_mesh
        from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard

        mesh = init_device_mesh(rt.device.type, (rt.world_size,))
        precision = config.train.precision
        mp = MixedPrecisionPolicy()
        if precision.endswith("-mixed"):
            half = torch.bfloat16 if precision == "bf16-mixed" else torch.float16
            mp = MixedPrecisionPolicy(param_dtype=half, reduce_dtype=torch.float32)
        reshard = config.parallel.zero_stage == 3
        for block in model.blocks:
            fully_shard(block, mesh=mesh, reshard_after_forward=reshard, mp_policy=mp)
        fully_shard(model, mesh=mesh, reshard_after_forward=reshard, mp_policy=mp)

    def sync_context(self, last: bool):
        self.model.set_requires_gradient_sync(last)
        return contextlib.nullcontext()


def parallelize(model, config, rt: Runtime):
    """(the model whose parameters the optimizer updates, the wrapper the loop talks to)."""
    if not rt.distributed:
        return model, Single(model, rt)
    stage = config.parallel.zero_stage
    if stage == 0:
        return model, DDP(model, rt)
    if stage == 1:
        return model, ZeRO1(model, rt)
    wrapper = FSDP(model, rt, config)
    return model, wrapper


__all__ = ["parallelize", "Single", "DDP", "ZeRO1", "FSDP"]
