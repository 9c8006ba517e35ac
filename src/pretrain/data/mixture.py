"""Training on a weighted mixture of prepared directories (data.mixture): which source each window comes from.

The global stream of windows is numbered by slot g = 0, 1, 2, ...; as in RandomWindows, slot g goes to rank
g % world_size, so a micro-batch of B windows per rank is the W x B consecutive slots after the position,
and ranks never take the same slot. Two pure functions then decide what a slot reads:

  source   a Weyl sequence: u_g = (offset(seed) + g x 2^64/phi) mod 2^64 (phi the golden ratio), and slot g
           belongs to the source whose interval of [0, 2^64), of width weight x 2^64, holds u_g. The golden
           ratio's multiples are the most evenly spread sequence mod 1 (three-distance theorem; Weyl 1916): the
           count of any source over the first N slots is within O(log N) windows of weight x N, so the achieved
           share tracks the target from the first steps (within 1 % after 200 steps of 8 windows, where drawing
           each slot at random would be off by ~1.1 % at one standard deviation). Every window holds seq_len
           tokens, so shares of windows are shares of tokens: the weights count tokens.
  window   the k-th slot of a source (k counted over all ranks) reads window Feistel_{seed_s, e}(k mod n_s) of
           its n_s windows, in epoch e = k // n_s: each source has its own keyed permutation per epoch, as
           RandomWindows has, and distinct k within an epoch are distinct windows, so ranks never overlap.

The reading state is the position (slots consumed) and the windows drawn per source: a few integers, so a
resumed run continues with exactly the batches it would have seen (any world size: the numbering is global).

Repetition cap: a source with max_epochs stops when its draws reach max_epochs x n_s windows; from that slot
on the remaining sources share the stream in proportion to their weights (the same rule on every rank, from
the same integers). A mixture whose every source is capped and spent is an error, not silent over-repetition.
"""

from __future__ import annotations

import numpy as np
import torch

from ..errors import UsageError
from .hashing import FeistelPermutation, hash64
from .loader import open_training_data
from .windows import count_windows, read_batch

GOLDEN_STEP = np.uint64(0x9E3779B97F4A7C15)  # 2^64 / phi, odd
SLOT_KEY, SOURCE_KEY = 1 << 40, 1 << 41  # keep the mixture's hashes apart from the Feistel round keys' inputs


def open_mixture(sources: list[dict], verify: str, model_vocab_size: int) -> list[dict]:
    """Each source of `config.mixture_sources` opened (`open_training_data`) as {..., "data": PreparedData};
    all must share one tokenizer and end-of-document id: a token id means the same text in every source, and
    <eos> the same boundary, or the mixture is noise."""
    opened = [{**s, "data": open_training_data(s["dir"], verify, model_vocab_size)} for s in sources]
    first = opened[0]["data"]
    for s in opened[1:]:
        d = s["data"]
        if (d.meta["tokenizer_sha256"], d.vocab_size) != (first.meta["tokenizer_sha256"], first.vocab_size):
            raise UsageError(
                f"data.mixture: {first.path} and {d.path} were prepared with different tokenizers "
                f"(tokenizer_sha256 {first.meta['tokenizer_sha256'][:12]} vs "
                f"{d.meta['tokenizer_sha256'][:12]}, vocab {first.vocab_size:,} vs {d.vocab_size:,}); "
                "prepare every source with the same --tokenizer"
            )
        if d.eos_id != first.eos_id:  # one tokenizer.json, another eos_token in a tokenizer_config.json
            raise UsageError(
                f"data.mixture: {first.path} ends its documents with token id {first.eos_id} and "
                f"{d.path} with token id {d.eos_id} (meta.json eos_id; the same tokenizer.json with "
                "another eos_token in tokenizer_config.json); prepare every source with the same "
                "tokenizer directory"
            )
    return opened


class MixtureWindows:
    """Training batches drawn from several sources by weight (see module doc); RandomWindows' interface."""

    def __init__(
        self, sources: list[dict], seq_len: int, seed: int, rank: int = 0, world_size: int = 1, split: str = "train"
    ):
        self.sources, self.split = sources, split
        self.seq_len, self.seed, self.rank, self.world_size = seq_len, seed, rank, world_size
        self.num_windows = [count_windows(s["data"], split, seq_len, rank, world_size) for s in sources]
        self.weights = np.array([s["weight"] for s in sources], dtype=np.float64)
        self.caps = [
            cap_windows(s["max_epochs"], n) if s.get("max_epochs") else None for s, n in zip(sources, self.num_windows)
        ]
        self.offset = hash64(seed, np.array([SLOT_KEY]))[0]
        self.source_seeds = [int(k) for k in hash64(seed, SOURCE_KEY + np.arange(len(sources)))]
        self.position = 0  # slots consumed by all ranks together
        self.drawn = [0] * len(sources)  # windows drawn per source, all ranks together

    def next_batch(self, batch_size: int) -> tuple[torch.Tensor, torch.Tensor]:
        """(inputs, targets): int64, (batch_size, seq_len) each, this rank's windows of the next W x B slots."""
        source, k = self._draw(batch_size * self.world_size)
        source, k = source[self.rank :: self.world_size], k[self.rank :: self.world_size]
        x = torch.empty(batch_size, self.seq_len, dtype=torch.int64)
        y = torch.empty_like(x)
        for s in np.unique(source):
            rows = np.flatnonzero(source == s)
            x[rows], y[rows] = read_batch(self.sources[s]["data"], self.split, self._windows(s, k[rows]), self.seq_len)
        for s in set(range(len(self.sources))) - set(source.tolist()):  # a change to a source is found at once,
            self.sources[s]["data"].check(self.split)  # not when its weight next draws from it
        return x, y

    def state_dict(self) -> dict:
        return {
            "seed": self.seed,
            "seq_len": self.seq_len,
            "position": self.position,
            "sources": [
                {"name": s["name"], "num_windows": n, "drawn": d}
                for s, n, d in zip(self.sources, self.num_windows, self.drawn)
            ],
        }

    def load_state_dict(self, state: dict) -> None:
        mine = ", ".join(f"{s['name']} ({n:,} windows)" for s, n in zip(self.sources, self.num_windows))
        saved = ", ".join(f"{s['name']} ({s['num_windows']:,} windows)" for s in state["sources"])
        if (saved, state["seq_len"], state["seed"]) != (mine, self.seq_len, self.seed):
            raise UsageError(
                f"data state is for the mixture {saved} of {state['seq_len']} tokens, seed "
                f"{state['seed']}; this run has {mine} of {self.seq_len}, seed {self.seed}: resume "
                "with the same data.mixture sources, seq_len and seed"
            )
        self.position = int(state["position"])
        self.drawn = [int(s["drawn"]) for s in state["sources"]]

    def _draw(self, count: int) -> tuple[np.ndarray, np.ndarray]:
        """The next `count` slots: the source of each and its draw index k within that source; advances."""
        source = np.empty(count, dtype=np.int64)
        k = np.empty(count, dtype=np.int64)
        done = 0
        while done < count:
            active = [i for i, cap in enumerate(self.caps) if cap is None or self.drawn[i] < cap]
            if not active:
                raise UsageError(
                    "data.mixture: every source has reached its max_epochs after "
                    f"{self.position * self.seq_len:,} tokens; raise a max_epochs, add a source "
                    "without one, or train fewer tokens"
                )
            chunk = slot_sources(self.offset, self.weights, active, self.position + np.arange(count - done))
            # Stop the chunk after the slot that spends a capped source: the shares change from the next slot.
            end = len(chunk)
            for i in active:
                cap = self.caps[i]
                if cap is not None:
                    hits = np.flatnonzero(chunk == i)
                    if len(hits) >= cap - self.drawn[i]:
                        end = min(end, int(hits[cap - self.drawn[i] - 1]) + 1)
            chunk = chunk[:end]
            for i in np.unique(chunk):
                mask = chunk == i
                k[done : done + end][mask] = self.drawn[i] + np.arange(int(mask.sum()))
                self.drawn[i] += int(mask.sum())
            source[done : done + end] = chunk
            done += end
            self.position += end
        return source, k

    def _windows(self, s: int, k: np.ndarray) -> np.ndarray:
        n = self.num_windows[s]
        epochs, positions = k // n, k % n
        windows = np.empty_like(k)
        for epoch in np.unique(epochs):
            at = epochs == epoch
            windows[at] = FeistelPermutation(n, self.source_seeds[s], int(epoch))(positions[at])
        return windows


def slot_sources(offset: np.uint64, weights: np.ndarray, active: list[int], slots: np.ndarray) -> np.ndarray:
    """The source of each slot among `active` (indices into weights, renormalised): the interval of [0, 2^64)
    that the slot's Weyl value falls in (module doc)."""
    shares = weights[active] / weights[active].sum()
    bounds = np.array([min(int(c * 2.0**64), 2**64 - 1) for c in np.cumsum(shares)[:-1]], dtype=np.uint64)
    u = offset + np.asarray(slots, dtype=np.uint64) * GOLDEN_STEP  # wraps modulo 2^64, as intended
    return np.asarray(active, dtype=np.int64)[np.searchsorted(bounds, u, side="right")]


def cap_windows(max_epochs: float, num_windows: int) -> int:
    """Windows a source may give under its max_epochs: never more than max_epochs x its windows."""
    return int(max_epochs * num_windows)


def source_tokens(state: dict) -> dict[str, int]:
    """Tokens drawn so far per source name (all ranks), from a MixtureWindows state."""
    return {s["name"]: s["drawn"] * state["seq_len"] for s in state["sources"]}


def source_epochs(state: dict) -> dict[str, float]:
    """Epochs drawn so far per source name: windows drawn / windows in its split."""
    return {s["name"]: s["drawn"] / s["num_windows"] for s in state["sources"]}
