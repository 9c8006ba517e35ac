"""Validation loss every `run.eval_every` steps, and after the schedule's last step (the run's final loss)."""

from __future__ import annotations

import math
from typing import TYPE_CHECKING, Any

import torch

from ..state import StepResult
from . import Callback, TrainerView

if TYPE_CHECKING:
    from ...data.loader import PreparedData


class Evaluation(Callback):
    def on_step_end(self, trainer: TrainerView, result: StepResult) -> None:
        every, step = trainer.config.run.eval_every, trainer.state.step
        if every and step % every == 0 and step < trainer.total_steps:
            evaluate(trainer)

    def on_final_step(self, trainer: TrainerView, stopped: bool) -> dict[str, Any] | None:
        return None if stopped else {"val_loss": evaluate(trainer)["val_loss"]}


@torch.no_grad()
def evaluate(trainer: TrainerView) -> dict:
    """Mean loss over `run.eval_batches` micro-batches of the validation split, the same windows every time,
    averaged over ranks; logged as val_loss and val_ppl. A mixture evaluates each source's split as well
    (val_loss/<name>, run.eval_batches micro-batches each): val_loss is then their mean weighted by the
    mixture's token weights, the loss on validation data mixed as the training data is. The ranks of one
    pipeline read the same windows and return the same loss (the last stage's), so the mean over all ranks
    is the mean over data-parallel ranks."""
    from ...distributed.runtime import all_reduce_mean

    rt, engine = trainer.rt, trainer.engine
    engine.set_training(False)
    # Eager, also when train.compile is on: under no_grad every compiled block and the loss would compile a
    # second graph (dynamo guards the grad mode), tens of seconds on a GPU for a 1B model, for a few forwards.
    with torch.compiler.set_stance("force_eager"):
        if trainer.mixture:
            losses = {s["name"]: all_reduce_mean(_mean_loss(trainer, s["data"]), rt) for s in trainer.mixture}
            val = sum(s["weight"] * losses[s["name"]] for s in trainer.mixture)
            per_source = {f"val_loss/{name}": loss for name, loss in losses.items()}
        else:
            assert trainer.data is not None  # a run without a mixture reads data.dir
            val, per_source = all_reduce_mean(_mean_loss(trainer, trainer.data), rt), {}
    engine.set_training(True)
    record = {
        "step": trainer.state.step,
        "tokens": trainer.state.tokens,
        "val_loss": val,
        "val_ppl": math.exp(min(val, 80.0)),
        **per_source,
    }
    trainer.log.metrics(record)
    return record


def _mean_loss(trainer: TrainerView, data: PreparedData) -> float:
    from ...data.windows import SequentialWindows

    c, rt, engine = trainer.config, trainer.rt, trainer.engine
    windows = SequentialWindows(data, "val", c.train.seq_len, rank=rt.data_rank, world_size=rt.data_size)
    losses = []
    for x, y in windows.batches(c.train.micro_batch_size, c.run.eval_batches):
        x, y = x.to(rt.device), y.to(rt.device)
        with engine.autocast_context():
            losses.append(float(engine.forward(x, y)))
    return sum(losses) / len(losses)
