"""Read a run directory written by `pretrain train`, also while the run is still writing it.

The trainer appends to `metrics.jsonl` and `events.jsonl` as it goes, so the last line may be half-written,
and a line torn by a crash gets glued to the first line written after the resume: every line that is not a
JSON object with a step is skipped. A resume or a rollback rewrites history from an earlier step; the later
line for a step replaces the earlier one. Pure Python (no numpy): `pretrain --help` imports this package.
"""

from __future__ import annotations

import json
import math
import statistics
from dataclasses import dataclass, field
from pathlib import Path

from .. import units
from ..errors import UsageError

# Events drawn on the plots; checkpoints are routine and would only add clutter.
MARKED_EVENTS = ("rollback", "spike", "nonfinite_skip", "resumed")


@dataclass
class Run:
    path: Path
    name: str
    train: list[dict]  # one line per logged step (the latest line for each step), by step
    evals: list[dict]  # one line per validation pass, by step
    lines: list[dict] = field(default_factory=list)  # every line of the current history (other series too)
    tasks: list[dict] = field(default_factory=list)  # one line per downstream-task evaluation (eval/<task>/...)
    events: list[dict] = field(default_factory=list)
    plan_vs_run: dict | None = None
    config: dict | None = None
    notes: list[str] = field(default_factory=list)  # optional files that could not be read

    def source_keys(self) -> list[str]:
        """val_loss/<source> keys of a data.mixture run's validation lines, in name order."""
        return sorted({k for r in self.evals for k in r if k.startswith("val_loss/")})

    def task_names(self) -> list[str]:
        """The downstream tasks of run.eval_tasks evaluated in the loop, in name order."""
        return sorted({k.split("/")[1] for r in self.tasks for k in r if k.startswith("eval/")})

    def series(self, key: str) -> tuple[list[float], list[float]]:
        """(tokens, values) of a metric, finite values only: a null mfu on a CPU gives empty lists. A key
        belongs to one kind of line (loss to training lines, val_loss to evaluations, eval/* to its own)."""
        rows = self._rows(key)
        return [r["tokens"] for r in rows], [r[key] for r in rows]

    def layer_series(self, key: str) -> list[tuple[int, list[float], list[float]]]:
        """(block, tokens, values) of each layer of a per-layer metric (a list per line, one number per MoE
        layer: moe/load_max_over_mean_per_layer), the blocks numbered as the model's: the MoE layers follow
        model.first_dense_layers dense ones."""
        rows = [r for r in self.lines if isinstance(r.get(key), list) and all(_is_number(v) for v in r[key])]
        first = ((self.config or {}).get("model") or {}).get("first_dense_layers") or 0
        layers = max((len(r[key]) for r in rows), default=0)
        return [
            (first + i, [r["tokens"] for r in rows if len(r[key]) > i], [r[key][i] for r in rows if len(r[key]) > i])
            for i in range(layers)
        ]

    def steps(self, key: str) -> list[int]:
        """The steps of `series(key)`'s points."""
        return [r["step"] for r in self._rows(key)]

    def _rows(self, key: str) -> list[dict]:
        return [r for r in self.lines if _is_number(r.get(key))]


def read_run(path: str | Path, name: str | None = None) -> Run:
    path = Path(path)
    if not path.is_dir():
        raise UsageError(f"{path}: no such run directory; pass the run.dir of a `pretrain train` run")
    metrics = path / "metrics.jsonl"
    if not metrics.is_file():
        raise UsageError(
            f"{metrics}: not found; is {path} a run directory? `pretrain train` writes it after its first logged step"
        )
    lines = current_history(read_jsonl(metrics))
    run = Run(
        path=path,
        name=name or path.resolve().name,
        train=[r for r in lines if _kind(r) == "train"],
        evals=[r for r in lines if _kind(r) == "val"],
        tasks=[r for r in lines if _kind(r) == "tasks"],
        lines=lines,
    )
    if (path / "events.jsonl").is_file():
        run.events = read_jsonl(path / "events.jsonl")
    run.plan_vs_run = _read_optional(path / "plan_vs_run.json", json.loads, run.notes)
    if run.plan_vs_run is not None and not isinstance(run.plan_vs_run.get("rows"), list):
        run.notes.append("plan_vs_run.json: no `rows` list, table skipped")
        run.plan_vs_run = None
    run.config = _read_optional(path / "config.yaml", _yaml_load, run.notes)
    return run


def read_jsonl(path: Path) -> list[dict]:
    rows = []
    for line in path.read_text(encoding="utf-8", errors="replace").splitlines():
        try:
            row = json.loads(line)
        except ValueError:
            continue  # half-written or torn line
        if isinstance(row, dict) and isinstance(row.get("step"), int) and _is_number(row.get("tokens")):
            rows.append(row)
    return rows


def current_history(rows: list[dict]) -> list[dict]:
    """The lines of the trajectory the run is on now, in step order. A training line for step s abandons
    every line logged for step s or later (a rollback, or a resume from an older checkpoint, trains them
    again); an evaluation line replaces earlier evaluations of its kind (validation loss, downstream tasks) at
    its step or later, and keeps the other lines it trims."""
    kept: list[dict] = []  # in step order: every backward step trims the tail
    for row in rows:
        tail = []
        while kept and kept[-1]["step"] >= row["step"]:
            tail.append(kept.pop())
        if _kind(row) != "train":
            kept += [r for r in reversed(tail) if _kind(r) != _kind(row)]
        kept.append(row)
    return kept


def _kind(row: dict) -> str:
    return "train" if "loss" in row else "val" if "val_loss" in row else "tasks"


def _read_optional(path: Path, parse, notes: list[str]) -> dict | None:
    if not path.is_file():
        return None
    try:
        value = parse(path.read_text(encoding="utf-8"))
    except (ValueError, OSError) as e:  # a file being replaced, or a bad edit by hand
        notes.append(f"{path.name}: unreadable ({e.__class__.__name__}), skipped")
        return None
    if not isinstance(value, dict):
        notes.append(f"{path.name}: not a mapping, skipped")
        return None
    return value


def _yaml_load(text: str):
    import yaml  # only when a run has a config

    try:
        return yaml.safe_load(text)
    except yaml.YAMLError as e:
        raise ValueError(str(e)) from e  # one exception type for _read_optional


def _is_number(v) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v)


# --- summary -------------------------------------------------------------------------------------------


def summarize(run: Run) -> dict:
    """The numbers a reader checks first; None where the run has not written them yet."""
    last = run.train[-1] if run.train else {}
    val = [r for r in run.evals if _is_number(r.get("val_loss"))]
    best = min(val, key=lambda r: r["val_loss"]) if val else {}
    speeds = run.series("tokens_per_s")[1]
    counts: dict[str, int] = {}
    for e in run.events:
        if e.get("event") in MARKED_EVENTS:
            counts[e["event"]] = counts.get(e["event"], 0) + 1
    return {
        "name": run.name,
        "dir": str(run.path),
        "last_step": last.get("step"),
        "tokens": last.get("tokens"),
        "last_loss": last.get("loss"),
        "best_val_loss": best.get("val_loss"),
        "best_val_step": best.get("step"),
        "tokens_per_s_median": statistics.median(speeds) if speeds else None,
        "events": counts,
        "model": model_line(run.config),
        "notes": list(run.notes),
    }


def summary_line(s: dict) -> str:
    if s["last_step"] is None:
        return f"{s['name']}: no training steps logged yet"
    parts = [
        f"step {s['last_step']}",
        f"{units.human(s['tokens'])} tokens",
        f"train loss {units.number(s['last_loss'])}",
    ]
    if s["best_val_loss"] is not None:
        parts.append(f"best val loss {units.number(s['best_val_loss'])} (step {s['best_val_step']})")
    if s["tokens_per_s_median"] is not None:
        parts.append(f"{units.human(s['tokens_per_s_median'])} tokens/s median")
    parts += [f"{n}x {kind}" for kind, n in s["events"].items()]
    return f"{s['name']}: " + ", ".join(parts)


def model_line(config: dict | None) -> str | None:
    """'gpt2: hidden 768, 12 layers, ...' from the resolved config, or None without one."""
    model = (config or {}).get("model")
    if not isinstance(model, dict):
        return None
    sizes = [
        f"{label} {model[key]}"
        for key, label in (
            ("hidden_size", "hidden"),
            ("num_layers", "layers"),
            ("num_heads", "heads"),
            ("vocab_size", "vocab"),
            ("max_seq_len", "context"),
        )
        if model.get(key) is not None
    ]
    return f"{model.get('preset') or 'custom'}: " + ", ".join(sizes)


def title_line(run: Run) -> str:
    """The run's name with what it trained: 'run: llama 3.43M (4 x 256), seq 256, 4.1K tokens/step, lr 0.002
    cosine, fp32'; the name alone without a readable config.yaml."""
    try:
        from ..config import from_dict
        from ..plan.params import count_params

        c = from_dict(run.config or {})
    except Exception:  # noqa: BLE001 - any unreadable config: the title falls back to the name
        return run.name
    m, t = c.model, c.train
    per_step = t.micro_batch_size * t.seq_len * t.grad_accum_steps * max(1, c.parallel.data_parallel)
    what = f"{m.preset or m.family} {units.human(count_params(m).total)} ({m.num_layers} x {m.hidden_size})"
    return (
        f"{run.name}: {what}, seq {t.seq_len}, {units.human(per_step)} tokens/step, lr {t.lr:g} {t.schedule}, "
        f"{t.precision}"
    )
