"""`pretrain sweep` as a function: the real training step timed for every combination of config values.

Each cell builds its own Config (the base, the fixed overrides, the cell's values), a `Trainer` fed with
synthetic tokens, runs `warmup_steps` optimizer steps (the second one measures memory tensor by tensor, as
`pretrain train` does) and then times `steps` more, `rounds` times in interleaved rounds (each figure the
median round's, with the spread). Beside every figure stands the planner's, for the same config on this
device, so a sweep is also a test of the planner.
"""

from __future__ import annotations

import contextlib
import datetime
import gc
import os
import time
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import TYPE_CHECKING

import torch

from ..bench.timing import check_rounds, check_threads, cpu_threads, torch_threads
from ..config import ResolvedConfig, load_config, replaced
from ..errors import ConfigError, UsageError
from ..plan import make_plan
from ..plan.length import training_length
from ..plan.params import count_params
from ..plan.schedule import checked_warmup
from ..precision import matmul_dtype
from ..progress import counting_bar
from ..train import use_expandable_segments
from . import grid, output
from .grid import Cell
from .records import OK, OOM, SKIPPED_BUDGET, SKIPPED_FIT, records
from .synthetic import SyntheticTokens

if TYPE_CHECKING:
    from ..distributed.runtime import Runtime

# progress: a bar on stderr (True), none (False), or a callable(done, total, description)
Progress = bool | Callable[[int, int, str], None]
Advance = Callable[[int, int, str], None]

MIN_WARMUP_STEPS = 2  # the Trainer measures memory on its 2nd step (MEASURE_STEP), after optimizer states exist


def run_sweep(
    config_path: str | Path | dict | None = None,
    overrides: Sequence[str] = (),
    sweep: dict | None = None,
    budget_seconds: float | None = None,
    try_all: bool = False,
    warmup_steps: int = 2,
    steps: int = 3,
    out_dir: str | Path | None = "sweep",
    progress: Progress = True,
    rounds: int = 3,
    threads: int | None = None,
) -> dict:
    """Time the real training step for every combination of `sweep` values; return the JSON-ready result.

    config_path: a YAML file (or a dict, or None for the defaults), with `overrides` (`section.key=value`
      strings) on top, as `pretrain plan` reads them.
    sweep: {"train.seq_len": [256, 1024], ...}: every combination is one cell; {} or None is one cell.
    budget_seconds: no cell starts once this many seconds have passed (a started cell runs to its end);
      a cell with no round run by then is reported as "skipped: budget".
    try_all: also run the cells whose plan says they do not fit (plan["fits"] is False).
    warmup_steps, steps: untimed steps (at least 2: the 2nd measures memory), then timed ones.
    rounds: every cell is run this many times, in interleaved rounds (A B A B: round 1 runs each cell once,
      then round 2 ...), so that a machine busy for a while slows every cell alike, not one; each figure is
      the median of the rounds, with their spread.
    threads: torch's CPU threads for every cell; None: the free cores (bench.timing.cpu_threads).
    out_dir: where sweep.csv, sweep.json and sweep.png go (rewritten after each cell); None writes nothing.
    progress: True for a bar on stderr (on a terminal), False, or a callable(done, total, description).

    Every cell's config is loaded, checked and planned before any cell runs: a bad key or value raises
    ConfigError / UsageError naming it, and nothing is measured.
    """
    use_expandable_segments()  # as `pretrain train` allocates: a near-limit cell fits where training would
    started = time.perf_counter()
    _check_arguments(warmup_steps, steps, budget_seconds, rounds, threads)
    sweep = {k: list(v) for k, v in (sweep or {}).items()}
    cells = prepare_cells(config_path, list(overrides), sweep)
    on_cpu = cells[0].rt.device.type == "cpu"
    n_threads, chosen_as = cpu_threads(threads) if on_cpu or threads else (None, None)
    with torch_threads(n_threads or torch.get_num_threads()):
        peaks = _set_peaks(cells)
        result = {
            **_machine(cells[0].rt.device, n_threads, chosen_as),
            "config": str(config_path) if isinstance(config_path, (str, Path)) else None,
            "overrides": list(overrides),
            "swept": {k: list(dict.fromkeys(c.values[k] for c in cells)) for k in sweep},
            "warmup_steps": warmup_steps,
            "steps": steps,
            "rounds": rounds,
            "budget_seconds": budget_seconds,
            "try_all": try_all,
            "memory_measured_as": memory_method(cells[0].rt.device),
            "peak_tflops": peaks,
            "cells": [],
            "warnings": [],
            "elapsed_seconds": None,
            "files": {},
        }
        out = Path(out_dir) if out_dir is not None else None
        if out is not None:
            output.make_dir(out)  # an unwritable --out fails now, not after the first cell
        runs, ended, seconds = _run_rounds(
            cells, result, out, started, budget_seconds, try_all, (warmup_steps, steps, rounds), progress, n_threads
        )
        result["cells"] = records(cells, runs, ended, seconds, n_threads)
        result["warnings"] = output.noise_warnings(result["cells"])
        result["elapsed_seconds"] = round(time.perf_counter() - started, 3)
        if out is not None:
            result["files"] = output.write_all(result, out)
    return result


def _machine(dev: torch.device, threads: int | None, chosen_as: str | None) -> dict:
    """When and on what the sweep ran: the date, the device, torch's version and its CPU threads."""
    return {
        "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "device": _device_name(dev),
        "device_type": dev.type,
        "torch": torch.__version__,
        "threads": threads,
        "threads_chosen_as": chosen_as,
    }


def _check_arguments(
    warmup_steps: int, steps: int, budget_seconds: float | None, rounds: int, threads: int | None
) -> None:
    """The sweep's own options, checked before any cell is loaded."""
    if not isinstance(warmup_steps, int) or warmup_steps < MIN_WARMUP_STEPS:
        raise UsageError(
            f"--warmup-steps: must be at least {MIN_WARMUP_STEPS} (the trainer measures memory on its "
            f"step {MIN_WARMUP_STEPS}, once optimizer states exist), got {warmup_steps}"
        )
    if not isinstance(steps, int) or steps < 1:
        raise UsageError(f"--steps: must be at least 1 timed step, got {steps}")
    if budget_seconds is not None and not budget_seconds > 0:
        raise UsageError(f"--budget-seconds: must be a positive number of seconds, got {budget_seconds}")
    check_rounds(rounds)
    check_threads(threads)


def _run_rounds(
    cells: list[Cell],
    result: dict,
    out: Path | None,
    started: float,
    budget_seconds: float | None,
    try_all: bool,
    counts: tuple[int, int, int],
    progress: Progress,
    n_threads: int | None,
) -> tuple[dict[int, list[dict]], dict[int, tuple[str, str | None]], dict[int, float]]:
    """Every cell once per round, rounds interleaved; the tables rewritten after each cell. Returns each cell's
    measurements, the cells that ended early (status, error), and each cell's seconds."""
    warmup_steps, steps, rounds = counts
    runs: dict[int, list[dict]] = {cell.index: [] for cell in cells}  # each round's measurement
    ended: dict[int, tuple[str, str | None]] = {}  # a cell that runs no more rounds: (status, error)
    seconds = dict.fromkeys(runs, 0.0)
    with _progress(progress) as advance:
        for done, (round_, cell) in enumerate((r, c) for r in range(rounds) for c in cells):
            if cell.index in ended:
                continue
            if advance:
                advance(done, rounds * len(cells), _describe(cell) + (f", round {round_ + 1}" if rounds > 1 else ""))
            cell_started = time.perf_counter()
            if budget_seconds is not None and cell_started - started >= budget_seconds:
                ended[cell.index] = (OK if runs[cell.index] else SKIPPED_BUDGET, None)
                continue
            if cell.plan["fits"] is False and not try_all:
                ended[cell.index] = (SKIPPED_FIT, None)
                continue
            ran = run_cell(cell, warmup_steps, steps)
            seconds[cell.index] += time.perf_counter() - cell_started
            if "measured" in ran:
                runs[cell.index].append(ran["measured"])
            else:
                ended[cell.index] = (ran["status"], ran["error"])
            result["cells"] = records(cells, runs, ended, seconds, n_threads)
            result["elapsed_seconds"] = round(time.perf_counter() - started, 3)
            if out is not None:
                result["files"] = output.write_tables(result, out)
        if advance:
            advance(rounds * len(cells), rounds * len(cells), "plot")
    return runs, ended, seconds


# --- before any cell runs ------------------------------------------------------------------------------------


def prepare_cells(config_path: str | Path | dict | None, overrides: list[str], sweep: dict) -> list[Cell]:
    """Load, check and plan every cell; raises on the first bad one, naming its key (and the cell)."""
    from ..config.trainable import check_trainable
    from ..distributed.runtime import init_runtime
    from ..train import plan_check

    runtimes: dict[str, Runtime] = {}
    cells = []
    for index, values in enumerate(grid.cells(sweep)):
        own = grid.cell_overrides(values)
        where = f" (sweep cell {' '.join(own)})" if own else ""
        try:
            # Synthetic tokens: a data directory is neither needed nor read. No batch ramp: every timed step
            # runs at the cell's full batch, as labelled.
            config = replaced(
                load_for_world(config_path, [*overrides, *own]), {"data.dir": None, "train.batch_ramp_tokens": 0}
            )
            check_trainable(config, needs_data=False)
            _check_length(config)
            device = config.train.device
            if device not in runtimes:
                runtimes[device] = init_runtime(device)
            rt = runtimes[device]
            device_config = plan_check.config_for_device(config, rt)
            p = make_plan(device_config)
        except UsageError as e:
            raise (ConfigError if isinstance(e, ConfigError) else UsageError)(f"{e}{where}") from None
        resolved = {key: getattr(getattr(config, key.split(".", 1)[0]), key.split(".", 1)[1]) for key in values}
        cells.append(
            Cell(index=index, values=resolved, overrides=own, config=config, device_config=device_config, rt=rt, plan=p)
        )
    return cells


def load_for_world(config_path: str | Path | dict | None, overrides: list[str]) -> ResolvedConfig:
    """The config as this sweep's processes run it: the world torchrun started (1 alone) is parallel.gpus, as
    for `pretrain train`; a tensor x pipeline layout it cannot hold says how many processes to launch (its
    parallel.gpus is not a figure to edit: a sweep measures the processes it has)."""
    from ..config.checks import GridError
    from ..config.trainable import wrong_process_count

    world = int(os.environ.get("WORLD_SIZE", "1"))
    try:
        return load_config(config_path, [*overrides, f"parallel.gpus={world}"])
    except GridError as e:
        raise ConfigError(wrong_process_count(e.tensor, e.pipeline, world, "sweep")) from None


def _check_length(config: ResolvedConfig) -> None:
    """The schedule the Trainer refuses (a warm-up as long as the run, ...): say so now, before any cell runs."""
    checked_warmup(config.train, training_length(config, count_params(config.model).active)["steps"])


def _set_peaks(cells: list[Cell]) -> dict:
    """The peak TFLOP/s behind MFU, per cell: the planner's (catalog, profile, hardware.peak_tflops), else this
    machine's measurement per dtype for the sweep (plan_check.measured_hardware: a CPU's profile, a GPU's peak)."""
    from ..train import plan_check

    measured: dict[tuple, tuple] = {}
    peaks = {}
    for cell in cells:
        hw = cell.plan["hardware"]
        if hw["peak_tflops"]:
            peak, source = hw["peak_tflops"], hw["peak_source"]
        else:
            key = (str(cell.rt.device), matmul_dtype(cell.config.train.precision, cell.rt.device.type))
            if key not in measured:
                measured[key] = plan_check.measured_hardware(cell.device_config, cell.rt.device)
            hardware, source = measured[key]
            cell.config, cell.device_config = (replaced(c, hardware) for c in (cell.config, cell.device_config))
            cell.plan = make_plan(cell.device_config)  # the planned tokens/s at the same peak as the MFU
            peak = cell.plan["hardware"]["peak_tflops"]
        cell.plan["hardware"]["peak_source"] = source
        peaks[cell.config.train.precision] = {"tflops": peak, "source": source}
    return peaks


# --- one cell --------------------------------------------------------------------------------------------------


def run_cell(cell: Cell, warmup_steps: int, steps: int) -> dict:
    """Build the Trainer, run the warm-up and timed steps; {'measured': ...} or {'status': OOM, 'error': ...}."""
    from ..bench.timing import synchronize
    from ..train.callbacks.plan_vs_run import MEASURE_STEP
    from ..train.trainer import Trainer

    dev = cell.rt.device
    free_memory(dev)
    # A fresh torch.compile cache per cell, as `pretrain train` starts with: one process's cache across cells
    # recompiles each new model, then traces dynamic shapes once a cell's shapes differ, then runs eager past
    # the recompile limit, so compiled cells were not comparable (inductor's on-disk cache stays: no recompile).
    torch._dynamo.reset()
    t = cell.config.train
    trainer = error = measured = None
    try:
        loader = SyntheticTokens(cell.config.model.vocab_size, t.seq_len, seed=t.seed)
        trainer = Trainer(cell.config, cell.rt, loader=loader, quiet=True, plan=cell.plan)
        measurement = None
        for _ in range(warmup_steps):
            step = trainer.step(measure=trainer.state.step + 1 == MEASURE_STEP)  # what a run's plan vs run measures
            measurement = step.measured or measurement
        synchronize(dev)
        if dev.type == "cuda":
            # The peak of the timed steps: steady training, with everything the warm-up allocated (weights,
            # optimizer states) still counted, but not the measurement step's extra recomputed block.
            torch.cuda.reset_peak_memory_stats(dev)
        times, timed = [], []
        for _ in range(steps):
            t0 = time.perf_counter()
            timed.append(trainer.step())
            synchronize(dev)
            times.append(time.perf_counter() - t0)
        peak_allocated = int(torch.cuda.max_memory_allocated(dev)) if dev.type == "cuda" else None
        measured = {
            "times": times,
            "tokens": sum(step.batch_tokens for step in timed),
            "loss": timed[-1].loss,
            "measurement": measurement,
            "peak_allocated": peak_allocated,
        }
    except (torch.cuda.OutOfMemoryError, MemoryError) as e:
        error = _first_line(e)
    except RuntimeError as e:  # the CPU allocator says so in a plain RuntimeError
        if not any(s in str(e).lower() for s in ("out of memory", "can't allocate memory", "not enough memory")):
            raise
        error = _first_line(e)
    finally:
        if trainer is not None:
            trainer.batches.close()
        del trainer  # the exception's frames are gone too once we are out of the except clause
    free_memory(dev)
    if error is not None:
        return {"status": OOM, "error": error}
    return {"measured": measured}


def free_memory(dev: torch.device) -> None:
    """Give the previous cell's tensors back, so each cell's peak is its own."""
    gc.collect()
    if dev.type == "cuda":
        torch.cuda.synchronize(dev)
        torch.cuda.empty_cache()


def memory_method(dev: torch.device) -> str:
    if dev.type == "cuda":
        return (
            "peak allocated (torch.cuda.max_memory_allocated over the timed steps) vs the plan's total - cuda_context"
        )
    return (
        "tensor count at the measurement step (parameters + gradients + optimizer states + working copies + "
        "saved activations, as `pretrain train` counts them) vs the plan's model_states + activations"
    )


# --- small helpers ----------------------------------------------------------------------------------------------


def _first_line(e: BaseException) -> str:
    text = str(e).strip().splitlines()
    return f"{type(e).__name__}: {text[0] if text else ''}".strip()


def _describe(cell: Cell) -> str:
    return " ".join(f"{k.split('.')[-1]}={v}" for k, v in cell.values.items()) or "base config"


def _device_name(dev: torch.device) -> str:
    from ..bench.run import _device_name as name

    return name(dev)


@contextlib.contextmanager
def _progress(progress: Progress) -> Iterator[Advance | None]:
    """A `advance(done, total, description)` callback: rich's bar over cells with an ETA, on stderr."""
    if callable(progress):
        yield progress
        return
    with counting_bar("sweep", enabled=bool(progress), eta=True) as advance:
        yield advance
