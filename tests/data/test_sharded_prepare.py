"""`pretrain prepare --tasks N`: shards made by datatrove's executors equal one pass, survive a SIGKILL (only
the unfinished tasks are redone), run through a stand-in Slurm and on a local Ray, and read in place."""

from __future__ import annotations

import itertools
import json
import os
import random
import shutil
import stat
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import psutil
import pytest
from test_prepare_reliability import snapshot

from pretrain.data.loader import PreparedData
from pretrain.data.readers import render_encyclopedia
from pretrain.data.shard_job import PARTIAL_MARK
from pretrain.data.sharded import split_files
from pretrain.data.windows import RandomWindows
from pretrain.errors import UsageError
from pretrain.lock import exclusive_lock
from support import tiny

SPLITS = ("train", "val")


@pytest.fixture(scope="module")
def corpus(tmp_path_factory, shakespeare, zh_classics) -> Path:
    """Eight files in sorted order: the Shakespeare slice cut in six text files (blank-line documents) and the
    Chinese JSONL cut in two, so tasks get files of both formats."""
    folder = tmp_path_factory.mktemp("multi")
    speeches = shakespeare.read_text(encoding="utf-8").split("\n\n")
    for i in range(6):
        (folder / f"a{i}.txt").write_text("\n\n".join(speeches[i::6]), encoding="utf-8")
    lines = zh_classics.read_text(encoding="utf-8").splitlines(keepends=True)
    (folder / "b0.jsonl").write_text("".join(lines[::2]), encoding="utf-8")
    (folder / "b1.jsonl").write_text("".join(lines[1::2]), encoding="utf-8")
    return folder


def prepare(cli, corpus, bpe_dir, out, *extra, **kw):
    r = cli(
        "prepare",
        "--input",
        corpus,
        "--tokenizer",
        bpe_dir,
        "--out",
        out,
        "--split-blank-lines",
        "--val-fraction",
        0.1,
        *extra,
        **kw,
    )
    assert r.returncode == 0, r.stderr[-3000:]
    return r


def concatenated(out: Path, split: str) -> bytes:
    meta = json.loads((out / "meta.json").read_text())
    return b"".join((out / name / f"{split}.bin").read_bytes() for name in meta["shards"])


@pytest.fixture(scope="module")
def one_pass(tmp_path_factory, corpus, bpe_dir) -> Path:
    """Today's single-process prepare of the corpus: what every sharded build must equal."""
    out = tmp_path_factory.mktemp("one") / "out"
    subprocess.run(
        [
            sys.executable,
            "-m",
            "pretrain",
            "prepare",
            "--input",
            corpus,
            "--tokenizer",
            bpe_dir,
            "--out",
            out,
            "--split-blank-lines",
            "--val-fraction",
            "0.1",
            "--workers",
            "1",
        ],
        check=True,
        capture_output=True,
    )
    return out


def assert_same_dataset(sharded: Path, one_pass: Path) -> None:
    single = json.loads((one_pass / "meta.json").read_text())
    meta = json.loads((sharded / "meta.json").read_text())
    for split in SPLITS:
        assert concatenated(sharded, split) == (one_pass / f"{split}.bin").read_bytes(), split
    assert meta["num_docs"] == single["num_docs"] and meta["num_tokens"] == single["num_tokens"]
    assert meta["doc_length_histogram"] == single["doc_length_histogram"]  # the shards' merged
    assert meta["tokenizer_sha256"] == single["tokenizer_sha256"]


@pytest.mark.parametrize("tasks", [1, 4])
def test_shards_concatenate_to_one_pass(tasks, tmp_path, corpus, bpe_dir, one_pass, cli):
    out = tmp_path / "out"
    r = prepare(cli, corpus, bpe_dir, out, "--tasks", tasks, "--executor", "local", "--workers", 2)
    meta = json.loads((out / "meta.json").read_text())
    assert meta["shards"] == [f"shard_{i:05d}" for i in range(tasks)]
    assert_same_dataset(out, one_pass)
    assert sorted(meta["sha256"]) == sorted(f"shard_{i:05d}/{s}.bin" for i in range(tasks) for s in SPLITS)
    assert (out / "tokenizer" / "tokenizer.json").read_bytes() == (bpe_dir / "tokenizer.json").read_bytes()
    assert not (tmp_path / "out.partial").exists() and not list(out.rglob("*.tmp"))
    assert f"shards     {tasks} (local executor)" in r.stdout


def test_the_loader_reads_shards_in_place_as_one_dataset(tmp_path, corpus, bpe_dir, one_pass, cli):
    out = tmp_path / "out"
    prepare(cli, corpus, bpe_dir, out, "--tasks", 3)
    sharded, single = PreparedData(out, verify="full"), PreparedData(one_pass)
    for split in SPLITS:
        assert np.array_equal(np.asarray(sharded.tokens(split)), single.tokens(split))
        assert np.array_equal(np.asarray(sharded.doc_starts(split)), single.doc_starts(split))
    # a window crossing from one shard into the next, through the maps and as the trainer's batches read them
    boundary = len(sharded.shards[0].tokens("train"))
    rows = boundary - 5 + np.arange(10)[None, :] + np.array([[0], [1]])
    assert np.array_equal(sharded.tokens("train")[rows], single.tokens("train")[rows])
    assert np.array_equal(sharded.read("train", rows[:, 0], 10), single.tokens("train")[rows])
    # the trainer's batches: the same windows, the same tokens
    a, b = RandomWindows(sharded, "train", 32, seed=3), RandomWindows(single, "train", 32, seed=3)
    for _ in range(4):
        for x, y in zip(a.next_batch(8), b.next_batch(8)):
            assert x.equal(y)


def test_shards_of_different_tokenizers_are_a_one_line_error(tmp_path, corpus, bpe_dir, small_corpus, cli):
    out = tmp_path / "out"
    prepare(cli, corpus, bpe_dir, out, "--tasks", 2)
    from pretrain.data import train_tokenizer

    other_tok = tmp_path / "other_tok"
    train_tokenizer([small_corpus], 700, other_tok, split_blank_lines=True)
    other = tmp_path / "other"
    prepare(cli, corpus, other_tok, other, "--tasks", 2)
    shutil.rmtree(out / "shard_00001")
    shutil.copytree(other / "shard_00001", out / "shard_00001")
    with pytest.raises(UsageError) as e:
        PreparedData(out)
    assert "another tokenizer" in str(e.value) and "shard_00001" in str(e.value) and "\n" not in str(e.value)


def wait_for(predicate, proc, timeout=120):
    deadline = time.time() + timeout
    while time.time() < deadline:
        if predicate():
            return
        if proc.poll() is not None:
            raise AssertionError(f"prepare ended early: {proc.stderr.read()[-2000:]}")
        time.sleep(0.02)
    raise AssertionError("prepare made no progress")


def bigger(corpus: Path, folder: Path, times: int = 6) -> Path:
    """The corpus with each file `times` as long (each of 8 tasks ~0.3 s for 6)."""
    folder.mkdir()
    for f in sorted(corpus.iterdir()):
        (folder / f.name).write_bytes(
            f.read_bytes() * times if f.suffix == ".jsonl" else b"\n\n".join([f.read_bytes()] * times)
        )
    return folder


def test_a_killed_prepare_redoes_only_unfinished_tasks(tmp_path, corpus, bpe_dir, one_pass, cli):
    # 8 tasks on a corpus 6x the fixtures, two at a time: killed after the first finishes
    big = bigger(corpus, tmp_path / "big")
    out = tmp_path / "out"
    shutil.copytree(one_pass, out)  # an earlier dataset at --out: usable until the new one is complete
    args = [
        "prepare",
        "--input",
        big,
        "--tokenizer",
        bpe_dir,
        "--out",
        out,
        "--split-blank-lines",
        "--val-fraction",
        0.1,
        "--tasks",
        8,
        "--workers",
        2,
    ]
    completions = tmp_path / "out.partial" / "logs" / "tokenize" / "completions"
    proc = subprocess.Popen(
        [sys.executable, "-m", "pretrain", *map(str, args)], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
    )
    wait_for(lambda: completions.is_dir() and any(completions.iterdir()), proc)
    proc.kill()  # SIGKILL: nothing in prepare runs
    proc.wait()
    proc.stdout.close()  # not communicate(): an orphan holding the pipes would block it
    proc.stderr.close()
    # its forked workers and datatrove's Manager go with it (none may keep writing a shard)
    deadline = time.time() + 5
    while time.time() < deadline and _processes_naming(out):
        time.sleep(0.1)
    assert not _processes_naming(out)
    done = sorted(p.name for p in completions.iterdir())
    assert 0 < len(done) < 8, f"the kill came too late to test a resume: {done}"
    kept = {name: _identity(tmp_path / "out.partial" / f"shard_{name}") for name in done}
    old = PreparedData(out, verify="full")  # still the earlier dataset, whole
    assert old.shards is None and np.array_equal(old.tokens("train"), PreparedData(one_pass).tokens("train"))

    r = cli(*args)
    assert r.returncode == 0, r.stderr[-3000:]
    assert f"{len(done)} of 8 tasks were done by an earlier run; running the other {8 - len(done)}" in r.stderr
    for name, identity in kept.items():  # finished shards are not rebuilt: the same files, untouched
        assert _identity(out / f"shard_{name}") == identity
    reference = tmp_path / "reference"
    r = cli(*[str(a).replace(str(out), str(reference)) for a in args])
    assert r.returncode == 0, r.stderr[-3000:]
    for split in SPLITS:
        assert concatenated(out, split) == concatenated(reference, split)
    assert not list(out.rglob("*.tmp"))


def _identity(shard: Path) -> tuple:
    return tuple((f.name, f.stat().st_ino, f.stat().st_mtime_ns) for f in sorted(shard.glob("*.bin")))


def _processes_naming(path: Path) -> list[int]:
    found = []
    for p in psutil.process_iter(["cmdline"]):
        if str(path) in " ".join(p.info["cmdline"] or []):
            found.append(p.pid)
    return found


def as_killed(build: Path, partial: Path) -> Path:
    """A finished build copied to `partial` as prepare leaves one killed after its last task: its shards and
    completion marks, prepare's mark, no manifest."""
    shutil.copytree(build, partial)
    (partial / "meta.json").unlink()
    (partial / PARTIAL_MARK).write_text("made by `pretrain prepare --tasks`\n")
    return partial


def test_a_changed_command_does_not_reuse_a_partial_build(tmp_path, corpus, bpe_dir, one_pass, cli):
    out = tmp_path / "out"
    prepare(cli, corpus, bpe_dir, tmp_path / "seed5", "--tasks", 2, "--seed", 5)
    as_killed(tmp_path / "seed5", tmp_path / "out.partial")  # a killed run of another command (seed 5)
    prepare(cli, corpus, bpe_dir, out, "--tasks", 2)
    assert_same_dataset(out, one_pass)


def _fake_slurm(bin_dir: Path) -> None:
    """sbatch, srun, scontrol and squeue stand-ins: sbatch runs each array task of the script it is given right
    away (SLURM_ARRAY_TASK_ID = 0, 1, ...), output to stderr, and answers "Submitted batch job ID" as sbatch
    does; with FAKE_SLURM_QUEUE set it runs nothing and queues the job there instead, for squeue to list."""
    scripts = {
        "sbatch": r"""#!/bin/bash
script="${@: -1}"
cp "$script" "$FAKE_SLURM_DIR/submitted_$(ls "$FAKE_SLURM_DIR" | wc -l).slurm"
for arg in "$@"; do
  case "$arg" in --export=ALL,*) export ${arg#--export=ALL,};; esac
done
array=$(sed -n 's/^#SBATCH --array=\([0-9]*-[0-9]*\).*/\1/p' "$script")
array=${array:-0-0}
export SLURM_JOB_ID=$((1000 + $(ls "$FAKE_SLURM_DIR" | wc -l))) SLURM_NODELIST=localhost
if [ -n "$FAKE_SLURM_QUEUE" ]; then
  echo "$SLURM_JOB_ID PENDING Dependency" >> "$FAKE_SLURM_QUEUE"
else
  for ((i=${array%-*}; i<=${array#*-}; i++)); do
    SLURM_ARRAY_TASK_ID=$i bash "$script" >&2 || exit 1
  done
fi
echo "Submitted batch job $SLURM_JOB_ID"
""",
        "squeue": r"""#!/bin/bash
for arg in "$@"; do case "$arg" in --jobs=*) jobs=${arg#--jobs=};; esac; done
[ -f "$FAKE_SLURM_QUEUE" ] && grep -E "^(${jobs//,/|}) " "$FAKE_SLURM_QUEUE"
exit 0
""",
        "srun": r"""#!/bin/bash
while [ $# -gt 0 ]; do case "$1" in -n) shift 2;; -*) shift;; *) break;; esac; done
exec "$@"
""",
        "scontrol": r"""#!/bin/bash
[ "$1" = show ] && [ "$2" = hostnames ] && echo "$3"
""",
    }
    bin_dir.mkdir()
    for name, text in scripts.items():
        (bin_dir / name).write_text(text)
        (bin_dir / name).chmod(stat.S_IRWXU)


def test_slurm_job_script_runs_the_array_through_a_stand_in_sbatch(tmp_path, corpus, bpe_dir, one_pass):
    _fake_slurm(tmp_path / "bin")
    submitted = tmp_path / "submitted"
    submitted.mkdir()
    env = {
        **os.environ,
        "PATH": f"{tmp_path / 'bin'}{os.pathsep}{os.environ['PATH']}",
        "FAKE_SLURM_DIR": str(submitted),
    }
    out = tmp_path / "out"
    r = subprocess.run(
        [
            sys.executable,
            "-m",
            "pretrain",
            "prepare",
            "--input",
            corpus,
            "--tokenizer",
            bpe_dir,
            "--out",
            out,
            "--split-blank-lines",
            "--val-fraction",
            "0.1",
            "--tasks",
            "3",
            "--executor",
            "slurm",
            "--slurm-partition",
            "cpu",
            "--slurm-time",
            "2:00:00",
            "--sbatch",
            "account=proj",
        ],
        capture_output=True,
        text=True,
        env=env,
        timeout=600,
    )
    assert r.returncode == 0, r.stderr[-3000:]
    assert "submitted 3 Slurm array tasks" in r.stdout
    array_job = (submitted / "submitted_0.slurm").read_text()
    for line in (
        "#SBATCH --array=0-2",
        "#SBATCH --partition=cpu",
        "#SBATCH --time=2:00:00",
        "#SBATCH --cpus-per-task=1",
        "#SBATCH --account=proj",
        "launch_pickled_pipeline",
    ):
        assert line in array_job, array_job
    assert "--qos" not in array_job  # none unless asked: a cluster without a "normal" QOS refuses one
    assert_same_dataset(out, one_pass)  # the manifest job ran after the array, and swapped the dataset in


def test_a_second_launcher_is_refused_while_the_slurm_job_runs(tmp_path, corpus, bpe_dir, one_pass):
    # The launcher returns once the array is queued; until the job ends, OUT.partial is the job's.
    _fake_slurm(tmp_path / "bin")
    (tmp_path / "submitted").mkdir()
    queue = tmp_path / "queue"
    env = {
        **os.environ,
        "PATH": f"{tmp_path / 'bin'}{os.pathsep}{os.environ['PATH']}",
        "FAKE_SLURM_DIR": str(tmp_path / "submitted"),
        "FAKE_SLURM_QUEUE": str(queue),
    }
    out = tmp_path / "out"
    args = [
        sys.executable,
        "-m",
        "pretrain",
        "prepare",
        "--input",
        corpus,
        "--tokenizer",
        bpe_dir,
        "--out",
        out,
        "--split-blank-lines",
        "--val-fraction",
        "0.1",
        "--tasks",
        "3",
    ]
    slurm = ["--executor", "slurm", "--slurm-partition", "cpu"]
    r = subprocess.run([*args, *slurm], capture_output=True, text=True, env=env, timeout=300)
    assert r.returncode == 0 and "submitted 3 Slurm array tasks" in r.stdout, r.stderr[-3000:]
    partial = tmp_path / "out.partial"
    before = sorted((p.relative_to(partial), p.stat().st_mtime_ns) for p in partial.rglob("*"))
    for again in (slurm, ["--seed", "7", *slurm], ["--executor", "local"]):  # the same command, another, local
        r = subprocess.run([*args, *again], capture_output=True, text=True, env=env, timeout=300)
        assert r.returncode == 2, r.stderr[-3000:]
        (line,) = r.stderr.strip().splitlines()
        assert "is being built by Slurm job 1001,1003 (squeue: 1003 PENDING Dependency)" in line, line
        assert "scancel 1001 1003" in line  # the array and the manifest job (1002: datatrove's stats job)
    assert sorted((p.relative_to(partial), p.stat().st_mtime_ns) for p in partial.rglob("*")) == before
    queue.write_text("")  # the job has ended (cancelled): the next launcher goes on
    r = subprocess.run([*args, "--executor", "local"], capture_output=True, text=True, env=env, timeout=300)
    assert r.returncode == 0, r.stderr[-3000:]
    assert_same_dataset(out, one_pass)


def test_a_failing_task_is_one_line_on_the_terminal_and_details_in_its_log(tmp_path, corpus, bpe_dir, jsonl, cli):
    bad = tmp_path / "bad"
    shutil.copytree(corpus, bad)
    jsonl(bad / "b2.jsonl", [{"text": "fine"}, b"{not json"])  # the last task's file: its task fails (--strict)
    r = cli(
        "prepare",
        "--input",
        bad,
        "--tokenizer",
        bpe_dir,
        "--out",
        tmp_path / "out",
        "--split-blank-lines",
        "--tasks",
        3,
        "--workers",
        2,
        "--strict",
    )
    assert r.returncode == 2, r.stderr[-3000:]
    assert len(r.stderr.splitlines()) <= 5, r.stderr[-3000:]
    last = r.stderr.splitlines()[-1]
    assert last.startswith("pretrain prepare: error: ") and "b2.jsonl:2: malformed JSON" in last
    assert "Traceback" not in r.stderr and "datatrove" not in r.stderr
    logs = tmp_path / "out.partial" / "logs" / "tokenize"
    task_log = (logs / "logs" / "task_00002.log").read_text()
    assert "b2.jsonl:2: malformed JSON" in task_log and "Traceback" in task_log  # datatrove's details
    assert "tasks completed" in (logs / "launcher.log").read_text()


def test_slurm_without_sbatch_is_one_line_and_creates_nothing(tmp_path, corpus, bpe_dir):
    (tmp_path / "empty").mkdir()
    out = tmp_path / "out"
    r = subprocess.run(
        [
            sys.executable,
            "-m",
            "pretrain",
            "prepare",
            "--input",
            corpus,
            "--tokenizer",
            bpe_dir,
            "--out",
            out,
            "--tasks",
            "3",
            "--executor",
            "slurm",
            "--slurm-partition",
            "cpu",
        ],
        capture_output=True,
        text=True,
        env={**os.environ, "PATH": str(tmp_path / "empty")},
        timeout=300,
    )
    assert r.returncode == 2, r.stderr[-3000:]
    (line,) = r.stderr.strip().splitlines()
    assert "--executor slurm needs Slurm's sbatch, which is not on PATH" in line
    assert sorted(p.name for p in tmp_path.iterdir()) == ["empty"]  # no out, no out.partial, no lock


def test_ray_executor_on_a_local_instance(tmp_path, corpus, bpe_dir, one_pass, cli):
    pytest.importorskip("ray")
    out = tmp_path / "out"
    r = prepare(cli, corpus, bpe_dir, out, "--tasks", 4, "--executor", "ray", "--workers", 2)  # ray.init(num_cpus=2)
    assert_same_dataset(out, one_pass)
    assert not r.stderr  # Ray's and datatrove's logs are in the log files
    assert (tmp_path / "out" / "logs" / "tokenize" / "completions" / "00003").is_file()


def test_a_killed_launcher_takes_its_local_ray_instance_with_it(tmp_path, corpus, bpe_dir):
    pytest.importorskip("ray")
    out, big = tmp_path / "out", bigger(corpus, tmp_path / "big", 30)
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "pretrain",
            "prepare",
            "--input",
            big,
            "--tokenizer",
            bpe_dir,
            "--out",
            out,
            "--split-blank-lines",
            "--tasks",
            "8",
            "--workers",
            "2",
            "--executor",
            "ray",
        ],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    wait_for(lambda: list((tmp_path / "out.partial").glob("shard_*")), proc)  # the Ray tasks are running
    instance = psutil.Process(proc.pid).children(recursive=True)  # GCS, raylet, agents, workers, their forks
    assert any(p.name().startswith("ray::") for p in instance)
    proc.kill()  # SIGKILL: nothing in prepare runs
    proc.wait()
    deadline = time.time() + 10
    while time.time() < deadline and _running(instance):
        time.sleep(0.2)
    assert not _running(instance), [p.name() for p in _running(instance)]


def _running(processes: list[psutil.Process]) -> list[psutil.Process]:
    """Those still running (a zombie has ended: its parent, perhaps init, has not collected it yet)."""
    alive = []
    for p in processes:
        try:
            if p.is_running() and p.status() != psutil.STATUS_ZOMBIE:
                alive.append(p)
        except psutil.NoSuchProcess:
            pass
    return alive


def test_hugging_face_dataset_directories_and_arrow_files(tmp_path, bpe_dir, zh_classics, cli):
    datasets = pytest.importorskip("datasets")
    records = [json.loads(x) for x in zh_classics.read_text(encoding="utf-8").splitlines()]
    texts = [render_encyclopedia(r) for r in records]  # the documents prepare reads from the JSONL
    reference = tmp_path / "reference"
    prepare(cli, zh_classics, bpe_dir, reference, "--workers", 1)

    saved = tmp_path / "hf"
    datasets.Dataset.from_dict({"content": texts, "n": list(range(len(texts)))}).save_to_disk(str(saved))
    from_disk = tmp_path / "from_disk"
    prepare(cli, saved, bpe_dir, from_disk, "--text-field", "content", "--workers", 1)
    sharded = tmp_path / "sharded"  # its .arrow files, two tasks (save_to_disk writes several when asked)
    datasets.Dataset.from_dict({"content": texts}).save_to_disk(str(tmp_path / "hf2"), num_shards=2)
    prepare(cli, tmp_path / "hf2", bpe_dir, sharded, "--text-field", "content", "--tasks", 2)
    for split in SPLITS:
        want = (reference / f"{split}.bin").read_bytes()
        assert (from_disk / f"{split}.bin").read_bytes() == want
        assert concatenated(sharded, split) == want

    import pyarrow as pa
    import pyarrow.feather

    pyarrow.feather.write_feather(pa.table({"text": texts}), tmp_path / "file_format.arrow")
    arrow = tmp_path / "arrow"
    prepare(cli, tmp_path / "file_format.arrow", bpe_dir, arrow, "--workers", 1)
    assert (arrow / "train.bin").read_bytes() == (reference / "train.bin").read_bytes()

    datasets.DatasetDict({"train": datasets.Dataset.from_dict({"text": texts})}).save_to_disk(str(tmp_path / "dd"))
    r = cli("prepare", "--input", tmp_path / "dd", "--tokenizer", bpe_dir, "--out", tmp_path / "x")
    assert r.returncode == 2 and "DatasetDict" in r.stderr and f"--input {tmp_path / 'dd' / 'train'}" in r.stderr
    assert len(r.stderr.strip().splitlines()) == 1


@pytest.mark.parametrize(
    "extra, message",
    [
        (["--tasks", "9"], "--tasks 9 is more than the 8 input files"),
        (["--tasks", "2", "--executor", "slurm"], "--executor slurm needs --slurm-partition"),
        (["--tasks", "0"], "--tasks 0 must be at least 1"),
    ],
)
def test_bad_sharding_options_are_one_line_before_any_work(extra, message, tmp_path, corpus, bpe_dir, cli):
    r = cli("prepare", "--input", corpus, "--tokenizer", bpe_dir, "--out", tmp_path / "out", *extra)
    assert r.returncode == 2 and message in r.stderr, r.stderr
    assert len(r.stderr.strip().splitlines()) == 1
    assert not (tmp_path / "out.partial").exists()


def test_the_largest_task_gets_as_few_bytes_as_any_cut_gives():
    # The eight files of `bench_prepare.py --sharded --mb 120`: cutting after the file that crossed half the bytes
    # gave task 0 five of them (80 MB against 48 MB), and --tasks 2 took the larger task's time.
    sizes = [15_781_956, 15_843_578, 15_856_152, 15_853_382, 16_774_339, 15_982_206, 16_027_011, 16_026_803]
    assert split_files(sizes, 2) == [range(0, 4), range(4, 8)]
    rng = random.Random(0)
    for _ in range(300):  # against every possible cut of small cases, empty files included
        sizes = [rng.choice([0, 1, 2, 3, 5, 8, 13, 100]) for _ in range(rng.randint(1, 8))]
        tasks = rng.randint(1, len(sizes))
        runs = split_files(sizes, tasks)
        assert [i for r in runs for i in r] == list(range(len(sizes))) and len(runs) == tasks and all(runs)
        best = min(
            max(sum(sizes[a:b]) for a, b in zip((0, *cut), (*cut, len(sizes))))
            for cut in itertools.combinations(range(1, len(sizes)), tasks - 1)
        )
        assert max(sum(sizes[i] for i in r) for r in runs) == best, (sizes, tasks, runs)


def test_two_tasks_split_eight_files_four_and_four(tmp_path, bpe_dir, cli):
    corpus = tmp_path / "corpus"
    corpus.mkdir()
    for i in range(8):  # file 4 a third larger: it crosses half the bytes
        (corpus / f"part{i}.txt").write_text(f"speech {i} " * (40 if i == 4 else 30), encoding="utf-8")
    prepare(cli, corpus, bpe_dir, tmp_path / "out", "--tasks", 2)
    shards = [json.loads((tmp_path / "out" / f"shard_{i:05d}" / "meta.json").read_text()) for i in range(2)]
    assert [[f["path"] for f in shard["files"]] for shard in shards] == [
        [str(corpus / f"part{i}.txt") for i in range(4)],
        [str(corpus / f"part{i}.txt") for i in range(4, 8)],
    ]


def test_a_damaged_token_names_its_shard_file(tmp_path, corpus, bpe_dir, cli):
    from pretrain.data.windows import SequentialWindows

    out = tmp_path / "out"
    prepare(cli, corpus, bpe_dir, out, "--tasks", 2)
    damaged = out / "shard_00001" / "train.bin"
    data = bytearray(damaged.read_bytes())
    data[14:16] = (65535).to_bytes(2, "little")  # token 7 of the shard: an id past the 600-token vocabulary
    damaged.write_bytes(bytes(data))
    windows = SequentialWindows(PreparedData(out, verify="size"), "train", 32)
    with pytest.raises(UsageError) as e:
        for _ in windows.batches(64, 10_000):
            pass
    assert f"{damaged}: token id 65,535 at token 7 is outside the vocabulary" in str(e.value)
    # what rebuilds it: the whole dataset, by the same --tasks (no command rebuilds one shard)
    assert f"run `pretrain prepare --out {out} --tasks 2` again" in str(e.value), str(e.value)
    with pytest.raises(UsageError) as e:
        PreparedData(out, verify="full")
    assert str(e.value) == (
        f"{damaged}: sha256 differs from meta.json (file corrupted or replaced); "
        f"run `pretrain prepare --out {out} --tasks 2` again"
    )


def test_either_kind_of_dataset_replaces_the_other(tmp_path, corpus, bpe_dir, one_pass, cli):
    out = tmp_path / "out"
    prepare(cli, corpus, bpe_dir, out, "--workers", 1)
    prepare(cli, corpus, bpe_dir, out, "--tasks", 2)
    assert_same_dataset(out, one_pass)
    prepare(cli, corpus, bpe_dir, out, "--workers", 1)
    assert not list(out.glob("shard_*")) and (out / "train.bin").read_bytes() == (one_pass / "train.bin").read_bytes()
    (out / "notes.txt").write_text("mine")
    r = cli("prepare", "--input", corpus, "--tokenizer", bpe_dir, "--out", out, "--tasks", 2)
    assert r.returncode == 2 and "notes.txt" in r.stderr


def test_pretrain_train_reads_a_sharded_dataset(tmp_path, corpus, bpe_dir, cli):
    out = tmp_path / "out"
    prepare(cli, corpus, bpe_dir, out, "--tasks", 3)
    r = cli(
        "train",
        *tiny(
            out,
            tmp_path / "run",
            "model.vocab_size=600",
            "train.max_steps=6",
            "run.eval_every=3",
            "run.checkpoint_every=0",
        ),
    )
    assert r.returncode == 0, r.stderr[-3000:]
    rows = [json.loads(x) for x in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    assert [row["step"] for row in rows if "loss" in row] == list(range(1, 7))
    assert any("val_loss" in row for row in rows)


def test_a_mixture_reads_a_sharded_source_as_its_one_pass_twin(tmp_path, two_corpora, zh_classics, cli):
    from pretrain.config import load_config, mixture_sources
    from pretrain.data.mixture import MixtureWindows, open_mixture

    lines = zh_classics.read_text(encoding="utf-8").splitlines(keepends=True)
    parts = tmp_path / "zh_parts"
    parts.mkdir()
    (parts / "a.jsonl").write_text("".join(lines[:150]), encoding="utf-8")
    (parts / "b.jsonl").write_text("".join(lines[150:]), encoding="utf-8")
    r = cli(
        "prepare",
        "--input",
        parts,
        "--tokenizer",
        two_corpora["tokenizer"],
        "--out",
        tmp_path / "zh_sharded",
        "--val-fraction",
        0.1,
        "--tasks",
        2,
    )
    assert r.returncode == 0, r.stderr[-3000:]

    def batches(zh_dir):
        config = load_config(
            None,
            [
                f"data.mixture=[{{dir: {two_corpora['shakespeare']}, weight: 0.7}}, "
                f"{{dir: {zh_dir}, weight: 0.3, name: zh}}]"
            ],
        )
        windows = MixtureWindows(open_mixture(mixture_sources(config.data), "auto", 512), seq_len=32, seed=1)
        return [windows.next_batch(8) for _ in range(20)]

    for (x, y), (u, v) in zip(batches(tmp_path / "zh_sharded"), batches(two_corpora["zh"])):
        assert x.equal(u) and y.equal(v)


def test_a_second_prepare_of_the_same_out_is_refused_while_the_first_runs(tmp_path, corpus, bpe_dir, cli):
    # The lock a running launcher holds beside --out, taken here: the second launcher stops before any write.
    held = exclusive_lock(tmp_path / ".out.lock", "test", "test")
    r = cli("prepare", "--input", corpus, "--tokenizer", bpe_dir, "--out", tmp_path / "out", "--tasks", 2)
    assert r.returncode == 2
    assert f"is in use by PID {os.getpid()}" in r.stderr and len(r.stderr.strip().splitlines()) == 1, r.stderr
    assert not (tmp_path / "out.partial").exists() and not (tmp_path / "out").exists()
    held.release()


def test_a_task_running_elsewhere_is_not_run_twice(tmp_path, corpus, bpe_dir, one_pass, cli):
    # A partial build whose task 1 is unfinished and held by another run of the job (a Slurm array submitted
    # twice): this run's task 1 stops without touching it, task 0 stays as it was, and the build is not swapped in.
    out = tmp_path / "out"
    prepare(cli, corpus, bpe_dir, tmp_path / "build", "--tasks", 2)
    partial = as_killed(tmp_path / "build", tmp_path / "out.partial")
    shutil.rmtree(partial / "shard_00001")
    (partial / "logs" / "tokenize" / "completions" / "00001").unlink()
    kept = _identity(partial / "shard_00000")
    held = exclusive_lock(partial / "locks" / "shard_00001.lock", "test", "test")
    r = cli(
        "prepare",
        "--input",
        corpus,
        "--tokenizer",
        bpe_dir,
        "--out",
        out,
        "--split-blank-lines",
        "--val-fraction",
        0.1,
        "--tasks",
        2,
    )
    assert r.returncode == 2
    assert f"task 1 of {out} is in use by PID {os.getpid()}" in r.stderr, r.stderr[-3000:]
    assert not out.exists() and not (partial / "shard_00001").exists() and _identity(partial / "shard_00000") == kept
    held.release()  # that run ended: the same command finishes the build, task 1 only
    prepare(cli, corpus, bpe_dir, out, "--tasks", 2)
    assert_same_dataset(out, one_pass)
    assert not (out / "locks").exists()


@pytest.fixture(scope="module")
def two_shards(tmp_path_factory, corpus, bpe_dir) -> Path:
    """A finished `--tasks 2` build of the corpus: killed builds are made from copies of it."""
    out = tmp_path_factory.mktemp("two") / "out"
    subprocess.run(
        [
            sys.executable,
            "-m",
            "pretrain",
            "prepare",
            "--input",
            corpus,
            "--tokenizer",
            bpe_dir,
            "--out",
            out,
            "--split-blank-lines",
            "--val-fraction",
            "0.1",
            "--tasks",
            "2",
        ],
        check=True,
        capture_output=True,
    )
    return out


@pytest.mark.parametrize("fault", ["train.bin cut short", "meta.json lost", "meta.json and completion mark lost"])
def test_a_finished_shard_a_rerun_cannot_use_is_redone(fault, tmp_path, corpus, bpe_dir, one_pass, two_shards, cli):
    # A build killed after its tasks, then a finished shard damaged in OUT.partial: the same command again redoes
    # that shard (it is prepare's own), keeps the other, and only then replaces the old dataset at --out.
    out = tmp_path / "out"
    shutil.copytree(one_pass, out)
    partial = as_killed(two_shards, tmp_path / "out.partial")
    kept = _identity(partial / "shard_00000")
    shard = partial / "shard_00001"
    if fault == "train.bin cut short":
        os.truncate(shard / "train.bin", (shard / "train.bin").stat().st_size - 10)
    else:
        (shard / "meta.json").unlink()
    if fault == "meta.json and completion mark lost":
        (partial / "logs" / "tokenize" / "completions" / "00001").unlink()
    r = cli(
        "prepare",
        "--input",
        corpus,
        "--tokenizer",
        bpe_dir,
        "--out",
        out,
        "--split-blank-lines",
        "--val-fraction",
        0.1,
        "--tasks",
        2,
    )
    assert r.returncode == 0, r.stderr[-3000:]
    assert "1 of 2 tasks were done by an earlier run; running the other 1" in r.stderr
    assert _identity(out / "shard_00000") == kept
    assert_same_dataset(out, one_pass)
    PreparedData(out, verify="full")


def test_a_shard_changed_since_its_task_is_never_swapped_in(tmp_path, corpus, bpe_dir, one_pass, two_shards, cli):
    # 10 bytes of a finished shard changed, its size kept: the check before the swap re-hashes every shard,
    # removes that one and refuses; the old dataset stays; the same command again rebuilds only that shard.
    out = tmp_path / "out"
    shutil.copytree(one_pass, out)
    before = snapshot(out)
    partial = as_killed(two_shards, tmp_path / "out.partial")
    with open(partial / "shard_00001" / "train.bin", "r+b") as f:  # the size kept: only the sha256 tells
        f.seek(20)
        f.write(b"\x01" * 10)
    args = [
        "prepare",
        "--input",
        corpus,
        "--tokenizer",
        bpe_dir,
        "--out",
        out,
        "--split-blank-lines",
        "--val-fraction",
        0.1,
        "--tasks",
        2,
    ]
    r = cli(*args)
    lines = r.stderr.strip().splitlines()
    assert r.returncode == 2 and lines[-1] == (
        f"pretrain prepare: error: {partial / 'shard_00001' / 'train.bin'}: sha256 differs from meta.json (file "
        "corrupted or replaced); shard removed: run the same command again, it rebuilds only the removed shards"
    ), r.stderr[-3000:]
    assert "Traceback" not in r.stderr
    assert snapshot(out) == before
    assert not (partial / "shard_00001").exists()
    assert not (partial / "logs" / "tokenize" / "completions" / "00001").exists()
    kept = _identity(partial / "shard_00000")
    r = cli(*args)
    assert r.returncode == 0, r.stderr[-3000:]
    assert _identity(out / "shard_00000") == kept
    assert_same_dataset(out, one_pass)


def test_a_directory_at_out_partial_that_prepare_did_not_make_is_refused(tmp_path, corpus, bpe_dir, one_pass, cli):
    # A user's complete dataset under the name a sharded build stages in: refused in one line, never deleted.
    partial = tmp_path / "web.partial"
    shutil.copytree(one_pass, partial)
    before = snapshot(partial)
    r = cli("prepare", "--input", corpus, "--tokenizer", bpe_dir, "--out", tmp_path / "web", "--tasks", 2)
    assert r.returncode == 2 and len(r.stderr.strip().splitlines()) == 1, r.stderr[-3000:]
    assert f"{partial} is in the way" in r.stderr and "move it away" in r.stderr, r.stderr
    assert snapshot(partial) == before and not (tmp_path / "web").exists()


def test_sharded_names_in_a_single_dataset_are_a_users(tmp_path, corpus, bpe_dir, one_pass, cli):
    # logs/ and shard_00009/ are a sharded dataset's only where its manifest lists them: in a single dataset's
    # --out they are a user's, refused, never deleted.
    out = tmp_path / "out"
    shutil.copytree(one_pass, out)
    (out / "logs").mkdir()
    (out / "logs" / "run.txt").write_text("a user's log")
    (out / "shard_00009").mkdir()
    before = snapshot(out)
    r = cli("prepare", "--input", corpus, "--tokenizer", bpe_dir, "--out", out, "--tasks", 2)
    assert r.returncode == 2 and len(r.stderr.strip().splitlines()) == 1, r.stderr[-3000:]
    assert "holds files this command did not write (logs, shard_00009)" in r.stderr, r.stderr
    assert snapshot(out) == before and (out / "shard_00009").is_dir()
    assert not (tmp_path / "out.partial").exists()
