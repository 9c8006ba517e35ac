"""benchmarks/gpu_acceptance.py on a CPU (--dry-run): the memory matrix written cell by cell as each finishes and
carried on by the next call, the time budget, the refusals; what the GPU session relies on between its
10-minute commands."""

import json
import os
import signal
import subprocess
import sys
import time

import pytest

from support import ROOT

pytest.importorskip("torch")
SCRIPT = ROOT / "benchmarks" / "gpu_acceptance.py"


def script(*args):
    return [sys.executable, str(SCRIPT), *map(str, args)]


def matrix(path):
    return json.loads(path.read_text()).get("memory_matrix", []) if path.exists() else []


def test_memory_rows_are_written_as_cells_finish_and_a_second_call_skips_them(tmp_path):
    out, work = tmp_path / "results.json", tmp_path / "work"
    # Three cells asked for; killed (-9, the whole process group) as soon as the first row is in the file.
    proc = subprocess.Popen(
        script("memory", "--dry-run", "--cells", 3, "--work", work, "--out", out),
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        start_new_session=True,
    )
    deadline = time.time() + 120
    while not matrix(out) and proc.poll() is None and time.time() < deadline:
        time.sleep(0.2)
    os.killpg(proc.pid, signal.SIGKILL)
    proc.wait()
    first = matrix(out)
    assert len(first) == 1, proc.stdout.read()[-3000:]
    row = first[0]
    assert set(row) == {"overrides", "planned_bytes", "measured_bytes", "compiled"}
    assert row["compiled"] is False and row["planned_bytes"] > 0 and row["measured_bytes"] > 0
    assert row["overrides"]["train.precision"] == "bf16-mixed" and row["overrides"]["model.vocab_size"] == 512
    assert not list(tmp_path.glob("*.tmp"))

    r = subprocess.run(
        script("memory", "--dry-run", "--cells", 1, "--work", work, "--out", out),
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-2000:]
    assert "1 cells already in" in r.stdout and "143 to go" in r.stdout
    second = matrix(out)
    assert len(second) == 2 and second[0] == row  # the done cell was not run again
    assert second[1]["overrides"] != row["overrides"]


def test_a_budget_too_small_for_any_run_stops_cleanly_and_records_no_figure(tmp_path):
    out = tmp_path / "results.json"
    r = subprocess.run(
        script("targets", "--dry-run", "--budget", 2, "--work", tmp_path / "work", "--out", out),
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert r.returncode == 0, r.stderr[-2000:]
    assert "llama_1b expects" in r.stdout and "not started" in r.stdout
    data = json.loads(out.read_text())
    # Only the device facts: a figure not measured is absent, never zero.
    assert set(data) <= {"gpu", "torch", "seconds"} and data["gpu"] == "cpu"


@pytest.mark.parametrize(
    "args, words",
    [
        (["--budget", "0"], "--budget 0: give a positive number"),
        (["--nanogpt", "/nonexistent/nanoGPT"], "no train.py / model.py / configurator.py there"),
        (["--cells", "0"], "--cells 0: give at least 1"),
    ],
)
def test_bad_arguments_are_one_line_and_exit_2(tmp_path, args, words):
    r = subprocess.run(
        script("targets", "--dry-run", "--work", tmp_path, *args), capture_output=True, text=True, timeout=120
    )
    assert r.returncode == 2 and r.stderr.count("\n") == 1 and words in r.stderr, r.stderr


def test_an_existing_pythonpath_is_kept_after_the_source_tree(tmp_path):
    """A GPU image's extra packages (a directory on PYTHONPATH) stay importable in every run it starts."""
    code = (
        f"import sys; sys.path.insert(0, {str(SCRIPT.parent)!r}); import gpu_acceptance; "
        "print(gpu_acceptance.ENV['PYTHONPATH'])"
    )
    r = subprocess.run(
        [sys.executable, "-c", code],
        capture_output=True,
        text=True,
        env={**os.environ, "PYTHONPATH": str(tmp_path)},
        timeout=60,
    )
    assert r.stdout.strip() == f"{ROOT / 'src'}{os.pathsep}{tmp_path}", r.stderr
