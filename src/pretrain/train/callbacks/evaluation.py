"""Validation loss every `run.eval_every` steps (and at the end of the run: the trainer calls `evaluate`)."""

from __future__ import annotations

import math

import torch

from . import Callback


class Evaluation(Callback):
    def on_step_end(self, trainer, result) -> None:
        every, step = trainer.config.run.eval_every, trainer.state.step
        if every and step % every == 0 and step < trainer.total_steps:
            evaluate(trainer)


@torch.no_grad()
def evaluate(trainer) -> dict:
    """Mean loss over `run.eval_batches` micro-batches of the validation split, the same windows every time,
    averaged over ranks; logged as val_loss and val_ppl."""
    from ...data.loader import SequentialWindows
    from ...distributed.runtime import all_reduce_mean

    c, rt, par = trainer.config, trainer.rt, trainer.par
    par.set_training(False)
    windows = SequentialWindows(trainer.data, "val", c.train.seq_len, rank=rt.data_rank, world_size=rt.data_size)
    losses = []
    for x, y in windows.batches(c.train.micro_batch_size, c.run.eval_batches):
        x, y = x.to(rt.device), y.to(rt.device)
        with par.autocast_context():
            losses.append(float(par.forward(x, y)))
    par.set_training(True)
    val = all_reduce_mean(sum(losses) / len(losses), rt)
    record = {"step": trainer.state.step, "tokens": trainer.state.tokens, "val_loss": val,
              "val_ppl": math.exp(min(val, 80.0))}
    trainer.log.metrics(record)
    return record
