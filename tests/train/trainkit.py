"""The tiny training setup the training tests share."""

from __future__ import annotations


def tiny(prepared, run_dir, *extra) -> list[str]:
    """Overrides for a ~160K-parameter LLaMA that trains in seconds on a CPU."""
    return ["model.preset=debug", "train.seq_len=32", "train.micro_batch_size=4", "train.grad_accum_steps=2",
            "train.precision=fp32", "train.device=cpu", "train.lr=3e-3", "train.warmup=2", "train.max_steps=12",
            f"data.dir={prepared}", f"run.dir={run_dir}", "run.log_every=1", "run.eval_every=6",
            "run.eval_batches=2", "run.checkpoint_every=4", "run.progress=false", "hardware.peak_tflops=0.05",
            *extra]
