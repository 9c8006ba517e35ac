"""Real file-system faults for tests: a small tmpfs (a real ENOSPC, not an injected one), a read-only mount,
an immutable directory (`chattr +i`). Each needs root and a kernel that allows it; a test that cannot have
one is skipped, never passed."""

from __future__ import annotations

import subprocess
from contextlib import contextmanager
from pathlib import Path

import pytest


def _run(*command) -> subprocess.CompletedProcess:
    try:
        return subprocess.run([str(c) for c in command], capture_output=True, text=True)
    except FileNotFoundError as e:  # no mount / chattr on this machine
        return subprocess.CompletedProcess(command, 127, "", str(e))


@contextmanager
def _applied(command: tuple, undo: tuple, unavailable: str):
    """Run `command`, yield, then `undo`; skip the test (never pass it) when the command fails here."""
    r = _run(*command)
    if r.returncode:
        pytest.skip(f"{unavailable} ({r.stderr.strip()})")
    try:
        yield
    finally:
        _run(*undo)


@contextmanager
def small_fs(path: Path, size: str = "1m"):
    """A tmpfs of `size` mounted at `path` (created): writing more than it holds is a real ENOSPC."""
    path.mkdir(parents=True, exist_ok=True)
    with _applied(
        ("mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", path),
        ("umount", "-l", path),
        "cannot mount a tmpfs here",
    ):
        yield path


def read_only(mount: Path) -> None:
    """Remount a small_fs read-only (what it holds stays readable)."""
    r = _run("mount", "-o", "remount,ro", mount)
    if r.returncode:
        pytest.skip(f"cannot remount {mount} read-only ({r.stderr.strip()})")


@contextmanager
def immutable(path: Path):
    """`chattr +i path` for the duration: nothing inside can be created, renamed or deleted, even by root."""
    with _applied(("chattr", "+i", path), ("chattr", "-i", path), "chattr +i is not available here"):
        yield path
