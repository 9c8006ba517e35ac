"""Every subcommand that writes, against the three ways its output place can fail: a file in the way, a
read-only file system, a full disk. Each is one line on stderr and exit code 2, and nothing that was
complete before is lost: every file on the file system is byte for byte what it was (the full disk holds a
complete earlier output of the same command, written before the disk filled up)."""

import hashlib
import shutil
import subprocess
from pathlib import Path

import pytest

from fs_faults import read_only, small_fs
from support import run_cli, run_here, tiny

pytest.importorskip("torch")


@pytest.fixture(scope="module")
def inputs(prepared, tmp_path_factory):
    """A corpus, a tokenizer and a finished tiny run to read from (outside the faulty file systems)."""
    root = tmp_path_factory.mktemp("inputs")
    corpus = prepared.parent / "corpus"
    run_dir = root / "run"
    r = run_here("train", *tiny(prepared, run_dir, "train.max_steps=4", "train.warmup=1", "run.eval_every=0"))
    assert r.returncode == 0, r.stderr
    return {"corpus": corpus, "tokenizer": prepared.parent / "tokenizer", "data": prepared, "run": run_dir}


def command(name: str, inputs: dict, out: Path) -> list:
    """The subcommand writing to `out`."""
    return {
        "tokenizer train": ["tokenizer", "train", "--input", inputs["corpus"], "--vocab-size", "300", "--out", out],
        "prepare": [
            "prepare",
            "--input",
            inputs["corpus"],
            "--tokenizer",
            inputs["tokenizer"],
            "--out",
            out,
            "--workers",
            "1",
        ],
        "train": ["train", *tiny(inputs["data"], out, "train.max_steps=4", "train.warmup=1", "run.eval_every=0")],
        "export": ["export", inputs["run"], "--to", "hf", out],
        "report": ["report", inputs["run"], "--out", out],
        "bench": ["bench", "--quick", "--seconds", "1", "--rounds", "1", "--out", out / "profile.json"],
        "sweep": [
            "sweep",
            "model.preset=debug",
            "train.precision=fp32",
            "train.device=cpu",
            "train.seq_len=32",
            "train.micro_batch_size=1",
            "--steps",
            "1",
            "--warmup-steps",
            "2",
            "--rounds",
            "1",
            "--out",
            out,
        ],
        "demo": ["demo", "--out", out],
    }[name]


COMMANDS = ["tokenizer train", "prepare", "train", "export", "report", "bench", "sweep", "demo"]


def snapshot(root: Path) -> dict:
    return {
        str(p.relative_to(root)): hashlib.sha256(p.read_bytes()).hexdigest()
        for p in sorted(root.rglob("*"))
        if p.is_file()
    }


def assert_one_line_exit_2(r: subprocess.CompletedProcess) -> None:
    lines = [x for x in r.stderr.splitlines() if x.strip()]
    assert r.returncode == 2, r.stderr[-2000:]
    assert len(lines) == 1 and "Traceback" not in r.stderr, r.stderr[-2000:]


@pytest.mark.slow
@pytest.mark.parametrize("name", COMMANDS)
def test_a_file_in_the_way(name, inputs, tmp_path):
    out = tmp_path / "out"
    out.write_text("a file the user owns\n")
    r = run_cli(*command(name, inputs, out), env={"OMP_NUM_THREADS": "1"})
    assert_one_line_exit_2(r)
    assert out.read_text() == "a file the user owns\n"


@pytest.mark.slow
@pytest.mark.parametrize("name", COMMANDS)
def test_a_read_only_file_system(name, inputs, tmp_path):
    with small_fs(tmp_path / "fs", "4m") as fs:
        (fs / "kept.txt").write_text("complete\n")
        read_only(fs)
        before = snapshot(fs)
        r = run_cli(*command(name, inputs, fs / "out"), env={"OMP_NUM_THREADS": "1"})
        assert_one_line_exit_2(r)
        assert snapshot(fs) == before


@pytest.mark.slow
@pytest.mark.parametrize("name", [c for c in COMMANDS if c != "demo"])  # demo: the first run takes minutes
def test_a_full_disk(name, inputs, tmp_path):
    with small_fs(tmp_path / "fs", "16m") as fs:
        r = run_cli(*command(name, inputs, fs / "first"), env={"OMP_NUM_THREADS": "1"})
        assert r.returncode == 0, r.stderr[-2000:]
        filler = fs / "filler"
        subprocess.run(["dd", "if=/dev/zero", f"of={filler}", "bs=64k"], capture_output=True)  # until ENOSPC
        before = snapshot(fs)
        r = run_cli(*command(name, inputs, fs / "second"), env={"OMP_NUM_THREADS": "1"})
        assert_one_line_exit_2(r)
        after = snapshot(fs)
        assert {k: v for k, v in after.items() if k in before} == before  # nothing complete changed or lost
        assert not [k for k in after if k not in before and not k.startswith(("second", ".second.lock"))]
        shutil.rmtree(fs / "second", ignore_errors=True)
