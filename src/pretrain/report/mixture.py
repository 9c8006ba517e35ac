"""A mixture run in the report: achieved vs target share and epochs per source, from metrics.jsonl's
source_tokens and the run's config (data.mixture, train.seq_len).

Epochs are windows drawn / windows in the source's train split ((num_tokens.train - 1) // seq_len, from its
meta.json), as the trainer counts them; None where the directory cannot be read from here. A source stopped
by its max_epochs falls below its target from then on, by design (docs/data.md "Mixtures").
"""

from __future__ import annotations

import io
from pathlib import Path

from ..config import mixture_sources
from ..config.job_sections import DataConfig
from ..errors import ConfigError
from ..plan.corpus import MAX_EPOCHS
from ..plan.mixture import read_counts
from .runs import Run


def mixture_rows(run: Run, series) -> list[dict]:
    """[{name, target, achieved, tokens, epochs, val_loss}] at the run's last line, from its mixture_series."""
    tokens, shares, epochs, sources = series
    last_val = run.evals[-1] if run.evals else {}
    return [
        {
            "name": s["name"],
            "target": s["weight"],
            "achieved": shares[s["name"]][-1],
            "tokens": run.train[-1]["source_tokens"].get(s["name"], 0),
            "epochs": epochs[s["name"]][-1] if epochs[s["name"]] else None,
            "val_loss": last_val.get(f"val_loss/{s['name']}"),
        }
        for s in sources
    ]


def mixture_series(run: Run):
    """(tokens, {name: share per line}, {name: epochs per line or []}, sources) over the lines with
    source_tokens; None without them."""
    config = run.config or {}
    entries = (config.get("data") or {}).get("mixture")
    lines = [r for r in run.train if isinstance(r.get("source_tokens"), dict) and r.get("tokens")]
    if not entries or not lines:
        return None
    try:
        sources = mixture_sources(DataConfig(mixture=entries))
    except ConfigError as e:
        run.notes.append(f"config.yaml: data.mixture unreadable ({e}), mixture section skipped")
        return None
    seq_len = (config.get("train") or {}).get("seq_len")
    tokens = [r["tokens"] for r in lines]
    shares, epochs = {}, {}
    for s in sources:
        drawn = [r["source_tokens"].get(s["name"], 0) for r in lines]
        shares[s["name"]] = [d / sum(r["source_tokens"].values()) for d, r in zip(drawn, lines)]
        available = read_counts(Path(s["dir"]), 1)["tokens_available"]
        windows = (available - 1) // seq_len if available and isinstance(seq_len, int) else 0
        epochs[s["name"]] = [d / seq_len / windows for d in drawn] if windows > 0 else []
    return tokens, shares, epochs, sources


def mixture_png(run: Run, series) -> bytes:
    """Two panels of a run's mixture_series: each source's achieved share of the tokens (solid) against its
    target (dashed), and its epochs so far (MAX_EPOCHS marked: Muennighoff et al. 2023)."""
    from matplotlib.figure import Figure

    from .style import TOKENS_AXIS

    tokens, shares, epochs, sources = series
    fig = Figure(figsize=(12.8, 3.6), layout="constrained")
    share_ax, epoch_ax = fig.subplots(1, 2)
    for i, s in enumerate(sources):
        color = f"C{i % 10}"
        share_ax.plot(tokens, [100 * v for v in shares[s["name"]]], color=color, label=s["name"])
        share_ax.axhline(100 * s["weight"], color=color, linestyle="--", linewidth=0.9)
        if epochs[s["name"]]:
            epoch_ax.plot(tokens, epochs[s["name"]], color=color, label=s["name"])
    share_ax.set_title("Mixture: achieved share (solid) vs target (dashed)")
    share_ax.set_ylabel("% of tokens")
    epoch_ax.set_title("Epochs per source")
    epoch_ax.set_ylabel("epochs")
    if any(v > MAX_EPOCHS - 1 for e in epochs.values() for v in e):
        epoch_ax.axhline(MAX_EPOCHS, color="tab:red", linestyle=":", linewidth=0.9, label=f"{MAX_EPOCHS} epochs")
    for ax in (share_ax, epoch_ax):
        ax.set_xlabel("tokens")
        ax.xaxis.set_major_formatter(TOKENS_AXIS)
        ax.grid(alpha=0.3)
        ax.legend(fontsize="small")
    fig.suptitle(f"mixture of {run.name}")
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=100)
    return buf.getvalue()


def mixture_line(row: dict) -> str:
    """One source in the terminal: 'web: target 70.0 %, achieved 70.1 %, 1.23M tokens, 0.41 epochs'."""
    epochs = f", {row['epochs']:.3g} epochs" if row["epochs"] is not None else ""
    return (
        f"{row['name']}: target {100 * row['target']:.1f} %, achieved {100 * row['achieved']:.1f} %, "
        f"{row['tokens']:,} tokens{epochs}"
    )
