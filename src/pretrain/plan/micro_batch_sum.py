"""A micro-batch's seconds from the terms pretrain.plan.step_time computes: the compute or the weights' reads,
whichever is longer, then everything that waits beside neither. And an MoE block's own terms, whose overlapped
expert-parallel exchanges hide behind the rest of that sum. Pure Python, as the rest of the planner."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from .expert_dispatch import dispatch_seconds
from .expert_parallel import moe_seconds

if TYPE_CHECKING:
    from ..config.schema import ResolvedConfig, ResolvedTrainConfig
    from .explain import Explain


def moe_terms(
    c: ResolvedConfig,
    tokens: int,
    gemm: tuple[float, float | None, float],
    link: tuple[float, float, str],
    terms: dict[str, Any],
    cast_s: float,
    ex: Explain,
) -> dict[str, Any]:
    """An MoE block's seconds (pretrain.plan.expert_parallel) and its dispatch's (pretrain.plan.expert_dispatch);
    none for a dense model. An overlapped exchange hides behind another micro-batch's work: all it does but its
    own exchanges (Megatron's combined 1F1B runs one micro-batch's forward beside another's backward)."""
    if not c.model.num_experts:
        return {}
    moe = moe_seconds(c, tokens, gemm, ex)
    load = moe.pop("load")
    moe.update(dispatch_seconds(c, tokens, load, link, busy_seconds(terms, moe, cast_s)[0], ex))
    return moe


def busy_seconds(terms: dict[str, Any], moe: dict[str, Any], cast_s: float) -> tuple[float, float]:
    """(the micro-batch's seconds but its expert-parallel exchanges, its compute seconds): the compute or the
    weights' reads, whichever is longer, then everything that waits beside neither."""
    compute_s = terms["matmul_s"] + terms["attention_s"] + moe.get("expert_imbalance_s", 0.0)
    compute_s += moe.get("expert_tile_s", 0.0)
    busy_s = max(compute_s, terms["weight_read_s"]) + terms["gemm_operand_s"] + terms["activation_traffic_s"]
    busy_s += terms["tensor_parallel_s"]  # added one by one, in the order a dense plan always summed them
    busy_s += terms["kernel_overhead_s"]
    busy_s += cast_s
    return busy_s + moe.get("permutation_s", 0.0), compute_s


def micro_batch_sum(
    t: ResolvedTrainConfig, terms: dict[str, Any], moe: dict[str, Any], cast_s: float, ex: Explain
) -> dict[str, Any]:
    """The micro-batch's seconds from its terms: the compute or the weights' reads, whichever is longer, then
    everything that waits beside neither."""
    busy_s, compute_s = busy_seconds(terms, moe, cast_s)
    weight_s, operand_s, traffic_s = terms["weight_read_s"], terms["gemm_operand_s"], terms["activation_traffic_s"]
    tp_s, overhead_s = terms["tensor_parallel_s"], terms["kernel_overhead_s"]
    micro_s = busy_s + moe.get("dispatch_exposed_s", 0.0)
    bound = "compute" if compute_s >= weight_s else "memory"
    ex.add(
        "step_time",
        "micro_batch_s",
        micro_s,
        f"max(compute {compute_s:.4g}, weight reads {weight_s:.4g}) + "
        f"GEMM operands {operand_s:.4g} + activation traffic {traffic_s:.4g} + TP {tp_s:.4g} "
        f"+ kernel overhead {overhead_s:.4g}"
        + (f" + fp8 casts {cast_s:.4g}" if t.precision == "fp8" else "")
        + (f" + dispatch {moe['dispatch_exposed_s']:.4g} + permutation {moe['permutation_s']:.4g}" if moe else "")
        + ": "
        + ("compute-bound" if bound == "compute" else "memory-bound (the weights' reads set the floor)"),
    )
    out = {
        "achievable_tflops": terms["achievable_tflops"],
        "micro_batch_s": micro_s,
        "matmul_s": terms["matmul_s"],
        "attention_s": terms["attention_s"],
        "weight_read_s": weight_s,
        "gemm_operand_s": operand_s,
        "activation_traffic_s": traffic_s,
        "tensor_parallel_s": tp_s,
        "kernel_overhead_s": overhead_s,
        "bound": bound,
        **moe,
    }
    return {**out, "fp8_cast_s": cast_s} if t.precision == "fp8" else out
