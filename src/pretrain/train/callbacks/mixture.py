"""A mixture's run log. Repetition: a line (and an event) when a source passes plan.corpus.MAX_EPOCHS or
reaches its max_epochs, once per crossing, with the evidence; read from the batches handed out, so a resume
does not warn again about a crossing it already made. Weights: a resume with other weights than the
checkpoint's says so (old -> new), as a line and a `mixture_weights` event: the stream goes on from its
position with the new shares, the tokens drawn so far stay as they were drawn."""

from __future__ import annotations

import math
from pathlib import Path

from ...config import mixture_sources
from ...config.job_sections import DataConfig
from ...data.mixture import cap_windows, source_epochs
from ...plan.corpus import MAX_EPOCHS
from ..state import StepResult
from . import Callback, TrainerView

CITATION = 'Muennighoff et al. 2023, "Scaling Data-Constrained Language Models"'


class EpochWarnings(Callback):
    def on_fit_start(self, trainer: TrainerView) -> None:
        self.epochs, self.spent = self._read(trainer)
        if trainer.resume_from is not None:
            self._say_reweighting(trainer, trainer.resume_from)

    def on_step_end(self, trainer: TrainerView, result: StepResult) -> None:
        epochs, spent = self._read(trainer)
        for source in _sources(trainer):
            name, cap = source["name"], source["max_epochs"]
            if spent[name] and not self.spent[name]:
                self._warn(
                    trainer,
                    name,
                    epochs[name],
                    cap,
                    "reached its max_epochs: no more windows from it; "
                    "the other sources share its weight in proportion from here",
                )
            if self.epochs[name] <= MAX_EPOCHS < epochs[name]:
                stop = f"its max_epochs {cap:g} stops it" if cap else "set its max_epochs to stop it there"
                self._warn(
                    trainer,
                    name,
                    epochs[name],
                    MAX_EPOCHS,
                    f"is past {MAX_EPOCHS} epochs: repeated "
                    f"tokens are worth less and less beyond ~{MAX_EPOCHS} ({CITATION}); {stop}",
                )
        self.epochs, self.spent = epochs, spent

    @staticmethod
    def _read(trainer: TrainerView) -> tuple[dict, dict]:
        """Epochs drawn per source, and whether each has drawn all its max_epochs allows."""
        state = trainer.batches.state_dict()
        spent = {
            s["name"]: s["max_epochs"] is not None and d["drawn"] >= cap_windows(s["max_epochs"], d["num_windows"])
            for s, d in zip(_sources(trainer), state["sources"])
        }
        return source_epochs(state), spent

    @staticmethod
    def _warn(trainer: TrainerView, name: str, epochs: float, cap: float, what: str) -> None:
        st = trainer.state
        trainer.log.say(
            f"warning: mixture source {name!r} {what} ({epochs:.2f} epochs drawn by step {st.step:,}, cap {cap:g})"
        )
        trainer.log.event(
            {
                "event": "mixture_epochs",
                "step": st.step,
                "tokens": st.tokens,
                "source": name,
                "epochs": epochs,
                "cap": cap,
            }
        )

    @staticmethod
    def _say_reweighting(trainer: TrainerView, resume_from: Path) -> None:
        """The weights of the resumed checkpoint's own config (normalised as this run's are) against this run's;
        the resume has already checked that the sources are the same, in the same order."""
        import yaml

        saved = yaml.safe_load((Path(resume_from) / "config.yaml").read_text())["data"]["mixture"]
        old = {s["name"]: s["weight"] for s in mixture_sources(DataConfig(mixture=saved))}
        new = {s["name"]: s["weight"] for s in _sources(trainer)}
        if all(math.isclose(old[name], new[name], rel_tol=1e-9) for name in new):  # 7/3 is 0.7/0.3
            return
        st = trainer.state
        change = ", ".join(f"{name} {old[name]:.4g} -> {new[name]:.4g}" for name in new)
        trainer.log.say(
            f"mixture weights changed on resume at step {st.step:,}: {change} (the tokens drawn so far "
            "stay as drawn; the new weights apply from this step)"
        )
        trainer.log.event({"event": "mixture_weights", "step": st.step, "tokens": st.tokens, "old": old, "new": new})


def _sources(trainer: TrainerView) -> list[dict]:
    """The run's mixture sources: this callback is on only for a run with data.mixture (default_callbacks)."""
    assert trainer.mixture is not None
    return trainer.mixture
