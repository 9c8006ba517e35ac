"""The mixture's order (data/mixture.py): a pure function of (seed, position), shares that track the weights,
ranks that never read the same window, a state that resumes exactly, caps that stop a source, and one
tokenizer for all sources."""

import numpy as np
import pytest

from pretrain.config import load_config, mixture_sources
from pretrain.errors import UsageError

torch = pytest.importorskip("torch")


def sources(two_corpora, weights=(0.7, 0.3), max_epochs=(None, None)):
    from pretrain.data.mixture import open_mixture

    entries = ", ".join(
        f"{{dir: {two_corpora[name]}, weight: {w}" + (f", max_epochs: {cap}}}" if cap else "}")
        for name, w, cap in zip(("shakespeare", "zh"), weights, max_epochs)
    )
    config = load_config(None, [f"data.mixture=[{entries}]"])
    return open_mixture(mixture_sources(config.data), "auto", 512)


def loader(srcs, seed=0, rank=0, world_size=1):
    from pretrain.data.mixture import MixtureWindows

    return MixtureWindows(srcs, seq_len=32, seed=seed, rank=rank, world_size=world_size)


def batches(windows, n, batch_size=8):
    return [windows.next_batch(batch_size) for _ in range(n)]


def same(a, b):
    return len(a) == len(b) and all(torch.equal(x, u) and torch.equal(y, v) for (x, y), (u, v) in zip(a, b))


def test_the_order_is_a_function_of_seed_and_position(two_corpora):
    srcs = sources(two_corpora)
    assert same(batches(loader(srcs, seed=3), 20), batches(loader(srcs, seed=3), 20))
    assert not same(batches(loader(srcs, seed=3), 20), batches(loader(srcs, seed=4), 20))


@pytest.mark.parametrize("world_size", [1, 2])
def test_achieved_share_is_within_one_percent_after_200_steps(two_corpora, world_size):
    """200 steps of the tiny run's 8 windows (all ranks together): 1,600 windows, 70/30 by tokens."""
    srcs = sources(two_corpora)
    for seed in range(10):
        ranks = [loader(srcs, seed=seed, rank=r, world_size=world_size) for r in range(world_size)]
        for _ in range(200):
            for w in ranks:
                w.next_batch(8 // world_size)
        drawn = ranks[0].state_dict()["sources"]
        assert ranks[0].state_dict() == ranks[-1].state_dict()  # every rank counts the global stream
        share = drawn[0]["drawn"] / (drawn[0]["drawn"] + drawn[1]["drawn"])
        assert abs(share - 0.7) < 0.01, (seed, share)


def test_ranks_read_disjoint_windows_that_together_are_the_single_process_batch(two_corpora):
    """Within each source's first epoch (shakespeare has 959 windows, 0.7 x 800 are drawn here)."""
    srcs = sources(two_corpora)
    single = batches(loader(srcs, seed=1), 100, batch_size=8)
    ranks = [batches(loader(srcs, seed=1, rank=r, world_size=2), 100, batch_size=4) for r in range(2)]
    rows = [{tuple(row.tolist()) for x, _ in rank for row in x} for rank in ranks]
    assert len(rows[0]) == len(rows[1]) == 400  # no window twice on one rank either
    assert not rows[0] & rows[1]
    for b in range(100):  # global micro-batch b is the single process's batch b, rank 0 on even slots
        x = single[b][0]
        assert torch.equal(x[0::2], ranks[0][b][0]) and torch.equal(x[1::2], ranks[1][b][0])


def test_state_round_trip_mid_epoch(two_corpora):
    srcs = sources(two_corpora)
    first = loader(srcs, seed=5)
    batches(first, 37)
    state = first.state_dict()
    assert 0 < state["sources"][0]["drawn"] < state["sources"][0]["num_windows"]  # mid-epoch
    resumed = loader(srcs, seed=5)
    resumed.load_state_dict(state)
    assert same(batches(first, 30), batches(resumed, 30))
    with pytest.raises(UsageError, match="resume with the same data.mixture sources"):
        loader(srcs, seed=6).load_state_dict(state)


def test_windows_repeat_only_after_a_whole_epoch(two_corpora):
    """Shakespeare's 959 windows: its first 959 draws are all different, the next 959 the same set again."""
    srcs = sources(two_corpora, weights=(1, 1))
    w = loader(srcs, seed=2)
    seen = []
    while w.drawn[0] < 2 * w.num_windows[0]:
        before = w.drawn[0]
        source, k = w._draw(1)
        if source[0] == 0:
            seen.append(int(w._windows(0, k)[0]))
        assert w.drawn[0] == before + (source[0] == 0)
    n = w.num_windows[0]
    assert sorted(seen[:n]) == sorted(seen[n:]) == list(range(n))
    assert seen[:n] != seen[n:]  # each epoch has its own order


def test_max_epochs_stops_a_source_and_the_rest_take_its_share(two_corpora):
    srcs = sources(two_corpora, max_epochs=(0.1, None))
    w = loader(srcs)
    batches(w, 100)
    drawn = [s["drawn"] for s in w.state_dict()["sources"]]
    assert drawn[0] == int(0.1 * w.num_windows[0])  # exactly its cap, then nothing more
    assert drawn[1] == 800 - drawn[0]

    spent = loader(sources(two_corpora, max_epochs=(0.1, 0.1)))
    with pytest.raises(UsageError, match="every source has reached its max_epochs"):
        batches(spent, 100)


def test_sources_with_different_tokenizers_are_refused(two_corpora, prepared):
    from pretrain.data.mixture import open_mixture

    config = load_config(
        None, [f"data.mixture=[{{dir: {two_corpora['zh']}, weight: 1}}, {{dir: {prepared}, weight: 1}}]"]
    )
    with pytest.raises(UsageError) as e:
        open_mixture(mixture_sources(config.data), "auto", 512)
    message = str(e.value)
    assert "\n" not in message and str(two_corpora["zh"]) in message and str(prepared) in message


def test_slot_sources_follow_the_weights_of_the_active_sources():
    from pretrain.data.mixture import slot_sources

    weights = np.array([0.5, 0.2, 0.3])
    slots = np.arange(10_000)
    counts = np.bincount(slot_sources(np.uint64(12345), weights, [0, 1, 2], slots), minlength=3)
    assert np.all(np.abs(counts - weights * 10_000) <= 10)
    only = slot_sources(np.uint64(12345), weights, [1, 2], slots)  # source 0 spent: 0.2 : 0.3 -> 40 / 60 %
    assert set(only.tolist()) == {1, 2} and abs((only == 1).mean() - 0.4) < 0.002
