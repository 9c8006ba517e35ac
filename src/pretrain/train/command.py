"""Pretrain a decoder-only language model on a prepared data directory.

  pretrain train CONFIG.yaml [section.key=value ...]
  pretrain train --resume RUN_DIR [section.key=value ...]     continue from the newest complete checkpoint
  torchrun --nproc-per-node 8 -m pretrain train CONFIG.yaml    several GPUs (docs/train.md)

Everything of the run goes to run.dir: config.yaml, metrics.jsonl, events.jsonl, plan_vs_run.json,
checkpoints/, tensorboard/.
"""

from __future__ import annotations

import argparse
import os
from pathlib import Path
from typing import TYPE_CHECKING

from ..config_args import add_config_arguments, split_items

if TYPE_CHECKING:
    from ..config.schema import ResolvedConfig

HELP = "train a model (one CPU/GPU, or many under torchrun)"


def add_arguments(p: argparse.ArgumentParser) -> None:
    add_config_arguments(p)
    p.add_argument(
        "--resume",
        metavar="RUN_DIR",
        help="continue a run from its newest complete checkpoint, "
        "with its saved config (key=value overrides still apply)",
    )


def resolve(args: argparse.Namespace) -> ResolvedConfig:
    """The config of `pretrain train`: a file, or a run directory's saved config when resuming."""
    from ..config import load_config
    from ..config.checks import GridError
    from ..errors import ConfigError

    path, overrides = split_items(args.items)
    if args.resume:
        run_dir = Path(args.resume)
        check_same_run_dir(run_dir, overrides)
        saved = run_dir / "config.yaml"
        if path is None:
            check_saved_config(saved)
        path = path or str(saved)
        overrides = [f"run.dir={args.resume}", "run.resume=auto", *overrides]
    if "WORLD_SIZE" in os.environ:  # under torchrun the world is the truth, also for the config's checks
        overrides = [*overrides, f"parallel.gpus={os.environ['WORLD_SIZE']}"]
    try:
        return load_config(path, overrides)
    except GridError as e:  # the fix is how many processes to launch, not parallel.gpus
        from ..config.trainable import wrong_process_count

        raise ConfigError(wrong_process_count(e.tensor, e.pipeline, int(os.environ.get("WORLD_SIZE", 1)))) from None


def check_same_run_dir(run_dir: Path, overrides: list[str]) -> None:
    """`--resume A run.dir=B` would train from scratch in B: a resume continues in its own directory."""
    from ..errors import UsageError

    for item in overrides:
        key, _, value = item.partition("=")
        if key.strip() == "run.dir" and Path(value.strip()).resolve() != run_dir.resolve():
            raise UsageError(
                f"--resume {run_dir} with run.dir={value.strip()}: a resume continues in its own run "
                f"directory; to continue a copy, `cp -r {run_dir} {value.strip()}` and resume that"
            )


def check_saved_config(saved: Path) -> None:
    """The run's config.yaml must be there and hold a config; when it does not, name it and the verified copy
    in the newest checkpoint to restore it from (every checkpoint keeps its own, checksummed)."""
    from ..checkpoint.choice import resume_point
    from ..checkpoint.run_dir import RunDir
    from ..errors import UsageError

    run_dir = saved.parent
    if not run_dir.is_dir():
        raise UsageError(
            f"--resume {run_dir}: no such directory; give the run directory of an earlier `pretrain train`"
        )
    problem = RunDir(run_dir).config_problem()
    if problem is None:
        return
    try:
        newest = resume_point(run_dir)[0]
    except UsageError:
        newest = None
    fix = (
        f"restore it from the newest checkpoint's verified copy: cp {newest / 'config.yaml'} {saved}"
        if newest
        else "no checkpoint of the run holds a copy to restore it from; give the run directory of "
        "an earlier `pretrain train`"
    )
    raise UsageError(f"--resume {run_dir}: the run's config {saved} {problem}; {fix}")


def run(args: argparse.Namespace) -> int:
    from . import train, use_expandable_segments

    use_expandable_segments()  # before the config's checks, which may ask CUDA about the GPU
    result = train(resolve(args))
    return 0 if result else 1
