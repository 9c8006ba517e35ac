"""Planner advice: one-line warnings where the practitioners' lessons apply, each with the number behind it.

`advise(config, plan)` returns the lines `pretrain plan` prints after its table (and `--json` under "advice").
Every rule, its threshold and its source is listed in docs/advice.md ("Planner advice"):
  memory     the config does not fit: the cheapest change that does, found by re-planning modified copies
  tokens     tokens per parameter < 5 or > 100 (Chinchilla's compute-optimal ~20)
  epochs     more than 4 passes over the same examples, the given corpus or a mixture's source, or a source
             past its max_epochs (Muennighoff et al. 2023)
  batch      tokens per step < 1/4 or > 8x GPT-3's batch for the size; >= 1M tokens per step with no ramp
  lr         peak learning rate more than 3x off the published peak for the size (GPT-3, LLaMA)
  warmup     warm-up outside 0.1-0.5 % of the steps (Zhao et al. 2023, LLM survey)
  mfu        a hardware.mfu / hfu given (overriding the step-time model) outside 0.3-0.55, no measured profile
             (PaLM's MFU table, Megatron-LM)
  bandwidth  the step's arithmetic intensity below the card's FLOP/byte ratio (the roofline model)
  context    windows of >= 32K tokens (mask attention to each document, Llama 3); RoPE's slowest wavelength
             shorter than the window, or the window beyond what model.rope_scaling stretches RoPE to
  fp8        train.precision=fp8 that converts no linear (on any device), or modelled below 1.10x bf16-mixed's
             speed (small GEMMs: plan/fp8.py)
Rules that describe large-scale practice (tokens, batch, lr, warm-up, bandwidth) are silent for models under
50M parameters (100M for the batch): demo and debug models are small and short on purpose.
A Mixture-of-Experts model is sized by its active parameters in the tokens, batch and lr rules (a token runs k of
its E routed experts: its compute per token, and the dense model it trains like, are those; DeepSeek-V3's 2.2e-4 at
671B total is a 37B model's rate), and each such line says so.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from ..config.key_doc import shown_value
from ..gpus import COMPUTE_DTYPE, gpu_spec
from ..units import GiB, human
from .activation_terms import COMPUTE_BYTES
from .corpus import MAX_EPOCHS, epochs_advice
from .fit_fixes import MAX_GPUS, fit_fixes
from .fp8 import advice as fp8_advice
from .kernels import planned_native_gqa
from .length import CHINCHILLA_TOKENS_PER_PARAM
from .long_context import context_advice
from .mixture import mixture_advice
from .muon import adamw_like_lr
from .muon_time import advice as muon_advice
from .traffic import kept_tensor_traffic, weight_reads

if TYPE_CHECKING:
    from ..config.schema import ResolvedConfig

TOKENS_PER_PARAM_RANGE = (5, 100)  # 4x below / 5x above Chinchilla; LLaMA-7B's 1T tokens is 148
SMALL_MODEL = 50_000_000  # below this, the size-dependent rules stay silent
BATCH_RULE_MIN_PARAMS = 100_000_000
BATCH_RANGE = (1 / 4, 8)  # of GPT-3's batch for the size; LLaMA and Qwen's 4M is 2x-8x GPT-3 at 0.5B-7B
RAMP_MIN_TOKENS = 1_000_000  # global batches from here on are ramped in GPT-3
LR_RANGE = 3.0  # x above or below the published peak for the size
# Linear warm-up over the first 0.1%-0.5% of the optimizer steps (Zhao et al. 2023, "A Survey of Large Language
# Models", arXiv:2303.18223).
WARMUP_RANGE = (0.001, 0.005)
WARMUP_MIN_STEPS = 1000  # shorter runs (smoke tests) warm up over more than a fraction of a percent
# End-to-end MFU: 21-46 % in PaLM's table 3 (GPT-3, Gopher, MT-NLG, PaLM), 52 % for Megatron-LM at 1T parameters
# (Narayanan et al. 2021).
MFU_RANGE = (0.3, 0.55)

# GPT-3 (Brown et al. 2020, table 2.1): parameters, batch size in tokens, peak learning rate. The table's
# "0.5M", "1M", "2M", "3.2M" are 256, 512, 1024 and 1536 sequences of 2048 tokens.
GPT3 = [
    (125e6, 2**19, 6.0e-4),
    (350e6, 2**19, 3.0e-4),
    (760e6, 2**19, 2.5e-4),
    (1.3e9, 2**20, 2.0e-4),
    (2.7e9, 2**20, 1.6e-4),
    (6.7e9, 2**21, 1.2e-4),
    (13e9, 2**21, 1.0e-4),
    (175e9, 1536 * 2048, 0.6e-4),
]
# LLaMA (Touvron et al. 2023, table 2): parameters, peak learning rate (batch 4M tokens at every size).
LLAMA_LR = [(6.7e9, 3.0e-4), (13e9, 3.0e-4), (32.5e9, 1.5e-4), (65.2e9, 1.5e-4)]


def _lr_reference() -> list[tuple[float, float]]:
    """Published peak LR by size: GPT-3 and LLaMA, the geometric mean where both trained that size."""
    by_size: dict[float, list[float]] = {}
    for n, _, lr in GPT3:
        by_size.setdefault(n, []).append(lr)
    for n, lr in LLAMA_LR:
        by_size.setdefault(n, []).append(lr)
    return [(n, math.prod(v) ** (1 / len(v))) for n, v in sorted(by_size.items())]


LR_REFERENCE = _lr_reference()
BATCH_REFERENCE = [(n, batch) for n, batch, _ in GPT3]


def loglog(points: Sequence[tuple[float, float]], x: float) -> float:
    """Interpolate y(x) linearly in log-log space; constant beyond the ends of the table."""
    if x <= points[0][0]:
        return points[0][1]
    for (x0, y0), (x1, y1) in zip(points, points[1:]):
        if x <= x1:
            f = (math.log(x) - math.log(x0)) / (math.log(x1) - math.log(x0))
            return math.exp(math.log(y0) + f * (math.log(y1) - math.log(y0)))
    return points[-1][1]


def advise(config: ResolvedConfig, plan: dict[str, Any]) -> list[str]:
    """The warnings for a config and its plan; empty when every rule is in range."""
    rules = (_memory, _tokens, _epochs, _batch, _lr, _warmup, _mfu, _bandwidth, fp8_advice, muon_advice)
    return [line for rule in rules for line in rule(config, plan)] + context_advice(config)


# --- the rules -----------------------------------------------------------------------------------------


def _sized(c: ResolvedConfig, p: dict[str, Any]) -> tuple[int, str]:
    """The parameters the size rules go by, and how a line names them: a dense model's all; an MoE's active ones."""
    pa, m = p["params"], c.model
    if not m.num_experts:
        return pa["total"], "params"
    return pa[
        "active"
    ], f"active params ({m.experts_per_token} of {m.num_experts} experts a token; {human(pa['total'])} in all)"


def _tokens(c: ResolvedConfig, p: dict[str, Any]) -> list[str]:
    (n, which), tokens = _sized(c, p), p["tokens"]["total"]
    if n < SMALL_MODEL:
        return []
    per_param = tokens / n
    per = "active parameter" if c.model.num_experts else "parameter"
    low, high = TOKENS_PER_PARAM_RANGE
    if low <= per_param <= high:
        return []
    # Same compute C = 6ND spent the Chinchilla way: D = 20 N, so C = 120 N^2.
    compute = 6 * n * tokens
    n_opt = math.sqrt(compute / (6 * CHINCHILLA_TOKENS_PER_PARAM))
    d_opt = CHINCHILLA_TOKENS_PER_PARAM * n_opt
    better = (
        f"for this compute (6ND = {compute:.3g} FLOPs{f', N the {which}' if c.model.num_experts else ''}) a model "
        f"of ~{human(n_opt)} {'active ' if c.model.num_experts else ''}params on ~{human(d_opt)} tokens would reach "
        "a lower loss"
    )
    if per_param < low:
        return [
            f"tokens: {per_param:.3g} tokens per {per}: {_times(CHINCHILLA_TOKENS_PER_PARAM / per_param)} "
            f"below the compute-optimal ~{CHINCHILLA_TOKENS_PER_PARAM} (Chinchilla, Hoffmann et al. 2022): "
            f"under-trained; {better}, or train on ~{human(CHINCHILLA_TOKENS_PER_PARAM * n)} tokens"
        ]
    return [
        f"tokens: {per_param:.3g} tokens per {per}: {_times(per_param / CHINCHILLA_TOKENS_PER_PARAM)} above "
        f"the compute-optimal ~{CHINCHILLA_TOKENS_PER_PARAM} (Chinchilla, Hoffmann et al. 2022); {better}. "
        "Fine if intended: a smaller model trained longer (as LLaMA did) is cheaper to serve"
    ]


def _epochs(c: ResolvedConfig, p: dict[str, Any]) -> list[str]:
    t = c.train
    if not t.examples:
        # the corpus given by data.raw_bytes or data.dir, or each source of a data.mixture
        return epochs_advice(p.get("data")) + mixture_advice(p.get("mixture"))
    unique = t.examples * t.seq_len
    epochs = p["tokens"]["total"] / unique
    if epochs <= MAX_EPOCHS:
        return []
    return [
        f"epochs: {epochs:.3g} passes over the same {human(unique)} tokens ({t.examples:,} examples x seq "
        f"{t.seq_len}): beyond ~{MAX_EPOCHS} epochs repeated tokens are worth much less than new ones "
        "(Muennighoff et al. 2023, 'Scaling Data-Constrained Language Models'; Xue et al. 2023, 'To Repeat or "
        "Not To Repeat'); add unique data or train a smaller model"
    ]


def _batch(c: ResolvedConfig, p: dict[str, Any]) -> list[str]:
    n, which = _sized(c, p)
    if n < BATCH_RULE_MIN_PARAMS:
        return []
    t, st = c.train, p["steps"]
    per_step = st["tokens_per_step"]
    ref = loglog(BATCH_REFERENCE, n)
    shape = (
        f"micro-batch {t.micro_batch_size} x seq {t.seq_len} x grad accum {t.grad_accum_steps} x data "
        f"parallel {p['parallel']['data']}"
    )
    gpt3 = f"the ~{human(ref)} GPT-3 used at {human(n)} {which} (Brown et al. 2020; LLaMA and Qwen: 4M)"
    out: list[str] = []
    ref = round(ref)  # whole tokens: 2**22 is exactly 8x GPT-3's 2**19, not a rounding error above it
    if per_step < ref * BATCH_RANGE[0]:
        accum = 2 ** math.ceil(math.log2(t.grad_accum_steps * ref / per_step))
        out.append(
            f"batch: {per_step:,} tokens per step ({shape}) is {_times(ref / per_step)} below {gpt3}: noisy "
            f"gradients and many small steps; train.grad_accum_steps={accum} gives "
            f"{human(per_step * accum / t.grad_accum_steps)} (or more parallel.gpus)"
        )
    elif per_step > ref * BATCH_RANGE[1]:
        unit = per_step // t.grad_accum_steps  # one micro-batch on every data-parallel rank
        batch = unit * max(1, round(ref / unit))
        fix = (
            f"train.global_batch_tokens={human(batch, 4)} ({batch:,}) keeps the batch there on any GPU count"
            if batch <= ref * BATCH_RANGE[1]
            else f"even one micro-batch per rank makes {human(unit)} tokens: "
            "fewer data-parallel ranks (parallel.tensor or parallel.pipeline)"
            + (" or a smaller train.micro_batch_size" if t.micro_batch_size > 1 else "")
        )
        out.append(
            f"batch: {per_step:,} tokens per step ({shape}) is {_times(per_step / ref)} above {gpt3}: "
            "beyond the critical batch size extra tokens per step stop reducing the number of steps needed; " + fix
        )
    if per_step >= RAMP_MIN_TOKENS and not t.batch_ramp_tokens:
        ramp = _round(min(4e9, 0.03 * p["tokens"]["total"]))
        out.append(
            f"batch: {human(per_step)} tokens per step from the first step (train.batch_ramp_tokens=0): "
            f"GPT-3 ramped from 32K tokens over the first 4-12B tokens (Brown et al. 2020, "
            f"appendix B); train.batch_ramp_tokens={_sci(ramp)} would ramp over "
            f"{_percent(ramp / p['tokens']['total'])} of the run (LLaMA used 4M from the start: a valid "
            "choice)"
        )
    return out


def _lr(c: ResolvedConfig, p: dict[str, Any]) -> list[str]:
    (n, which), lr = _sized(c, p), adamw_like_lr(c.train)
    if n < SMALL_MODEL:
        return []
    ref = loglog(LR_REFERENCE, n)
    if ref / LR_RANGE <= lr <= ref * LR_RANGE:
        return []
    how = f"{_times(lr / ref)} above" if lr > ref else f"{_times(ref / lr)} below"
    risk = "loss spikes and divergence" if lr > ref else "slow progress for the same tokens"
    return [
        f"lr: peak train.lr={lr:.2g} is {how} the ~{ref:.1e} published for {human(n)} {which} (GPT-3 table "
        f"2.1, LLaMA table 2, log-log interpolated; within 3x: {ref / LR_RANGE:.1e} to {ref * LR_RANGE:.1e}): "
        f"{risk}"
    ]


def _warmup(c: ResolvedConfig, p: dict[str, Any]) -> list[str]:
    st, w = p["steps"], c.train.warmup
    total, warm = st["total"], st["warmup"]
    if p["params"]["total"] < SMALL_MODEL or total < WARMUP_MIN_STEPS:
        return []
    low, high = WARMUP_RANGE
    if isinstance(w, float) and low <= w <= high:
        return []  # the fraction itself is in range; rounding to whole steps does not count
    fraction = warm / total
    if low * total - 1 <= warm <= high * total + 1:
        return []
    if warm == 0:
        what = "no warm-up"
    else:
        what = f"{fraction:.2%} of the steps ({warm:,} of {total:,})"
    return [
        f"warmup: {what}: LLMs warm up linearly over {low:.1%}-{high:.1%} of the steps (Zhao et al. 2023, "
        f"LLM survey), where "
        f"random initial weights give large gradients; train.warmup={high} would be "
        f"{round(high * total):,} steps"
    ]


def _mfu(c: ResolvedConfig, p: dict[str, Any]) -> list[str]:
    hw = c.hardware
    value = hw.hfu or hw.mfu
    if hw.profile or not p["time"]["seconds"] or not value:  # only a utilisation the user assumed
        return []
    key = "hfu" if hw.hfu else "mfu"
    low, high = MFU_RANGE
    if low <= value <= high:
        return []
    way = "optimistic: the time estimate is too short" if value > high else "pessimistic: the time estimate is too long"
    measured = p.get("mfu")
    how = (
        f"the measured speed gives MFU {measured:.3g}: set hardware.mfu={measured:.2g}"
        if measured
        else "measure the card with `pretrain bench` (hardware.profile) or a short run (measured.tokens_per_second)"
    )
    return [
        f"mfu: assumed hardware.{key}={value:g} is outside the {low}-{high} that end-to-end training reaches "
        f"with data loading, optimizer, communication and logging included (MFU 21-46 % in PaLM's table 3, "
        f"52 % for Megatron-LM): {way}; {how}"
    ]


def step_intensity(c: ResolvedConfig, p: dict[str, Any], b: int | None = None) -> tuple[float, float]:
    """FLOPs and a lower bound on bytes moved per GPU by one micro-batch of b sequences (forward + backward).

    Bytes: the matmul weights in the compute dtype read 3 times (forward, backward for the activations'
    gradients, backward for the weights' gradients; 4 with full recomputation, which reruns the forward)
    plus every tensor kept for backward written once and read once. Kernels move more than this, so the
    intensity FLOPs / bytes is an upper bound: when even it is below the card's ratio, the step is
    memory-bandwidth-bound."""
    m, t, par = c.model, c.train, c.parallel
    b = b or t.micro_batch_size
    model_parallel = par.tensor * par.pipeline
    flops = p["flops"]["per_token_hardware"] * b * t.seq_len / model_parallel
    weights = weight_reads(t) * COMPUTE_BYTES[t.precision] * p["params"]["flops"] / model_parallel
    traffic, _ = kept_tensor_traffic(m, t, par, b, native_gqa=planned_native_gqa(c), imbalance=c.plan.routing_imbalance)
    return flops, weights + traffic


def _bandwidth(c: ResolvedConfig, p: dict[str, Any]) -> list[str]:
    bandwidth = p["hardware"]["bandwidth_gbps"]
    peak = p["hardware"]["peak_tflops"]
    if not bandwidth or not peak or p["params"]["total"] < SMALL_MODEL:
        return []
    ratio = peak * 1e12 / (bandwidth * 1e9)
    t = c.train
    flops, moved = step_intensity(c, p)
    if flops / moved >= ratio:
        return []

    def bound(b: int) -> bool:
        f, m = step_intensity(c, p, b)
        return f / m >= ratio

    need, limit = None, 1 << 16
    hi = t.micro_batch_size
    while hi < limit and not bound(hi):
        hi *= 2
    if bound(hi):
        lo = hi // 2  # not compute-bound (or the current micro-batch)
        while hi - lo > 1:
            mid = (lo + hi) // 2
            lo, hi = (lo, mid) if bound(mid) else (mid, hi)
        need = hi
    largest = p["max_micro_batch_size"]
    if need is None:
        f, m = step_intensity(c, p, limit)
        fix = f"no micro-batch gets there: activation traffic alone caps it at {f / m:.3g} FLOP/byte"
    elif largest is not None and need <= largest:
        fix = (
            f"micro-batch >= {need} would be compute-bound and fits (largest that fits: {largest}; lower "
            "train.grad_accum_steps to keep the global batch)"
        )
    else:
        fix = (
            f"micro-batch >= {need} would be compute-bound but does not fit (largest that fits: {largest}); "
            "a longer train.seq_len raises the intensity too"
        )
    reads, card = weight_reads(t), gpu_spec(c.hardware.gpu).name
    return [
        f"bandwidth: micro-batch {t.micro_batch_size} x seq {t.seq_len} moves {moved / 1e9:.3g} GB (weights "
        f"read {reads}x in {COMPUTE_DTYPE[t.precision]}, activations written and read back) for "
        f"{flops / 1e9:.3g} GFLOP: {flops / moved:.3g} FLOP/byte, below the {card}'s {ratio:.0f} "
        f"({peak:g} TFLOP/s / {bandwidth:,.0f} GB/s): memory-bandwidth-bound, the assumed "
        f"utilisation is out of reach; {fix}"
    ]


# --- does not fit: search for the cheapest change --------------------------------------------------------


def _memory(c: ResolvedConfig, p: dict[str, Any]) -> list[str]:
    if p["fits"] is not False:
        return []
    head = (
        f"memory: does not fit: {p['memory_bytes']['total'] / GiB:.1f} GiB > {p['usable_memory_bytes'] / GiB:.1f} "
        "GiB usable"
    )
    fixes = fit_fixes(c)
    if not fixes:
        offload = "parallel.offload=optimizer (planned only) or " if c.parallel.offload == "none" else ""
        return [
            f"{head}; no fix found by recomputation, a smaller micro-batch, ZeRO, up to {MAX_GPUS:,} GPUs or "
            f"tensor parallel 8: try {offload}a card with more memory"
        ]
    shown: list[str] = []
    for overrides, q in fixes:
        text = " ".join(f"{k}={shown_value(v)}" for k, v in overrides.items())
        notes = [f"{q['memory_bytes']['total'] / GiB:.1f} GiB"]
        if q["steps"]["tokens_per_step"] != p["steps"]["tokens_per_step"]:
            notes.append(
                f"global batch {human(q['steps']['tokens_per_step'])} tokens, was "
                f"{human(p['steps']['tokens_per_step'])}"
            )
        if "parallel.tensor" in overrides and c.model.family != "llama":
            notes.append("planned only: `pretrain train` runs tensor parallelism for the LLaMA family")
        shown.append(f"{text} ({'; '.join(notes)})")
    return [f"{head}; cheapest fix: {shown[0]}" + "".join(f"; or: {s}" for s in shown[1:])]


def _times(x: float) -> str:
    return f"{x:,.0f}x" if x >= 100 else f"{x:.3g}x"


def _round(x: float) -> float:
    """One significant figure: 4e9, 3e8."""
    if x <= 0:
        return 0.0
    e = math.floor(math.log10(x))
    return round(x / 10**e) * 10**e


def _sci(x: float) -> str:
    """4000000000.0 -> '4e9': a number a config override reads back."""
    e = math.floor(math.log10(x))
    return f"{x / 10**e:g}e{e}"


def _percent(x: float) -> str:
    """Two significant figures: 3%, 0.4%, 0.04% (a fixed number of decimals would print 0.0%)."""
    return f"{x * 100:.2g}%"
