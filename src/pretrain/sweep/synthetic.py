"""Synthetic tokens: the loader `pretrain sweep` feeds each cell's Trainer, so that a sweep needs no data."""

from __future__ import annotations

import torch


class SyntheticTokens:
    """The loader interface `Trainer` reads (`next_batch`, `state_dict`, `load_state_dict`), with uniform
    random token ids instead of a data directory. Batch k comes from its own generator seeded by (seed, k),
    so the whole state is two integers. Inputs and targets are separate int64 tensors, as `RandomWindows`
    returns them: the planner counts both among the activations (2 x 8 x b*s bytes), and two views of one
    storage would be counted once by the tensor meter."""

    def __init__(self, vocab_size: int, seq_len: int, seed: int = 0):
        self.vocab_size, self.seq_len, self.seed = vocab_size, seq_len, seed
        self.batches = 0

    def next_batch(self, batch_size: int) -> tuple[torch.Tensor, torch.Tensor]:
        generator = torch.Generator().manual_seed(self.seed * 1_000_003 + self.batches)
        self.batches += 1
        rows = torch.randint(0, self.vocab_size, (batch_size, self.seq_len + 1), generator=generator)
        return rows[:, :-1].clone(), rows[:, 1:].clone()  # clone: with batch 1 a slice is already contiguous

    def state_dict(self) -> dict:
        return {"seed": self.seed, "batches": self.batches}

    def load_state_dict(self, state: dict) -> None:
        self.seed, self.batches = int(state["seed"]), int(state["batches"])
