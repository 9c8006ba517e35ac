"""A Mixture-of-Experts block's feed-forward terms, in place of the MLP's, tensor by tensor as model/moe.py keeps
them (measured on the CPU: tests/plan/test_memory_vs_measured.py):
  router   the fp32 logits (kept by the z-loss's logsumexp, with its result) and scores (softmax or sigmoid),
           the score sums of the aux loss and the norm of the top-k weights, the expert shares;
  choice   the top-k expert ids (int64), the chosen weights before their norm (norm_topk_prob), and per routed
           (token, expert) pair its sort order and token id (int64) and its weight in the residual dtype;
  experts  per routed pair its input, the expert's SwiGLU terms at width H_e (gate|up output, silu(gate), down
           input) and its output before the weighted sum; the grouped GEMM's offsets;
  shared   the shared experts keep the MLP's terms at num_shared_experts x H_e (and, under autocast, their own
           half-precision copy of the input beside the router's).
The weighted sum back to the tokens (index_put_) keeps only the token ids. Selective recomputation keeps of all
this the top-k choice (values and ids) and the shared experts' first matmul output; the rest is remade with the
block (pretrain.distributed.recompute). With expert parallelism a rank computes the pairs every rank of its group
sends to its experts (and keeps their re-sort order and its inverse): the busiest rank is counted at its load
(`rank_load`: the busiest expert's `plan.routing_imbalance`, averaged over the rank's E/ep experts); dropless,
one rank holding every expert computes b*s*k routed pairs whatever the imbalance. With experts split
over the tensor ranks (parallel.expert_tensor = tensor) each tensor rank computes every pair of its tensor group
at 1/t of the width. Under torch.compile the MoE terms are counted as eager (the routed part runs eager).

Its own module because the busiest rank's load (`routed_load`) is also the memory's (pretrain.plan.memory: the
imbalance that still fits) and the step time's (pretrain.plan.expert_parallel).
"""

from __future__ import annotations

import functools
import math
from typing import TYPE_CHECKING

from .params import expert_width

if TYPE_CHECKING:
    from ..config.job_sections import ParallelConfig
    from ..config.schema import ResolvedModelConfig
    from .activation_terms import AddTerm


def routed_load(m: ResolvedModelConfig, parallel: ParallelConfig, imbalance: float) -> float:
    """The busiest rank's routed tokens over b*s*k: under expert parallelism the rank's load for the busiest
    expert's `imbalance` (`rank_spread`; at most what the group can send it: ep ranks' tokens, each to
    min(k, E/ep) of its experts), 1 with every expert on the rank."""
    ep = parallel.expert
    if ep == 1:
        return 1.0
    return min(1 + (imbalance - 1) * rank_spread(m.num_experts, ep), routed_ceiling(m, parallel))


def routed_ceiling(m: ResolvedModelConfig, parallel: ParallelConfig) -> float:
    """The most a rank can receive over b*s*k: every token of its group sent to min(k, E/ep) of its experts."""
    ep = parallel.expert
    return ep * min(m.experts_per_token, m.num_experts // ep) / m.experts_per_token


def rank_spread(experts: int, ranks: int) -> float:
    """The busiest of `ranks` ranks' excess load over the busiest expert's (both over the mean), each rank
    holding n = E/ranks of E experts. With expert loads spread alike and independently about their mean (relative
    standard deviation sigma), the busiest of N draws lies e(N) sigma above it, e(N) the expected maximum of N
    standard normals; a rank's mean of n experts, drawn without replacement from E whose loads sum to the
    step's tokens, has a relative deviation sigma sqrt((E - n) / (n (E - 1))). So

        rank excess = expert excess x e(ranks) / e(E) x sqrt((E - n) / (n (E - 1)))

    1 when each rank holds one expert, 0 when one rank holds them all. Qwen3-30B-A3B's 128 experts over 8 ranks:
    0.128, so the busiest expert at 1.72 makes the busiest rank 1.09."""
    if ranks <= 1:
        return 0.0
    n = experts // ranks
    return _expected_max(ranks) / _expected_max(experts) * math.sqrt((experts - n) / (n * (experts - 1)))


@functools.cache
def _expected_max(n: int) -> float:
    """E[max of n independent standard normals] = integral of x n phi(x) Phi(x)^(n-1) dx (Simpson, |x| <= 10)."""
    steps, lo, hi = 2000, -10.0, 10.0
    dx = (hi - lo) / steps

    def f(x: float) -> float:
        return (
            x * n * math.exp(-x * x / 2) / math.sqrt(2 * math.pi) * (0.5 * (1 + math.erf(x / math.sqrt(2)))) ** (n - 1)
        )

    inner = sum((4 if i % 2 else 2) * f(lo + i * dx) for i in range(1, steps))
    return (f(lo) + inner + f(hi)) * dx / 3


def moe_terms(
    add: AddTerm,
    m: ResolvedModelConfig,
    parallel: ParallelConfig,
    bs: int,
    a: int,
    r: int,
    recompute: str,
    imbalance: float,
) -> None:
    """An MoE block's feed-forward terms (the module docstring) for b*s = `bs` tokens, compute dtype `a` bytes,
    the residual stream (the layer's input) `r` bytes."""
    k, h = m.experts_per_token, m.hidden_size
    etp = parallel.expert_tensor if parallel.tensor > 1 else 1
    if recompute == "selective":
        add("top-k expert ids", 8 * bs * k, f"8 x b*s*k {k} (int64)", sharded=False)
        add("top-k scores", 4 * bs * k, f"4 x b*s*k {k}", sharded=False)
    else:
        _router_terms(add, m, bs)
        add("top-k expert ids", 8 * bs * k, f"8 x b*s*k {k} (int64)", sharded=False)
        pairs = bs * k * etp  # a rank's routed pairs: its tensor group's with split experts
        on = f" x expert_tensor {etp}" if etp > 1 else ""
        add("routed pairs: sort order, token ids", 16 * pairs, f"16 x b*s*k{on} (int64)", sharded=False)
        add("routed pairs: weights", r * pairs, f"{r} x b*s*k{on}", sharded=False)
        _expert_terms(add, m, parallel, bs, a, imbalance)
    if m.num_shared_experts:
        width = m.num_shared_experts * expert_width(m)
        add("shared experts: gate|up output", a * bs * 2 * width, f"{a} x b*s*2 x {width}")
        if recompute != "selective":
            add("shared experts: silu(gate), down input", 2 * a * bs * width, f"2 x {a} x b*s*{width}")
            if r != a:  # autocast casts the layer's input for the router and again for the shared experts
                add("shared experts: matmul input", a * bs * h, f"{a} x b*s*h", sharded=False)


def _router_terms(add: AddTerm, m: ResolvedModelConfig, bs: int) -> None:
    """The router's fp32 tensors: logits and scores, the z-loss's logsumexp, the aux loss's score sums and expert
    shares, the top-k weights' norm."""
    E, k = m.num_experts, m.experts_per_token
    add("router fp32 logits and scores", 2 * 4 * bs * E, f"2 x 4 x b*s*E {E}", sharded=False)
    add("router fp32 logsumexp, score sums", 2 * 4 * bs + 4 * E, "2 x 4 x b*s + 4 x E", sharded=False)
    if m.norm_topk_prob:
        add(
            "top-k weights before their norm, and its sum",
            4 * bs * k + 4 * bs,
            f"4 x b*s*k {k} + 4 x b*s",
            sharded=False,
        )


def _expert_terms(
    add: AddTerm, m: ResolvedModelConfig, parallel: ParallelConfig, bs: int, a: int, imbalance: float
) -> None:
    """What the experts keep for the pairs a rank computes (its busiest load under expert parallelism) and for the
    outputs it gets back."""
    k, h, He = m.experts_per_token, m.hidden_size, expert_width(m)
    etp = parallel.expert_tensor if parallel.tensor > 1 else 1
    load = routed_load(m, parallel, imbalance)
    computed = int(bs * k * load) * etp  # with split experts, every pair of the tensor group at 1/t the width
    at = (f" x load {load:.3g}" if load != 1 else "") + (f" x expert_tensor {etp}" if etp > 1 else "")
    add("routed pairs: expert inputs", a * computed * h, f"{a} x b*s*k*h{at}", sharded=False)
    add(
        "routed pairs: gate|up output, silu(gate), down input",
        4 * a * computed * He // etp,
        f"4 x {a} x b*s*k*H_e {He}{at}" + (f" / {etp}" if etp > 1 else ""),
        sharded=False,
    )
    add(
        "routed pairs: expert outputs",
        a * bs * k * etp * h,
        f"{a} x b*s*k*h" + (f" x expert_tensor {etp}" if etp > 1 else ""),
        sharded=False,
    )
    if parallel.expert > 1:  # the owner's re-sort of what it receives by expert, and back
        add("received pairs: sort order and its inverse", 16 * computed, f"16 x b*s*k{at} (int64)", sharded=False)
    add("grouped GEMM offsets", 4 * (m.num_experts // parallel.expert), "4 x E / ep (int32)", sharded=False)
