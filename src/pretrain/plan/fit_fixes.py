"""When a config does not fit: the cheapest change that makes it fit on the same GPUs (recomputation, a smaller
micro-batch, ZeRO, more GPUs, tensor parallelism), each candidate checked by planning it. The advice's memory
line and budget mode's fit read it."""

from __future__ import annotations

import math
from typing import TYPE_CHECKING, Any, cast

from ..config import replaced
from ..config.job_sections import RECOMPUTE
from ..errors import ConfigError

if TYPE_CHECKING:
    from ..config.schema import ResolvedConfig

MAX_GPUS = 16384  # the "more GPUs" fix stops here
Options = tuple[list[dict[str, Any]], dict[str, Any] | None]  # the overrides to try, and the one to keep if none fits


def fit_fixes(config: ResolvedConfig, limit: int = 2) -> list[tuple[dict[str, Any], dict[str, Any]]]:
    """Up to `limit` override sets {"section.key": value} that make the config fit, cheapest first, each with
    the plan it gives.

    Levers, in order: activation recomputation (selective, then full); a smaller micro-batch (the largest
    that fits); ZeRO stages 1-3 (data parallel > 1); more GPUs (power-of-two multiples, ZeRO-3); tensor
    parallelism 2/4/8. A lever that is not enough on its own is kept at its strongest for the next ones; a
    fix is then pruned of the kept changes it does not need. grad_accum_steps is set last, to keep the global
    batch where a whole number of accumulation steps does. The second fix comes from a later lever and is
    shown only if it needs no more GPUs than the first."""
    levers = (_recompute_options, _micro_batch_options, _zero_options, _gpu_options, _tensor_options)
    kept: list[dict[str, Any]] = []  # strongest option of each lever that did not suffice
    fixes: list[tuple[dict[str, Any], dict[str, Any]]] = []
    for lever in levers:
        state = _merge(kept)
        options, carry = lever(config, state)
        found = next((o for o in options if _fits(config, {**state, **o})), None)
        if found is None:
            if carry:
                kept.append(carry)
            continue
        fix = _complete(config, _prune(config, kept, found))
        gpus = _get(config, fix, "parallel.gpus")
        if fixes:
            first = fixes[0][0]
            if gpus > _get(config, first, "parallel.gpus") or first.items() <= fix.items():
                continue
        fixes.append((fix, cast(dict[str, Any], _replan(config, fix))))  # a plan: every fix passed _fits
        if len(fixes) == limit:
            break
    return sorted(fixes, key=lambda f: _get(config, f[0], "parallel.gpus"))  # cheapest: fewest GPUs


def _get(config: ResolvedConfig, overrides: dict[str, Any], key: str) -> Any:
    if key in overrides:
        return overrides[key]
    section, name = key.split(".")
    return getattr(getattr(config, section), name)


def _data_parallel(config: ResolvedConfig, overrides: dict[str, Any]) -> int:
    return _get(config, overrides, "parallel.gpus") // (
        _get(config, overrides, "parallel.tensor") * _get(config, overrides, "parallel.pipeline")
    )


def _sequences_per_rank(config: ResolvedConfig, overrides: dict[str, Any]) -> int | None:
    """Sequences each data-parallel rank must contribute per step to keep the global batch (None: no whole
    number does)."""
    t = config.train
    sequences = t.micro_batch_size * t.grad_accum_steps * _data_parallel(config, {})
    dp = _data_parallel(config, overrides)
    return sequences // dp if sequences % dp == 0 else None


def _complete(config: ResolvedConfig, overrides: dict[str, Any]) -> dict[str, Any]:
    """The overrides with the grad_accum_steps whose global batch is nearest the original: the same batch
    where a whole number of steps gives it, else the closest (at least one step), so that more GPUs do not
    multiply the batch by their number."""
    out = {k: v for k, v in overrides.items() if k != "train.grad_accum_steps"}
    t = config.train
    sequences = t.micro_batch_size * t.grad_accum_steps * _data_parallel(config, {})
    per_step = _get(config, out, "train.micro_batch_size") * _data_parallel(config, out)
    accum = max(1, round(sequences / per_step))
    if accum != t.grad_accum_steps and t.global_batch_tokens is None:  # else the config derives it itself
        out["train.grad_accum_steps"] = accum
    return out


def _fits(config: ResolvedConfig, overrides: dict[str, Any]) -> bool:
    q = _replan(config, _complete(config, overrides))
    return bool(q and q["fits"])


def _recompute_options(config: ResolvedConfig, state: dict[str, Any]) -> Options:
    current = RECOMPUTE.index(_get(config, state, "train.activation_checkpointing"))
    options = [{"train.activation_checkpointing": r} for r in RECOMPUTE[current + 1 :]]
    return options, (options[-1] if options else None)


def _smaller_micro_batch(config: ResolvedConfig, overrides: dict[str, Any]) -> int:
    """The largest micro-batch below the current one that fits with `overrides` and divides the sequences
    per rank (so the global batch stays); 1 when none fits."""
    b = _get(config, overrides, "train.micro_batch_size")
    q = _replan(config, _complete(config, overrides))
    largest = min(q["max_micro_batch_size"] or 0, b - 1) if q else 0
    per_rank = _sequences_per_rank(config, overrides) or b
    return max([d for d in range(1, largest + 1) if per_rank % d == 0] or [1])


def _micro_batch_options(config: ResolvedConfig, state: dict[str, Any]) -> Options:
    if _get(config, state, "train.micro_batch_size") == 1:
        return [], None
    option = {"train.micro_batch_size": _smaller_micro_batch(config, state)}
    return [option], option


def _zero_options(config: ResolvedConfig, state: dict[str, Any]) -> Options:
    if _data_parallel(config, state) <= 1:
        return [], None
    current = _get(config, state, "parallel.zero_stage")
    options = [{"parallel.zero_stage": z} for z in range(current + 1, 4)]
    return options, (options[-1] if options else None)


def _gpu_options(config: ResolvedConfig, state: dict[str, Any]) -> Options:
    gpus = _get(config, state, "parallel.gpus")
    options: list[dict[str, Any]] = []
    k = 2
    while gpus * k <= MAX_GPUS:
        options.append({"parallel.gpus": gpus * k, "parallel.zero_stage": 3})
        k *= 2
    return options, None  # more GPUs alone did not help: the tensor-parallel options set their own


def _tensor_options(config: ResolvedConfig, state: dict[str, Any]) -> Options:
    m, par = config.model, config.parallel
    gpus = _get(config, state, "parallel.gpus")
    options: list[dict[str, Any]] = []
    for t in (2, 4, 8):
        if t <= par.tensor or m.num_heads % t or m.num_kv_heads % t:
            continue
        base = math.lcm(gpus, t * par.pipeline)
        k = 1
        while base * k <= MAX_GPUS:
            options.append(
                {
                    "parallel.tensor": t,
                    "parallel.sequence_parallel": True,
                    "parallel.gpus": base * k,
                    "parallel.zero_stage": 3,
                }
            )
            k *= 2
    return options, None


def _prune(config: ResolvedConfig, kept: list[dict[str, Any]], found: dict[str, Any]) -> dict[str, Any]:
    """Drop (or weaken) the kept changes the fix does not need, earliest lever first; a kept micro-batch is
    raised back to the largest that fits with the rest of the fix."""
    groups = [dict(g) for g in kept]
    for i, group in enumerate(groups):
        trials: list[dict[str, Any]] = [{}]
        if group.get("train.activation_checkpointing") == "full":
            trials.append({"train.activation_checkpointing": "selective"})
        if "train.micro_batch_size" in group:
            rest = {**_merge(groups[:i] + groups[i + 1 :]), **found}
            trials.append({"train.micro_batch_size": _smaller_micro_batch(config, rest)})
        for trial in trials:
            if _fits(config, {**_merge(groups[:i] + [trial] + groups[i + 1 :]), **found}):
                groups[i] = trial
                break
    fix = {**_merge(groups), **found}
    return {k: v for k, v in fix.items() if _get(config, {}, k) != v}


def _merge(groups: list[dict[str, Any]]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for g in groups:
        out.update(g)
    return out


def _replan(config: ResolvedConfig, overrides: dict[str, Any]) -> dict[str, Any] | None:
    """The plan of a copy of `config` with `overrides` applied (None when the copy is not a valid config)."""
    from . import plan_with_explain

    try:
        c = replaced(config, overrides)
    except ConfigError:
        return None
    return plan_with_explain(c, advice=False)[0]
