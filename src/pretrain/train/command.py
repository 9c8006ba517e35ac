"""Pretrain a decoder-only language model on a prepared data directory.

  pretrain train CONFIG.yaml [section.key=value ...]
  pretrain train --resume RUN_DIR [section.key=value ...]     continue from the newest complete checkpoint
  torchrun --nproc-per-node 8 -m pretrain train CONFIG.yaml    several GPUs (see the README)

Everything of the run goes to run.dir: config.yaml, metrics.jsonl, events.jsonl, plan_vs_run.json,
checkpoints/, tensorboard/.
"""

from __future__ import annotations

from pathlib import Path

from ..config_args import add_config_arguments, split_items

HELP = "train a model (one CPU/GPU, or many under torchrun)"


def add_arguments(p):
    add_config_arguments(p)
    p.add_argument("--resume", metavar="RUN_DIR", help="continue a run from its newest complete checkpoint, "
                   "with its saved config (key=value overrides still apply)")


def resolve(args):
    """The config of `pretrain train`: a file, or a run directory's saved config when resuming."""
    from ..config import load_config
    from ..errors import UsageError

    path, overrides = split_items(args.items)
    if args.resume:
        saved = Path(args.resume) / "config.yaml"
        if not saved.exists():
            raise UsageError(f"--resume {args.resume}: no config.yaml there; give the run directory of an "
                             "earlier `pretrain train`")
        path = path or str(saved)
        overrides = [f"run.dir={args.resume}", "run.resume=auto", *overrides]
    return load_config(path, overrides)


def run(args) -> int:
    from . import train

    result = train(resolve(args))
    return 0 if result else 1
