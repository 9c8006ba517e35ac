"""A metrics line every `run.log_every` steps: loss, learning rate, batch, grad norm, tokens/s, MFU, memory.

tokens/s = the tokens trained since the last line / the wall-clock seconds since it (nanoGPT's measure): what
the run really does, with everything a step costs (the callbacks, an evaluation or checkpoint in the
interval, the optimizer's work that overlaps the next step); a slow first step, compilation included, stays
in its own interval with log_every=1. On a GPU the clock is read after the device has finished the
interval's work (the one synchronisation, on log steps only). MFU = tokens/s x the plan's FLOPs per token /
(peak x ranks).
"""

from __future__ import annotations

import time

import torch

from ...data.mixture import source_tokens
from ...machine import BusyMeter
from ...plan.flops import mfu
from ..state import Asks, Interval, StepResult
from . import Callback, TrainerView


class MetricsLogger(Callback):
    def __init__(self, plan: dict):
        self.plan = plan  # the trainer's plan of this run: its FLOPs per token and the peak behind MFU

    def on_fit_start(self, trainer: TrainerView) -> None:
        self.tokens, self.since, self.started = 0, trainer.state.step, device_clock(trainer.rt.device)
        # On a CPU, how much of the machine other work took over each interval: the plan is an idle machine's
        self.others = BusyMeter() if trainer.rt.device.type == "cpu" else None
        convention = trainer.config.flops.convention
        self.flops_per_token = self.plan["flops"]["per_token" if convention == "palm" else "per_token_6n"]

    def on_step_end(self, trainer: TrainerView, result: StepResult) -> Asks | None:
        self.tokens += result.batch_tokens
        step = trainer.state.step
        if step % trainer.config.run.log_every and step != trainer.total_steps:
            return None
        now = device_clock(trainer.rt.device)
        tps = self.tokens / max(now - self.started, 1e-9)
        peak = self.plan["hardware"]["peak_tflops"]
        utilisation = mfu(tps, self.flops_per_token, trainer.rt.world_size, peak)
        record = {
            "step": step,
            "tokens": trainer.state.tokens,
            "loss": result.loss,
            "lr": result.lr,
            "batch_tokens": result.batch_tokens,
            "grad_norm": result.grad_norm,
            "tokens_per_s": tps,
            "mfu": utilisation,
            "peak_mem_bytes": peak_memory(trainer.rt.device),
        }
        if result.moe:  # the last step's balancing losses and expert load (pretrain.model.moe)
            record.update(result.moe)
        if trainer.mixture:  # the batches handed out so far, not those read ahead (data/mixture.py)
            record["source_tokens"] = source_tokens(trainer.batches.state_dict())
        trainer.log.metrics(record)
        busy = self.others.busy_cores() if self.others else None
        interval = Interval(
            step=step, start=self.since, tokens_per_s=tps, mfu=utilisation, loss=result.loss, busy_cores=busy
        )
        self.tokens, self.since, self.started = 0, step, now
        return Asks(interval=interval)


def device_clock(device: torch.device) -> float:
    """Seconds on a monotonic clock once the device has done the work queued so far."""
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    return time.perf_counter()


def peak_memory(device: torch.device) -> int:
    """GPU: the allocator's peak; CPU: the process's peak RSS (Linux reports KiB)."""
    if device.type == "cuda":
        return int(torch.cuda.max_memory_allocated(device))
    import resource

    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
