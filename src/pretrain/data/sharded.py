"""`pretrain prepare --tasks N`: the corpus tokenized as N shards, each task run by datatrove's executors.

datatrove (Hugging Face's library for LLM data processing, https://github.com/huggingface/datatrove) runs a list of
pipeline steps as N tasks, locally (LocalPipelineExecutor), as a Slurm job array (SlurmPipelineExecutor) or on a
Ray cluster (RayPipelineExecutor: executors.py), and marks each finished task (`completions/00003`) so a rerun skips
it. Our
step, `TokenizeShard`, is today's single-dataset build (pipeline.build_dataset) run on the task's files: task i reads a
contiguous run of the sorted input files, so the shards in order hold the documents in the order one pass reads
them, and the train/validation split is decided per document from its content (encode.is_validation): the
concatenated shards equal `--tasks 1` byte for byte.

While it runs, everything lives in OUT.partial beside --out (its layout: shard_job.py); an earlier dataset at
--out stays usable. A rerun first forgets (removes, with its completion mark) every finished shard it cannot
use: its meta.json lost, a file of the wrong size. When every task is done, `finish` (shard_manifest.py)
re-hashes every shard against its meta.json, writes the manifest (meta.json: the shards, token counts,
checksums, tokenizer sha256) and swaps OUT.partial in for --out.
"""

from __future__ import annotations

import os
import shutil
from pathlib import Path

from datatrove.pipeline.base import PipelineStep

from ..errors import UsageError
from ..files import check_output_dir, display_path, hidden_prefix, refuse_foreign, writer_lock
from ..lock import exclusive_lock
from .executors import EXECUTORS, SlurmOptions, refuse_while_slurm_builds, run_local, run_ray, submit_slurm
from .preparation import SPLITS, build_dataset, replaceable_names, resolve_dtype
from .readers import Corpus, ReadOptions
from .shard_job import Job, absolute, forget_unusable_shards, open_work_dir, shard_name
from .shard_manifest import finish
from .sources import RemoteFile, find_files
from .tokenizer import find_tokenizer


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
        files=[[absolute(corpus.files[i]) for i in r] for r in split_files(corpus.sizes, tasks)],
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
    open_work_dir(job, corpus, tok)
    forget_unusable_shards(job)
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
