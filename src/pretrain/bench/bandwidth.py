"""Memory bandwidth: a device-to-device copy, and host-to-device transfers from pinned memory.

A copy reads every byte once and writes it once, so GB/s = 2 x bytes / seconds, the convention of STREAM's
"copy" and of CUDA's bandwidthTest (device to device); the data-sheet figure counts both directions too.
The buffer must be far larger than the caches (50 MB of L2 on an H100, tens of MB of L3 on a server CPU),
or the cache's bandwidth is measured instead.
"""

from __future__ import annotations

import torch

from .timing import median_seconds

GPU_COPY_BYTES = 1 << 30  # 1 GiB, two buffers
CPU_COPY_BYTES = 256 << 20  # 256 MiB, above most CPUs' L3
HOST_TO_DEVICE_BYTES = 256 << 20


def device_copy_gbps(device: torch.device, budget: float, nbytes: int | None = None) -> float:
    """Device memory bandwidth in GB/s (1e9 bytes), from dst.copy_(src)."""
    nbytes = nbytes or (GPU_COPY_BYTES if device.type == "cuda" else CPU_COPY_BYTES)
    # The values do not matter to a copy, but every page must be written first: untouched host pages all
    # map to one zero page, which sits in the cache.
    src = torch.ones(nbytes, dtype=torch.uint8, device=device)
    dst = torch.ones_like(src)
    seconds = median_seconds(lambda: dst.copy_(src), device, budget)
    return 2 * nbytes / seconds / 1e9


def host_to_device_gbps(device: torch.device, budget: float, nbytes: int = HOST_TO_DEVICE_BYTES) -> float | None:
    """Host-to-device bandwidth in GB/s from pinned (page-locked) host memory, what a DataLoader with
    pin_memory=True feeds; None on a CPU, where there is no transfer."""
    if device.type != "cuda":
        return None
    src = torch.ones(nbytes, dtype=torch.uint8).pin_memory()
    dst = torch.empty(nbytes, dtype=torch.uint8, device=device)
    # non_blocking: a DMA transfer the synchronisation in timing.py waits for, as in a training input pipeline
    seconds = median_seconds(lambda: dst.copy_(src, non_blocking=True), device, budget)
    return nbytes / seconds / 1e9
