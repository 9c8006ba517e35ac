"""The windows that training and evaluation read of a prepared directory (loader.py's PreparedData): which
tokens a window covers, the order training visits them in, and each rank's share.

A window k of a split covers tokens [k*seq_len, k*seq_len + seq_len + 1): inputs are its first seq_len
tokens, targets the last seq_len (inputs shifted by one), so consecutive windows share one token and a
split of N tokens has (N - 1) // seq_len windows. Windows cross document boundaries; the <eos> between
documents tells the model where one ends (GPT-2 / nanoGPT packing).

Training order (RandomWindows): epoch e visits every window once, in the order of a keyed permutation of
(seed, e). The permutation is a Feistel network, computed per position, never stored: O(1) memory for any
number of windows. Global position p of an epoch goes to rank p % world_size, so rank r reads positions r,
r + W, r + 2W, ... (W = world_size): ranks never overlap. The last (num_windows % W) positions of each
epoch are dropped so ranks stay in step. So in the first epoch the windows of global batch b (b x W x B to
(b+1) x W x B) are exactly those a single process reading batches of W x B would see as its batch b (in
another order within the batch); after it, only when W divides num_windows (a single process drops
nothing, so its epochs are longer). The whole reading state is a few integers (epoch, position), so a
resumed run continues with exactly the batches it would have seen (at another seq_len, a new stage of context
extension, from the same share of the epoch: RandomWindows._new_stage).

Its own module: the order is arithmetic on a few integers, apart from how the files are checked and read.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import TYPE_CHECKING

import numpy as np

from ..errors import UsageError
from .hashing import FeistelPermutation

if TYPE_CHECKING:  # imported where a batch is made: counting windows needs no torch
    import torch

    from .loader import PreparedData


class RandomWindows:
    """Training batches: random windows, each once per epoch, disjoint across ranks, resumable (see module doc).

    windows_per_epoch: windows this rank reads per epoch (num_windows // world_size).
    """

    def __init__(self, data: PreparedData, split: str, seq_len: int, seed: int, rank: int = 0, world_size: int = 1):
        self.data, self.split = data, split
        self.num_windows = count_windows(data, split, seq_len, rank, world_size)
        self.seq_len, self.seed, self.rank, self.world_size = seq_len, seed, rank, world_size
        self.windows_per_epoch = self.num_windows // world_size
        self.epoch = 0
        self.position = 0  # global position in this epoch's order: windows consumed by all ranks together

    def next_batch(self, batch_size: int) -> tuple[torch.Tensor, torch.Tensor]:
        """(inputs, targets): int64, (batch_size, seq_len) each, targets = inputs shifted by one token."""
        windows = [
            FeistelPermutation(self.num_windows, self.seed, epoch)(
                first + self.rank + self.world_size * np.arange(count, dtype=np.uint64)
            )
            for epoch, first, count in self._advance(batch_size)
        ]
        return read_batch(self.data, self.split, np.concatenate(windows), self.seq_len)

    def state_dict(self) -> dict:
        return {
            "seed": self.seed,
            "epoch": self.epoch,
            "position": self.position,
            "num_windows": self.num_windows,
            "seq_len": self.seq_len,
        }

    def load_state_dict(self, state: dict) -> None:
        if state["seq_len"] != self.seq_len:
            state = self._new_stage(state)
        if (state["num_windows"], state["seq_len"], state["seed"]) != (self.num_windows, self.seq_len, self.seed):
            raise UsageError(
                f"data state is for {state['num_windows']:,} windows of {state['seq_len']} tokens, "
                f"seed {state['seed']}; this loader has {self.num_windows:,} of {self.seq_len}, "
                f"seed {self.seed}: resume with the same data, seq_len and seed"
            )
        self.epoch, self.position = int(state["epoch"]), int(state["position"])
        self._roll_over()  # the state may come from a run with another world size

    def _new_stage(self, state: dict) -> dict:
        """A state saved at another seq_len, by a run now continued with longer (or shorter) windows: a stage of
        context extension (docs/train.md). The same epoch, at the same share of it in tokens (to one window per
        rank below); the rest of the epoch reads windows of the new length in their own permutation, so within
        this one epoch a token may be read twice or not at all. A state of other data or another seed is left
        for the check that names it."""
        if (
            state["seed"] != self.seed
            or state["num_windows"] != (self.data._num_tokens(self.split) - 1) // state["seq_len"]
        ):
            return state
        tokens_read = state["position"] * state["seq_len"]  # of this epoch, all ranks together
        position = tokens_read // self.seq_len // self.world_size * self.world_size
        return {**state, "seq_len": self.seq_len, "num_windows": self.num_windows, "position": position}

    def _advance(self, n: int) -> Iterator[tuple[int, int, int]]:
        """Consume n windows of this rank: yields runs (epoch, first global position, windows of this rank)."""
        while n > 0:
            count = min(n, (self.num_windows - self.position) // self.world_size)
            yield self.epoch, self.position, count
            self.position += count * self.world_size
            n -= count
            self._roll_over()

    def _roll_over(self) -> None:
        if self.num_windows - self.position < self.world_size:
            self.epoch += 1
            self.position = 0


class SequentialWindows:
    """Evaluation batches: the split's first windows in order, the same every time.

    Rank r of W reads windows r, r + W, r + 2W, ...; batches stop when the split runs out (the last one
    may be shorter, equally on every rank).
    """

    def __init__(self, data: PreparedData, split: str, seq_len: int, rank: int = 0, world_size: int = 1):
        self.data, self.split = data, split
        self.num_windows = count_windows(data, split, seq_len, rank, world_size)
        self.seq_len, self.rank, self.world_size = seq_len, rank, world_size

    def batches(self, batch_size: int, num_batches: int) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
        total = min(batch_size * num_batches, self.num_windows // self.world_size)
        for start in range(0, total, batch_size):
            local = np.arange(start, min(start + batch_size, total))
            yield read_batch(self.data, self.split, self.rank + self.world_size * local, self.seq_len)


def count_windows(data: PreparedData, split: str, seq_len: int, rank: int, world_size: int) -> int:
    if seq_len < 1 or world_size < 1 or not 0 <= rank < world_size:
        raise UsageError(
            f"need seq_len >= 1 and 0 <= rank < world_size, got seq_len {seq_len}, rank {rank}, world_size {world_size}"
        )
    n = data._num_tokens(split)  # the size checked at open: a file changed since is found by the reads
    if n < seq_len + 1:
        fraction = "larger" if split == "val" else "smaller"  # --val-fraction moves documents from train to val
        raise UsageError(
            f"{split} split of {data.path} has {n:,} tokens; seq_len {seq_len} needs at least "
            f"{seq_len + 1:,} (prepare more data or a {fraction} --val-fraction, or shorten seq_len)"
        )
    windows = (n - 1) // seq_len
    if windows < world_size:
        raise UsageError(
            f"{split} split of {data.path} has {windows:,} windows of {seq_len} tokens, fewer than "
            f"the {world_size} ranks"
        )
    return windows


def read_batch(data: PreparedData, split: str, windows: np.ndarray, seq_len: int) -> tuple[torch.Tensor, torch.Tensor]:
    starts = np.asarray(windows, dtype=np.int64) * seq_len
    rows = data.read(split, starts, seq_len + 1).astype(np.int64)  # reads only these windows
    if rows.size and rows.max() >= data.vocab_size:  # the ids are unsigned: only too large is possible
        row, column = np.unravel_index(int(rows.argmax()), rows.shape)
        path, token = data.locate(split, int(starts[row]) + int(column))
        raise UsageError(
            f"{path}: token id {int(rows.max()):,} at token "
            f"{token:,} is outside the vocabulary of {data.vocab_size:,} "
            f"(meta.json): the file is damaged; {data.advice} "
            "(data.verify=full checks every byte at start)"
        )
    import torch

    return torch.from_numpy(rows[:, :-1].copy()), torch.from_numpy(rows[:, 1:].copy())
