"""Time the real training step for every combination of config values, beside the planner's figures.

  pretrain sweep [CONFIG.yaml] [section.key=v1,v2,... ...] [--budget-seconds S] [--rounds N] [--threads N]
                 [--json] [--out DIR]
  pretrain sweep [CONFIG.yaml] [section.key=value ...] --from-fit N [--rounds N] [--json] [--out DIR]

A comma list sweeps a key (a list-typed key such as train.betas keeps its own syntax); every combination is a
cell: a few warm-up and timed optimizer steps of the training step on synthetic tokens, on this device, run
--rounds times in interleaved rounds (the median and the spread are reported, a spread above 10% warned). Each
cell reports it/s, tokens/s, achieved TFLOP/s, MFU, and memory measured and planned, or OOM.

Examples:
  pretrain sweep model.preset=debug train.precision=fp32 train.seq_len=32,64,128 train.micro_batch_size=1,4
  pretrain sweep configs/my.yaml train.seq_len=1024,4096 train.activation_checkpointing=none,full

`--from-fit N` times instead the N fastest layouts `pretrain plan --fit` finds for this machine, measured
beside predicted, and chooses the fastest that ran (writes from_fit.json).

Writes sweep.csv, sweep.json and sweep.png to --out (default sweep/). See docs/sweep.md.
"""

from __future__ import annotations

import argparse

from ..config_args import add_config_arguments

HELP = "time the training step over lists of config values: tokens/s, MFU, memory measured vs planned"


def add_arguments(p: argparse.ArgumentParser) -> None:
    add_config_arguments(p)
    p.add_argument(
        "--out", metavar="DIR", default="sweep", help="write sweep.csv, sweep.json and sweep.png here (default sweep/)"
    )
    p.add_argument("--json", action="store_true", help="print the result as JSON instead of the table")
    p.add_argument(
        "--budget-seconds",
        type=float,
        metavar="S",
        help="start no cell after S seconds; the rest are reported as 'skipped: budget'",
    )
    p.add_argument("--try-all", action="store_true", help="also run the cells the plan says do not fit")
    p.add_argument(
        "--warmup-steps",
        type=int,
        default=2,
        metavar="N",
        help="untimed optimizer steps per cell, at least 2 (the 2nd measures memory) (default 2)",
    )
    p.add_argument(
        "--from-fit",
        type=int,
        metavar="N",
        help="time the N fastest layouts of `pretrain plan --fit` on this machine, measured beside predicted",
    )
    p.add_argument("--steps", type=int, default=3, metavar="N", help="timed optimizer steps per cell (default 3)")
    p.add_argument(
        "--rounds",
        type=int,
        default=3,
        metavar="N",
        help="runs of every cell, interleaved (round 1 "
        "runs each cell once, then round 2 ...); figures are the medians, with their spread; a spread "
        "above 10%% is a warning (default 3)",
    )
    p.add_argument(
        "--threads",
        type=int,
        metavar="N",
        help="torch CPU threads for every cell (default on a CPU: "
        "its cores less the 1-minute load average, at least 1; see docs/sweep.md)",
    )


def run(args: argparse.Namespace) -> int:
    from ..train import use_expandable_segments
    from . import parse_items, run_sweep

    use_expandable_segments()  # before the config's checks, which may ask CUDA about the GPU

    path, overrides, swept = parse_items(args.items)
    if args.from_fit is not None:
        return _from_fit(args, path, overrides, swept)
    result = run_sweep(
        path,
        overrides,
        swept,
        budget_seconds=args.budget_seconds,
        try_all=args.try_all,
        warmup_steps=args.warmup_steps,
        steps=args.steps,
        out_dir=args.out,
        progress=not args.json,
        rounds=args.rounds,
        threads=args.threads,
    )
    _warn(result)
    if args.json:
        from .output import to_json

        print(to_json(result), end="")
        return 0
    from rich.console import Console

    from .output import table

    console = Console()
    if not console.is_terminal:  # a file or a pipe: one line per cell rather than 80 wrapped columns
        console = Console(width=200)
    console.print(table(result))
    print("wrote " + ", ".join(result["files"].values()))
    return 0


def _warn(result: dict) -> None:
    """The noise warnings on stderr, where --json keeps stdout a JSON document."""
    import sys

    for line in result["warnings"]:
        print(line, file=sys.stderr)


def _from_fit(args: argparse.Namespace, path: str | None, overrides: list[str], swept: dict[str, list[str]]) -> int:
    from ..errors import UsageError

    if swept:
        raise UsageError(
            f"--from-fit: the layouts come from the fit; give single values, not lists ({', '.join(swept)})"
        )
    from .from_fit import render, run_from_fit

    result = run_from_fit(
        path,
        overrides,
        args.from_fit,
        warmup_steps=args.warmup_steps,
        steps=args.steps,
        out_dir=args.out,
        rounds=args.rounds,
        threads=args.threads,
    )
    _warn(result)
    if args.json:
        from .output import to_json

        print(to_json(result), end="")
    else:
        print(render(result))
    return 0
