"""The pipeline's share of the step-time model (pretrain.plan.step_time): a step's micro-batches in the
schedule's slots, each slot also sending activations on and gradients back. Pure Python."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from .activation_terms import COMPUTE_BYTES
from .collectives import links
from .explain import Explain
from .stages import bubble_fraction, chunks_per_stage

if TYPE_CHECKING:
    from ..config.schema import ResolvedConfig


def pipeline_time(c: ResolvedConfig, micro_s: float, ex: Explain) -> dict[str, Any]:
    """1F1B: m micro-batches in m + p - 1 slots, each slot also sending activations on and gradients back.
    Interleaved 1F1B with v chunks per stage: m + (p - 1) / v slots, each sending v times (Narayanan et al.
    2021, section 2.2.2)."""
    t, par = c.train, c.parallel
    micro, pp, v = t.grad_accum_steps, par.pipeline, chunks_per_stage(par)
    intra, inter, _ = links(c)
    link = intra if par.gpus <= par.gpus_per_node else inter
    sent = 2 * COMPUTE_BYTES[t.precision] * t.micro_batch_size * t.seq_len * c.model.hidden_size
    p2p_s = v * sent / (link * 1e9) if pp > 1 and link else 0.0  # per slot: each of the v chunks sends
    slots = micro + (pp - 1) / v
    phase_s = slots * (micro_s + p2p_s)
    bubble = bubble_fraction(pp, micro, v)
    if v == 1:
        ex.add(
            "step_time",
            "forward_backward_s",
            phase_s,
            f"({micro} micro-batches + {pp} stages - 1) x "
            f"(micro-batch {micro_s:.4g} + point-to-point {p2p_s:.4g}); bubble (p-1)/(m+p-1) = {bubble:.3g}",
        )
    else:
        ex.add(
            "step_time",
            "forward_backward_s",
            phase_s,
            f"({micro} micro-batches + ({pp} stages - 1) / {v} "
            f"chunks) x (micro-batch {micro_s:.4g} + point-to-point of {v} chunks {p2p_s:.4g}); interleaved "
            f"bubble (p-1)/(vm+p-1) = {bubble:.3g}",
        )
    return {"forward_backward_s": phase_s, "pipeline_bubble": bubble, "pipeline_p2p_s": p2p_s}
