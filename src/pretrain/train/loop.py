"""The pretraining loop: the recipe large-model pretraining converged on, resumable bit for bit.

One optimizer step = `micro_batches_per_step(tokens seen)` micro-batches per rank (the batch ramp), each
forward under autocast, backward of loss / micro-batches; clip the global gradient norm (logged before
clipping); skip the update if the norm is not finite; AdamW with the warm-up + decay learning rate. Around
it: evaluation, checkpoints, loss-spike rollback, preemption, metrics, and the plan checked against the run.
"""

from __future__ import annotations

import contextlib
import functools
import math
import os
import signal
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

import torch
import yaml

from .. import __version__
from ..config import compile_enabled
from ..errors import ConfigError, UsageError
from ..files import write_atomic
from ..plan.budget import run_length
from ..plan.params import count_params
from ..plan.schedule import checked_warmup, learning_rate, micro_batches_per_step
from . import checkpoint as ckpt
from . import plan_check
from .measure import measure_forward, model_state_bytes
from .metrics import RunLog
from .stability import SpikeDetector

MEASURE_STEP = 2  # optimizer states exist after the first step; measure the plan on the step after


class TrainingStopped(UsageError):
    """The run cannot go on without a person (e.g. it keeps diverging); the message says what to do."""


@dataclass
class TrainState:
    """Everything a resume needs besides tensors and RNG states: a few numbers."""
    step: int = 0
    tokens: int = 0            # tokens trained on, all ranks together
    micro_batches: int = 0     # micro-batches drawn from the data stream per rank (survives rollbacks)
    data: dict = field(default_factory=dict)
    lr_scale: float = 1.0
    lr_scale_until: int = 0
    rollbacks: list = field(default_factory=list)
    nonfinite_skips: int = 0
    stability: dict = field(default_factory=dict)
    good: bool = True


def precision_context(precision: str, device: torch.device):
    """Autocast for the *-mixed precisions (no weight-cast cache: the planner counts casts kept for backward)."""
    if precision.endswith("-mixed"):
        dtype = torch.bfloat16 if precision == "bf16-mixed" else torch.float16
        return functools.partial(torch.autocast, device.type, dtype=dtype, cache_enabled=False)
    return contextlib.nullcontext


def check_trainable(config, data_meta: dict | None = None, needs_data: bool = True) -> None:
    """Config errors the trainer (not the planner) refuses, before anything heavy is built."""
    t, par = config.train, config.parallel
    if t.grad_dtype == "same" and t.precision.endswith("-mixed"):
        raise ConfigError("train.grad_dtype: same (half-precision gradients) is a planning option; autocast keeps "
                          "fp32 gradients: use train.grad_dtype=fp32 or train.precision=bf16")
    if par.offload != "none":
        raise ConfigError("parallel.offload: the trainer does not offload to host memory; the planner models "
                          "it (use parallel.offload=none to train)")
    if par.tensor > 1 or par.pipeline > 1:
        raise ConfigError("parallel.tensor / parallel.pipeline: the trainer runs data parallel (DDP, ZeRO 1-3) "
                          "only; the planner models tensor and pipeline parallelism (set both to 1 to train)")
    if needs_data and not config.data.dir:
        raise ConfigError("data.dir: not set; prepare data with `pretrain prepare --out DIR` and set data.dir=DIR")
    if data_meta is not None and data_meta["vocab_size"] > config.model.vocab_size:
        raise ConfigError(f"model.vocab_size: {config.model.vocab_size} is smaller than the vocabulary of "
                          f"{config.data.dir} ({data_meta['vocab_size']}); set model.vocab_size="
                          f"{data_meta['vocab_size']} or more")


class Trainer:
    def __init__(self, config, rt, loader=None, quiet: bool = False):
        """`loader` replaces the data directory (e.g. synthetic tokens for `pretrain sweep`); `quiet` writes
        nothing to the run directory."""
        from ..data.loader import PreparedData, RandomWindows, SequentialWindows
        from ..distributed.parallel import parallelize
        from ..distributed.recompute import apply_activation_checkpointing
        from ..model import build_model

        self.config, self.rt = config, rt
        c, t = config, config.train
        c.parallel.gpus = rt.world_size  # the world torchrun gives is the truth (steps, batch, the plan)
        self.run_dir = Path(c.run.dir)
        check_trainable(c, needs_data=loader is None)
        if loader is None and c.data.dir:  # saved absolute: export, generate and resume run from anywhere
            c.data.dir = str(Path(c.data.dir).resolve())
        self.data = PreparedData(c.data.dir) if loader is None else None
        if self.data is not None:
            check_trainable(c, self.data.meta)
            SequentialWindows(self.data, "val", t.seq_len, rank=rt.rank, world_size=rt.world_size)  # enough val?
        if c.run.resume == "never" and not quiet and ckpt.list_checkpoints(self.run_dir):
            raise UsageError(f"run.dir {self.run_dir} already holds checkpoints of another run; continue it with "
                             f"`pretrain train --resume {self.run_dir}` or choose a new run.dir")
        self.counts = count_params(c.model)
        self.length = run_length(c, self.counts.total)
        self.total_steps = self.length["steps"]
        self.warmup = checked_warmup(t, self.total_steps)
        self.dp = rt.world_size
        self.ramp = dict(seq_len=t.seq_len, micro_batch_size=t.micro_batch_size, data_parallel=self.dp,
                         grad_accum_steps=t.grad_accum_steps, ramp_tokens=t.batch_ramp_tokens,
                         ramp_start=t.batch_ramp_start)
        if rt.device.type == "cuda":
            torch.set_float32_matmul_precision("high")  # fp32 matmuls at TF32 speed, as the plan assumes

        # FSDP shards a model built on the meta device, then each rank materialises only its shard: a 70B
        # model never exists whole on one GPU. The per-parameter seeded init gives every mode the same values.
        fsdp = rt.distributed and c.parallel.zero_stage >= 2
        self.compiled = compile_enabled(t.compile, rt.device.type)
        on_meta = fsdp and not c.model.init_from
        model = build_model(c.model, attention=t.attention, device="meta" if on_meta else rt.device,
                            seed=t.seed, loss=t.loss, loss_chunk_tokens=t.loss_chunk_tokens)
        if c.model.init_from:
            from ..export.hf import load_hf_into

            load_hf_into(model, c.model.init_from)
        if t.precision == "bf16":
            model = model.to(torch.bfloat16)
        apply_activation_checkpointing(model, t.activation_checkpointing)
        model.fix_attention_kernel(rt.device, half=t.precision != "fp32")
        if self.compiled and fsdp:
            # torchtitan's order: each block compiled, then sharded. FSDP2's hooks at the block boundaries stay
            # eager; a whole-model compile would meet them inside the loop over blocks and run all eager.
            for block in model.blocks:
                block.compile()
        self.model, self.wrapped = parallelize(model, c, rt)
        if on_meta:
            self.model.to_empty(device=rt.device)
            self.model.reset_parameters(t.seed)
        self.optimizer = self.wrapped.build_optimizer(c)
        # The weights have their own generators; the global one drives dropout, whose masks must differ
        # between data-parallel ranks as they would between the micro-batches of one process.
        torch.manual_seed(t.seed + rt.rank)
        self.autocast = precision_context(t.precision, rt.device) if self.wrapped.autocast else contextlib.nullcontext
        self.scaler = torch.amp.GradScaler(rt.device.type) if t.precision == "fp16-mixed" else None
        if self.compiled:
            self.model.rotary(t.seq_len, rt.device)
        self.forward_model = torch.compile(self.wrapped.module_for_forward) if self.compiled and not fsdp else \
            self.wrapped.module_for_forward
        self.loader = loader or RandomWindows(self.data, "train", t.seq_len, seed=t.seed, rank=rt.rank,
                                              world_size=rt.world_size)
        self.state = TrainState()
        self.spikes = SpikeDetector(c.stability)
        self.device_config = plan_check.config_for_device(c, rt)
        self.plan = None
        self.peak = None
        self.stop_signal = 0
        self.stop_reason = ""
        self.saved_at = None  # (step, path) of the last checkpoint written
        self.log = RunLog(self.run_dir, self.total_steps, 0, progress=c.run.progress,
                          enabled=rt.is_main and not quiet)

    # --- state -------------------------------------------------------------------------------------------

    def state_dict(self) -> dict:
        sd = self.wrapped.state_dict(self.optimizer)
        if self.scaler is not None:
            sd["scaler"] = self.scaler.state_dict()
        return sd

    def load_state_dict(self, sd: dict) -> None:
        self.wrapped.load_state_dict(self.optimizer, sd)
        if self.scaler is not None and "scaler" in sd:
            self.scaler.load_state_dict(sd["scaler"])

    def save(self) -> Path:
        self.state.data = self.loader.state_dict()
        self.state.stability = self.spikes.state_dict()
        self.state.good = not self.spikes.active
        trainer = {**asdict(self.state), "version": __version__, "total_steps": self.total_steps}
        path = ckpt.save_checkpoint(self.run_dir, self.state.step, self.state_dict(), trainer,
                                    yaml.safe_dump(self.config.to_dict(), sort_keys=False), rank=self.rt.rank,
                                    barrier=self._barrier,
                                    fail_disk_full=self.state.step == self.config.debug.inject_disk_full_step > 0,
                                    pause=self.config.debug.checkpoint_sleep)
        self.saved_at = (self.state.step, path)
        if self.rt.is_main:
            ckpt.prune(self.run_dir, self.config.run.keep_checkpoints)
            self.log.event({"event": "checkpoint", "step": self.state.step, "tokens": self.state.tokens,
                            "good": self.state.good, "path": str(path)})
        self._barrier()
        return path

    def restore(self, path: Path, keep_data_position: bool = False) -> None:
        sd = self.state_dict()
        ckpt.load_state(path, sd)
        self.load_state_dict(sd)
        saved = ckpt.read_trainer_state(path)
        fields = {k: saved[k] for k in TrainState.__dataclass_fields__ if k in saved}
        keep = (self.state.micro_batches, self.loader.state_dict(), self.state.rollbacks) if keep_data_position else None
        self.state = TrainState(**fields)
        self.spikes.load_state_dict(self.state.stability)
        if keep is None:
            self.loader.load_state_dict(self.state.data)
            ckpt.load_rng(path, self.rt.rank)
        else:  # a rollback: weights go back, the data stream goes on past what caused the spike
            self.state.micro_batches, data, self.state.rollbacks = keep
            self.loader.load_state_dict(data)

    def _barrier(self):
        from ..distributed.runtime import barrier

        barrier(self.rt)

    # --- the loop ----------------------------------------------------------------------------------------

    def resume_or_start(self) -> None:
        if self.rt.is_main:
            ckpt.remove_partial(self.run_dir)
        self._barrier()
        found = ckpt.latest_checkpoint(self.run_dir) if self.config.run.resume == "auto" else None
        if found is not None:
            self.restore(found)
            self.log.say(f"resumed from {found} (step {self.state.step:,}, {self.state.tokens:,} tokens)")
            self.log.event({"event": "resumed", "step": self.state.step, "tokens": self.state.tokens,
                            "path": str(found)})
        else:
            if self.config.run.resume == "auto":
                self.log.say(f"warning: no complete checkpoint in {self.run_dir}; starting from the beginning")
            if self.config.stability.spike_detection:
                self.save()  # step 0: a rollback target before the first regular checkpoint

    def run(self) -> dict:
        try:
            return self._run()
        finally:
            self._restore_signals()
            self.log.close()

    def _run(self) -> dict:
        c = self.config
        self._write_config()
        self.resume_or_start()
        self.peak, peak_source = plan_check.peak_tflops(self.device_config, self.rt.device)
        self.device_config.hardware.peak_tflops = self.peak  # the plan's tokens/s at the same peak as MFU
        self.plan = plan_check.make_plan(self.device_config)
        self.log.say(plan_check.summary(self.plan, self.device_config))
        self._install_signals()
        flops_per_token = self.plan["flops"]["per_token" if c.flops.convention == "palm" else "per_token_6n"]
        interval_tokens, interval_time, interval_start, last, pending = 0, 0.0, self.state.step, {}, None
        while self.state.step < self.total_steps:
            t0 = time.perf_counter()
            result = self.train_step()
            if result["action"] == "rollback":
                self.rollback(result)
                continue
            elapsed = time.perf_counter() - t0
            interval_tokens += result["batch_tokens"]
            interval_time += elapsed
            step = self.state.step
            if result.get("measured"):
                pending = result["measured"]
            if step % c.run.log_every == 0 or step == self.total_steps:
                tps = interval_tokens / max(interval_time, 1e-9)
                mfu = tps * flops_per_token / (self.peak * 1e12 * self.rt.world_size) if self.peak else None
                last = {"step": step, "tokens": self.state.tokens, "loss": result["loss"], "lr": result["lr"],
                        "batch_tokens": result["batch_tokens"], "grad_norm": result["grad_norm"],
                        "tokens_per_s": tps, "mfu": mfu, "peak_mem_bytes": self._peak_memory()}
                self.log.metrics(last)
                # Compared with the plan on an interval after the measurement (warm-up and compilation done).
                if pending is not None and (interval_start >= MEASURE_STEP or step == self.total_steps):
                    self._report_plan_vs_run(pending, tps, mfu)
                    pending = None
                interval_tokens, interval_time, interval_start = 0, 0.0, step
            if c.run.eval_every and step % c.run.eval_every == 0 and step < self.total_steps:
                self.evaluate()
            if (c.run.checkpoint_every and step % c.run.checkpoint_every == 0) or step == self.total_steps:
                self.save()
            if result.get("measured") and self.rt.device.type == "cuda" and pending is not None:
                # The measurement step holds extras (a second run of block 0, the meter's copies): the peak the
                # plan is compared with is that of the steps after it.
                torch.cuda.reset_peak_memory_stats(self.rt.device)
            if c.debug.step_sleep:
                time.sleep(c.debug.step_sleep)
            if c.debug.stop_after_step and step == c.debug.stop_after_step:
                self.stop_reason = "debug.stop_after_step"
            if self._stop_requested():
                return self._preempted()
        final = self.evaluate()
        self.log.say(f"done: {self.state.step:,} steps, {self.state.tokens:,} tokens, final validation loss "
                     f"{final['val_loss']:.4f}")
        return {"step": self.state.step, "tokens": self.state.tokens, "val_loss": final["val_loss"],
                "train_loss": last.get("loss"), "run_dir": str(self.run_dir)}

    def train_step(self) -> dict:
        c, t, st = self.config, self.config.train, self.state
        accum = micro_batches_per_step(st.tokens, **self.ramp)
        scale = st.lr_scale if st.step < st.lr_scale_until else 1.0
        lr = learning_rate(st.step, total_steps=self.total_steps, warmup=self.warmup, peak=t.lr,
                           min_ratio=t.min_lr_ratio, schedule=t.schedule, decay_fraction=t.decay_fraction) * scale
        for group in self.optimizer.param_groups:
            group["lr"] = lr
        measure = st.step + 1 == MEASURE_STEP
        measured = None
        loss_sum = torch.zeros((), device=self.rt.device)
        for i in range(accum):
            x, y = self.loader.next_batch(t.micro_batch_size)
            x, y = x.to(self.rt.device, non_blocking=True), y.to(self.rt.device, non_blocking=True)
            with self.wrapped.sync_context(last=i == accum - 1):
                if measure and i == 0 and self.wrapped.measurable and not self.compiled:
                    loss, saved = measure_forward(self.forward_model, x, y, self.autocast)
                    measured = {"saved": saved}
                else:
                    with self.autocast():
                        loss = self.forward_model(x, y)
                loss = self._inject(loss)
                st.micro_batches += 1
                loss_sum += loss.detach().float()
                scaled = loss / accum
                (self.scaler.scale(scaled) if self.scaler else scaled).backward()
        if self.scaler is not None:
            self.scaler.unscale_(self.optimizer)
        grad_norm = self.wrapped.clip_grad_norm(t.grad_clip)
        loss_value = self.wrapped.mean_over_ranks(loss_sum.item() / accum)
        finite = math.isfinite(grad_norm)
        if finite or self.scaler is not None:
            if self.scaler is not None:
                self.scaler.step(self.optimizer)  # skips the update itself on inf/NaN and lowers the scale
                self.scaler.update()
            else:
                self.optimizer.step()
        if measure:
            measured = measured or {"saved": None}
            measured["states"] = model_state_bytes(self.model, getattr(self.optimizer, "optim", self.optimizer))
            if c.debug.check_sharding:
                self._check_sharding(measured["states"])
        self.optimizer.zero_grad(set_to_none=True)
        batch_tokens = accum * t.micro_batch_size * t.seq_len * self.dp
        st.step += 1
        st.tokens += batch_tokens
        if not finite:
            st.nonfinite_skips += 1
            self.log.event({"event": "nonfinite_skip", "step": st.step, "tokens": st.tokens, "loss": _json_float(
                loss_value), "grad_norm": _json_float(grad_norm)})
        action = self.spikes.observe(loss_value)
        if action == "spike":
            self.log.event({"event": "spike", "step": st.step, "tokens": st.tokens, "loss": _json_float(loss_value),
                            "streak": self.spikes.streak})
        return {"action": action, "loss": loss_value, "lr": lr, "grad_norm": grad_norm, "batch_tokens": batch_tokens,
                "measured": measured}

    def _inject(self, loss):
        """Fault injection for tests (debug.inject_*): keyed by position in the data stream, so skipping the
        data after a rollback removes the fault, as it would remove bad data."""
        d = self.config.debug
        if self.state.micro_batches in d.inject_nan_batches:
            return loss * float("nan")
        if self.state.micro_batches in d.inject_spike_batches:
            return loss * d.inject_spike_factor
        return loss

    def rollback(self, result: dict) -> None:
        st, cfg = self.state, self.config.stability
        recent = [s for s in st.rollbacks if st.step - s < cfg.rollback_window]
        if len(recent) >= cfg.max_rollbacks:
            self.log.event({"event": "stopped", "step": st.step, "tokens": st.tokens, "loss": _json_float(result["loss"]),
                            "reason": "too many rollbacks"})
            raise TrainingStopped(f"{len(recent)} rollbacks within {cfg.rollback_window} steps (last at step "
                                  f"{st.step}, loss {result['loss']:.4g}); the run keeps diverging: lower train.lr, "
                                  f"check the data, or raise stability.max_rollbacks, then `pretrain train --resume "
                                  f"{self.run_dir}`")
        target = ckpt.latest_checkpoint(self.run_dir, good_only=True, before_step=st.step)
        if target is None:
            raise TrainingStopped(f"loss spike at step {st.step} and no good checkpoint to roll back to in "
                                  f"{self.run_dir}; lower train.lr or enable stability.spike_detection")
        from_step, from_tokens = st.step, st.tokens
        st.rollbacks = st.rollbacks + [from_step]
        saved = ckpt.read_trainer_state(target)
        self.restore(target, keep_data_position=True)
        if self.rt.is_main:  # written on the way into the spike: a resume must not go back to them
            ckpt.remove_after(self.run_dir, self.state.step)
        self.saved_at = None
        self._barrier()
        if cfg.lr_scale != 1.0 and cfg.lr_scale_steps:
            self.state.lr_scale = cfg.lr_scale
            self.state.lr_scale_until = self.state.step + cfg.lr_scale_steps
        skipped = [saved["micro_batches"], self.state.micro_batches]
        seq_tokens = self.config.train.micro_batch_size * self.config.train.seq_len * self.rt.world_size
        self.log.event({"event": "rollback", "step": from_step, "tokens": from_tokens,
                        "loss": _json_float(result["loss"]), "to_step": self.state.step,
                        "skipped_micro_batches": skipped,
                        "skipped_tokens": [skipped[0] * seq_tokens, skipped[1] * seq_tokens]})
        self.log.say(f"loss {result['loss']:.4g} at step {from_step}: rolled back to step {self.state.step} and "
                     f"skipped data micro-batches {skipped[0]}..{skipped[1]}")

    @torch.no_grad()
    def evaluate(self) -> dict:
        from ..data.loader import SequentialWindows

        c = self.config
        self.wrapped.module_for_forward.eval()
        windows = SequentialWindows(self.data, "val", c.train.seq_len, rank=self.rt.rank, world_size=self.rt.world_size)
        losses = []
        for x, y in windows.batches(c.train.micro_batch_size, c.run.eval_batches):
            x, y = x.to(self.rt.device), y.to(self.rt.device)
            with self.autocast():
                losses.append(float(self.wrapped.module_for_forward(x, y)))
        self.wrapped.module_for_forward.train()
        val = self.wrapped.mean_over_ranks(sum(losses) / len(losses))
        record = {"step": self.state.step, "tokens": self.state.tokens, "val_loss": val,
                  "val_ppl": math.exp(min(val, 80.0))}
        self.log.metrics(record)
        return record

    # --- plan vs run ---------------------------------------------------------------------------------------

    def _peak_memory(self) -> int | None:
        if self.rt.device.type == "cuda":
            return int(torch.cuda.max_memory_allocated(self.rt.device))
        import resource

        return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024  # the process's peak RSS on Linux

    def _report_plan_vs_run(self, measured: dict, tps: float, mfu: float | None) -> None:
        peak = int(torch.cuda.max_memory_allocated(self.rt.device)) if self.rt.device.type == "cuda" else None
        report = plan_check.compare(self.plan, measured["states"], measured["saved"], peak, tps, mfu,
                                    self.config.hardware.mfu, str(self.rt.device))
        if self.rt.is_main:
            plan_check.write(self.run_dir, report)
            self.log.say(plan_check.render(report))

    def _check_sharding(self, states: dict) -> None:
        """Debug mode: this rank holds exactly what the planner says this rank holds (one shared truth)."""
        from ..plan.memory import model_state_tensors

        planned = model_state_tensors(self.device_config, rank=self.rt.rank)
        wrong = {k: (v, planned[k]) for k, v in states.items() if v != planned[k]}
        if wrong:
            detail = ", ".join(f"{k} {held:,} bytes held, {want:,} planned" for k, (held, want) in wrong.items())
            raise AssertionError(f"rank {self.rt.rank}: {detail} (ZeRO-{self.config.parallel.zero_stage})")

    # --- signals -------------------------------------------------------------------------------------------

    def _install_signals(self) -> None:
        def handler(signum, frame):
            if self.stop_signal:  # a second signal: leave at once
                os._exit(128 + signum)
            self.stop_signal = signum
            name = signal.Signals(signum).name
            os.write(2, f"pretrain train: {name}: stopping after this step with a checkpoint ({name} again "
                        f"exits at once)\n".encode())  # os.write: safe inside a signal handler

        self._previous_handlers = {sig: signal.signal(sig, handler) for sig in (signal.SIGTERM, signal.SIGINT)}

    def _restore_signals(self) -> None:
        for sig, previous in getattr(self, "_previous_handlers", {}).items():
            signal.signal(sig, previous)

    def _stop_requested(self) -> bool:
        from ..distributed.runtime import all_reduce_max

        asked = 1.0 if (self.stop_signal or self.stop_reason) else 0.0
        return all_reduce_max(asked, self.rt) > 0  # one rank's SIGTERM stops the whole job

    def _preempted(self) -> dict:
        step = self.state.step  # a checkpoint step already saved itself
        path = self.saved_at[1] if self.saved_at and self.saved_at[0] == step else self.save()
        name = (signal.Signals(self.stop_signal).name if self.stop_signal else self.stop_reason
                or "a signal on another rank")
        self.log.event({"event": "preempted", "step": self.state.step, "tokens": self.state.tokens,
                        "signal": name, "path": str(path)})
        self.log.say(f"stopped by {name} after step {self.state.step:,}; checkpoint {path}; resume with: "
                     f"pretrain train --resume {self.run_dir}")
        return {"step": self.state.step, "tokens": self.state.tokens, "preempted": True, "run_dir": str(self.run_dir)}

    def _write_config(self) -> None:
        if self.rt.is_main:
            self.run_dir.mkdir(parents=True, exist_ok=True)
            write_atomic(self.run_dir / "config.yaml", yaml.safe_dump(self.config.to_dict(), sort_keys=False))


def _json_float(x: float):
    return x if math.isfinite(x) else str(x)
