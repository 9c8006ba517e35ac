"""Documents of a prepared directory: the histogram of their lengths that `prepare` writes into meta.json (the
planner prices masked attention from it), and the check that the offset index agrees with the <eos> ids the
trainer finds the documents by (train.document_masking). No torch: `prepare` and the planner read this.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np

from ..errors import UsageError

if TYPE_CHECKING:
    from .loader import PreparedData

# Offsets checked at train start: enough to catch an index from another build or shifted by one, at a cost
# (one token read per document) that stays small on a corpus of millions of documents.
CHECKED_STARTS = 1 << 16


def length_bins(lengths: np.ndarray) -> np.ndarray:
    """Document lengths in tokens (<eos> included) -> counts per power-of-two bin: bin k holds the documents
    of 2^k <= length < 2^(k+1) (64 bins: any int64 length)."""
    k = np.floor(np.log2(np.maximum(np.asarray(lengths, dtype=np.int64), 1))).astype(np.int64)
    return np.bincount(k, minlength=64)


def length_histogram(bins: np.ndarray) -> dict[str, int]:
    """Counts per bin -> meta.json's doc_length_histogram of a split: {"lo": documents of lo <= length < 2 lo}."""
    return {str(1 << k): int(n) for k, n in enumerate(bins) if n}


def merge_histograms(histograms: list[dict[str, int]]) -> dict[str, int]:
    """The histogram of several parts' documents together (chunks, shards)."""
    total: dict[int, int] = {}
    for h in histograms:
        for lo, n in h.items():
            total[int(lo)] = total.get(int(lo), 0) + n
    return {str(lo): total[lo] for lo in sorted(total)}


def check_document_index(data: PreparedData, split: str) -> None:
    """UsageError, in one line, unless the token before each of the split's first CHECKED_STARTS document
    offsets (*.idx.npy) and the split's last token are <eos>: where they disagree, the documents the mask
    follows are not the ones `prepare` wrote."""
    n = data._num_tokens(split)
    if n == 0:
        return
    tokens, starts = data.tokens(split), data.doc_starts(split)
    checked = np.asarray(starts[:CHECKED_STARTS], dtype=np.int64)
    if not checked.size or checked[0] != 0:
        where = "its first document does not start at token 0"
    else:
        ends = np.append(checked[1:] - 1, n - 1)  # the token before each checked start, and the split's last
        bad = np.flatnonzero(np.asarray(tokens[ends]) != data.eos_id)
        if not bad.size:
            return
        k = int(bad[0])
        where = f"token {int(ends[k]):,} is not <eos> {data.eos_id}, " + (
            "the split's last token" if k == len(ends) - 1 else f"before document {k + 1:,}"
        )
    raise UsageError(
        f"{data.path}: {split}.idx.npy disagrees with the <eos> ids of {split}.bin ({where}); "
        f"train.document_masking finds documents by <eos>: {data.advice}"
    )
