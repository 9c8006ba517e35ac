"""What happens around the optimizer steps, each piece deciding for itself when it acts (OLMo-core's callbacks).

The trainer calls, in list order: `on_fit_start` once (after a resume), `on_step_start` and `on_step_end`
around every optimizer step, and `on_fit_end` once, however the run ends. A callback that undoes a step (a
rollback) sets `result.rolled_back`; the callbacks after it then skip that step. `stateful()` names the
small states a callback wants saved in checkpoints (trainer.json[name]).
"""

from __future__ import annotations


class Callback:
    def on_fit_start(self, trainer) -> None:
        pass

    def on_step_start(self, trainer) -> None:
        pass

    def on_step_end(self, trainer, result) -> None:
        pass

    def on_fit_end(self, trainer) -> None:
        pass

    def stateful(self) -> dict:
        return {}


def default_callbacks(config) -> list[Callback]:
    """The run's callbacks, in the order they act on a step: undo it, report it, evaluate, save, stop."""
    from .checkpointing import Checkpointing
    from .evaluation import Evaluation
    from .faults import FaultInjection
    from .metrics import MetricsLogger
    from .plan_vs_run import PlanVsRun
    from .preemption import Preemption
    from .spikes import Stability

    callbacks: list[Callback] = [
        Stability(config.stability),
        MetricsLogger(),
        PlanVsRun(),
        Evaluation(),
        Checkpointing(),
        Preemption(),
    ]
    if config.run.eval_tasks:
        from .tasks import TaskEvaluation

        callbacks.insert(
            callbacks.index(next(cb for cb in callbacks if isinstance(cb, Evaluation))) + 1, TaskEvaluation(config)
        )
    if config.data.mixture:
        from .mixture import EpochWarnings

        callbacks.insert(2, EpochWarnings())  # after MetricsLogger: the warning follows the step's metrics line
    if config.debug.fp8_check:  # the bf16 shadow of fp8's first steps
        from .fp8_check import Fp8Check

        callbacks.append(Fp8Check(config.debug.fp8_check))
    if FaultInjection.wanted(config.debug):  # tests only: nothing of it runs in a normal run
        callbacks.append(FaultInjection(config.debug))
    return callbacks
