"""The report's curves as interactive charts in report.html: plotly's offline HTML, plotly.js embedded once.

The same panels as report.png (plots.PANELS), plus one panel per `eval/*` or `moe/*` series a run logs, every
run on the same axes in its report.png colour. Hover reads a point (run, step, tokens, value), the mouse
zooms, a click on a run in the legend hides or shows it on every panel (one legend group per run), and
events are vertical lines at their tokens on every panel, with a marker on the loss curve that names them.
"""

from __future__ import annotations

import math

from .plots import EVENT_STYLE, PER_LAYER, Panel, panels
from .runs import Run

# matplotlib's tab10, which report.png draws with (C0, C1, ...): a run has one colour in both figures
COLORS = ("#1f77b4", "#ff7f0e", "#2ca02c", "#d62728", "#9467bd", "#8c564b", "#e377c2", "#7f7f7f", "#bcbd22", "#17becf")
EVENT_COLORS = {"tab:red": "#d62728", "tab:orange": "#ff7f0e", "tab:purple": "#9467bd", "0.45": "#737373"}
DASH = {"-": "solid", "--": "dash", ":": "dot", "-.": "dashdot"}
SYMBOL = {"X": "x", "^": "triangle-up", "v": "triangle-down", "o": "circle"}
EXTRA_PREFIXES = ("eval/", "moe/")  # series other parts of pretrain log: one panel each, found by name
_LOG_RANGE = 3  # as report.png: log scale only when the values span more than 3x


def extra_panels(runs: list[Run]) -> list[Panel]:
    """A panel per eval/* or moe/* series that report.png's panels do not draw (a per-layer list is drawn
    inside its panel)."""
    drawn = {p.key for p in panels(runs)} | set(PER_LAYER.values())
    keys = sorted({k for r in runs for line in r.lines for k in line if k.startswith(EXTRA_PREFIXES)} - drawn)
    return [Panel(key.replace("/", "_"), key, key, key) for key in keys]


def curves_html(runs: list[Run]) -> str:
    """A <div> with every panel and the <script>s that draw it (plotly.js itself first, inline)."""
    return curves_figure(runs).to_html(
        full_html=False, include_plotlyjs=True, div_id="curves", config={"displaylogo": False, "responsive": True}
    )


def curves_figure(runs: list[Run]):
    """The plotly Figure of every panel."""
    import plotly.graph_objects as go
    from plotly.subplots import make_subplots

    shown = panels(runs) + extra_panels(runs)
    rows = math.ceil(len(shown) / 2)
    fig = make_subplots(
        rows=rows,
        cols=2,
        subplot_titles=[p.title for p in shown],
        vertical_spacing=min(0.3 / rows, 0.08),
        horizontal_spacing=0.08,
    )
    shapes = []  # the events' lines, set at once (plotly's add_vline re-validates the layout each time)
    for i, panel in enumerate(shown):
        row, col = i // 2 + 1, i % 2 + 1
        axis = "" if i == 0 else str(i + 1)  # make_subplots numbers the axes row by row
        values = []
        for j, run in enumerate(runs):
            color = COLORS[j % len(COLORS)]
            series = [(panel.key, "solid", None)]
            if panel.key == "loss":  # validation dashed, a mixture's sources dotted, as in report.png
                series += [("val_loss", "dash", "circle")] + [(k, "dot", "square") for k in run.source_keys()]
            for key, dash, symbol in series:
                tokens, ys = run.series(key)
                ys = [v * panel.scale for v in ys]
                values += ys
                if not ys:
                    continue
                steps = run.steps(key)
                fig.add_trace(
                    go.Scatter(
                        x=tokens,
                        y=ys,
                        customdata=steps,
                        name=run.name,
                        legendgroup=run.name,
                        showlegend=i == 0 and key == panel.key,
                        mode="lines+markers" if symbol or len(ys) <= 50 else "lines",
                        line={"color": color, "dash": dash, "width": 1.5},
                        marker={"symbol": symbol or "circle", "size": 5},
                        hovertemplate=f"{run.name}<br>{key} %{{y:.4~g}}<br>step %{{customdata}}, tokens %{{x:,}}"
                        "<extra></extra>",
                    ),
                    row=row,
                    col=col,
                )
            values += _layer_traces(fig, go, run, PER_LAYER.get(panel.key, ""), color, row, col)
            shapes += _events(fig, go, run, color, row, col, axis, markers=panel.key == "loss")
        if panel.log and values and min(values) > 0 and max(values) > _LOG_RANGE * min(values):
            fig.update_yaxes(type="log", row=row, col=col)
        fig.update_yaxes(title_text=panel.ylabel, row=row, col=col)
        fig.update_xaxes(title_text="tokens", row=row, col=col)
    fig.update_layout(
        shapes=shapes,
        height=300 * rows + 40,
        hovermode="closest",
        margin={"t": 80, "b": 40},
        legend={"orientation": "h", "yref": "container", "y": 1, "yanchor": "top"},
    )
    return fig


def _layer_traces(fig, go, run: Run, key: str, color: str, row: int, col: int) -> list[float]:
    """Each layer of a per-layer series (moe/load_max_over_mean_per_layer) as a thin trace of the run's colour,
    named by its block; returns the values drawn."""
    values = []
    for block, tokens, ys in run.layer_series(key):
        values += ys
        fig.add_trace(
            go.Scatter(
                x=tokens,
                y=ys,
                name=f"{run.name} block {block}",
                legendgroup=run.name,
                showlegend=False,
                mode="lines",
                opacity=0.5,
                line={"color": color, "width": 0.8},
                hovertemplate=f"{run.name}<br>block {block}: {key} %{{y:.4~g}}<br>tokens %{{x:,}}<extra></extra>",
            ),
            row=row,
            col=col,
        )
    return values


def _events(fig, go, run: Run, color: str, row: int, col: int, axis: str, markers: bool) -> list[dict]:
    """The run's marked events on one panel: their vertical lines (returned), and on the loss panel a marker
    on the curve for each that carries a loss (added)."""
    lines = []
    for kind, (line_color, style, marker) in EVENT_STYLE.items():
        events = [e for e in run.events if e.get("event") == kind]
        lines += [
            {
                "type": "line",
                "xref": f"x{axis}",
                "yref": f"y{axis} domain",
                "x0": e["tokens"],
                "x1": e["tokens"],
                "y0": 0,
                "y1": 1,
                "opacity": 0.8,
                "line": {"color": EVENT_COLORS[line_color], "dash": DASH[style], "width": 1},
            }
            for e in events
        ]
        shown = [e for e in events if _positive(e.get("loss"))]
        if markers and shown:
            fig.add_trace(
                go.Scatter(
                    x=[e["tokens"] for e in shown],
                    y=[e["loss"] for e in shown],
                    mode="markers",
                    name=f"{run.name}: {kind}",
                    legendgroup=run.name,
                    showlegend=False,
                    marker={
                        "symbol": SYMBOL[marker],
                        "size": 10,
                        "color": color,
                        "line": {"color": "black", "width": 1},
                    },
                    customdata=[e["step"] for e in shown],
                    hovertemplate=f"{run.name}: {kind} at step %{{customdata}}<br>loss %{{y:.4~g}}<extra></extra>",
                ),
                row=row,
                col=col,
            )
    return lines


def _positive(v) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v) and v > 0
