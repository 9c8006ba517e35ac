"""Fixtures for the data-stage tests: slices of the two sample corpora vendored in tests/fixtures/ (its README
gives their source and licence), a small byte-level BPE trained on both, and `python -m pretrain` as a
subprocess."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

os.environ["HF_HUB_OFFLINE"] = "1"  # every tokenizer here is local; a hub lookup would be a bug

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures"


@pytest.fixture(scope="session")
def shakespeare() -> Path:
    """The first 59,804 bytes of tinyshakespeare, cut at a blank line (415 speeches)."""
    return FIXTURES / "tinyshakespeare_head.txt"


@pytest.fixture(scope="session")
def zh_classics() -> Path:
    """Every 25th record of zh_classics.jsonl (292 records, prose, poems and classics)."""
    return FIXTURES / "zh_classics_sample.jsonl"


@pytest.fixture(scope="session")
def small_corpus(tmp_path_factory, shakespeare, zh_classics) -> Path:
    """A directory holding both slices, as a user's corpus folder would."""
    folder = tmp_path_factory.mktemp("corpus")
    shutil.copyfile(shakespeare, folder / "shakespeare.txt")
    shutil.copyfile(zh_classics, folder / "zh.jsonl")
    return folder


@pytest.fixture(scope="session")
def bpe_dir(tmp_path_factory, small_corpus) -> Path:
    """A 600-token byte-level BPE trained on the small corpus (English and Chinese)."""
    from pretrain.data import train_tokenizer

    out = tmp_path_factory.mktemp("bpe")
    train_tokenizer([small_corpus], 600, out, split_blank_lines=True)
    return out


@pytest.fixture
def cli():
    """run(*args): `python -m pretrain ARGS` in a fresh interpreter, as a user runs it."""

    def run(*args, timeout=300) -> subprocess.CompletedProcess:
        return subprocess.run(
            [sys.executable, "-m", "pretrain", *map(str, args)], capture_output=True, text=True, timeout=timeout
        )

    return run


@pytest.fixture
def jsonl():
    """write(path, records): one record per line; dicts are dumped as JSON, bytes written as they are."""

    def write(path: Path, records) -> Path:
        with open(path, "wb") as f:
            for record in records:
                f.write(record if isinstance(record, bytes) else json.dumps(record, ensure_ascii=False).encode())
                f.write(b"\n")
        return path

    return write
