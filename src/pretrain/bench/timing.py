"""Honest timing of one operation: warm-up, device synchronisation, median of several repeats.

CUDA kernels run asynchronously: a wall clock read right after a launch measures the launch, not the work.
Every timed repeat is therefore fenced by `torch.cuda.synchronize()`, and holds enough calls that the fence's
own latency (tens of microseconds) is a small fraction of it. The median of the repeats ignores a repeat
slowed by something else on the machine.
"""

from __future__ import annotations

import statistics
import time

import torch

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
