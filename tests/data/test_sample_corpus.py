"""The sample corpus (Python's bundled documentation) and the light imports behind `pretrain --help`."""

from __future__ import annotations

import json
import subprocess
import sys

from pretrain.data import PreparedData, prepare, train_tokenizer, write_sample_corpus


def test_sample_corpus_is_deterministic_and_prepares(tmp_path):
    from pydoc_data.topics import topics

    path = write_sample_corpus(tmp_path / "a")
    assert path.read_bytes() == write_sample_corpus(tmp_path / "b").read_bytes()
    records = [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines()]
    assert [r["title"] for r in records] == sorted(topics) and records[0]["text"] == topics[records[0]["title"]]
    assert path.stat().st_size > 400_000  # ~465 KB of English on Python 3.11

    train_tokenizer([path], 400, tmp_path / "tok")
    meta = prepare([path], tmp_path / "tok", tmp_path / "data", val_fraction=0.1, workers=1)
    assert sum(meta["num_docs"].values()) == len(topics)
    assert PreparedData(tmp_path / "data").meta == meta


def test_cli_modules_import_neither_torch_nor_numpy():
    code = (
        "import sys, pretrain.data, pretrain.data.prepare_command, pretrain.data.tokenizer_command; "
        "print(sorted(m for m in ('torch', 'numpy', 'tokenizers', 'transformers') if m in sys.modules))"
    )
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert result.stdout.strip() == "[]"


def test_the_demo_corpus_adds_the_standard_librarys_docstrings(tmp_path):
    # The demo's 200 steps x 4,096 tokens read the topics alone ~7 times; the docstrings bring that near 2.
    topics = write_sample_corpus(tmp_path / "a")
    both = write_sample_corpus(tmp_path / "b", docstrings=True)
    assert both.read_bytes().startswith(topics.read_bytes()) and both.stat().st_size > 2 * topics.stat().st_size
    assert both.read_bytes() == write_sample_corpus(tmp_path / "c", docstrings=True).read_bytes()
    titles = [json.loads(line)["title"] for line in both.read_text(encoding="utf-8").splitlines()]
    assert "json" in titles and "collections" in titles
