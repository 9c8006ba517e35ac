"""What Mixture-of-Experts adds to a micro-batch's time (pretrain.plan.step_time), each term written out.

all-to-all  with expert parallelism ep > 1 every MoE block sends each routed token's hidden state to the rank
            holding its expert (dispatch) and brings the expert's output back (combine): two all-to-alls in
            forward, two in backward (their gradients), two more with full recomputation, which redoes the
            forward. Each moves (ep - 1)/ep of the b*s*k*h activations a rank sends (the tokens bound for
            other ranks' experts), the busiest rank `plan.routing_imbalance` times the mean (the expert
            GEMMs and the exchange wait for it). Not overlapped with compute, as in a plain dispatch-compute-
            combine (DeepSeek-V3's DualPipe overlaps them; a fused library may later, behind its own key).
            The group lies within a node (tensor x expert ranks adjacent) on NVLink, else on the network.
imbalance   the busiest rank computes `load` x the mean routed tokens, so the routed experts' GEMMs take
            (load - 1) x their balanced time more; with every expert on the rank (ep = 1) a dropless layer
            computes b*s*k routed tokens whatever the routing, so nothing is added.
weights     a micro-batch of thousands of tokens reaches nearly every expert, so all the rank's experts'
            weights are read (not only the k a token runs): the read floor counts E / ep experts.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from .activation_terms import COMPUTE_BYTES
from .explain import Explain
from .moe_activations import routed_load
from .params import expert_width, moe_layers

if TYPE_CHECKING:
    from ..config.schema import ResolvedConfig
    from .params import ParamCounts


def weight_params(c: ResolvedConfig, counts: ParamCounts) -> int:
    """Matmul parameters a micro-batch reads on one rank before tensor/pipeline splits: the active N with the
    routed experts replaced by the rank's E / ep of them (a dense model's N)."""
    return counts.flops + counts.inactive - counts.routed_experts + counts.routed_experts // c.parallel.expert


def rank_params(c: ResolvedConfig, counts: ParamCounts) -> int:
    """Parameters whose gradients and states a rank holds before tensor/pipeline splits and ZeRO: all, with
    the routed experts' E / ep of them (a dense model's total)."""
    return counts.total - counts.routed_experts + counts.routed_experts // c.parallel.expert


def routed_flops_per_token(c: ResolvedConfig) -> int:
    """Training FLOPs of a token's k routed experts, all MoE blocks: 6 x k x 3 H H_e per block."""
    m = c.model
    return 6 * moe_layers(m) * m.experts_per_token * 3 * m.hidden_size * expert_width(m)


def moe_seconds(
    c: ResolvedConfig, tokens: int, rate_tflops: float, intra: float, inter: float, link_how: str, ex: Explain
) -> dict[str, Any]:
    """{"all_to_all_s", "imbalance_s"} of one micro-batch of `tokens` on one rank."""
    m, par, t = c.model, c.parallel, c.train
    ep = par.expert
    load = routed_load(m, par, c.plan.routing_imbalance)
    shard = par.tensor * par.pipeline
    routed = routed_flops_per_token(c) * (4 / 3 if t.activation_checkpointing == "full" else 1)
    imbalance_s = (load - 1) * routed * tokens / shard / (rate_tflops * 1e12)
    ex.add(
        "step_time",
        "expert_imbalance_s",
        imbalance_s,
        f"(load {load:.3g} - 1) x routed-expert FLOPs "
        f"{routed:,.0f}/token x {tokens:,} / {shard} / {rate_tflops:.4g} TFLOP/s: the busiest rank's extra tokens",
    )
    if ep == 1:
        return {"all_to_all_s": 0.0, "expert_imbalance_s": imbalance_s}
    inside = par.tensor * ep <= par.gpus_per_node
    gbps = intra if inside else inter
    exchanges = 6 if t.activation_checkpointing == "full" else 4
    layers = -(-moe_layers(m) // par.pipeline)
    a = COMPUTE_BYTES[t.precision]
    sent = a * tokens * m.experts_per_token * m.hidden_size
    seconds = layers * exchanges * load * (ep - 1) / ep * sent / (gbps * 1e9) if gbps else 0.0
    ex.add(
        "step_time",
        "all_to_all_s",
        seconds,
        f"{layers} MoE layers x {exchanges} all-to-alls x load {load:.3g} "
        f"x ({ep}-1)/{ep} x {sent:,} bytes (b*s*k*h x {a}) / {gbps:.4g} GB/s ("
        + ("NVLink" if inside else "network")
        + f": {link_how}); not overlapped"
        + ("" if gbps else "; no bandwidth known: not modelled"),
    )
    return {"all_to_all_s": seconds, "expert_imbalance_s": imbalance_s}
