"""`debug.fp8_check: N`: for the first N optimizer steps of an fp8 run, a bf16 shadow of a few layers' outputs,
so a user sees float8 diverge before it costs a day (float8 numerics do diverge: TE #841, Megatron #1152).

The layers: every converted linear (torchao's Float8Linear) of the first, middle and last block (under a
pipeline, those on rank 0's stage: rank 0 writes the metrics). Each training forward of one runs, beside it
and without gradients, the matmul bf16-mixed would have run (its input and weight in bf16, F.linear); the
relative error of the float8 output against it, ||y_fp8 - y_bf16|| / ||y_bf16|| over the micro-batch
(averaged over the step's micro-batches), is a line of metrics.jsonl per step: {"step", "fp8_rel_err":
{linear: error}, "fp8_rel_err_max", "fp8_rel_err_worst"}, and one terminal line. e4m3 keeps 3 significant
bits: a linear's output is typically a few percent off (about 3.7 % on the tiny model of
tests/train/test_fp8.py); a growing error, or one linear far above the others, is the outlier that rowwise
scaling or bf16 for that layer would absorb.

The shadow is eager: under it `train.compile: auto` stays off and true is refused (config/trainable.py). The
float8 rounding itself is the same eager and compiled (docs/train.md: FP8 training). Under FSDP it needs each
weight before its float8 cast, so the all-gather stays bf16 during a checked run (distributed/parallelize.py).
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
        self.hooks: list = []
        self.errors: dict[str, list[torch.Tensor]] = {}

    def on_fit_start(self, trainer: TrainerView) -> None:
        if trainer.state.step >= self.steps:  # resumed past the window
            return
        from torchao.float8.float8_linear import Float8Linear

        layers = trainer.config.model.num_layers
        watched = {0, layers // 2, layers - 1}
        for name, module in trainer.par.module.named_modules():
            # the path in the whole model, also on a pipeline stage (whose module holds its blocks elsewhere)
            found = re.search(r"(?:^|\.)(blocks\.(\d+)\..+)$", name)
            if isinstance(module, Float8Linear) and found and int(found[2]) in watched:
                self.errors[found[1]] = []
                # prepended: before tensor parallelism's own hook turns the output into this rank's local part
                self.hooks.append(module.register_forward_hook(self._shadow(found[1]), prepend=True))

    def _shadow(self, name: str):
        def hook(module, inputs, out):
            if not torch.is_grad_enabled():  # evaluation: not a training step's forward
                return
            with torch.no_grad():
                bias = None if module.bias is None else module.bias.to(torch.bfloat16)
                reference = F.linear(inputs[0].to(torch.bfloat16), module.weight.to(torch.bfloat16), bias).float()
                error = (out.float() - reference).norm() / reference.norm().clamp_min(1e-30)
                if isinstance(error, DTensor):  # tensor parallel: the output and its shadow split alike
                    error = error.full_tensor()
            self.errors[name].append(error)

        return hook

    def on_step_start(self, trainer: TrainerView) -> None:
        for errs in self.errors.values():  # a rolled-back step's (its on_step_end never came here) left behind
            errs.clear()

    def on_step_end(self, trainer: TrainerView, result: StepResult) -> None:
        if not self.hooks:
            return
        errors = {name: torch.stack(errs).mean().item() for name, errs in self.errors.items() if errs}
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
        if trainer.state.step >= self.steps:
            self.on_fit_end(trainer)

    def on_fit_end(self, trainer: TrainerView) -> None:
        for h in self.hooks:
            h.remove()
        self.hooks = []
