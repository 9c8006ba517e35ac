"""A small prepared dataset every machine can build: Python's bundled documentation, a 512-token BPE."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")


@pytest.fixture(scope="session")
def prepared(tmp_path_factory):
    from pretrain.data import prepare, train_tokenizer, write_sample_corpus

    root = tmp_path_factory.mktemp("sample")
    corpus = write_sample_corpus(root / "corpus")
    train_tokenizer([str(corpus)], 512, root / "tokenizer")
    prepare([str(corpus)], str(root / "tokenizer"), root / "data", val_fraction=0.1, workers=1)
    return root / "data"

