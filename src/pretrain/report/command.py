"""Plot one or more training runs: loss (train and validation), learning rate, global batch size, gradient
norm, tokens/s, MFU and peak memory against tokens, with spikes and rollbacks marked, plus the table of
planned vs measured memory and speed. Several runs share the axes. Works on a run that is still going.

Writes report.png and a self-contained report.html (to RUN_DIR/report/ for one run, ./report/ for several),
then prints a one-line summary per run.

examples:
  pretrain report runs/gpt2-small
  pretrain report runs/lr3e-4 runs/lr6e-4 --out reports/lr-sweep --per-panel
"""

from __future__ import annotations

HELP = "plot runs (loss, lr, batch, grad norm, speed, MFU, memory) and plan vs measured, as PNG and HTML"


def add_arguments(parser) -> None:
    parser.add_argument("run_dirs", nargs="+", metavar="RUN_DIR", help="run directory (its metrics.jsonl)")
    parser.add_argument(
        "--out", metavar="DIR", help="output directory (default: RUN_DIR/report for one run, ./report for several)"
    )
    parser.add_argument("--per-panel", action="store_true", help="also write one PNG per panel")


def run(args) -> int:
    from . import make_report
    from .mixture import mixture_line
    from .runs import summary_line

    result = make_report(args.run_dirs, args.out, per_panel=args.per_panel)
    for path in result["files"]:
        print(f"wrote {path}")
    for summary in result["runs"]:
        print(summary_line(summary))
        for row in summary.get("mixture") or []:
            print(f"  mixture {mixture_line(row)}")
        for note in summary["notes"]:
            print(f"  note: {note}")
    return 0
