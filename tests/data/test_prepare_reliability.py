"""prepare never loses a finished dataset: a new one is built beside --out and swapped in only when complete,
so every way a run can fail or be stopped (bad input, --strict, Ctrl-C, SIGTERM, SIGKILL, a full disk) leaves
the old one usable. Output paths are checked before any work; worker processes exit quietly with the parent."""

from __future__ import annotations

import hashlib
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from fs_faults import immutable, read_only, small_fs
from pretrain.data import PreparedData, prepare


@pytest.fixture(scope="module")
def pydoc(tmp_path_factory) -> Path:
    """Python's bundled documentation as JSONL (~465 KB): every machine has it."""
    from pretrain.data import write_sample_corpus

    return write_sample_corpus(tmp_path_factory.mktemp("pydoc"))


@pytest.fixture(scope="module")
def bpe_dir(tmp_path_factory, pydoc) -> Path:
    from pretrain.data import train_tokenizer

    out = tmp_path_factory.mktemp("bpe")
    train_tokenizer([pydoc], 300, out)
    return out


def big_corpus(folder: Path, pydoc: Path, copies: int) -> Path:
    path = folder / "big.jsonl"
    path.write_bytes(pydoc.read_bytes() * copies)
    return path


def snapshot(folder: Path) -> dict:
    """Every file under `folder` (relative path -> sha256): equal snapshots, equal datasets."""
    return {
        str(p.relative_to(folder)): hashlib.sha256(p.read_bytes()).hexdigest()
        for p in sorted(folder.rglob("*"))
        if p.is_file()
    }


@pytest.fixture
def old(tmp_path, jsonl, bpe_dir):
    """A finished dataset in tmp_path/out, and its snapshot."""
    corpus = jsonl(tmp_path / "old.jsonl", [{"text": f"old document number {i}"} for i in range(20)])
    out = tmp_path / "out"
    prepare([corpus], bpe_dir, out, val_fraction=0.2, workers=1)
    return out, snapshot(out)


def leftovers(out: Path) -> list[str]:
    """What a build left beside --out: its hidden directories, not the lock file (which stays: lock.py)."""
    return [p.name for p in out.parent.iterdir() if p.name.startswith(f".{out.name}") and p.name != f".{out.name}.lock"]


def assert_intact(out: Path, before: dict) -> None:
    assert snapshot(out) == before
    PreparedData(out, verify="full")
    assert not leftovers(out), leftovers(out)


def one_line(r) -> str:
    lines = r.stderr.strip().splitlines()
    assert r.returncode == 2 and len(lines) == 1, r.stderr
    return lines[0]


@pytest.mark.parametrize("case", ["empty corpus", "binary input", "strict stop"])
def test_a_failed_prepare_keeps_the_old_dataset(case, tmp_path, old, bpe_dir, jsonl, cli):
    out, before = old
    corpus = {
        "empty corpus": lambda: jsonl(tmp_path / "c.jsonl", [{"text": ""}]),
        "binary input": lambda: (tmp_path / "c.txt").write_bytes(bytes(range(256)) * 64) and tmp_path / "c.txt",
        "strict stop": lambda: jsonl(tmp_path / "c.jsonl", [{"text": "good"}, b"{broken"]),
    }[case]()
    strict = ["--strict"] if case == "strict stop" else []
    r = cli("prepare", "--input", corpus, "--tokenizer", bpe_dir, "--out", out, *strict, "--workers", 1)
    one_line(r)
    assert_intact(out, before)


def _default_sigint():
    """Ctrl-C as in a terminal, even when the tests run in the background (where a shell ignores SIGINT)."""
    signal.signal(signal.SIGINT, signal.SIG_DFL)


def _fifo_prepare(tmp_path, out, bpe_dir):
    """A prepare over --out whose input is a named pipe: it blocks reading, past every check and set-up."""
    fifo = tmp_path / "pipe.txt"
    os.mkfifo(fifo)
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "pretrain",
            "prepare",
            "--input",
            fifo,
            "--tokenizer",
            bpe_dir,
            "--out",
            out,
            "--workers",
            "2",
        ],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        preexec_fn=_default_sigint,
    )
    writer = open(fifo, "wb")  # returns once prepare has opened the pipe to read the corpus
    writer.write(b"a document that never ends ")
    writer.flush()
    return proc, writer


@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM, signal.SIGKILL])
def test_a_stopped_prepare_keeps_the_old_dataset(sig, tmp_path, old, bpe_dir, cli):
    out, before = old
    proc, writer = _fifo_prepare(tmp_path, out, bpe_dir)
    proc.send_signal(sig)
    # A signal may reach one of the pool's threads, which leaves the main thread blocked reading the pipe: the
    # end of the input lets it see the signal (a regular file is never blocked on).
    writer.close()
    _, stderr = proc.communicate(timeout=120)  # stderr ends when the workers too have gone
    assert "Traceback" not in stderr, stderr
    assert snapshot(out) == before
    PreparedData(out, verify="full")
    if sig == signal.SIGKILL:  # nothing ran to clean up: the next prepare removes what it left
        corpus = tmp_path / "new.txt"
        corpus.write_text("a new document")
        r = cli("prepare", "--input", corpus, "--tokenizer", bpe_dir, "--out", out, "--val-fraction", 0)
        assert r.returncode == 0, r.stderr
        assert PreparedData(out, verify="full").meta["num_docs"] == {"train": 1, "val": 0}
        assert not leftovers(out)
    else:
        assert stderr.strip().splitlines() == ["pretrain prepare: interrupted"]
        assert_intact(out, before)


@pytest.mark.parametrize("second", ["plain", "--tasks"])
def test_one_writer_per_out_whatever_the_mode(second, tmp_path, old, bpe_dir, cli):
    # A real plain prepare over --out, blocked reading its input: a second build of the same --out, plain or
    # sharded, is refused naming it, and the first one's dataset is the one that ends up there.
    out, before = old
    proc, writer = _fifo_prepare(tmp_path, out, bpe_dir)
    corpus = tmp_path / "other.txt"
    corpus.write_text("the second build's document")
    extra = ["--tasks", 1] if second == "--tasks" else []
    r = cli("prepare", "--input", corpus, "--tokenizer", bpe_dir, "--out", out, "--val-fraction", 0, *extra)
    line = one_line(r)
    assert f"--out {out} is in use by PID {proc.pid}" in line, line
    assert snapshot(out) == before and not (tmp_path / "out.partial").exists()
    writer.close()  # the first build's input ends: it finishes
    _, stderr = proc.communicate(timeout=120)
    assert proc.returncode == 0, stderr
    assert sum(PreparedData(out, verify="full").meta["num_docs"].values()) == 1


def test_killing_prepare_does_not_flood_stderr_with_worker_tracebacks(tmp_path, pydoc, bpe_dir):
    corpus = big_corpus(tmp_path, pydoc, 16)
    out = tmp_path / "out"
    proc = subprocess.Popen(
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
            "--workers",
            "2",
        ],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    # Wait until the first chunks are written: the workers are then busy with the next ones.
    while not _written(tmp_path, "train.bin*") and proc.poll() is None:
        time.sleep(0.05)
    proc.kill()
    _, stderr = proc.communicate(timeout=120)  # stderr ends when the last worker has gone
    assert stderr == "", stderr


def _written(folder: Path, pattern: str) -> bool:
    """Whether a file matching `pattern` under `folder` (hidden directories included) holds any bytes yet."""
    for path in folder.rglob(pattern):
        try:
            if path.stat().st_size:
                return True
        except FileNotFoundError:  # renamed in between
            continue
    return False


def test_a_full_disk_is_one_line_and_keeps_the_old_dataset(tmp_path, jsonl, bpe_dir, pydoc, cli):
    with small_fs(tmp_path / "small", "256k") as disk:
        corpus = jsonl(tmp_path / "old.jsonl", [{"text": f"old document number {i}"} for i in range(20)])
        out = disk / "out"
        prepare([corpus], bpe_dir, out, val_fraction=0.2, workers=1)
        before = snapshot(out)
        r = cli("prepare", "--input", big_corpus(tmp_path, pydoc, 4), "--tokenizer", bpe_dir, "--out", out)
        assert "No space left on device" in one_line(r)
        assert_intact(out, before)


def test_tokenizer_train_on_a_full_disk_is_one_line(tmp_path, pydoc, cli):
    with small_fs(tmp_path / "small", "16k") as disk:
        r = cli("tokenizer", "train", "--input", pydoc, "--vocab-size", 2000, "--out", disk / "tok")
        assert "No space left on device" in one_line(r)
        assert [p.name for p in disk.rglob("*") if p.is_file()] == []


@pytest.mark.parametrize("command", ["prepare", "tokenizer", "demo"])
@pytest.mark.parametrize("fault", ["read-only", "immutable", "file in the way", "name too long"])
def test_an_unwritable_out_is_one_line_before_any_work(command, fault, tmp_path, pydoc, bpe_dir, cli):
    args = {
        "prepare": ["prepare", "--input", pydoc, "--tokenizer", bpe_dir, "--out"],
        "tokenizer": ["tokenizer", "train", "--input", pydoc, "--vocab-size", 300, "--out"],
        "demo": ["demo", "--out"],
    }[command]
    expected = {
        "read-only": "read-only file system",
        "immutable": "not permitted",
        "file in the way": "is a file",
        "name too long": "longer than",
    }[fault]
    with small_fs(tmp_path / "fs", "1m") as disk:
        (disk / "afile").write_text("x")
        (disk / "dir").mkdir()
        out = {"file in the way": disk / "afile" / "out", "name too long": disk / ("n" * 256)}.get(
            fault, disk / "dir" / "out"
        )
        if fault == "read-only":
            read_only(disk)
        with immutable(disk / "dir") if fault == "immutable" else _nothing():
            r = cli(*args, out, timeout=120)
        line = one_line(r)
        assert line.startswith(f"pretrain {command}: error: --out ") and expected in line.lower(), line
        assert r.stdout == ""  # refused before the first step


@pytest.mark.parametrize("tasks", [[], ["--tasks", 1]])
def test_out_holding_a_users_tmp_files_is_refused(tasks, tmp_path, old, bpe_dir, cli):
    # Only the temporary name prepare itself may leave there (write_atomic's .NAME.PID.tmp of its own files) is
    # not the user's: a draft.tmp or a backup.tmp/ is, and replacing --out would delete it.
    out, before = old
    corpus = tmp_path / "new.txt"
    corpus.write_text("a new document")
    (out / "draft.tmp").write_text("a user's draft")
    (out / "backup.tmp").mkdir()
    (out / "backup.tmp" / "train.bin").write_bytes(b"a user's backup")
    r = cli("prepare", "--input", corpus, "--tokenizer", bpe_dir, "--out", out, "--val-fraction", 0, *tasks)
    line = one_line(r)
    assert f"--out {out} holds files this command did not write (backup.tmp, draft.tmp)" in line, line
    assert (out / "draft.tmp").read_text() == "a user's draft"
    assert (out / "backup.tmp" / "train.bin").read_bytes() == b"a user's backup"
    (out / "draft.tmp").unlink()
    (out / "backup.tmp" / "train.bin").unlink()
    (out / "backup.tmp").rmdir()
    assert_intact(out, before)
    (out / ".meta.json.4242.tmp").write_text("{")  # a writer of meta.json killed before its rename
    r = cli("prepare", "--input", corpus, "--tokenizer", bpe_dir, "--out", out, "--val-fraction", 0, *tasks)
    assert r.returncode == 0, r.stderr[-3000:]
    assert PreparedData(out, verify="full").meta["num_docs"] == {"train": 1, "val": 0}


class _nothing:
    def __enter__(self):
        return None

    def __exit__(self, *exc):
        return False


def test_a_file_name_that_is_not_utf8(tmp_path, bpe_dir, cli):
    corpus = tmp_path / "corpus"
    corpus.mkdir()
    name = os.fsencode(corpus) + b"/caf\xe9.txt"  # Latin-1 bytes: not a UTF-8 file name
    with open(name, "wb") as f:
        f.write(b"a document under a Latin-1 name")
    r = cli("prepare", "--input", corpus, "--tokenizer", bpe_dir, "--out", tmp_path / "out", "--val-fraction", 0)
    assert r.returncode == 0, r.stderr
    meta = json.loads((tmp_path / "out" / "meta.json").read_text(encoding="utf-8"))
    assert meta["files"][0]["path"].endswith("caf\\xe9.txt")  # shown escaped, the byte kept visible
    assert meta["num_docs"]["train"] == 1


def test_dev_zero_is_read_with_a_bound(tmp_path, bpe_dir):
    import resource

    def limit_memory():  # without the bound the whole "file" is read into memory: MemoryError, not a hang
        resource.setrlimit(resource.RLIMIT_AS, (6 << 30, 6 << 30))

    r = subprocess.run(
        [
            sys.executable,
            "-m",
            "pretrain",
            "prepare",
            "--input",
            "/dev/zero",
            "--tokenizer",
            bpe_dir,
            "--out",
            tmp_path / "out",
            "--workers",
            "1",
        ],
        capture_output=True,
        text=True,
        preexec_fn=limit_memory,
        timeout=300,
    )
    line = one_line(r)
    assert "no documents" in line and "unreadable" in line, line


@pytest.mark.parametrize("documents", [1, 3])
def test_everything_in_val_is_a_warning(documents, tmp_path, bpe_dir, jsonl, cli):
    # seed 30 sends "document 0", "document 1" and "document 2" to validation at --val-fraction 0.5
    # (encode.is_validation: the hash of each text)
    corpus = jsonl(tmp_path / "c.jsonl", [{"text": f"document {i}"} for i in range(documents)])
    r = cli(
        "prepare",
        "--input",
        corpus,
        "--tokenizer",
        bpe_dir,
        "--out",
        tmp_path / "out",
        "--val-fraction",
        0.5,
        "--seed",
        30,
        "--workers",
        1,
    )
    assert r.returncode == 0, r.stderr
    meta = json.loads((tmp_path / "out" / "meta.json").read_text())
    assert meta["num_docs"] == {"train": 0, "val": documents}
    assert "warning: train.bin is empty" in r.stdout and "smaller --val-fraction" in r.stdout, r.stdout
