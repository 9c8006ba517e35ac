"""The trainer: builds a run from its config and runs `fit()`, the optimizer steps with callbacks around them.

  build    the run's config for this process layout, the data, the model made trainable here
           (distributed/parallelize.py), the batches (read ahead), the callbacks, its checkpoints: the
           pieces made by startup.py, kept here as the attributes the callbacks read
  fit      resume or start; then step (step.py) and let every callback act on the result, until the last
           step or a stop request; a final validation pass
Everything else a run does (metrics, plan vs run, evaluation, checkpoints, loss-spike rollback, preemption)
is a callback in train/callbacks/, deciding for itself when it acts.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from contextlib import AbstractContextManager
from pathlib import Path
from typing import TYPE_CHECKING

import torch

from ..checkpoint.choice import prune, remove_after
from ..checkpoint.compatibility import schedule_line, settings_line, stage_line
from ..checkpoint.contents import Checkpoints, Stateful, TensorState
from ..checkpoint.format import read_trainer_state, rng_state
from ..checkpoint.run_dir import RunDir
from ..config.trainable import check_trainable
from ..data.token_files import DataChanged
from ..distributed.fp8 import check_installed as check_fp8_installed
from ..plan.length import training_length
from ..plan.params import count_params
from ..plan.schedule import learning_rate, micro_batches_per_step, resumed_schedule
from . import plan_check
from .callbacks import Callback, default_callbacks
from .data_changes import stopped_by_data_change
from .loggers import check_installed
from .prefetch import Prefetcher, WindowSource
from .preflight import check_fits_device
from .run_log import TrainingLog, json_float
from .startup import claim_run_dir, launched_config, open_data, plan_run, staged, trainable_model, window_source
from .state import Asks, Rollback, StepResult, TrainState
from .step import pipeline_train_step, train_step

if TYPE_CHECKING:
    from ..config.schema import ResolvedConfig
    from ..data.loader import PreparedData
    from ..distributed.engines import Parallelized
    from ..distributed.runtime import Runtime
    from ..model.documents import Documents


class Trainer:
    """What a callback reads (train/callbacks/__init__.py): everything below; it changes none of it, but asks
    (state.Asks), and the trainer carries that out (`carry_out`)."""

    config: ResolvedConfig  # the launched config: this world's size, the data directories absolute
    rt: Runtime  # this process's place, with the run's tensor and pipeline degrees
    run_dir: Path
    device_config: ResolvedConfig  # the config with the hardware the run has (plan_check.config_for_device)
    plan: dict  # the run's one plan (pretrain.plan), made at start-up, at the peak behind its MFU
    mixture: list[dict] | None  # a mixture's sources (data/mixture.py), each with its opened data
    data: PreparedData | None  # data.dir's prepared data; None for a mixture or a loader of its own
    directory: RunDir  # run.dir: its lock (held by rank 0 of a run that writes), config.yaml, set-asides
    resume_from: Path | None  # the checkpoint this run resumes from
    resume_changes: list[dict]  # what a resume changes: a stage of another train.seq_len, other settings (events)
    history_aside: Path | None  # where an earlier run's history without a checkpoint was moved
    total_steps: int
    warmup: int  # warm-up steps of the schedule this run follows (a resumed run's may differ: resumed_schedule)
    schedule_change: dict | None  # a resume into a run of another length: the event that says so
    ramp: dict  # the batch ramp's arguments (plan.schedule.micro_batches_per_step)
    documents: Documents | None  # train.document_masking: the documents of a window (model/documents.py)
    attention_kernels: Callable[[], AbstractContextManager]  # entered by each step
    engine: Parallelized  # the model made trainable here, with its optimizer
    scaler: torch.amp.GradScaler | None  # fp16-mixed's loss scaler
    batches: Prefetcher
    state: TrainState  # the counters, and the last metrics interval
    callbacks: list[Callback]  # in callbacks.ORDER
    checkpoints: Checkpoints
    stop_reason: str  # the first stop a callback asked for ("" none): the coming steps carry it to every rank
    measure_next: bool  # a callback asked that the coming step count the bytes it holds
    in_step: tuple | None  # while a step runs: where a data fault mid-step rewinds to (data_changes.py)
    log: TrainingLog

    def __init__(
        self,
        config: ResolvedConfig,
        rt: Runtime,
        loader: WindowSource | None = None,
        quiet: bool = False,
        plan: dict | None = None,
    ):
        """`loader` replaces the data directory (e.g. synthetic tokens for `pretrain sweep`); `quiet` writes
        nothing to the run directory; `plan`: this config's plan on this device where the caller has made it
        already (`pretrain sweep`'s cell), else the trainer makes it."""
        c = self.config = launched_config(config, rt, own_data=loader is None)
        # This run's grid: the tensor ranks and pipeline stages of one data-parallel rank read its batches.
        rt = dataclasses.replace(rt, tensor=c.parallel.tensor, pipeline=c.parallel.pipeline)
        self.rt, self.run_dir = rt, Path(c.run.dir)
        self.directory = RunDir(self.run_dir)
        check_trainable(c, needs_data=loader is None)
        self.device_config = plan_check.config_for_device(c, rt)
        self.plan = plan if plan is not None else plan_run(self.device_config, rt)
        check_fits_device(self.plan, rt)
        check_installed(c.run.loggers)
        check_fp8_installed(c.train.precision)
        opened = open_data(c, rt, loader)
        self.mixture, self.data = opened.mixture, opened.data
        claimed = claim_run_dir(self.directory, c, rt, quiet)
        self.resume_from, self.history_aside = claimed.resume_from, claimed.history_aside
        saved = read_trainer_state(self.resume_from) if self.resume_from is not None else {"step": 0}
        stage = staged(c, self.resume_from, claimed.changes, saved)
        c = self.config = stage.config
        self.resume_changes = stage.changes
        self._plan_the_steps(saved)
        built = trainable_model(c, rt, opened.prepared())
        self.documents, self.attention_kernels, self.engine = built.documents, built.attention_kernels, built.engine
        self.scaler = torch.amp.GradScaler(rt.device.type) if c.train.precision == "fp16-mixed" else None
        self.batches = Prefetcher(window_source(c, rt, opened, loader), c.train.micro_batch_size, rt.device)
        self.state = TrainState()
        self.callbacks = default_callbacks(c, self.plan)
        parts: dict[str, Stateful] = {"data": self.batches}
        for cb in self.callbacks:
            parts.update(cb.stateful())
        tensors = TensorState(self.engine, self.scaler)
        self.checkpoints = Checkpoints(self.run_dir, rt, tensors, self.state, parts, c, self.total_steps, self.warmup)
        self.stop_reason, self.measure_next, self.in_step = "", False, None
        self.log = TrainingLog(
            self.run_dir,
            self.total_steps,
            progress=c.run.progress,
            enabled=rt.is_main and not quiet,
            loggers=c.run.loggers,
            config=c.to_dict(),
        )

    def _plan_the_steps(self, saved: dict) -> None:
        """The run's length, its schedule's warm-up (a resume, `saved` its trainer state, into a run of another
        length follows the new length's schedule, said in an event) and the batch ramp."""
        c, t = self.config, self.config.train
        self.total_steps = training_length(c, count_params(c.model).active)["steps"]
        self.warmup, self.schedule_change = resumed_schedule(t, saved, self.total_steps)
        self.ramp = dict(
            seq_len=t.seq_len,
            micro_batch_size=t.micro_batch_size,
            data_parallel=self.rt.data_size,
            grad_accum_steps=t.grad_accum_steps,
            ramp_tokens=t.batch_ramp_tokens,
            ramp_start=t.batch_ramp_start,
        )

    # --- the loop ----------------------------------------------------------------------------------------

    def fit(self) -> dict:
        try:
            return self._fit()
        finally:
            for cb in self.callbacks:
                cb.on_fit_end(self)
            self.batches.close()
            self.log.close()
            self.directory.release()

    def _fit(self) -> dict:
        self.resume_or_start()
        for cb in self.callbacks:
            self.carry_out(cb.on_fit_start(self))
        try:
            stopped = self._steps()
            summary = {"step": self.state.step, "tokens": self.state.tokens}
            for cb in self.callbacks:  # the final validation loss, a stop's checkpoint
                summary.update(cb.on_final_step(self, stopped) or {})
        except DataChanged as e:  # a token file truncated, deleted or replaced under the run
            raise stopped_by_data_change(self, e) from None
        if stopped:
            return summary
        self.log.say(
            f"done: {self.state.step:,} steps, {self.state.tokens:,} tokens, final validation loss "
            f"{summary['val_loss']:.4f}"
        )
        interval = self.state.interval
        return {**summary, "train_loss": interval.loss if interval else None, "run_dir": str(self.run_dir)}

    def _steps(self) -> bool:
        """The optimizer steps with the callbacks around them, to the last; True when a stop was asked."""
        while self.state.step < self.total_steps:
            for cb in self.callbacks:
                self.carry_out(cb.on_step_start(self))
            # Where a data fault mid-step rewinds to; the RNG only where a step draws from it (dropout).
            self.in_step = (
                self.state.micro_batches,
                self.batches.state_dict(),
                rng_state() if self.config.model.dropout else None,
            )
            result = self.step(measure=self.measure_next, stop_asked=lambda: bool(self.stop_pending()))
            self.in_step, self.measure_next = None, False
            if not result.finite:  # the update was skipped (the stability callback logs it)
                self.state.nonfinite_skips += 1
            # One process needs no agreement: a signal received after the step's all-reduce (its update, the
            # callbacks) stops it here too, not after one step more.
            if self.after_step(result) and (result.stop or not self.rt.distributed and self.stop_received()):
                self.stop_reason = self.stop_pending()
                return True
        return False

    def after_step(self, result: StepResult) -> bool:
        """Every callback's on_step_end, in order, each one's asks carried out before the next; False when one
        rolled the step back (the callbacks after it do not see it)."""
        for cb in self.callbacks:
            if self.carry_out(cb.on_step_end(self, result)):
                return False
        return True

    def carry_out(self, asks: Asks | None) -> bool:
        """What a callback's hook asked (state.Asks), the one place the trainer changes for a callback; True
        when the step was rolled back."""
        if asks is None:
            return False
        self.stop_reason = self.stop_reason or asks.stop
        self.measure_next = self.measure_next or asks.measure_next
        if asks.interval is not None:
            self.state.interval = asks.interval
        if asks.rollback is not None:
            self.roll_back(asks.rollback)
        return asks.rollback is not None

    def roll_back(self, asked: Rollback) -> None:
        """Back to checkpoint `asked.to` but for its data position and RNG: the data stream goes on past what
        caused the rollback, and the counters keep the micro-batches drawn and the rollbacks made."""
        st = self.state
        from_step, from_tokens = st.step, st.tokens
        keep = (st.micro_batches, st.rollbacks + [from_step])
        saved = self.checkpoints.load(asked.to, skip=("data", "rng"))
        st.micro_batches, st.rollbacks = keep
        if self.rt.is_main:  # written on the way into the spike: a resume must not go back to them
            remove_after(self.run_dir, st.step)
        self.barrier()
        if asked.lr_scale != 1.0 and asked.lr_scale_steps:
            st.lr_scale, st.lr_scale_until = asked.lr_scale, st.step + asked.lr_scale_steps
        skipped = [saved["micro_batches"], st.micro_batches]
        t = self.config.train
        window_tokens = t.micro_batch_size * t.seq_len * self.rt.data_size  # one micro-batch of every data rank
        self.log.event(
            {
                "event": "rollback",
                "step": from_step,
                "tokens": from_tokens,
                "loss": json_float(asked.loss),
                "to_step": st.step,
                "skipped_micro_batches": skipped,
                "skipped_tokens": [skipped[0] * window_tokens, skipped[1] * window_tokens],
            }
        )
        self.log.say(
            f"loss {asked.loss:.4g} at step {from_step}: rolled back to step {st.step} and skipped data "
            f"micro-batches {skipped[0]}..{skipped[1]}"
        )

    def stop_pending(self) -> str:
        """Why this rank would stop after the step in flight: a callback's ask (debug.stop_after_step) or a
        stop received (Preemption's signal), even in the middle of the step; "" when none."""
        return self.stop_reason or self.stop_received()

    def stop_received(self) -> str:
        """The first callback's stop received in the middle of a step (Callback.stop_received); "" none."""
        return next((why for cb in self.callbacks if (why := cb.stop_received())), "")

    def step(self, measure: bool = False, stop_asked: Callable[[], bool] = lambda: False) -> StepResult:
        """One optimizer step at the schedule's learning rate and the batch ramp's size; `measure`: count the
        bytes it holds (measure.py); `stop_asked()`, asked just before the step's all-reduce: this rank asks
        every rank to stop after it."""
        t, st = self.config.train, self.state
        accum = micro_batches_per_step(st.tokens, **self.ramp)
        lr = (
            learning_rate(
                st.step,
                total_steps=self.total_steps,
                warmup=self.warmup,
                peak=t.lr,
                min_ratio=t.min_lr_ratio,
                schedule=t.schedule,
                decay_fraction=t.decay_fraction,
            )
            * st.lr_multiplier()
        )
        with self.attention_kernels():
            if self.config.parallel.pipeline > 1:
                from ..distributed.pipeline import Pipelined

                assert isinstance(self.engine, Pipelined)  # parallelize() builds one for parallel.pipeline > 1
                return pipeline_train_step(
                    self.engine,
                    self.batches,
                    st,
                    accum=accum,
                    lr=lr,
                    grad_clip=t.grad_clip,
                    micro_batch_size=t.micro_batch_size,
                    seq_len=t.seq_len,
                    stop_asked=stop_asked,
                    measure=measure,
                )
            return train_step(
                self.engine,
                self.batches,
                st,
                accum=accum,
                lr=lr,
                grad_clip=t.grad_clip,
                micro_batch_size=t.micro_batch_size,
                seq_len=t.seq_len,
                scaler=self.scaler,
                stop_asked=stop_asked,
                measure=measure,
            )

    # --- checkpoints ---------------------------------------------------------------------------------------

    def resume_or_start(self) -> None:
        if self.rt.is_main:
            self.directory.remove_partial()
        self.barrier()
        found = self.resume_from
        if found is not None:
            self.checkpoints.load(found)
            self._write_config()  # only after a successful restore: a failed --resume leaves it as it was
            st = self.state
            self.log.start_at(st.step)
            self.log.say(f"resumed from {found} (step {st.step:,}, {st.tokens:,} tokens)")
            self.log.event({"event": "resumed", "step": st.step, "tokens": st.tokens, "path": str(found)})
            for change in self.resume_changes:
                if change["event"] == "stage_changed":
                    self.say_stage_change(change)
                else:
                    self.log.say(settings_line(change))
                    self.log.event(change)
            if self.schedule_change:
                self.log.say(schedule_line(self.schedule_change))
                self.log.event(self.schedule_change)
            return
        self._write_config()
        if self.history_aside:
            self.log.say(f"moved the history of an earlier run without a checkpoint to {self.history_aside}")
        if self.config.run.resume == "auto":
            self.log.say(f"warning: no complete checkpoint in {self.run_dir}; starting from the beginning")
        if self.config.stability.spike_detection and self.config.run.checkpoint_every:
            self.save()  # step 0: a rollback target before the first regular checkpoint

    def say_stage_change(self, e: dict) -> None:
        """The new stage's windows, batch and data position (the loader kept its share of the epoch)."""
        st, data = self.state, self.batches.state_dict()
        e = {**e, "step": st.step, "tokens": st.tokens}
        e |= {"data_epoch": data.get("epoch"), "data_position": data.get("position")}
        self.log.say(stage_line(e, self.total_steps))
        self.log.event(e)

    def save(self) -> Path:
        """Checkpoint the current step (every rank), keep the newest, say so."""
        good = all(cb.checkpoint_is_good() for cb in self.callbacks)
        path = self.checkpoints.save(good)
        if self.rt.is_main:
            prune(self.run_dir, self.config.run.keep_checkpoints)
            self.log.event(
                {
                    "event": "checkpoint",
                    "step": self.state.step,
                    "tokens": self.state.tokens,
                    "good": good,
                    "path": str(path),
                }
            )
        self.barrier()
        return path

    def barrier(self) -> None:
        from ..distributed.runtime import barrier

        barrier(self.rt)

    def _write_config(self) -> None:
        if self.rt.is_main:
            self.directory.write_config(self.config)
