"""Loss spikes and non-finite steps: skip what cannot be applied, roll back what keeps diverging.

A non-finite gradient norm skips the update (the step already did) and is logged. A spike that lasts
`stability.patience` steps, or a non-finite loss, rolls the weights and optimizer back to the newest good
checkpoint while the data stream goes on past the batches that caused it (PaLM's remedy: restart from a
checkpoint ~100 steps earlier and skip the data around the spike, Chowdhery et al. 2022, section 5.1).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from ...checkpoint.choice import latest_checkpoint, remove_after
from ..spikes import SpikeDetector
from ..state import Asks, StepResult, TrainingStopped
from . import Callback, TrainerView

if TYPE_CHECKING:
    from ...config.trainer_sections import StabilityConfig


class Stability(Callback):
    def __init__(self, cfg: StabilityConfig):
        self.cfg = cfg
        self.detector = SpikeDetector(cfg)

    def stateful(self) -> dict[str, SpikeDetector]:
        return {"stability": self.detector}

    @property
    def good(self) -> bool:
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
            return Asks(rollback=True)
        return None

    def rollback(self, trainer: TrainerView, loss: float) -> None:
        """Back to the newest good checkpoint, the data stream going on: what the trainer carries out when this
        callback asks it to roll back (Trainer.carry_out), the one place besides the trainer that sets the
        counters (TrainState: the restored step, the rollbacks, the learning-rate scale)."""
        st, cfg, run_dir = trainer.state, self.cfg, trainer.run_dir
        recent = [s for s in st.rollbacks if st.step - s < cfg.rollback_window]
        if len(recent) >= cfg.max_rollbacks:
            trainer.log.event(
                {
                    "event": "stopped",
                    "step": st.step,
                    "tokens": st.tokens,
                    "loss": json_float(loss),
                    "reason": "too many rollbacks",
                }
            )
            raise TrainingStopped(
                f"{len(recent)} rollbacks within {cfg.rollback_window} steps (last at step "
                f"{st.step}, loss {loss:.4g}); the run keeps diverging: lower train.lr, check the "
                f"data, or raise stability.max_rollbacks, then `pretrain train --resume {run_dir}`"
            )
        target = latest_checkpoint(run_dir, good_only=True, before_step=st.step)
        if target is None and not trainer.config.run.checkpoint_every:
            trainer.log.event(
                {
                    "event": "stopped",
                    "step": st.step,
                    "tokens": st.tokens,
                    "loss": json_float(loss),
                    "reason": "no checkpoint to roll back to",
                }
            )
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
        from_step, from_tokens = st.step, st.tokens
        keep = (st.micro_batches, st.rollbacks + [from_step])
        saved = trainer.checkpoints.load(target, skip=("data", "rng"))
        st.micro_batches, st.rollbacks = keep  # the data stream goes on past what caused the spike
        if trainer.rt.is_main:  # written on the way into the spike: a resume must not go back to them
            remove_after(run_dir, st.step)
        trainer.barrier()
        if cfg.lr_scale != 1.0 and cfg.lr_scale_steps:
            st.lr_scale = cfg.lr_scale
            st.lr_scale_until = st.step + cfg.lr_scale_steps
        skipped = [saved["micro_batches"], st.micro_batches]
        seq_tokens = trainer.config.train.micro_batch_size * trainer.config.train.seq_len * trainer.rt.data_size
        trainer.log.event(
            {
                "event": "rollback",
                "step": from_step,
                "tokens": from_tokens,
                "loss": json_float(loss),
                "to_step": st.step,
                "skipped_micro_batches": skipped,
                "skipped_tokens": [skipped[0] * seq_tokens, skipped[1] * seq_tokens],
            }
        )
        trainer.log.say(
            f"loss {loss:.4g} at step {from_step}: rolled back to step {st.step} and skipped data "
            f"micro-batches {skipped[0]}..{skipped[1]}"
        )


def json_float(x: float) -> float | str:
    """JSON has no NaN or infinity: those are written as strings."""
    return x if x == x and abs(x) != float("inf") else str(x)
