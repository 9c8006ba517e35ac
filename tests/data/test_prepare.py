"""prepare: <eos> framing, document index, determinism (workers, fast path, chunking), split, meta.json."""

from __future__ import annotations

import json

import numpy as np
import pytest

from pretrain.data import PreparedData, find_tokenizer, preparation, prepare
from pretrain.data.readers import Corpus, ReadOptions
from pretrain.data.sources import find_files
from pretrain.plan.length import storage_bytes

OUTPUT_FILES = ("train.bin", "val.bin", "train.idx.npy", "val.idx.npy", "meta.json", "tokenizer/tokenizer.json")


def documents_of(data: PreparedData, split: str) -> list[np.ndarray]:
    tokens, starts = np.asarray(data.tokens(split)), np.asarray(data.doc_starts(split))
    return np.split(tokens, starts[1:])


@pytest.fixture(scope="module")
def prepared(tmp_path_factory, small_corpus, bpe_dir):
    out = tmp_path_factory.mktemp("prepared")
    meta = prepare([small_corpus], bpe_dir, out, val_fraction=0.2, workers=1, split_blank_lines=True)
    return out, meta


def test_every_document_ends_with_exactly_one_eos(prepared, small_corpus, bpe_dir):
    out, meta = prepared
    data = PreparedData(out, verify="full")
    tokenizer = find_tokenizer(bpe_dir).load()
    source = [r.text for r in Corpus(find_files([small_corpus]), ReadOptions(split_blank_lines=True))]
    decoded = []
    for split in ("train", "val"):
        tokens = np.asarray(data.tokens(split))
        assert (tokens == data.eos_id).sum() == meta["num_docs"][split] > 0
        starts = np.asarray(data.doc_starts(split))
        assert starts[0] == 0 and (tokens[starts[1:] - 1] == data.eos_id).all()  # each start follows an <eos>
        for doc in documents_of(data, split):
            assert doc[-1] == data.eos_id and data.eos_id not in doc[:-1]
            decoded.append(tokenizer.decode(doc[:-1].tolist(), skip_special_tokens=False))
    assert sorted(decoded) == sorted(source)  # every document, exactly, once


def test_meta_and_planner_storage(prepared, bpe_dir):
    out, meta = prepared
    for key in (
        "dtype",
        "vocab_size",
        "eos_id",
        "tokenizer_sha256",
        "num_tokens",
        "num_docs",
        "skipped",
        "files",
        "chars_per_token",
        "bytes_per_token",
        "sha256",
        "seed",
        "val_fraction",
        "version",
    ):
        assert key in meta
    assert json.loads((out / "meta.json").read_text()) == meta
    assert (meta["dtype"], meta["vocab_size"], meta["eos_id"]) == ("uint16", 600, 0)
    total = sum(meta["num_tokens"].values())
    on_disk = (out / "train.bin").stat().st_size + (out / "val.bin").stat().st_size
    assert on_disk == storage_bytes(total, meta["vocab_size"]) == 2 * total
    text_tokens = total - sum(meta["num_docs"].values())
    assert meta["bytes_per_token"] == pytest.approx(meta["text_bytes"] / text_tokens)
    assert meta["encoder"]["name"] == "tokenizers"  # the default: tokens by construction
    for name in ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json"):
        assert (out / "tokenizer" / name).read_bytes() == (bpe_dir / name).read_bytes()
    assert PreparedData(out).tokenizer_dir == out / "tokenizer"


def test_split_is_by_document_and_follows_the_seed(prepared, small_corpus, bpe_dir, tmp_path):
    out, meta = prepared
    docs = sum(meta["num_docs"].values())
    assert 0.1 < meta["num_docs"]["val"] / docs < 0.3  # val_fraction 0.2 of ~700 documents
    other = prepare([small_corpus], bpe_dir, tmp_path, val_fraction=0.2, workers=1, seed=7, split_blank_lines=True)
    assert other["num_docs"] != meta["num_docs"] or other["sha256"] != meta["sha256"]
    assert sum(other["num_docs"].values()) == docs


def test_same_bytes_for_any_workers_chunking_and_encoder(tmp_path, small_corpus, bpe_dir, monkeypatch):
    # Small chunks so that documents cross many chunk (and worker) boundaries.
    monkeypatch.setattr(preparation, "CHUNK_CHARS", 20_000)
    runs = {"1 worker": dict(workers=1), "2 workers": dict(workers=2), "fast path": dict(workers=2, fast_path=True)}
    for name, options in runs.items():
        prepare([small_corpus], bpe_dir, tmp_path / name, val_fraction=0.1, split_blank_lines=True, **options)
    for file in OUTPUT_FILES:
        contents = {name: (tmp_path / name / file).read_bytes() for name in runs}
        if file == "meta.json":  # identical but for how the tokens were computed
            contents = {k: json.dumps({**json.loads(v), "encoder": None}) for k, v in contents.items()}
        assert len(set(contents.values())) == 1, file


def test_fast_path_falls_back_when_it_disagrees(tmp_path, jsonl):
    # Merge rules b+c, a+b, ab+c (ids in merge order): on "abc" tokenizers gives a|bc, tiktoken abc.
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers

    from pretrain.data.fast_bpe import byte_decoder

    alphabet = sorted(byte_decoder())
    vocab = {"<eos>": 0, **{c: i + 1 for i, c in enumerate(alphabet)}}
    vocab.update({"bc": 257, "ab": 258, "abc": 259})
    tokenizer = Tokenizer(models.BPE(vocab, [("b", "c"), ("a", "b"), ("ab", "c")]))
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    tokenizer.add_special_tokens(["<eos>"])
    tokenizer.save(str(tmp_path / "tokenizer.json"))
    corpus = jsonl(tmp_path / "c.jsonl", [{"text": "abc abc"}] * 40)

    meta = prepare([corpus], tmp_path / "tokenizer.json", tmp_path / "out", val_fraction=0, workers=1, fast_path=True)
    assert meta["encoder"]["name"] == "tokenizers"
    assert "disagreed" in meta["encoder"]["why_not_tiktoken"]
    tokens = np.fromfile(tmp_path / "out" / "train.bin", dtype="<u2")
    assert tokens[:5].tolist() == [vocab["a"], 257, vocab["Ġ"], vocab["a"], 257]  # tokenizers' a|bc


def test_special_token_text_is_not_a_separator(tmp_path, bpe_dir, jsonl):
    corpus = jsonl(tmp_path / "c.jsonl", [{"text": "a literal <eos> inside"}, {"text": "<eos><bos><pad>"}])
    meta = prepare([corpus], bpe_dir, tmp_path / "out", val_fraction=0, workers=1)
    tokens = np.fromfile(tmp_path / "out" / "train.bin", dtype="<u2")
    assert (tokens == 0).sum() == meta["num_docs"]["train"] == 2 and tokens[-1] == 0


def test_uint32_and_rerun_from_its_own_tokenizer_copy(tmp_path, small_corpus, bpe_dir):
    out = tmp_path / "out"
    first = prepare([small_corpus], bpe_dir, out, workers=1, dtype="uint32")
    assert first["dtype"] == "uint32"
    assert (out / "train.bin").stat().st_size == 4 * first["num_tokens"]["train"]
    # Re-running over the same directory, with the tokenizer copy inside it, starts over cleanly.
    second = prepare([small_corpus], out / "tokenizer", out, workers=1)
    assert second["dtype"] == "uint16" and second["num_tokens"] == first["num_tokens"]
    assert second["tokenizer_sha256"] == first["tokenizer_sha256"]
    assert sorted(p.name for p in out.iterdir()) == sorted({f.split("/")[0] for f in OUTPUT_FILES})
    PreparedData(out, verify="full")


def test_truncation_and_padding_of_a_tokenizer_json_are_ignored(tmp_path, bpe_dir, jsonl):
    from tokenizers import Tokenizer

    third_party = Tokenizer.from_file(str(bpe_dir / "tokenizer.json"))
    third_party.enable_truncation(max_length=4)
    third_party.enable_padding(pad_id=2, pad_token="<pad>")  # pads a batch to its longest document
    third_party.save(str(tmp_path / "tokenizer.json"))
    docs = ["a document of more than four tokens, encoded whole", "short"]
    corpus = jsonl(tmp_path / "c.jsonl", [{"text": d} for d in docs])
    prepare([corpus], tmp_path / "tokenizer.json", tmp_path / "out", val_fraction=0, workers=1)
    tokens = np.fromfile(tmp_path / "out" / "train.bin", dtype="<u2").tolist()
    assert 2 not in tokens  # no <pad>
    assert third_party.decode(tokens, skip_special_tokens=False) == "<eos>".join(docs) + "<eos>"
