"""`pretrain prepare`: a raw corpus in, the flat token files that pretraining reads out.

Pipeline: the main process reads documents in sorted file order and cuts them into chunks of ~1 M
characters; worker processes tokenize chunks (each document + one <eos>) and split them by document into
train/validation; the main process writes the results in chunk order. At most a few chunks are in flight
per worker, so memory stays flat however large the corpus. The new dataset is built in a temporary
directory beside --out (meta.json written last) and swapped in only when complete: until then an earlier
dataset at --out stays whole and usable, whatever stops the build (bad input, Ctrl-C, SIGTERM, SIGKILL, a
full disk). One build of an --out at a time, plain or sharded (the lock beside it: files.writer_lock).
"""

from __future__ import annotations

import hashlib
import json
import multiprocessing
import os
import shutil
from collections import deque
from collections.abc import Iterator
from contextlib import contextmanager, suppress
from pathlib import Path

import numpy as np

from .. import __version__
from ..errors import UsageError
from ..files import StagedDirectory, display_path, write_atomic, write_error
from ..plan.length import TOKEN_DTYPES, token_dtype
from ..progress import terminal_bar
from .documents import length_bins, length_histogram
from .encode import Chunk, ChunkEncoder, encode_in_worker, init_worker
from .fast_bpe import why_not_fast
from .readers import SKIP_REASONS, Corpus, ReadOptions
from .sources import file_name, find_files
from .tokenizer import find_tokenizer

SPLITS = ("train", "val")
DTYPES = ("auto", *TOKEN_DTYPES)
CHUNK_CHARS = 1 << 20  # ~1 M characters per task: `tokenizers` holds ~90 bytes per input byte while encoding
STR_OVERHEAD = 64  # bytes of a Python str object beyond its characters: bounds chunks of many tiny documents
IN_FLIGHT_PER_WORKER = 2  # chunks queued per worker: enough to keep it busy, few enough to bound memory
MAX_SHOWN = 5  # bad records listed by name; the rest are counted
META_VERSION = 1
# What a dataset directory holds: the only names a new dataset may replace (anything else in --out is refused).
DATASET_FILES = ("meta.json", "tokenizer", *(f"{s}.{ext}" for s in SPLITS for ext in ("bin", "idx.npy")))


def replaceable_names(out_dir) -> tuple[str, ...]:
    """What a new dataset may replace at --out: a dataset's files, and a sharded dataset's (sharded.py) when
    --out holds one, as its meta.json lists them: one kind of dataset may replace the other."""
    try:
        shards = json.loads((Path(out_dir) / "meta.json").read_text(encoding="utf-8"))["shards"]
        extra = tuple(name for name in shards if isinstance(name, str) and "/" not in name)
    except (OSError, ValueError, KeyError, TypeError):
        return DATASET_FILES
    return (*DATASET_FILES, "job.json", "logs", *extra)


def resolve_dtype(dtype: str, vocab_size: int) -> str:
    """auto: the smallest id type that holds the vocabulary (the planner's token_dtype)."""
    if dtype not in DTYPES:
        raise UsageError(f"--dtype {dtype!r} is unknown; use one of {' | '.join(DTYPES)}")
    if dtype == "auto":
        return token_dtype(vocab_size)
    if vocab_size > TOKEN_DTYPES[dtype]:
        raise UsageError(
            f"--dtype {dtype} cannot hold a vocabulary of {vocab_size:,} ids (max "
            f"{TOKEN_DTYPES[dtype]:,}); use --dtype uint32 or auto"
        )
    return dtype


def default_workers() -> int:
    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1


def prepare(
    inputs,
    tokenizer,
    out_dir,
    *,
    val_fraction: float = 0.01,
    workers: int | None = None,
    seed: int = 1234,
    dtype: str = "auto",
    strict: bool = False,
    format: str = "auto",
    text_field: str = "text",
    split_blank_lines: bool = False,
    fast_path: bool = False,
    progress: bool = False,
) -> dict:
    """Tokenize the documents of `inputs` into `out_dir` (train.bin, val.bin, indexes, tokenizer/, meta.json).

    Returns the meta dict (also written to out_dir/meta.json). The output bytes depend on the inputs, the
    tokenizer, seed and val_fraction only: not on `workers` or on the fast path.
    """
    if not 0 <= val_fraction < 1:
        raise UsageError(f"--val-fraction {val_fraction} is out of range; give a fraction in [0, 1), e.g. 0.01")
    workers = default_workers() if workers is None else workers
    if workers < 1:
        raise UsageError(f"--workers {workers} must be at least 1")
    corpus = Corpus(find_files(inputs), ReadOptions(format, text_field, split_blank_lines))
    tok = find_tokenizer(tokenizer)
    dtype = resolve_dtype(dtype, tok.vocab_size)
    why_not = why_not_fast(tok.json) if fast_path else "not asked for (--fast-path)"

    with StagedDirectory(out_dir, "--out", replaceable_names(out_dir)) as staged:
        try:
            meta = build_dataset(
                staged.path,
                corpus,
                tok,
                dtype,
                why_not,
                seed=seed,
                val_fraction=val_fraction,
                workers=workers,
                strict=strict,
                progress=progress,
                format=format,
                text_field=text_field,
                split_blank_lines=split_blank_lines,
            )
            staged.commit()
        except OSError as e:
            error = write_error(e, f"--out {display_path(out_dir)}", "the dataset")
            if error is None:
                raise
            raise error from None
    return meta


def build_dataset(
    out_dir: Path,
    corpus,
    tok,
    dtype,
    why_not,
    *,
    seed,
    val_fraction,
    workers,
    strict,
    progress,
    allow_empty: bool = False,
    **read_options,
) -> dict:
    """The whole dataset in `out_dir` (a fresh directory), meta.json last; returns the meta dict.

    allow_empty: no documents is a dataset of empty splits, not an error (one shard of many: sharded.py)."""
    args = dict(
        corpus=corpus,
        tok=tok,
        dtype=dtype,
        seed=seed,
        val_fraction=val_fraction,
        workers=workers,
        strict=strict,
        out_dir=out_dir,
        progress=progress,
        allow_empty=allow_empty,
    )
    try:
        result = _tokenize(fast=why_not is None, **args)
    except _FastPathMismatch as e:
        why_not = f"tiktoken disagreed with tokenizers on document {e.doc}"
        result = _tokenize(fast=False, **args)
    writers, skips, text = result

    _save_tokenizer(tok, out_dir / "tokenizer")
    meta = {
        "version": META_VERSION,
        "pretrain_version": __version__,
        "dtype": dtype,
        "vocab_size": tok.vocab_size,
        "eos_id": tok.eos_id,
        **_split_figures(writers, text),
        "skipped": skips.counts,
        "skipped_examples": skips.examples,
        "files": [{"path": file_name(p), "bytes": n} for p, n in zip(corpus.files, corpus.sizes)],
        "tokenizer": "tokenizer",
        "tokenizer_sha256": tok.sha256,
        "tokenizer_source": display_path(tok.source),
        "encoder": _encoder(why_not, text["verified"]),
        "seed": seed,
        "val_fraction": val_fraction,
        **read_options,
    }
    write_atomic(out_dir / "meta.json", json.dumps(meta, indent=2, ensure_ascii=False) + "\n")
    return meta


class _FastPathMismatch(Exception):
    def __init__(self, doc: int):
        self.doc = doc


def _split_figures(writers: dict, text: dict) -> dict:
    """Each split's tokens, documents, length histogram and checksum, and the text's characters and bytes
    per token."""
    num_tokens = {s: w.num_tokens for s, w in writers.items()}
    num_docs = {s: w.num_docs for s, w in writers.items()}
    text_tokens = max(1, sum(num_tokens.values()) - sum(num_docs.values()))  # <eos> separators excluded
    return {
        "num_tokens": num_tokens,
        "num_docs": num_docs,
        "doc_length_histogram": {s: length_histogram(w.length_bins) for s, w in writers.items()},
        "sha256": {f"{s}.bin": w.sha256.hexdigest() for s, w in writers.items()},
        "chars_per_token": text["chars"] / text_tokens,
        "bytes_per_token": text["bytes"] / text_tokens,
        "text_chars": text["chars"],
        "text_bytes": text["bytes"],
    }


def _encoder(why_not: str | None, verified_docs) -> dict:
    """Which encoder tokenized: tiktoken, or tokenizers and why not tiktoken."""
    return {
        "name": "tokenizers" if why_not else "tiktoken",
        "verified_docs": verified_docs,
        **({"why_not_tiktoken": why_not} if why_not else {}),
    }


def _tokenize(*, corpus, tok, dtype, seed, val_fraction, workers, strict, out_dir, progress, fast, allow_empty):
    """One pass over the corpus into the split files; returns (finished writers, skip log, text stats)."""
    skips = SkipLog(strict)
    writers = {split: SplitWriter(out_dir, split, dtype) for split in SPLITS}
    text = {"chars": 0, "bytes": 0, "verified": 0}
    encoder_args = (tok, dtype, seed, val_fraction, fast)
    try:
        with _progress_bar(corpus.total_bytes, progress) as update:
            for encoded in _encoded(_chunks(corpus, skips), encoder_args, workers):
                if encoded.mismatch is not None:
                    raise _FastPathMismatch(encoded.mismatch)
                writers["train"].write(encoded.train, encoded.train_lengths)
                writers["val"].write(encoded.val, encoded.val_lengths)
                text["chars"] += encoded.chars
                text["bytes"] += encoded.text_bytes
                text["verified"] += encoded.verified
                update(corpus.bytes_read, sum(w.num_tokens for w in writers.values()))
        if not allow_empty and not sum(w.num_docs for w in writers.values()):
            raise UsageError(
                f"no documents in {corpus.describe()} ({skips.summary() or 'empty'}); "
                "check --format, --text-field and --split-blank-lines"
            )
        for writer in writers.values():
            writer.finish()
    except BaseException:  # interrupted or failed: leave no partial output behind
        for writer in writers.values():
            writer.discard()
        raise
    return writers, skips, text


def _chunks(corpus: Corpus, skips: SkipLog) -> Iterator[Chunk]:
    texts: list[str] = []
    size = first = 0
    for record in corpus:
        if record.skip:
            skips.add(record)
            continue
        assert record.text is not None  # a record without a skip reason carries its text (readers.Record)
        texts.append(record.text)
        size += len(record.text) + STR_OVERHEAD
        if size >= CHUNK_CHARS:
            yield Chunk(first, texts)
            first += len(texts)
            texts, size = [], 0
    if texts:
        yield Chunk(first, texts)


def _encoded(chunks: Iterator[Chunk], encoder_args: tuple, workers: int):
    """Encoded chunks in input order, at most IN_FLIGHT_PER_WORKER x workers in flight."""
    if workers == 1:
        yield from map(ChunkEncoder(*encoder_args), chunks)
        return
    # The pool's semaphores are registered with multiprocessing's resource tracker, a helper process that, when
    # the main process is killed, removes them and warns about each "leak": noise on a kill that lost nothing.
    quiet = "ignore::UserWarning:multiprocessing.resource_tracker"
    os.environ["PYTHONWARNINGS"] = ",".join(filter(None, [os.environ.get("PYTHONWARNINGS"), quiet]))
    # spawn, not fork: a forked child would inherit the progress bar's thread state and locks
    with multiprocessing.get_context("spawn").Pool(workers, init_worker, encoder_args) as pool:
        pending: deque = deque()
        for chunk in chunks:
            pending.append(pool.apply_async(encode_in_worker, (chunk,)))
            if len(pending) >= IN_FLIGHT_PER_WORKER * workers:
                yield pending.popleft().get()
        while pending:
            yield pending.popleft().get()


class SkipLog:
    """Bad records: counted by reason, the first few kept by name; --strict turns the first into an error."""

    def __init__(self, strict: bool):
        self.strict = strict
        self.counts = dict.fromkeys(SKIP_REASONS, 0)
        self.examples: list[str] = []

    def add(self, record) -> None:
        if self.strict:
            raise UsageError(
                f"{record.message()} (--strict stops at the first bad record; without it bad records "
                "are skipped and counted)"
            )
        self.counts[record.skip] += 1
        if len(self.examples) < MAX_SHOWN:
            self.examples.append(record.message())

    def summary(self) -> str:
        total = sum(self.counts.values())
        parts = ", ".join(f"{n:,} {SKIP_REASONS[k]}" for k, n in self.counts.items() if n)
        return f"skipped {total:,} records: {parts}" if total else ""


class SplitWriter:
    """One split's token file (+ running sha256) and document index, under temporary names until `finish`."""

    def __init__(self, out_dir: Path, split: str, dtype: str):
        self.bin, self.idx = out_dir / f"{split}.bin", out_dir / f"{split}.idx.npy"
        self._bin_tmp, self._idx_tmp = out_dir / f"{split}.bin.tmp", out_dir / f"{split}.idx.tmp"
        self.dtype = np.dtype(dtype).newbyteorder("<")  # little-endian on disk, whatever the machine
        self.sha256 = hashlib.sha256()
        self.num_tokens = self.num_docs = 0
        self.length_bins = np.zeros(64, dtype=np.int64)  # documents per power-of-two length (data/documents.py)
        self._tokens = open(self._bin_tmp, "wb")
        self._starts = open(self._idx_tmp, "wb")  # raw int64 document starts; made a .npy in finish()

    def write(self, tokens: np.ndarray, lengths: np.ndarray) -> None:
        starts = self.num_tokens + np.cumsum(lengths) - lengths
        self._starts.write(starts.astype("<i8").tobytes())
        data = tokens.astype(self.dtype, copy=False).tobytes()
        self._tokens.write(data)
        self.sha256.update(data)
        self.num_tokens += len(tokens)
        self.num_docs += len(lengths)
        self.length_bins += length_bins(lengths)

    def finish(self) -> None:
        self._tokens.close()
        self._starts.close()
        npy_tmp = self.idx.with_name(self.idx.name + ".tmp")
        with open(npy_tmp, "wb") as out, open(self._idx_tmp, "rb") as starts:
            header = {"descr": "<i8", "fortran_order": False, "shape": (self.num_docs,)}
            np.lib.format.write_array_header_1_0(out, header)
            shutil.copyfileobj(starts, out)
        self._idx_tmp.unlink()
        os.replace(npy_tmp, self.idx)
        os.replace(self._bin_tmp, self.bin)

    def discard(self) -> None:
        for f in (self._tokens, self._starts):
            with suppress(OSError):  # closing flushes, which fails again on a full disk; the file is closed anyway
                f.close()
        for path in (self._bin_tmp, self._idx_tmp, self.idx.with_name(self.idx.name + ".tmp")):
            path.unlink(missing_ok=True)


def _save_tokenizer(tok, folder: Path) -> None:
    """Copy the tokenizer into the new dataset (from memory: its source may be the old dataset's copy)."""
    tok.save(folder)


@contextmanager
def _progress_bar(total_bytes: int, enabled: bool):
    """Yields update(bytes_read, tokens): a rich bar with MB/s (input read) and tokens/s, or nothing."""
    if not enabled:
        yield lambda completed, tokens: None
        return
    from rich.progress import BarColumn, TaskProgressColumn, TextColumn, TimeRemainingColumn

    bar = terminal_bar(
        TextColumn("prepare"),
        BarColumn(),
        TaskProgressColumn(),
        TextColumn("{task.fields[mb_s]:.1f} MB/s"),
        TextColumn("{task.fields[tokens_s]:,.0f} tokens/s"),
        TimeRemainingColumn(),
    )
    if bar is None:
        yield lambda completed, tokens: None
        return
    with bar:
        task = bar.add_task("prepare", total=total_bytes, mb_s=0.0, tokens_s=0.0)

        def update(completed: int, tokens: int) -> None:
            elapsed = bar.tasks[0].elapsed or 1e-9
            bar.update(task, completed=completed, mb_s=completed / 1e6 / elapsed, tokens_s=tokens / elapsed)

        yield update
