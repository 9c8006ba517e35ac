"""`pretrain tokenizer stats`: characters, bytes and tokens per GB for two tokenizers trained here, on the
English sample corpus (Python's bundled docs) and on vendored classical Chinese (tests/fixtures/README.md)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from pretrain.data import find_tokenizer, train_tokenizer, write_sample_corpus
from pretrain.data.tokenizer_stats import tokenizer_stats
from support import run_cli

ZH = Path(__file__).resolve().parents[1] / "fixtures" / "zh_lunyu.jsonl"


@pytest.fixture(scope="module")
def corpora(tmp_path_factory) -> dict:
    """An English-only 300-token BPE and a 1,000-token BPE that has also seen the Chinese text."""
    root = tmp_path_factory.mktemp("stats")
    english = write_sample_corpus(root / "en")
    train_tokenizer([str(english)], 300, root / "en_bpe")
    train_tokenizer([str(english), str(ZH)], 1000, root / "zh_bpe")
    return {"en": english, "en_bpe": root / "en_bpe", "zh_bpe": root / "zh_bpe"}


def test_json_contract_and_the_figures_behind_it(corpora):
    r = run_cli("tokenizer", "stats", "--tokenizer", corpora["en_bpe"], corpora["zh_bpe"], "--input", ZH, "--json")
    assert r.returncode == 0, r.stderr
    stats = json.loads(r.stdout)
    first, second = stats["tokenizers"]
    assert {"path", "chars_per_token", "bytes_per_token", "tokens_per_gb", "compression_vs_first"} <= set(first)
    assert first["path"] == str(corpora["en_bpe"]) and first["compression_vs_first"] == 1.0
    # The figures are the sample's own counts: every document of the fixture, encoded whole.
    texts = [json.loads(line) for line in ZH.read_text(encoding="utf-8").splitlines()]
    assert stats["sample"]["documents"] == len(texts) == 3
    for row in (first, second):
        ids = sum(len(find_tokenizer(row["path"]).load().encode(t).ids) for t in _documents(ZH))
        assert row["tokens"] == ids
        assert row["bytes_per_token"] == pytest.approx(stats["sample"]["bytes"] / ids)
        assert row["chars_per_token"] == pytest.approx(stats["sample"]["chars"] / ids)
        assert row["tokens_per_gb"] == pytest.approx(1e9 / row["bytes_per_token"])
    # A byte-level BPE that never saw Chinese spends ~1 token per UTF-8 byte (3 bytes per character); the one
    # trained on it merges characters and needs far fewer tokens for the same text.
    assert first["bytes_per_token"] < 1.2
    assert second["compression_vs_first"] == pytest.approx(second["bytes_per_token"] / first["bytes_per_token"])
    assert second["compression_vs_first"] > 1.5


def test_english_table_and_the_document_bound(corpora):
    r = run_cli(
        "tokenizer",
        "stats",
        "--tokenizer",
        corpora["en_bpe"],
        corpora["zh_bpe"],
        "--input",
        corpora["en"],
        "--max-docs",
        "5",
    )
    assert r.returncode == 0, r.stderr
    lines = r.stdout.splitlines()
    assert lines[0].startswith("5 documents (")
    assert lines[2].split() == [
        "tokenizer",
        "tokens",
        "chars/token",
        "bytes/token",
        "tokens",
        "per",
        "GB",
        "vs",
        "first",
    ]
    assert lines[3].split()[0] == str(corpora["en_bpe"]) and lines[3].endswith("1.000x")
    # Both learned English merges, the second more of them: more than a character per token on ASCII text,
    # and fewer tokens for the larger vocabulary.
    stats = tokenizer_stats([corpora["en_bpe"], corpora["zh_bpe"]], [corpora["en"]], max_docs=5)
    first, second = stats["tokenizers"]
    assert first["chars_per_token"] > 1 and second["compression_vs_first"] > 1
    assert stats["sample"]["documents"] == 5


def test_a_missing_tokenizer_is_one_line_before_reading(tmp_path, corpora):
    r = run_cli("tokenizer", "stats", "--tokenizer", corpora["en_bpe"], tmp_path / "nope", "--input", ZH)
    assert r.returncode == 2
    assert r.stderr.count("\n") == 1 and "nope not found" in r.stderr


def _documents(path: Path) -> list[str]:
    from pretrain.data.readers import Corpus
    from pretrain.data.sources import find_files

    return [record.text for record in Corpus(find_files([path]))]
