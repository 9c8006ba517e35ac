"""Test-wide setup: no network, no hub downloads; a small prepared dataset every machine can build."""

import os
import tempfile

import pytest

os.environ.setdefault("HF_HUB_OFFLINE", "1")
# Two pytest workers share two cores: one OpenMP thread each (and in every subprocess they start), or idle
# OpenMP threads spin against each other and tiny CPU steps run 100x slower.
os.environ.setdefault("OMP_NUM_THREADS", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
# The trainer caches a CPU's measured matmul peak per machine: tests keep theirs out of the user's home.
os.environ["XDG_CACHE_HOME"] = tempfile.mkdtemp(prefix="pretrain-test-cache-")
# Inductor's FX-graph cache is not keyed by ATen's vector capability (torch 2.13): C++ code generated under
# AVX-512 is found again under ATEN_CPU_CAPABILITY=default, whose headers have no at::vec, and fails to build.
# One cache per capability, so the suite's second pass (README) makes its own; kept across runs, it stays warm.
os.environ.setdefault(
    "TORCHINDUCTOR_CACHE_DIR",
    os.path.join(
        tempfile.gettempdir(), f"torchinductor-{os.getuid()}-{os.environ.get('ATEN_CPU_CAPABILITY', 'native')}"
    ),
)


@pytest.fixture(scope="session")
def prepared(tmp_path_factory):
    """Python's bundled documentation, tokenized with a 512-token byte-level BPE (train.bin / val.bin)."""
    pytest.importorskip("torch")
    from pretrain.data import prepare, train_tokenizer, write_sample_corpus

    root = tmp_path_factory.mktemp("sample")
    corpus = write_sample_corpus(root / "corpus")
    train_tokenizer([str(corpus)], 512, root / "tokenizer")
    prepare([str(corpus)], str(root / "tokenizer"), root / "data", val_fraction=0.1, workers=1)
    return root / "data"


@pytest.fixture(scope="session")
def two_corpora(tmp_path_factory):
    """The two vendored samples (tests/fixtures/: English Shakespeare, classical Chinese) prepared as two
    directories with one shared 512-token BPE: the sources of a data.mixture."""
    pytest.importorskip("torch")
    from pathlib import Path

    from pretrain.data import prepare, train_tokenizer

    fixtures = Path(__file__).resolve().parent / "fixtures"
    english, chinese = fixtures / "tinyshakespeare_head.txt", fixtures / "zh_classics_sample.jsonl"
    root = tmp_path_factory.mktemp("mixture")
    train_tokenizer([str(english), str(chinese)], 512, root / "tokenizer", split_blank_lines=True)
    prepare(
        [str(english)],
        str(root / "tokenizer"),
        root / "shakespeare",
        val_fraction=0.1,
        workers=1,
        split_blank_lines=True,
    )
    prepare([str(chinese)], str(root / "tokenizer"), root / "zh", val_fraction=0.1, workers=1)
    return {"shakespeare": root / "shakespeare", "zh": root / "zh", "tokenizer": root / "tokenizer"}
