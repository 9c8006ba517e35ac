"""Downstream tasks in the report (run.eval_tasks): one panel per task, accuracy against tokens seen, with the
chance line. acc_norm solid, acc dashed, one colour per run; chance is a grey dotted line (a flat curve on it
is a model that has not learned the task yet). The panels close report.png's grid and fill tasks.png."""

from __future__ import annotations

import math

from .runs import Run


def task_names(runs: list[Run]) -> list[str]:
    return sorted({t for r in runs for t in r.task_names()})


def draw_task(ax, name: str, runs: list[Run]) -> None:
    from .style import TOKENS_AXIS, run_colors

    ax.set_title(name)
    ax.set_xlabel("tokens")
    ax.set_ylabel("accuracy")
    ax.grid(alpha=0.3)
    ax.xaxis.set_major_formatter(TOKENS_AXIS)
    chance = None
    for color, run in zip(run_colors(runs), runs):
        for metric, style in (("acc_norm", "-"), ("acc", "--")):
            tokens, values = run.series(f"eval/{name}/{metric}")
            ax.plot(tokens, values, style, color=color, marker="o" if len(tokens) < 50 else None, markersize=3)
        chance = chance or next(iter(run.series(f"eval/{name}/chance")[1]), None)
    if chance is not None:
        ax.axhline(chance, color="0.5", linestyle=":", linewidth=1.2)


def legend_handles():
    """The line styles of the task panels, for a legend beside the runs' colours."""
    from matplotlib.lines import Line2D

    return [
        Line2D([], [], color="0.3", linestyle="-", label="acc_norm"),
        Line2D([], [], color="0.3", linestyle="--", label="acc"),
        Line2D([], [], color="0.5", linestyle=":", label="chance"),
    ]


def tasks_png(runs: list[Run]) -> bytes | None:
    """The figure, or None when no run evaluated a task."""
    from matplotlib.figure import Figure
    from matplotlib.lines import Line2D

    from .style import figure_png, run_colors

    names = task_names(runs)
    if not names:
        return None
    cols = min(len(names), 3)
    rows = math.ceil(len(names) / cols)
    fig = Figure(figsize=(4.6 * cols, 3.2 * rows + 0.6), layout="constrained")
    axes = fig.subplots(rows, cols, squeeze=False).ravel()
    for ax, name in zip(axes, names):
        draw_task(ax, name, runs)
    for ax in axes[len(names) :]:
        ax.axis("off")
    handles = [Line2D([], [], color=c, label=r.name) for c, r in zip(run_colors(runs), runs)] + legend_handles()
    fig.legend(handles=handles, loc="outside lower center", ncols=len(handles), frameon=False, fontsize="small")
    fig.suptitle("Downstream tasks")
    return figure_png(fig)
