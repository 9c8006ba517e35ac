"""Budget mode: what a budget of GPU time buys (`budget.gpu_hours`, `budget.days`, or `budget.cost`).

Compute: C = GPU-seconds x 6N x the tokens one GPU trains per second, by the plan's own time of the candidate
model's config (pretrain.plan.length.tokens_per_gpu_second: the step-time model, or hardware.mfu / hfu when
given), so that the plan of the model chosen takes the budget's time (the GPU-seconds and what each buys:
pretrain.plan.budget_compute). The speed depends on the model and the model on the compute: from the config as
given, the shape is chosen again at its own speed until it stays the same (ROUNDS at most).
Compute-optimal size: Hoffmann et al. 2022 ("Training Compute-Optimal Large Language Models"), approaches 1
and 2 (their table 2: N_opt ~ C^a with a = 0.50 and 0.49, D_opt ~ C^b with b = 0.50 and 0.51), taken as
a = b = 0.5 with their ~20 tokens per parameter (table 3) and C = 6 N D:
    N_opt = sqrt(C / 120),  D_opt = 20 N_opt.
A shape near N_opt by the conventions of the LLaMA family (Touvron et al. 2023; LLaMA-3 for the key/value
heads), vocabulary and context kept from the config:
    head_dim 128, heads = H / 128, H a multiple of 128; about 128 of width per layer (LLaMA-7B 4096 / 32,
    13B 5120 / 40) for the width, then the layer count that lands nearest N_opt;
    intermediate = 8/3 H rounded up to a multiple of 256 (LLaMA's multiple_of: 4096 -> 11,008);
    8 key/value heads (grouped-query attention, LLaMA-2 70B and LLaMA-3), or 4 where 8 does not divide the
    heads (H a multiple of 512 from 1,024 on), one per head below 8 heads; untied embeddings, SwiGLU, RMSNorm.
The shape is trained on D = C / (6 N) tokens, its own share of the compute. Whether it fits on the GPUs is the
ordinary plan's answer; when it does not, the cheapest fix on the same GPUs from pretrain.plan.fit_fixes
(recomputation, micro-batch, ZeRO, tensor parallelism) is applied.
Inference-aware row: half the parameters on twice the tokens (80 tokens per parameter, near LLaMA-13B's 1T /
13B = 77), cheaper to serve. Each row's predicted loss comes from Hoffmann et al.'s approach 3 parametric fit
    L(N, D) = E + A / N^alpha + B / D^beta,  E = 1.8172, A = 482.01, B = 2085.43, alpha = 0.3478, beta = 0.3658,
as refitted by Besiroglu et al. 2024 (the published coefficients put the optimum at a third of approaches 1-2's
N_opt, so the compute-optimal row predicted a higher loss than the smaller one: pretrain.plan.scaling), and its
loss penalty is measured from that fit's own optimum for C (their equation 4), within a few percent of N_opt.

Precedence: the budget chooses the model only when none is given. With model.preset, model.hf_config or a shape
key away from its default (CHOSEN_KEYS), the model stays and the budget buys its training tokens, by the plan's
own time: whole optimizer steps at the GPU-seconds each takes (pretrain.plan.budget_tokens). A length given
beside a budget (train.tokens, max_steps, examples) is refused either way: the budget fixes the tokens itself.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from ..config import Config, replaced, resolve
from ..errors import ConfigError
from ..units import GiB
from .budget_compute import (
    NO_BUDGET,
    budget_key,
    converted_at,
    flops_per_gpu_second,
    gpu_seconds,
    refuse_outside,
)
from .budget_tokens import buy_tokens
from .explain import Explain
from .hardware import peak_tflops
from .length import CHINCHILLA_TOKENS_PER_PARAM, storage_bytes
from .scaling import (
    FIT,
    WIDTHS,
    approach_3_optimum,
    chinchilla_loss,
    fit_coefficients,
    llama_shape,
    loss_formula,
    shape_keys,
    shape_params,
)

if TYPE_CHECKING:
    from ..config.schema import ResolvedConfig

# shape -> (its _fit, 6N FLOPs per GPU-second, utilisation, basis); {} for the config as given
Speed = Callable[[dict[str, Any]], tuple[Any, ...]]
INFERENCE_AWARE_SHRINK = 2  # half the parameters, twice the tokens
# The model keys llama_shape chooses (it keeps the vocabulary and the context): one of them away from its
# default, or a preset or Hugging Face config, is a model the user gave, which a budget does not replace.
CHOSEN_KEYS = (
    "family",
    "hidden_size",
    "num_layers",
    "num_heads",
    "num_kv_heads",
    "head_dim",
    "intermediate_size",
    "tie_embeddings",
)
DEFAULT_MODEL = resolve(Config()).model  # as a loaded config holds it (num_kv_heads, head_dim filled in)
LENGTH_KEYS = ("tokens", "max_steps", "examples")  # train.*: each fixes the tokens a budget would set
ROUNDS = 5  # shapes tried at their own speed; the step-time model's MFU moves slowly with size: 2-3 suffice


def budget_requested(cfg: ResolvedConfig) -> bool:
    b = cfg.budget
    return any(v is not None for v in (b.gpu_hours, b.days, b.cost))


def model_given(cfg: ResolvedConfig) -> str | None:
    """The `key=value` that fixes the model (model.preset, model.hf_config, or the first of CHOSEN_KEYS away
    from its default); None when budget mode is to choose it. A shape key given at its default value cannot
    be told apart from one left out: it counts as not given."""
    m = cfg.model
    if m.preset or m.hf_config:
        return f"model.preset={m.preset}" if m.preset else f"model.hf_config={m.hf_config}"
    key = next((k for k in CHOSEN_KEYS if getattr(m, k) != getattr(DEFAULT_MODEL, k)), None)
    return f"model.{key}={getattr(m, key)}" if key else None


def spendable_compute(vocab_size: int, max_seq_len: int) -> tuple[float, float]:
    """The FLOPs budget mode can spend on a model it chooses: from C = 120 N^2 (N_opt = sqrt(C / 120)) at twice
    the smallest shape it builds (width 128, one layer), so that the inference-aware row's N_opt / 2 is a shape
    too, to C at the largest (width 65,536 at the planner's MAX_LAYERS). Beyond either end the shape no longer
    follows N_opt: a fixed smallest model on next to no tokens, or more layers than the planner models."""
    from . import MAX_LAYERS

    smallest = shape_params(shape_keys(WIDTHS[0], 1, vocab_size, max_seq_len)).total
    largest = shape_params(shape_keys(WIDTHS[-1], MAX_LAYERS, vocab_size, max_seq_len)).total
    return 120 * (INFERENCE_AWARE_SHRINK * smallest) ** 2, 120 * largest**2


def apply_budget(cfg: ResolvedConfig, ex: Explain) -> tuple[dict[str, Any], ResolvedConfig]:
    """Choose the model for the budget, or with a model given buy its tokens: (the plan's "budget" entry, a
    new config of that model with its train.tokens, the overrides that make it fit, and the budget keys
    cleared). `cfg` is left unchanged; the rest of the plan is the ordinary plan of the new config, and
    `budget.overrides` rebuilds it from `cfg`."""
    given = model_given(cfg)
    _refuse_length(cfg, given)
    seconds, how = gpu_seconds(cfg)
    peak, source = peak_tflops(cfg.hardware, cfg.train.precision)
    if not peak:
        raise ConfigError(f"budget: {source}; the compute a budget buys needs a peak FLOP/s")
    if given:
        return buy_tokens(cfg, given, seconds, how, peak, ex)
    shape, speed = _search(cfg, seconds, peak)
    _, per_second, util, what = speed(shape)
    compute = seconds * per_second
    ex.add("budget", "gpu_hours", seconds / 3600, how)
    ex.add(
        "budget",
        "compute_flops",
        compute,
        f"{seconds:.4g} GPU-seconds x {per_second:.4g} FLOPs (6N) per "
        f"GPU-second of the shape chosen, at {converted_at(util, util, what)} of {peak} TFLOP/s ({source})",
    )
    n_opt, d_opt, n_3, best = _compute_optimal(compute, ex)
    optimal = _row(cfg, seconds, n_opt, shape, speed, best, ex, "model")
    small = n_opt / INFERENCE_AWARE_SHRINK
    smaller = _row(cfg, seconds, small, _shape_near(cfg, small), speed, best, ex, "inference_aware")
    smaller.pop("config_overrides")

    entry = {
        "compute_flops": compute,
        "gpu_hours": seconds / 3600,
        "params": n_opt,
        "tokens": d_opt,
        "model": optimal["model"],
        "model_params": optimal["params"],
        "model_tokens": optimal["tokens"],
        "loss": optimal["loss"],
        "loss_penalty": optimal["loss_penalty"],
        "loss_optimum": best,
        "approach_3_params": n_3,
        "storage_bytes": optimal["storage_bytes"],
        "raw_text_bytes": optimal["raw_text_bytes"],
        "fit": optimal["fit"],
        "inference_aware": smaller,
        "method": "Hoffmann et al. 2022 approaches 1-2: N_opt = sqrt(C / 120), D_opt = 20 N_opt; loss from "
        f"{FIT} ({fit_coefficients()})",
    }
    # The plan that follows is the compute-optimal row's, with the overrides that make it fit.
    entry["overrides"] = {**optimal["config_overrides"], **NO_BUDGET}
    return entry, replaced(cfg, entry["overrides"])


def _refuse_length(cfg: ResolvedConfig, given: str | None) -> None:
    """A length given beside a budget (train.tokens, max_steps, examples): the budget fixes the tokens itself."""
    length = next((k for k in LENGTH_KEYS if getattr(cfg.train, k) is not None), None)
    if not length:
        return
    key, value = budget_key(cfg), f"train.{length}={getattr(cfg.train, length)}"
    if given:
        raise ConfigError(
            f"{key}: buys the training tokens of the model given ({given}), and {value} fixes "
            f"them too; drop train.{length} to train on what the budget buys, or drop {key}"
        )
    raise ConfigError(
        f"{key}: chooses the model and its tokens, and {value} fixes the tokens; drop train."
        f"{length}, or give the model (model.preset or its shape keys) for the budget to buy its "
        "tokens"
    )


def _compute_optimal(compute: float, ex: Explain) -> tuple[float, float, float, float]:
    """(N_opt, D_opt) of approaches 1-2 for this compute, and approach 3's own optimum N with its loss, the
    lowest its fit predicts (each row's loss_penalty is measured from it)."""
    n_opt = math.sqrt(compute / (6 * CHINCHILLA_TOKENS_PER_PARAM))
    d_opt = CHINCHILLA_TOKENS_PER_PARAM * n_opt
    ex.add(
        "budget",
        "params",
        n_opt,
        f"sqrt(C {compute:.4g} / 120): Hoffmann et al. 2022, approaches 1-2 "
        "(N_opt ~ C^0.5) with 20 tokens per parameter and C = 6ND",
    )
    ex.add("budget", "tokens", d_opt, f"20 x N_opt {n_opt:.4g}")

    n_3 = approach_3_optimum(compute)
    best = chinchilla_loss(n_3, compute / (6 * n_3))
    ex.add(
        "budget",
        "loss_optimum",
        best,
        f"L at approach 3's own optimum N = {n_3:.4g} (equation 4), D = C / 6N: "
        "the lowest loss its fit predicts for this compute; each row's loss_penalty is measured from it",
    )
    return n_opt, d_opt, n_3, best


def _search(cfg: ResolvedConfig, seconds: float, peak: float) -> tuple[dict[str, Any], Speed]:
    """The compute-optimal shape at its own speed, and `speed` (shape -> (its _fit, 6N FLOPs per GPU-second,
    utilisation, basis), {} for the config as given): from the config's speed, the shape N_opt gives, until a
    shape comes again. One that needs recomputation to fit is slower, and its compute buys a smaller shape,
    which buys it back: of such a cycle, the smallest (the largest that its own speed affords)."""
    low, high = spendable_compute(cfg.model.vocab_size, cfg.model.max_seq_len)
    speeds: dict[tuple[tuple[str, Any], ...], tuple[Any, ...]] = {}

    def speed(shape: dict[str, Any]) -> tuple[Any, ...]:
        if (key := tuple(shape.items())) not in speeds:
            fit = _fit(cfg, _model_overrides(shape)) if shape else {"config": cfg}
            speeds[key] = (fit, *flops_per_gpu_second(fit["config"], peak))
        return speeds[key]

    shape, per_second = {}, speed({})[1]
    seen: list[dict[str, Any]] = []
    for _ in range(ROUNDS):
        compute = seconds * per_second
        if not low <= compute <= high:  # the ends at their own speed, as configured (no fix searched)
            ends = [
                flops_per_gpu_second(
                    replaced(cfg, {**_model_overrides(_shape_near(cfg, math.sqrt(x / 120))), **NO_BUDGET}), peak
                )
                for x in (low, high)
            ]
            refuse_outside(
                cfg,
                seconds,
                low / ends[0][0],
                high / ends[1][0],
                f"buys {compute:.3g} FLOPs, whose "
                f"Chinchilla-optimal N {math.sqrt(compute / 120):.3g} is outside the "
                f"{math.sqrt(low / 120):.3g} to {math.sqrt(high / 120):.3g} parameters budget mode "
                "builds",
                converted_at(ends[0][1], ends[1][1], ends[0][2]),
            )
            compute = min(max(compute, low), high)
        chosen = _shape_near(cfg, math.sqrt(compute / 120))
        if chosen in seen:
            return min(seen[seen.index(chosen) :], key=lambda m: shape_params(m).total), speed
        seen.append(chosen)
        shape, per_second = chosen, speed(chosen)[1]
    return shape, speed


def _shape_near(cfg: ResolvedConfig, n: float) -> dict[str, Any]:
    return llama_shape(n, cfg.model.vocab_size, cfg.model.max_seq_len)


def _model_overrides(shape: dict[str, Any]) -> dict[str, Any]:
    """The config keys of a chosen shape: the model, and no length of the user's (the budget gives it)."""
    return {
        **{f"model.{k}": v for k, v in shape.items()},
        "model.preset": None,
        "model.hf_config": None,
        "train.max_steps": None,
        "train.examples": None,
    }


def _row(
    cfg: ResolvedConfig,
    seconds: float,
    n_target: float,
    shape: dict[str, Any],
    speed: Speed,
    best_loss: float,
    ex: Explain,
    name: str,
) -> dict[str, Any]:
    """A chosen shape (near n_target parameters) trained on the tokens the GPU-seconds buy at its own speed."""
    n = shape_params(shape).total
    fit, per_second, util, what = speed(shape)
    compute = seconds * per_second
    tokens = int(compute / (6 * n))
    loss = chinchilla_loss(n, tokens)
    ex.add(
        "budget",
        f"{name}.shape",
        f"H {shape['hidden_size']}, L {shape['num_layers']}, heads "
        f"{shape['num_heads']} (kv {shape['num_kv_heads']}), H' {shape['intermediate_size']}",
        f"LLaMA conventions near {n_target:.4g} params: head_dim 128, ~128 width per layer, H' = 8/3 H "
        "rounded up to 256, gcd(heads, 8) kv heads",
    )
    ex.add("budget", f"{name}.params", n, "exact count of that shape (pretrain.plan.params)")
    ex.add(
        "budget",
        f"{name}.tokens",
        tokens,
        f"{seconds:.4g} GPU-seconds x {per_second:.4g} FLOPs per GPU-second "
        f"({converted_at(util, util, what)}) / (6 x {n:,}) = {tokens / n:.1f} tokens per parameter",
    )
    ex.add(
        "budget",
        f"{name}.loss",
        loss,
        loss_formula(n, tokens),
    )
    ex.add("budget", f"{name}.loss_penalty", loss - best_loss, f"{loss:.4f} - loss_optimum {best_loss:.4f}")
    storage = storage_bytes(tokens, shape["vocab_size"])
    raw = tokens * cfg.data.bytes_per_token if cfg.data.bytes_per_token else None
    ex.add(
        "budget",
        f"{name}.storage_bytes",
        storage,
        f"{tokens:,} tokens x {storage // max(1, tokens)} bytes"
        + (
            f"; raw text {raw:.4g} bytes at data.bytes_per_token {cfg.data.bytes_per_token}"
            if raw
            else "; set data.bytes_per_token (pretrain tokenizer stats) for the raw text it takes"
        ),
    )
    ex.add("budget", f"{name}.fits", fit["fits"], fit["why"])
    return {
        "model": shape,
        "params": n,
        "tokens": tokens,
        "compute_flops": compute,
        "loss": loss,
        "loss_penalty": loss - best_loss,
        "storage_bytes": storage,
        "raw_text_bytes": raw,
        "fit": {k: fit[k] for k in ("fits", "overrides", "memory_bytes")},
        "config_overrides": {**_model_overrides(shape), "train.tokens": tokens, **fit["overrides"]},
    }


def _fit(cfg: ResolvedConfig, overrides: dict[str, Any]) -> dict[str, Any]:
    """The ordinary plan of the shape on the budget's GPUs; when it does not fit, the cheapest fix that keeps
    the number of GPUs (pretrain.plan.fit_fixes)."""
    from . import plan_with_explain
    from .fit_fixes import fit_fixes

    c = replaced(cfg, {**overrides, **NO_BUDGET})
    p = plan_with_explain(c, advice=False)[0]
    total = p["memory_bytes"]["total"]
    if p["fits"] is not False:
        return {
            "fits": p["fits"],
            "overrides": {},
            "memory_bytes": total,
            "config": c,
            "why": f"as configured: {total / GiB:.1f} GiB per GPU",
        }
    for fix, q in fit_fixes(c):
        if fix.get("parallel.gpus", c.parallel.gpus) == c.parallel.gpus:
            text = " ".join(f"{k}={v}" for k, v in fix.items())
            return {
                "fits": True,
                "overrides": fix,
                "memory_bytes": q["memory_bytes"]["total"],
                "config": replaced(c, fix),
                "why": f"with {text}: {q['memory_bytes']['total'] / GiB:.1f} GiB per GPU",
            }
    return {
        "fits": False,
        "overrides": {},
        "memory_bytes": total,
        "config": c,
        "why": f"{total / GiB:.1f} GiB per GPU and no fix on {c.parallel.gpus} GPUs",
    }
