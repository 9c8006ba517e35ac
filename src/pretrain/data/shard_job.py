"""A sharded build's job and its work directory: what the build is for (`Job`, written as job.json), and
OUT.partial, where everything lives until the swap, opened or reused and its unusable shards forgotten.

Its own module because the launcher and the tasks' pipeline steps (sharded.py) and the end of the build
(shard_manifest.py) all work in it. OUT.partial, beside --out:
  .pretrain-partial  written first, removed just before the swap: what marks the directory as this command's
                  (one without it is a user's, never deleted)
  job.json        what this build is for (inputs with sizes and mtimes, tokenizer sha256, split, dtype, tasks):
                  a rerun reuses OUT.partial only when it matches, else starts over
  tokenizer/      the tokenizer every task reads (copied once, so a task never depends on the source)
  logs/tokenize/  datatrove's logging_dir of the tokenize tasks (completions/, logs/, stats/)
  locks/          one lock file per task: a task run twice at once (an array submitted again) runs once
  shard_00003/    task 3's shard, built as shard_00003.tmp/ (meta.json last) and renamed: a task that crashed
                  leaves only a .tmp, which the manifest never accepts and the task's rerun deletes
"""

from __future__ import annotations

import json
import os
import shutil
from dataclasses import dataclass
from pathlib import Path

from .. import __version__
from ..errors import UsageError
from ..files import display_path, write_atomic
from .readers import Corpus, ReadOptions
from .sources import RemoteFile, file_name

PARTIAL_MARK = ".pretrain-partial"  # in OUT.partial from its creation to the swap: it is ours to reuse or delete


def shard_name(task: int) -> str:
    return f"shard_{task:05d}"


def completion_mark(work: Path, task: int) -> Path:
    """datatrove's mark of a finished task (the tokenize tasks' logging_dir is OUT.partial/logs/tokenize)."""
    return work / "logs" / "tokenize" / "completions" / f"{task:05d}"


@dataclass(frozen=True)
class Job:
    """Everything a task needs, pickled into each (datatrove pickles the pipeline for its workers and jobs)."""

    files: list[list[str | RemoteFile]]  # per task, absolute paths (or fsspec URLs) in read order
    work: str  # OUT.partial
    final: str  # --out, symlinks resolved
    seed: int
    val_fraction: float
    dtype: str
    strict: bool
    fast_path: bool
    format: str
    text_field: str
    split_blank_lines: bool

    @property
    def read_options(self) -> ReadOptions:
        return ReadOptions(self.format, self.text_field, self.split_blank_lines)


def absolute(path: Path | RemoteFile) -> str | RemoteFile:
    """A file as every task finds it, whatever its working directory: an absolute path, or the URL."""
    return path if isinstance(path, RemoteFile) else os.path.abspath(path)


def open_work_dir(job: Job, corpus: Corpus, tok) -> None:
    """OUT.partial with job.json and tokenizer/: the one a killed run of the same command left, else a new one.
    An OUT.partial without our mark was not made here (a user's dataset, say): refused, never deleted."""
    work = Path(job.work)
    if (work.exists() or work.is_symlink()) and not (work / PARTIAL_MARK).is_file():
        raise UsageError(
            f"{display_path(work)} is in the way: `prepare --tasks` builds --out there, and did not make "
            f"this one (no {PARTIAL_MARK} in it); move it away, then run again"
        )
    fingerprint = {
        "pretrain_version": __version__,
        "inputs": [
            {"path": file_name(absolute(p)), "bytes": p.stat().st_size, "mtime_ns": p.stat().st_mtime_ns}
            for p in corpus.files
        ],
        "tasks": [[file_name(p) for p in files] for files in job.files],
        "tokenizer_sha256": tok.sha256,
        "seed": job.seed,
        "val_fraction": job.val_fraction,
        "dtype": job.dtype,
        "strict": job.strict,
        "fast_path": job.fast_path,
        "format": job.format,
        "text_field": job.text_field,
        "split_blank_lines": job.split_blank_lines,
    }
    text = json.dumps(fingerprint, indent=2, ensure_ascii=False) + "\n"
    job_file = work / "job.json"
    if job_file.is_file() and job_file.read_text(encoding="utf-8") == text and (work / "tokenizer").is_dir():
        return  # the same command's unfinished build: its finished tasks are kept
    shutil.rmtree(work, ignore_errors=True)  # another command's, or a build killed before writing job.json
    work.mkdir(parents=True)
    (work / PARTIAL_MARK).write_text(f"made by `pretrain prepare --tasks` for --out {display_path(job.final)}\n")
    tok.save(work / "tokenizer")
    write_atomic(job_file, text)  # last: a work dir with job.json is complete enough to resume


def forget_unusable_shards(job: Job) -> None:
    """A finished shard this run cannot use (its meta.json lost, a file cut short, a directory left without
    meta.json) is removed with its completion mark, so the executor runs its task again: it is in our own
    OUT.partial. The checks that read every byte (sha256) wait for `finish` (shard_manifest.py), where every shard is
    checked."""
    from .loader import PreparedData

    work = Path(job.work)
    for task in range(len(job.files)):
        shard = work / shard_name(task)
        try:
            if shard.exists():
                PreparedData(shard, verify="size")
            elif completion_mark(work, task).exists():
                forget_shard(work, task)
        except UsageError:
            forget_shard(work, task)


def forget_shard(work: Path, task: int) -> None:
    shutil.rmtree(work / shard_name(task), ignore_errors=True)
    completion_mark(work, task).unlink(missing_ok=True)
