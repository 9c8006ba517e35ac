"""Train a byte-level BPE tokenizer on a corpus, or compare tokenizers on one.

  pretrain tokenizer train --input corpus/ --vocab-size 32000 --out tokenizers/mine
  pretrain tokenizer stats --tokenizer tokenizers/mine other/ --input corpus/ [--json]

Writes tokenizer.json, tokenizer_config.json and special_tokens_map.json: a directory that
`pretrain prepare --tokenizer` and `transformers.AutoTokenizer.from_pretrained` both load. Special tokens
<eos>, <bos>, <pad> get ids 0, 1, 2. Inputs are read exactly as `pretrain prepare` reads them.
"""

from __future__ import annotations

import argparse

from ..config.reading import count_argument
from .readers import FORMATS

HELP = "train a byte-level BPE tokenizer (Hugging Face tokenizers), or compare tokenizers on a corpus"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    sub = parser.add_subparsers(dest="action", metavar="ACTION", required=True)
    train = sub.add_parser(
        "train", help="train a tokenizer", description=__doc__, formatter_class=parser.formatter_class
    )
    train.add_argument(
        "--input",
        nargs="+",
        action="extend",
        required=True,
        metavar="PATH",
        help="corpus files, directories (searched recursively) or globs",
    )
    train.add_argument(
        "--vocab-size", type=count_argument, required=True, help="vocabulary size, special tokens included"
    )
    train.add_argument("--out", required=True, help="directory to write the tokenizer to")
    train.add_argument("--min-frequency", type=int, default=2, help="pairs seen fewer times are not merged")
    add_reader_arguments(train)
    stats = sub.add_parser(
        "stats",
        help="characters, bytes and tokens per GB of text, tokenizers compared",
        description=__doc__,
        formatter_class=parser.formatter_class,
    )
    stats.add_argument(
        "--tokenizer",
        nargs="+",
        action="extend",
        required=True,
        metavar="DIR",
        help="tokenizer directories (or tokenizer.json files); the first is the reference",
    )
    stats.add_argument(
        "--input",
        nargs="+",
        action="extend",
        required=True,
        metavar="PATH",
        help="corpus files, directories (searched recursively) or globs",
    )
    stats.add_argument(
        "--max-docs", type=count_argument, default=2000, help="documents sampled, from the start (default 2000)"
    )
    stats.add_argument("--json", action="store_true", help="print the figures as JSON")
    add_reader_arguments(stats)


def add_reader_arguments(parser: argparse.ArgumentParser) -> None:
    """The reader flags, shared with `pretrain prepare`."""
    parser.add_argument(
        "--format",
        default="auto",
        choices=FORMATS,
        help="how to read the inputs; auto: by suffix, and encyclopedia when a JSONL record has "
        "`sections` (default auto)",
    )
    parser.add_argument(
        "--text-field", default="text", help="JSONL key / Parquet or Arrow column of the text (default text)"
    )
    parser.add_argument(
        "--split-blank-lines",
        action="store_true",
        help=".txt: one document per blank-line-separated block (default: one per file)",
    )


def run(args: argparse.Namespace) -> int:
    if args.action == "stats":
        return _stats(args)
    import sys

    from .tokenizer import train_tokenizer

    summary = train_tokenizer(
        args.input,
        args.vocab_size,
        args.out,
        format=args.format,
        text_field=args.text_field,
        split_blank_lines=args.split_blank_lines,
        min_frequency=args.min_frequency,
        progress=sys.stderr.isatty(),
    )
    skipped = sum(summary["skipped"].values())
    print(
        f"trained a {summary['vocab_size']:,}-token byte-level BPE on {summary['num_docs']:,} documents "
        f"({summary['text_bytes'] / 1e6:,.1f} MB) in {summary['seconds']:.1f} s -> {summary['path']}"
        + (f" (skipped {skipped:,} bad records)" if skipped else "")
    )
    return 0


def _stats(args) -> int:
    import json

    from .readers import ReadOptions
    from .tokenizer_stats import render, tokenizer_stats

    stats = tokenizer_stats(
        args.tokenizer, args.input, args.max_docs, ReadOptions(args.format, args.text_field, args.split_blank_lines)
    )
    print(json.dumps(stats, indent=2) if args.json else render(stats))
    return 0
