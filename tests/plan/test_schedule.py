"""Learning-rate schedules and the batch-size ramp (pure functions shared by the planner and the trainer)."""

import math

import pytest

from pretrain.plan.schedule import (
    learning_rate,
    micro_batches_per_step,
    steps_for_tokens,
    tokens_for_steps,
    warmup_steps,
)

LR = dict(total_steps=1000, warmup=10, peak=3e-4, min_ratio=0.1)


@pytest.mark.parametrize("schedule", ["cosine", "linear", "inverse_sqrt", "wsd"])
def test_warmup_then_decay_to_the_floor(schedule):
    lrs = [learning_rate(s, schedule=schedule, **LR) for s in range(1000)]
    assert lrs[0] == pytest.approx(3e-5) and lrs[9] == pytest.approx(3e-4)  # linear warm-up over 10 steps
    assert all(a <= b for a, b in zip(lrs[:10], lrs[1:10]))
    assert all(3e-5 - 1e-12 <= x <= 3e-4 + 1e-12 for x in lrs)  # never below 10% of the peak
    assert all(b <= a + 1e-15 for a, b in zip(lrs[10:], lrs[11:]))  # non-increasing after warm-up


def test_cosine_midpoint_and_end():
    mid = learning_rate(505, schedule="cosine", **LR)
    assert mid == pytest.approx(3e-5 + (3e-4 - 3e-5) * 0.5 * (1 + math.cos(math.pi * 0.5)), rel=1e-9)
    assert learning_rate(999, schedule="cosine", **LR) == pytest.approx(3e-5, rel=1e-3)


def test_wsd_is_flat_then_decays():
    lrs = [learning_rate(s, schedule="wsd", decay_fraction=0.2, **LR) for s in range(1000)]
    assert set(lrs[10:800]) == {3e-4}
    assert lrs[999] == pytest.approx(3e-5)


def test_warmup_fraction_or_steps():
    assert warmup_steps(0.005, 2000) == 10
    assert warmup_steps(25, 2000) == 25


RAMP = dict(
    seq_len=1024, micro_batch_size=4, data_parallel=8, grad_accum_steps=96, ramp_tokens=4_000_000_000, ramp_start=32_768
)


def test_batch_ramp_grows_from_start_to_target_in_whole_micro_batches():
    # GPT-3 style: 32K tokens -> 3.1M tokens (1024 x 4 x 8 x 96) over the first 4B tokens.
    unit = 1024 * 4 * 8
    assert micro_batches_per_step(0, **RAMP) == 1  # 32,768 tokens = one micro-batch on every rank
    mid = micro_batches_per_step(2_000_000_000, **RAMP)
    assert mid == (32_768 + (96 * unit - 32_768) // 2) // unit
    assert micro_batches_per_step(4_000_000_000, **RAMP) == 96
    seen, previous = 0, 1
    for _ in range(200):
        k = micro_batches_per_step(seen, **RAMP)
        assert previous <= k <= 96
        previous, seen = k, seen + k * unit * 1000


def test_steps_for_tokens_matches_a_step_by_step_walk():
    args = dict(RAMP, ramp_tokens=50_000_000)
    tokens = 120_000_000
    seen = steps = 0
    unit = 1024 * 4 * 8
    while seen < tokens:
        seen += micro_batches_per_step(seen, **args) * unit
        steps += 1
    assert steps_for_tokens(tokens, **args) == steps
    assert tokens_for_steps(steps, **args) == seen


def test_no_ramp_is_plain_division():
    args = dict(RAMP, ramp_tokens=0)
    per_step = 1024 * 4 * 8 * 96
    assert steps_for_tokens(10 * per_step + 1, **args) == 11
    assert tokens_for_steps(11, **args) == 11 * per_step


def _walk_tokens(steps, args):
    """The trainer's own walk: one optimizer step at a time, each of micro_batches_per_step micro-batches."""
    unit = args["seq_len"] * args["micro_batch_size"] * args["data_parallel"]
    seen = 0
    for _ in range(steps):
        seen += micro_batches_per_step(seen, **args) * unit
    return seen


@pytest.mark.parametrize(
    "args",
    [
        dict(seq_len=7, micro_batch_size=3, data_parallel=5, grad_accum_steps=40, ramp_tokens=150_000, ramp_start=1),
        dict(seq_len=64, micro_batch_size=1, data_parallel=1, grad_accum_steps=13, ramp_tokens=9_999, ramp_start=100),
        dict(
            seq_len=1, micro_batch_size=1, data_parallel=1, grad_accum_steps=1000, ramp_tokens=10**18, ramp_start=37
        ),  # a ramp that never ends
        dict(
            seq_len=256, micro_batch_size=2, data_parallel=3, grad_accum_steps=8, ramp_tokens=50_000, ramp_start=10**9
        ),  # start above the target: no ramp at all
        dict(RAMP, ramp_tokens=50_000_000),
    ],
)
def test_tokens_for_steps_jumps_runs_but_equals_the_step_walk(args):
    for steps in (0, 1, 2, 17, 500, 3000):
        assert tokens_for_steps(steps, **args) == _walk_tokens(steps, args)


def test_tokens_for_steps_is_instant_in_a_long_ramp():
    # 20M steps inside a ramp that never ends took 25 s one step at a time; runs of equal batch jump at once.
    import time

    args = dict(
        seq_len=256, micro_batch_size=1, data_parallel=1, grad_accum_steps=1000, ramp_tokens=10**18, ramp_start=32_768
    )
    started = time.perf_counter()
    tokens = tokens_for_steps(20_000_000, **args)
    assert time.perf_counter() - started < 1.0
    assert tokens == 20_000_000 * 32_768  # 128 micro-batches of 256 tokens: the ramp barely moves in 6.6e11 tokens
