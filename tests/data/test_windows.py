"""The loader: PreparedData's checks, the window permutation, RandomWindows (determinism, resume, ranks,
epochs, skip) and SequentialWindows. Token ids here are 0, 1, 2, ... so a window is known by its first id."""

from __future__ import annotations

import hashlib
import json
import os
import tracemalloc

import numpy as np
import pytest
import torch

from pretrain.data import PreparedData, RandomWindows, SequentialWindows
from pretrain.data.hashing import FeistelPermutation
from pretrain.errors import UsageError

SEQ = 8


def write_prepared(out, train_tokens: int, val_tokens: int):
    """A prepared directory whose split tokens are 0..n-1 (uint32), one document per split."""
    out.mkdir(parents=True, exist_ok=True)
    meta = {
        "dtype": "uint32",
        "vocab_size": 100_000,
        "eos_id": 0,
        "tokenizer_sha256": "0" * 64,
        "num_tokens": {"train": train_tokens, "val": val_tokens},
        "num_docs": {"train": 1, "val": 1},
        "sha256": {},
    }
    for split, n in (("train", train_tokens), ("val", val_tokens)):
        data = np.arange(n, dtype="<u4").tobytes()
        (out / f"{split}.bin").write_bytes(data)
        np.save(out / f"{split}.idx.npy", np.zeros(1, dtype=np.int64))
        meta["sha256"][f"{split}.bin"] = hashlib.sha256(data).hexdigest()
    (out / "meta.json").write_text(json.dumps(meta))
    return out


def truncate(path, nbytes: int) -> None:
    with open(path, "r+b") as f:
        f.truncate(path.stat().st_size - nbytes)


def edit_meta(folder, change) -> None:
    meta = json.loads((folder / "meta.json").read_text())
    change(meta)
    (folder / "meta.json").write_text(json.dumps(meta))


@pytest.fixture
def data(tmp_path):
    return PreparedData(write_prepared(tmp_path / "d", train_tokens=SEQ * 101 + 1, val_tokens=SEQ * 5 + 3))


def window_ids(inputs: torch.Tensor) -> list[int]:
    return (inputs[:, 0] // SEQ).tolist()


def take(loader, batches, batch_size=4) -> list[int]:
    return [w for _ in range(batches) for w in window_ids(loader.next_batch(batch_size)[0])]


# --- PreparedData ------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "change, words",
    [
        (lambda f: truncate(f, 4), "was truncated to"),
        (lambda f: f.unlink(), "was deleted"),
        (lambda f: (f.with_name("new").write_bytes(f.read_bytes()), f.with_name("new").replace(f)), "was replaced"),
        # a rewrite in place of the same size: only the modification time tells (set ahead: a real write within the
        # file system's clock tick of the fixture's would keep it)
        (lambda f: os.utime(f, ns=(0, f.stat().st_mtime_ns + 10**9)), "was rewritten"),
    ],
)
def test_a_token_file_changed_after_open_is_one_line_at_the_next_read(data, change, words):
    """Reads are pread against the file as checked at open: a change is DataChanged naming the file, never a
    SIGBUS (a truncated memory map) or a window of other data."""
    from pretrain.data.token_files import DataChanged

    train, val = RandomWindows(data, "train", SEQ, seed=0), SequentialWindows(data, "val", SEQ)
    train.next_batch(4)
    change(data.path / "train.bin")
    with pytest.raises(DataChanged) as e:
        train.next_batch(4)
    assert str(e.value).startswith(f"{data.path / 'train.bin'} {words}"), e.value
    assert e.value.path == data.path / "train.bin" and "\n" not in str(e.value)
    assert len(list(val.batches(2, 1))) == 1  # val.bin is unchanged: it reads on
    with pytest.raises(DataChanged):
        data.check("train")


def test_opens_and_memory_maps(data):
    assert (data.vocab_size, data.eos_id, data.dtype.name) == (100_000, 0, "uint32")
    tokens = data.tokens("train")
    assert isinstance(tokens, np.memmap) and len(tokens) == SEQ * 101 + 1
    assert data.tokenizer_dir == data.path / "tokenizer"
    with pytest.raises(UsageError, match="unknown split 'test'"):
        data.tokens("test")


@pytest.mark.parametrize(
    "damage, message",
    [
        (lambda d: (d / "meta.json").unlink(), "no meta.json"),
        (lambda d: (d / "meta.json").write_text("{"), "not valid JSON"),
        (lambda d: (d / "meta.json").write_text("{}"), "missing keys dtype"),
        (lambda d: (d / "val.bin").unlink(), "val.bin: missing"),
        (lambda d: (d / "train.bin").write_bytes(b"\0" * 8), "train.bin: 8 bytes, meta.json says 3,236"),
        (
            lambda d: np.save(d / "val.idx.npy", np.zeros(3, dtype=np.int64)),
            r"val.idx.npy: offsets of shape \(3,\), meta.json says 1 documents",
        ),
        (lambda d: truncate(d / "train.idx.npy", 8), r"train.idx.npy: 128 bytes, its header says 136 \(1 offsets\)"),
        (lambda d: np.save(d / "val.idx.npy", np.zeros(1, dtype=np.int32)), "val.idx.npy: offsets of dtype int32"),
        (lambda d: edit_meta(d, lambda m: m["num_tokens"].pop("val")), "num_tokens has no val"),
        (lambda d: edit_meta(d, lambda m: m["sha256"].pop("train.bin")), "sha256 has no train.bin"),
    ],
)
def test_refuses_a_damaged_directory(tmp_path, damage, message):  # at open, not at first use
    folder = write_prepared(tmp_path / "d", SEQ * 101 + 1, 43)
    damage(folder)
    with pytest.raises(UsageError, match=message) as error:
        PreparedData(folder)
    assert str(folder) in str(error.value) and "\n" not in str(error.value)


def test_checksums_on_request(tmp_path):
    folder = write_prepared(tmp_path / "d", 100, 20)
    with open(folder / "train.bin", "r+b") as f:  # same size, one byte changed
        f.seek(17)
        f.write(b"\xff")
    PreparedData(folder, verify="size")  # sizes only: opens
    with pytest.raises(UsageError, match="train.bin: sha256 differs"):
        PreparedData(folder, verify="full")


# --- the permutation ---------------------------------------------------------------------------------


@pytest.mark.parametrize("size", [1, 2, 3, 4, 5, 7, 16, 17, 100, 1000, 4097])
def test_feistel_is_a_permutation(size):
    order = FeistelPermutation(size, seed=3, epoch=1)(np.arange(size))
    assert sorted(order.tolist()) == list(range(size))


def test_feistel_needs_no_memory_for_1e8_windows():
    size = 10**8
    tracemalloc.start()
    order = FeistelPermutation(size, seed=1, epoch=0)(np.arange(10_000))
    peak = tracemalloc.get_traced_memory()[1]
    tracemalloc.stop()
    assert peak < 2_000_000  # a few arrays of 10,000 values; a stored permutation would be 800 MB
    assert len(set(order.tolist())) == 10_000 and order.min() >= 0 and order.max() < size
    assert order[:100].tolist() != list(range(100))


# --- RandomWindows -----------------------------------------------------------------------------------


def test_batches_are_windows_shifted_by_one(data):
    inputs, targets = RandomWindows(data, "train", SEQ, seed=0).next_batch(5)
    assert inputs.shape == targets.shape == (5, SEQ) and inputs.dtype == targets.dtype == torch.int64
    assert inputs.is_contiguous() and targets.is_contiguous()
    assert inputs.untyped_storage().data_ptr() != targets.untyped_storage().data_ptr()
    starts = inputs[:, :1]
    assert torch.equal(inputs, starts + torch.arange(SEQ)) and torch.equal(targets, inputs + 1)
    assert (starts % SEQ == 0).all()


def test_every_window_once_per_epoch_and_epochs_differ(data):
    loader = RandomWindows(data, "train", SEQ, seed=5)
    assert loader.num_windows == loader.windows_per_epoch == 101  # (809 - 1) // 8
    first, second = window_ids(loader.next_batch(101)[0]), window_ids(loader.next_batch(101)[0])
    assert sorted(first) == sorted(second) == list(range(101)) and first != second
    assert loader.state_dict()["epoch"] == 2
    # Batches that straddle the epoch boundary see the same order.
    assert take(RandomWindows(data, "train", SEQ, seed=5), 101, batch_size=2) == first + second


def test_same_seed_same_batches_other_seed_other_batches(data):
    assert take(RandomWindows(data, "train", SEQ, seed=1), 5) == take(RandomWindows(data, "train", SEQ, seed=1), 5)
    assert take(RandomWindows(data, "train", SEQ, seed=1), 5) != take(RandomWindows(data, "train", SEQ, seed=2), 5)


def test_resume_gives_exactly_the_batches_it_would_have_seen(data):
    loader = RandomWindows(data, "train", SEQ, seed=9)
    take(loader, 20, batch_size=7)  # 140 windows: into the second epoch
    state = json.loads(json.dumps(loader.state_dict()))  # a few integers, JSON-safe
    expected = [loader.next_batch(7) for _ in range(30)]
    resumed = RandomWindows(data, "train", SEQ, seed=9)
    resumed.load_state_dict(state)
    for x, y in expected:
        rx, ry = resumed.next_batch(7)
        assert torch.equal(rx, x) and torch.equal(ry, y)
    # another seed is other data order: refused (another seq_len is a new stage: tests/train/test_context_stages.py)
    with pytest.raises(UsageError, match="resume with the same data"):
        RandomWindows(data, "train", SEQ, seed=10).load_state_dict(state)


def test_ranks_are_disjoint_and_together_are_the_single_process_batches(data):
    world, batch, steps = 3, 4, 5
    ranks = [RandomWindows(data, "train", SEQ, seed=2, rank=r, world_size=world) for r in range(world)]
    single = RandomWindows(data, "train", SEQ, seed=2)
    assert ranks[0].windows_per_epoch == 101 // world
    for _ in range(steps):
        per_rank = [window_ids(r.next_batch(batch)[0]) for r in ranks]
        assert len({w for ids in per_rank for w in ids}) == world * batch  # no overlap between ranks
        assert sorted(w for ids in per_rank for w in ids) == sorted(window_ids(single.next_batch(world * batch)[0]))


def test_ranks_equal_the_single_process_until_an_epoch_drops_windows(tmp_path):
    # 1,607 windows, W = 3, B = 5: a single process's epoch is 1,607 positions, the ranks' 1,605 (1,607 % 3
    # dropped), so the batches agree for steps 0 to 106 and part at step 107, which crosses into epoch 1.
    # With W dividing num_windows (1,608) they agree across epochs.
    def union_equals_single(num_windows: int, step: int) -> bool:
        data = PreparedData(write_prepared(tmp_path / str(num_windows), SEQ * num_windows + 1, SEQ + 1))
        ranks = [RandomWindows(data, "train", SEQ, seed=3, rank=r, world_size=3) for r in range(3)]
        single = RandomWindows(data, "train", SEQ, seed=3)
        for loader in (*ranks, single):
            loader.next_batch(step * (15 if loader is single else 5))  # read past: skipping is reading
        union = sorted(w for r in ranks for w in window_ids(r.next_batch(5)[0]))
        return union == sorted(window_ids(single.next_batch(15)[0]))

    assert union_equals_single(1607, 106) and not union_equals_single(1607, 107)
    assert union_equals_single(1608, 107) and union_equals_single(1608, 250)


def test_ranks_cover_an_epoch_without_repeats(data):
    world = 4
    ranks = [RandomWindows(data, "train", SEQ, seed=8, rank=r, world_size=world) for r in range(world)]
    seen = [w for r in ranks for w in window_ids(r.next_batch(r.windows_per_epoch)[0])]
    assert len(seen) == len(set(seen)) == 100  # 101 windows, the last position dropped to keep ranks in step


def test_resume_with_another_world_size_repeats_nothing(data):
    single = RandomWindows(data, "train", SEQ, seed=6)
    seen = take(single, 5, batch_size=2)
    for rank in range(2):
        loader = RandomWindows(data, "train", SEQ, seed=6, rank=rank, world_size=2)
        loader.load_state_dict(single.state_dict())
        seen += window_ids(loader.next_batch((101 - 10) // 2)[0])
    assert len(seen) == len(set(seen)) == 100


def test_split_too_small_names_split_and_counts(tmp_path):
    data = PreparedData(write_prepared(tmp_path / "d", 100, 5))
    with pytest.raises(UsageError, match=r"val split of .* has 5 tokens; seq_len 8 needs at least 9"):
        RandomWindows(data, "val", SEQ, seed=0)
    with pytest.raises(UsageError, match=r"val split .* has 5 tokens.* a larger --val-fraction"):
        SequentialWindows(data, "val", SEQ)
    data = PreparedData(write_prepared(tmp_path / "e", 5, 100))  # --val-fraction took train's documents
    with pytest.raises(UsageError, match=r"train split .* has 5 tokens.* a smaller --val-fraction"):
        RandomWindows(data, "train", SEQ, seed=0)


# --- SequentialWindows -------------------------------------------------------------------------------


def test_sequential_windows_are_the_first_in_order(data):
    loader = SequentialWindows(data, "val", SEQ)  # 43 tokens: 5 windows
    batches = list(loader.batches(batch_size=2, num_batches=10))
    assert [window_ids(x) for x, _ in batches] == [[0, 1], [2, 3], [4]]  # stops when the split runs out
    again = list(loader.batches(batch_size=2, num_batches=10))
    assert all(torch.equal(a[0], b[0]) and torch.equal(a[1], b[1]) for a, b in zip(batches, again))
    assert len(list(loader.batches(batch_size=2, num_batches=1))) == 1
    ranks = [SequentialWindows(data, "val", SEQ, rank=r, world_size=2) for r in range(2)]
    assert [[window_ids(x) for x, _ in r.batches(2, 5)] for r in ranks] == [[[0, 2]], [[1, 3]]]
