"""Checkpoints every `run.checkpoint_every` steps and at the last step; none at all when it is 0 (a benchmark's
run, where a 1B model's checkpoint is 15 GB of writing that nobody reads)."""

from __future__ import annotations

from . import Callback


class Checkpointing(Callback):
    def on_step_end(self, trainer, result) -> None:
        every, step = trainer.config.run.checkpoint_every, trainer.state.step
        if every and (step % every == 0 or step == trainer.total_steps):
            trainer.save()
