"""The pipeline's share of the step-time model (pretrain.plan.step_time): a step's micro-batches in the
schedule's slots, each slot also sending activations on and gradients back. Pure Python."""

from __future__ import annotations

import math
from typing import TYPE_CHECKING, Any

from ..gpus import gpu_spec
from .activation_terms import COMPUTE_BYTES
from .collectives import links
from .explain import Explain
from .stages import bubble_fraction, chunks_per_stage, stage_layers

if TYPE_CHECKING:
    from ..config.schema import ResolvedConfig
    from .params import ParamCounts

TILE_ROWS = 128  # a GEMM's tile of M rows (as pretrain.plan.step_time's)


def output_layer_seconds(c: ResolvedConfig, counts: ParamCounts, fl: dict[str, Any], rate: float) -> float:
    """One micro-batch's output-layer matmul, 6 V H FLOPs a token over the tensor ranks, at the large-GEMM rate:
    what the last pipeline stage runs besides its blocks; with multi-token prediction its modules too (Megatron
    and DeepSeek-V3 place them after the last block: their block, projection and second output-layer pass)."""
    m = c.model
    tokens = c.train.micro_batch_size * c.train.seq_len
    tile = tokens / (TILE_ROWS * math.ceil(tokens / TILE_ROWS)) if gpu_spec(c.hardware.gpu).name != "cpu" else 1.0
    mtp_attention = fl["attention_per_token"] * m.mtp_layers // (m.num_layers + m.mtp_layers)
    per_token = 6 * (counts.vocab_hidden + counts.mtp_active) + mtp_attention
    return per_token * tokens / c.parallel.tensor / (rate * 1e12 * tile)


def busiest_stage(c: ResolvedConfig, micro_s: float, output_s: float) -> float:
    """The busiest pipeline rank's micro-batch over the average rank's: every micro-batch passes each rank in turn,
    so the slowest sets the pace of every slot. micro_s: the average rank's seconds (all blocks and the output
    layer over p); output_s: the output layer's matmul, which runs on the last rank only. With few active
    parameters per stage (MoE) it is a large share of that rank's work (gpt-oss-120b on 4 stages: 0.58B of the
    last stage's 1.9B active), though, at one large GEMM's rate, less of its time than of its FLOPs. Blocks split
    over p x v chunks (rank k holding chunks k, k + p, ... under interleaving) as parallel.pipeline_split says:
    `even` as the trainer splits them (stages.stage_layers), `balanced` with the embedding and the output layer
    counted as one block each (Megatron's account_for_embedding/loss_in_pipeline_split; Llama 3's first and last
    stages one block short, Dubey et al. 2024, section 3.3.2), and so is each multi-token prediction module, which
    output_s carries to the last stage."""
    m, pp, v = c.model, c.parallel.pipeline, chunks_per_stage(c.parallel)
    if pp == 1 or not micro_s:
        return 1.0
    block_s = (micro_s * pp - output_s) / m.num_layers
    balanced = c.parallel.pipeline_split == "balanced"
    extra = 2 + m.mtp_layers  # the embedding's, the output layer's and each MTP module's places
    chunks = [len(chunk) for chunk in stage_layers(m.num_layers + (extra if balanced else 0), pp * v)]
    if balanced:  # those places are no blocks (Megatron's layout for DeepSeek-V3: Et|(tt|)*30mL)
        chunks[0], chunks[-1] = chunks[0] - 1, max(0, chunks[-1] - 1 - m.mtp_layers)
    work = [0.0] * pp
    for i, blocks in enumerate(chunks):
        work[i % pp] += blocks * block_s
    work[-1] += output_s
    return max(work) / micro_s


def pipeline_time(c: ResolvedConfig, micro_s: float, busiest: float, ex: Explain) -> dict[str, Any]:
    """1F1B: m micro-batches in m + p - 1 slots, each slot also sending activations on and gradients back.
    Interleaved 1F1B with v chunks per stage: m + (p - 1) / v slots, each sending v times (Narayanan et al.
    2021, section 2.2.2). A slot lasts the busiest rank's micro-batch: `busiest` x the average's."""
    t, par = c.train, c.parallel
    micro_s *= busiest
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
            f"(micro-batch {micro_s:.4g} + point-to-point {p2p_s:.4g}); bubble (p-1)/(m+p-1) = {bubble:.3g}"
            + (f"; the busiest stage {busiest:.4g} x the average (the output layer)" if busiest != 1 else ""),
        )
    else:
        ex.add(
            "step_time",
            "forward_backward_s",
            phase_s,
            f"({micro} micro-batches + ({pp} stages - 1) / {v} "
            f"chunks) x (micro-batch {micro_s:.4g} + point-to-point of {v} chunks {p2p_s:.4g}); interleaved "
            f"bubble (p-1)/(vm+p-1) = {bubble:.3g}"
            + (f"; the busiest rank {busiest:.4g} x the average (the output layer)" if busiest != 1 else ""),
        )
    out = {"forward_backward_s": phase_s, "pipeline_bubble": bubble, "pipeline_p2p_s": p2p_s}
    return {**out, "pipeline_busiest_stage": busiest} if pp > 1 else out
