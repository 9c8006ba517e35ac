"""meta.json's doc_length_histogram: every document of a split in its power-of-two bin of length (tokens,
<eos> included), as the offset index measures them."""

import json

import numpy as np

from pretrain.data.documents import length_bins, length_histogram


def test_the_histogram_counts_the_offset_index_documents(prepared):
    meta = json.loads((prepared / "meta.json").read_text())
    for split in ("train", "val"):
        starts = np.load(prepared / f"{split}.idx.npy")
        lengths = np.diff(np.append(starts, meta["num_tokens"][split]))
        histogram = meta["doc_length_histogram"][split]
        assert sum(histogram.values()) == meta["num_docs"][split]
        for lo, n in histogram.items():
            assert n == ((lengths >= int(lo)) & (lengths < 2 * int(lo))).sum(), (split, lo)


def test_bins_are_powers_of_two():
    assert length_histogram(length_bins(np.array([1, 2, 3, 4, 7, 8, 300, 511, 512]))) == {
        "1": 1,
        "2": 2,
        "4": 2,
        "8": 1,
        "256": 2,
        "512": 1,
    }
