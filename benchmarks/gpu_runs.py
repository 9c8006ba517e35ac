"""What benchmarks/gpu_acceptance.py's parts share: the time budget, the results file rewritten after every
figure, runs in their own process group with a hard cap, the sample data, and one `pretrain train` or nanoGPT
run turned into figures.

Everything a part measures is written the moment it exists, so that a command killed at its limit (kill -9,
the whole process group) keeps every figure it finished: the results JSON is rewritten whole through a temporary
file and a rename, each run logs straight into RUNS/NAME/train.log while it runs, and its plan_vs_run.json and
metrics.jsonl are copied there (temp + rename) as soon as it ends.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PY = sys.executable
# Prepended: packages installed beside the system's (a GPU image's extra site directory) stay importable.
ENV = {
    **os.environ,
    "PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT / "src"), os.environ.get("PYTHONPATH")])),
    "PYTHONUNBUFFERED": "1",
    "HF_HUB_OFFLINE": "1",
}
KEPT = ("plan_vs_run.json", "metrics.jsonl")  # what each run leaves beside its log


def fail(message: str):
    """A fault the caller can fix: one line on stderr, exit 2."""
    print(f"gpu_acceptance: {message}", file=sys.stderr)
    sys.exit(2)


class Budget:
    """The seconds left of --budget (None: no limit), and each run's cap: about twice what it is expected to
    take, never past the budget's end, so one slow compile cannot starve every later figure."""

    def __init__(self, seconds: float | None):
        self.start = time.monotonic()
        self.end = None if seconds is None else self.start + seconds

    def left(self) -> float:
        return float("inf") if self.end is None else self.end - time.monotonic()

    def allows(self, what: str, expected: float) -> bool:
        if self.left() >= expected:
            return True
        print(f"budget: {self.left():.0f} s left, {what} expects {expected:.0f} s: not started", flush=True)
        return False

    def cap(self, expected: float) -> float:
        return min(2 * expected, self.left())

    def elapsed(self) -> float:
        return time.monotonic() - self.start


class Results:
    """The results file, rewritten (temp + rename) after every figure: readable JSON at every moment."""

    def __init__(self, path: Path, facts: dict, budget: Budget, earlier: dict | None = None):
        self.path, self.budget = path, budget
        self.data = earlier if earlier is not None else json.loads(path.read_text()) if path.exists() else {}
        self.data.update(facts)

    def put(self, timing: tuple[str, float] | None = None, shown=None, **figures) -> None:
        """Record `figures`, and `timing` (what ran, its seconds) in the "seconds" table; print `shown` (default
        the figures)."""
        if timing is not None:
            figures["seconds"] = {**self.data.get("seconds", {}), timing[0]: round(timing[1], 1)}
        self.data.update(figures)
        write_json(self.path, self.data)
        print(f"recorded at {self.budget.elapsed():.0f} s:", json.dumps(shown or figures)[:400], flush=True)

    def missed(self, name: str, why: str) -> None:
        """A run that measured nothing: said in "not_measured" (a later call does not run it again)."""
        self.put(shown={name: why}, not_measured={**self.data.get("not_measured", {}), name: why})


def write_json(path: Path, data) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(json.dumps(data, indent=1) + "\n")
    os.replace(tmp, path)


def keep(src: Path, dst: Path) -> None:
    """Copy a file in whole or not at all (temp + rename): a kill mid-copy leaves no half file."""
    if not src.is_file():
        return
    dst.parent.mkdir(parents=True, exist_ok=True)
    tmp = dst.with_name(dst.name + ".tmp")
    shutil.copyfile(src, tmp)
    os.replace(tmp, dst)


def _die_with_parent() -> None:
    """In the child before exec (Linux): SIGKILL it when this script dies, however it dies (kill -9 at the
    command's limit included), so that no run outlives the script and writes after it."""
    import ctypes

    PR_SET_PDEATHSIG = 1
    ctypes.CDLL(None, use_errno=True).prctl(PR_SET_PDEATHSIG, signal.SIGKILL)


def _stop_on_term(proc: subprocess.Popen) -> None:
    """A TERM to this script (gpu_session.sh's timeout) stops the run's whole group too, then this script."""

    def stop(signum, frame):
        os.killpg(proc.pid, signal.SIGKILL)
        sys.exit(128 + signum)

    signal.signal(signal.SIGTERM, stop)


def run(cmd: list, timeout: float, log: Path, **kw) -> bool:
    """A subprocess in its own process group, its output into `log` as it runs; True when it exits 0. Past
    `timeout` the whole group is killed (torchrun's ranks, inductor's compile workers), and its log says so."""
    log.parent.mkdir(parents=True, exist_ok=True)
    limit = None if timeout == float("inf") else max(timeout, 1)
    with log.open("w") as out:
        out.write(f"$ {' '.join(map(str, cmd))}\n")
        out.flush()
        proc = subprocess.Popen(
            [str(x) for x in cmd],
            stdout=out,
            stderr=subprocess.STDOUT,
            start_new_session=True,
            preexec_fn=_die_with_parent,
            **kw,
        )
        _stop_on_term(proc)
        try:
            code = proc.wait(timeout=limit)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
            out.write(f"\nstopped after {timeout:.0f} s (its cap)\n")
            print(f"stopped after {timeout:.0f} s: {' '.join(map(str, cmd[:6]))} ... (log: {log})", flush=True)
            return False
    if code != 0:
        print(f"exit {code}: {' '.join(map(str, cmd[:6]))} ...", tail(log), sep="\n", flush=True)
    return code == 0


def tail(log: Path, chars: int = 3000) -> str:
    return log.read_text(errors="replace")[-chars:] if log.exists() else ""


# --- the sample data ------------------------------------------------------------------------------------------


def write_corpus(directory: Path) -> Path:
    """Python's bundled documentation and the standard library's docstrings (pretrain.data.sample) as JSONL;
    where this Python has no pydoc_data (some images strip it), the docstrings alone; where those are missing
    too, this repository's own text (docs/ and src/). The step time does not depend on the text."""
    sys.path.insert(0, str(ROOT / "src"))
    from pretrain.data.sample import FILE_NAME, stdlib_docstrings, write_sample_corpus
    from pretrain.errors import UsageError

    try:
        return write_sample_corpus(directory, docstrings=True)
    except UsageError as e:
        print(f"sample corpus: {e}; the standard library's docstrings instead", flush=True)
    records = stdlib_docstrings()
    if sum(len(r["text"]) for r in records) < 200_000:
        files = sorted([*ROOT.glob("docs/*.md"), *ROOT.glob("src/pretrain/**/*.py"), ROOT / "README.md"])
        print(
            f"sample corpus: {len(records)} docstring documents; this repository's {len(files)} files too", flush=True
        )
        records += [{"title": str(f.relative_to(ROOT)), "text": f.read_text(errors="replace")} for f in files]
    directory.mkdir(parents=True, exist_ok=True)
    path = directory / FILE_NAME
    path.write_text("".join(json.dumps(r, ensure_ascii=False) + "\n" for r in records), encoding="utf-8")
    return path


def val_tokens(data: Path) -> int:
    return int(json.loads((data / "meta.json").read_text())["num_tokens"]["val"])


def prepare_data(work: Path, vocab: int, seq_len: int, ranks: int = 1) -> Path:
    """The sample corpus as tokens, with a validation split of at least `ranks` windows of `seq_len` (every run
    ends with an evaluation): prepared again with a larger --val-fraction where 5 % is too little."""
    data = work / f"data{vocab}"
    needed = ranks * seq_len + 1
    if (data / "meta.json").exists() and val_tokens(data) >= needed:
        return data
    corpus, tok, logs = work / "corpus", work / f"tok{vocab}", work / "logs"
    if not (corpus.is_dir() and any(corpus.iterdir())):
        write_corpus(corpus)
    if not (tok / "tokenizer.json").exists():
        args = ["tokenizer", "train", "--input", corpus, "--vocab-size", vocab, "--out", tok]
        if not run([PY, "-m", "pretrain", *args], 300, logs / "tokenizer.log", env=ENV):
            fail(f"training the sample tokenizer failed (log: {logs / 'tokenizer.log'})")
    fraction = 0.05
    for _ in range(4):
        shutil.rmtree(data, ignore_errors=True)
        args = ["prepare", "--input", corpus, "--tokenizer", tok, "--out", data, "--val-fraction", fraction]
        if not run([PY, "-m", "pretrain", *args], 300, logs / "prepare.log", env=ENV):
            fail(f"preparing the sample data failed (log: {logs / 'prepare.log'})")
        have = val_tokens(data)
        if have >= needed:
            return data
        fraction = min(0.5, fraction * 2 * needed / max(have, 1))
        print(f"sample data: {have:,} validation tokens < {needed:,}; again with --val-fraction {fraction:.3f}")
    fail(f"the sample corpus has too few tokens for {ranks} validation window(s) of {seq_len}")


# --- one run's figures ----------------------------------------------------------------------------------------

TRAIN_DEFAULTS = [
    "run.log_every=2",
    "run.eval_every=0",
    "run.eval_batches=1",
    "run.checkpoint_every=0",  # no checkpoint at all: 15 GB for the 1B model
    "run.progress=false",
    "stability.spike_detection=false",
]


def train_run(
    name: str, work: Path, data: Path, overrides: list[str], steps: int, timeout: float, runs: Path, nproc: int = 1
) -> dict | None:
    """A short `pretrain train` (under torchrun over `nproc` GPUs if more than one), its log in RUNS/NAME/ as
    it runs and its plan_vs_run.json and metrics.jsonl copied there when it ends; the steady tokens/s and MFU
    of its metrics lines, the SDPA kernel, and its peak memory against the plan's eager and (when it models one)
    compiled peak. None when it failed or outlived `timeout`."""
    out = work / "runs" / name
    shutil.rmtree(out, ignore_errors=True)
    torchrun = [PY, "-m", "torch.distributed.run", "--standalone", f"--nproc-per-node={nproc}", "-m", "pretrain"]
    cmd = [
        *(torchrun if nproc > 1 else [PY, "-m", "pretrain"]),
        "train",
        *overrides,
        f"data.dir={data}",
        f"run.dir={out}",
        f"train.max_steps={steps}",
        *TRAIN_DEFAULTS,
    ]
    ok = run(cmd, timeout, runs / name / "train.log", env=ENV)
    for kept in KEPT:
        keep(out / kept, runs / name / kept)
    if not ok or not (out / "plan_vs_run.json").exists():
        return None
    lines = [json.loads(x) for x in (out / "metrics.jsonl").read_text().splitlines()]
    steady = [x for x in lines if "loss" in x and x["step"] > steps // 2]
    report = json.loads((out / "plan_vs_run.json").read_text())
    got = {
        "tokens_per_s": statistics.median(x["tokens_per_s"] for x in steady),
        "mfu": statistics.median(x["mfu"] for x in steady),
        "attention_kernel": report.get("attention_kernel"),
        "vs_plan": {r["name"]: {k: r[k] for k in ("planned", "measured", "error_pct")} for r in report["rows"]},
    }
    if "tensor_parallel" in report.get("fp8", {}):  # what fp8's tensor-parallel collectives carried
        got["tensor_parallel"] = report["fp8"]["tensor_parallel"]
    peak = got["vs_plan"].get("peak allocated")
    if peak is not None:  # a GPU's allocator peak; on a CPU it is not measured, so absent
        got["peak"] = _peak(peak, report["plan"]["memory_bytes"])
    return got


def _peak(peak: dict, mem: dict) -> dict:
    """The allocator's peak against the plan's eager total and, where the planner models one, its compiled
    peak (both less the CUDA context, which the allocator does not see)."""
    got = {
        "measured_bytes": peak["measured"],
        "planned_eager_bytes": peak["planned"],
        "error_pct_vs_eager": peak["error_pct"],
    }
    if isinstance(mem.get("compiled"), (int, float)):
        planned = mem["compiled"] - mem["cuda_context"]
        got.update(planned_compiled_bytes=planned, error_pct_vs_compiled=100.0 * (peak["measured"] - planned) / planned)
    return got


NANOGPT_FILES = ("train.py", "model.py", "configurator.py")


def nanogpt_run(nanogpt: Path, work: Path, data: Path, args: list[str], timeout: float, log: Path) -> float | None:
    """nanoGPT's train.py (unmodified, MIT) as its README runs it, on the same tokens, its output in `log`;
    tokens/s over its later iterations."""
    home = work / "nanogpt"
    (home / "data" / "ours").mkdir(parents=True, exist_ok=True)
    for name in NANOGPT_FILES:
        shutil.copy(nanogpt / name, home / name)
    for split in ("train", "val"):
        target = home / "data" / "ours" / f"{split}.bin"
        target.unlink(missing_ok=True)
        os.symlink(data / f"{split}.bin", target)
    flags = ["--dataset=ours", "--eval_interval=1000000", "--eval_iters=1", "--log_interval=1"]
    flags += ["--always_save_checkpoint=False", "--wandb_log=False", *args]
    if not run([PY, "train.py", *flags], timeout, log, cwd=home, env={**os.environ, "PYTHONUNBUFFERED": "1"}):
        return None
    times = [
        float(line.split("time ")[1].split("ms")[0])
        for line in log.read_text().splitlines()
        if line.startswith("iter ") and "time " in line
    ]
    flag = {x.split("=")[0]: int(x.split("=")[1]) for x in args if x.split("=")[1].isdigit()}
    tokens_per_iter = flag["--batch_size"] * flag["--block_size"] * flag["--gradient_accumulation_steps"]
    return tokens_per_iter / (statistics.median(times[len(times) // 2 :]) / 1000)
