"""The plan and the run check each other: the planner's figures for this config at start, the measured ones
beside them after a few steps (RUN_DIR/plan_vs_run.json).

The measurement step counts what a step holds (measure.py) at step MEASURE_STEP, when the optimizer states
exist; it is compared with the plan on the first metrics interval after it (warm-up and compilation done).
"""

from __future__ import annotations

import torch

from .. import plan_check
from ..attention import kernel_that_runs
from ..state import Asks, StepResult
from . import Callback, TrainerView

MEASURE_STEP = 2  # optimizer states exist after the first step; measure the plan on the step after


class PlanVsRun(Callback):
    def __init__(self, plan: dict):
        self.plan = plan  # the trainer's one plan of this run (Trainer.plan), made at start-up

    def on_fit_start(self, trainer: TrainerView) -> None:
        trainer.log.say(plan_check.summary(self.plan))
        for line in self.plan.get("advice", []):  # what `pretrain plan` warns about, said where it matters
            trainer.log.say(f"  ! {line}")
        self.pending = None
        self.reset_peak = False
        self.kernel = kernel_that_runs(trainer.config, trainer.rt.device)

    def on_step_start(self, trainer: TrainerView) -> Asks:
        if self.reset_peak:
            # The measurement step holds extras (a second run of block 0, the meter's copies): the peak the
            # plan is compared with is that of the steps after it.
            torch.cuda.reset_peak_memory_stats(trainer.rt.device)
            self.reset_peak = False
        return Asks(measure_next=trainer.state.step + 1 == MEASURE_STEP)

    def on_step_end(self, trainer: TrainerView, result: StepResult) -> None:
        if result.measured:
            self.pending = result.measured
            self.reset_peak = trainer.rt.device.type == "cuda"
            if trainer.config.debug.check_sharding:
                self._check_sharding(trainer, result.measured["states"])
        interval, step = trainer.state.interval, trainer.state.step
        if self.pending is None or interval is None or interval.step != step:
            return
        if interval.start >= MEASURE_STEP or step == trainer.total_steps:
            device = trainer.rt.device
            peak = int(torch.cuda.max_memory_allocated(device)) if device.type == "cuda" else None
            report = plan_check.compare(
                self.plan,
                self.pending["states"],
                self.pending["saved"],
                peak,
                interval.tokens_per_s,
                interval.mfu,
                self.plan["time"]["utilisation"],
                str(device),
            )
            plan_check.mark_busy(report, interval.busy_cores, torch.get_num_threads())
            report["attention_kernel"] = self.kernel
            report["document_masking"] = trainer.config.train.document_masking
            if trainer.engine.fp8:
                report["fp8"] = trainer.engine.fp8
            if trainer.rt.is_main:
                plan_check.write(trainer.run_dir, report)
                trainer.log.say(plan_check.render(report))
            if trainer.config.debug.plan_vs_run_per_rank:
                self._write_rank_report(trainer, report)
            self.pending = None

    def _write_rank_report(self, trainer: TrainerView, report: dict) -> None:
        """This rank's plan_vs_run.rank<R>.json: its place in the grid, and its model-state rows against the
        planner's figures for that place (ranks differ under ZeRO-1 and with uneven FSDP chunks)."""
        from ...plan.model_states import model_state_tensors

        rt = trainer.rt
        coords = rt.layout.coords(rt.rank)
        planned = model_state_tensors(
            trainer.device_config, rank=coords.data, stage=coords.pipeline, tensor_rank=coords.tensor
        )
        rows = [
            plan_check._row(r["name"], planned[r["name"]], r["measured"], r["unit"])
            if r["name"] in ("parameters", "gradients", "optimizer_states")
            else r
            for r in report["rows"]
        ]
        mine = {
            **report,
            "rank": rt.rank,
            "grid": {"pipeline": coords.pipeline, "data": coords.data, "tensor": coords.tensor},
            "rows": rows,
        }
        plan_check.write(trainer.run_dir, mine, name=f"plan_vs_run.rank{rt.rank}.json")

    @staticmethod
    def _check_sharding(trainer: TrainerView, states: dict) -> None:
        """Debug mode: this rank holds exactly what the planner says this rank holds (one shared truth)."""
        from ...plan.model_states import model_state_tensors

        coords = trainer.rt.layout.coords(trainer.rt.rank)
        planned = model_state_tensors(
            trainer.device_config, rank=coords.data, stage=coords.pipeline, tensor_rank=coords.tensor
        )
        wrong = {k: (v, planned[k]) for k, v in states.items() if v != planned[k]}
        if wrong:
            detail = ", ".join(f"{k} {held:,} bytes held, {want:,} planned" for k, (held, want) in wrong.items())
            raise AssertionError(f"rank {trainer.rt.rank}: {detail} (ZeRO-{trainer.config.parallel.zero_stage})")
