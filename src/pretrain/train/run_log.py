"""Where a run reports: metrics.jsonl and events.jsonl (one JSON object per line), the loggers of run.loggers
(TensorBoard, W&B, MLflow: loggers.py), and the terminal (a rich progress bar, or plain lines when the output
is not a terminal). Rank 0 only."""

from __future__ import annotations

import json
import math
import time
from collections.abc import Sequence
from pathlib import Path

from ..progress import terminal_bar
from .loggers import open_sinks


class TrainingLog:
    def __init__(
        self,
        run_dir: Path,
        total_steps: int,
        progress: bool,
        enabled: bool = True,
        loggers: Sequence[str] = ("tensorboard",),
        config: dict | None = None,
    ):
        self.enabled = enabled
        self.run_dir = Path(run_dir)
        self.started = time.time()
        self._sinks = []
        self._bar = None
        if not enabled:
            return
        self.run_dir.mkdir(parents=True, exist_ok=True)
        self._metrics = open(self.run_dir / "metrics.jsonl", "a")
        self._events = open(self.run_dir / "events.jsonl", "a")
        self._sinks = open_sinks(loggers, self.run_dir, config or {})
        from rich.progress import BarColumn, MofNCompleteColumn, TextColumn, TimeRemainingColumn

        self._bar = terminal_bar(
            TextColumn("train"),
            BarColumn(),
            MofNCompleteColumn(),
            TextColumn("{task.fields[status]}"),
            TimeRemainingColumn(),
            enabled=progress,
        )
        if self._bar is not None:
            self._task = self._bar.add_task("train", total=total_steps, completed=0, status="")
            self._bar.start()

    def start_at(self, step: int) -> None:
        """A resumed run's bar starts where the checkpoint left off, not at 0."""
        if self._bar is not None:
            self._bar.update(self._task, completed=step)

    def now(self) -> float:
        return time.time() - self.started

    def metrics(self, record: dict) -> None:
        if not self.enabled:
            return
        record = self._append(self._metrics, record)
        scalars = {
            key: value
            for key, value in _scalars(record).items()
            if key not in ("step", "time") and isinstance(value, (int, float)) and math.isfinite(value)
        }
        for sink in self._sinks:
            sink.scalars(scalars, record["step"])
        if "loss" in record:
            status = f"loss {record['loss']:.4f}  {record['tokens_per_s']:,.0f} tok/s"
            if self._bar is not None:
                self._bar.update(self._task, completed=record["step"], status=status)
            else:
                print(
                    f"step {record['step']:>7}  tokens {record['tokens']:>12,}  {status}  lr {record['lr']:.3g}  "
                    f"grad norm {record['grad_norm']:.3g}",
                    flush=True,
                )
        elif "fp8_rel_err" in record:  # debug.fp8_check (callbacks/fp8_check.py)
            self.say(
                f"step {record['step']}: fp8 against its bf16 shadow: relative error at most "
                f"{record['fp8_rel_err_max']:.3g} ({record['fp8_rel_err_worst']})"
            )
        elif "val_loss" in record:
            self.say(
                f"step {record['step']}: validation loss {record['val_loss']:.4f} (perplexity {record['val_ppl']:.2f})"
            )
        else:  # downstream tasks (callbacks/tasks.py)
            tasks = sorted({key.split("/")[1] for key in record if key.startswith("eval/")})
            self.say(
                f"step {record['step']}: "
                + ", ".join(
                    f"{t} acc_norm {record[f'eval/{t}/acc_norm']:.3f} (chance {record[f'eval/{t}/chance']:.3f})"
                    for t in tasks
                )
            )

    def event(self, record: dict) -> None:
        if not self.enabled:
            return
        self._append(self._events, record)

    def _append(self, stream, record: dict) -> dict:
        """One JSON line with the seconds since the run started, flushed: a crash loses no line."""
        record = {"time": round(self.now(), 3), **record}
        stream.write(json.dumps(record) + "\n")
        stream.flush()
        return record

    def say(self, text: str) -> None:
        if not self.enabled:
            return
        if self._bar is not None:
            self._bar.console.print(text)
        else:
            print(text, flush=True)

    def close(self) -> None:
        if not self.enabled or self._metrics.closed:
            return
        if self._bar is not None:
            self._bar.stop()
        for sink in self._sinks:
            sink.close()
        self._metrics.close()
        self._events.close()


def _scalars(record: dict) -> dict:
    """A record's values, a mapping such as source_tokens {name: n} spread into source_tokens/<name>."""
    flat = {}
    for key, value in record.items():
        flat.update({f"{key}/{k}": v for k, v in value.items()} if isinstance(value, dict) else {key: value})
    return flat


def json_float(x: float) -> float | str:
    """JSON has no NaN or infinity: those are written as strings."""
    return x if x == x and abs(x) != float("inf") else str(x)
