"""prepare on bad input: skipped and counted records, --strict, usage errors through the real CLI, and an
interrupted run that leaves no meta.json."""

from __future__ import annotations

import gzip
import json

import numpy as np
import pytest

from pretrain.data import PreparedData, find_tokenizer, preparation, prepare
from pretrain.errors import UsageError


@pytest.fixture
def bad_corpus(tmp_path, jsonl):
    """Two valid documents around one of each bad record, plus an unreadable file."""
    folder = tmp_path / "bad"
    folder.mkdir()
    jsonl(
        folder / "a.jsonl",
        [
            {"text": "first good"},
            b"{not json",
            {"title": "no text"},
            b'{"text": "\xff"}',
            {"text": ""},
            {"text": "second good"},
        ],
    )
    (folder / "b.jsonl.gz").write_bytes(b"corrupt")
    return folder


def test_bad_records_are_skipped_counted_and_reported(tmp_path, bad_corpus, bpe_dir, cli):
    result = cli(
        "prepare",
        "--input",
        bad_corpus,
        "--tokenizer",
        bpe_dir,
        "--out",
        tmp_path / "out",
        "--val-fraction",
        0,
        "--workers",
        1,
    )
    assert result.returncode == 0, result.stderr
    meta = json.loads((tmp_path / "out" / "meta.json").read_text())
    assert meta["skipped"] == {"invalid_json": 1, "missing_field": 1, "invalid_utf8": 1, "empty": 1, "unreadable": 1}
    assert "skipped 5 bad records" in result.stdout
    assert f"{bad_corpus / 'a.jsonl'}:2: malformed JSON" in result.stdout  # file:line: reason
    assert f"{bad_corpus / 'b.jsonl.gz'}: unreadable file" in result.stdout
    # Nothing valid lost to its bad neighbours.
    data = PreparedData(tmp_path / "out")
    tokenizer = find_tokenizer(bpe_dir).load()
    tokens = np.asarray(data.tokens("train")).tolist()
    assert tokenizer.decode(tokens, skip_special_tokens=False) == "first good<eos>second good<eos>"


def test_strict_stops_at_the_first_bad_record(tmp_path, bad_corpus, bpe_dir, cli):
    result = cli("prepare", "--input", bad_corpus, "--tokenizer", bpe_dir, "--out", tmp_path / "out", "--strict")
    assert result.returncode == 2
    assert result.stderr.strip().splitlines() == [
        f"pretrain prepare: error: {bad_corpus / 'a.jsonl'}:2: malformed JSON (Expecting property name enclosed in "
        "double quotes) (--strict stops at the first bad record; without it bad records are skipped and counted)"
    ]
    assert not (tmp_path / "out" / "meta.json").exists()
    assert not list((tmp_path / "out").glob("*.tmp"))


@pytest.fixture(scope="module")
def huge_vocab(tmp_path_factory) -> str:
    """A word-level tokenizer with 70,000 ids: more than uint16 holds."""
    from tokenizers import Tokenizer, models, pre_tokenizers

    vocab = {"<eos>": 0, **{f"w{i}": i + 1 for i in range(69_999)}}
    path = tmp_path_factory.mktemp("huge") / "tokenizer.json"
    tokenizer = Tokenizer(models.WordLevel(vocab, unk_token="<eos>"))
    tokenizer.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    tokenizer.add_special_tokens(["<eos>"])  # prepare takes only a special end-of-document token
    tokenizer.save(str(path))
    return str(path)


@pytest.mark.parametrize(
    "case", ["missing input", "no files", "unknown tokenizer", "uint16 overflow", "bad val fraction", "out is a file"]
)
def test_usage_errors_are_one_line_and_exit_2(case, tmp_path, small_corpus, bpe_dir, huge_vocab, cli):
    (tmp_path / "empty").mkdir()
    (tmp_path / "afile").write_text("")
    args, expected = {
        "missing input": (["--input", tmp_path / "nope.jsonl"], "nope.jsonl does not exist"),
        "no files": (["--input", tmp_path / "empty"], "no corpus files matched"),
        "unknown tokenizer": (["--tokenizer", tmp_path / "tok"], "tokenizer /"),
        "uint16 overflow": (["--tokenizer", huge_vocab, "--dtype", "uint16"], "cannot hold a vocabulary of 70,000"),
        "bad val fraction": (["--val-fraction", 1.5], "--val-fraction 1.5 is out of range"),
        "out is a file": (["--out", tmp_path / "afile"], "afile is a file, not a directory"),
    }[case]
    defaults = {"--input": small_corpus, "--tokenizer": bpe_dir, "--out": tmp_path / "out"}
    for flag, value in defaults.items():
        if flag not in args:
            args += [flag, value]
    result = cli("prepare", *args)
    assert result.returncode == 2
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("pretrain prepare: error: ") and expected in lines[0], lines
    assert not (tmp_path / "out").exists()  # refused before any work


def test_uint16_overflow_auto_picks_uint32(tmp_path, huge_vocab, jsonl):
    corpus = jsonl(tmp_path / "c.jsonl", [{"text": "w69998 w5"}])
    meta = prepare([corpus], huge_vocab, tmp_path / "out", val_fraction=0, workers=1)
    assert meta["dtype"] == "uint32"
    assert np.asarray(PreparedData(tmp_path / "out").tokens("train")).tolist() == [69_999, 6, 0]


def test_interrupted_run_keeps_the_old_dataset_and_a_rerun_succeeds(tmp_path, small_corpus, bpe_dir, monkeypatch):
    out = tmp_path / "out"
    prepare([small_corpus], bpe_dir, out, workers=1, val_fraction=0.5)  # a finished dataset, to be replaced
    old_meta = (out / "meta.json").read_text()
    real_chunks = preparation._chunks

    def interrupted(corpus, skips):
        for i, chunk in enumerate(real_chunks(corpus, skips)):
            if i == 1:
                raise KeyboardInterrupt  # Ctrl-C part-way through
            yield chunk

    monkeypatch.setattr(preparation, "CHUNK_CHARS", 10_000)
    monkeypatch.setattr(preparation, "_chunks", interrupted)
    with pytest.raises(KeyboardInterrupt):
        prepare([small_corpus], bpe_dir, out, workers=2)
    assert (out / "meta.json").read_text() == old_meta  # the new dataset was never swapped in
    PreparedData(out, verify="full")
    assert sorted(p.name for p in tmp_path.iterdir()) == [".out.lock", "out"]  # nothing half-built beside it
    monkeypatch.undo()
    prepare([small_corpus], bpe_dir, out, workers=1)
    PreparedData(out, verify="full")


def test_empty_corpus_is_an_error(tmp_path, bpe_dir, jsonl):
    corpus = jsonl(tmp_path / "c.jsonl", [{"text": ""}, b"oops"])
    with pytest.raises(UsageError, match=r"no documents in .*skipped 2 records: 1 malformed JSON, 1 empty"):
        prepare([corpus], bpe_dir, tmp_path / "out", workers=1)
    assert not (tmp_path / "out" / "meta.json").exists()


def test_gzip_and_bad_arguments(tmp_path, bpe_dir):
    (tmp_path / "c.jsonl.gz").write_bytes(gzip.compress(b'{"text": "zipped"}\n'))
    with pytest.raises(UsageError, match="--workers 0"):
        prepare([tmp_path], bpe_dir, tmp_path / "out", workers=0)
    with pytest.raises(UsageError, match="unknown format"):
        prepare([tmp_path], bpe_dir, tmp_path / "out", format="xml")
    assert prepare([tmp_path], bpe_dir, tmp_path / "out", workers=1, val_fraction=0)["num_docs"]["train"] == 1
