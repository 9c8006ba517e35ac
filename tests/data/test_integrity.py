"""A prepared dataset is checked before training trusts it: meta.json's numbers are sane, the token files'
sha256 is compared by default (below data.verify's threshold, or always with data.verify=full), and a token
id outside the vocabulary is one line at the first read of its batch, not an IndexError inside the model."""

from __future__ import annotations

import shutil

import numpy as np
import pytest
from test_windows import SEQ, edit_meta, write_prepared

from pretrain.config import load_config
from pretrain.data import PreparedData, RandomWindows, SequentialWindows, loader, open_training_data
from pretrain.errors import ConfigError, UsageError
from support import run_here, tiny


def corrupt(path, offset: int, data: bytes) -> None:
    """Overwrite bytes in place: the size stays what meta.json says."""
    with open(path, "r+b") as f:
        f.seek(offset)
        f.write(data)


@pytest.mark.parametrize(
    "change, message",
    [
        (lambda m: m.update(vocab_size=-4), "vocab_size -4 is not a whole number in [1, 4,294,967,296]"),
        (lambda m: m.update(vocab_size=0), "vocab_size 0 is not"),
        (lambda m: m.update(vocab_size="512"), "vocab_size '512' is not"),
        (lambda m: m.update(vocab_size=True), "vocab_size True is not"),
        (
            lambda m: m.update(dtype="uint16", vocab_size=70_000),
            "vocab_size 70000 is not a whole number in [1, 65,536]",
        ),
        (lambda m: m.update(eos_id=99_999, vocab_size=512), "eos_id 99999 is outside the vocabulary [0, 512)"),
        (lambda m: m.update(eos_id=-1), "eos_id -1 is outside"),
        (lambda m: m.update(eos_id="x" * 1000), "eos_id 'xxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxx... is outside"),
        (lambda m: m["num_docs"].update(val=1.5), "num_docs.val 1.5 is not a count"),
    ],
)
def test_meta_json_values_are_checked_in_one_line(tmp_path, change, message):
    folder = write_prepared(tmp_path / "d", SEQ * 101 + 1, 43)
    edit_meta(folder, change)
    with pytest.raises(UsageError) as error:
        PreparedData(folder)
    text = str(error.value)
    assert message in text and str(folder / "meta.json") in text and "\n" not in text and len(text) < 300, text


def test_checksums_by_default_below_the_threshold_and_on_request_above(tmp_path, monkeypatch):
    folder = write_prepared(tmp_path / "d", 100, 20)
    corrupt(folder / "train.bin", 17, b"\x01")  # same size, one byte changed: the id stays inside the vocabulary
    with pytest.raises(UsageError, match="train.bin: sha256 differs from meta.json"):
        PreparedData(folder)  # auto: 480 bytes is below the threshold
    PreparedData(folder, verify="size")
    monkeypatch.setattr(loader, "VERIFY_AUTO_BYTES", 100)  # as if the dataset were larger than the threshold
    PreparedData(folder)
    with pytest.raises(UsageError, match="train.bin: sha256 differs"):
        PreparedData(folder, verify="full")
    with pytest.raises(ConfigError, match="data.verify: 'some' is unknown"):
        PreparedData(folder, verify="some")


def test_data_verify_is_a_config_key():
    assert load_config().data.verify == "auto"
    assert load_config(overrides=["data.verify=full"]).data.verify == "full"
    with pytest.raises(ConfigError, match="data.verify"):
        load_config(overrides=["data.verify=sometimes"])


@pytest.mark.parametrize("split", ["train", "val"])
def test_a_token_id_outside_the_vocabulary_is_one_line_at_its_first_read(tmp_path, split):
    folder = write_prepared(tmp_path / "d", SEQ * 101 + 1, SEQ * 5 + 3)
    edit_meta(folder, lambda m: m.update(vocab_size=1000))  # ids 0..808 in train, 0..42 in val: all inside
    corrupt(folder / f"{split}.bin", 4 * 20, np.array([70_000], dtype="<u4").tobytes())  # token 20, window 2
    data = PreparedData(folder, verify="size")  # what a large dataset gets by default: sizes only
    with pytest.raises(UsageError) as error:
        if split == "train":
            loader_ = RandomWindows(data, "train", SEQ, seed=0)
            for _ in range(101):
                loader_.next_batch(4)
        else:
            list(SequentialWindows(data, "val", SEQ).batches(batch_size=2, num_batches=10))
    text = str(error.value)
    assert f"{split}.bin: token id 70,000 at token 20 is outside the vocabulary of 1,000" in text and "\n" not in text


def test_open_training_data_checks_the_model_vocabulary(tmp_path):
    folder = write_prepared(tmp_path / "d", 100, 20)
    assert open_training_data(folder, "full", model_vocab_size=100_000).vocab_size == 100_000
    with pytest.raises(
        ConfigError,
        match="model.vocab_size: 512 is smaller than the vocabulary of .* "
        r"\(100000\); set model.vocab_size=100000 or more",
    ):
        open_training_data(folder, "auto", model_vocab_size=512)


@pytest.mark.parametrize(
    "damage, message",
    [
        (lambda d: corrupt(d / "train.bin", 64, b"\xff\xff"), "train.bin: sha256 differs from meta.json"),
        (lambda d: edit_meta(d, lambda m: m.update(vocab_size=-4)), "vocab_size -4 is not a whole number"),
        (lambda d: edit_meta(d, lambda m: m.update(eos_id=99_999)), "eos_id 99999 is outside the vocabulary"),
    ],
)
def test_train_refuses_a_damaged_dataset_in_one_line(prepared, tmp_path, damage, message):
    data = tmp_path / "data"
    shutil.copytree(prepared, data)
    damage(data)
    r = run_here("train", *tiny(data, tmp_path / "run"))
    lines = r.stderr.strip().splitlines()
    assert r.returncode == 2 and len(lines) == 1 and message in lines[0], r.stderr[-2000:]
