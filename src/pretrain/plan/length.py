"""Tokens, bytes on disk, optimizer steps and wall-clock time of a run.

Chinchilla (Hoffmann et al. 2022): compute-optimal training uses ~20 tokens per parameter.
Storage: a token id takes 2 bytes when the vocabulary fits in uint16 (<= 65,536 ids), else 4 (uint32): the
flat array `pretrain prepare` writes, holding each example once however many epochs read it. Steps as the
Hugging Face Trainer counts them for a fixed dataset: epochs x floor(ceil(examples / (micro-batch x ranks)) /
grad accum) (transformers' trainer.py: `len_dataloader // gradient_accumulation_steps` per epoch; a
practitioner's two Trainer logs read 16,527,707 examples, 3 epochs, batch 8 -> 6,197,892 and 826,279
examples, batch 1 x accum 8 -> 309,852 "Total optimization steps"); with a batch ramp, whose early steps are
smaller, the steps our trainer needs to see examples x epochs x seq_len tokens.
Time: steps x the step-time model's seconds per step (pretrain.plan.step_time), within the model's own error on
published runs (STEP_TIME_ERROR); or, with hardware.mfu / hardware.hfu given (an explicit override of the model),
FLOPs / (GPUs x peak FLOP/s x utilisation).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from ..config.schema import ResolvedConfig
from .explain import Explain, fmt
from .schedule import steps_for_tokens, tokens_for_steps, warmup_steps

if TYPE_CHECKING:
    from ..config.schema import ResolvedTrainConfig

CHINCHILLA_TOKENS_PER_PARAM = 20
# The step-time model's own error, measured: predicted / measured tokens/s per GPU on the 41 dense published runs
# of tests/plan/published_runs.yaml (the shared golden set's 25 and our 16), 10th and 90th percentile
# (benchmarks/published_runs.py, statistics.quantiles, 2026-11-28; geometric mean 0.97). A ratio r means the run
# takes r x the planned time, so the plan's time range is seconds x (low, high). Re-measure when
# pretrain.plan.step_time changes (tests/plan/test_published_runs.py checks it).
STEP_TIME_ERROR = (0.79, 1.13)
# The same on its 16 Mixture-of-Experts runs (the shared MoE golden set's 9 and our 7; geometric mean 1.08, issue
# #41's second pass): an MoE plan carries its own, wider error (its top decile: the two Nous torchtitan runs).
MOE_STEP_TIME_ERROR = (0.78, 1.96)


# The token files' id types and the ids each holds; `pretrain prepare --dtype auto` takes the smallest that
# holds the vocabulary, and the planner counts storage by the same rule.
TOKEN_DTYPE_BYTES = {"uint16": 2, "uint32": 4}
TOKEN_DTYPES = {name: 1 << 8 * width for name, width in TOKEN_DTYPE_BYTES.items()}


def token_dtype(vocab_size: int) -> str:
    """uint16 when every id fits (vocab_size <= 65,536), else uint32."""
    return "uint16" if vocab_size <= TOKEN_DTYPES["uint16"] else "uint32"


def token_bytes(vocab_size: int) -> int:
    return TOKEN_DTYPE_BYTES[token_dtype(vocab_size)]


def storage_bytes(tokens: int, vocab_size: int) -> int:
    """Size of the `.bin` file holding `tokens` token ids (what `pretrain prepare` writes)."""
    return tokens * token_bytes(vocab_size)


def ramp_args(cfg: ResolvedConfig) -> dict[str, Any]:
    t, par = cfg.train, cfg.parallel
    return dict(
        seq_len=t.seq_len,
        micro_batch_size=t.micro_batch_size,
        data_parallel=par.data_parallel,
        grad_accum_steps=t.grad_accum_steps,
        ramp_tokens=t.batch_ramp_tokens,
        ramp_start=t.batch_ramp_start,
    )


def _epochs_length(t: ResolvedTrainConfig, args: dict[str, Any], per_step: int, ex: Explain) -> tuple[int, int]:
    """(tokens, steps) of train.examples x train.epochs."""
    assert t.examples  # the caller's branch
    tokens = t.examples * t.epochs * t.seq_len
    if t.batch_ramp_tokens:  # ramped steps are smaller: count them as the trainer runs them, by tokens
        steps = steps_for_tokens(tokens, **args)
        ex.add("steps", "total", steps, _steps_formula(tokens, per_step, t))
    else:
        # The Hugging Face Trainer's count: batches per rank per epoch, then whole accumulation groups.
        batches = -(-t.examples // (t.micro_batch_size * args["data_parallel"]))
        steps = t.epochs * max(1, batches // t.grad_accum_steps)
        ex.add(
            "steps",
            "total",
            steps,
            f"epochs {t.epochs} x floor(ceil(examples {t.examples:,} / (micro-batch "
            f"{t.micro_batch_size} x data parallel {args['data_parallel']})) / grad accum {t.grad_accum_steps})",
        )
    ex.add("tokens", "total", tokens, f"examples {t.examples:,} x epochs {t.epochs} x seq {t.seq_len}")
    return tokens, steps


def training_length(cfg: ResolvedConfig, params: int, ex: Explain | None = None) -> dict[str, Any]:
    """Tokens and optimizer steps of the run: max_steps, else tokens, else examples x epochs, else Chinchilla's 20
    tokens per parameter. params: the active parameters (all of a dense model's; an MoE token runs k of its E
    routed experts, and its compute per token, which Chinchilla trades against tokens, is theirs)."""
    ex = ex or Explain()
    t = cfg.train
    args = ramp_args(cfg)
    per_step = args["seq_len"] * args["micro_batch_size"] * args["data_parallel"] * args["grad_accum_steps"]
    examples_per_step = per_step // t.seq_len
    chinchilla = CHINCHILLA_TOKENS_PER_PARAM * params
    ex.add(
        "tokens",
        "tokens_per_step",
        per_step,
        f"seq {t.seq_len} x micro-batch {t.micro_batch_size} x grad accum {t.grad_accum_steps} "
        f"x data parallel {args['data_parallel']}",
    )
    data = None  # tokens the .bin holds, when the run gives them apart from the tokens trained on
    if t.max_steps:
        steps = t.max_steps
        tokens = tokens_for_steps(steps, **args)
        ex.add("steps", "total", steps, "train.max_steps")
        ex.add("tokens", "total", tokens, f"{steps:,} steps of up to {per_step:,} tokens (batch ramp included)")
    elif t.tokens:
        tokens = t.tokens
        steps = steps_for_tokens(tokens, **args)
        ex.add("tokens", "total", tokens, "train.tokens")
        ex.add("steps", "total", steps, _steps_formula(tokens, per_step, t))
    elif t.examples:
        tokens, steps = _epochs_length(t, args, per_step, ex)
        data = t.examples * t.seq_len  # every epoch re-reads the same windows
    else:
        tokens = chinchilla
        steps = steps_for_tokens(tokens, **args)
        ex.add(
            "tokens",
            "total",
            tokens,
            "no length given: Chinchilla's 20 tokens per "
            + ("active parameter" if cfg.model.num_experts else "parameter"),
        )
        ex.add("steps", "total", steps, _steps_formula(tokens, per_step, t))
    warm = warmup_steps(t.warmup, steps)
    ex.add(
        "steps",
        "warmup",
        warm,
        f"train.warmup {t.warmup}" + (f" x {steps:,} steps" if isinstance(t.warmup, float) else ""),
    )
    which = "active parameters" if cfg.model.num_experts else "parameters"
    ex.add("tokens", "chinchilla", chinchilla, f"20 x {params:,} {which} (Hoffmann et al. 2022)")
    return dict(
        tokens=tokens,
        steps=steps,
        tokens_per_step=per_step,
        examples_per_step=examples_per_step,
        warmup=warm,
        chinchilla=chinchilla,
        data_tokens=tokens if data is None else data,
    )


def _steps_formula(tokens: int, per_step: int, t: ResolvedTrainConfig) -> str:
    if not t.batch_ramp_tokens:
        return f"ceil(tokens {tokens:,} / tokens per step {per_step:,})"
    start = min(t.batch_ramp_start, per_step)
    return (
        f"steps until {tokens:,} tokens are seen, the batch growing from {start:,} to {per_step:,} tokens per "
        f"step over the first {t.batch_ramp_tokens:,} tokens (train.batch_ramp_tokens)"
    )


def tokens_per_gpu_second(
    cfg: ResolvedConfig, model_pt: float, hardware_pt: float, peak: float, step: dict[str, Any]
) -> tuple[Any, ...]:
    """(tokens one GPU trains per second, the utilisation behind it, where it comes from) in the plan's time:
    hardware.hfu or hardware.mfu when given, else the step-time model's (`step`: pretrain.plan.step_time's)."""
    hw = cfg.hardware
    if hw.hfu:
        return peak * 1e12 * hw.hfu / hardware_pt, hw.hfu, "hardware.hfu (override of the step-time model)"
    if hw.mfu:
        return peak * 1e12 * hw.mfu / model_pt, hw.mfu, "hardware.mfu (override of the step-time model)"
    return step["tokens_per_second"] / cfg.parallel.gpus, step["mfu"], "step-time model"


def wall_clock(
    cfg: ResolvedConfig,
    length: dict[str, Any],
    model_pt: float,
    hardware_pt: float,
    peak_tflops: float | None,
    step: dict[str, Any] | None,
    ex: Explain,
) -> dict[str, Any]:
    """The run's time: length's steps x step["seconds"], or its tokens at hardware.mfu / hfu when given."""
    hw, gpus = cfg.hardware, cfg.parallel.gpus
    if not peak_tflops or step is None:  # step_time models a step wherever there is a peak
        ex.add("time", "seconds", None, "no peak FLOP/s for this device: set hardware.profile or hardware.peak_tflops")
        return dict(
            seconds=None,
            days=None,
            gpu_hours=None,
            cost=None,
            tokens_per_second=None,
            utilisation=None,
            seconds_range=None,
        )
    tokens, steps = length["tokens"], length["steps"]
    per_gpu, util, what = tokens_per_gpu_second(cfg, model_pt, hardware_pt, peak_tflops, step)
    if not (hw.hfu or hw.mfu):
        error, name = (MOE_STEP_TIME_ERROR, "MOE_STEP_TIME_ERROR") if cfg.model.num_experts else (STEP_TIME_ERROR, "")
        seconds, low_high = steps * step["seconds"], [steps * step["seconds"] * r for r in error]
        ex.add(
            "time", "seconds", seconds, f"{steps:,} steps x step_time.seconds {step['seconds']:.4g} (MFU {util:.3g})"
        )
        ex.add(
            "time",
            "seconds_range",
            " to ".join(fmt(x) for x in low_high),
            f"x {error[0]} to x {error[1]}: the step-time model's predicted / measured tokens/s on published "
            f"{'MoE' if name else 'dense'} runs, 10th to 90th percentile ({name or 'STEP_TIME_ERROR'})",
        )
    else:
        flops, kind = (hardware_pt, "hardware") if hw.hfu else (model_pt, "model")
        seconds, low_high = tokens / (gpus * per_gpu), None
        ex.add(
            "time",
            "seconds",
            seconds,
            f"{tokens:,} tokens x {flops:.4g} {kind} FLOPs/token / ({gpus} GPUs x "
            f"{peak_tflops} TFLOP/s x {util}): {what}; no error range, the utilisation is the one given",
        )
    ex.add("time", "days", seconds / 86400, f"{seconds:.4g} s / 86,400")
    gpu_hours = seconds * gpus / 3600
    ex.add("time", "gpu_hours", gpu_hours, f"{seconds:.4g} s x {gpus} GPUs / 3,600")
    cost = gpu_hours * hw.price_per_gpu_hour if hw.price_per_gpu_hour else None
    if cost is not None:
        ex.add("time", "cost", cost, f"{gpu_hours:,.1f} GPU-hours x {hw.price_per_gpu_hour} per GPU-hour")
    return dict(
        seconds=seconds,
        seconds_range=low_high,
        days=seconds / 86400,
        gpu_hours=gpu_hours,
        cost=cost,
        tokens_per_second=tokens / seconds,
        utilisation=util,
        basis=what,
    )
