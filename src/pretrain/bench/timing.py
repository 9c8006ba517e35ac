"""Honest timing of one operation: warm-up, device synchronisation, median of several repeats.

CUDA kernels run asynchronously: a wall clock read right after a launch measures the launch, not the work.
Every timed repeat is therefore fenced by `torch.cuda.synchronize()`, and holds enough calls that the fence's
own latency (tens of microseconds) is a small fraction of it. The median of the repeats ignores a repeat
slowed by something else on the machine.
"""

from __future__ import annotations

import contextlib
import statistics
import time

import torch

from ..errors import UsageError

MIN_REPEAT_SECONDS = 0.002  # calls per repeat are chosen so one repeat lasts at least this long
WARMUP_CALLS = 2  # first calls pay for kernel selection (cuBLAS heuristics), allocation and clock ramp-up
MIN_REPEATS = 3
MAX_REPEATS = 50


def synchronize(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def median_seconds(fn, device: torch.device, budget: float) -> float:
    """Median seconds per call of fn(): repeats until `budget` seconds are spent (at least MIN_REPEATS)."""
    for _ in range(WARMUP_CALLS):
        fn()
    # Calls per repeat: doubled until a repeat lasts MIN_REPEAT_SECONDS (as timeit's autorange does).
    number = 1
    while (elapsed := _timed(fn, device, number)) < MIN_REPEAT_SECONDS:
        number *= 2
    times = [elapsed / number]
    # A deadline rather than a repeat count fixed in advance: a machine that slows down mid-run (another
    # job, thermal throttling) cannot stretch the measurement past its budget by more than MIN_REPEATS.
    deadline = time.perf_counter() + budget
    while len(times) < MIN_REPEATS or (len(times) < MAX_REPEATS and time.perf_counter() < deadline):
        times.append(_timed(fn, device, number) / number)
    return statistics.median(times)


def _timed(fn, device: torch.device, number: int) -> float:
    synchronize(device)
    start = time.perf_counter()
    for _ in range(number):
        fn()
    synchronize(device)
    return time.perf_counter() - start


# --- repeated rounds on a shared machine --------------------------------------------------------------------

NOISY_SPREAD_PCT = 10.0  # a figure whose rounds differ by more than this is reported as noise


def spread(values: list[float]) -> dict:
    """Median, min, max and (max - min) / median in % of one figure's rounds (None for one round); noisy
    above NOISY_SPREAD_PCT."""
    mid = statistics.median(values)
    pct = 100.0 * (max(values) - min(values)) / mid if len(values) > 1 and mid else None
    return {
        "median": mid,
        "min": min(values),
        "max": max(values),
        "spread_pct": pct,
        "noisy": pct is not None and pct > NOISY_SPREAD_PCT,
    }


def cpu_threads(requested: int | None) -> tuple[int, str]:
    """Torch's CPU threads for a measurement, and why. `requested` wins; else the cores this process may use
    less the ones other processes keep busy (the 1-minute load average), at least 1: torch's OpenMP threads
    wait for each other at every operation, so one thread sharing its core with another process stalls
    them all (on 2 busy cores the default 2 threads were 4x slower than 1)."""
    import os

    if requested is not None:
        return requested, "--threads"
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)
    load = os.getloadavg()[0] if hasattr(os, "getloadavg") else 0.0
    free = max(1, min(cores, torch.get_num_threads()) - round(load))
    return free, f"auto: {cores} cores, load {load:.1f}"


@contextlib.contextmanager
def torch_threads(n: int):
    """torch's intra-op CPU threads set to `n` for the block, as they were after it."""
    before = torch.get_num_threads()
    torch.set_num_threads(n)
    try:
        yield
    finally:
        torch.set_num_threads(before)


def check_threads(threads: int | None) -> None:
    if threads is not None and (not isinstance(threads, int) or threads < 1):
        raise UsageError(f"--threads: must be at least 1, got {threads}")


def check_rounds(rounds: int) -> None:
    if not isinstance(rounds, int) or rounds < 1:
        raise UsageError(f"--rounds: must be at least 1, got {rounds}")
