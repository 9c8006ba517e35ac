"""SIGTERM / SIGINT (a scheduler's preemption, Ctrl-C): finish the step in flight, checkpoint, exit 0; a second
signal exits at once. One rank's signal stops every rank: the request travels in the step's one all-reduce.
With run.checkpoint_every=0 (no checkpoints) the run stops without one and says it cannot be resumed."""

from __future__ import annotations

import os
import signal
from typing import Any

from . import Callback, TrainerView

SIGNALS = (signal.SIGTERM, signal.SIGINT)


class Preemption(Callback):
    def __init__(self) -> None:
        self.signal = 0  # the signal received, set by the handler (it may come at any moment)
        self.previous: dict[int, Any] = {}

    def on_fit_start(self, trainer: TrainerView) -> None:
        keep = (
            "with a checkpoint"
            if trainer.config.run.checkpoint_every
            else "without a checkpoint (run.checkpoint_every=0)"
        )
        # The trainer asks `stop_received()` just before each step's all-reduce, and one process again after the
        # step: a signal stops the run after the step it came in. Several ranks agree in that all-reduce, so
        # one that came after it is carried by the next step's.
        agree = (
            " (or the next, if this step's all-reduce had passed: every rank stops after the same step)"
            if trainer.rt.distributed
            else ""
        )

        def handler(signum, frame):
            if self.signal:  # a second signal: leave at once
                os._exit(128 + signum)
            self.signal = signum
            name = signal.Signals(signum).name
            said = f"pretrain train: {name}: stopping after this step {keep}{agree} ({name} again exits at once)\n"
            os.write(2, said.encode())  # os.write: safe inside a signal handler

        self.previous = {sig: signal.signal(sig, handler) for sig in SIGNALS}

    def stop_received(self) -> str:
        """The name of the signal received, "" before one."""
        return signal.Signals(self.signal).name if self.signal else ""

    def on_final_step(self, trainer: TrainerView, stopped: bool) -> dict[str, Any] | None:
        return preempted(trainer) if stopped else None

    def on_fit_end(self, trainer: TrainerView) -> None:
        for sig, previous in self.previous.items():
            signal.signal(sig, previous)


def preempted(trainer: TrainerView) -> dict:
    """The run stops here: checkpoint (unless this step already wrote one, or the run keeps none), say how to
    resume."""
    keeps = trainer.config.run.checkpoint_every > 0
    path = (trainer.checkpoints.saved_now() or trainer.save()) if keeps else None
    name = trainer.stop_reason or "a signal on another rank"
    st = trainer.state
    trainer.log.event(
        {
            "event": "preempted",
            "step": st.step,
            "tokens": st.tokens,
            "signal": name,
            "path": str(path) if path else None,
        }
    )
    if keeps:
        trainer.log.say(
            f"stopped by {name} after step {st.step:,}; checkpoint {path}; resume with: "
            f"pretrain train --resume {trainer.run_dir}"
        )
    else:
        trainer.log.say(
            f"stopped by {name} after step {st.step:,}; no checkpoint written (run.checkpoint_every=0), "
            f"so this run cannot be resumed"
        )
    return {"step": st.step, "tokens": st.tokens, "preempted": True, "run_dir": str(trainer.run_dir)}
