"""SIGTERM / SIGINT (a scheduler's preemption, Ctrl-C): finish the step, checkpoint, exit 0; a second signal
exits at once. One rank's signal stops every rank: the request travels in the step's one all-reduce.

A token file changed under the run (data/token_files.py: truncated, deleted, replaced) stops it as well, with
a checkpoint of the last complete step and one line naming the source (exit 2): `stopped_by_data_change`."""

from __future__ import annotations

import os
import signal
from pathlib import Path

from ...data.token_files import DataChanged
from ...errors import UsageError
from .. import checkpoint as ckpt
from . import Callback

SIGNALS = (signal.SIGTERM, signal.SIGINT)


class Preemption(Callback):
    def on_fit_start(self, trainer) -> None:
        def handler(signum, frame):
            if trainer.stop_signal:  # a second signal: leave at once
                os._exit(128 + signum)
            trainer.stop_signal = signum
            name = signal.Signals(signum).name
            os.write(2, f"pretrain train: {name}: stopping after this step with a checkpoint ({name} again "
                        f"exits at once)\n".encode())  # os.write: safe inside a signal handler

        self.previous = {sig: signal.signal(sig, handler) for sig in SIGNALS}

    def on_fit_end(self, trainer) -> None:
        for sig, previous in getattr(self, "previous", {}).items():
            signal.signal(sig, previous)


def preempted(trainer) -> dict:
    """The run stops here: checkpoint (unless this step already wrote one), say how to resume."""
    path = trainer.checkpointer.saved_now() or trainer.save()
    name = (signal.Signals(trainer.stop_signal).name if trainer.stop_signal else trainer.stop_reason
            or "a signal on another rank")
    st = trainer.state
    trainer.log.event({"event": "preempted", "step": st.step, "tokens": st.tokens, "signal": name, "path": str(path)})
    trainer.log.say(f"stopped by {name} after step {st.step:,}; checkpoint {path}; resume with: "
                    f"pretrain train --resume {trainer.run_dir}")
    return {"step": st.step, "tokens": st.tokens, "preempted": True, "run_dir": str(trainer.run_dir)}


def stopped_by_data_change(trainer, error: DataChanged) -> UsageError:
    """The run stops on a changed token file: checkpoint the last complete step (a step the fault cut short is
    rewound first: its micro-batch count, data position and RNG as the step found them; the optimizer had not
    stepped) and return the one line naming the source. Under torchrun the other ranks may wait inside the
    step's collectives, so no rank writes: the newest checkpoint stands."""
    st, run_dir = trainer.state, trainer.run_dir
    source = next((f"data.mixture source {s['name']!r}" for s in trainer.mixture or []
                   if Path(s["data"].path) in error.path.parents), "data.dir")
    fix = (f"restore it as it was (or prepare the source again from the same inputs) and resume: pretrain train "
           f"--resume {run_dir}")
    if trainer.rt.distributed:
        return UsageError(f"{source}: {error}; stopped at step {st.step:,} without a checkpoint (the newest one "
                          f"stands); {fix}")
    if trainer.in_step is not None:
        st.micro_batches, data, rng = trainer.in_step
        trainer.batches.load_state_dict(data)
        if rng is not None:
            ckpt.set_rng_state(rng)
    path = trainer.checkpointer.saved_now() or trainer.save()
    trainer.log.event({"event": "data_changed", "step": st.step, "tokens": st.tokens, "source": source,
                       "file": str(error.path), "path": str(path)})
    return UsageError(f"{source}: {error}; stopped after step {st.step:,} with checkpoint {path}; {fix}")
