"""Loss-spike detection (PaLM, OPT and BLOOM's answer to divergence: roll back, skip the data, go on).

A step's loss is a spike when it is above a robust statistic of the recent losses:
    loss > median + threshold * 1.4826 * MAD   and   loss > median * (1 + min_rise)
(1.4826 * MAD estimates the standard deviation of normal noise; the second test keeps a flat, low-noise
curve from calling every wobble a spike). Spike losses are not added to the history, so a long spike
cannot become the new normal. `patience` consecutive spike steps, or any non-finite loss, ask for a rollback.
"""

from __future__ import annotations

import math
import statistics
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from ..config.trainer_sections import StabilityConfig


class SpikeDetector:
    def __init__(self, cfg: StabilityConfig):
        self.cfg = cfg
        self.history: list[float] = []
        self.streak = 0

    @property
    def active(self) -> bool:
        """A spike is in progress: checkpoints written now are not rollback targets."""
        return self.streak > 0

    def observe(self, loss: float) -> str:
        """'ok', 'spike' (watching) or 'rollback'."""
        if not math.isfinite(loss):
            self.streak += 1
            return "rollback"
        if not self.cfg.spike_detection:
            return "ok"
        if len(self.history) >= self.cfg.min_history and self.is_spike(loss):
            self.streak += 1
            return "rollback" if self.streak >= self.cfg.patience else "spike"
        self.streak = 0
        self.history.append(loss)
        del self.history[: -self.cfg.window]
        return "ok"

    def is_spike(self, loss: float) -> bool:
        median = statistics.median(self.history)
        mad = statistics.median(abs(x - median) for x in self.history)
        return loss > median + self.cfg.threshold * 1.4826 * mad and loss > median * (1 + self.cfg.min_rise)

    def state_dict(self) -> dict:
        return {"history": list(self.history), "streak": self.streak}

    def load_state_dict(self, state: dict) -> None:
        self.history = list(state.get("history", []))
        self.streak = int(state.get("streak", 0))
