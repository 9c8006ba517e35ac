"""Helpers for every test folder: the `pretrain` CLI as a subprocess and the tiny training run's overrides."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


def run_cli(*args, cwd=None, env=None, timeout=600) -> subprocess.CompletedProcess:
    """`python -m pretrain ARGS` in a fresh interpreter, as a user runs it."""
    full_env = {**os.environ, "PYTHONUNBUFFERED": "1", **(env or {})}
    return subprocess.run(
        [sys.executable, "-m", "pretrain", *map(str, args)],
        cwd=cwd,
        env=full_env,
        capture_output=True,
        text=True,
        timeout=timeout,
    )


# The GPU tests' model: big enough on a card that the allocator's fixed costs (cuBLAS workspace, rotary tables)
# are small beside the step, and every block linear a multiple of 16 on each of 2 tensor ranks (float8's rule).
GPU_MODEL = [
    "model.hidden_size=512",
    "model.intermediate_size=1376",
    "model.num_layers=4",
    "model.num_heads=8",
    "model.num_kv_heads=4",
]


def tiny(prepared, run_dir, *extra) -> list[str]:
    """`pretrain train` overrides for a ~160K-parameter LLaMA that trains in seconds on a CPU."""
    return [
        "model.preset=debug",
        "train.seq_len=32",
        "train.micro_batch_size=4",
        "train.grad_accum_steps=2",
        "train.precision=fp32",
        "train.device=cpu",
        "train.lr=3e-3",
        "train.warmup=2",
        "train.max_steps=12",
        f"data.dir={prepared}",
        f"run.dir={run_dir}",
        "run.log_every=1",
        "run.eval_every=6",
        "run.eval_batches=2",
        "run.checkpoint_every=4",
        "run.progress=false",
        "hardware.peak_tflops=0.05",
        *extra,
    ]


# torch.compile on a CPU generates C++ (inductor): without a compiler the compile tests cannot run.
needs_compiler = pytest.mark.skipif(
    shutil.which("g++") is None and shutil.which("c++") is None, reason="torch.compile on a CPU needs a C++ compiler"
)


def start(args, **kw):
    """`python -m pretrain ARGS` started in the background (a test that signals or kills it)."""
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    return subprocess.Popen(
        [sys.executable, "-m", "pretrain", *map(str, args)],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=env,
        **kw,
    )


def wait_for_steps(run_dir, n, proc, timeout=120):
    """Until `run_dir`'s metrics.jsonl holds n training lines (or `proc` ended: an AssertionError)."""
    deadline = time.time() + timeout
    while time.time() < deadline:
        path = run_dir / "metrics.jsonl"
        if path.exists() and sum('"loss"' in x for x in path.read_text().splitlines()) >= n:
            return
        if proc.poll() is not None:
            raise AssertionError(f"training ended early: {proc.stderr.read()}")
        time.sleep(0.05)
    raise AssertionError("training made no progress")


def torchrun(*args, nproc: int = 2, wait: bool = True):
    """`pretrain train ARGS` under a real torchrun with `nproc` CPU ranks (gloo). With wait=False the Popen,
    in a session of its own so that a test can end the whole job at once."""
    cmd = [
        sys.executable,
        "-m",
        "torch.distributed.run",
        "--standalone",
        f"--nproc-per-node={nproc}",
        "-m",
        "pretrain",
        "train",
        *map(str, args),
    ]
    env = {**os.environ, "PYTHONUNBUFFERED": "1", "OMP_NUM_THREADS": "1"}
    if not wait:
        return subprocess.Popen(
            cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env, start_new_session=True
        )
    return subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=600)


def kill_job(proc) -> None:
    """SIGKILL a torchrun job started with wait=False (a lost node): the launcher and every rank, each of
    which torchrun starts in a session of its own (a killpg of the launcher leaves the ranks training)."""
    import contextlib

    import psutil

    for process in [psutil.Process(proc.pid), *psutil.Process(proc.pid).children(recursive=True)]:
        with contextlib.suppress(psutil.NoSuchProcess):
            process.kill()
    proc.communicate(timeout=60)


def train_layouts(out: Path, base: list[str], layouts: list[dict], timeout: int = 900) -> None:
    """Every layout (overrides on `base`) trained in turn by one torchrun of 2 ranks of
    tests/distributed/train_layouts.py, each into out/INDEX, its results in out/results.json."""
    job = out / "job.json"
    job.write_text(json.dumps({"base": base, "layouts": layouts, "out": str(out)}))
    script = Path(__file__).parent / "distributed" / "train_layouts.py"
    r = subprocess.run(
        [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node=2", str(script), str(job)],
        capture_output=True,
        text=True,
        env={**os.environ, "OMP_NUM_THREADS": "1"},
        timeout=timeout,
    )
    assert r.returncode == 0, r.stderr[-3000:]


def run_here(*args) -> subprocess.CompletedProcess:
    """`pretrain ARGS` run by pretrain.cli.main in this interpreter, returned as run_cli returns it: the exit
    status (an uncaught exception is 1 and its traceback on stderr, as Python's), stdout, and stderr with the
    warnings Python would print there. A tiny training run costs ~0.6 s of CPU here against ~6 s in a fresh
    interpreter, most of which imports torch. For a run whose process is not what is tested: signals, kills,
    locks held by another process, torchrun, the environment and the interpreter's exit stay with run_cli."""
    import contextlib
    import io
    import traceback
    import warnings

    from pretrain.cli import main

    out, err = io.StringIO(), io.StringIO()
    with (
        contextlib.redirect_stdout(out),
        contextlib.redirect_stderr(err),
        warnings.catch_warnings(record=True) as caught,
    ):
        try:
            code = main([str(a) for a in args])
        except SystemExit as e:  # argparse's usage errors
            code = e.code
        except Exception:  # noqa: BLE001 - what a fresh interpreter does with it: a traceback, exit 1
            traceback.print_exc()
            code = 1
    # The filters in force are pytest's (pyproject.toml's); these categories Python itself would not print.
    hidden = (DeprecationWarning, PendingDeprecationWarning, ImportWarning, ResourceWarning)
    shown = "".join(
        warnings.formatwarning(w.message, w.category, w.filename, w.lineno)
        for w in caught
        if not issubclass(w.category, hidden)
    )
    return subprocess.CompletedProcess(["pretrain", *map(str, args)], code, out.getvalue(), shown + err.getvalue())


def finished_run(run_dir, *args) -> Path:
    """`pretrain train *args` (in this interpreter), which must succeed: its run directory (for module-scoped
    fixtures)."""
    r = run_here("train", *args)
    assert r.returncode == 0, r.stderr
    return run_dir


def finished_torchrun(*args, nproc: int = 2) -> subprocess.CompletedProcess:
    """`torchrun ... pretrain train *args`, which must succeed (the end of its stderr shown if not)."""
    r = torchrun(*args, nproc=nproc)
    assert r.returncode == 0, r.stderr[-3000:]
    return r


def exported_tensors(run_dir, out) -> dict:
    """`pretrain export RUN_DIR --to hf OUT`, which must succeed: the tensors of its model.safetensors."""
    from safetensors.torch import load_file

    r = run_cli("export", run_dir, "--to", "hf", out)
    assert r.returncode == 0, r.stderr
    return load_file(Path(out) / "model.safetensors")


def per_rank_reports(run_dir, ranks: int) -> list[tuple[dict, dict]]:
    """Each rank's plan_vs_run.rank<R>.json (debug.plan_vs_run_per_rank) as (its place in the grid, {row name:
    row}), after asserting that the rank holds exactly the planner's parameter, gradient and optimizer bytes."""
    import json

    reports = []
    for r in range(ranks):
        report = json.loads((Path(run_dir) / f"plan_vs_run.rank{r}.json").read_text())
        rows = {x["name"]: x for x in report["rows"]}
        for name in ("parameters", "gradients", "optimizer_states"):
            assert rows[name]["planned"] == rows[name]["measured"], (r, name)
        reports.append((report["grid"], rows))
    return reports


def losses(run_dir) -> dict:
    """{step: training loss} of a run's metrics.jsonl."""
    import json

    rows = [json.loads(x) for x in (Path(run_dir) / "metrics.jsonl").read_text().splitlines()]
    return {r["step"]: r["loss"] for r in rows if "loss" in r}


def task_rows(run_dir) -> dict:
    """{step: {"eval/<task>/<metric>": value}} of a run's in-loop task evaluations (run.eval_tasks)."""
    import json

    rows = [json.loads(x) for x in (Path(run_dir) / "metrics.jsonl").read_text().splitlines()]
    tasks = [r for r in rows if any(k.startswith("eval/") and k.endswith("/acc") for k in r)]
    return {r["step"]: {k: v for k, v in r.items() if k.startswith("eval/")} for r in tasks}


def same_task_rows(a_dir, b_dir, steps) -> None:
    """Two runs' in-loop task metrics at `steps`: the same accuracies (counts of the same examples), the
    bits per byte and standard errors within float tolerance (other layouts sum in other orders)."""
    a, b = task_rows(a_dir), task_rows(b_dir)
    assert list(a) == list(b) == list(steps)
    for step in a:
        exact = {k: v for k, v in a[step].items() if k.endswith(("/acc", "/acc_norm", "/acc_bytes", "/chance"))}
        assert exact and exact == {k: b[step][k] for k in exact}, step
        assert a[step] == pytest.approx(b[step], rel=1e-5), step


def params(path) -> dict:
    """The state dict of a run's newest checkpoint (or of one checkpoint)."""
    from pretrain import load_model

    return load_model(path).state_dict()


def serve_planner(*items):
    """`pretrain plan ITEMS --serve --port 0` in the background: (the process, its page's URL). The caller
    ends it (proc.terminate())."""
    proc = start(["plan", *items, "--serve", "--port", "0"])
    line = proc.stdout.readline()  # "pretrain plan: serving the planner at URL (Ctrl-C stops it)"
    if " at http://" not in line:
        proc.kill()
        raise AssertionError(f"the planner did not serve: {line}{proc.stderr.read()}")
    return proc, line.split(" at ", 1)[1].split()[0]


# Short multiple-choice examples in the words of the sample corpus (Python's documentation): choices of
# different lengths, so that acc and acc_norm can disagree.
MC_EXAMPLES = [
    ("The for statement", [" iterates over the items of any sequence", " is a fish", " returns"], 0),
    ("A function is defined with the keyword", [" def", " class", " import", " banana"], 0),
    ("Python is an interpreted", [" language", " mountain range in the north"], 0),
    ("To read a file, call", [" open()", " the doctor", " sleep"], 0),
    ("The dictionary maps keys to", [" values", " trees", " nothing at all today"], 0),
    ("An exception is raised when", [" an error occurs", " the sun sets"], 1),
    ("Lists are", [" mutable sequences", " purple"], 0),
    ("The module", [" os", " sys", " provides functions for the operating system"], 2),
    ("import", [" os", " the"], 1),
    ("A class defines", [" a new type of object", " a river"], 0),
    ("Strings in Python are", [" immutable", " loud", " made of glass"], 0),
    ("The return statement", [" exits a function", " is green"], 1),
]


def write_mc_task(path, examples: int = len(MC_EXAMPLES)) -> Path:
    """The first `examples` of MC_EXAMPLES as a local task file for `pretrain eval` / run.eval_tasks
    ({context, choices, gold} lines)."""
    import json

    Path(path).write_text(
        "".join(json.dumps({"context": c, "choices": ch, "gold": g}) + "\n" for c, ch, g in MC_EXAMPLES[:examples])
    )
    return Path(path)
