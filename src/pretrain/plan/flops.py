"""Training FLOPs per token, in the conventions papers use, and what a measured speed means in MFU/HFU.

Model FLOPs (MFU convention of PaLM, Chowdhery et al. 2022, appendix B, and torchtitan):
    per_token = 6 * N + 12 * L * n_heads * head_dim * seq
where N excludes the input-embedding lookup (a tied output layer still counts: it is a V*H matmul), and the
second term is attention's QK^T and AV (forward 4*L*H*seq, backward twice that). PaLM counts it over the full
seq x seq square; `flops.causal_attention: true` halves it, as causal kernels only compute the lower half.
GPT-3 and Chinchilla count 6 * N * D with N = all parameters (`per_token_6n`).

Mixture-of-Experts: N and the 6N count are the ACTIVE parameters (pretrain.plan.params: the router, the shared
experts and k of the E routed experts per token), as MFU must be: a token never runs the other experts (prime-rl
#778 computed it on total parameters). The plan states MoE per-token FLOPs under each convention in use, with and
without causal halving (`flops.moe`), because their ratio moves an MoE run's MFU the most: its attention is a
large share of the little compute per token. Multi-head latent attention has query/key heads of head_dim and
value heads of v_head_dim, so its attention term is 6 * L * n_heads * (head_dim + v_head_dim) * seq.

Hardware FLOPs add what recomputation does again (Korthikanti et al. 2022). The papers' full recomputation
repeats the whole forward (8 * N * D, kept as `per_token_hardware_6n`). Ours checkpoints each block, so what
runs again is every block's forward but the output layer's, and torch's checkpoint stops re-running a block
once it has every tensor backward needs: the MLP's down projection (the block's last matmul, whose output
backward never needs) is skipped unless dropout keeps a mask after it. Selective recomputation (operator-level,
pretrain.distributed.recompute) keeps the outputs of attention and of every other matmul and repeats the rest:
of the matmuls, the attention output projection (its output makes the second norm's input), the down projection
again only under dropout, and eager attention's batched matmuls (SDPA's outputs are kept). A FLOP counter over
a real training step agrees with these counts (tests/plan/test_flops_vs_measured.py).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from .documents import attention_context
from .explain import Explain
from .params import expert_width, moe_layers

if TYPE_CHECKING:
    from ..config.schema import ResolvedConfig, ResolvedModelConfig
    from .params import ParamCounts


def flops(cfg: ResolvedConfig, counts: ParamCounts, tokens: int, ex: Explain) -> dict[str, Any]:
    m, t = cfg.model, cfg.train
    N = counts.flops
    v_dim = m.v_head_dim or m.head_dim
    causal = cfg.flops.causal_attention
    attention, full_attention, lengths_from, context = _attention_per_token(cfg, v_dim, ex)
    per_token = 6 * N + attention
    active = " active" if counts.inactive else ""
    ex.add(
        "flops",
        "per_token",
        per_token,
        f"6 x N {N:,} (all{active} but the input-embedding lookup) + attention {attention:,}",
    )
    per_token_6n = 6 * counts.active
    ex.add(
        "flops",
        "per_token_6n",
        per_token_6n,
        f"6 x all{active} parameters {counts.active:,} (GPT-3 / "
        "Chinchilla)" + (f"; over all {counts.total:,} it would be {6 * counts.total:.4g}" if active else ""),
    )

    recompute = t.activation_checkpointing
    extra, extra_6n = _recomputed(cfg, counts, attention, v_dim, ex)
    per_token_hw = per_token + extra
    ex.add(
        "flops",
        "per_token_hardware",
        per_token_hw,
        f"per_token + recomputed forward {extra:,} ({recompute} recomputation)",
    )
    out: dict[str, Any] = dict(
        per_token=per_token,
        per_token_no_attention=6 * N,
        per_token_6n=per_token_6n,
        attention_per_token=attention,
        per_token_hardware=per_token_hw,
        per_token_hardware_6n=per_token_6n + extra_6n,
        total=per_token * tokens,
        total_no_attention=6 * N * tokens,
        total_6n=per_token_6n * tokens,
        total_hardware=per_token_hw * tokens,
        total_hardware_6n=(per_token_6n + extra_6n) * tokens,
        convention=(
            "per_token: 6 x (parameters - input embedding) + attention "
            f"({'causal, halved' if causal else 'full square, PaLM'}); per_token_6n: 6 x all parameters; "
            "hardware: + recomputed forward (blocks but their down projections; 6n: 8 N D with full "
            "recomputation)"
        ),
    )
    if counts.inactive:
        out["moe"] = _moe_conventions(counts, full_attention, ex)
    if t.document_masking:  # keys per query of the masked window (seq: lengths unknown, the upper bound)
        out["attention_context"] = context
    if lengths_from is not None:  # the masked window's attention: its documents' squares, from these lengths
        out["document_lengths"] = lengths_from
        out["convention"] += (
            "; attention over each window's documents (document masking): sum L_i^2 / seq "
            "keys per query, the pairs a block-sparse kernel computes"
        )
    ex.add("flops", "total", out["total"], f"per_token {per_token:,} x tokens {tokens:,}")
    ex.add("flops", "total_6n", out["total_6n"], f"6 x {counts.active:,} x {tokens:,}")
    if recompute == "full":
        ex.add("flops", "total_hardware_6n", out["total_hardware_6n"], f"8 x {counts.active:,} x {tokens:,}")
    return out


def _attention_per_token(cfg: ResolvedConfig, v_dim: int, ex: Explain) -> tuple[int, int, str | None, float]:
    """Attention's FLOPs per token as counted (halved when causal) and over the full square, where the
    document lengths of its context came from (None: no document masking, the whole sequence), and that
    context (keys per query)."""
    m, t = cfg.model, cfg.train
    context, lengths_from = attention_context(cfg, ex)  # seq, or sum L_i^2 / seq with document masking
    full_attention = round(6 * m.num_layers * m.num_heads * (m.head_dim + v_dim) * context)
    causal = cfg.flops.causal_attention
    attention = full_attention // 2 if causal else full_attention
    heads = (
        f"6 x L {m.num_layers} x heads {m.num_heads} x (head_dim {m.head_dim} + v_head_dim {v_dim})"
        if v_dim != m.head_dim
        else f"12 x L {m.num_layers} x heads {m.num_heads} x head_dim {m.head_dim}"
    )
    keys = f"seq {t.seq_len}" if lengths_from is None else f"context {context:,.1f} (document masking)"
    ex.add(
        "flops",
        "attention_per_token",
        attention,
        f"{heads} x {keys}" + (" / 2 (causal)" if causal else " (PaLM: full square)"),
    )
    return attention, full_attention, lengths_from, context


def _recomputed(cfg: ResolvedConfig, counts: ParamCounts, attention: int, v_dim: int, ex: Explain) -> tuple[int, int]:
    """What recomputation adds per token (our convention, and 6N's): full re-runs each block's forward (a third
    of its FLOPs) but the last matmul; selective, the output projections (and what dropout or eager attention
    makes it run again)."""
    m, t = cfg.model, cfg.train
    recompute = t.activation_checkpointing
    extra = extra_6n = 0
    if recompute == "full":
        skipped = 0 if m.dropout else _down_projections(m)
        extra = 2 * (counts.active_blocks - skipped) + attention // 3
        extra_6n = 2 * counts.active
        blocks = (
            f"L {m.num_layers} x per-layer {counts.per_layer:,}"
            if not counts.inactive
            else f"the blocks' active parameters {counts.active_blocks:,}"
        )
        ex.add(
            "flops",
            "recomputed_per_token",
            extra,
            f"2 x ({blocks} - down projections {skipped:,}, not re-run) + attention forward {attention // 3:,}",
        )
    elif recompute == "selective":
        projections = m.num_layers * m.num_heads * v_dim * m.hidden_size
        down = _down_projections(m) if m.dropout else 0
        again = attention // 3 if t.attention == "eager" else 0
        extra = extra_6n = 2 * (projections + down)
        extra += again
        ex.add(
            "flops",
            "recomputed_per_token",
            extra,
            f"2 x (output projections L {m.num_layers} x {m.num_heads * v_dim} x {m.hidden_size}"
            + (f" + down projections {down:,} (dropout keeps a mask after them)" if down else "")
            + ")"
            + (f" + eager attention's forward {again:,}" if again else ""),
        )
    return extra, extra_6n


def _down_projections(m: ResolvedModelConfig) -> int:
    """Down-projection weights a token runs per pass: each dense block's, and in an MoE block those of its k
    routed and its shared experts."""
    sparse = moe_layers(m)
    experts = m.experts_per_token + m.num_shared_experts
    return (m.num_layers - sparse) * m.intermediate_size * m.hidden_size + sparse * experts * expert_width(
        m
    ) * m.hidden_size


def _moe_conventions(counts: ParamCounts, full_attention: int, ex: Explain) -> dict[str, Any]:
    """An MoE token's FLOPs under each convention in use: ours (6 x active non-embedding N + attention) with the
    attention square full (PaLM, torchtitan) or halved (causal kernels), and 6N over the active parameters
    (GPT-3, Chinchilla) or, the mistake to avoid, over all of them. MFU scales with the one chosen."""
    N = counts.flops
    out: dict[str, Any] = dict(
        per_token_full_attention=6 * N + full_attention,
        per_token_causal_attention=6 * N + full_attention // 2,
        per_token_6n_active=6 * counts.active,
        per_token_6n_total=6 * counts.total,
    )
    out["full_over_causal"] = out["per_token_full_attention"] / out["per_token_causal_attention"]
    ex.add(
        "flops",
        "moe conventions",
        out["full_over_causal"],
        f"6N + attention full {out['per_token_full_attention']:,} / causal {out['per_token_causal_attention']:,}; "
        f"6N over active {out['per_token_6n_active']:,}, over total {out['per_token_6n_total']:,} "
        f"({out['per_token_6n_total'] / out['per_token_6n_active']:.3g}x: MFU on total parameters overstates "
        "an MoE run by this)",
    )
    return out


def basis(cfg: ResolvedConfig, fl: dict[str, Any]) -> tuple[int, int, str]:
    """(model FLOPs per token, hardware FLOPs per token, name) under `flops.convention`."""
    if cfg.flops.convention == "6n":
        return fl["per_token_6n"], fl["per_token_hardware_6n"], "6n: 6 x all parameters"
    return fl["per_token"], fl["per_token_hardware"], "palm: 6 x N + attention"


def mfu(tokens_per_second: float, flops_per_token: float, gpus: int, peak_tflops: float | None) -> float | None:
    """Model FLOPs utilisation: the model FLOPs a job does per second per GPU over the GPU's peak (PaLM,
    Chowdhery et al. 2022, appendix B). One rule for the plan, the trainer's log, the sweep and the bench."""
    if not peak_tflops:
        return None
    return tokens_per_second * flops_per_token / (gpus * peak_tflops * 1e12)


def utilisation(
    cfg: ResolvedConfig, fl: dict[str, Any], tokens_per_step: int, peak_tflops: float | None, ex: Explain
) -> dict[str, Any] | None:
    """Achieved TFLOP/s per GPU, MFU and HFU from a measured speed of the whole job."""
    ms = cfg.measured
    if ms.tokens_per_second:
        tps, how = ms.tokens_per_second, f"measured {ms.tokens_per_second:,} tokens/s"
    elif ms.iterations_per_second:
        tps = ms.iterations_per_second * tokens_per_step
        how = f"{ms.iterations_per_second} it/s x {tokens_per_step:,} tokens per step"
    elif ms.step_time_seconds:
        tps = tokens_per_step / ms.step_time_seconds
        how = f"{tokens_per_step:,} tokens per step / {ms.step_time_seconds} s"
    else:
        return None
    model_pt, hw_pt, name = basis(cfg, fl)
    gpus = cfg.parallel.gpus
    achieved = tps * model_pt / gpus / 1e12
    achieved_hw = tps * hw_pt / gpus / 1e12
    ex.add("measured", "tokens_per_second", tps, how)
    ex.add(
        "measured",
        "achieved_tflops_per_gpu",
        achieved,
        f"{tps:,.6g} tokens/s x {model_pt:,} FLOPs/token ({name}) / {gpus} GPUs / 1e12",
    )
    out: dict[str, Any] = dict(
        tokens_per_second=tps,
        achieved_tflops_per_gpu=achieved,
        achieved_hardware_tflops_per_gpu=achieved_hw,
        mfu=None,
        hfu=None,
    )
    if peak_tflops:
        out["mfu"] = mfu(tps, model_pt, gpus, peak_tflops)
        out["hfu"] = achieved_hw / peak_tflops
        ex.add("measured", "mfu", out["mfu"], f"{achieved:.4g} / peak {peak_tflops} TFLOP/s")
        ex.add("measured", "hfu", out["hfu"], f"{achieved_hw:.4g} (with recomputation) / peak {peak_tflops} TFLOP/s")
    return out
