"""Documents out of raw corpus files: plain text, JSONL (plain, .gz, .zst), encyclopedia JSONL, Parquet and Arrow
(Hugging Face `datasets`: a `save_to_disk` directory, or its .arrow files).

A reader never raises on bad content: a malformed line, a missing field, invalid UTF-8, an empty document or
an unreadable file becomes a `Record` with a `skip` reason, so the caller counts it (or, with --strict,
stops) and nothing valid is lost because of a bad neighbour. Files are read in sorted path order so the
document order, and hence every token file built from it, is the same on every run.
Pure Python apart from pyarrow (Parquet and Arrow) and zstandard (.zst only), imported when such a file is read.
A `datasets` directory is read with pyarrow directly, batch by batch: its .arrow files are Arrow IPC streams
(the format `datasets` writes), so no `datasets` install, and memory bounded by a batch.
"""

from __future__ import annotations

import contextlib
import io
import json
import zlib
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import NamedTuple

from ..errors import UsageError, json_kind
from .compression import check_codecs, decompressed
from .sources import RemoteFile, file_name, open_file

FORMATS = ("auto", "text", "jsonl", "encyclopedia", "parquet", "arrow")
SKIP_REASONS = {
    "invalid_json": "malformed JSON",
    "missing_field": "missing text field",
    "invalid_utf8": "invalid UTF-8",
    "empty": "empty document",
    "unreadable": "unreadable file",
}
PARQUET_BATCH_ROWS = 1024  # rows per Arrow batch: bounded memory whatever the file size (Parquet and Arrow)
# The largest document (a JSONL line, a text file or block) read: `tokenizers` holds ~90 bytes per input byte
# while encoding (pipeline.CHUNK_CHARS), so 32 MiB already takes ~3 GB. A larger one (or an endless input such
# as /dev/zero) is skipped as unreadable and the rest of its file with it, read in bounded memory.
MAX_DOCUMENT_BYTES = 32 << 20
BOM = b"\xef\xbb\xbf"  # a UTF-8 byte order mark (Windows editors write one): not part of the text


class Record(NamedTuple):
    """One document (`text`) or one skipped record (`skip` = a key of SKIP_REASONS)."""

    path: str
    line: int  # 1-based line (row for Parquet); 0 = the file as a whole
    text: str | None
    skip: str | None = None
    detail: str = ""

    def where(self) -> str:
        return f"{self.path}:{self.line}" if self.line else self.path

    def message(self) -> str:
        # one line: a detail may be a multi-line library message (pyarrow's), and --strict prints this
        assert self.skip is not None, "a skipped record's message"
        detail = f" ({' '.join(self.detail.split())})" if self.detail else ""
        return f"{self.where()}: {SKIP_REASONS[self.skip]}{detail}"


@dataclass(frozen=True)
class ReadOptions:
    format: str = "auto"  # one of FORMATS; auto decides per file from its suffix and first record
    text_field: str = "text"  # JSONL key / Parquet column holding the document
    split_blank_lines: bool = False  # .txt: one document per blank-line-separated block instead of per file


class Corpus:
    """The records of `files` in order; `bytes_read` says how far into the files (on disk) reading has got."""

    def __init__(self, files: list[Path | RemoteFile], options: ReadOptions = ReadOptions()):
        if options.format not in FORMATS:
            raise UsageError(f"unknown format {options.format!r}; use one of {' | '.join(FORMATS)}")
        check_codecs(files)
        self.files = files
        self.options = options
        self.sizes = [p.stat().st_size for p in files]
        self.total_bytes = sum(self.sizes)
        self._done = 0
        self._current: io.BufferedReader | None = None

    def describe(self) -> str:
        more = len(self.files) - 1
        return f"{self.files[0]}" + (f" and {more:,} more files" if more else "")

    @property
    def bytes_read(self) -> int:
        current = self._current
        return self._done + (current.tell() if current is not None and not current.closed else 0)

    def __iter__(self) -> Iterator[Record]:
        self._done = 0
        for path, size in zip(self.files, self.sizes):
            yield from self._read(path)
            self._current = None
            self._done += size

    def _read(self, path: Path | RemoteFile) -> Iterator[Record]:
        name = file_name(path)
        try:
            fmt = file_format(path, self.options)
            if fmt == "parquet":
                yield from _parquet(path, name, self.options.text_field)
                return
            if fmt == "arrow":
                yield from _arrow(path, name, self.options.text_field)
                return
            with open_file(path) as raw:
                self._current = raw
                if fmt == "text":
                    yield from _text(raw, name, self.options.split_blank_lines)
                else:
                    yield from _jsonl(decompressed(raw, name), name, fmt, self.options.text_field)
        except _unreadable_errors() as e:  # unreadable from the start, or a corrupt stream part-way through
            yield Record(name, 0, None, "unreadable", f"{type(e).__name__}: {e}")
        except _TooLarge as e:
            yield Record(
                name,
                e.line,
                None,
                "unreadable",
                f"a document over {MAX_DOCUMENT_BYTES >> 20} MiB; the "
                "rest of the file is not read (split it: JSONL lines or --split-blank-lines)",
            )


def file_format(path: Path | RemoteFile, options: ReadOptions) -> str:
    """The format `path` is read in: --format when given, else by suffix (and first record, for JSONL)."""
    if options.format != "auto":
        return options.format
    name = path.name
    if name.endswith(".parquet"):
        return "parquet"
    if name.endswith(".arrow"):
        return "arrow"
    if not name.endswith((".jsonl", ".jsonl.gz", ".jsonl.zst")):
        return "text"
    try:
        with open_file(path) as raw:
            for _, line in zip(range(100), _lines(decompressed(raw, name))):
                try:
                    record = json.loads(line)
                except (ValueError, RecursionError):  # RecursionError: nested too deeply for json
                    continue
                if isinstance(record, dict):
                    is_encyclopedia = "sections" in record and options.text_field not in record
                    return "encyclopedia" if is_encyclopedia else "jsonl"
    except (*_unreadable_errors(), _TooLarge):
        pass  # damaged early: reading it as jsonl keeps the records before the damage and reports the rest
    return "jsonl"


def render_encyclopedia(record: dict) -> str:
    """`title：summary`, then `section title：content。` per section, with nothing between.

    The layout of the Baidu-Baike 563w dump that Chinese from-scratch pretraining projects use; other keys
    (`source`, ...) are ignored.
    """
    parts = [_field(record, "title"), "：", _field(record, "summary")]
    sections = record.get("sections")
    if not isinstance(sections, list):
        raise _MissingField("sections")
    for section in sections:
        if not isinstance(section, dict):
            raise _MissingField("sections[] entry")
        parts += [_field(section, "title"), "：", _field(section, "content"), "。"]
    return "".join(parts)


# --- formats ------------------------------------------------------------------------------------------


class _MissingField(Exception):
    """A record lacks a field (or it is not a string)."""


class _TooLarge(Exception):
    """A document longer than MAX_DOCUMENT_BYTES, starting at `line`."""

    def __init__(self, line: int):
        self.line = line


def _lines(stream) -> Iterator[bytes]:
    """The lines of a binary stream, each read with a bound (a file without newlines is not read whole)."""
    number = 0
    while line := stream.readline(MAX_DOCUMENT_BYTES + 1):
        number += 1
        if len(line) > MAX_DOCUMENT_BYTES:
            raise _TooLarge(number)
        yield line


def _field(record: dict, key: str) -> str:
    value = record.get(key)
    if not isinstance(value, str):
        raise _MissingField(key if value is None else f"{key} is {type(value).__name__}, not a string")
    return value


def _document(name: str, line: int, text: str) -> Record:
    if not text.strip():
        return Record(name, line, None, "empty")
    return Record(name, line, text)


def _jsonl(stream, name: str, fmt: str, text_field: str) -> Iterator[Record]:
    for number, line in enumerate(_lines(stream), 1):
        if number == 1:
            line = line.removeprefix(BOM)
        if not line.strip():
            continue  # blank lines (a trailing newline) are not records
        try:
            record = json.loads(line.decode("utf-8"))
        except UnicodeDecodeError as e:
            yield Record(name, number, None, "invalid_utf8", f"byte {e.start}")
            continue
        except ValueError as e:
            yield Record(name, number, None, "invalid_json", getattr(e, "msg", str(e)))
            continue
        except RecursionError:
            yield Record(name, number, None, "invalid_json", "nested too deeply")
            continue
        try:
            if not isinstance(record, dict):
                raise _MissingField(f"{json_kind(record)}, not an object")
            text = render_encyclopedia(record) if fmt == "encyclopedia" else _field(record, text_field)
        except _MissingField as e:
            yield Record(name, number, None, "missing_field", str(e))
            continue
        if b"\\u" in line and not _encodable(text):
            # a JSON escape such as "\ud800" decodes to a lone surrogate, which is not text
            yield Record(name, number, None, "invalid_utf8", "lone surrogate escape")
            continue
        yield _document(name, number, text)


def _encodable(text: str) -> bool:
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True


def _text(raw: io.BufferedReader, name: str, split_blank_lines: bool) -> Iterator[Record]:
    if not split_blank_lines:
        data = raw.read(MAX_DOCUMENT_BYTES + 1)
        if len(data) > MAX_DOCUMENT_BYTES:
            raise _TooLarge(1)
        yield _decoded(name, 1, data.removeprefix(BOM))
        return
    # A block's final line terminator separates it from the next block; it is not part of the document.
    block: list[bytes] = []
    start = size = 0
    for number, line in enumerate(_lines(raw), 1):
        if number == 1:
            line = line.removeprefix(BOM)
        if not _blank(line):
            if not block:
                start, size = number, 0
            block.append(line)
            size += len(line)
            if size > MAX_DOCUMENT_BYTES:
                raise _TooLarge(start)
        elif block:
            yield _decoded(name, start, b"".join(block).rstrip(b"\r\n"))
            block = []
    if block:
        yield _decoded(name, start, b"".join(block).rstrip(b"\r\n"))


def _blank(line: bytes) -> bool:
    """Whitespace only, as str.strip sees it: U+3000 (ideographic space) too, not only ASCII whitespace."""
    return not (line.strip() if line.isascii() else line.decode("utf-8", "replace").strip())


def _decoded(name: str, line: int, data: bytes) -> Record:
    """A text document from raw bytes, taken as they are (no normalisation)."""
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as e:
        bad_line = line + data[: e.start].count(b"\n")
        return Record(name, bad_line, None, "invalid_utf8", f"byte {e.start}")
    return _document(name, line, text)


def _parquet(path: Path | RemoteFile, name: str, text_field: str) -> Iterator[Record]:
    import pyarrow.parquet as pq

    with contextlib.ExitStack() as stack:  # a local file opened by pyarrow itself (native reads, no GIL)
        source = stack.enter_context(path.open()) if isinstance(path, RemoteFile) else path
        parquet = stack.enter_context(pq.ParquetFile(source))
        if text_field not in parquet.schema_arrow.names:
            yield Record(name, 0, None, "missing_field", f"no column {text_field!r}")
            return
        yield from _column_records(
            parquet.iter_batches(batch_size=PARQUET_BATCH_ROWS, columns=[text_field]), name, text_field
        )


def _arrow(path: Path | RemoteFile, name: str, text_field: str) -> Iterator[Record]:
    """An Arrow IPC file: the stream format `datasets` writes, or the random-access (Feather v2) format."""
    import pyarrow as pa
    import pyarrow.ipc

    with contextlib.ExitStack() as stack:
        source = stack.enter_context(
            pa.PythonFile(stack.enter_context(path.open()), mode="r")
            if isinstance(path, RemoteFile)
            else pa.OSFile(str(path))
        )
        try:
            reader = pa.ipc.open_stream(source)
            batches = iter(reader)
        except pa.ArrowInvalid:  # not a stream: the file format (magic "ARROW1" at both ends)
            source.seek(0)
            reader = pa.ipc.open_file(source)
            batches = (reader.get_batch(i) for i in range(reader.num_record_batches))
        if text_field not in reader.schema.names:
            yield Record(name, 0, None, "missing_field", f"no column {text_field!r}")
            return
        column = reader.schema.get_field_index(text_field)
        # `datasets` writes batches of 1,000 rows (its writer_batch_size); slices keep any file's batch bounded
        yield from _column_records(
            (piece.select([column]) for batch in batches for piece in _slices(batch, PARQUET_BATCH_ROWS)),
            name,
            text_field,
        )


def _slices(batch, rows: int):
    return (batch.slice(start, rows) for start in range(0, batch.num_rows, rows))


def _column_records(batches, name: str, text_field: str) -> Iterator[Record]:
    """The documents of Arrow record batches of one column (strings, or bytes as UTF-8), numbered by row."""
    row = 0
    for batch in batches:
        for value in batch.column(0).to_pylist():
            row += 1
            if isinstance(value, bytes):
                yield _decoded(name, row, value)
            elif isinstance(value, str):
                yield _document(name, row, value)
            else:
                yield Record(name, row, None, "missing_field", f"{text_field} is {type(value).__name__}")


def _unreadable_errors() -> tuple[type[BaseException], ...]:
    errors: tuple[type[BaseException], ...] = (OSError, EOFError, zlib.error)  # zlib: a corrupt .gz block
    try:  # pyarrow raises ArrowInvalid (a ValueError) for a file that is not Parquet
        import pyarrow

        errors += (pyarrow.ArrowException,)
    except ImportError:
        pass
    try:
        import zstandard

        errors += (zstandard.ZstdError,)
    except ImportError:
        pass
    return errors
