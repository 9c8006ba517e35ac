"""A budget with the model given (pretrain.plan.budget_mode.model_given): the model stays, and the budget buys
its training tokens by the plan's own time: the whole optimizer steps the GPU-seconds pay for, at the
GPU-seconds each step takes (pretrain.plan.length.tokens_per_gpu_second: the step-time model, or hardware.mfu
/ hfu when given), a batch ramp's smaller first steps counted as such. Its loss and loss penalty come from
Hoffmann et al.'s approach 3 fit (as refitted by Besiroglu et al. 2024), as the chosen model's do.

Its own module beside choosing a model (pretrain.plan.budget_mode): it searches no shape and fits nothing,
only turns GPU-seconds into steps.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from ..config import replaced
from ..config.checks import LARGEST
from .budget_compute import NO_BUDGET, converted_at, flops_per_gpu_second, refuse_outside
from .length import ramp_args, training_length
from .params import count_params
from .scaling import FIT, approach_3_optimum, chinchilla_loss, loss_formula
from .schedule import tokens_for_steps

if TYPE_CHECKING:
    from ..config.schema import ResolvedConfig
    from .explain import Explain


def buy_tokens(
    cfg: ResolvedConfig, given: str, seconds: float, how: str, peak: float, ex: Explain
) -> tuple[dict[str, Any], ResolvedConfig]:
    """The model given, trained on the whole optimizer steps the budget's GPU-seconds buy at the plan's own
    time (pretrain.plan.length.tokens_per_gpu_second: the step-time model, or hardware.mfu / hfu when given)."""
    counts = count_params(cfg.model)
    per_second, util, what = flops_per_gpu_second(cfg, peak)
    token_seconds = 6 * counts.active / per_second  # GPU-seconds per token
    step = training_length(cfg, counts.active)["tokens_per_step"]
    step_seconds = step * token_seconds  # GPU-seconds of one (full) optimizer step
    steps = int(seconds / step_seconds)
    tokens = tokens_for_steps(steps, **ramp_args(cfg))  # a batch ramp's first steps are smaller
    # At least one optimizer step, at most what train.tokens holds (int64).
    refuse_outside(
        cfg,
        seconds,
        step_seconds,
        LARGEST * token_seconds,
        f"buys {tokens:,} tokens of the model given ({given}), "
        + ("less than one optimizer step" if steps < 1 else "more than train.tokens holds"),
        converted_at(util, util, what),
    )
    n = counts.active  # an MoE token runs its active parameters: the scaling law's N
    compute = seconds * per_second
    n_3 = approach_3_optimum(6 * n * tokens)
    best = chinchilla_loss(n_3, tokens * n / n_3)
    loss = chinchilla_loss(n, tokens)
    ex.add("budget", "gpu_hours", seconds / 3600, how)
    ex.add(
        "budget",
        "model_given",
        given,
        "the budget buys this model's tokens (it chooses a model only when none is given)",
    )
    ex.add(
        "budget",
        "model_tokens",
        tokens,
        f"floor({seconds:.4g} GPU-seconds / {step_seconds:.4g} GPU-seconds "
        f"per step) = {steps:,} steps of {step:,} tokens, a token taking {token_seconds:.4g} GPU-seconds at "
        f"{converted_at(util, util, what)}, the plan's time",
    )
    ex.add(
        "budget",
        "loss",
        loss,
        loss_formula(n, tokens),
    )
    ex.add(
        "budget",
        "loss_penalty",
        loss - best,
        f"{loss:.4f} - {best:.4f}, the fit's optimum for C = 6ND {6 * n * tokens:.4g} (at {n_3:.4g} params)",
    )
    entry: dict[str, Any] = {
        "gpu_hours": seconds / 3600,
        "compute_flops": compute,
        "model_given": given,
        "model_params": n,
        "model_tokens": tokens,
        "loss": loss,
        "loss_penalty": loss - best,
        "loss_optimum": best,
        "approach_3_params": n_3,
        "method": "tokens = the whole optimizer steps the GPU-seconds buy at the "
        "plan's time (the step-time model, or hardware.mfu / hfu when given); loss from " + FIT,
        "overrides": {"train.tokens": tokens, **NO_BUDGET},
    }
    return entry, replaced(cfg, entry["overrides"])
