"""The tensor-parallel term of the step-time model (pretrain.plan.step_time, whose docstring gives the model and
its sources): a block's all-reduces (all-gather + reduce-scatter under sequence parallelism) of b*s*h activations
over the tensor group's link, what async TP hides of them, and what float8 all-gathers save. Pure Python."""

from __future__ import annotations

from typing import TYPE_CHECKING

from . import fp8
from .activation_terms import COMPUTE_BYTES
from .collectives import OVERLAP_SLOWDOWN, ring

if TYPE_CHECKING:
    from ..config.job_sections import ParallelConfig
    from ..config.schema import ResolvedConfig
    from .explain import Explain


def _exposed(par: ParallelConfig, tp_s: float, matmul_s: float) -> tuple[float, str]:
    """What of the tensor-parallel collectives the step waits for. Plain: all of it, each collective between
    the matmuls that need it. Async TP (parallel.async_tp) splits each all-gather + matmul and matmul +
    reduce-scatter into tp chunks and runs chunk i's matmul while chunk i+1 moves (Wang et al. 2022,
    "Overlap Communication with Dependent Computation via Decomposition", ASPLOS'23; torch's micro-pipeline
    TP, Megatron's --tp-comm-overlap): one chunk in tp stays exposed, the rest hides behind the split matmuls
    (beyond them it waits) and slows them as any overlapped collective does (OVERLAP_SLOWDOWN)."""
    if not par.async_tp:
        return tp_s, "not overlapped"
    hidden = tp_s * (par.tensor - 1) / par.tensor
    exposed = tp_s / par.tensor + max(0.0, hidden - matmul_s) + OVERLAP_SLOWDOWN * min(hidden, matmul_s)
    return exposed, (
        f"{tp_s:.4g} s, async TP: 1/{par.tensor} exposed, the rest behind the matmuls, + {OVERLAP_SLOWDOWN} x "
        f"{min(hidden, matmul_s):.4g} s of contention"
    )


def tensor_parallel_time(
    c: ResolvedConfig, layers: int, tokens: int, intra: float, link_how: str, matmul_s: float, on_gpu: bool, ex: Explain
) -> float:
    """Seconds of one micro-batch's tensor-parallel collectives that the step waits for."""
    m, t, par = c.model, c.train, c.parallel
    a, tp = COMPUTE_BYTES[t.precision], par.tensor
    full = t.activation_checkpointing == "full"
    collectives = 6 if full else 4
    tp_bytes = a * tokens * m.hidden_size
    float8_share = fp8.tensor_parallel_bytes(c, collectives, on_gpu)
    tp_s = layers * collectives * ring(tp_bytes, tp, intra, 2) * float8_share
    if tp > 1:
        tp_s, how = _exposed(par, tp_s, matmul_s)
        ex.add(
            "step_time",
            "tensor_parallel_s",
            tp_s,
            f"{layers} layers x {collectives} all-reduces x 2 x "
            f"({tp}-1)/{tp} x {tp_bytes:,} bytes (b*s*h x {a}) / {intra:.4g} GB/s ({link_how}); {how}"
            + ("; sequence parallel: all-gather + reduce-scatter, same volume" if par.sequence_parallel else "")
            + (f"; x {float8_share:g}: the converted linears all-gather in float8" if float8_share < 1 else ""),
        )
    return tp_s
