"""Tokenize a corpus into the flat token files that pretraining reads.

  pretrain prepare --input corpus/ --tokenizer tokenizers/mine --out data/mine --val-fraction 0.01

Each document is tokenized, followed by one <eos>, and appended to train.bin or val.bin (split by whole
documents, from --seed). Also written: train.idx.npy / val.idx.npy (document start offsets), a copy of the
tokenizer in OUT/tokenizer/, and meta.json last (a directory without it is unfinished). The output is
byte-identical for any --workers. Bad records (malformed JSON, missing text field, invalid UTF-8, empty
documents, unreadable files) are skipped and counted, or are an error with --strict.

  pretrain prepare --input corpus/ --tokenizer tok --out data/big --tasks 64 --executor slurm --slurm-partition cpu

--tasks N splits the input files over N tasks run by datatrove (locally, as a Slurm job array, or on Ray), each
writing OUT/shard_0000i/ in the format above; a final step writes OUT/meta.json listing the shards. Killed, the
same command again redoes only the unfinished tasks. The shards' concatenation equals --tasks 1 byte for byte.
"""

from __future__ import annotations

import argparse

from ..plan.length import TOKEN_DTYPES
from .executors import EXECUTORS
from .tokenizer_command import add_reader_arguments

HELP = "tokenize a corpus into train.bin / val.bin + meta.json (streaming, parallel, deterministic)"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--input",
        nargs="+",
        action="extend",
        required=True,
        metavar="PATH",
        help="corpus files, directories (searched recursively), globs, or URLs (hf://datasets/..., read with fsspec)",
    )
    parser.add_argument(
        "--tokenizer", required=True, help="a tokenizer directory (with tokenizer.json) or a tokenizer.json path"
    )
    parser.add_argument("--out", required=True, help="output directory")
    parser.add_argument(
        "--val-fraction",
        type=float,
        default=0.01,
        help="fraction of documents sent to val.bin, in [0, 1) (default 0.01)",
    )
    parser.add_argument("--workers", type=int, default=None, help="tokenizer processes (default: all cores)")
    parser.add_argument("--seed", type=int, default=1234, help="seed of the train/validation split (default 1234)")
    parser.add_argument(
        "--dtype",
        default="auto",
        choices=("auto", *TOKEN_DTYPES),
        help="token id type; auto = uint16 when the vocabulary fits in 65,536 ids, else uint32",
    )
    parser.add_argument("--strict", action="store_true", help="stop at the first bad record instead of skipping it")
    parser.add_argument(
        "--fast-path",
        action="store_true",
        help="encode with tiktoken's engine (~2x faster), checked against tokenizers on every 16th "
        "document with a fallback on any difference: a sample, not a proof (see docs/data.md)",
    )
    add_reader_arguments(parser)
    sharded = parser.add_argument_group("sharded preparation (datatrove; see docs/data.md)")
    sharded.add_argument(
        "--tasks",
        type=int,
        default=None,
        help="split the input files over this many tasks, one shard each (a sharded dataset); "
        "--workers is then the number of tasks run at once",
    )
    sharded.add_argument(
        "--executor",
        default="local",
        choices=EXECUTORS,
        help="what runs the tasks: this machine, a Slurm job array, or a Ray cluster "
        "(RAY_ADDRESS, else a local one) (default local)",
    )
    sharded.add_argument("--slurm-partition", default=None, help="Slurm partition of the job array")
    sharded.add_argument("--slurm-time", default="24:00:00", help="time limit of each array task (default 24:00:00)")
    sharded.add_argument("--slurm-mem-gb", type=int, default=2, help="memory per task in GB (default 2)")
    sharded.add_argument("--slurm-qos", default="", help="Slurm QOS (default: the cluster's)")
    sharded.add_argument(
        "--slurm-env-command",
        default="",
        help="shell line each task runs first (default: activate this Python environment)",
    )
    sharded.add_argument(
        "--sbatch",
        nargs="+",
        action="extend",
        default=[],
        metavar="KEY=VALUE",
        help="more #SBATCH options, e.g. --sbatch account=proj constraint=cpu",
    )


def run(args: argparse.Namespace) -> int:
    import signal
    import sys
    import time

    from ..plan.length import storage_bytes
    from .preparation import prepare

    # SIGTERM (kill, a job scheduler) stops prepare as Ctrl-C does: the half-built dataset is removed and the
    # previous one at --out is left as it was (Python's default would end the process without cleaning up).
    signal.signal(signal.SIGTERM, _interrupt)
    start = time.perf_counter()
    if args.tasks is not None:
        return _run_sharded(args, start)
    meta = prepare(
        args.input,
        args.tokenizer,
        args.out,
        val_fraction=args.val_fraction,
        workers=args.workers,
        seed=args.seed,
        dtype=args.dtype,
        strict=args.strict,
        format=args.format,
        text_field=args.text_field,
        split_blank_lines=args.split_blank_lines,
        fast_path=args.fast_path,
        progress=sys.stderr.isatty(),
    )  # no bar frames in logs
    seconds = time.perf_counter() - start
    print(summary(meta, args.out, seconds, storage_bytes(sum(meta["num_tokens"].values()), meta["vocab_size"])))
    return 0


def _run_sharded(args, start: float) -> int:
    import time

    from ..errors import UsageError
    from ..plan.length import storage_bytes
    from .executors import SlurmOptions

    try:  # an optional dependency: the one-pass prepare needs none of it
        from .sharded import prepare_sharded
    except ModuleNotFoundError as e:
        if e.name != "datatrove" and not (e.name or "").startswith("datatrove."):
            raise
        raise UsageError(
            "prepare --tasks: the sharded preparation runs on datatrove, which is not installed: "
            "pip install datatrove (or leave out --tasks)"
        ) from None

    slurm = None
    if args.executor == "slurm":
        pairs = [item.partition("=") for item in args.sbatch]
        bad = [item for item, (key, eq, _) in zip(args.sbatch, pairs) if not key or not eq]
        if bad:
            raise UsageError(f"--sbatch {bad[0]!r} is not KEY=VALUE; e.g. --sbatch account=proj")
        slurm = SlurmOptions(
            args.slurm_partition,
            args.slurm_time,
            args.slurm_mem_gb,
            args.slurm_qos,
            sbatch_args={k: v for k, _, v in pairs},
            env_command=args.slurm_env_command,
        )
    meta = prepare_sharded(
        args.input,
        args.tokenizer,
        args.out,
        tasks=args.tasks,
        executor=args.executor,
        workers=args.workers,
        slurm=slurm,
        val_fraction=args.val_fraction,
        seed=args.seed,
        dtype=args.dtype,
        strict=args.strict,
        format=args.format,
        text_field=args.text_field,
        split_blank_lines=args.split_blank_lines,
        fast_path=args.fast_path,
    )
    if meta is None:
        print(
            f"submitted {args.tasks} Slurm array tasks and the manifest job after them; {args.out} appears when "
            f"they finish (logs in {args.out}.partial/logs/; if some fail, run the same command again)"
        )
        return 0
    seconds = time.perf_counter() - start
    print(summary(meta, args.out, seconds, storage_bytes(sum(meta["num_tokens"].values()), meta["vocab_size"])))
    print(f"  shards     {len(meta['shards'])} ({args.executor} executor)")
    return 0


def _interrupt(signum, frame):
    raise KeyboardInterrupt


def summary(meta: dict, out: str, seconds: float, planned_bytes: int) -> str:
    from ..files import display_path
    from ..plan.length import TOKEN_DTYPE_BYTES

    docs, tokens = meta["num_docs"], meta["num_tokens"]
    size = sum(tokens.values()) * TOKEN_DTYPE_BYTES[meta["dtype"]]
    lines = [
        f"prepared {display_path(out)} in {seconds:.1f} s ({meta['text_bytes'] / 1e6 / seconds:,.1f} MB/s, "
        f"{sum(tokens.values()) / seconds:,.0f} tokens/s, encoder {meta['encoder']['name']})",
        f"  documents  train {docs['train']:,}  val {docs['val']:,}",
        f"  tokens     train {tokens['train']:,}  val {tokens['val']:,}  ({meta['dtype']})",
        f"  chars/token {meta['chars_per_token']:.3f}  bytes/token {meta['bytes_per_token']:.3f}",
        f"  size on disk {size:,} bytes (.bin); planner storage_bytes predicts {planned_bytes:,}"
        + (" (equal)" if size == planned_bytes else " (differs: --dtype was forced)"),
    ]
    skipped = sum(meta["skipped"].values())
    if skipped:
        reasons = ", ".join(f"{n:,} {reason}" for reason, n in meta["skipped"].items() if n)
        lines.append(f"  skipped {skipped:,} bad records ({reasons}):")
        lines += [f"    {example}" for example in meta["skipped_examples"]]
        if skipped > len(meta["skipped_examples"]):
            lines.append(f"    ... and {skipped - len(meta['skipped_examples']):,} more")
    if tokens["train"] < tokens["val"]:  # the split is by whole documents: a few large ones can all land in val
        lines.append(
            f"  warning: train.bin is {'empty' if not docs['train'] else 'smaller than val.bin'}: "
            f"{docs['val']:,} of {docs['train'] + docs['val']:,} documents went to val.bin "
            f"(--val-fraction {meta['val_fraction']}); use a smaller --val-fraction (0 for none), more "
            "documents, or --split-blank-lines for smaller ones"
        )
    if meta["val_fraction"] > 0 and docs["val"] == 0:
        lines.append(
            "  note: val.bin is empty (too few documents for --val-fraction; try --split-blank-lines "
            "or a larger fraction)"
        )
    return "\n".join(lines)
