"""The report's figures: one panel per metric against tokens, every run on the same axes, events marked.

Tokens, not steps, on the x axis: runs with different batch sizes (or a batch ramp) line up only in tokens.
Built on `matplotlib.figure.Figure` rather than pyplot: no global state, no display, Agg rendering.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Literal

from matplotlib.figure import Figure
from matplotlib.lines import Line2D
from matplotlib.ticker import FuncFormatter

from .. import units
from .runs import MARKED_EVENTS, Run, title_line
from .style import TOKENS_AXIS, figure_png, run_colors
from .tasks import draw_task, legend_handles, task_names


@dataclass(frozen=True)
class Panel:
    name: str  # file name of its own PNG
    title: str
    key: str  # field of the training lines in metrics.jsonl
    ylabel: str
    scale: float = 1.0  # stored unit -> plotted unit
    log: bool = False
    human_y: bool = False  # y ticks as 1.5K / 2M


PANELS = (
    # Log scale: the first hundred steps fall from ~ln(vocab) = 10.8 and would squash the rest of the curve.
    Panel("loss", "Loss (train solid, validation dashed)", "loss", "cross-entropy (nats/token)", log=True),
    Panel("lr", "Learning rate", "lr", "learning rate"),
    Panel("batch", "Global batch size", "batch_tokens", "tokens per step", human_y=True),
    Panel("grad_norm", "Gradient norm", "grad_norm", "global L2 norm", log=True),
    Panel("throughput", "Throughput", "tokens_per_s", "tokens/s", human_y=True),
    Panel("mfu", "Model FLOPs utilisation", "mfu", "MFU (% of peak)", scale=100),
    Panel("memory", "Peak memory", "peak_mem_bytes", "GiB", scale=1 / units.GiB),
)

# A Mixture-of-Experts run's own (pretrain.model.moe logs them), drawn after PANELS when a run has them. The
# load panel also draws each MoE layer's load thin (PER_LAYER: its per-layer list), under the worst layer's.
MOE_PANELS = (
    Panel(
        "moe_load",
        "MoE expert load (worst layer; each layer thin)",
        "moe/load_max_over_mean",
        "busiest expert's tokens / mean",
    ),
    Panel("moe_aux_loss", "MoE load-balancing loss (1: even load)", "moe/aux_loss", "aux loss, before its coefficient"),
    Panel("moe_z_loss", "MoE router z-loss", "moe/z_loss", "z-loss, before its coefficient", log=True),
)
PER_LAYER = {"moe/load_max_over_mean": "moe/load_max_over_mean_per_layer"}


def panels(runs: list[Run]) -> list[Panel]:
    """The panels of these runs: PANELS, then MOE_PANELS where a run logged them."""
    return list(PANELS) + [p for p in MOE_PANELS if any(run.series(p.key)[1] for run in runs)]


# colour, line style, marker on the loss curve
EVENT_STYLE: dict[str, tuple[str, Literal["-", "--", ":", "-."], str]] = {  # color, line style, marker
    "rollback": ("tab:red", "-", "X"),
    "spike": ("tab:orange", "--", "^"),
    "nonfinite_skip": ("tab:purple", ":", "v"),
    "resumed": ("0.45", "-.", "o"),
}
SOURCE_MARKERS = ("s", "D", "P", "*", "h", "<", ">", "p")  # val_loss/<source>, dotted: one marker each
_FEW_POINTS = 50  # below this, draw markers: a run that has just started is a handful of dots
_LOG_RANGE = 3  # log scale only when the values span more than this factor; a narrow range reads better linear


def grid_png(runs: list[Run]) -> bytes:
    """All panels in a two-column grid, then one per downstream task (run.eval_tasks); the spare cell holds the
    legend."""
    tasks, shown = task_names(runs), panels(runs)
    cols = 2
    rows = math.ceil((len(shown) + len(tasks) + 1) / cols)
    fig = Figure(figsize=(6.4 * cols, 3.3 * rows), layout="constrained")
    axes = fig.subplots(rows, cols, squeeze=False).ravel()
    for ax, panel in zip(axes, shown):
        draw(ax, panel, runs)
    for ax, name in zip(axes[len(shown) :], tasks):
        draw_task(ax, name, runs)
    drawn = len(shown) + len(tasks)
    for ax in axes[drawn:]:
        ax.axis("off")
    axes[drawn].legend(handles=_legend(runs) + (legend_handles() if tasks else []), loc="center", frameon=False)
    fig.suptitle("pretrain report: " + "; ".join(title_line(r) for r in runs), wrap=True)
    return figure_png(fig)


def panel_png(runs: list[Run], panel: Panel) -> bytes:
    fig = Figure(figsize=(7.5, 4.2), layout="constrained")
    ax = fig.subplots()
    draw(ax, panel, runs)
    ax.legend(handles=_legend(runs), fontsize="small")
    return figure_png(fig)


def draw(ax, panel: Panel, runs: list[Run]) -> None:
    ax.set_title(panel.title)
    ax.set_xlabel("tokens")
    ax.set_ylabel(panel.ylabel)
    ax.grid(alpha=0.3)
    ax.xaxis.set_major_formatter(TOKENS_AXIS)
    values = []
    for color, run in zip(run_colors(runs), runs):
        values += _curve(ax, run, panel.key, panel.scale, color, "-")
        if panel.key == "loss":
            values += _curve(ax, run, "val_loss", panel.scale, color, "--", marker="o")
            for key, marker in zip(run.source_keys(), SOURCE_MARKERS):  # a mixture's validation per source
                values += _curve(ax, run, key, panel.scale, color, ":", marker=marker)
        for _, tokens, layer in run.layer_series(PER_LAYER.get(panel.key, "")):  # each MoE layer, thin
            ax.plot(tokens, layer, color=color, linewidth=0.6, alpha=0.45)
            values += layer
    if not values:  # e.g. MFU of a run with no known peak: the trainer logs null
        ax.text(0.5, 0.5, "no data", transform=ax.transAxes, ha="center", va="center", color="0.5", fontsize="large")
        ax.set_xticks([])
        ax.set_yticks([])
        return
    if panel.log and min(values) > 0 and max(values) > _LOG_RANGE * min(values):
        _log_y(ax, max(values) / min(values))
    elif panel.human_y:
        ax.yaxis.set_major_formatter(TOKENS_AXIS)
    _mark_events(ax, runs, loss_markers=panel.key == "loss")


def _log_y(ax, span: float) -> None:
    """Log scale labelled with plain numbers (4, 5, 10, not 4x10^0). A loss from 11 to 3 stays within one
    decade, so its only major tick is 10: the minor ticks need labels, fewer of them the wider the span."""
    ax.set_yscale("log")
    ax.yaxis.set_major_formatter(FuncFormatter(lambda y, _: f"{y:g}"))
    shown = range(1, 10) if span < 10 else (2, 5) if span < 100 else ()

    def minor(y, _):
        mantissa = round(y / 10 ** math.floor(math.log10(y) + 1e-9))
        return f"{y:g}" if mantissa in shown else ""

    ax.yaxis.set_minor_formatter(FuncFormatter(minor))


def _curve(ax, run: Run, key: str, scale: float, color, style: str, marker: str | None = None) -> list:
    """Plots one series; returns the plotted values (empty when the run has none)."""
    tokens, values = run.series(key)
    values = [v * scale for v in values]
    if values:
        marker = marker or ("." if len(values) <= _FEW_POINTS else None)
        ax.plot(tokens, values, color=color, linestyle=style, marker=marker, markersize=4, linewidth=1.2)
    return values


def _mark_events(ax, runs: list[Run], loss_markers: bool) -> None:
    """A vertical line at each event's tokens; on the loss panel also a marker on the run's curve."""
    for color, run in zip(run_colors(runs), runs):
        for e in run.events:
            if e.get("event") not in EVENT_STYLE:
                continue
            line_color, style, marker = EVENT_STYLE[e["event"]]
            ax.axvline(e["tokens"], color=line_color, linestyle=style, linewidth=0.9, alpha=0.8)
            loss = e.get("loss")
            if loss_markers and isinstance(loss, (int, float)) and math.isfinite(loss) and loss > 0:
                ax.plot(
                    [e["tokens"]],
                    [loss],
                    marker=marker,
                    color=color,
                    markeredgecolor="black",
                    markersize=8,
                    linestyle="none",
                )


def _legend(runs: list[Run]) -> list[Line2D]:
    handles = [Line2D([], [], color=c, label=r.name) for c, r in zip(run_colors(runs), runs)]
    sources = sorted({key for r in runs for key in r.source_keys()})
    handles += [
        Line2D([], [], color="0.3", linestyle=":", marker=marker, label=key.replace("/", ": "))
        for key, marker in zip(sources, SOURCE_MARKERS)
    ]
    kinds = {e.get("event") for r in runs for e in r.events}
    for kind in MARKED_EVENTS:
        if kind in kinds:
            color, style, marker = EVENT_STYLE[kind]
            handles.append(
                Line2D([], [], color=color, linestyle=style, marker=marker, markeredgecolor="black", label=kind)
            )
    return handles
