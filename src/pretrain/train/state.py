"""What the trainer and its callbacks share: the trainer's counters and the stop that needs a person. Below
both, so that a callback reads them without importing the trainer."""

from __future__ import annotations

from dataclasses import asdict, dataclass, field

from ..errors import UsageError


class TrainingStopped(UsageError):
    """The run cannot go on without a person (e.g. it keeps diverging); the message says what to do."""


@dataclass
class TrainState:
    """The trainer's counters: what a resume needs besides tensors, RNG states and the callbacks' states."""

    step: int = 0
    tokens: int = 0  # tokens trained on, all ranks together
    micro_batches: int = 0  # micro-batches drawn from the data stream per rank (survives rollbacks)
    lr_scale: float = 1.0
    lr_scale_until: int = 0
    rollbacks: list = field(default_factory=list)
    nonfinite_skips: int = 0

    def lr_multiplier(self) -> float:
        """The learning-rate factor a rollback set (stability.lr_scale), for its stability.lr_scale_steps."""
        return self.lr_scale if self.step < self.lr_scale_until else 1.0

    def state_dict(self) -> dict:
        return asdict(self)

    def load_state_dict(self, saved: dict) -> None:
        for name in self.__dataclass_fields__:
            if name in saved:
                setattr(self, name, saved[name])
