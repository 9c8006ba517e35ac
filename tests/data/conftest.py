"""Fixtures for the data-stage tests: the real corpora beside the repository, small slices of them, a small
byte-level BPE trained on both, and `python -m pretrain` as a subprocess."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

os.environ["HF_HUB_OFFLINE"] = "1"  # every tokenizer here is local; a hub lookup would be a bug

SHARED_DATA = Path(__file__).resolve().parents[2].parent / "shared" / "data"


def shared(name: str) -> Path:
    path = SHARED_DATA / name
    if not path.exists():
        pytest.skip(f"{path} not available (the shared corpora live beside the repository)")
    return path


@pytest.fixture(scope="session")
def shakespeare() -> Path:
    return shared("tinyshakespeare.txt")


@pytest.fixture(scope="session")
def zh_classics() -> Path:
    return shared("zh_classics.jsonl")


@pytest.fixture(scope="session")
def small_corpus(tmp_path_factory, shakespeare, zh_classics) -> Path:
    """A directory with the first 60 KB of tinyshakespeare and the first 300 zh_classics records."""
    folder = tmp_path_factory.mktemp("corpus")
    text = shakespeare.read_text(encoding="utf-8")[:60_000]
    (folder / "shakespeare.txt").write_text(text[: text.rindex("\n\n")] + "\n", encoding="utf-8")
    with open(zh_classics, encoding="utf-8") as f:
        lines = [next(f) for _ in range(300)]
    (folder / "zh.jsonl").write_text("".join(lines), encoding="utf-8")
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
        return subprocess.run([sys.executable, "-m", "pretrain", *map(str, args)], capture_output=True,
                              text=True, timeout=timeout)
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
