"""Readers: formats and their auto-detection, the encyclopedia rendering, bad records, file discovery."""

from __future__ import annotations

import gzip
import json
import re

import pytest

from pretrain.data.readers import Corpus, ReadOptions, Record, file_format, render_encyclopedia
from pretrain.data.sources import find_files
from pretrain.errors import UsageError

ENCYCLOPEDIA = {
    "title": "长城",
    "summary": "古代防御工程",
    "sections": [{"title": "历史", "content": "始建于春秋"}, {"title": "结构", "content": "城墙与关隘"}],
    "source": "ignored",
}


def records(paths, **options):
    return list(Corpus(find_files(paths), ReadOptions(**options)))


def texts(paths, **options):
    return [r.text for r in records(paths, **options)]


def test_encyclopedia_is_title_summary_then_sections():
    # The formula of the brief: title + "：" + summary, then section title + "：" + content + "。" per section.
    assert render_encyclopedia(ENCYCLOPEDIA) == "长城：古代防御工程历史：始建于春秋。结构：城墙与关隘。"
    assert render_encyclopedia({"title": "t", "summary": "s", "sections": []}) == "t：s"


def test_real_encyclopedia_file_is_detected_and_rendered(zh_classics):
    first = json.loads(zh_classics.open(encoding="utf-8").readline())
    expected = (
        first["title"]
        + "："
        + first["summary"]
        + "".join(s["title"] + "：" + s["content"] + "。" for s in first["sections"])
    )
    assert file_format(zh_classics, ReadOptions()) == "encyclopedia"
    docs = records([zh_classics])
    assert len(docs) == 292  # one per line (tests/fixtures/README.md: 292 lines, no empty records)
    assert docs[0].text == expected and docs[0].line == 1


def test_auto_detects_each_format(tmp_path, jsonl):
    import pyarrow as pa
    import pyarrow.parquet as pq
    import zstandard

    (tmp_path / "a.txt").write_text("plain text\n\nstill the same document\n", encoding="utf-8")
    jsonl(tmp_path / "b.jsonl", [{"text": "from jsonl", "id": 1}])
    jsonl(tmp_path / "c.jsonl", [ENCYCLOPEDIA])
    (tmp_path / "d.jsonl.gz").write_bytes(gzip.compress(b'{"text": "from gzip"}\n'))
    (tmp_path / "e.jsonl.zst").write_bytes(zstandard.ZstdCompressor().compress(b'{"text": "from zstd"}\n'))
    pq.write_table(pa.table({"text": ["from parquet", "second row"]}), tmp_path / "f.parquet")
    (tmp_path / "notes.md").write_text("not a corpus suffix: left out of a directory search")

    assert [file_format(p, ReadOptions()) for p in find_files([tmp_path])] == [
        "text",
        "jsonl",
        "encyclopedia",
        "jsonl",
        "jsonl",
        "parquet",
    ]
    assert texts([tmp_path]) == [
        "plain text\n\nstill the same document\n",
        "from jsonl",
        render_encyclopedia(ENCYCLOPEDIA),
        "from gzip",
        "from zstd",
        "from parquet",
        "second row",
    ]


def test_text_field_and_forced_format(tmp_path, jsonl):
    path = jsonl(tmp_path / "x.jsonl", [{"content": "a", "text": "b"}])
    assert texts([path], text_field="content") == ["a"]
    assert texts([path], format="text") == [path.read_text()]


def test_blank_line_blocks_are_documents(tmp_path):
    path = tmp_path / "speeches.txt"
    path.write_text("First:\nline one\n\n\nSecond:\n  \nThird\n", encoding="utf-8")
    docs = records([path], split_blank_lines=True)
    assert [(d.line, d.text) for d in docs] == [(1, "First:\nline one"), (5, "Second:"), (7, "Third")]


def test_shakespeare_blocks(shakespeare):
    docs = texts([shakespeare], split_blank_lines=True)
    assert docs[0] == "First Citizen:\nBefore we proceed any further, hear me speak."
    assert all(d.strip() and "\n\n" not in d for d in docs)
    # Nothing but the blank-line separators is dropped.
    assert docs == re.split(r"\n(?:[ \t]*\n)+", shakespeare.read_text(encoding="utf-8").rstrip("\n"))


def test_bad_records_are_reported_and_neighbours_kept(tmp_path, jsonl):
    path = jsonl(
        tmp_path / "bad.jsonl",
        [
            {"text": "good 1"},
            b'{"text": "unterminated',
            {"title": "no text field"},
            b'{"text": "caf\xe9"}',  # Latin-1 byte, not UTF-8
            {"text": ""},
            {"text": " \n\t"},
            b"[1, 2]",
            {"text": 5},
            b'{"text": "lone \\ud800 surrogate"}',
            {"text": "good 2"},
        ],
    )
    got = [(r.line, r.skip, r.text) for r in records([path])]
    assert got == [
        (1, None, "good 1"),
        (2, "invalid_json", None),
        (3, "missing_field", None),
        (4, "invalid_utf8", None),
        (5, "empty", None),
        (6, "empty", None),
        (7, "missing_field", None),
        (8, "missing_field", None),
        (9, "invalid_utf8", None),
        (10, None, "good 2"),
    ]
    assert records([path])[1].message().startswith(f"{path}:2: malformed JSON")


def test_invalid_utf8_in_text_skips_only_its_block(tmp_path):
    path = tmp_path / "mixed.txt"
    path.write_bytes(b"fine\n\nbroken \xff here\nmore\n\nalso fine\n")
    got = [(r.line, r.skip, r.text) for r in records([path], split_blank_lines=True)]
    assert got == [(1, None, "fine"), (3, "invalid_utf8", None), (6, None, "also fine")]


def test_unreadable_files_are_skipped(tmp_path):
    (tmp_path / "a.jsonl.gz").write_bytes(b"this is not gzip data")
    lines = b"".join(b'{"text": "line %d"}\n' % i for i in range(20000))
    damaged = gzip.compress(lines)
    (tmp_path / "b.jsonl.gz").write_bytes(damaged[: len(damaged) // 2])  # the stream stops half-way
    (tmp_path / "c.parquet").write_bytes(b"not parquet either")
    (tmp_path / "d.txt").write_text("still read")
    got = [(r.path.rsplit("/", 1)[1], r.skip) for r in records([tmp_path])]
    read_before_damage = got.count(("b.jsonl.gz", None))
    assert 0 < read_before_damage < 20000  # what decompressed before the damage is kept
    assert [g for g in got if g != ("b.jsonl.gz", None)] == [
        ("a.jsonl.gz", "unreadable"),
        ("b.jsonl.gz", "unreadable"),
        ("c.parquet", "unreadable"),
        ("d.txt", None),
    ]


def test_missing_parquet_column(tmp_path):
    import pyarrow as pa
    import pyarrow.parquet as pq

    pq.write_table(pa.table({"body": ["x"]}), tmp_path / "t.parquet")
    assert [r.skip for r in records([tmp_path / "t.parquet"])] == ["missing_field"]


def test_files_are_sorted_and_globs_expand(tmp_path):
    for name in ("b/2.txt", "a/9.txt", "a/10.txt", "c.jsonl"):
        (tmp_path / name).parent.mkdir(exist_ok=True)
        (tmp_path / name).write_text(name)
    names = [
        str(p.relative_to(tmp_path))
        for p in find_files([tmp_path / "b", str(tmp_path / "a" / "*.txt"), tmp_path / "a" / "9.txt"])
    ]
    assert names == ["a/10.txt", "a/9.txt", "b/2.txt"]  # sorted by path, each once


def test_missing_inputs_are_usage_errors(tmp_path):
    with pytest.raises(UsageError, match="does not exist"):
        find_files([tmp_path / "nope.jsonl"])
    with pytest.raises(UsageError, match="no corpus files matched"):
        find_files([str(tmp_path / "*.jsonl")])
    with pytest.raises(UsageError, match="unknown format"):
        Corpus([], ReadOptions(format="csv"))


def test_corrupt_gzip_block_is_unreadable(tmp_path):
    damaged = bytearray(gzip.compress(b'{"text": "never read"}\n' * 100))
    damaged[10:18] = b"\xff" * 8  # the first deflate block: zlib.error, not a gzip header error
    (tmp_path / "a.jsonl.gz").write_bytes(damaged)
    (tmp_path / "b.txt").write_text("still read")
    assert [(r.skip, r.text) for r in records([tmp_path])] == [("unreadable", None), (None, "still read")]


def zst_lines(count: int, start: int = 0) -> bytes:
    return b"".join(b'{"text": "line %d"}\n' % i for i in range(start, start + count))


def test_zstd_frames_and_a_file_cut_short(tmp_path):
    import zstandard

    compressor = zstandard.ZstdCompressor()
    # Two frames, each larger than a read step (compression.ZSTD_READ_BYTES), both read whole.
    whole = compressor.compress(zst_lines(5000)) + compressor.compress(zst_lines(5000, 5000))
    (tmp_path / "whole.jsonl.zst").write_bytes(whole)
    assert texts([tmp_path / "whole.jsonl.zst"]) == [f"line {i}" for i in range(10000)]
    # Cut at a block boundary inside the frame: 50 records decode cleanly, but the frame never ends.
    frame = compressor.compressobj()
    cut = frame.compress(zst_lines(50)) + frame.flush(zstandard.COMPRESSOBJ_FLUSH_BLOCK)
    (tmp_path / "cut.jsonl.zst").write_bytes(cut)
    got = records([tmp_path / "cut.jsonl.zst"])
    assert [r.text for r in got[:-1]] == [f"line {i}" for i in range(50)]  # what was read before the cut is kept
    assert got[-1].skip == "unreadable" and "EOFError" in got[-1].detail  # as gzip reports a cut file
    # Cut inside the second frame: the first frame's records, then unreadable.
    (tmp_path / "cut2.jsonl.zst").write_bytes(whole[: len(whole) - 100])
    got = records([tmp_path / "cut2.jsonl.zst"])
    assert 5000 <= len(got) - 1 < 10000 and got[-1].skip == "unreadable"


def test_json_nested_too_deeply_is_invalid_json(tmp_path, jsonl):
    deep = b"[" * 100_000 + b"]" * 100_000  # deeper than Python's recursion limit: RecursionError in json
    path = jsonl(tmp_path / "deep.jsonl", [deep, {"text": "fine"}])
    assert file_format(path, ReadOptions()) == "jsonl"  # the first record is skipped, not fatal
    assert [(r.skip, r.text) for r in records([path])] == [("invalid_json", None), (None, "fine")]


def test_a_leading_byte_order_mark_is_not_text(tmp_path):
    bom = b"\xef\xbb\xbf"
    (tmp_path / "a.jsonl").write_bytes(bom + b'{"text": "first"}\n{"text": "second"}\n')
    (tmp_path / "b.txt").write_bytes(bom + b"whole file\n")
    assert texts([tmp_path]) == ["first", "second", "whole file\n"]
    (tmp_path / "c.txt").write_bytes(bom + b"\n\nx\n")  # the BOM alone on a line: a blank line, not a document
    assert [(r.line, r.text) for r in records([tmp_path / "c.txt"], split_blank_lines=True)] == [(3, "x")]


def test_unicode_whitespace_lines_separate_blocks(tmp_path):
    path = tmp_path / "zh.txt"
    path.write_text("第一段\n\u3000\u3000\n第二段\n", encoding="utf-8")  # a line of two ideographic spaces
    assert texts([path], split_blank_lines=True) == ["第一段", "第二段"]


def test_a_file_named_twice_is_read_once(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "c.jsonl").write_text('{"text": "once"}\n')
    assert find_files(["c.jsonl", tmp_path / "c.jsonl", str(tmp_path / "*.jsonl"), tmp_path]) == [
        tmp_path / "c.jsonl"
    ]  # the first name in sorted order: the absolute one
    assert texts(["c.jsonl", tmp_path / "c.jsonl"]) == ["once"]


def test_an_existing_file_named_like_a_glob(tmp_path):
    (tmp_path / "part[1].jsonl").write_text('{"text": "bracketed"}\n')
    assert texts([tmp_path / "part[1].jsonl"]) == ["bracketed"]


def test_a_multi_line_detail_is_reported_on_one_line():
    # pyarrow's messages can span lines; --strict prints the message as its one-line error.
    record = Record("f.parquet", 0, None, "unreadable", "ArrowInvalid: bad file\nIn ../reader.cc\n  line 2")
    assert record.message() == "f.parquet: unreadable file (ArrowInvalid: bad file In ../reader.cc line 2)"


def test_fsspec_urls_are_read_as_their_local_files(tmp_path, shakespeare, bpe_dir, cli):
    # file:// goes through fsspec like hf:// or s3:// (listing, sizes, streaming opens) without a network
    import pyarrow as pa
    import pyarrow.feather
    import pyarrow.parquet

    speeches = shakespeare.read_text(encoding="utf-8").split("\n\n")
    corpus = tmp_path / "corpus"
    (corpus / "sub").mkdir(parents=True)
    (corpus / "a.txt").write_text("\n\n".join(speeches[:100]), encoding="utf-8")
    with gzip.open(corpus / "b.jsonl.gz", "wt", encoding="utf-8") as f:
        f.writelines(json.dumps({"text": s}) + "\n" for s in speeches[100:200])
    pyarrow.parquet.write_table(pa.table({"text": speeches[200:300]}), corpus / "sub" / "c.parquet")
    pyarrow.feather.write_feather(pa.table({"text": speeches[300:]}), corpus / "sub" / "d.arrow")
    outputs = {}
    for name, source in [("local", corpus), ("url", f"file://{corpus}"), ("glob", f"file://{corpus}/**")]:
        r = cli(
            "prepare",
            "--input",
            source,
            "--tokenizer",
            bpe_dir,
            "--out",
            tmp_path / name,
            "--split-blank-lines",
            "--workers",
            1,
        )
        assert r.returncode == 0, r.stderr
        outputs[name] = [(tmp_path / name / f"{s}.bin").read_bytes() for s in ("train", "val")]
    assert outputs["url"] == outputs["local"] == outputs["glob"]
    files = json.loads((tmp_path / "url" / "meta.json").read_text())["files"]
    assert [f["path"] for f in files] == [
        f"file://{corpus}/{n}" for n in ("a.txt", "b.jsonl.gz", "sub/c.parquet", "sub/d.arrow")
    ]

    r = cli("prepare", "--input", f"file://{tmp_path}/missing", "--tokenizer", bpe_dir, "--out", tmp_path / "x")
    assert r.returncode == 2 and "does not exist" in r.stderr and len(r.stderr.strip().splitlines()) == 1
