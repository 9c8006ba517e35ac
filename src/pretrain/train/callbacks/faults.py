"""Fault injection for the tests (`debug.*` keys), installed only when one is set: nothing of it runs in, or
slows, a normal run's step.

NaN or spiking losses are keyed by position in the data stream (micro-batches drawn), so skipping the data
after a rollback removes the fault, as it would remove bad data. An inf gradient (rank 0 only, one embedding
row: under FSDP one rank's shard) leaves the loss finite, as an fp16 overflow does; every rank then writes
what it applied (faults.rank<R>.json), for a test to check that the ranks skipped alike. `stop_after_step`
behaves as a preemption; `step_sleep` slows the run so that a test can kill it at a chosen moment.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from typing import TYPE_CHECKING

import torch

from ...files import write_atomic
from ..state import Asks, StepResult
from . import Callback, TrainerView

if TYPE_CHECKING:
    from ...config.trainer_sections import DebugConfig


class FaultInjection(Callback):
    def __init__(self, debug: DebugConfig):
        self.debug = debug

    @staticmethod
    def wanted(debug: DebugConfig) -> bool:
        return bool(
            debug.inject_nan_batches
            or debug.inject_spike_batches
            or debug.inject_inf_grad_batches
            or debug.step_sleep
            or debug.stop_after_step
        )

    def on_fit_start(self, trainer: TrainerView) -> None:
        d = self.debug
        if d.inject_inf_grad_batches and trainer.rt.rank == 0:
            self.grad_hook = trainer.engine.module.embed.register_forward_hook(self.inf_gradient(trainer))
        if not (d.inject_nan_batches or d.inject_spike_batches):
            return

        def corrupt_loss(module, inputs, loss):  # a forward hook may replace the module's output
            if not torch.is_grad_enabled():  # evaluation reads no training data
                return loss
            position = trainer.state.micro_batches
            if position in d.inject_nan_batches:
                return loss * float("nan")
            if position in d.inject_spike_batches:
                return loss * d.inject_spike_factor
            return loss

        self.hook = trainer.engine.module.register_forward_hook(corrupt_loss)

    def inf_gradient(self, trainer: TrainerView) -> Callable:
        """A forward hook on the embedding: an inf in its gradient on debug.inject_inf_grad_batches."""

        def poison(grad):  # the first token's: inf in its embedding row alone
            grad = grad.clone()
            grad[0, 0] = float("inf")
            return grad

        def hook(module, inputs, out):
            if torch.is_grad_enabled() and trainer.state.micro_batches in self.debug.inject_inf_grad_batches:
                out.register_hook(poison)
            return out

        return hook

    def on_fit_end(self, trainer: TrainerView) -> None:
        if not self.debug.inject_inf_grad_batches:
            return
        optimizer = getattr(trainer.engine.optimizer, "optim", trainer.engine.optimizer)
        steps = {int(state["step"]) for state in optimizer.state.values() if "step" in state}  # SGD counts none
        record = {
            "optimizer_steps": sorted(steps),
            "loss_scale": trainer.scaler.get_scale() if trainer.scaler is not None else None,
        }
        write_atomic(trainer.run_dir / f"faults.rank{trainer.rt.rank}.json", json.dumps(record))

    def on_step_start(self, trainer: TrainerView) -> Asks | None:
        if self.debug.stop_after_step and trainer.state.step + 1 == self.debug.stop_after_step:
            return Asks(stop="debug.stop_after_step")
        return None

    def on_step_end(self, trainer: TrainerView, result: StepResult) -> None:
        if self.debug.step_sleep:
            time.sleep(self.debug.step_sleep)
