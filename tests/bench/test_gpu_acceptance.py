"""benchmarks/gpu_acceptance.py and gpu_session.sh on a CPU (--dry-run): `first` writes each figure as it is
measured and a kill -9 halfway keeps every finished one, a second call finishes the rest from the first's JSON;
the memory matrix written cell by cell and carried on; the budget; the refusals; the sample data without
pydoc_data or with a short validation split. What a 15-minute GPU window relies on."""

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
SESSION = ROOT / "benchmarks" / "gpu_session.sh"
FIRST_ORDER = ["llama_1b", "gpt2", "llama_1b_eager", "masked", "fp8", "moe", "llama_1b_fp32_residual"]


def script(*args):
    return [sys.executable, str(SCRIPT), *map(str, args)]


def read(path):
    """The results file as it is now: absent, or whole JSON (never a half-written file)."""
    return json.loads(path.read_text()) if path.exists() else {}


def test_first_writes_each_figure_as_measured_a_kill_keeps_them_and_a_second_call_finishes(prepared, tmp_path):
    out, work = tmp_path / "out", tmp_path / "work"
    args = ["first", "--dry-run", "--skip", "nanogpt", "--data", prepared, "--work", work]
    proc = subprocess.Popen(
        script(*args, "--out", out), stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, start_new_session=True
    )
    seen = []  # every state of the file the polling met: each one whole JSON
    deadline = time.time() + 600  # a loaded 2-core machine: minutes
    while "gpt2_tokens_per_s" not in read(out / "first.json") and proc.poll() is None and time.time() < deadline:
        seen.append(read(out / "first.json"))
        time.sleep(0.1)
    os.killpg(proc.pid, signal.SIGKILL)  # halfway: two of the six runs done
    proc.wait()
    first = read(out / "first.json")
    assert "gpt2_tokens_per_s" in first, proc.stdout.read()[-3000:]
    assert first["tokens_per_s_llama_1b"] > 0 and 0 < first["mfu_llama_1b"]
    assert first["vs_plan_llama_1b"]["parameters"]["error_pct"] == 0  # model states exact against the plan
    assert list(first["seconds"]) == FIRST_ORDER[: len(first["seconds"])]
    assert any("tokens_per_s_llama_1b" in s and "gpt2_tokens_per_s" not in s for s in seen)  # written as measured
    kept = json.loads((out / "runs" / "llama_1b" / "plan_vs_run.json").read_text())
    assert kept["rows"] and (out / "runs" / "llama_1b" / "metrics.jsonl").exists()
    assert "$ " in (out / "runs" / "gpt2" / "train.log").read_text()
    assert not list(out.rglob("*.tmp"))

    r = subprocess.run(
        script(*args, "--out", tmp_path / "again", "--from", out / "first.json"),
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-2000:]
    assert "llama_1b: in the results already, not run again" in r.stdout
    done = read(tmp_path / "again" / "first.json")
    assert list(done["seconds"]) == FIRST_ORDER and not done.get("not_measured")
    assert done["seconds"]["llama_1b"] == first["seconds"]["llama_1b"]  # carried, not measured again
    ratios = ("masked_over_unmasked", "fp8_over_bf16", "llama_1b_fp32_residual_over_bf16_residual")
    for figure in [*(f"{r}_tokens_per_s" for r in ratios), "moe_tokens_per_s"]:
        assert done[figure] > 0, figure


def test_memory_rows_are_written_as_cells_finish_and_a_second_call_carries_on_from_the_returned_json(tmp_path):
    out, work = tmp_path / "out", tmp_path / "work"
    # Three cells asked for; killed (-9, the whole process group) as soon as the first row is in the file.
    proc = subprocess.Popen(
        script("memory", "--dry-run", "--cells", 3, "--work", work, "--out", out),
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        start_new_session=True,
    )
    deadline = time.time() + 300
    while not read(out / "memory.json").get("memory_matrix") and proc.poll() is None and time.time() < deadline:
        time.sleep(0.2)
    os.killpg(proc.pid, signal.SIGKILL)
    proc.wait()
    first = read(out / "memory.json")["memory_matrix"]
    assert len(first) == 1, proc.stdout.read()[-3000:]
    row = first[0]
    assert set(row) == {"overrides", "planned_bytes", "measured_bytes", "compiled"}
    assert row["compiled"] is False and row["planned_bytes"] > 0 and row["measured_bytes"] > 0
    assert row["overrides"]["train.precision"] == "bf16-mixed" and row["overrides"]["model.vocab_size"] == 512
    assert not list(tmp_path.rglob("*.tmp"))

    # A fresh machine: only the returned JSON comes along (--from), into another results directory.
    r = subprocess.run(
        script(
            "memory",
            "--dry-run",
            "--cells",
            1,
            "--work",
            tmp_path / "w2",
            "--out",
            tmp_path / "o2",
            "--from",
            out / "memory.json",
        ),
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-2000:]
    assert "1 cells already in the results, 287 to go" in r.stdout
    second = read(tmp_path / "o2" / "memory.json")["memory_matrix"]
    assert len(second) == 2 and second[0] == row  # the done cell was not run again
    assert second[1]["overrides"]["train.micro_batch_size"] == 1  # the deciding cells' order: recomputation x batch


def test_the_first_window_holds_the_twenty_deciding_cells_and_the_rest_follows():
    sys.path.insert(0, str(SCRIPT.parent))
    import gpu_acceptance

    cells = gpu_acceptance.memory_cells(dry=False)
    keys = [json.dumps(c, sort_keys=True) for c in cells]
    assert len(keys) == len(set(keys)) == 288  # the whole grid, each cell once
    deciding = cells[:20]
    assert sum(c["compiled"] for c in deciding) == 8 and not any(c["compiled"] for c in cells[20:144])
    modes = {
        (c["overrides"]["train.activation_checkpointing"], c["overrides"]["train.micro_batch_size"]) for c in deciding
    }
    assert {(m, b) for m in ("none", "selective", "full") for b in (1, 8)} <= modes
    assert {c["overrides"]["train.precision"] for c in deciding} == {"bf16-mixed", "bf16", "fp16-mixed", "fp32"}
    assert {c["overrides"]["model.vocab_size"] for c in deciding} == {128256, 32000}


def test_a_budget_too_small_for_any_run_stops_cleanly_and_records_no_figure(prepared, tmp_path):
    r = subprocess.run(
        script("first", "--dry-run", "--skip", "nanogpt", "--data", prepared, "--budget", 2, "--out", tmp_path),
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert r.returncode == 0, r.stderr[-2000:]
    assert "llama_1b expects" in r.stdout and "not started" in r.stdout
    data = json.loads((tmp_path / "first.json").read_text())
    # Only the device facts: a figure not measured is absent, never zero.
    assert set(data) <= {"gpu", "torch", "dry_run", "seconds"} and data["gpu"] == "cpu"


@pytest.mark.parametrize(
    "args, words",
    [
        (["--budget", "0"], "--budget 0: give a positive number"),
        (["--nanogpt", "/nonexistent/nanoGPT"], "train.py / model.py / configurator.py are not in /nonexistent"),
        (["--cells", "0"], "--cells 0: give at least 1"),
        (["--skip", "nanogpt,gpt2"], "--skip gpt2: give a comma list of nanogpt, fp8"),
        (["--from", "/nonexistent.json"], "--from /nonexistent.json: no such file"),
    ],
)
def test_bad_arguments_are_one_line_and_exit_2(tmp_path, args, words):
    r = subprocess.run(
        script("first", "--dry-run", "--work", tmp_path, "--out", tmp_path, *args),
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert r.returncode == 2 and r.stderr.count("\n") == 1 and words in r.stderr, r.stderr


def session(tmp_path, *args, pythonpath=""):
    env = {**os.environ, "OUT": str(tmp_path / "out"), "GPU_SESSION_WORK": str(tmp_path / "work")}
    env.update(PYTHON=sys.executable, PYTHONPATH=pythonpath)
    return subprocess.run(["bash", str(SESSION), *args], capture_output=True, text=True, env=env, timeout=120)


def test_the_session_refuses_in_one_line_what_would_lose_a_figure(tmp_path):
    """nanoGPT missing (targets and first), torchao missing (first): refused before anything runs or prints,
    unless told to skip them."""
    r = session(tmp_path, "targets", "--nanogpt", tmp_path / "NO_SUCH_DIR")
    assert r.returncode == 2 and r.stdout == "" and r.stderr.count("\n") == 1, r.stderr
    assert "NO_SUCH_DIR/train.py" in r.stderr and "--skip nanogpt" in r.stderr
    r = session(tmp_path, "first", "--nanogpt", tmp_path / "NO_SUCH_DIR", "--dry-run")
    assert r.returncode == 2 and "--skip nanogpt" in r.stderr and r.stderr.count("\n") == 1, r.stderr
    blocked = tmp_path / "blocked"  # an image without torchao: a package of that name that cannot be imported
    (blocked / "torchao").mkdir(parents=True)
    (blocked / "torchao" / "__init__.py").write_text("raise ImportError('not on this image')\n")
    r = session(tmp_path, "first", "--skip", "nanogpt", "--dry-run", pythonpath=str(blocked))
    assert r.returncode == 2 and r.stdout == "" and r.stderr.count("\n") == 1, r.stderr
    assert "torchao is not importable" in r.stderr and "--skip fp8" in r.stderr
    assert not (tmp_path / "out" / "first.json").exists()


def test_the_sample_corpus_needs_no_pydoc_data(tmp_path):
    """Some images strip pydoc_data: the corpus is then the standard library's docstrings."""
    stripped = tmp_path / "stripped" / "pydoc_data"  # a pydoc_data without its topics
    stripped.mkdir(parents=True)
    (stripped / "__init__.py").write_text("")
    code = (
        f"import sys; sys.path.insert(0, {str(SCRIPT.parent)!r}); from pathlib import Path; import gpu_runs; "
        f"print(gpu_runs.write_corpus(Path({str(tmp_path / 'corpus')!r})))"
    )
    env = {**os.environ, "PYTHONPATH": str(stripped.parent)}
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=120)
    assert r.returncode == 0, r.stderr
    assert "no pydoc_data" in r.stdout
    records = [json.loads(x) for x in (tmp_path / "corpus" / "pydoc_topics.jsonl").read_text().splitlines()]
    assert len(records) > 50 and sum(len(x["text"]) for x in records) > 200_000


def test_a_short_validation_split_is_prepared_again_until_it_holds_a_window(tmp_path):
    """Every run ends with an evaluation: 5 % of a small corpus is less than one window, so the data is
    prepared again with a larger --val-fraction."""
    sys.path.insert(0, str(SCRIPT.parent))
    import gpu_runs

    corpus = tmp_path / "corpus"
    corpus.mkdir()
    text = (ROOT / "tests" / "fixtures" / "tinyshakespeare_head.txt").read_text()
    lines = [json.dumps({"text": part}) for part in text.split("\n\n") if part.strip()]
    (corpus / "small.jsonl").write_text("\n".join(lines) + "\n")
    data = gpu_runs.prepare_data(tmp_path, 300, 4000)
    meta = json.loads((data / "meta.json").read_text())
    assert meta["num_tokens"]["val"] >= 4001 and meta["val_fraction"] > 0.05


def test_an_existing_pythonpath_is_kept_after_the_source_tree(tmp_path):
    """A GPU image's extra packages (a directory on PYTHONPATH) stay importable in every run it starts."""
    code = f"import sys; sys.path.insert(0, {str(SCRIPT.parent)!r}); import gpu_runs; print(gpu_runs.ENV['PYTHONPATH'])"
    r = subprocess.run(
        [sys.executable, "-c", code],
        capture_output=True,
        text=True,
        env={**os.environ, "PYTHONPATH": str(tmp_path)},
        timeout=60,
    )
    assert r.stdout.strip() == f"{ROOT / 'src'}{os.pathsep}{tmp_path}", r.stderr


def test_no_run_outlives_the_script(tmp_path):
    """kill -9 of the script (a command's limit): the run it waits for dies with it, and writes nothing after."""
    marker = tmp_path / "late"
    late = f"import time, pathlib; time.sleep(3); pathlib.Path({str(marker)!r}).touch()"
    code = (
        f"import sys; sys.path.insert(0, {str(SCRIPT.parent)!r}); from pathlib import Path; import gpu_runs; "
        f"gpu_runs.run([sys.executable, '-c', {late!r}], 60, Path({str(tmp_path / 'log')!r}))"
    )
    proc = subprocess.Popen([sys.executable, "-c", code], start_new_session=True)
    time.sleep(1.5)
    os.killpg(proc.pid, signal.SIGKILL)
    proc.wait()
    time.sleep(3)
    assert not marker.exists()
