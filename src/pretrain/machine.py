"""How busy this machine is with other work: the cores other processes kept busy over an interval, from the
kernel's own counters (Linux's /proc/stat for the whole machine, /proc/self/stat for this process and its
threads). On a shared machine a CPU measurement tells of the share it got, not of the CPU: torch's OpenMP
threads wait for each other at every op, so one thread sharing its core stalls them all (a tiny model's step ran
22x slower with 2 threads on 2 cores loaded 8x over than with 1). Pure Python; None where the OS does not say.
"""

from __future__ import annotations

import os
import time
from pathlib import Path

BUSY_CORES = 0.25  # other processes kept more than this many cores busy: the figure is the machine's share


def _cpu_seconds() -> tuple[float, float] | None:
    """(seconds every core has spent busy, seconds this process has), since boot; None without /proc."""
    try:
        fields = Path("/proc/stat").read_text().splitlines()[0].split()[1:]
        own = Path("/proc/self/stat").read_text().rsplit(")", 1)[1].split()
    except (OSError, IndexError):
        return None
    ticks = os.sysconf("SC_CLK_TCK")
    user, nice, system, idle, iowait, irq, softirq, steal = (int(v) for v in fields[:8])
    busy = user + nice + system + irq + softirq + steal  # idle and iowait are not work
    return busy / ticks, (int(own[11]) + int(own[12])) / ticks  # utime, stime: fields 14 and 15 of stat(5)


class BusyMeter:
    """Started at construction; `busy_cores()`: the cores other processes kept busy since (or since the last
    call), on average; None where the OS does not say."""

    def __init__(self) -> None:
        self.start, self.clock = _cpu_seconds(), time.monotonic()

    def busy_cores(self) -> float | None:
        now, clock = _cpu_seconds(), time.monotonic()
        start, elapsed = self.start, clock - self.clock
        self.start, self.clock = now, clock
        if start is None or now is None or elapsed <= 0:
            return None
        others = (now[0] - start[0]) - (now[1] - start[1])
        return max(0.0, others / elapsed)


def cores() -> int:
    """The cores this process may run on."""
    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)
