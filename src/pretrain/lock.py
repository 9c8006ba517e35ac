"""One writer at a time: an exclusive lock that the operating system releases when its process ends.

`flock(2)` on a lock file: the trainer's RUN_DIR/.lock (rank 0 of a job takes it before it writes anything
and holds it until it exits), and `pretrain prepare --tasks`' lock beside --out and one per task. The kernel
drops the lock when the process ends in any way (a crash or SIGKILL included), so a lock is never stale and
nothing needs cleaning up by hand: the file staying behind means nothing. It holds the holder's PID and
host, only so that a refused second start can say who holds it. On NFS, Linux emulates flock with
byte-range locks that the server sees (nfs(5), "Using file locks with NFS"), so two nodes exclude each other.
"""

from __future__ import annotations

import fcntl
import os
import socket
import time
from contextlib import suppress
from pathlib import Path

from .errors import UsageError


class HeldLock:
    """A held lock; `release()` (or the process ending) gives it up."""

    def __init__(self, path: Path, fd: int):
        self.path, self._fd = path, fd

    def release(self, _close=os.close) -> None:  # _close: still bound when __del__ runs at interpreter exit
        fd, self._fd = self._fd, None
        if fd is not None:
            _close(fd)  # closing the only descriptor of the open file releases the flock

    def __del__(self):
        self.release()


def exclusive_lock(path: Path, what: str, fix: str) -> HeldLock:
    """Lock `path` (its folder created if needed) for this process, or raise UsageError: "`what` is in use by
    PID on HOST (lock `path`); `fix`". Two processes starting at the same instant: the kernel lets exactly
    one through."""
    path = Path(path)
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        # O_CLOEXEC: a program this process starts must not inherit (and keep alive) the lock.
        fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o644)
    except OSError as e:
        raise UsageError(
            f"{what}: cannot create its lock file {path} ({e.strerror}); choose a directory you can write"
        ) from None
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        holder = _holder(fd)
        os.close(fd)
        raise UsageError(f"{what} is in use by {holder} (lock {path}); {fix}") from None
    # Who holds it, only for a refused second start to name: a full disk leaves it unsaid, not the lock untaken
    # (the holder then meets the full disk where it writes what it is for, in one line).
    with suppress(OSError):
        os.ftruncate(fd, 0)
        os.pwrite(fd, f"{os.getpid()} {socket.gethostname()}\n".encode(), 0)
    return HeldLock(path, fd)


def _holder(fd: int) -> str:
    """ "PID 123 on HOST" from the lock file; the holder writes it just after taking the lock, so wait a
    moment for a lock taken an instant ago."""
    for _ in range(20):
        fields = os.pread(fd, 4096, 0).decode(errors="replace").split()
        if len(fields) == 2:
            return f"PID {fields[0]} on {fields[1]}"
        time.sleep(0.05)
    return "another process"
