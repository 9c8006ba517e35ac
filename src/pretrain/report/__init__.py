"""`pretrain report`: plots and tables of one or more run directories, also of runs still going.

`make_report` is the whole feature; `command.py` only parses arguments. matplotlib is imported inside
`make_report`, because `pretrain --help` imports this package through `pretrain.report.command`.
"""

from __future__ import annotations

import os
from pathlib import Path

from ..errors import UsageError
from ..files import write_atomic
from .mixture import mixture_png, mixture_rows, mixture_series
from .runs import read_run, summarize
from .tasks import tasks_png

__all__ = ["make_report"]


def make_report(run_dirs, out_dir=None, per_panel: bool = False) -> dict:
    """Write report.png (all panels) and report.html (self-contained) for the runs, on the same axes.

    run_dirs: one run directory or a list of them. out_dir: default RUN_DIR/report for one run, ./report for
    several. per_panel: also write one PNG per panel (loss.png, lr.png, ...).
    Runs that evaluated downstream tasks in the loop (run.eval_tasks) also get tasks.png: a panel per task,
    accuracy against tokens with the chance line, also in the page.
    A mixture run (data.mixture) also gets mixture.png (mixture-K.png for the K-th of several runs): achieved
    vs target share and epochs per source, and a table of them in the page and its summary ("mixture").
    Returns {"out_dir": str, "files": [paths written], "runs": [one summary dict per run]}.
    """
    from . import html, plots  # matplotlib: only when a report is made

    paths = [Path(run_dirs)] if isinstance(run_dirs, (str, os.PathLike)) else [Path(p) for p in run_dirs]
    if not paths:
        raise UsageError("no run directory given; pass one or more RUN_DIRs")
    names = [p.resolve().name for p in paths]
    if len(set(names)) < len(names):  # runs/a/seed1 and runs/b/seed1: the legend needs the whole path
        names = [str(p) for p in paths]
    runs = [read_run(p, name) for p, name in zip(paths, names)]
    summaries = [summarize(r) for r in runs]

    out = Path(out_dir) if out_dir is not None else (paths[0] / "report" if len(paths) == 1 else Path("report"))
    try:  # before rendering: a bad --out fails at once
        out.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        raise _cannot_write(out, e) from e
    png = plots.grid_png(runs)
    task_png = tasks_png(runs)
    mixtures = {}  # run index -> its mixture figure (pretrain.report.mixture), mixture runs only
    for i, (run, summary) in enumerate(zip(runs, summaries)):
        series = mixture_series(run)  # None for a run without a mixture or without source_tokens yet
        if series:
            summary["mixture"], mixtures[i] = mixture_rows(run, series), mixture_png(run, series)
    files = {
        out / "report.png": png,
        out / "report.html": html.page(runs, summaries, png, mixtures, task_png).encode("utf-8"),
    }
    if task_png is not None:
        files[out / "tasks.png"] = task_png
    files.update(
        {out / ("mixture.png" if len(runs) == 1 else f"mixture-{i + 1}.png"): image for i, image in mixtures.items()}
    )
    if per_panel:
        files.update({out / f"{p.name}.png": plots.panel_png(runs, p) for p in plots.panels(runs)})
    for path, data in files.items():
        try:
            write_atomic(path, data)
        except OSError as e:
            raise _cannot_write(out, e) from e
    return {"out_dir": str(out), "files": [str(p) for p in files], "runs": summaries}


def _cannot_write(out: Path, e: OSError) -> UsageError:
    return UsageError(f"{out}: cannot write the report ({e.strerror or e}); pass --out DIR")
