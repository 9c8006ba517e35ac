"""A check of a training run before anything is allocated or written: does the planned memory fit the machine.
(What the run directory holds is checkpoint/run_dir.py's.)"""

from __future__ import annotations

import os
from pathlib import Path
from typing import TYPE_CHECKING

from ..errors import ConfigError
from ..units import GiB

if TYPE_CHECKING:
    from ..distributed.runtime import Runtime


def host_memory_bytes() -> int:
    """The host's RAM, or the container's limit when lower (cgroup v2 memory.max: what its OOM killer uses)."""
    total = os.sysconf("SC_PHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
    try:
        limit = Path("/sys/fs/cgroup/memory.max").read_text().strip()
        if limit != "max":
            total = min(total, int(limit))
    except (OSError, ValueError):
        pass
    return total


def check_fits_device(plan: dict, rt: Runtime) -> None:
    """Refuse a run whose planned memory per process (`plan`: the run's, for the device it has) exceeds its
    device: the GPU's memory, or on a CPU the host's RAM shared by the ranks on this host. Called before the
    model is built: the default 6.7B config started on a laptop is one line, not minutes of swapping and the
    OOM killer."""
    import torch

    m = plan["memory_bytes"]
    per_process = m["total"]
    if rt.device.type == "cuda":
        have = torch.cuda.get_device_properties(rt.device).total_memory
        need, where = per_process, f"GPU {torch.cuda.get_device_name(rt.device)}"
    else:
        ranks_here = int(os.environ.get("LOCAL_WORLD_SIZE", "1"))
        have, need = host_memory_bytes(), per_process * ranks_here
        where = "this host's RAM" + (f" ({ranks_here} ranks of {per_process / GiB:.1f} GiB)" if ranks_here > 1 else "")
    if need > have:
        parts = ", ".join(f"{k} {m[k] / GiB:.1f}" for k in ("weights", "gradients", "optimizer", "activations"))
        raise ConfigError(
            f"the plan needs {need / GiB:.1f} GiB per process ({parts} GiB) but {where} has "
            f"{have / GiB:.1f} GiB; choose a smaller model, batch or sequence, or more devices "
            "(`pretrain plan` with this config shows the memory and ways to fit it)"
        )
