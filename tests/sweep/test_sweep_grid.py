"""The grid: which items are swept, and the cells they make (pure Python, no torch)."""

import pytest

from pretrain.errors import UsageError
from pretrain.sweep.grid import cell_overrides, cells, is_list_key, parse_items


def test_comma_lists_are_swept_and_the_rest_fixed():
    path, fixed, swept = parse_items(
        ["base.yaml", "model.preset=debug", "train.seq_len=256,1024,4096", "train.micro_batch_size=1,8"]
    )
    assert path == "base.yaml"
    assert fixed == ["model.preset=debug"]
    assert swept == {"train.seq_len": ["256", "1024", "4096"], "train.micro_batch_size": ["1", "8"]}


def test_list_typed_keys_keep_their_comma_syntax():
    assert is_list_key("train.betas") and is_list_key("debug.inject_nan_batches")
    assert not is_list_key("train.seq_len") and not is_list_key("nosuch.key")
    _, fixed, swept = parse_items(["train.betas=0.9,0.95", "train.seq_len=32,64"])
    assert fixed == ["train.betas=0.9,0.95"]
    assert list(swept) == ["train.seq_len"]


def test_no_config_file_and_nothing_swept_is_one_cell():
    path, fixed, swept = parse_items(["train.seq_len=32"])
    assert path is None and fixed == ["train.seq_len=32"] and swept == {}
    assert cells(swept) == [{}]


def test_a_later_item_replaces_an_earlier_one():
    _, fixed, swept = parse_items(["train.seq_len=32,64", "train.seq_len=128"])
    assert fixed == ["train.seq_len=128"] and swept == {}


def test_cells_are_the_product_first_key_slowest():
    grid = cells({"train.seq_len": ["32", "64", "128"], "train.micro_batch_size": ["1", "4"]})
    assert len(grid) == 6
    assert grid[0] == {"train.seq_len": "32", "train.micro_batch_size": "1"}
    assert grid[1] == {"train.seq_len": "32", "train.micro_batch_size": "4"}
    assert grid[-1] == {"train.seq_len": "128", "train.micro_batch_size": "4"}


def test_values_are_stripped_and_duplicates_dropped():
    _, _, swept = parse_items(["train.seq_len=32, 64,32"])
    assert swept == {"train.seq_len": ["32", "64"]}


@pytest.mark.parametrize("item", ["train.seq_len=32,", "train.seq_len=,32", "train.seq_len=32,,64"])
def test_an_empty_value_names_the_key(item):
    with pytest.raises(UsageError, match="train.seq_len"):
        parse_items([item])


def test_cell_overrides_write_values_as_a_command_line_does():
    assert cell_overrides({"train.compile": False, "train.tokens": None, "train.seq_len": 64}) == [
        "train.compile=false",
        "train.tokens=null",
        "train.seq_len=64",
    ]
