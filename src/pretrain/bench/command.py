"""Measure this machine: achievable matmul TFLOP/s per dtype over a sweep of shapes (best and median), device
memory and host-to-device bandwidth, and one transformer block's forward/backward (tokens/s, MFU).

  pretrain bench                                   # default small model, print a table
  pretrain bench --quick --out profile.json        # then: pretrain plan hardware.profile=profile.json
  pretrain bench configs/my.yaml train.micro_batch_size=8 --dtypes bf16,fp8 --json
  pretrain bench --rounds 5 --threads 1            # on a busy machine: medians of 5 rounds, one thread

CONFIG and key=value overrides pick the block: model.*, train.seq_len, train.micro_batch_size, train.precision.
See docs/bench.md for how each figure is measured and the profile's format.
"""

from __future__ import annotations

from ..config_args import add_config_arguments, split_items

HELP = "measure matmul TFLOP/s, memory bandwidth and a transformer block; write a hardware profile"


def add_arguments(parser) -> None:
    add_config_arguments(parser)
    parser.add_argument(
        "--dtypes", help="comma-separated subset of fp32,tf32,fp16,bf16,fp8 (default: all the device has)"
    )
    parser.add_argument("--device", default="auto", help="auto | cpu | cuda | cuda:N (default auto)")
    parser.add_argument(
        "--seconds", type=float, help="measurement budget in seconds (default 25 on a CPU, 120 on a GPU)"
    )
    parser.add_argument("--quick", action="store_true", help="fewer shapes and a short budget (6 s CPU, 30 s GPU)")
    parser.add_argument("--out", metavar="FILE", help="write the hardware profile JSON here")
    parser.add_argument("--json", action="store_true", help="print the profile JSON instead of the table")
    parser.add_argument(
        "--rounds",
        type=int,
        default=3,
        metavar="N",
        help="measure everything N times in turn, a "
        "1/N share of the budget each; report medians and the spread, warn above 10%% (default 3)",
    )
    parser.add_argument(
        "--threads",
        type=int,
        metavar="N",
        help="torch CPU threads (default on a CPU: its cores "
        "less the 1-minute load average, at least 1; see docs/bench.md)",
    )


def run(args) -> int:
    import json
    import sys

    from rich.console import Console

    from ..progress import counting_bar
    from . import run_bench, write_profile
    from .display import table
    from .run import check_profile_path

    path, overrides = split_items(args.items)  # no config file: a small Llama block (docs/bench.md)
    if args.out:
        check_profile_path(args.out)
    with counting_bar("bench", enabled=not args.json) as progress:
        profile = run_bench(
            path,
            overrides,
            dtypes=args.dtypes,
            seconds=args.seconds,
            device=args.device,
            quick=args.quick,
            progress=progress,
            rounds=args.rounds,
            threads=args.threads,
        )
    for line in profile["warnings"]:  # stderr: --json keeps stdout a JSON document
        print(line, file=sys.stderr)
    if args.out:
        write_profile(profile, args.out)
    if args.json:
        print(json.dumps(profile, indent=2))
    else:
        Console().print(table(profile))
        if args.out:
            print(f"profile written to {args.out}; use it with: pretrain plan hardware.profile={args.out}")
    return 0
