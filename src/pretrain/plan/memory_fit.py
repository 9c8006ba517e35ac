"""Does the step fit the card? Its peak against the device's memory less hardware.fragmentation, the largest
train.micro_batch_size whose peak phase fits (bisected), and for Mixture-of-Experts the busiest rank's routed
load and the routing imbalance up to which the step still fits.

Its own module beside the peak itself (pretrain.plan.memory): these re-plan the step's phases
(pretrain.plan.phases) at other micro-batches and imbalances, searches the peak does not need.
"""

from __future__ import annotations

import dataclasses
from typing import TYPE_CHECKING, Any

from ..gpus import gpu_spec
from ..units import gib
from .hardware import device_memory_bytes
from .moe_activations import rank_spread, routed_ceiling, routed_load
from .phases import step_phases

if TYPE_CHECKING:
    from ..config.schema import ResolvedConfig
    from .explain import Explain

# Expandable segments grow in place in 2 MiB pages instead of a new segment being cut for each new largest size
# (pytorch/pytorch#96995); what they leave is measured nowhere public, so the default stays 10%, a margin that
# also holds what no phase counts: cuBLAS / cuDNN workspaces, inductor's scratch, NCCL's trees and NVLS.
FRAGMENTATION_WHY = (
    "hardware.fragmentation is 10% by default even with PYTORCH_CUDA_ALLOC_CONF="
    "expandable_segments:True, which the trainer sets unless the variable is set: it removes most "
    "fragmentation (no public figure says how much stays), and the margin also holds library "
    "workspaces that no phase counts"
)


def memory_fit(cfg: ResolvedConfig, st: dict[str, Any], total: int, ex: Explain) -> dict[str, Any]:
    """Whether the peak fits the card less its fragmentation allowance, and the largest micro-batch that does."""
    hw = cfg.hardware
    device = device_memory_bytes(hw)
    fit = dict(device_bytes=device, usable_bytes=None, fits=None, max_micro_batch_size=None)
    if device is not None:
        usable = int(device * (1 - hw.fragmentation))
        fit.update(usable_bytes=usable, fits=total <= usable)
        fit["max_micro_batch_size"] = _max_micro_batch(cfg, st, usable)
        on_gpu = gpu_spec(hw.gpu).name != "cpu"
        ex.add(
            "memory",
            "fits",
            fit["fits"],
            f"total {gib(total)} <= {gib(device)} x (1 - fragmentation "
            f"{hw.fragmentation}) = {gib(usable)}" + (f"; {FRAGMENTATION_WHY}" if on_gpu else ""),
        )
        ex.add(
            "memory",
            "max_micro_batch_size",
            fit["max_micro_batch_size"],
            "largest train.micro_batch_size whose peak phase fits",
        )
    return fit


def _max_micro_batch(cfg: ResolvedConfig, st: dict[str, Any], usable: int) -> int:
    def need(b: int) -> int:
        return max(sum(n for _, n in parts) for parts in step_phases(cfg, st, b).values())

    if need(1) > usable:
        return 0
    lo, hi = 1, 2
    while need(hi) <= usable:  # ends: every sequence adds its token ids and logits, so need grows with b
        lo, hi = hi, hi * 2
    while hi - lo > 1:
        mid = (lo + hi) // 2
        lo, hi = (mid, hi) if need(mid) <= usable else (lo, mid)
    return lo


def moe_fit(cfg: ResolvedConfig, st: dict[str, Any], usable: int | None, ex: Explain) -> dict[str, Any]:
    """The MoE figures of the memory plan: the busiest rank's routed load, and the routing imbalance up to which
    the step still fits (bisected over plan.routing_imbalance: each phase grows with it, linearly)."""
    m, par, f = cfg.model, cfg.parallel, cfg.plan.routing_imbalance
    load = routed_load(m, par, f)
    ex.add(
        "memory",
        "routed load",
        load,
        "the busiest rank's routed tokens / b*s*k: "
        + (
            f"1 + (plan.routing_imbalance {f} - 1) x {rank_spread(m.num_experts, par.expert):.3g}, the busiest "
            f"expert's excess over the busiest rank's of {m.num_experts // par.expert} experts (expert parallel "
            f"{par.expert}; docs/moe.md)"
            if par.expert > 1
            else "1: every expert on the rank computes the b*s*k routed tokens, whatever the imbalance"
        ),
    )
    out = dict(
        expert_parallel=par.expert,
        experts_per_rank=m.num_experts // par.expert,
        routing_imbalance=f,
        routed_load=load,
        fits_up_to_imbalance=None,
    )
    if usable is None or par.expert == 1:
        return out
    # the busiest expert's imbalance at which the busiest rank gets every token of its group
    ceiling = 1 + (routed_ceiling(m, par) - 1) / rank_spread(m.num_experts, par.expert)

    def fits(imbalance: float) -> bool:
        c = dataclasses.replace(cfg, plan=dataclasses.replace(cfg.plan, routing_imbalance=imbalance))
        return (
            max(sum(n for _, n in parts) for parts in step_phases(c, st, cfg.train.micro_batch_size).values()) <= usable
        )

    if not fits(1.0):
        limit, why = 0.0, "does not fit even with perfectly balanced routing"
    elif fits(ceiling):
        limit, why = ceiling, f"fits even at {ceiling:g}, every token of the group on this rank's experts"
    else:
        lo, hi = 1.0, ceiling
        while hi - lo > 1e-3:
            mid = (lo + hi) / 2
            lo, hi = (mid, hi) if fits(mid) else (lo, mid)
        limit, why = round(lo, 3), f"stops fitting above a routing imbalance of {lo:.3g} (planned at {f})"
    out["fits_up_to_imbalance"] = limit
    ex.add("memory", "fits up to imbalance", limit, why)
    return out
