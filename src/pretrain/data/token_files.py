"""The token files a run reads, read with pread, each read checked against the file the run started with.

A memory map of a file that another process truncates kills the reader by SIGBUS on the next touch of a lost
page: no message, no checkpoint. So the windows are read with pread (a truncated file gives a short read, an
error the trainer handles), and every read compares the file with its identity when the run opened the
dataset (device, inode, size, modification time): a file deleted, replaced (a new inode, as `prepare`'s
rename makes), truncated or rewritten in place is `DataChanged`, never a window of other data. A check is one
open and two fstat per file and batch: microseconds next to a step.

`Concatenated` reads the memory maps of a sharded dataset's token files as one array, for looking at the data
(`PreparedData.tokens`, `doc_starts`).
"""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np

from ..errors import UsageError


class DataChanged(UsageError):
    """A token file changed under the run; `path` is the file. The trainer stops with a checkpoint on it."""

    def __init__(self, path: Path, what: str):
        super().__init__(f"{path} {what} since the dataset was opened")
        self.path = Path(path)


class TokenFile:
    """One split's token file, as `PreparedData` checked it at open (its identity recorded then)."""

    def __init__(self, path: Path):
        self.path = Path(path)
        self.identity = _identity(os.stat(self.path))
        self.size = self.identity[2]

    def read(self, pieces: list[tuple[np.ndarray, int]]) -> None:
        """Fill each (out: a contiguous 1-D array, first: a token index) with the tokens from `first` on."""
        try:
            fd = os.open(self.path, os.O_RDONLY)
        except OSError as e:
            raise DataChanged(
                self.path, "was deleted" if isinstance(e, FileNotFoundError) else f"became unreadable ({e.strerror})"
            ) from None
        try:
            self._compare(os.fstat(fd))
            for out, first in pieces:
                data = os.pread(fd, out.nbytes, first * out.itemsize)
                if len(data) != out.nbytes:
                    self._compare(os.fstat(fd))  # names how it changed
                    raise DataChanged(self.path, "was truncated")
                out[:] = np.frombuffer(data, dtype=out.dtype)
            self._compare(os.fstat(fd))  # a write during the reads changes the modification time
        finally:
            os.close(fd)

    def check(self) -> None:
        """DataChanged unless the path still holds the file the run opened (one stat)."""
        try:
            st = os.stat(self.path)
        except FileNotFoundError:
            raise DataChanged(self.path, "was deleted") from None
        self._compare(st)

    def _compare(self, st: os.stat_result) -> None:
        device, inode, size, mtime = _identity(st)
        if (device, inode) != self.identity[:2]:
            raise DataChanged(self.path, "was replaced by another file")
        if size != self.size:
            raise DataChanged(
                self.path,
                f"was {'truncated' if size < self.size else 'extended'} to {size:,} bytes (it held {self.size:,})",
            )
        if mtime != self.identity[3]:
            raise DataChanged(self.path, "was rewritten (its modification time changed)")


class Concatenated:
    """1-D arrays (the shards' memory maps) read as one, end to end, without a copy: the indexing the loaders
    use (integers, slices, integer arrays of any shape) gathers each element from the part holding it.

    add: a value per part added to what it reads (document starts: the part's first token in the whole).
    """

    ndim = 1

    def __init__(self, parts: list[np.ndarray], add: np.ndarray | None = None):
        keep = [i for i, part in enumerate(parts) if len(part)]  # an empty shard holds no position
        self.parts = [parts[i] for i in keep]
        self.add = None if add is None else np.asarray(add, dtype=np.int64)[keep]
        self.dtype = np.dtype(np.int64) if add is not None else parts[0].dtype
        self.starts = np.cumsum([0] + [len(p) for p in self.parts], dtype=np.int64)  # part k: [starts[k], starts[k+1])
        self.shape = (int(self.starts[-1]),)
        self.size = self.shape[0]

    def __len__(self) -> int:
        return self.size

    def __getitem__(self, index):
        if isinstance(index, slice):
            return self[np.arange(*index.indices(self.size))]
        if isinstance(index, (int, np.integer)):
            return self[np.array([index])][0]
        positions = np.asarray(index)
        if positions.dtype.kind not in "iu":
            raise IndexError(f"only integers, slices and integer arrays index a Concatenated, not {positions.dtype}")
        flat = positions.astype(np.int64).ravel()
        flat = np.where(flat < 0, flat + self.size, flat)
        if flat.size and (flat.min() < 0 or flat.max() >= self.size):
            raise IndexError(f"index out of range for {self.size:,} elements")
        which = np.searchsorted(self.starts, flat, side="right") - 1
        out = np.empty(flat.shape, dtype=self.dtype)
        for k in np.unique(which):
            here = which == k
            out[here] = self.parts[k][flat[here] - self.starts[k]]
            if self.add is not None:
                out[here] += self.add[k]
        return out.reshape(positions.shape)

    def __array__(self, dtype=None, copy=None) -> np.ndarray:
        """The whole as one array in memory (np.asarray): a copy, for small data and tests."""
        return self[:].astype(dtype or self.dtype, copy=False)


def _identity(st: os.stat_result) -> tuple[int, int, int, int]:
    return st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns
