"""`pretrain sweep` as a user runs it: the acceptance sweep (3 x 2 cells in well under two minutes, table,
CSV, JSON and plot), a single cell, and bad input as one stderr line with exit code 2."""

import json
import subprocess
import sys
import time

import pytest

from support import run_cli

pytest.importorskip("torch")

# One OpenMP thread: on a shared 2-core machine two threads contending with another process make the tiny
# model's steps ~100x slower (docs/sweep.md).
ENV = {"OMP_NUM_THREADS": "1"}
GRID = [
    "model.preset=debug",
    "train.precision=fp32",
    "train.device=cpu",
    "train.seq_len=32,64,128",
    "train.micro_batch_size=1,4",
]


def test_acceptance_sweep_json(tmp_path):
    # No hardware.peak_tflops: the sweep measures this CPU's matmul peak once for the MFU.
    started = time.monotonic()
    done = run_cli(
        "sweep", *GRID, "--rounds", "2", "--threads", "1", "--json", "--out", tmp_path / "out", env=ENV, timeout=300
    )
    elapsed = time.monotonic() - started
    assert done.returncode == 0, done.stderr
    assert elapsed < 120
    result = json.loads(done.stdout)
    cells = result["cells"]
    assert len(cells) == 6 and all(c["status"] == "ok" for c in cells)
    for c in cells:
        assert c["it_per_s"] > 0 and c["tokens_per_s"] > 0 and c["achieved_tflops"] > 0 and 0 < c["mfu"]
        assert abs(c["memory_error_pct"]) < 10  # the brief's bar; on a CPU the planner is exact
        assert c["rounds"] == 2 and len(c["tokens_per_s_each_round"]) == 2 and c["threads"] == 1
        assert c["tokens_per_s_min"] <= c["tokens_per_s"] <= c["tokens_per_s_max"] and c["spread_pct"] >= 0
    assert (result["rounds"], result["threads"]) == (2, 1)
    assert done.stderr.count("warning: cell") == sum(c["noisy"] for c in cells)  # the noisy ones, on stderr
    assert "measured once" in result["peak_tflops"]["fp32"]["source"]
    for name in ("sweep.csv", "sweep.json", "sweep.png"):
        assert (tmp_path / "out" / name).stat().st_size > 0
    assert json.loads((tmp_path / "out" / "sweep.json").read_text())["cells"] == cells


def test_one_cell_table(tmp_path):
    done = run_cli(
        "sweep",
        "model.preset=debug",
        "train.device=cpu",
        "train.precision=bf16-mixed",
        "train.seq_len=32",
        "train.activation_checkpointing=full",
        "hardware.peak_tflops=0.05",
        "--steps",
        "1",
        "--out",
        tmp_path / "out",
        env=ENV,
        timeout=300,
    )
    assert done.returncode == 0, done.stderr
    assert "pretrain sweep on" in done.stdout and "no limit" in done.stdout
    rows = [line for line in done.stdout.splitlines() if "MiB" in line]
    assert len(rows) == 1 and "+0.0%" in rows[0]  # full recomputation under autocast, exact on a CPU
    assert f"wrote {tmp_path / 'out' / 'sweep.csv'}" in done.stdout


@pytest.mark.parametrize(
    "args, words",
    [
        (["train.seq_lenn=32,64"], "unknown config key 'train.seq_lenn'"),
        (["model.preset=debug", "train.seq_len=32,100000"], "train.seq_len: 100000 is longer than model.max_seq_len"),
        (["train.precision=fp32,fp64"], "train.precision: 'fp64' is not allowed"),
        (["train.seq_len=32,"], "train.seq_len: empty value"),
        (["--warmup-steps", "1"], "--warmup-steps: must be at least 2"),
        (["--rounds", "0"], "--rounds: must be at least 1"),
        (["--threads", "0"], "--threads: must be at least 1"),
    ],
)
def test_bad_input_is_one_line_and_exit_2(tmp_path, args, words):
    done = run_cli("sweep", *args, "--out", tmp_path / "out", env=ENV, timeout=120)
    assert done.returncode == 2
    assert done.stderr.count("\n") == 1 and done.stderr.startswith("pretrain sweep: error: ")
    assert words in done.stderr
    assert not (tmp_path / "out").exists()  # checked for every cell before any cell runs


def test_help_imports_no_torch():
    code = "import sys, pretrain.sweep.command, pretrain.sweep; assert 'torch' not in sys.modules, 'torch imported'"
    assert subprocess.run([sys.executable, "-c", code]).returncode == 0
    done = run_cli("sweep", "--help")
    assert done.returncode == 0 and "--budget-seconds" in done.stdout and "--try-all" in done.stdout


def test_unwritable_out_fails_before_any_cell(tmp_path):
    (tmp_path / "file").write_text("")
    done = run_cli("sweep", "model.preset=debug", "train.device=cpu", "--out", tmp_path / "file" / "sub", env=ENV)
    assert done.returncode == 2 and done.stderr.count("\n") == 1
    assert "--out" in done.stderr and "cannot write" in done.stderr
