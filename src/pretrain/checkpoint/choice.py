"""Which checkpoint a reader uses, and which ones a run keeps: a resume's starting point (the corrupt ones
after it are set aside by run_dir.py, never trained over), a rollback's target, the checkpoint export and
generate read, `load_model`'s, and what pruning keeps. Every one goes through format.verify."""

from __future__ import annotations

import warnings
from collections.abc import Callable
from pathlib import Path

from ..errors import UsageError
from .format import CHECKPOINT_NAME, discard, list_checkpoints, read_trainer_state, step_of, verify


def latest_checkpoint(run_dir: str | Path, good_only: bool = False, before_step: int | None = None) -> Path | None:
    """Newest checkpoint that verifies (optionally: written while no loss spike was active)."""
    for path in reversed(list_checkpoints(run_dir)):
        if before_step is not None and step_of(path) > before_step:
            continue
        problem = verify(path)
        if problem:
            warnings.warn(f"checkpoint {path} is corrupt ({problem}); using the one before it", stacklevel=2)
            continue
        if good_only and not read_trainer_state(path).get("good", True):
            continue
        return path
    return None


def resume_point(
    run_dir: str | Path, share: tuple[int, int] = (0, 1), agree: Callable[[str | None], str | None] | None = None
) -> tuple[Path | None, list[tuple[Path, str]]]:
    """(the checkpoint a resume continues from, [(corrupt checkpoint newer than it, why)]), warning nothing.
    (None, []) when the run has no checkpoint at all; UsageError when it has some and none verifies: a
    restart from step 0 would write over them. Ranks that resume together each hash their `share` (rank,
    world) of each checkpoint's files (format.share_of) and `agree` on one verdict: every rank's answer is the
    same."""
    corrupt = []
    for path in reversed(list_checkpoints(run_dir)):
        problem = verify(path, share)
        if agree is not None:
            problem = agree(problem)
        if problem is None:
            return path, corrupt
        corrupt.append((path, problem))
    if corrupt:
        newest, why = corrupt[0]
        raise UsageError(
            f"every checkpoint in {Path(run_dir) / 'checkpoints'} is corrupt ({len(corrupt)}; the "
            f"newest, {newest.name}: {why}); nothing was changed and training did not restart from "
            "step 0: restore a checkpoint from a backup, or start over with another run.dir"
        )
    return None, []


def resolve_checkpoint(path: str | Path) -> Path:
    """A checkpoint directory, or the newest one of a run directory that verifies. The one verification
    path of every reader: a checkpoint named directly is refused if it fails, as one of a run is skipped."""
    path = Path(path)
    if not path.exists():
        raise UsageError(f"{path} does not exist; give a run directory or one of its checkpoints")
    named = (
        CHECKPOINT_NAME.fullmatch(path.name) or (path / "manifest.json").exists() or (path / "trainer.json").exists()
    )
    if named:
        problem = verify(path)
        if problem:
            raise UsageError(
                f"checkpoint {path} fails verification: {problem}; give another checkpoint, or the "
                "run directory (its newest checkpoint that verifies)"
            )
        return path
    found = latest_checkpoint(path)
    if found is None:
        if list_checkpoints(path):
            raise UsageError(
                f"every checkpoint in {path / 'checkpoints'} is corrupt (the warnings above say "
                "why); restore one from a backup"
            )
        raise UsageError(
            f"{path} holds no complete checkpoint; train with run.checkpoint_every or wait for the first checkpoint"
        )
    return found


def _ours(path: Path) -> bool:
    """A checkpoint this code wrote (it has a manifest): the only kind pruning may delete."""
    return (path / "manifest.json").is_file()


def prune(run_dir: str | Path, keep: int) -> None:
    """Keep the newest `keep` checkpoints, and always the newest good one (rollback target)."""
    complete = [p for p in list_checkpoints(run_dir) if _ours(p)]
    keep_set = set(complete[-keep:])
    for path in reversed(complete):
        if read_trainer_state(path).get("good", True):
            keep_set.add(path)
            break
    for path in complete:
        if path not in keep_set:
            discard(path)


def remove_after(run_dir: str | Path, step: int) -> None:
    """Delete the checkpoints newer than `step` (a rollback abandons the steps that wrote them)."""
    for path in list_checkpoints(run_dir):
        if step_of(path) > step and _ours(path):
            discard(path)
