"""The report as one self-contained HTML page: interactive curves (plotly.js inline, interactive.py), the
figure inlined as a data URI, so it can be mailed or copied off a cluster as a single file that works offline."""

from __future__ import annotations

import base64
from html import escape

from .. import units
from .interactive import curves_html
from .runs import Run, title_line

_CSS = """
body { font-family: system-ui, sans-serif; margin: 2em; color: #222; }
table { border-collapse: collapse; margin: 0.5em 0 1.5em; }
th, td { border: 1px solid #ccc; padding: 0.25em 0.7em; text-align: right; }
th:first-child, td:first-child { text-align: left; }
td.off { background: #fde2e1; }
img { max-width: 100%; }
.runs { display: flex; flex-wrap: wrap; gap: 0 2em; }
.run { flex: 1 1 30em; min-width: 0; overflow-x: auto; }
.note { color: #a15c00; }
"""
_OFF_PCT = 10  # plan and run disagree by more than this: shade the cell


def page(
    runs: list[Run], summaries: list[dict], png: bytes, mixtures: dict | None = None, tasks: bytes | None = None
) -> str:
    """mixtures: run index -> the PNG of its mixture (achieved vs target, epochs), for mixture runs; tasks:
    the PNG of the downstream tasks' panels, for runs that evaluated some."""
    image = base64.b64encode(png).decode("ascii")
    parts = [
        "<!DOCTYPE html>",
        '<html lang="en"><head><meta charset="utf-8"><title>pretrain report</title>',
        f"<style>{_CSS}</style></head><body>",
        f"<h1>pretrain report: {escape(', '.join(r.name for r in runs))}</h1>",
        _summary_table(summaries),
        curves_html(runs),
        (
            f'<details><summary>The same curves as one image (report.png)</summary><img alt="training curves" '
            f'src="data:image/png;base64,{image}"></details>'
        ),
        '<div class="runs">',
    ]
    if tasks is not None:
        parts.append(f'<img alt="downstream tasks" src="data:image/png;base64,{base64.b64encode(tasks).decode()}">')
    for i, (run, s) in enumerate(zip(runs, summaries)):  # side by side, one column per run
        parts.append(f'<section class="run"><h2>{escape(title_line(run))}</h2><p>{escape(str(run.path))}</p>')
        if s["model"]:
            parts.append(f"<p>Model {escape(s['model'])}</p>")
        parts += [f'<p class="note">{escape(n)}</p>' for n in run.notes]
        if s.get("mixture"):
            parts.append(_mixture_table(s["mixture"], (mixtures or {}).get(i)))
        parts.append(_plan_table(run.plan_vs_run) if run.plan_vs_run else "<p>No plan_vs_run.json yet.</p>")
        parts.append(_events_table(run.events) + "</section>")
    parts.append("</div></body></html>\n")
    return "\n".join(parts)


def _table(header: list[str], rows: list[list]) -> str:
    """A cell is escaped text, or (escaped text, CSS class)."""

    def td(cell):
        text, cls = cell if isinstance(cell, tuple) else (cell, None)
        return f'<td class="{cls}">{text}</td>' if cls else f"<td>{text}</td>"

    head = "".join(f"<th>{h}</th>" for h in header)
    body = "".join("<tr>" + "".join(td(cell) for cell in row) + "</tr>" for row in rows)
    return f"<table><tr>{head}</tr>{body}</table>"


def _summary_table(summaries: list[dict]) -> str:
    rows = [
        [
            escape(s["name"]),
            str(s["last_step"] if s["last_step"] is not None else "-"),
            units.human(s["tokens"]),
            units.number(s["last_loss"]),
            units.number(s["best_val_loss"]),
            units.human(s["tokens_per_s_median"]),
            escape(", ".join(f"{n}x {kind}" for kind, n in s["events"].items()) or "-"),
        ]
        for s in summaries
    ]
    return _table(
        ["run", "last step", "tokens", "last train loss", "best val loss", "tokens/s (median)", "events"], rows
    )


def _plan_table(plan_vs_run: dict) -> str:
    rows = []
    for row in plan_vs_run["rows"]:
        if not isinstance(row, dict):
            continue
        unit = str(row.get("unit", ""))
        err = row.get("error_pct")
        err_cell = "-" if err is None else (f"{err:+.1f} %", "off" if abs(err) > _OFF_PCT else None)
        rows.append(
            [
                escape(str(row.get("name", "?"))),
                escape(units.quantity(row.get("planned"), unit)),
                escape(units.quantity(row.get("measured"), unit)),
                err_cell,
            ]
        )
    device = plan_vs_run.get("device")
    caption = "<h3>Plan vs measured" + (f" on {escape(str(device))}" if device else "") + "</h3>"
    notes = "".join(f"<p>{escape(str(n))}</p>" for n in plan_vs_run.get("notes", []) if isinstance(n, str))
    advice = [a for a in plan_vs_run.get("advice", []) if isinstance(a, str)]  # the plan's warnings
    if advice:
        notes += "<h4>The plan's advice for this run</h4>" + "".join(
            f'<p class="note">! {escape(a)}</p>' for a in advice
        )
    return caption + _table(["quantity", "planned", "measured", "error"], rows) + notes


def _mixture_table(rows: list[dict], png: bytes | None) -> str:
    cells = [
        [
            escape(r["name"]),
            f"{100 * r['target']:.1f} %",
            f"{100 * r['achieved']:.1f} %",
            f"{100 * (r['achieved'] - r['target']):+.1f} pt",
            units.human(r["tokens"]),
            units.number(r["epochs"]),
            units.number(r["val_loss"]),
        ]
        for r in rows
    ]
    image = f'<img alt="mixture" src="data:image/png;base64,{base64.b64encode(png).decode("ascii")}">' if png else ""
    return (
        "<h3>Mixture: achieved vs target</h3>"
        + _table(["source", "target", "achieved", "difference", "tokens", "epochs", "last val loss"], cells)
        + image
    )


def _events_table(events: list[dict]) -> str:
    rows = [
        [
            escape(str(e.get("event"))),
            str(e["step"]),
            units.human(e["tokens"]),
            units.number(e.get("loss")),
            escape(", ".join(f"{k}={v}" for k, v in e.items() if k not in ("event", "step", "tokens", "loss", "time"))),
        ]
        for e in events
        if e.get("event") != "checkpoint"
    ]  # checkpoints are routine
    if not rows:
        return ""
    return "<h3>Events</h3>" + _table(["event", "step", "tokens", "loss", "details"], rows)
