"""`pretrain prepare --tasks N`: the corpus tokenized as N shards, each task run by datatrove's executors.

datatrove (Hugging Face's library for LLM data processing, https://github.com/huggingface/datatrove) runs a list of
pipeline steps as N tasks, locally (LocalPipelineExecutor), as a Slurm job array (SlurmPipelineExecutor) or on a
Ray cluster (RayPipelineExecutor: executors.py), and marks each finished task (`completions/00003`) so a rerun skips
it. Our
step, `TokenizeShard`, is today's single-dataset build (pipeline.build_dataset) run on the task's files: task i reads a
contiguous run of the sorted input files, so the shards in order hold the documents in the order one pass reads
them, and the train/validation split is decided per document from its content (encode.is_validation): the
concatenated shards equal `--tasks 1` byte for byte.

While it runs, everything lives in OUT.partial/ beside --out; an earlier dataset at --out stays usable:
  .pretrain-partial  written first, removed just before the swap: what marks the directory as this command's
                  (one without it is a user's, never deleted)
  job.json        what this build is for (inputs with sizes and mtimes, tokenizer sha256, split, dtype, tasks):
                  a rerun reuses OUT.partial only when it matches, else starts over
  tokenizer/      the tokenizer every task reads (copied once, so a task never depends on the source)
  logs/tokenize/  datatrove's logging_dir of the tokenize tasks (completions/, logs/, stats/)
  locks/          one lock file per task: a task run twice at once (an array submitted again) runs once
  shard_00003/    task 3's shard, built as shard_00003.tmp/ (meta.json last) and renamed: a task that crashed
                  leaves only a .tmp, which the manifest never accepts and the task's rerun deletes
A rerun first forgets (removes, with its completion mark) every finished shard it cannot use: its meta.json
lost, a file of the wrong size. When every task is done, `finish` re-hashes every shard against its meta.json,
writes the manifest (meta.json: the shards, token counts, checksums, tokenizer sha256) and swaps OUT.partial in
for --out.
"""

from __future__ import annotations

import json
import os
import shutil
from dataclasses import dataclass
from pathlib import Path

from datatrove.pipeline.base import PipelineStep

from .. import __version__
from ..errors import UsageError
from ..files import (
    aside_path,
    check_output_dir,
    display_path,
    hidden_prefix,
    refuse_foreign,
    swap_in,
    write_atomic,
    writer_lock,
)
from ..lock import exclusive_lock
from .documents import merge_histograms
from .executors import EXECUTORS, SlurmOptions, refuse_while_slurm_builds, run_local, run_ray, submit_slurm
from .preparation import MAX_SHOWN, META_VERSION, SPLITS, build_dataset, replaceable_names, resolve_dtype
from .readers import Corpus, ReadOptions
from .sources import RemoteFile, file_name, find_files
from .tokenizer import find_tokenizer

PARTIAL_MARK = ".pretrain-partial"  # in OUT.partial from its creation to the swap: it is ours to reuse or delete


def shard_name(task: int) -> str:
    return f"shard_{task:05d}"


def completion_mark(work: Path, task: int) -> Path:
    """datatrove's mark of a finished task (the tokenize tasks' logging_dir is OUT.partial/logs/tokenize)."""
    return work / "logs" / "tokenize" / "completions" / f"{task:05d}"


def split_files(sizes: list[int], tasks: int) -> list[range]:
    """Task t's files: a contiguous run of the sorted files, every task at least one (tasks <= files), cut so
    that the largest run holds as few bytes as any cut can give. Tasks that run at once finish when the largest
    does: cutting after the file that crosses each t/tasks of the bytes gave one of two tasks 5 of 8 files of
    about equal size (docs/benchmarks.md).

    The linear partition problem (Skiena, The Algorithm Design Manual, 2nd ed., sec. 8.5): the least bound on a
    run's bytes that `tasks` runs can meet, by bisection (greedy packing decides whether a bound can be met),
    then the runs greedy packing makes under it."""
    low, high = max(sizes), sum(sizes)
    while low < high:
        bound = (low + high) // 2
        if len(_pack(sizes, bound, tasks)) - 1 <= tasks:
            high = bound
        else:
            low = bound + 1
    cuts = _pack(sizes, low, tasks)
    return [range(a, b) for a, b in zip(cuts, cuts[1:])]


def _pack(sizes: list[int], bound: int, tasks: int) -> list[int]:
    """Where runs of at most `bound` bytes start (and the end), each run as long as it can be while leaving a
    file for every later task: exactly `tasks` runs when `bound` can be met, more when it cannot."""
    cuts, run = [0], 0
    for i, size in enumerate(sizes):
        later_tasks = tasks - len(cuts)  # tasks after the run being packed
        if i > cuts[-1] and (run + size > bound or len(sizes) - i == later_tasks):
            cuts.append(i)
            run = 0
        run += size
    cuts.append(len(sizes))
    return cuts


def prepare_sharded(
    inputs,
    tokenizer,
    out_dir,
    *,
    tasks: int,
    executor: str = "local",
    workers: int | None = None,
    slurm: SlurmOptions | None = None,
    val_fraction: float = 0.01,
    seed: int = 1234,
    dtype: str = "auto",
    strict: bool = False,
    format: str = "auto",
    text_field: str = "text",
    split_blank_lines: bool = False,
    fast_path: bool = False,
) -> dict | None:
    """Tokenize `inputs` into a sharded dataset at `out_dir`; returns its manifest (meta.json), or None for
    Slurm, whose job array and final manifest job are submitted, not waited for.

    workers: tasks run at once (local: default all cores; Ray: default the cluster's CPUs; Slurm: the array's
    %limit, default none). Each task encodes in one process: the tasks are the parallelism.
    """
    _check_arguments(executor, tasks, workers, slurm, val_fraction)
    options = ReadOptions(format, text_field, split_blank_lines)
    corpus = Corpus(find_files(inputs), options)  # checks the format and that every input exists
    if tasks > len(corpus.files):
        raise UsageError(
            f"--tasks {tasks} is more than the {len(corpus.files)} input files: a task reads whole "
            f"files; use --tasks {len(corpus.files)} or fewer, or split the corpus into more files"
        )
    tok = find_tokenizer(tokenizer)
    dtype = resolve_dtype(dtype, tok.vocab_size)
    final = Path(os.path.realpath(out_dir))
    check_output_dir(final, "--out")
    # One writer per --out, a plain prepare included: a second launcher would rebuild or rewrite OUT.partial under
    # the first. Held until this function returns.
    launcher = writer_lock(final, "--out")
    refuse_foreign(final, "--out", replaceable_names(final))
    # A Slurm build outlives its launcher, and so this lock: the job ids stand in for it.
    slurm_jobs = final.with_name(f"{hidden_prefix(final)}.slurm-jobs.json")
    refuse_while_slurm_builds(slurm_jobs, f"--out {display_path(final)}")

    job = Job(
        files=[[_absolute(corpus.files[i]) for i in r] for r in split_files(corpus.sizes, tasks)],
        work=str(final.with_name(final.name + ".partial")),
        final=str(final),
        seed=seed,
        val_fraction=val_fraction,
        dtype=dtype,
        strict=strict,
        fast_path=fast_path,
        format=format,
        text_field=text_field,
        split_blank_lines=split_blank_lines,
    )
    _open_work_dir(job, corpus, tok)
    _forget_unusable_shards(job)
    if executor == "slurm":
        assert slurm is not None  # _check_arguments refused --executor slurm without its options
        submit_slurm(
            [TokenizeShard(job)], [WriteManifest(job)], Path(job.work) / "logs", tasks, workers, slurm, slurm_jobs
        )
        launcher.release()  # the array runs after this returns: each of its tasks takes its own lock
        return None
    run = run_local if executor == "local" else run_ray
    run([TokenizeShard(job)], tasks, workers, str(Path(job.work) / "logs" / "tokenize"))
    return finish(job)


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


def _check_arguments(
    executor: str, tasks: int, workers: int | None, slurm: SlurmOptions | None, val_fraction: float
) -> None:
    """The flags on their own, before any input is read."""
    if executor not in EXECUTORS:
        raise UsageError(f"--executor {executor!r} is unknown; use one of {' | '.join(EXECUTORS)}")
    if tasks < 1:
        raise UsageError(f"--tasks {tasks} must be at least 1")
    if workers is not None and workers < 1:
        raise UsageError(f"--workers {workers} must be at least 1")
    if executor == "slurm" and (slurm is None or not slurm.partition):
        raise UsageError("--executor slurm needs --slurm-partition (the partition the job array runs on)")
    if executor == "slurm" and shutil.which("sbatch") is None:
        raise UsageError(
            "--executor slurm needs Slurm's sbatch, which is not on PATH: run prepare on a node that "
            "submits jobs (a login node), or use --executor local"
        )
    if not 0 <= val_fraction < 1:
        raise UsageError(f"--val-fraction {val_fraction} is out of range; give a fraction in [0, 1), e.g. 0.01")


def _absolute(path: Path | RemoteFile) -> str | RemoteFile:
    """A file as every task finds it, whatever its working directory: an absolute path, or the URL."""
    return path if isinstance(path, RemoteFile) else os.path.abspath(path)


def _open_work_dir(job: Job, corpus: Corpus, tok) -> None:
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
            {"path": file_name(_absolute(p)), "bytes": p.stat().st_size, "mtime_ns": p.stat().st_mtime_ns}
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


def _forget_unusable_shards(job: Job) -> None:
    """A finished shard this run cannot use (its meta.json lost, a file cut short, a directory left without
    meta.json) is removed with its completion mark, so the executor runs its task again: it is in our own
    OUT.partial. The checks that read every byte (sha256) wait for `finish`, where every shard is checked."""
    from .loader import PreparedData

    work = Path(job.work)
    for task in range(len(job.files)):
        shard = work / shard_name(task)
        try:
            if shard.exists():
                PreparedData(shard, verify="size")
            elif completion_mark(work, task).exists():
                _forget(work, task)
        except UsageError:
            _forget(work, task)


def _forget(work: Path, task: int) -> None:
    shutil.rmtree(work / shard_name(task), ignore_errors=True)
    completion_mark(work, task).unlink(missing_ok=True)


class JobStep(PipelineStep):
    """A datatrove pipeline step of this job. datatrove runs a step as step.run(data, rank, world_size); ours
    read their own files (a reader step's Document objects would add a copy of every text and nothing we use)
    and pass nothing on."""

    type = "pretrain"

    def __init__(self, job: Job):
        super().__init__()
        self.job = job


class TokenizeShard(JobStep):
    """Task `rank`: pipeline.build_dataset on its files into shard_{rank:05d}/."""

    name = "tokenize shard"

    def run(self, data=None, rank: int = 0, world_size: int = 1):
        job = self.job
        if world_size != len(job.files):
            raise RuntimeError(f"executor runs {world_size} tasks, the job has {len(job.files)}")
        work = Path(job.work)
        shard = work / shard_name(rank)
        if (shard / "meta.json").is_file():
            return None  # finished by a run killed before datatrove marked it complete
        # One run of a task at a time: a Slurm array submitted again while the first still runs would
        # otherwise delete and rewrite this task's staging directory under it.
        lock = exclusive_lock(
            work / "locks" / f"{shard.name}.lock",
            f"task {rank} of {display_path(job.final)}",
            "another run of the same job is running it: wait for it to end or stop it",
        )
        if (shard / "meta.json").is_file():
            return None  # finished while this run waited to start
        staging = work / f"{shard.name}.tmp"
        shutil.rmtree(staging, ignore_errors=True)  # a crashed attempt's
        staging.mkdir()
        os.environ["TOKENIZERS_PARALLELISM"] = "false"  # one core per task: no tokenizers thread pool
        os.environ["RAYON_NUM_THREADS"] = "1"
        from .fast_bpe import why_not_fast

        tok = find_tokenizer(work / "tokenizer")
        why_not = why_not_fast(tok.json) if job.fast_path else "not asked for (--fast-path)"
        corpus = Corpus([p if isinstance(p, RemoteFile) else Path(p) for p in job.files[rank]], job.read_options)
        with self.track_time("shard"):
            meta = build_dataset(
                staging,
                corpus,
                tok,
                job.dtype,
                why_not,
                seed=job.seed,
                val_fraction=job.val_fraction,
                workers=1,
                strict=job.strict,
                progress=False,
                allow_empty=True,
                format=job.format,
                text_field=job.text_field,
                split_blank_lines=job.split_blank_lines,
            )
        os.rename(staging, shard)
        lock.release()
        for split in SPLITS:  # datatrove's stats.json, per task and summed
            self.stat_update(f"{split}_tokens", value=meta["num_tokens"][split], unit="shard")
            self.stat_update(f"{split}_docs", value=meta["num_docs"][split], unit="shard")
        return None


class WriteManifest(JobStep):
    """The Slurm job that runs after the array: `finish` (a dependent job, as datatrove's `depends=` makes)."""

    name = "write manifest"

    def run(self, data=None, rank: int = 0, world_size: int = 1):
        finish(self.job)
        return None


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
        _forget(work, task)
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
