"""What the planner needs to know of a CPU to time a step of eager PyTorch (pretrain.plan.cpu_time): the best
matmul TFLOP/s of the run's dtype, the bandwidth an elementwise op streams at, and the seconds one dispatched op
of our model costs (Python, the dispatcher, autograd, and with several threads OpenMP's fork and join), which
is what a small model's step is made of. A hardware profile in the format of `pretrain bench --out`, measured
in a few seconds; the trainer keeps one per machine, threads and torch (pretrain.train.plan_check).
"""

from __future__ import annotations

import datetime
import os
import platform

import torch
from torch.utils._python_dispatch import TorchDispatchMode

from ..config import load_config
from ..machine import BusyMeter
from ..model import build_model
from . import matmul
from .bandwidth import device_copy_gbps
from .timing import median_seconds

# A small model of ours, the tests' debug shape at 4 x 32 tokens: most of its step is its ops' overhead, at the
# sizes a small model's ops have (a nano model's ops cost half as much each); its arithmetic is taken off.
OP_MODEL = ["model.preset=debug", "train.seq_len=32", "train.micro_batch_size=4"]
SHARE = {"matmul": 0.6, "ops": 0.3, "copy": 0.1}  # of the budget


class _OpCounter(TorchDispatchMode):
    """Counts the aten ops dispatched under it (below autograd: forward, backward and optimizer alike)."""

    def __init__(self) -> None:
        super().__init__()
        self.ops = 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        self.ops += 1
        return func(*args, **(kwargs or {}))


def op_seconds(budget: float, peak_tflops: float) -> tuple[float, int]:
    """(seconds per dispatched op, ops per step) of a training step of OP_MODEL on the CPU: forward, backward,
    gradient clipping, fused AdamW and zero_grad, as the trainer's step runs them, timed (median), less its
    FLOPs at `peak_tflops` (the planner's count), divided by the ops it dispatches."""
    from ..plan import make_plan

    cfg = load_config(None, OP_MODEL)
    model = build_model(cfg.model)
    params = [p for p in model.parameters() if p.requires_grad]
    optimizer = torch.optim.AdamW(params, lr=1e-3, fused=True)
    t = cfg.train
    x = torch.randint(0, cfg.model.vocab_size, (t.micro_batch_size, t.seq_len))
    flops = make_plan(cfg)["flops"]["per_token_hardware"] * x.numel()

    def step():
        model(x, x).backward()
        torch.nn.utils.clip_grad_norm_(params, 1.0, foreach=True)
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)

    step()  # the optimizer's states exist from the second step on: count a step like every later one
    counter = _OpCounter()
    with counter:
        step()
    seconds = median_seconds(step, torch.device("cpu"), budget) - flops / (peak_tflops * 1e12)
    return max(seconds, 0.0) / counter.ops, counter.ops


def cpu_profile(dtype: str, budget: float = 3.0) -> dict:
    """This CPU's profile at torch's current threads: {"device", "device_type", "peak_tflops": {dtype: best},
    "memory_bandwidth_gbps", "op_seconds", "threads", "torch", "machine", "processor", "date", "busy_cores"}
    ("busy_cores": what other processes kept busy while it was measured, when the OS says)."""
    meter = BusyMeter()
    shapes = matmul.sweep(dtype, torch.device("cpu"), budget * SHARE["matmul"], quick=True)
    peak = matmul.summary(shapes)[0]
    seconds, ops = op_seconds(budget * SHARE["ops"], peak)
    copy = device_copy_gbps(torch.device("cpu"), budget * SHARE["copy"])
    return {
        "device": "cpu",
        "device_type": "cpu",
        "peak_tflops": {dtype: peak},
        "memory_bandwidth_gbps": copy,
        "op_seconds": seconds,
        "ops_per_step_measured": ops,
        "threads": torch.get_num_threads(),
        "torch": torch.__version__,
        "machine": platform.node(),
        "processor": processor(),
        "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "busy_cores": meter.busy_cores(),
    }


def processor() -> str:
    """The CPU model (two machines with the same name share a measurement only if their CPUs match)."""
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine() or os.name
