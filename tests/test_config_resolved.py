"""The config is resolved once at load and frozen after: what the planner reads is what the trainer reads."""

import dataclasses

import pytest

from pretrain.config import docs_markdown, load_config, replaced, untrained
from pretrain.errors import ConfigError


def test_derived_defaults_are_filled_at_load():
    c = load_config({"model": {"hidden_size": 256, "num_heads": 4, "max_seq_len": 512}})
    assert (c.model.num_kv_heads, c.model.head_dim, c.train.seq_len) == (4, 64, 512)
    assert load_config({"model": {"max_seq_len": 8192}}).train.seq_len == 2048  # capped default


def test_a_loaded_config_cannot_change():
    c = load_config({})
    with pytest.raises(dataclasses.FrozenInstanceError):
        c.train.lr = 1.0
    with pytest.raises(dataclasses.FrozenInstanceError):
        c.model = None


def test_replaced_gives_a_new_checked_config_and_leaves_the_old_one():
    c = load_config({})
    new = replaced(c, {"train.lr": 1e-3, "parallel.gpus": 8})
    assert (new.train.lr, new.parallel.gpus) == (1e-3, 8)
    assert (c.train.lr, c.parallel.gpus) == (3e-4, 1)
    with pytest.raises(ConfigError, match="parallel.gpus"):
        replaced(c, {"parallel.gpus": 3, "parallel.tensor": 2})


def test_untrained_values_come_from_the_keys_metadata():
    assert untrained(load_config({})) == []
    (line,) = untrained(load_config({"parallel": {"offload": "optimizer"}}))
    assert line.startswith("parallel.offload: optimizer is planned but not trained") and "none" in line
    assert "*Planner only beyond `none`" in docs_markdown()  # docs/config.md's table says the same


def test_the_package_root_hands_out_the_planner_without_shadowing_its_package():
    import pretrain
    import pretrain.plan

    assert callable(pretrain.make_plan) and pretrain.make_plan(load_config({}))["params"]["total"] > 0
    assert pretrain.plan.__name__ == "pretrain.plan"  # the package, not a function of the same name


@pytest.mark.parametrize(
    "text, value",
    [
        ("15T", 15 * 10**12),
        ("1.5B", 1_500_000_000),
        ("32k", 32_000),
        ("4M", 4_000_000),
        ("2_000", 2000),
        ("4e9", 4 * 10**9),
    ],
)
def test_counts_take_the_papers_suffixes(text, value):
    # Llama 3 trained on "15T tokens" (Dubey et al. 2024, sec. 3.1): a count is written the way papers write it.
    assert load_config(overrides=[f"train.tokens={text}"]).train.tokens == value
    assert load_config({"train": {"tokens": text}}).train.tokens == value  # a YAML file reads the same


@pytest.mark.parametrize("text", ["1.5Q", "1.2345K", "K", "15 TB"])
def test_a_count_that_is_not_whole_is_one_line(text):
    with pytest.raises(ConfigError, match=r"train.tokens: expected a whole number .*15T"):
        load_config(overrides=[f"train.tokens={text}"])


def test_a_ramp_that_starts_above_its_batch_is_refused():
    # 4 x 128 x 2 = 1,024 tokens per step: a ramp from 32K would be no ramp at all, silently.
    base = [
        "model.max_seq_len=128",
        "train.seq_len=128",
        "train.micro_batch_size=4",
        "train.grad_accum_steps=2",
        "train.batch_ramp_tokens=1e6",
    ]
    with pytest.raises(ConfigError, match=r"train.batch_ramp_start: 32,768 tokens is above the global batch 1,024"):
        load_config(overrides=base)
    assert load_config(overrides=[*base, "train.batch_ramp_start=256"]).train.batch_ramp_start == 256
    assert load_config(overrides=[*base, "parallel.gpus=32"]).train.batch_ramp_start == 32768  # 32K per step


def test_count_flags_take_suffixes_too():
    import argparse

    from pretrain.config.reading import count_argument

    assert count_argument("32K") == 32_000 and count_argument("2000") == 2000
    with pytest.raises(argparse.ArgumentTypeError, match="2K"):
        count_argument("2.5x")


def test_a_global_batch_fixes_accumulation_on_every_layout():
    # Llama 3 8B's 4M-token batch at seq 8192 (Dubey et al. 2024, table 4): 512 sequences per step.
    c = load_config(
        overrides=[
            "model.preset=llama3-8b",
            "train.seq_len=8192",
            "train.global_batch_tokens=4194304",
            "parallel.gpus=64",
        ]
    )
    assert c.train.grad_accum_steps == 8
    assert replaced(c, {"parallel.gpus": 512}).train.grad_accum_steps == 1
    assert replaced(c, {"parallel.gpus": 512, "parallel.tensor": 8}).train.grad_accum_steps == 8
    assert replaced(c, {"train.micro_batch_size": 2}).train.grad_accum_steps == 4


def test_a_global_batch_that_does_not_divide_is_one_line_with_the_nearest():
    with pytest.raises(
        ConfigError,
        match=r"train.global_batch_tokens: 4,000,000 is not a multiple of micro-batch 1 "
        r"x seq 8192 x 64 data-parallel ranks = 524,288 tokens; the nearest that "
        r"are: 3,670,016 or 4,194,304",
    ):
        load_config(
            overrides=[
                "model.preset=llama3-8b",
                "train.seq_len=8192",
                "train.global_batch_tokens=4M",
                "parallel.gpus=64",
            ]
        )
