"""Batch-size ramp and learning-rate schedule: pure functions shared by the planner and the trainer.

The batch ramp is a function of tokens seen, not of steps, so a resumed run reproduces it exactly: the global
batch grows linearly from `batch_ramp_start` tokens to the target (micro_batch x grad_accum x data parallel x
seq_len) over `batch_ramp_tokens` tokens (GPT-3: 32K to 3.2M tokens over the first 4-12B tokens), rounded
down to whole micro-batches, at least one per data-parallel rank.
"""

from __future__ import annotations

import dataclasses
import math
from typing import TYPE_CHECKING, Any

from ..errors import ConfigError

if TYPE_CHECKING:
    from ..config.job_sections import TrainConfig


def micro_batches_per_step(
    tokens_seen: int,
    *,
    seq_len: int,
    micro_batch_size: int,
    data_parallel: int,
    grad_accum_steps: int,
    ramp_tokens: int,
    ramp_start: int,
) -> int:
    """Gradient-accumulation steps of the optimizer step that starts after `tokens_seen` tokens."""
    if ramp_tokens <= 0 or tokens_seen >= ramp_tokens:
        return grad_accum_steps
    unit = seq_len * micro_batch_size * data_parallel  # tokens of one micro-batch on every rank
    target = unit * grad_accum_steps
    start = min(ramp_start, target)
    # floor((start + (target - start) * seen / ramp) / unit), in integers so planner and trainer agree.
    k = (start * ramp_tokens + (target - start) * tokens_seen) // (unit * ramp_tokens)
    return max(1, min(grad_accum_steps, k))


def _next_change(
    k: int,
    *,
    seq_len: int,
    micro_batch_size: int,
    data_parallel: int,
    grad_accum_steps: int,
    ramp_tokens: int,
    ramp_start: int,
) -> int:
    """First token count at which a ramp step of k micro-batches grows to k + 1 (or the ramp ends): the
    batch is k for every step that starts before it, so runs of equal steps can be jumped over."""
    unit = seq_len * micro_batch_size * data_parallel
    target = unit * grad_accum_steps
    start = min(ramp_start, target)
    # Smallest seen with (start * ramp + (target - start) * seen) // (unit * ramp) >= k + 1.
    boundary = -(-((k + 1) * unit * ramp_tokens - start * ramp_tokens) // (target - start))
    return min(boundary, ramp_tokens)


def steps_for_tokens(
    tokens: int,
    *,
    seq_len: int,
    micro_batch_size: int,
    data_parallel: int,
    grad_accum_steps: int,
    ramp_tokens: int,
    ramp_start: int,
) -> int:
    """Optimizer steps until at least `tokens` tokens are seen, following the ramp (jumping whole runs of
    equal batch size, so it is instant even for millions of steps)."""
    unit = seq_len * micro_batch_size * data_parallel
    args = dict(
        seq_len=seq_len,
        micro_batch_size=micro_batch_size,
        data_parallel=data_parallel,
        grad_accum_steps=grad_accum_steps,
        ramp_tokens=ramp_tokens,
        ramp_start=ramp_start,
    )
    seen = steps = 0
    while seen < tokens:
        k = micro_batches_per_step(seen, **args)
        if k == grad_accum_steps:  # ramp done: the rest is uniform
            steps += -(-(tokens - seen) // (k * unit))
            break
        limit = min(_next_change(k, **args), tokens)
        n = max(1, -(-(limit - seen) // (k * unit)))  # the steps of k micro-batches that start before limit
        steps += n
        seen += n * k * unit
    return steps


def tokens_for_steps(steps: int, **args: int) -> int:
    """Tokens seen after `steps` optimizer steps (the ramp's steps are smaller), jumping runs of equal batch
    size as steps_for_tokens does."""
    unit = args["seq_len"] * args["micro_batch_size"] * args["data_parallel"]
    seen = done = 0
    while done < steps:
        k = micro_batches_per_step(seen, **args)
        if k == args["grad_accum_steps"]:  # ramp done: the rest is uniform
            return seen + (steps - done) * k * unit
        n = min(steps - done, max(1, -(-(_next_change(k, **args) - seen) // (k * unit))))
        done += n
        seen += n * k * unit
    return seen


def warmup_steps(warmup: float | int, total_steps: int) -> int:
    """`train.warmup` as steps: a float is a fraction of the run, an int a step count."""
    if isinstance(warmup, float):
        return int(round(warmup * total_steps))
    return int(warmup)


def checked_warmup(train: TrainConfig, total_steps: int) -> int:
    """Warm-up steps of a run of `total_steps`, refused (ConfigError) where the schedule cannot be followed:
    a warm-up as long as the run, or a wsd decay that would start inside the warm-up."""
    warmup = warmup_steps(train.warmup, total_steps)
    if warmup >= total_steps:
        raise ConfigError(
            f"train.warmup: {warmup} warm-up steps is not shorter than the run ({total_steps} "
            "steps); lower train.warmup"
        )
    decay = _wsd_decay_steps(train.decay_fraction, total_steps)
    if train.schedule == "wsd" and total_steps - decay < warmup:
        raise ConfigError(
            f"train.decay_fraction: the wsd decay over the last {decay} of {total_steps} steps would "
            f"start inside the {warmup}-step warm-up; lower train.decay_fraction or train.warmup"
        )
    return warmup


def _wsd_decay_steps(decay_fraction: float, total_steps: int) -> int:
    return max(1, int(round(decay_fraction * total_steps)))


def learning_rate(
    step: int,
    *,
    total_steps: int,
    warmup: int,
    peak: float,
    min_ratio: float,
    schedule: str,
    decay_fraction: float = 0.2,
) -> float:
    """LR for optimizer step `step` (0-based): linear warm-up to `peak`, then decay to `min_ratio * peak`.
    A resume into a longer or shorter run follows the schedule of its new length (resumed_schedule).

    cosine: half a cosine; linear: a straight line; inverse_sqrt: peak * sqrt(warmup / step), floored;
    wsd: constant, then a linear decay over the last `decay_fraction` of the steps (warmup-stable-decay).
    """
    floor = min_ratio * peak
    if step < warmup:
        return peak * (step + 1) / warmup
    if schedule == "inverse_sqrt":
        return max(floor, peak * math.sqrt(max(warmup, 1) / (step + 1)))
    span = max(1, total_steps - warmup)
    progress = min(1.0, (step - warmup) / span)
    if schedule == "cosine":
        return floor + (peak - floor) * 0.5 * (1 + math.cos(math.pi * progress))
    if schedule == "linear":
        return peak - (peak - floor) * progress
    if schedule == "wsd":
        decay_steps = _wsd_decay_steps(decay_fraction, total_steps)
        decay_start = total_steps - decay_steps
        if step < decay_start:
            return peak
        return peak - (peak - floor) * min(1.0, (step - decay_start + 1) / decay_steps)
    raise ValueError(f"unknown schedule {schedule!r}")


def resumed_schedule(train: TrainConfig, saved: dict[str, Any], total_steps: int) -> tuple[int, dict[str, Any] | None]:
    """(warm-up steps, the `schedule_changed` event or None) of a resume from a checkpoint whose trainer.json
    is `saved`, into a run now `total_steps` long.

    A run whose length changed (train.max_steps or train.tokens overridden on --resume) follows the schedule of
    its new length from the checkpoint's step on; the warm-up keeps the steps the checkpoint saved (it is done,
    and a fraction of a new length would move inverse_sqrt's curve). wsd extends its stable phase and decays anew
    over the last decay_fraction of the new length, as WSD runs are extended (Hu et al. 2024, MiniCPM; Hägele
    et al. 2024): from a checkpoint already inside the old decay the LR goes back up to the stable one, said in
    the event. inverse_sqrt has no end: its LR does not change. cosine and linear would jump (their whole
    curve stretches): refused unless train.schedule_restart=true accepts the new curve.
    """
    step, old_total = saved["step"], saved.get("total_steps", total_steps)
    warmup = saved.get("warmup_steps", warmup_steps(train.warmup, old_total))
    kept = dataclasses.replace(train, warmup=int(warmup))
    if old_total == total_steps or step >= total_steps:
        return checked_warmup(kept, total_steps), None
    args = dict(
        warmup=warmup,
        peak=train.lr,
        min_ratio=train.min_lr_ratio,
        schedule=train.schedule,
        decay_fraction=train.decay_fraction,
    )
    before = learning_rate(step, total_steps=old_total, **args)
    after = learning_rate(step, total_steps=total_steps, **args)
    if train.schedule in ("cosine", "linear") and not train.schedule_restart:
        raise ConfigError(
            f"train.schedule_restart: the run was {old_total} steps and is now {total_steps}: its "
            f"{train.schedule} schedule would stretch and the learning rate at step {step} jump from "
            f"{before:.3g} to {after:.3g}; set train.schedule_restart=true to follow the {total_steps}-"
            f"step {train.schedule} from here, or keep the run's length"
        )
    event = {
        "event": "schedule_changed",
        "step": step,
        "schedule": train.schedule,
        "old_total": old_total,
        "new_total": total_steps,
        "lr_at_resume_before": before,
        "lr_at_resume_after": after,
    }
    if train.schedule == "wsd":
        old_start = old_total - _wsd_decay_steps(train.decay_fraction, old_total)
        event.update(
            decay_start=total_steps - _wsd_decay_steps(train.decay_fraction, total_steps),
            old_decay_start=old_start,
            inside_old_decay=step > old_start,
        )
    return checked_warmup(kept, total_steps), event
