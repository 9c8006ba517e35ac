"""A Mixture-of-Experts block's feed-forward terms, in place of the MLP's: the router's fp32 probabilities (b*s*E)
and its top-k weights and expert ids, and per routed token (b*s*k of them) its gathered input, the expert's
SwiGLU terms at width H_e and its output before the weighted sum; the shared experts keep the MLP's terms at
num_shared_experts x H_e. With expert parallelism a rank computes the tokens every rank of its group sends to
its experts: the busiest rank is counted at `plan.routing_imbalance` x the mean (the busiest expert's ratio, an
upper bound for a rank of several experts). Dropless, one rank holding every expert computes b*s*k routed
tokens whatever the imbalance. Under torch.compile the MoE terms are counted as eager (not measured compiled).

Its own module because the busiest rank's load (`routed_load`) is also the memory's (pretrain.plan.memory:
the imbalance that still fits) and the step time's (pretrain.plan.expert_parallel).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from .params import expert_width

if TYPE_CHECKING:
    from ..config.job_sections import ParallelConfig
    from ..config.schema import ResolvedModelConfig
    from .activation_terms import AddTerm


def routed_load(m: ResolvedModelConfig, parallel: ParallelConfig, imbalance: float) -> float:
    """The busiest rank's routed tokens over b*s*k: `imbalance` under expert parallelism (at most what the group
    can send it: ep ranks' tokens, each to min(k, E/ep) of its experts), 1 with every expert on the rank."""
    ep = parallel.expert
    if ep == 1:
        return 1.0
    return min(imbalance, ep * min(m.experts_per_token, m.num_experts // ep) / m.experts_per_token)


def moe_terms(
    add: AddTerm, m: ResolvedModelConfig, parallel: ParallelConfig, bs: int, a: int, recompute: str, imbalance: float
) -> None:
    """An MoE block's feed-forward terms (the module docstring); experts are not split over tensor ranks."""
    E, k, He, h = m.num_experts, m.experts_per_token, expert_width(m), m.hidden_size
    load = routed_load(m, parallel, imbalance)
    tokens = int(bs * k * load)
    at = f" x load {load:.3g}" if load != 1 else ""
    add("router fp32 probabilities", 4 * bs * E, f"4 x b*s*E {E}", sharded=False)
    add("top-k weights and expert ids", 12 * bs * k, f"12 x b*s*k {k}", sharded=False)
    add("routed tokens: expert inputs and outputs", 2 * a * tokens * h, f"2 x {a} x b*s*k*h{at}", sharded=False)
    swiglu = 3 if recompute == "selective" else 4  # selective remakes silu(gate) from gate|up
    add(
        "routed tokens: gate|up output, silu(gate), down input",
        swiglu * a * tokens * He,
        f"{swiglu} x {a} x b*s*k*H_e {He}{at}",
        sharded=False,
    )
    if m.num_shared_experts:
        width = m.num_shared_experts * He
        add(
            "shared experts: gate|up output, silu(gate), down input",
            swiglu * a * bs * width,
            f"{swiglu} x {a} x b*s*{width}",
        )
