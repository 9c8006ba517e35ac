"""What the trainer and its callbacks share, below both so that a callback reads it without importing the
trainer: the stop that needs a person, the trainer's counters and what callbacks read of a run (TrainState),
one step's outcome (StepResult), and what a callback may ask of the trainer (Asks, Rollback)."""

from __future__ import annotations

from dataclasses import dataclass, field, fields
from pathlib import Path

from ..errors import UsageError


class TrainingStopped(UsageError):
    """The run cannot go on without a person (e.g. it keeps diverging); the message says what to do."""


@dataclass(frozen=True)
class StepResult:
    """One optimizer step's outcome, the same on every rank (it came through the step's all-reduce)."""

    loss: float  # mean loss over the global batch
    grad_norm: float  # global gradient norm before clipping
    lr: float
    batch_tokens: int  # tokens of this step, all ranks together
    finite: bool  # the update was applied (the gradient norm was finite)
    stop: bool  # some rank asked to stop after this step
    measured: dict | None = None  # bytes held, on a measurement step (see measure.py)
    moe: dict | None = None  # Mixture-of-Experts: balancing losses and expert load (model.moe.end_step)


@dataclass(frozen=True)
class Interval:
    """The last metrics interval (steps start+1 .. step), timed by MetricsLogger: what plan vs run compares."""

    step: int
    start: int  # the step the interval began after
    tokens_per_s: float
    mfu: float | None
    loss: float  # the loss of its last step (the metrics line's)
    busy_cores: float | None = None  # the cores other processes kept busy meanwhile (a CPU run; machine.py)


@dataclass
class TrainState:
    """The trainer's counters, which a resume needs besides tensors, RNG states and the callbacks' states (the
    top level of trainer.json), and the last metrics interval, which it does not (`saved=False`). The trainer
    writes it; callbacks read it, and ask for changes with `Asks`."""

    step: int = 0
    tokens: int = 0  # tokens trained on, all ranks together
    micro_batches: int = 0  # micro-batches drawn from the data stream per rank (survives rollbacks)
    lr_scale: float = 1.0
    lr_scale_until: int = 0
    rollbacks: list[int] = field(default_factory=list)
    nonfinite_skips: int = 0
    interval: Interval | None = field(default=None, metadata={"saved": False})

    def lr_multiplier(self) -> float:
        """The learning-rate factor a rollback set (stability.lr_scale), for its stability.lr_scale_steps."""
        return self.lr_scale if self.step < self.lr_scale_until else 1.0

    def state_dict(self) -> dict:
        return {f.name: _copied(getattr(self, f.name)) for f in fields(self) if f.metadata.get("saved", True)}

    def load_state_dict(self, saved: dict) -> None:
        for f in fields(self):
            if f.name in saved and f.metadata.get("saved", True):
                setattr(self, f.name, saved[f.name])


def _copied(value):
    """A saved list is the checkpoint's own, not the one the run goes on appending to."""
    return list(value) if isinstance(value, list) else value


@dataclass(frozen=True)
class Rollback:
    """A rollback a callback asks for (Stability): the trainer loads checkpoint `to` but for its data position and
    RNG, so the data stream goes on past the batches that caused it, and scales the learning rate by
    `lr_scale` for `lr_scale_steps` steps after it (1.0 or 0 steps: unchanged)."""

    to: Path  # the newest good checkpoint before this step
    loss: float  # the loss that asked for it, for the event and the line
    lr_scale: float = 1.0
    lr_scale_steps: int = 0


@dataclass(frozen=True)
class Asks:
    """What a callback's hook may ask of the trainer (its return value; None asks nothing). The trainer carries
    it out right after that hook returns, in one place (`Trainer.carry_out`); callbacks change no trainer
    attribute themselves."""

    # Stop after a step, with a checkpoint, this reason in the `preempted` event and line ("SIGTERM",
    # "debug.stop_after_step", ...). The request travels in the next step's all-reduce, so every rank stops
    # after that same step; the first reason asked is the one given.
    stop: str = ""
    # on_step_end only: roll this step back (Stability: to the newest good checkpoint, past the data that
    # caused it); the callbacks after this one do not see the step.
    rollback: Rollback | None = None
    # on_step_start: the coming step counts the bytes it holds (measure.py), for plan vs run.
    measure_next: bool = False
    # on_step_end: a metrics interval was timed (MetricsLogger); recorded as TrainState.interval, read by
    # the callbacks after it.
    interval: Interval | None = None
