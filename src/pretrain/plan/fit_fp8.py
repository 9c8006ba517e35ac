"""`--fit` weighs fp8 against bf16-mixed: on a card with float8 tensor cores, the search is made again in the
other precision and the two fastest layouts are compared in the modelled step time.

The ranking stays in the config's own precision (what the user asked for, and what the table's command line
plans); the other precision's fastest layout is one line beside it, with its command, so choosing float8 is a
decision with a number on it: the ratio of the two fastest layouts' tokens/s, each searched on its own (fp8
needs less memory per converted weight, so its fastest layout can be another one). Below fp8.PAYS the line
says float8 does not pay, as the plan's fp8 advice does. A CPU, a card without an fp8 peak (A100) or another
precision (fp32, fp16-mixed, pure bf16) weighs nothing: there is no float8 rate, or the user chose elsewhere.
"""

from __future__ import annotations

import re
from typing import TYPE_CHECKING, Any

from ..config import replaced
from . import fp8

if TYPE_CHECKING:
    from ..config.schema import ResolvedConfig

WEIGHED = ("bf16-mixed", "fp8")


def weigh(config: ResolvedConfig, result: dict[str, Any]) -> dict[str, Any] | None:
    """{"bf16-mixed": fastest or None, "fp8": fastest or None, "fp8_speedup": fp8 tokens/s over bf16-mixed's or
    None, "faster": the faster precision or None}; each fastest is the candidate's figures with
    train.precision in its overrides. None where fp8 is not weighed (see the module's doc)."""
    from .fit import fit

    if config.train.precision not in WEIGHED or not fp8.peaks(config)[0]:
        return None
    other = WEIGHED[1 - WEIGHED.index(config.train.precision)]
    found = {config.train.precision: result, other: fit(replaced(config, {"train.precision": other}), top=1)}
    out: dict[str, Any] = {p: _fastest(p, found[p]) for p in WEIGHED}
    both = out["bf16-mixed"] and out["fp8"]
    out["fp8_speedup"] = out["fp8"]["tokens_per_s"] / out["bf16-mixed"]["tokens_per_s"] if both else None
    ratio = out["fp8_speedup"]
    out["faster"] = None if ratio is None or ratio == 1 else "fp8" if ratio > 1 else "bf16-mixed"
    return out


def _fastest(precision: str, result: dict[str, Any]) -> dict[str, Any] | None:
    if not result["candidates"]:
        return None
    best = result["candidates"][0]
    return {
        "overrides": {"train.precision": precision, **best["overrides"]},
        **{k: best[k] for k in ("tokens_per_s", "mfu", "step_time_s")},
    }


def lines(config: ResolvedConfig, weighed: dict[str, Any] | None, command: str) -> list[str]:
    """The table's lines: which precision is faster and by how much, and the other one's command."""
    if not weighed:
        return []
    from .fit import command_line

    b, f = weighed["bf16-mixed"], weighed["fp8"]
    if not (b and f):
        missing = "bf16-mixed" if not b else "fp8"
        return [
            "",
            f"  fp8 against bf16-mixed: no {missing} layout fits or trains (pretrain plan ... "
            f"train.precision={missing} --fit says why)",
        ]
    ratio = weighed["fp8_speedup"]
    if not fp8.gemms(config)["linears"]:
        verdict = f"no linear passes the filter (train.fp8_min_features={config.train.fp8_min_features})"
    elif ratio >= fp8.PAYS:
        verdict = f"fp8 is faster by {ratio - 1:.0%}"
    else:
        verdict = (
            f"fp8 is {'faster by ' + format(ratio - 1, '.0%') if ratio > 1 else 'not faster'}: below "
            f"{fp8.PAYS:.2f}x float8 does not pay for its numerics"
        )
    other = f if config.train.precision == "bf16-mixed" else b
    command = re.sub(r" train\.precision=\S+", "", command)  # the other precision's overrides set it
    return [
        "",
        f"  fp8 against bf16-mixed (each at its fastest layout, modelled): fp8 {f['tokens_per_s']:,.0f} "
        f"tokens/s, bf16-mixed {b['tokens_per_s']:,.0f}: {ratio:.2f}x; {verdict}",
        f"  The fastest in {other['overrides']['train.precision']}: {command} {command_line(other['overrides'])}",
    ]
