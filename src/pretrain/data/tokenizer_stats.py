"""How much text a token is, for one or more tokenizers on the same documents: the table practitioners
quote when they compare tokenizers ("1 token ~ 1.4-1.7 Chinese characters, 1B tokens ~ 3 GB of text").

Each tokenizer encodes the same sample: the first `max_docs` documents the project's readers yield (the
documents `pretrain prepare` would tokenize, bad records skipped), so a huge corpus costs a bounded time.
  chars_per_token       characters / tokens
  bytes_per_token       UTF-8 bytes / tokens (what `data.bytes_per_token` in a plan takes)
  tokens_per_gb         1e9 / bytes_per_token: tokens in 1 GB of such text
  compression_vs_first  bytes_per_token / the first tokenizer's: above 1, this tokenizer needs fewer tokens
                        for the same text (the "compression rate" of the Baichuan and ChatGLM tables)
Documents are encoded whole, without the <eos> separators `prepare` adds (those are not text).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ..errors import UsageError
from .readers import Corpus, ReadOptions
from .sources import find_files
from .tokenizer import find_tokenizer

DEFAULT_MAX_DOCS = 2000
ENCODE_BATCH = 256  # documents per encode_batch call: bounded memory, the library's threads kept busy


@dataclass
class Sample:
    """The documents every tokenizer encodes, with their size in characters and UTF-8 bytes."""

    texts: list[str]
    chars: int
    bytes: int
    skipped: int


def read_sample(
    inputs: list[str | Path], max_docs: int = DEFAULT_MAX_DOCS, options: ReadOptions = ReadOptions()
) -> Sample:
    if max_docs < 1:
        raise UsageError(f"--max-docs {max_docs} must be at least 1")
    corpus = Corpus(find_files(inputs), options)
    texts, skipped = [], 0
    for record in corpus:
        if record.skip:
            skipped += 1
            continue
        texts.append(record.text)
        if len(texts) == max_docs:
            break
    if not texts:
        raise UsageError(f"no documents in {corpus.describe()}; check --format, --text-field and --split-blank-lines")
    return Sample(texts, sum(len(t) for t in texts), sum(len(t.encode("utf-8")) for t in texts), skipped)


def count_tokens(tokenizer_path: str | Path, texts: list[str]) -> int:
    tokenizer = find_tokenizer(tokenizer_path).load()
    return sum(
        len(e.ids)
        for i in range(0, len(texts), ENCODE_BATCH)
        for e in tokenizer.encode_batch(texts[i : i + ENCODE_BATCH])
    )


def tokenizer_stats(
    tokenizers: list[str | Path],
    inputs: list[str | Path],
    max_docs: int = DEFAULT_MAX_DOCS,
    options: ReadOptions = ReadOptions(),
) -> dict[str, Any]:
    """The JSON contract of `pretrain tokenizer stats --json`: {"tokenizers": [...], "sample": {...}}."""
    for path in tokenizers:  # every tokenizer checked before the corpus is read
        find_tokenizer(path)
    sample = read_sample(inputs, max_docs, options)
    rows = []
    for path in tokenizers:
        tokens = max(1, count_tokens(path, sample.texts))
        bytes_per_token = sample.bytes / tokens
        rows.append(
            {
                "path": str(path),
                "tokens": tokens,
                "chars_per_token": sample.chars / tokens,
                "bytes_per_token": bytes_per_token,
                "tokens_per_gb": 1e9 / bytes_per_token,
                "compression_vs_first": bytes_per_token / rows[0]["bytes_per_token"] if rows else 1.0,
            }
        )
    return {
        "tokenizers": rows,
        "sample": {
            "documents": len(sample.texts),
            "chars": sample.chars,
            "bytes": sample.bytes,
            "skipped": sample.skipped,
            "max_docs": max_docs,
        },
    }


def render(stats: dict) -> str:
    s = stats["sample"]
    lines = [
        f"{s['documents']:,} documents ({s['chars']:,} characters, {s['bytes']:,} bytes of UTF-8)"
        + (f", {s['skipped']:,} bad records skipped" if s["skipped"] else ""),
        "",
    ]
    header = ("tokenizer", "tokens", "chars/token", "bytes/token", "tokens per GB", "vs first")
    rows = [
        (
            r["path"],
            f"{r['tokens']:,}",
            f"{r['chars_per_token']:.3f}",
            f"{r['bytes_per_token']:.3f}",
            f"{r['tokens_per_gb'] / 1e6:,.1f}M",
            f"{r['compression_vs_first']:.3f}x",
        )
        for r in stats["tokenizers"]
    ]
    widths = [max(len(row[i]) for row in [header, *rows]) for i in range(len(header))]
    for row in [header, *rows]:
        lines.append(
            "  ".join(
                cell.ljust(w) if i == 0 else cell.rjust(w) for i, (cell, w) in enumerate(zip(row, widths))
            ).rstrip()
        )
    return "\n".join(lines)
