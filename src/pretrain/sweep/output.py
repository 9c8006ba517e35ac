"""What a sweep writes: sweep.csv, sweep.json and sweep.png in the output directory, and the terminal table.

The plot puts the swept key with the most numeric values on the x axis (a categorical axis when no key is
numeric), one colour per combination of the other swept keys; measured figures are points, the planner's
lines. Built on `matplotlib.figure.Figure` (no pyplot, no display), like the report's plots.
"""

from __future__ import annotations

import csv
import io
import json
import math
from pathlib import Path

from .. import units
from ..bench.timing import NOISY_SPREAD_PCT
from ..errors import UsageError
from ..files import write_atomic

FILES = {"csv": "sweep.csv", "json": "sweep.json", "png": "sweep.png"}
CSV_COLUMNS = (
    "status",
    "plan_verdict",
    "it_per_s",
    "tokens_per_s",
    "achieved_tflops",
    "mfu",
    "memory_measured_bytes",
    "memory_planned_bytes",
    "memory_error_pct",
    "planned_tokens_per_s",
    "tokens_per_step",
    "step_seconds",
    "peak_tflops",
    "loss",
    "seconds",
    "error",
    "rounds",
    "tokens_per_s_min",
    "tokens_per_s_max",
    "spread_pct",
    "threads",
)


# --- files -------------------------------------------------------------------------------------------------------


def write_tables(result: dict, out: Path) -> dict:
    """sweep.json and sweep.csv (after every cell, so an interrupted sweep keeps what it measured)."""
    files = {"csv": str(out / FILES["csv"]), "json": str(out / FILES["json"])}
    result = {**result, "files": {**result.get("files", {}), **files}}
    _write(out, FILES["csv"], to_csv(result).encode())
    _write(out, FILES["json"], to_json(result).encode())
    return result["files"]


def write_all(result: dict, out: Path) -> dict:
    """The tables and the plot; returns the paths written."""
    files = {**result.get("files", {}), "png": str(out / FILES["png"])}
    _write(out, FILES["png"], plot_png(result))
    return write_tables({**result, "files": files}, out)


def make_dir(out: Path) -> None:
    try:
        out.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        raise _cannot_write(out, "it", e) from None


def _cannot_write(out: Path, what: str, e: OSError) -> UsageError:
    return UsageError(f"--out {out}: cannot write {what} ({e.strerror or e}); give a writable directory")


def _write(out: Path, name: str, data: bytes) -> None:
    """Temp file in the same directory, then rename: a reader never sees half a file."""
    try:
        out.mkdir(parents=True, exist_ok=True)
        write_atomic(out / name, data)
    except OSError as e:
        raise _cannot_write(out, name, e) from None


def to_json(result: dict) -> str:
    return json.dumps(_json_safe(result), indent=1) + "\n"


def _json_safe(x):
    """NaN and infinity are not JSON: a diverged loss becomes its string, as the trainer's events write it."""
    if isinstance(x, float) and not math.isfinite(x):
        return str(x)
    if isinstance(x, dict):
        return {k: _json_safe(v) for k, v in x.items()}
    if isinstance(x, list):
        return [_json_safe(v) for v in x]
    return x


def to_csv(result: dict) -> str:
    keys = list(result["swept"])
    buf = io.StringIO()
    writer = csv.writer(buf, lineterminator="\n")
    writer.writerow(["cell", *keys, *CSV_COLUMNS])
    for cell in result["cells"]:
        writer.writerow(
            [
                cell["cell"],
                *(cell["values"][k] for k in keys),
                *("" if cell[c] is None else cell[c] for c in CSV_COLUMNS),
            ]
        )
    return buf.getvalue()


def noise_warnings(records: list[dict]) -> list[str]:
    """One line per cell whose rounds' tokens/s differ by more than NOISY_SPREAD_PCT: its figure is noise."""
    return [
        f"warning: cell {' '.join(f'{k}={v}' for k, v in r['values'].items()) or '(base config)'}: tokens/s "
        f"spread {r['spread_pct']:.0f}% over {r['rounds']} rounds ({units.human(r['tokens_per_s_min'])} to "
        f"{units.human(r['tokens_per_s_max'])}), above {NOISY_SPREAD_PCT:.0f}%: the machine is busy; compare "
        "cells on a quiet one, or with more --rounds"
        for r in records
        if r["noisy"]
    ]


# --- terminal ----------------------------------------------------------------------------------------------------


def column_names(keys: list[str]) -> dict[str, str]:
    """train.seq_len -> seq_len, unless two swept keys share the last part."""
    short = [k.split(".")[-1] for k in keys]
    return {k: (s if short.count(s) == 1 else k) for k, s in zip(keys, short)}


def table(result: dict):
    from rich.table import Table

    keys = list(result["swept"])
    names = column_names(keys)
    peaks = "; ".join(f"{prec} {p['tflops']:.4g} TFLOP/s ({p['source']})" for prec, p in result["peak_tflops"].items())
    threads = f", {result['threads']} CPU thread{'s' if result['threads'] != 1 else ''}" if result["threads"] else ""
    t = Table(
        title=f"pretrain sweep on {result['device']}: {result['warmup_steps']} warm-up + {result['steps']} "
        f"timed steps per cell, median of {result['rounds']} interleaved rounds{threads}",
        caption=f"MFU against peak {peaks}\nmemory: {result['memory_measured_as']}\nspread: (max - min) / "
        f"median tokens/s of the rounds, ! above {NOISY_SPREAD_PCT:.0f}%",
        caption_justify="left",
    )
    with_status = any(cell["status"] != "ok" for cell in result["cells"])  # OOM, skipped: a column of its own
    for k in keys:
        t.add_column(names[k])
    if with_status:
        t.add_column("status")
    for name in ("it/s", "tokens/s", "spread", "TFLOP/s", "MFU", "memory", "planned", "error"):
        t.add_column(name, justify="right")
    t.add_column("plan")
    for cell in result["cells"]:
        first = [str(cell["values"][k]) for k in keys] + ([cell["status"]] if with_status else [])
        planned = units.nbytes(cell["memory_planned_bytes"])
        if cell["status"] != "ok":
            t.add_row(
                *first,
                "",
                "",
                "",
                "",
                "",
                "",
                planned,
                "",
                cell["plan_verdict"],
                style="red" if cell["status"] == "OOM" else "dim",
            )
            continue
        err = cell["memory_error_pct"]
        noise = f"{cell['spread_pct']:.0f}%" + (" !" if cell["noisy"] else "") if cell["rounds"] > 1 else "-"
        t.add_row(
            *first,
            f"{cell['it_per_s']:.3g}",
            units.human(cell["tokens_per_s"]),
            noise,
            f"{cell['achieved_tflops']:.3g}",
            "-" if cell["mfu"] is None else f"{100 * cell['mfu']:.1f}%",
            units.nbytes(cell["memory_measured_bytes"]),
            planned,
            "-" if err is None else f"{err:+.1f}%",
            cell["plan_verdict"],
        )
    return t


# --- plot --------------------------------------------------------------------------------------------------------


def x_key(result: dict) -> str | None:
    """The swept key on the x axis: the numeric one with the most values, else the first one."""
    swept = result["swept"]
    numeric = [k for k, vs in swept.items() if all(_is_number(v) for v in vs)]
    pool = numeric or list(swept)
    return max(pool, key=lambda k: len(swept[k])) if pool else None  # max keeps the first of equals


def _is_number(v) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool)


def _interleaved(index: int, count: int):
    """The planned line of group `index` of `count`: solid alone; else dashes that leave gaps for the other
    groups' dashes, so lines the plan draws on top of each other (a swept key that changes no planned figure,
    e.g. train.compile) show every colour in turn instead of the last one drawn."""
    if count == 1:
        return "-"
    dash = 4
    return (index * dash, (dash, dash * (count - 1)))


def plot_png(result: dict) -> bytes:
    from matplotlib.figure import Figure

    cells, swept = result["cells"], result["swept"]
    xk = x_key(result)
    others = [k for k in swept if k != xk]
    xs: list = swept[xk] if xk else ["base config"]  # the swept values: numbers, strings or booleans
    numeric = xk is not None and all(_is_number(v) for v in xs)
    position = (lambda v: v) if numeric else (lambda v: xs.index(v))
    groups: dict[tuple, list] = {}
    for cell in cells:
        groups.setdefault(tuple(cell["values"][k] for k in others), []).append(cell)

    top = max(c[k] or 0 for c in cells for k in ("memory_measured_bytes", "memory_planned_bytes"))
    mem_scale, mem_unit = (units.GiB, "GiB") if top >= units.GiB else (units.MiB, "MiB")
    fig = Figure(figsize=(12.8, 5.6), layout="constrained")
    ax_tps, ax_mem = fig.subplots(1, 2)
    names = column_names(list(swept))
    handles = _plot_groups(ax_tps, ax_mem, groups, others, names, xk, position, mem_scale)
    for ax, title, ylabel in ((ax_tps, "Throughput", "tokens/s"), (ax_mem, "Memory", mem_unit)):
        ax.set_title(title)
        ax.set_xlabel(xk or "")
        ax.set_ylabel(ylabel)
        ax.grid(True, alpha=0.3)
        if numeric and min(xs) > 0 and max(xs) / min(xs) >= 8:
            ax.set_xscale("log", base=2)
        ax.set_xticks([position(v) for v in xs], [str(v) for v in xs])
        ax.minorticks_off()
    _throughput_scale(ax_tps, cells)
    ax_mem.set_ylim(bottom=0)
    style = _style_legend(cells)
    fig.legend(
        handles=handles + style,
        loc="outside lower center",
        ncols=min(3, len(handles) + len(style)),
        fontsize="small",
        frameon=False,
    )
    fig.suptitle(
        f"pretrain sweep on {result['device']}, memory as "
        f"{'peak allocated' if result['device_type'] == 'cuda' else 'tensor count'}"
    )
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=100)
    return buf.getvalue()


def _plot_groups(ax_tps, ax_mem, groups: dict, others: list, names: dict, xk, position, mem_scale: float) -> list:
    """One colour per combination of the other swept keys: the planner's line, the measured points and the
    OOMs (at their planned memory); returns the legend's handle of each."""
    from matplotlib.lines import Line2D

    colours = [f"C{i % 10}" for i in range(len(groups))]
    handles = []
    for index, (colour, (group, members)) in enumerate(zip(colours, groups.items())):
        members = sorted(members, key=lambda c: position(c["values"][xk]) if xk else 0)
        x = [position(c["values"][xk]) if xk else 0 for c in members]
        label = ", ".join(f"{names[k]}={v}" for k, v in zip(others, group)) or "measured"
        handles.append(Line2D([], [], color=colour, marker="o", label=label))
        for ax, measured, planned, scale in (
            (ax_tps, "tokens_per_s", "planned_tokens_per_s", 1.0),
            (ax_mem, "memory_measured_bytes", "memory_planned_bytes", mem_scale),
        ):
            line = [(xi, c[planned] / scale) for xi, c in zip(x, members) if c[planned] is not None]
            if line:
                ax.plot(*zip(*line), color=colour, linestyle=_interleaved(index, len(groups)), linewidth=1.4)
            points = [(xi, c[measured] / scale) for xi, c in zip(x, members) if c[measured] is not None]
            if points:
                ax.plot(*zip(*points), color=colour, linestyle="none", marker="o", markersize=6)
        ooms = [(xi, c["memory_planned_bytes"] / mem_scale) for xi, c in zip(x, members) if c["status"] == "OOM"]
        if ooms:
            ax_mem.plot(*zip(*ooms), color=colour, linestyle="none", marker="X", markersize=10)
    return handles


def _throughput_scale(ax_tps, cells: list[dict]) -> None:
    from matplotlib.ticker import FuncFormatter, LogLocator, NullFormatter

    rates = [c[k] for c in cells for k in ("tokens_per_s", "planned_tokens_per_s") if c[k]]
    if rates and max(rates) / min(rates) > 10:  # seq_len x batch sweeps span decades of tokens/s
        ax_tps.set_yscale("log")
        ax_tps.yaxis.set_major_locator(LogLocator(base=10, subs=(1, 2, 5)))
        ax_tps.yaxis.set_minor_formatter(NullFormatter())
    else:
        ax_tps.set_ylim(bottom=0)
    ax_tps.yaxis.set_major_formatter(FuncFormatter(lambda v, _: units.human(v, digits=4)))


def _style_legend(cells: list[dict]) -> list:
    """The legend's entries for the marks: measured points, planned lines (at the MFU given, if any), OOMs."""
    from matplotlib.lines import Line2D

    given = sorted(
        {
            f"{c['planned_basis'].split(' ')[0]} {c['planned_mfu']:g}"
            for c in cells
            if c["planned_basis"] and c["planned_basis"].startswith("hardware.")
        }
    )  # mfu / hfu overrides
    return [
        Line2D([], [], color="0.3", marker="o", linestyle="none", label="measured"),
        Line2D(
            [],
            [],
            color="0.3",
            linestyle="-",
            label=f"planned (tokens/s at {', '.join(given)})"
            if given
            else "planned (tokens/s of the plan's step-time model)",
        ),
        Line2D([], [], color="0.3", marker="X", linestyle="none", label="OOM (at planned memory)"),
    ]
