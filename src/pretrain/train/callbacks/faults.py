"""Fault injection for the tests (`debug.*` keys), installed only when one is set: nothing of it runs in, or
slows, a normal run's step.

NaN or spiking losses are keyed by position in the data stream (micro-batches drawn), so skipping the data
after a rollback removes the fault, as it would remove bad data. `stop_after_step` behaves as a preemption;
`step_sleep` slows the run so that a test can kill it at a chosen moment.
"""

from __future__ import annotations

import time

import torch

from . import Callback


class FaultInjection(Callback):
    def __init__(self, debug):
        self.debug = debug

    @staticmethod
    def wanted(debug) -> bool:
        return bool(debug.inject_nan_batches or debug.inject_spike_batches or debug.step_sleep
                    or debug.stop_after_step)

    def on_fit_start(self, trainer) -> None:
        d = self.debug
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

        self.hook = trainer.par.module.register_forward_hook(corrupt_loss)

    def on_step_start(self, trainer) -> None:
        if self.debug.stop_after_step and trainer.state.step + 1 == self.debug.stop_after_step:
            trainer.stop_reason = "debug.stop_after_step"

    def on_step_end(self, trainer, result) -> None:
        if self.debug.step_sleep:
            time.sleep(self.debug.step_sleep)
