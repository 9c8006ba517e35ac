"""Tokenizer training: exact round trip on both real corpora, loadable by AutoTokenizer, found offline."""

from __future__ import annotations

import json

import pytest

from pretrain.data import find_tokenizer, train_tokenizer
from pretrain.data.readers import Corpus
from pretrain.data.sources import find_files
from pretrain.errors import UsageError

TRICKY = [
    "  leading spaces",
    "trailing\n\n",
    "tabs\tand\r\nCRLF",
    "emoji 🦜 and é",
    "literal <eos> and <pad>",
    "中文，全角标点：「引号」。",
    "",
    "\x00 control \x7f",
]


def test_round_trip_is_exact_on_both_corpora(bpe_dir, shakespeare, zh_classics):
    tokenizer = find_tokenizer(bpe_dir).load()
    zh = [r.text for r in Corpus(find_files([zh_classics]))]
    for text in [shakespeare.read_text(encoding="utf-8"), *zh, *TRICKY]:
        assert tokenizer.decode(tokenizer.encode(text).ids, skip_special_tokens=False) == text


def test_special_tokens_and_config_files(bpe_dir):
    spec = json.loads((bpe_dir / "tokenizer.json").read_text())
    assert [(t["id"], t["content"]) for t in spec["added_tokens"]] == [(0, "<eos>"), (1, "<bos>"), (2, "<pad>")]
    assert spec["normalizer"] is None and spec["pre_tokenizer"]["add_prefix_space"] is False
    config = json.loads((bpe_dir / "tokenizer_config.json").read_text())
    assert config["eos_token"] == "<eos>" and config["clean_up_tokenization_spaces"] is False
    assert json.loads((bpe_dir / "special_tokens_map.json").read_text())["pad_token"] == "<pad>"
    found = find_tokenizer(bpe_dir / "tokenizer.json")  # the file itself works as well as its directory
    assert (found.eos_id, found.vocab_size) == (0, 600)


def test_auto_tokenizer_loads_it_offline(bpe_dir, small_corpus):
    from transformers import AutoTokenizer

    hf = AutoTokenizer.from_pretrained(bpe_dir)  # HF_HUB_OFFLINE=1 (conftest): local files only
    ours = find_tokenizer(bpe_dir).load()
    assert (hf.eos_token_id, hf.bos_token_id, hf.pad_token_id) == (0, 1, 2)
    # Not the "literal <eos>" text: AutoTokenizer maps it to the special id, prepare keeps it as text.
    plain = [t for t in TRICKY if "<" not in t]
    for text in [*plain, (small_corpus / "shakespeare.txt").read_text(encoding="utf-8")[:5000]]:
        ids = hf(text)["input_ids"]
        assert ids == ours.encode(text).ids  # no <bos>/<eos> added by AutoTokenizer either
        assert hf.decode(ids) == text


def test_trained_on_the_documents_the_readers_give(tmp_path, jsonl):
    # 400 copies of one word: with min_frequency 2 its merges are learnt, so it encodes to one token.
    path = jsonl(tmp_path / "c.jsonl", [{"body": "pretraining"}] * 400 + [b"not json"])
    summary = train_tokenizer([path], 300, tmp_path / "tok", text_field="body")
    assert (summary["num_docs"], summary["skipped"]) == (400, {"invalid_json": 1})
    assert len(find_tokenizer(tmp_path / "tok").load().encode("pretraining").ids) == 1


def test_errors(tmp_path, small_corpus):
    with pytest.raises(UsageError, match="at least 259"):
        train_tokenizer([small_corpus], 100, tmp_path / "tok")
    with pytest.raises(UsageError, match="tokenizer .* not found"):
        find_tokenizer(tmp_path / "nowhere")
    (tmp_path / "broken.json").write_text("{}")
    with pytest.raises(UsageError, match="cannot be loaded"):
        find_tokenizer(tmp_path / "broken.json")
    (tmp_path / "empty.jsonl").write_text("\n")
    with pytest.raises(UsageError, match="no documents"):
        train_tokenizer([tmp_path / "empty.jsonl"], 300, tmp_path / "tok")


def test_cli(tmp_path, small_corpus, cli):
    result = cli(
        "tokenizer", "train", "--input", small_corpus / "zh.jsonl", "--vocab-size", 400, "--out", tmp_path / "tok"
    )
    assert result.returncode == 0, result.stderr
    assert "trained a 400-token byte-level BPE on 292 documents" in result.stdout
    assert sorted(p.name for p in (tmp_path / "tok").iterdir()) == [
        "special_tokens_map.json",
        "tokenizer.json",
        "tokenizer_config.json",
    ]


def test_bad_min_frequency_and_out_are_refused_before_training(tmp_path, small_corpus, cli):
    with pytest.raises(UsageError, match="--min-frequency -1 is negative"):
        train_tokenizer([small_corpus], 300, tmp_path / "tok", min_frequency=-1)
    (tmp_path / "afile").write_text("")
    result = cli("tokenizer", "train", "--input", small_corpus, "--vocab-size", 300, "--out", tmp_path / "afile")
    assert result.returncode == 2
    assert result.stderr.strip().splitlines() == [
        f"pretrain tokenizer: error: --out {tmp_path / 'afile'} is a file, "
        "not a directory; give a directory path (created if missing)"
    ]


@pytest.mark.parametrize(
    "config, message", [("{not json", "is not valid JSON"), ('["x"]', "holds an array, not an object")]
)
def test_malformed_tokenizer_config_names_the_file(tmp_path, bpe_dir, config, message):
    (tmp_path / "tokenizer.json").write_bytes((bpe_dir / "tokenizer.json").read_bytes())
    (tmp_path / "tokenizer_config.json").write_text(config)
    with pytest.raises(UsageError, match=f"{tmp_path / 'tokenizer_config.json'} {message}.*fix it or delete it"):
        find_tokenizer(tmp_path)


def test_an_eos_that_is_not_special_is_refused(tmp_path, bpe_dir):
    # A non-special added token matches its text inside documents: "<eos>" in a document would end it.
    spec = json.loads((bpe_dir / "tokenizer.json").read_text())
    for token in spec["added_tokens"]:
        token["special"] = False
    (tmp_path / "tokenizer.json").write_text(json.dumps(spec))
    with pytest.raises(UsageError, match=r"token '<eos>' is not a special token.*mark it \"special\": true"):
        find_tokenizer(tmp_path)
