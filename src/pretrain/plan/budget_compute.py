"""The compute a budget is: its GPU-seconds (gpu_hours x 3,600, days x 86,400 x parallel.gpus, or cost /
hardware.price_per_gpu_hour x 3,600), the 6N FLOPs one GPU-second buys for a config by the plan's own time
(pretrain.plan.length.tokens_per_gpu_second: the step-time model, or hardware.mfu / hfu when given), and the
one-line refusal of a budget outside the range budget mode serves, in the budget key's own units.

Its own module because both ways of spending a budget use it: choosing a model (pretrain.plan.budget_mode) and
buying the tokens of the model given (pretrain.plan.budget_tokens).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, cast

from ..errors import ConfigError
from .explain import Explain
from .flops import basis, flops
from .length import tokens_per_gpu_second
from .params import count_params
from .step_time import step_time

if TYPE_CHECKING:
    from ..config.schema import ResolvedConfig

NO_BUDGET = {"budget.gpu_hours": None, "budget.days": None, "budget.cost": None}  # the chosen config plans plainly


def budget_key(cfg: ResolvedConfig) -> str:
    return next(f"budget.{k}" for k in ("gpu_hours", "days", "cost") if getattr(cfg.budget, k) is not None)


def gpu_seconds(cfg: ResolvedConfig) -> tuple[float, str]:
    b, gpus, price = cfg.budget, cfg.parallel.gpus, cfg.hardware.price_per_gpu_hour
    if b.gpu_hours is not None:
        return b.gpu_hours * 3600, f"budget.gpu_hours {b.gpu_hours:,g}"
    if b.days is not None:
        return b.days * 86400 * gpus, f"budget.days {b.days:g} x 24 x parallel.gpus {gpus}"
    assert b.cost is not None and price  # one budget key is set; checks.py refuses budget.cost without a price
    return b.cost / price * 3600, f"budget.cost {b.cost:,g} / hardware.price_per_gpu_hour {price:g}"


def _in_budget_units(cfg: ResolvedConfig, seconds: float) -> float:
    """GPU-seconds as the budget key given counts them (gpu_seconds the other way round)."""
    b = cfg.budget
    if b.gpu_hours is not None:
        return seconds / 3600
    if b.days is not None:
        return seconds / (86400 * cfg.parallel.gpus)
    assert cfg.hardware.price_per_gpu_hour  # checks.py refuses budget.cost without a price
    return seconds / 3600 * cfg.hardware.price_per_gpu_hour


def refuse_outside(cfg: ResolvedConfig, seconds: float, low: float, high: float, what: str, utilisation: str) -> None:
    """One line naming the budget key and the range it supports (low and high in GPU-seconds)."""
    if low <= seconds <= high:
        return
    key = budget_key(cfg)
    given = getattr(cfg.budget, key.split(".")[1])
    raise ConfigError(
        f"{key}: {given:g} {what}; give {key} from {_in_budget_units(cfg, low):.3g} to "
        f"{_in_budget_units(cfg, high):.3g} (on {cfg.hardware.gpu} at {utilisation})"
    )


def flops_per_gpu_second(c: ResolvedConfig, peak: float) -> tuple[float, float, str]:
    """(6N FLOPs one GPU-second buys for config `c`, the utilisation behind it, its basis): 6 x active parameters x the
    tokens a GPU trains per second in the plan's time of `c` (the step-time model, or hardware.mfu / hfu)."""
    counts = count_params(c.model)
    fl = flops(c, counts, 1, Explain())
    model_pt, hardware_pt, _ = basis(c, fl)
    step = cast(dict[str, Any], step_time(c, counts, fl, peak))  # a dict: there is a peak
    per_gpu, util, what = tokens_per_gpu_second(c, model_pt, hardware_pt, peak, step)
    return 6 * counts.active * per_gpu, util, what


def converted_at(low: float, high: float, what: str) -> str:
    """The utilisation a budget was converted at, for the messages: "the step-time model's MFU 0.41"."""
    if what.startswith("hardware."):
        return f"{what.split(' ')[0]} {low:g}"
    return f"the step-time model's MFU {low:.3g}" + (f"-{high:.3g}" if high != low else "")
