"""The end of a sharded build: every shard re-read against its meta.json, the manifest (the dataset's top-level
meta.json: the shards in order, their totals and checksums) written last, then OUT.partial swapped in for --out.

Its own module because two callers end a build with it: the launcher after a local or Ray run, and the Slurm
job that runs after the array (sharded.py's WriteManifest).
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

from .. import __version__
from ..errors import UsageError
from ..files import aside_path, display_path, swap_in, write_atomic
from .documents import merge_histograms
from .preparation import MAX_SHOWN, META_VERSION, SPLITS
from .shard_job import PARTIAL_MARK, Job, forget_shard, shard_name


def finish(job: Job) -> dict:
    """The manifest (meta.json) from the shards' meta.json files, written last, then OUT.partial swapped in."""
    work, final = Path(job.work), Path(job.final)
    names = [shard_name(i) for i in range(len(job.files))]
    missing = [n for n in names if not (work / n / "meta.json").is_file()]
    if missing:
        raise UsageError(
            f"{len(missing)} of {len(names)} tasks did not finish ({', '.join(missing[:3])}"
            f"{' ...' if len(missing) > 3 else ''}; why: "
            f"{display_path(work / 'logs' / 'tokenize' / 'logs')}/task_NNNNN.log); run the same command "
            "again: it redoes only those"
        )
    _check_shards(work, names)
    shards = [json.loads((work / n / "meta.json").read_text(encoding="utf-8")) for n in names]
    meta = manifest(shards, names, (work / "job.json").read_text(encoding="utf-8"))
    if not sum(meta["num_docs"].values()):
        raise UsageError(
            f"no documents in the {sum(len(f) for f in job.files):,} input files (skipped: "
            f"{meta['skipped']}); check --format, --text-field and --split-blank-lines"
        )
    shutil.rmtree(work / "locks", ignore_errors=True)  # every task is done: the tasks' lock files mean nothing
    write_atomic(work / "meta.json", json.dumps(meta, indent=2, ensure_ascii=False) + "\n")
    (work / PARTIAL_MARK).unlink(missing_ok=True)  # a dataset now: renamed OUT.partial, never deleted
    # The old dataset goes aside under the name StagedDirectory gives it, so a crash between the two renames
    # is undone by the next prepare.
    swap_in(work, final, aside_path(final))
    return meta


def _check_shards(work: Path, names: list[str]) -> None:
    """Every shard re-read against its meta.json (sizes, sha256) before it is swapped in: a damaged one (a file
    changed since its task wrote it) is removed with its completion mark and the swap refused, so the same
    command again rebuilds only it. One shard per core at a time (hashlib releases the GIL while it hashes)."""
    from concurrent.futures import ThreadPoolExecutor

    from .loader import PreparedData
    from .preparation import default_workers

    def damage(name: str) -> str | None:
        try:
            PreparedData(
                work / name,
                verify="full",
                advice="shard removed: run the same command again, it rebuilds only the removed shards",
            )
        except UsageError as e:
            return str(e)
        return None

    with ThreadPoolExecutor(default_workers()) as pool:
        errors = {task: error for task, error in enumerate(pool.map(damage, names)) if error}
    for task in errors:
        forget_shard(work, task)
    if errors:
        more = f" (and {len(errors) - 1} more damaged, removed too)" if len(errors) > 1 else ""
        raise UsageError(next(iter(errors.values())) + more)


def manifest(shards: list[dict], names: list[str], job_text: str) -> dict:
    """The top-level meta.json: the keys of a single dataset's (totals), plus the shards in order and each
    shard's checksums under its relative path."""
    first = shards[0]
    for name, shard in zip(names, shards):
        for key in ("tokenizer_sha256", "dtype", "vocab_size", "eos_id", "seed", "val_fraction"):
            if shard[key] != first[key]:
                raise UsageError(
                    f"{name}/meta.json: {key} {shard[key]!r} differs from {names[0]}'s {first[key]!r}; "
                    "delete the .partial directory and prepare again"
                )
    total = {key: {s: sum(m[key][s] for m in shards) for s in SPLITS} for key in ("num_tokens", "num_docs")}
    chars, nbytes = sum(m["text_chars"] for m in shards), sum(m["text_bytes"] for m in shards)
    text_tokens = max(1, sum(total["num_tokens"].values()) - sum(total["num_docs"].values()))
    encoders = {m["encoder"]["name"] for m in shards}
    job = json.loads(job_text)
    return {
        "version": META_VERSION,
        "pretrain_version": __version__,
        "shards": names,
        "dtype": first["dtype"],
        "vocab_size": first["vocab_size"],
        "eos_id": first["eos_id"],
        **total,
        "doc_length_histogram": {
            s: merge_histograms([m.get("doc_length_histogram", {}).get(s, {}) for m in shards]) for s in SPLITS
        },
        "sha256": {f"{n}/{s}.bin": m["sha256"][f"{s}.bin"] for n, m in zip(names, shards) for s in SPLITS},
        "chars_per_token": chars / text_tokens,
        "bytes_per_token": nbytes / text_tokens,
        "text_chars": chars,
        "text_bytes": nbytes,
        "skipped": {k: sum(m["skipped"][k] for m in shards) for k in first["skipped"]},
        "skipped_examples": [e for m in shards for e in m["skipped_examples"]][:MAX_SHOWN],
        "files": [f for m in shards for f in m["files"]],
        "tokenizer": "tokenizer",
        "tokenizer_sha256": first["tokenizer_sha256"],
        "tokenizer_source": first["tokenizer_source"],
        "encoder": {
            "name": "tiktoken" if encoders == {"tiktoken"} else "tokenizers",
            "verified_docs": sum(m["encoder"]["verified_docs"] for m in shards),
            **(
                {"shards_on_tokenizers": sum(m["encoder"]["name"] != "tiktoken" for m in shards)}
                if len(encoders) > 1
                else {}
            ),
        },
        "seed": first["seed"],
        "val_fraction": first["val_fraction"],
        "format": job["format"],
        "text_field": job["text_field"],
        "split_blank_lines": job["split_blank_lines"],
    }
