"""`pretrain report`: plots and tables of one or more run directories, also of runs still going.

`make_report` is the whole feature; `command.py` only parses arguments. matplotlib is imported inside
`make_report`, because `pretrain --help` imports this package through `pretrain.report.command`.
"""

from __future__ import annotations

import os
from pathlib import Path

from ..errors import UsageError
from ..files import display_path, read_owned, record_owned, write_atomic
from .mixture import mixture_png, mixture_rows, mixture_series
from .runs import read_run, summarize
from .tasks import task_names, tasks_png

__all__ = ["make_report"]

# The report's own mark in its output directory: the files it wrote there, which the next report may replace.
# Any other file of the same name (a user's report.html, a tasks.png of their own) is refused, never replaced.
MARKER = ".pretrain-report.json"


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
    # None for a run without a mixture or without source_tokens yet
    series = {i: s for i, run in enumerate(runs) if (s := mixture_series(run))}
    mixture_names = {i: "mixture.png" if len(runs) == 1 else f"mixture-{i + 1}.png" for i in series}
    names = ["report.png", "report.html", *(["tasks.png"] if task_names(runs) else []), *mixture_names.values()]
    names += [f"{p.name}.png" for p in plots.PANELS] if per_panel else []
    _claim(out, names)  # before rendering: a bad --out, or one holding a user's files, fails at once
    png = plots.grid_png(runs)
    task_png = tasks_png(runs)
    mixtures = {}  # run index -> its mixture figure (pretrain.report.mixture), mixture runs only
    for i, s in series.items():
        summaries[i]["mixture"], mixtures[i] = mixture_rows(runs[i], s), mixture_png(runs[i], s)
    files = {
        out / "report.png": png,
        out / "report.html": html.page(runs, summaries, png, mixtures, task_png).encode("utf-8"),
    }
    if task_png is not None:
        files[out / "tasks.png"] = task_png
    files.update({out / mixture_names[i]: image for i, image in mixtures.items()})
    if per_panel:
        files.update({out / f"{p.name}.png": plots.panel_png(runs, p) for p in plots.panels(runs)})
    for path, data in files.items():
        try:
            write_atomic(path, data)
        except OSError as e:
            raise _cannot_write(out, e) from e
    return {"out_dir": str(out), "files": [str(p) for p in files], "runs": summaries}


def _claim(out: Path, names: list[str]) -> None:
    """Refuse (UsageError, nothing written) when `out` holds one of `names` that no earlier report wrote there;
    then create `out` and record them in its MARKER as the report's own."""
    marker = out / MARKER
    owned = read_owned(marker, f"delete it if {out} holds only earlier reports, or pass another --out")
    foreign = [name for name in names if os.path.lexists(out / name) and name not in owned]
    if foreign:
        shown = ", ".join(foreign[:3]) + (" ..." if len(foreign) > 3 else "")
        raise UsageError(
            f"{display_path(out)} holds {shown}, which pretrain report did not write (its {MARKER} does not list "
            "them): they would be replaced; pass another --out, or move them away"
        )
    try:
        out.mkdir(parents=True, exist_ok=True)
        record_owned(marker, owned | set(names))
    except OSError as e:
        raise _cannot_write(out, e) from e


def _cannot_write(out: Path, e: OSError) -> UsageError:
    return UsageError(f"{out}: cannot write the report ({e.strerror or e}); pass --out DIR")
