"""`pretrain sweep --from-fit N`: the planner's N fastest layouts (`pretrain plan --fit`), each timed with the
real training step on this machine in interleaved rounds (the median, with its spread), measured beside
predicted; the fastest that ran is the choice.

The fit is made for the hardware the sweep runs on (the detected GPU or the CPU, this world size) at the peak
the sweep's MFU uses (the catalog's, a profile's, or the one-time measurement), so predicted and measured
speak of the same machine. The fit proposes only layouts the trainer runs (config/trainable.py), for this
world: one process measures the single-process layouts, `torchrun --nproc-per-node N -m pretrain sweep ...`
the layouts of N ranks (tensor, pipeline, data parallel), each cell on all of them. A candidate a cell still
refuses is reported "not run: why". The ranking model's error is printed: per candidate (measured /
predicted - 1), their mean absolute value, and whether the predicted fastest is the measured fastest.
"""

from __future__ import annotations

import statistics
from pathlib import Path

import torch

from ..bench.timing import NOISY_SPREAD_PCT, check_rounds, check_threads, cpu_threads, spread, torch_threads
from ..config import replaced
from ..errors import UsageError
from ..plan import make_plan
from ..plan.fit import command_line, fit
from . import output
from .run import _device_name, load_for_world, run_sweep

DATA_PARALLEL = {
    "parallel.tensor": 1,
    "parallel.pipeline": 1,
    "parallel.sequence_parallel": False,
    "parallel.offload": "none",
}  # the layout keys the fit chooses; the rest of the config is the user's


def run_from_fit(
    config_path: str | Path | dict | None,
    overrides: list[str],
    n: int,
    warmup_steps: int = 2,
    steps: int = 3,
    out_dir: str | Path | None = "sweep",
    rounds: int = 3,
    threads: int | None = None,
) -> dict:
    """Time the top `n` candidates of `fit`, each `rounds` times in interleaved rounds (run_sweep's); returns
    {"device", "candidates": [...], "chosen", "error", "warnings", ...}."""
    from ..config.trainable import check_trainable
    from ..distributed.runtime import init_runtime
    from ..train import plan_check

    if n < 1:
        raise UsageError(f"--from-fit: must be at least 1 candidate, got {n}")
    check_rounds(rounds)
    check_threads(threads)
    config = load_for_world(config_path, overrides)
    # What the trainer would refuse whatever the layout: one line now, before any fit or cell.
    check_trainable(replaced(config, DATA_PARALLEL), needs_data=False)
    rt = init_runtime(config.train.device)
    n_threads, chosen_as = cpu_threads(threads) if rt.device.type == "cpu" or threads else (None, None)
    with torch_threads(n_threads or torch.get_num_threads()):
        here = plan_check.config_for_device(config, rt)
        hardware, source = plan_check.measured_hardware(here, rt.device)
        # measured (a CPU's profile, an unlisted GPU's peak): the same for the fit and every cell
        pinned = [
            f"{key}={value!r}" if isinstance(value, float) else f"{key}={value}" for key, value in hardware.items()
        ]
        here = replaced(here, hardware)
        peak = make_plan(here)["hardware"]["peak_tflops"]
        found = fit(here, top=n)  # only layouts the trainer runs (config/trainable.py)
        if not found["candidates"]:
            raise UsageError("--from-fit: no layout fits on this machine (pretrain plan --fit says why)")
        out = Path(out_dir) if out_dir is not None else None
        if out is not None:
            output.make_dir(out)
        candidates = list(enumerate(found["candidates"], 1))
        # The world the fit was made for: a layout of tensor x pipeline ranks is valid only on it.
        base = [*overrides, *pinned, f"parallel.gpus={rt.world_size}"]
        ran, failed = _interleaved_rounds(config_path, base, candidates, rounds, warmup_steps, steps, n_threads)
    rows = [_row(rank, cand, [] if rank in failed else ran[rank], failed.get(rank, "ok")) for rank, cand in candidates]
    measured = [r for r in rows if r["measured_tokens_per_s"] is not None]
    chosen = max(measured, key=lambda r: r["measured_tokens_per_s"]) if measured else None
    result = {
        "device": _device_name(rt.device),
        "peak_tflops": peak,
        "peak_source": source,
        "hardware": hardware,  # the measured keys the fit and every cell were planned with (a CPU's profile)
        "threads": n_threads,
        "threads_chosen_as": chosen_as,
        "rounds": rounds,
        "candidates": rows,
        "chosen": chosen,
        "error": _ranking_error(measured, chosen),
        "warnings": _candidate_noise_warnings(rows),
    }
    if out is not None:
        output._write(out, "from_fit.json", output.to_json(result).encode())  # temp + rename
        result["file"] = str(out / "from_fit.json")
    return result


def _interleaved_rounds(
    config_path: str | Path | dict | None,
    base: list[str],
    candidates: list,
    rounds: int,
    warmup_steps: int,
    steps: int,
    threads: int | None,
) -> tuple[dict[int, list[dict]], dict[int, str]]:
    """Each candidate timed by one sweep cell a round, A B A B, so that a busy spell slows every candidate
    alike, not the one it hits: (rank -> each round's cell, rank -> why it runs no more rounds)."""
    ran = {rank: [] for rank, _ in candidates}
    failed = {}
    for _ in range(rounds):
        for rank, cand in candidates:
            if rank in failed:
                continue
            items = [*base, *command_line(cand["overrides"]).split()]
            try:
                cell = run_sweep(
                    config_path,
                    items,
                    {},
                    warmup_steps=warmup_steps,
                    steps=steps,
                    out_dir=None,
                    progress=False,
                    rounds=1,
                    threads=threads,
                )["cells"][0]
            except UsageError as e:  # a layout the trainer refuses: said in its row, the others still run
                failed[rank] = f"not run: {e}"
                continue
            if cell["status"] != "ok":
                failed[rank] = cell["status"]
            else:
                ran[rank].append(cell)
    return ran, failed


def _ranking_error(measured: list[dict], chosen: dict | None) -> dict:
    """How far the ranking model was from what ran: its mean error, and where its fastest came."""
    errors = [abs(r["error_pct"]) for r in measured]
    return {
        "mean_abs_pct": sum(errors) / len(errors) if errors else None,
        "predicted_fastest_is_fastest": bool(measured)
        and chosen is not None
        and chosen["rank"] == min(r["rank"] for r in measured),
        "measured_rank_of_predicted_fastest": _measured_rank(measured),
    }


def _candidate_noise_warnings(rows: list[dict]) -> list[str]:
    """One line per candidate whose rounds differ by more than NOISY_SPREAD_PCT (output.noise_warnings: per cell)."""
    return [
        f"warning: #{r['rank']}: measured tokens/s spread {r['spread_pct']:.0f}% over {r['rounds']} "
        f"rounds, above {NOISY_SPREAD_PCT:.0f}%: the machine is busy and the choice may be noise; "
        "run on a quiet machine or with more --rounds"
        for r in rows
        if r["noisy"]
    ]


def _row(rank: int, cand: dict, cells: list[dict], status: str) -> dict:
    """A candidate's row: predicted beside the median of its rounds, with their spread."""
    noise = spread([c["tokens_per_s"] for c in cells]) if cells else None
    measured = noise and noise["median"]

    def median(key):
        return statistics.median(c[key] for c in cells) if cells and cells[0][key] is not None else None

    return {
        "rank": rank,
        "overrides": cand["overrides"],
        "status": status,
        "predicted_tokens_per_s": cand["tokens_per_s"],
        "measured_tokens_per_s": measured,
        "error_pct": None if measured is None else 100 * (measured / cand["tokens_per_s"] - 1),
        "predicted_step_s": cand["step_time_s"],
        "measured_step_s": median("step_seconds"),
        "memory_planned_bytes": cand["memory_bytes"]["total"],
        "mfu": median("mfu"),
        "rounds": len(cells),
        "measured_tokens_per_s_each_round": [c["tokens_per_s"] for c in cells],
        "spread_pct": noise and noise["spread_pct"],
        "noisy": bool(noise and noise["noisy"]),
    }


def _measured_rank(ran: list[dict]) -> int | None:
    if not ran:
        return None
    order = sorted(ran, key=lambda r: -r["measured_tokens_per_s"])
    return 1 + order.index(min(ran, key=lambda r: r["rank"]))


def render(result: dict) -> str:
    threads = (
        f", {result['threads']} CPU thread{'s' if result['threads'] != 1 else ''} ({result['threads_chosen_as']})"
        if result["threads"]
        else ""
    )
    lines = [
        f"pretrain sweep --from-fit on {result['device']} (peak {result['peak_tflops']:.4g} TFLOP/s: "
        f"{result['peak_source']}); measured: median of {result['rounds']} interleaved rounds{threads}",
        "",
        f"  {'#':>2}  {'layout':<58} {'predicted':>11} {'measured':>11} {'spread':>7} {'error':>8}  status",
    ]
    for r in result["candidates"]:
        o = r["overrides"]
        layout = (
            f"micro {o['train.micro_batch_size']} x {o['train.grad_accum_steps']}, recompute "
            f"{o['train.activation_checkpointing']}, ZeRO {o['parallel.zero_stage']}, TP {o['parallel.tensor']}, "
            f"PP {o['parallel.pipeline']}"
        )
        measured = "-" if r["measured_tokens_per_s"] is None else f"{r['measured_tokens_per_s']:,.0f}"
        error = "-" if r["error_pct"] is None else f"{r['error_pct']:+.0f}%"
        noise = "-" if r["rounds"] < 2 else f"{r['spread_pct']:.0f}%" + ("!" if r["noisy"] else "")
        lines.append(
            f"  {r['rank']:>2}  {layout:<58} {r['predicted_tokens_per_s']:>11,.0f} {measured:>11} "
            f"{noise:>7} {error:>8}  {r['status']}"
        )
    e = result["error"]
    if result["chosen"] is None:
        lines += ["", "  none ran: nothing to choose"]
        return "\n".join(lines)
    lines += [
        "",
        f"  ranking model's error: mean |measured / predicted - 1| = {e['mean_abs_pct']:.0f}%; the predicted "
        f"fastest ran {_ordinal(e['measured_rank_of_predicted_fastest'])} fastest",
        f"  chosen (fastest measured): #{result['chosen']['rank']} " + command_line(result["chosen"]["overrides"]),
    ]
    if "file" in result:
        lines.append(f"  wrote {result['file']}")
    return "\n".join(lines)


def _ordinal(k: int) -> str:
    return {1: "1st", 2: "2nd", 3: "3rd"}.get(k, f"{k}th")
