"""A sweep's rows: one record per cell, the plan's figures beside the measured ones (the median of the rounds,
with their spread). Read by sweep/output.py's table, CSV, JSON and plot."""

from __future__ import annotations

import torch

from ..bench.timing import spread
from ..plan.flops import mfu
from .grid import Cell

# What a cell's status can be (the table, the CSV and the JSON use these strings).
OK, OOM, SKIPPED_BUDGET, SKIPPED_FIT = "ok", "OOM", "skipped: budget", "skipped: does not fit"


def records(
    cells: list[Cell],
    runs: dict[int, list[dict]],
    ended: dict[int, tuple[str, str | None]],
    seconds: dict[int, float],
    threads: int | None,
) -> list[dict]:
    """The rows of the cells that ran a round or ended, in cell order. By cell index: `runs` each round's
    measurement, `ended` a cell that runs no more rounds (status, error), `seconds` its time so far."""
    rows = []
    for cell in cells:
        if not runs[cell.index] and cell.index not in ended:
            continue
        status, error = ended.get(cell.index, (OK, None))
        record = record_of(cell, status, runs[cell.index] if status == OK else None, error)
        record.update(seconds=round(seconds[cell.index], 3), threads=threads)
        rows.append(record)
    return rows


def planned_memory(p: dict, dev: torch.device) -> int:
    """The plan's figure comparable with what is measured on this device (see memory_method)."""
    mem = p["memory_bytes"]
    if dev.type == "cuda":
        return mem["total"] - mem["cuda_context"]
    return sum(p["model_states"].values()) + mem["activations"]


def record_of(cell: Cell, status: str = OK, measured: list[dict] | None = None, error: str | None = None) -> dict:
    """One row of the result: the cell's values, the plan's figures, and the measured ones (a list: one per
    round) where it ran."""
    record = _planned_record(cell, status, error)
    if measured:
        _add_speed(record, measured, cell.rt.world_size)
        _add_memory(record, measured[0], cell.rt.device)
    return record


def _planned_record(cell: Cell, status: str, error: str | None) -> dict:
    """The row before any round: the cell's values and the plan's figures, the measured ones still empty."""
    c, p, dev = cell.config, cell.plan, cell.rt.device
    fits = p["fits"]
    return {
        "cell": cell.index,
        "values": dict(cell.values),
        "status": status,
        "device": str(dev),
        "plan_fits": fits,
        "plan_verdict": {True: "fits", False: "does not fit", None: "no limit"}[fits],
        "tokens_per_step": c.train.micro_batch_size * c.train.grad_accum_steps * c.train.seq_len * cell.rt.world_size,
        "step_seconds": None,
        "step_seconds_each": None,
        "it_per_s": None,
        "tokens_per_s": None,
        "achieved_tflops": None,
        "mfu": None,
        "peak_tflops": p["hardware"]["peak_tflops"],
        "peak_source": p["hardware"]["peak_source"],
        "flops_per_token": p["flops"]["per_token" if c.flops.convention == "palm" else "per_token_6n"],
        "memory_measured_bytes": None,
        "memory_planned_bytes": planned_memory(p, dev),
        "memory_error_pct": None,
        "memory_planned_total_bytes": p["memory_bytes"]["total"],
        "planned_tokens_per_s": p["time"].get("tokens_per_second"),
        "planned_mfu": p["time"].get("utilisation"),
        "planned_basis": p["time"].get("basis"),  # the step-time model, or hardware.mfu / hfu given
        "modelled_tokens_per_s": p["time"].get("modelled_tokens_per_second"),  # pretrain.plan.step_time
        "measured_detail": None,
        "loss": None,
        "error": error,
        "rounds": 0,
        "tokens_per_s_each_round": [],
        "tokens_per_s_min": None,
        "tokens_per_s_max": None,
        "spread_pct": None,
        "noisy": False,
    }


def _add_speed(record: dict, measured: list[dict], world: int) -> None:
    """Each figure is the median of the rounds, with their spread."""
    per_round = [r["tokens"] / sum(r["times"]) for r in measured]
    noise = spread(per_round)
    tokens_per_s = noise["median"]
    step_seconds = record["tokens_per_step"] / tokens_per_s  # the median round's (no batch ramp in a sweep)
    flops_per_token = record["flops_per_token"]
    record.update(
        step_seconds=step_seconds,
        step_seconds_each=[t for r in measured for t in r["times"]],
        it_per_s=1.0 / step_seconds,
        tokens_per_s=tokens_per_s,
        achieved_tflops=tokens_per_s * flops_per_token / 1e12,
        mfu=mfu(tokens_per_s, flops_per_token, world, record["peak_tflops"]),
        loss=measured[-1]["loss"],
        rounds=len(measured),
        tokens_per_s_each_round=per_round,
        tokens_per_s_min=noise["min"],
        tokens_per_s_max=noise["max"],
        spread_pct=noise["spread_pct"],
        noisy=noise["noisy"],
    )


def _add_memory(record: dict, first: dict, dev: torch.device) -> None:
    """Memory is the first round's (the same tensors every round): the peak allocated on a GPU, the tensors
    counted on a CPU."""
    m = first["measurement"]
    detail = counted = None  # counted: the tensors' bytes, where the saved activations were counted too
    if m is not None:
        detail = dict(m["states"])
        if m["saved"] is not None:  # None: not measurable (compiled or FSDP), no activation count on a CPU
            detail.update(m["saved"])
            counted = sum(detail.values())
    record["measured_detail"] = detail
    mem = first["peak_allocated"] if dev.type == "cuda" else counted
    record["memory_measured_bytes"] = mem
    planned_mem = record["memory_planned_bytes"]
    if mem is not None and planned_mem:
        record["memory_error_pct"] = 100.0 * (mem - planned_mem) / planned_mem
