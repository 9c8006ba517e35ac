"""A training run's directory, held by one trainer at a time: its lock, its config.yaml, the partial writes a
crash left in checkpoints/, and what must not be trained over, set aside (never deleted): corrupt checkpoints,
and an earlier run's history in a directory without a checkpoint.

  RUN_DIR/.lock                  rank 0 holds it from before its first write until it exits (lock.py)
  RUN_DIR/config.yaml            the resolved config, written once the run has started or resumed
  checkpoints/step_N.tmp/        a write or a deletion cut short: removed when the next run starts
  checkpoints/step_N.corrupt/    a checkpoint that failed verification at a resume, kept for a person
  previous-<UTC time>/           an earlier run's metrics, events and logs, stopped before its first checkpoint
"""

from __future__ import annotations

import os
import shutil
import time
import warnings
from pathlib import Path
from typing import TYPE_CHECKING

import yaml

from ..errors import UsageError
from ..files import write_atomic
from ..lock import HeldLock, exclusive_lock
from .format import PREFIX, config_yaml, list_checkpoints

if TYPE_CHECKING:
    from ..config.schema import ResolvedConfig

# What a run writes besides its checkpoints: the history of one run.
HISTORY = (
    "metrics.jsonl",
    "events.jsonl",
    "tensorboard",
    "plan_vs_run.json",
    "config.yaml",
    "loggers.json",
    "wandb",
    "mlruns",
)


class RunDir:
    """RUN_DIR as the trainer (rank 0 where it writes) and `pretrain train --resume` handle it."""

    def __init__(self, path: str | Path) -> None:
        self.path = Path(path)
        self.config_path = self.path / "config.yaml"
        self._lock: HeldLock | None = None

    def lock(self) -> None:
        """One trainer per run directory, taken before any write: UsageError naming the holder if another
        process holds it. The kernel releases it when this process ends in any way."""
        self._lock = exclusive_lock(
            self.path / ".lock",
            f"run.dir {self.path}",
            "wait for that run to end or stop it, or choose another run.dir",
        )

    def release(self) -> None:
        if self._lock is not None:
            self._lock.release()

    def check_new_run(self) -> None:
        """A run that must not resume (run.resume=never) refuses a directory with checkpoints of another."""
        if list_checkpoints(self.path):
            raise UsageError(
                f"run.dir {self.path} already holds checkpoints of another run; continue it with "
                f"`pretrain train --resume {self.path}` or choose a new run.dir"
            )

    def remove_partial(self) -> list[Path]:
        """Delete the `.tmp` directories a crash left in checkpoints/ (only rank 0 calls this)."""
        root = self.path / "checkpoints"
        partial = [p for p in root.glob(f"{PREFIX}*.tmp")] if root.is_dir() else []
        for p in partial:
            shutil.rmtree(p, ignore_errors=True)
        return partial

    def set_aside_corrupt(self, corrupt: list[tuple[Path, str]]) -> list[Path]:
        """Rename corrupt checkpoints to `step_N.corrupt/` with a warning each (rank 0, before the run goes on):
        kept for a person to look at, never pruned, never replaced by a new checkpoint of the same step."""
        moved = []
        for path, why in corrupt:
            target = path.with_name(path.name + ".corrupt")
            n = 1
            while target.exists():
                n += 1
                target = path.with_name(f"{path.name}.corrupt-{n}")
            os.rename(path, target)
            warnings.warn(
                f"checkpoint {path} is corrupt ({why}); kept as {target.name}, resuming from the one before it",
                stacklevel=2,
            )
            moved.append(target)
        return moved

    def set_aside_history(self) -> Path | None:
        """A run directory with an earlier run's history but no checkpoint (stopped before its first one): move
        that history into RUN_DIR/previous-<UTC time>/ so that the new run's metrics.jsonl starts empty instead
        of continuing another run's steps. Nothing is deleted. Returns the folder, or None when there was
        nothing (or the directory holds checkpoints: its history is the run's that a resume continues)."""
        if list_checkpoints(self.path):
            return None
        present = [self.path / name for name in HISTORY if (self.path / name).exists()]
        if not any(p.suffix == ".jsonl" for p in present):
            return None  # no history: at most a config.yaml, which the new run writes again
        stamp = time.strftime("%Y%m%dT%H%M%SZ", time.gmtime())
        aside, n = self.path / f"previous-{stamp}", 1
        while aside.exists():
            n += 1
            aside = self.path / f"previous-{stamp}-{n}"
        aside.mkdir()
        for p in present:
            os.rename(p, aside / p.name)
        return aside

    def write_config(self, config: ResolvedConfig) -> None:
        """RUN_DIR/config.yaml, atomically: what `pretrain train --resume` reads back."""
        self.path.mkdir(parents=True, exist_ok=True)
        write_atomic(self.config_path, config_yaml(config))

    def config_problem(self) -> str | None:
        """What keeps a resume from reading RUN_DIR/config.yaml ("is missing", "is not valid YAML ..."), or
        None when it holds a config."""
        if not self.config_path.is_file():
            return "is missing"
        try:
            raw = yaml.safe_load(self.config_path.read_text(encoding="utf-8"))
        except (yaml.YAMLError, UnicodeDecodeError) as e:
            return f"is not valid YAML ({type(e).__name__})"
        if not isinstance(raw, dict) or not raw:
            return "is empty" if not raw else "does not hold a mapping of config sections"
        return None
