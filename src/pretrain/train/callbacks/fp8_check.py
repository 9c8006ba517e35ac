"""`debug.fp8_check: N`: for the first N optimizer steps of an fp8 run, a bf16 shadow of a few layers' outputs,
so a user sees float8 diverge before it costs a day (float8 numerics do diverge: TE #841, Megatron #1152).

The layers: every converted linear (torchao's Float8Linear) of the first, middle and last block (under a
pipeline, those on rank 0's stage: rank 0 writes the metrics). After each of the first N steps, one forward of
the first validation micro-batch (the same input every time: a change in the error is the weights', not the
data's), without gradients and in evaluation mode, runs each of those linears beside the matmul bf16-mixed
would have run (its input and weight in bf16, F.linear); the relative error of the float8 output against it,
||y_fp8 - y_bf16|| / ||y_bf16||, is a line of metrics.jsonl per step: {"step", "fp8_rel_err": {linear: error},
"fp8_rel_err_max", "fp8_rel_err_worst"}, and one terminal line. e4m3 keeps 3 significant bits: a linear's
output is typically a few percent off (about 3.7 % on the tiny model of tests/train/test_fp8.py); a growing
error, or one linear far above the others, is the outlier that rowwise scaling or bf16 for that layer would
absorb.

Outside the training step, so the training is untouched, compiled or not: the check's forward runs eager
(`torch.compiler.set_stance("force_eager")`, as the validation loss does), where the shadow's hooks can run
without breaking or changing the compiled blocks' graphs, and on the weights the step left. The float8 rounding
is the same eager and compiled (docs/train.md: FP8 training); evaluation mode draws no dropout randomness. The
shadow needs each weight and input before their float8 casts, so during a checked run the collectives that
would carry float8 stay bf16: FSDP's all-gather, and tensor parallelism's (distributed/parallelize.py).
"""

from __future__ import annotations

import re

import torch
import torch.nn.functional as F
from torch.distributed.tensor import DTensor

from ..state import StepResult
from . import Callback, TrainerView


class Fp8Check(Callback):
    def __init__(self, steps: int):
        self.steps = steps
        self.linears: dict[str, torch.nn.Module] = {}
        self.errors: dict[str, list[torch.Tensor]] = {}

    def on_fit_start(self, trainer: TrainerView) -> None:
        from torchao.float8.float8_linear import Float8Linear

        layers = trainer.config.model.num_layers
        watched = {0, layers // 2, layers - 1}
        for name, module in trainer.engine.module.named_modules():
            # the path in the whole model, also on a pipeline stage (whose module holds its blocks elsewhere)
            found = re.search(r"(?:^|\.)(blocks\.(\d+)\..+)$", name)
            if isinstance(module, Float8Linear) and found and int(found[2]) in watched:
                self.linears[found[1]] = module

    def _shadow(self, name: str):
        def hook(module, inputs, out):
            bias = None if module.bias is None else module.bias.to(torch.bfloat16)
            reference = F.linear(inputs[0].to(torch.bfloat16), module.weight.to(torch.bfloat16), bias).float()
            error = (out.float() - reference).norm() / reference.norm().clamp_min(1e-30)
            if isinstance(error, DTensor):  # tensor parallel: the output and its shadow split alike
                error = error.full_tensor()
            self.errors[name].append(error)

        return hook

    def on_step_end(self, trainer: TrainerView, result: StepResult) -> None:
        if trainer.state.step > self.steps:  # also a run resumed past the window
            return
        # on every rank, also one with no watched linear (a later pipeline stage): the forward is collective
        errors = self._measure(trainer)
        if errors:
            worst = max(errors, key=errors.__getitem__)
            trainer.log.metrics(
                {
                    "step": trainer.state.step,
                    "fp8_rel_err": errors,
                    "fp8_rel_err_max": errors[worst],
                    "fp8_rel_err_worst": worst,
                }
            )

    @torch.no_grad()
    def _measure(self, trainer: TrainerView) -> dict[str, float]:
        """One eager forward of the first validation micro-batch with the shadows on: {linear: error} (the mean
        where a pipeline's schedule splits the batch)."""
        from ...data.windows import SequentialWindows

        c, rt, engine = trainer.config, trainer.rt, trainer.engine
        data = trainer.mixture[0]["data"] if trainer.mixture else trainer.data
        assert data is not None  # a training run's data
        windows = SequentialWindows(data, "val", c.train.seq_len, rank=rt.data_rank, world_size=rt.data_size)
        x, y = next(windows.batches(c.train.micro_batch_size, 1))
        self.errors = {name: [] for name in self.linears}
        # prepended: before tensor parallelism's own hook turns the output into this rank's local part
        hooks = [m.register_forward_hook(self._shadow(n), prepend=True) for n, m in self.linears.items()]
        engine.set_training(False)
        try:
            with torch.compiler.set_stance("force_eager"), engine.autocast_context():
                engine.forward(x.to(rt.device), y.to(rt.device))
        finally:
            engine.set_training(True)
            for h in hooks:
                h.remove()
        return {name: torch.stack(errs).mean().item() for name, errs in self.errors.items() if errs}
