"""Loss spikes and non-finite steps: skip what cannot be applied, roll back what keeps diverging.

A non-finite gradient norm skips the update (the step already did) and is logged. A spike that lasts
`stability.patience` steps, or a non-finite loss, rolls the weights and optimizer back to the newest good
checkpoint while the data stream goes on past the batches that caused it (PaLM's remedy: restart from a
checkpoint ~100 steps earlier and skip the data around the spike, Chowdhery et al. 2022, section 5.1).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from ...checkpoint.choice import latest_checkpoint
from ..run_log import json_float
from ..spikes import SpikeDetector
from ..state import Asks, Rollback, StepResult, TrainingStopped
from . import Callback, TrainerView

if TYPE_CHECKING:
    from ...config.trainer_sections import StabilityConfig


class Stability(Callback):
    def __init__(self, cfg: StabilityConfig):
        self.cfg = cfg
        self.detector = SpikeDetector(cfg)

    def stateful(self) -> dict[str, SpikeDetector]:
        return {"stability": self.detector}

    def checkpoint_is_good(self) -> bool:
        """A checkpoint written now is a rollback target: no spike is under way."""
        return not self.detector.active

    def on_step_end(self, trainer: TrainerView, result: StepResult) -> Asks | None:
        st = trainer.state
        if not result.finite:  # the trainer has counted it (TrainState.nonfinite_skips)
            trainer.log.event(
                {
                    "event": "nonfinite_skip",
                    "step": st.step,
                    "tokens": st.tokens,
                    "loss": json_float(result.loss),
                    "grad_norm": json_float(result.grad_norm),
                }
            )
        action = self.detector.observe(result.loss)
        if action == "spike":
            trainer.log.event(
                {
                    "event": "spike",
                    "step": st.step,
                    "tokens": st.tokens,
                    "loss": json_float(result.loss),
                    "streak": self.detector.streak,
                }
            )
        elif action == "rollback":
            return Asks(rollback=self.rollback(trainer, result.loss))
        return None

    def rollback(self, trainer: TrainerView, loss: float) -> Rollback:
        """The rollback this callback asks for: to the newest good checkpoint before this step. Stops the run
        instead (TrainingStopped, with a `stopped` event) when it keeps diverging or has nothing to go back to."""
        st, cfg, run_dir = trainer.state, self.cfg, trainer.run_dir
        recent = [s for s in st.rollbacks if st.step - s < cfg.rollback_window]
        if len(recent) >= cfg.max_rollbacks:
            _stopped(trainer, loss, "too many rollbacks")
            raise TrainingStopped(
                f"{len(recent)} rollbacks within {cfg.rollback_window} steps (last at step "
                f"{st.step}, loss {loss:.4g}); the run keeps diverging: lower train.lr, check the "
                f"data, or raise stability.max_rollbacks, then `pretrain train --resume {run_dir}`"
            )
        target = latest_checkpoint(run_dir, good_only=True, before_step=st.step)
        if target is None and not trainer.config.run.checkpoint_every:
            _stopped(trainer, loss, "no checkpoint to roll back to")
            raise TrainingStopped(
                f"loss {loss:.4g} at step {st.step} asks for a rollback, but run.checkpoint_every=0 "
                f"keeps no checkpoint to roll back to; set run.checkpoint_every (and "
                f"stability.spike_detection=true) to have one, or lower train.lr"
            )
        if target is None:
            raise TrainingStopped(
                f"loss spike at step {st.step} and no good checkpoint to roll back to in "
                f"{run_dir}; lower train.lr or enable stability.spike_detection"
            )
        return Rollback(target, loss, cfg.lr_scale, cfg.lr_scale_steps)


def _stopped(trainer: TrainerView, loss: float, reason: str) -> None:
    st = trainer.state
    trainer.log.event(
        {"event": "stopped", "step": st.step, "tokens": st.tokens, "loss": json_float(loss), "reason": reason}
    )
