"""What Mixture-of-Experts adds to a micro-batch's time (pretrain.plan.step_time), each term written out.

dispatch    with expert parallelism ep > 1, the exchanges of routed tokens with the ranks holding their experts:
            pretrain.plan.expert_dispatch (tokens per rank, NVLink and network, the dispatcher, the overlap).
imbalance   the busiest rank computes `load` x the mean routed tokens, so the routed experts' GEMMs take
            (load - 1) x their balanced time more; with every expert on the rank (ep = 1) a dropless layer
            computes b*s*k routed tokens whatever the routing, so nothing is added.
grouped     the routed experts run as one grouped GEMM whose M is each expert's tokens, tiled as any GEMM's in
            128-row tiles (NVIDIA's Matrix Multiplication Background guide: tile quantization): an expert of m
            rows uses m / (128 ceil(m / 128)) of them, m = b*s/t x k x ep / E x load (each rank's tokens over
            all E experts, ep ranks sending to each). The GEMMs' narrow shapes (Qwen3's 768-wide experts)
            stream more activation bytes per FLOP: pretrain.plan.gemm_shapes.
permutation the rows are gathered by expert, their outputs weighted and added back to their tokens (3 passes,
            each reading and writing b*s/t x k x load rows of h: our model/moe.py), with expert parallelism also
            re-sorted by expert on the receiving rank and back (2 more: distributed/expert_parallel.py); DeepEP
            and HybridEP deliver each rank its tokens, which Megatron's flex dispatcher permutes by expert and
            back, weighting as it unpermutes (2 passes). Backward mirrors each; either recomputation reruns the
            forward's (the routed part keeps only its top-k choice). Memory-bound, at HBM bandwidth; GPUs only
            (a CPU's traffic is not modelled).
weights     a micro-batch of thousands of tokens reaches nearly every expert, so all the rank's experts'
            weights are read (not only the k a token runs): the read floor counts E / ep experts.
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING, Any

from .activation_terms import COMPUTE_BYTES
from .explain import Explain
from .moe_activations import routed_load
from .params import expert_width, moe_layers

if TYPE_CHECKING:
    from ..config.schema import ResolvedConfig, ResolvedTrainConfig
    from .params import ParamCounts

TILE_ROWS = 128  # a GEMM's tile of M rows (as pretrain.plan.step_time's)
PERMUTATION_PASSES = 3  # forward: gather by expert, weight the outputs, add them back to their tokens
RESORT_PASSES = 2  # expert parallelism: the received rows sorted by expert, and back
FUSED_PASSES = 2  # DeepEP / HybridEP: the delivered tokens permuted by expert, and back (weighted)
DEDUPLICATING = ("deepep", "hybridep")  # dispatchers that send a token once per rank and node it reaches


def weight_params(c: ResolvedConfig, counts: ParamCounts) -> int:
    """Matmul parameters a micro-batch reads on one rank before tensor/pipeline splits: the active N with the
    routed experts replaced by the rank's E / ep of them (a dense model's N)."""
    return counts.flops + counts.inactive - counts.routed_experts + counts.routed_experts // c.parallel.expert


def rank_params(c: ResolvedConfig, counts: ParamCounts) -> int:
    """Parameters whose gradients and states a rank holds before tensor/pipeline splits and ZeRO: all, with
    the routed experts' E / ep of them (a dense model's total)."""
    return counts.total - counts.routed_experts + counts.routed_experts // c.parallel.expert


def reruns_routed_part(t: ResolvedTrainConfig) -> bool:
    """Whether backward runs an MoE block's routed part again: under either recomputation, which keep only
    its top-k choice (pretrain.distributed.recompute); so its GEMMs, permutations and exchanges run 3 times."""
    return t.activation_checkpointing != "none"


def routed_flops_per_token(c: ResolvedConfig) -> int:
    """Training FLOPs of a token's k routed experts, all MoE blocks: 6 x k x 3 H H_e per block."""
    m = c.model
    return 6 * moe_layers(m) * m.experts_per_token * 3 * m.hidden_size * expert_width(m)


def expert_rows(c: ResolvedConfig, tokens: int, load: float) -> float:
    """Rows of one expert on the busiest rank: b*s/t x k x ep / E x load."""
    m, par = c.model, c.parallel
    return tokens / par.tensor * m.experts_per_token * par.expert / m.num_experts * load


def moe_seconds(
    c: ResolvedConfig,
    tokens: int,
    rates: tuple[float, float | None, float],
    ex: Explain,
) -> dict[str, Any]:
    """The MoE terms of one micro-batch of `tokens` on one rank. rates: (GEMM TFLOP/s, the micro-batch's tile
    share or None off a GPU, HBM GB/s or 0 off a GPU). The dispatch is pretrain.plan.expert_dispatch's."""
    m, par, t = c.model, c.parallel, c.train
    rate, tile, hbm = rates
    load = routed_load(m, par, c.plan.routing_imbalance)
    shard = par.tensor * par.pipeline
    routed = routed_flops_per_token(c) * (4 / 3 if reruns_routed_part(t) else 1)
    imbalance_s = (load - 1) * routed * tokens / shard / (rate * 1e12)
    ex.add(
        "step_time",
        "expert_imbalance_s",
        imbalance_s,
        f"(load {load:.3g} - 1) x routed-expert FLOPs "
        f"{routed:,.0f}/token x {tokens:,} / {shard} / {rate:.4g} TFLOP/s: the busiest rank's extra tokens",
    )
    out = {"expert_imbalance_s": imbalance_s, **_grouped_gemm(c, tokens, load, routed, rate, tile, ex)}
    out["permutation_s"] = _permutation(c, tokens, load, hbm, ex)
    return {**out, "load": load}


def _grouped_gemm(
    c: ResolvedConfig, tokens: int, load: float, routed: float, rate: float, tile: float | None, ex: Explain
) -> dict[str, float]:
    """The routed GEMMs' tiles: each expert's rows in 128-row tiles instead of the micro-batch's (tile: its
    share, None off a GPU, which has no tiles)."""
    rows = expert_rows(c, tokens, load)
    expert_tile = 1.0 if tile is None else rows / (TILE_ROWS * math.ceil(rows / TILE_ROWS))
    full_tiles = routed * load * tokens / (c.parallel.tensor * c.parallel.pipeline) / (rate * 1e12)
    seconds = max(0.0, full_tiles / expert_tile - full_tiles / (tile or 1.0))
    ex.add(
        "step_time",
        "expert_tile_s",
        seconds,
        f"routed GEMMs {full_tiles:.4g} s at full tiles, {rows:,.0f} rows per expert (b*s/t x k x ep / E x "
        f"load): tiles {expert_tile:.3g} full instead of the micro-batch's {tile or 1.0:.3g}"
        + ("; no tiles on a CPU" if tile is None else ""),
    )
    return {"expert_tile_s": seconds, "expert_tile": expert_tile}


def _permutation(c: ResolvedConfig, tokens: int, load: float, hbm: float, ex: Explain) -> float:
    """Seconds of the memory-bound passes that sort rows by expert and bring them back (module docstring)."""
    m, par, t = c.model, c.parallel, c.train
    rows = tokens / par.tensor * m.experts_per_token * load
    forward = PERMUTATION_PASSES + (RESORT_PASSES if par.expert > 1 else 0)
    if par.expert > 1 and par.expert_dispatch in DEDUPLICATING:
        forward = FUSED_PASSES
    passes = forward * (3 if reruns_routed_part(t) else 2)
    layers = -(-moe_layers(m) // par.pipeline)
    nbytes = layers * passes * 2 * rows * m.hidden_size * COMPUTE_BYTES[t.precision]
    seconds = nbytes / (hbm * 1e9) if hbm else 0.0
    ex.add(
        "step_time",
        "permutation_s",
        seconds,
        f"{layers} MoE layers x {passes} passes x 2 (read, write) x {rows:,.0f} rows (b*s/t x k x load) x h "
        f"{m.hidden_size} = {nbytes:.4g} bytes / HBM" + ("" if hbm else "; not modelled off a GPU"),
    )
    return seconds
