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
