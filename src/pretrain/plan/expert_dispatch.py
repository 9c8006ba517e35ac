"""Dispatch as it runs: what moving routed tokens to their experts' ranks and back costs a micro-batch (the
expert-parallel term of pretrain.plan.step_time; docs/moe.md "Dispatch" gives the sources). Pure Python.

tokens      a rank dispatches its own tokens: b*s / t of the micro-batch under tensor parallelism (sequence
            parallelism splits them, and with expert tensor parallelism 1, Megatron's and torchtitan's default,
            each tensor rank routes its share: Megatron requires --sequence-parallel with MoE and tensor
            parallelism), each to k experts; the busiest rank receives its load times the mean
            (pretrain.plan.moe_activations.routed_load: the busiest expert's `plan.routing_imbalance` over the
            rank's experts).
group       the expert-parallel group: ep consecutive ranks of data x tensor ranks (expert tensor 1: Megatron's
            "parallel folding", torchtitan's EP borrowing data and tensor ranks), so min(ep, gpus_per_node) of
            them share a node and the rest sit on ceil(ep / that) nodes. A row for a rank of the same node
            crosses NVLink; one for another node crosses the sending GPU's NIC (one per GPU, as in NVIDIA's DGX
            systems: the catalog's network figure is per GPU). The two links run at once: an exchange takes
            the longer of the two.
dispatcher  parallel.expert_dispatch:
  all_to_all        one NCCL all_to_all_single of every (token, expert) row (pretrain.distributed.expert_parallel,
                    torchtitan's default, Megatron's alltoall dispatcher): k rows a token, a copy per expert;
  deepep / hybridep a token crosses the network once per node that holds one of its experts and NVLink once
                    per other rank it reaches (DeepEP's normal kernels forward it over NVLink inside the node;
                    NVIDIA's HybridEP the same hierarchy, priced alike).
            Dispatch and combine, forward and backward (their gradients): 4 exchanges per MoE layer, 6 with
            recomputation, which reruns the routed part's forward (selective keeps only its top-k choice).
overlap     parallel.expert_dispatch_overlap: each micro-batch's exchanges hidden behind another micro-batch's
            compute (Megatron's --overlap-moe-expert-parallel-comm, "EP A2A overlap", as DeepSeek-V3's DualPipe):
            what the compute does not cover stays exposed, and the covered part slows the compute beside it by
            OVERLAP_SLOWDOWN as any overlapped collective does. Otherwise every exchange waits.
counts      before each dispatch the ranks exchange their per-expert counts and the host reads them to size the
            rows' exchange (our trainer's .tolist(), torchtitan's; DeepEP's normal kernels wait for the same
            signal on the host): a small exchange and a host round trip per forward run of a layer, priced at
            COUNTS_EXCHANGE_S.
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING, Any

from .activation_terms import COMPUTE_BYTES
from .collectives import OVERLAP_SLOWDOWN
from .expert_parallel import DEDUPLICATING, reruns_routed_part
from .explain import Explain
from .params import moe_layers

if TYPE_CHECKING:
    from ..config.job_sections import ParallelConfig
    from ..config.schema import ResolvedConfig, ResolvedModelConfig

# The floor of one expert-parallel exchange of a few rows: DeepEP's low-latency dispatch of 128 tokens over 8
# H800s takes 77 us (deepseek-ai/DeepEP, docs/legacy.md, "Low-latency kernels with pure RDMA"); the counts are a
# few hundred bytes, so latency is all they cost, and the host waits for them.
COUNTS_EXCHANGE_S = 77e-6


def expert_group(par: ParallelConfig) -> tuple[int, int]:
    """(ranks of an expert-parallel group in one node, nodes the group spans): ep consecutive ranks."""
    local = min(par.expert, par.gpus_per_node)
    return local, -(-par.expert // local)


def none_of_k(experts: int, held: int, k: int) -> float:
    """The chance that none of a token's k distinct experts, drawn evenly from `experts`, is among `held`
    of them: C(E - held, k) / C(E, k) (force-balanced routing; a real router's correlations only lower it)."""
    p = 1.0
    for i in range(k):
        p *= max(0, experts - held - i) / (experts - i)
    return p


def none_reached(m: ResolvedModelConfig, held: int) -> float:
    """The chance that none of a token's k experts is among `held` of them (a rank's or a node's): with
    group-limited routing (model.expert_groups G, a token's experts among its M = expert_groups_per_token best
    groups of g = E/G, chosen evenly under force-balanced routing) when `held` is whole groups or a part of one,
    else as if every expert could be chosen (none_of_k)."""
    E, k, G, M = m.num_experts, m.experts_per_token, m.expert_groups, m.expert_groups_per_token
    g = E // G
    if G == 1 or (held % g and g % held):
        return none_of_k(E, held, k)
    if held < g:  # inside one group: missed if the group is not chosen, or chosen and these experts missed
        return 1 - M / G + M / G * none_of_k(M * g, held, k)
    q = held // g  # whole groups: j of them among the M chosen, hypergeometrically, and then all k missed
    chosen = [math.comb(q, j) * math.comb(G - q, M - j) / math.comb(G, M) for j in range(min(q, M) + 1)]
    return sum(p * none_of_k(M * g, j * g, k) for j, p in enumerate(chosen))


def exchange_bytes(c: ResolvedConfig, tokens: int, load: float) -> tuple[float, float, str]:
    """(bytes over NVLink, bytes over the network) that one exchange moves per GPU, and how."""
    m, par = c.model, c.parallel
    ep, E, k = par.expert, m.num_experts, m.experts_per_token
    local, nodes = expert_group(par)
    row = COMPUTE_BYTES[c.train.precision] * m.hidden_size
    sent = tokens / par.tensor * load  # this rank's share of the micro-batch, at the busiest rank's load
    if par.expert_dispatch in DEDUPLICATING:
        per_rank = 1 - none_reached(m, E // ep)  # a token reaches a given other rank
        per_node = 1 - none_reached(m, E * local // ep)  # ... and a given other node
        nvlink, network = sent * (ep - nodes) * per_rank * row, sent * (nodes - 1) * per_node * row
        groups = m.expert_groups > 1
        how = (
            f"b*s/t {tokens / par.tensor:,.0f} x load {load:.3g} x h x {row // m.hidden_size} bytes, once per "
            f"node reached ({nodes - 1} others x {per_node:.3f}) over the network and once per rank "
            f"({ep - nodes} by NVLink x {per_rank:.3f})"
            + (f"; a token's experts in {m.expert_groups_per_token} of {m.expert_groups} groups" if groups else "")
        )
        return nvlink, network, how
    rows = sent * k
    how = (
        f"b*s/t {tokens / par.tensor:,.0f} x k {k} x load {load:.3g} rows of h x {row // m.hidden_size} bytes: "
        f"({local}-1)/{ep} to the node's ranks, ({ep}-{local})/{ep} to {nodes - 1} other node(s)"
    )
    return rows * (local - 1) / ep * row, rows * (ep - local) / ep * row, how


def dispatch_seconds(
    c: ResolvedConfig, tokens: int, load: float, links: tuple[float, float, str], window_s: float, ex: Explain
) -> dict[str, Any]:
    """{"all_to_all_s": the exchanges' seconds, "counts_exchange_s", "dispatch_exposed_s": what the micro-batch
    waits for} of one micro-batch of `tokens` (b*s) on one rank, all 0 at ep = 1; `window_s`: the compute an
    overlap hides behind."""
    par, t = c.parallel, c.train
    if par.expert == 1:
        return {"all_to_all_s": 0.0, "counts_exchange_s": 0.0, "dispatch_exposed_s": 0.0}
    intra, inter, link_how = links
    layers = -(-moe_layers(c.model) // par.pipeline)
    rerun = reruns_routed_part(t)
    nvlink, network, how = exchange_bytes(c, tokens, load)
    one = max(nvlink / (intra * 1e9) if intra else 0.0, network / (inter * 1e9) if inter else 0.0)
    exchanges = 6 if rerun else 4
    a2a_s = layers * exchanges * one
    counts_s = layers * (2 if rerun else 1) * COUNTS_EXCHANGE_S if intra or inter else 0.0
    ex.add(
        "step_time",
        "all_to_all_s",
        a2a_s,
        f"{layers} MoE layers x {exchanges} exchanges x max({nvlink:.4g} bytes NVLink, {network:.4g} bytes "
        f"network) ({par.expert_dispatch}: {how}; links {link_how})"
        + ("" if intra or inter else "; no bandwidth known: not modelled"),
    )
    ex.add(
        "step_time",
        "counts_exchange_s",
        counts_s,
        f"{layers} layers x {2 if rerun else 1} forward run(s) x {COUNTS_EXCHANGE_S * 1e6:g} us: the per-expert "
        "counts exchanged and read by the host before each dispatch",
    )
    if par.expert_dispatch_overlap:
        hidden = min(a2a_s, window_s)
        exposed = a2a_s - hidden + OVERLAP_SLOWDOWN * hidden + counts_s
        how = (
            f"{a2a_s:.4g} s behind another micro-batch's compute {window_s:.4g} s: {a2a_s - hidden:.4g} exposed "
            f"+ {OVERLAP_SLOWDOWN} x {hidden:.4g} contention + counts {counts_s:.4g}"
        )
    else:
        exposed, how = a2a_s + counts_s, f"not overlapped: all-to-all {a2a_s:.4g} + counts {counts_s:.4g}"
    ex.add("step_time", "dispatch_exposed_s", exposed, how)
    return {"all_to_all_s": a2a_s, "counts_exchange_s": counts_s, "dispatch_exposed_s": exposed}
