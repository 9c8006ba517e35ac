"""The GPU figures, measured within a time budget, each written the moment it exists (benchmarks/gpu_runs.py).

    python benchmarks/gpu_acceptance.py first    [--budget S] [--nanogpt DIR] [--skip nanogpt,fp8]  # 15-min window
    python benchmarks/gpu_acceptance.py memory   [--budget S] [--cells N]   # resumable: --from the last JSON
    python benchmarks/gpu_acceptance.py targets  [--budget S]               # GPT-2 A B A B, the speed switches
    python benchmarks/gpu_acceptance.py features [--budget S]               # + fp8 with tensor parallelism (2 GPUs)
    python benchmarks/gpu_acceptance.py first --dry-run                     # the same code, tiny, on a CPU

first, in this order, one `pretrain train` process each, each capped at about twice its expected time:
  llama_1b        the Llama-3.2-1B shape at seq 2048, bf16-mixed, micro-batch 8 x accumulation 4, compiled, one
                  GPU: tokens/s, MFU against the catalog's bf16 peak, the SDPA kernel that ran, the planned MFU,
                  and the allocator's peak against the plan's eager and compiled figures
  gpt2, nanogpt   GPT-2 124M against nanoGPT's own train.py (unmodified, MIT), same model, batch, sequence, dtype
  llama_1b_eager  the same 1B shape eager: its MFU, and its peak against the plan (activations counted too)
  masked          the 1B compiled with train.document_masking (FlexAttention) against llama_1b, the same run
                  unmasked (no second baseline run)
  fp8             the 1B compiled in fp8 (torchao tensorwise) against llama_1b, the bf16 run
  moe             a Qwen3-MoE-like model (64 experts, top 8), eager: the grouped GEMM's tokens/s and MFU
  llama_1b_fp32_residual  llama_1b with the residual stream in fp32 (train.half_residual=false), where the
                  budget leaves room: the default bf16 stream's speed-up is llama_1b's tokens/s over its
A run starts only if its expected time (EXPECTED: H200 seconds with inductor's cache empty, and a dry run's)
fits in what is left of --budget. Results: DIR/PART.json (--out DIR, default $OUT or gpu-results/), rewritten
atomically after every figure; each run's log, plan_vs_run.json and metrics.jsonl in DIR/runs/NAME/. A run
already measured (or failed) in that file, or in --from FILE (the JSON an earlier window returned), is not run
again. A figure not measured is absent, never zero; a run that measured nothing is named in "not_measured".

memory: planned peak against torch.cuda.max_memory_allocated, one `pretrain sweep` process per cell (a fresh
torch.compile cache each), the ~20 cells that decide the plan's terms first (memory_cells), then the rest of
precision x recomputation x micro-batch x accumulation x vocabulary, eager then compiled, for later windows.
"""

from __future__ import annotations

import argparse
import itertools
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from gpu_runs import (
    ENV,
    NANOGPT_FILES,
    PY,
    ROOT,
    Budget,
    Results,
    fail,
    nanogpt_run,
    prepare_data,
    run,
    tail,
    train_run,
)

NANOGPT_DIRS = (ROOT / "benchmarks" / "peers" / "nanoGPT", ROOT.parent / "shared" / "peers" / "nanoGPT")
SKIPPABLE = ("nanogpt", "fp8")
# Seconds a run is expected to take: on one H200 with inductor's cache empty (compile included; estimates until
# a session measures them: rewrite them from the results' "seconds"), and in a dry run on the 2-core CPU.
EXPECTED = {
    "llama_1b": (75, 40),
    "gpt2": (45, 30),
    "nanogpt": (45, 30),
    "llama_1b_eager": (50, 30),
    "masked": (75, 30),
    "fp8": (75, 40),
    "fp8_tp": (90, 60),
    "moe": (45, 30),
    "llama_1b_fp32_residual": (85, 40),
    "memory_cell": (20, 15),
    "memory_cell_compiled": (45, 30),
}
STEPS = (10, 4)  # optimizer steps per run (GPU, dry run): metrics every 2 steps, the later half steady
DRY_CAP = 600  # a dry run's cap on each run: it checks the code path, and a loaded CPU is slow by minutes


@dataclass
class Job:
    """One run of a part: `measure` returns its figures (None: it measured nothing); `done` is the figure
    whose presence in the results means it ran already; `kind` its row of EXPECTED."""

    name: str
    done: str
    measure: Callable[[float], dict | None]  # its cap in seconds -> figures
    kind: str = ""

    def expected(self, dry: bool) -> float:
        return EXPECTED[self.kind or self.name][dry]


class Session:
    """What a part's runs share: the results, the budget, the data, where the runs and their copies go."""

    def __init__(self, results: Results, budget: Budget, work: Path, runs: Path, dry: bool, data: Path | None):
        self.results, self.budget, self.work, self.runs = results, budget, work, runs
        self.dry, self.given_data = dry, data
        self.device, self.steps = ("cpu", STEPS[1]) if dry else ("cuda", STEPS[0])
        self.data: Path | None = None

    def prepare(self, seq_len: int, ranks: int = 1) -> None:
        self.data = self.given_data or prepare_data(self.work, 8192, seq_len, ranks)

    def train(self, name: str, overrides: list[str], cap: float, nproc: int = 1) -> dict | None:
        assert self.data is not None
        return train_run(name, self.work, self.data, overrides, self.steps, cap, self.runs, nproc)

    def cap(self, expected: float) -> float:
        """A run's time limit: about twice its expected time on a GPU, inside the budget either way."""
        return min(DRY_CAP, self.budget.left()) if self.dry else self.budget.cap(expected)

    def run_jobs(self, jobs: list[Job]) -> None:
        """Each job in order: skipped when the results have it, not started when its expected time does not fit
        in the budget, recorded (or named in not_measured) the moment it ends."""
        for job in jobs:
            data = self.results.data
            if job.done in data or job.name in data.get("not_measured", {}):
                print(f"{job.name}: in the results already, not run again", flush=True)
                continue
            expected = job.expected(self.dry)
            if not self.budget.allows(job.name, expected):
                continue
            started = time.monotonic()
            figures = job.measure(self.cap(expected))
            seconds = (job.name, time.monotonic() - started)
            if figures is None:
                self.results.put(seconds, shown={job.name: "not measured"})
                self.results.missed(job.name, f"failed or stopped: {self.runs / job.name / 'train.log'}")
            else:
                self.results.put(seconds, **figures)


# --- the shapes ----------------------------------------------------------------------------------------------

TINY = [
    "model.num_layers=2",
    "model.hidden_size=128",
    "model.intermediate_size=256",
    "model.num_heads=4",
    "model.num_kv_heads=2",
    "model.vocab_size=8192",
    "train.seq_len=64",
    "train.micro_batch_size=2",
    "hardware.peak_tflops=0.1",
]


def llama_1b(s: Session, compiled: bool) -> list[str]:
    """Llama-3.2-1B's shape, seq 2048, bf16-mixed, micro-batch 8 x accumulation 4, one GPU (a dry run: a tiny
    LLaMA of the same family, never compiled: a CPU compile takes minutes and says nothing of a GPU's)."""
    shape = [
        "configs/llama-1b.yaml",
        "parallel.gpus=1",
        "parallel.zero_stage=0",
        "train.grad_accum_steps=4",
        "train.micro_batch_size=8",
        "train.batch_ramp_tokens=0",
        "train.precision=bf16-mixed",
        f"train.device={s.device}",
        f"train.compile={str(compiled and not s.dry).lower()}",
    ]
    return shape + TINY if s.dry else shape


def moe(s: Session) -> list[str]:
    shape = [
        "model.preset=moe-debug",
        "model.hidden_size=1024",
        "model.num_heads=16",
        "model.num_kv_heads=4",
        "model.intermediate_size=2816",
        "model.moe_intermediate_size=512",
        "model.num_experts=64",
        "model.experts_per_token=8",
        "model.num_layers=8",
        "model.vocab_size=8192",
        "train.seq_len=2048",
        "train.micro_batch_size=4",
        "train.grad_accum_steps=2",
        "train.precision=bf16-mixed",
        "train.compile=false",
        f"train.device={s.device}",
    ]
    if s.dry:
        shape += [*TINY, "model.moe_intermediate_size=64", "model.num_experts=8", "model.experts_per_token=2"]
    return shape


def gpt2_pair(s: Session) -> tuple[list[str], list[str]]:
    """GPT-2 124M ours and nanoGPT's: the same model (vocab padded to 50,304, no biases), batch, sequence, dtype."""
    batch, seq, accum = (2, 64, 2) if s.dry else (12, 1024, 4)
    ours = [
        "configs/gpt2-124m.yaml",
        "model.pad_vocab_to=64",
        "model.bias=false",
        f"train.seq_len={seq}",
        f"train.micro_batch_size={batch}",
        f"train.grad_accum_steps={accum}",
        f"train.device={s.device}",
        f"train.compile={str(not s.dry).lower()}",
    ]
    theirs = [
        f"--batch_size={batch}",
        f"--block_size={seq}",
        f"--gradient_accumulation_steps={accum}",
        f"--max_iters={s.steps}",
        f"--device={s.device}",
        f"--compile={not s.dry}",
        f"--dtype={'float32' if s.dry else 'bfloat16'}",
    ]
    if s.dry:
        ours += ["model.num_layers=2", "model.hidden_size=64", "model.num_heads=2", "model.intermediate_size=256"]
        ours += ["train.precision=fp32", "hardware.peak_tflops=0.1"]
        theirs += ["--n_layer=2", "--n_embd=64", "--n_head=2"]
    return ours, theirs


# --- the runs ------------------------------------------------------------------------------------------------

# The 1B runs whose figures carry the contract's names (mfu_llama_1b, tokens_per_s_llama_1b, peak_llama_1b, ...).
NAMED = ("llama_1b", "llama_1b_eager")


def llama_job(
    s: Session, name: str, compiled: bool, extra: tuple[str, ...] = (), against: tuple[str, str] | None = None
) -> Job:
    """A 1B run. `against`: (the run it is compared with, the word for that run in the ratio's name): its
    tokens/s over that run's, taken from the results (this call's or an earlier one's)."""

    def measure(cap: float) -> dict | None:
        got = s.train(name, [*llama_1b(s, compiled), *extra], cap)
        if got is None:
            return None
        if name in NAMED:
            out = {
                f"mfu_{name}": got["mfu"],
                f"tokens_per_s_{name}": got["tokens_per_s"],
                f"vs_plan_{name}": got["vs_plan"],
            }
            if "peak" in got:
                out[f"peak_{name}"] = got["peak"]
            if compiled:
                out["attention_kernel"] = got["attention_kernel"]
            return out
        out = {f"{name}_{k}": v for k, v in got.items()}
        if against is not None and s.results.data.get(f"tokens_per_s_{against[0]}"):
            ratio = got["tokens_per_s"] / s.results.data[f"tokens_per_s_{against[0]}"]
            out[f"{name}_over_{against[1]}_tokens_per_s"] = ratio
        return out

    done = f"tokens_per_s_{name}" if name in NAMED else f"{name}_tokens_per_s"
    return Job(name, done, measure, kind=name if name in EXPECTED else "llama_1b_eager")


def gpt2_jobs(s: Session, nanogpt: Path | None, rounds: int) -> list[Job]:
    """Ours and nanoGPT's in alternation (A B A B ...: a machine that slows down slows both); each figure the
    median of the rounds so far, their ratio once both are in."""
    ours, theirs = gpt2_pair(s)
    speeds: dict[str, list[float]] = {"gpt2": [], "nanogpt": []}

    def side(who: str, name: str) -> Callable[[float], dict | None]:
        def measure(cap: float) -> dict | None:
            if who == "gpt2":
                got = s.train(name, ours, cap)
                speed = got and got["tokens_per_s"]
            else:
                assert nanogpt is not None and s.data is not None
                speed = nanogpt_run(nanogpt, s.work, s.data, theirs, cap, s.runs / name / "train.log")
            if not speed:
                return None
            speeds[who].append(speed)
            figures = {f"{k}_tokens_per_s": statistics.median(v) for k, v in speeds.items() if v}
            figures[f"{name}_tokens_per_s"] = speed
            both = {k: figures.get(k, s.results.data.get(k)) for k in ("gpt2_tokens_per_s", "nanogpt_tokens_per_s")}
            if all(both.values()):
                figures["gpt2_vs_nanogpt"] = both["gpt2_tokens_per_s"] / both["nanogpt_tokens_per_s"]
            return figures

        return measure

    sides = ["gpt2", "nanogpt"] if nanogpt is not None else ["gpt2"]
    names = [(who, who if i == 0 else f"{who}_{i}") for i in range(rounds) for who in sides]
    return [Job(name, f"{name}_tokens_per_s", side(who, name), kind=who) for who, name in names]


def moe_job(s: Session) -> Job:
    def measure(cap: float) -> dict | None:
        got = s.train("moe", moe(s), cap)
        return None if got is None else {f"moe_{k}": v for k, v in got.items()}

    return Job("moe", "moe_tokens_per_s", measure)


def fp8_overrides(s: Session) -> tuple[str, ...]:
    return ("train.precision=fp8", "train.fp8_min_features=16") if s.dry else ("train.precision=fp8",)


def first(s: Session, nanogpt: Path | None, skip: set[str]) -> None:
    """The 15-minute window's command: every headline figure, most wanted first (the module docstring)."""
    s.prepare(64 if s.dry else 2048)
    jobs = [llama_job(s, "llama_1b", compiled=True), *gpt2_jobs(s, nanogpt, rounds=1)]
    jobs.append(llama_job(s, "llama_1b_eager", compiled=False))
    masking = ("train.document_masking=true",)
    jobs.append(llama_job(s, "masked", compiled=True, extra=masking, against=("llama_1b", "unmasked")))
    if "fp8" not in skip:
        jobs.append(llama_job(s, "fp8", compiled=True, extra=fp8_overrides(s), against=("llama_1b", "bf16")))
    jobs.append(moe_job(s))
    # The default bf16 residual stream of a compiled CUDA run (train.half_residual null) against the fp32 one:
    # the speed-up that made it the default, last, where the budget leaves room (else the next window's)
    fp32_stream = ("train.half_residual=false",)
    jobs.append(llama_job(s, "llama_1b_fp32_residual", True, fp32_stream, against=("llama_1b", "bf16_residual")))
    s.run_jobs(jobs)


# --- later windows -------------------------------------------------------------------------------------------


def targets(s: Session, nanogpt: Path | None) -> None:
    """A second GPT-2 / nanoGPT round (A B A B with the first's), and the eager 1B with each speed switch on
    against it off."""
    s.prepare(64 if s.dry else 2048)
    jobs = [llama_job(s, "llama_1b", compiled=True), *gpt2_jobs(s, nanogpt, rounds=2)]
    jobs.append(llama_job(s, "llama_1b_eager", compiled=False))
    for switch in ("cache_weight_casts", "half_residual"):
        on = (f"train.{switch}=true",)
        jobs.append(llama_job(s, f"llama_1b_{switch}", False, on, against=("llama_1b_eager", "eager")))
    s.run_jobs(jobs)


def features(s: Session) -> None:
    """fp8 with tensor and sequence parallelism over 2 GPUs, its collectives in bf16 (debug.fp8_check keeps
    them bf16) and in float8 (torchao's Float8ColwiseParallel / Float8RowwiseParallel): on a machine with 2 GPUs
    or more (one GPU says it cannot); a dry run splits over 2 CPU ranks (gloo: bf16)."""
    import torch

    gpus = torch.cuda.device_count()
    if not s.dry and gpus < 2:
        print(f"fp8 with tensor parallelism: needs 2 GPUs, this machine has {gpus}: not run", flush=True)
        return
    s.prepare(64 if s.dry else 2048, ranks=2)
    tensor = [*llama_1b(s, True), *fp8_overrides(s), "parallel.gpus=2", "parallel.tensor=2"]
    tensor.append("parallel.sequence_parallel=true")

    def pair(name: str, extra: list[str]) -> Job:
        def measure(cap: float) -> dict | None:
            got = s.train(name, [*tensor, *extra], cap, nproc=2)
            if got is None:
                return None
            out = {f"{name}_{k}": v for k, v in got.items()}
            base = s.results.data.get("fp8_tp_bf16_tokens_per_s")
            if name == "fp8_tp" and base:
                out["fp8_tp_over_fp8_tp_bf16_tokens_per_s"] = got["tokens_per_s"] / base
            return out

        return Job(name, f"{name}_tokens_per_s", measure, kind="fp8_tp")

    s.run_jobs([pair("fp8_tp_bf16", ["debug.fp8_check=1"]), pair("fp8_tp", [])])


# --- the memory matrix ---------------------------------------------------------------------------------------


def memory_cells(dry: bool) -> list[dict]:
    """Every cell, {"overrides": {...}, "compiled": bool}, in the order they run: first the 20 that decide the
    plan's terms (one window's command), then the rest of the grid, eager ones first, for later windows.

    Deciding: each recomputation mode at micro-batch 1 and 8 (a term's fixed part and its part per sequence),
    eager and compiled; each other precision (its bytes per element; compiled: fp32's); accumulation 4 (the
    gradients held across micro-batches); the smaller vocabulary (the loss's terms); all against bf16-mixed, no
    recomputation, micro-batch 4, accumulation 1, the larger vocabulary, eager and compiled."""
    big, small = (512, 256) if dry else (128256, 32000)
    base = {
        "train.precision": "bf16-mixed",
        "train.activation_checkpointing": "none",
        "train.micro_batch_size": 4,
        "train.grad_accum_steps": 1,
        "model.vocab_size": big,
    }

    def cell(compiled: bool, **changes) -> dict:
        return {"overrides": {**base, **{k.replace("__", "."): v for k, v in changes.items()}}, "compiled": compiled}

    deciding = [cell(False)]
    for compiled in (False, True):
        for recompute, batch in itertools.product(("none", "selective", "full"), (1, 8)):
            deciding.append(cell(compiled, train__activation_checkpointing=recompute, train__micro_batch_size=batch))
        if not compiled:
            deciding += [cell(False, train__precision=p) for p in ("bf16", "fp16-mixed", "fp32")]
            deciding += [cell(False, train__grad_accum_steps=4), cell(False, model__vocab_size=small)]
    deciding += [cell(True), cell(True, train__precision="fp32")]
    grid = {
        "train.precision": ["bf16-mixed", "bf16", "fp16-mixed", "fp32"],
        "train.activation_checkpointing": ["none", "selective", "full"],
        "train.micro_batch_size": [1, 4, 8],
        "train.grad_accum_steps": [1, 4],
    }
    rest = [
        {"overrides": {**dict(zip(grid, values)), "model.vocab_size": vocab}, "compiled": compiled}
        for compiled in (False, True)
        for vocab in (big, small)
        for values in itertools.product(*grid.values())
    ]
    return deciding + [c for c in rest if c not in deciding]


def memory(s: Session, cells: int | None) -> None:
    """Planned peak against torch.cuda.max_memory_allocated (a CPU: the tensors counted), cell by cell."""
    model = (
        ["model.preset=debug", "train.seq_len=32", "hardware.peak_tflops=0.1"]
        if s.dry
        else ["model.preset=llama3.2-1b", "model.num_layers=4", "train.seq_len=2048", "hardware.peak_tflops=989.4"]
    )
    results = s.results
    rows = list(results.data.get("memory_matrix", []))
    missed = list(results.data.get("memory_not_measured", []))
    done = [(x["overrides"], x["compiled"]) for x in rows + missed]
    todo = [c for c in memory_cells(s.dry) if (c["overrides"], c["compiled"]) not in done]
    print(f"memory: {len(done)} cells already in the results, {len(todo)} to go", flush=True)
    for i, cell in enumerate(todo[:cells]):
        expected = EXPECTED["memory_cell_compiled" if cell["compiled"] else "memory_cell"][s.dry]
        if not s.budget.allows("a memory cell", expected):
            print(f"memory: {len(todo) - i} cells to go: call again with --from this file", flush=True)
            return
        settings = [*model, f"train.compile={str(cell['compiled']).lower()}", f"train.device={s.device}"]
        settings += [f"{k}={v}" for k, v in cell["overrides"].items()]
        row = memory_cell(s, settings, cell, s.cap(expected))
        if "measured_bytes" in row:
            rows.append(row)
            results.put(shown=row, memory_matrix=rows)
        else:
            missed.append(row)
            results.put(shown=row, memory_not_measured=missed)


def memory_cell(s: Session, settings: list[str], cell: dict, cap: float) -> dict:
    """One cell's row: planned and measured bytes, or the status that kept it from measuring."""
    out = s.work / "cell"
    ok = run(
        [PY, "-m", "pretrain", "sweep", *settings, "--steps", "1", "--out", out], cap, s.runs / "cell.log", env=ENV
    )
    swept = json.loads((out / "sweep.json").read_text())["cells"][0] if ok else {"status": "failed or timed out"}
    (out / "sweep.json").unlink(missing_ok=True)
    if swept.get("memory_measured_bytes") is None:
        return {**cell, "status": swept["status"], "error": swept.get("error") or tail(s.runs / "cell.log", 400)}
    planned = swept["memory_planned_bytes"]  # the eager plan, on the device's basis (sweep.planned_memory)
    if cell["compiled"] and not s.dry:
        plan = subprocess.run(
            [PY, "-m", "pretrain", "plan", *settings, "--json"], capture_output=True, text=True, env=ENV
        )
        mem = json.loads(plan.stdout)["memory_bytes"] if plan.returncode == 0 else {}
        if isinstance(mem.get("compiled"), (int, float)):
            planned = mem["compiled"] - mem["cuda_context"]
    return {**cell, "planned_bytes": planned, "measured_bytes": swept["memory_measured_bytes"]}


# --- the command ---------------------------------------------------------------------------------------------


def nanogpt_dir(given: Path | None, skip: set[str]) -> Path | None:
    """--nanogpt, else the first of NANOGPT_DIRS that holds nanoGPT's files; None under --skip nanogpt. Missing
    otherwise: refused before anything runs (a window's figure must not go silently missing)."""
    if "nanogpt" in skip:
        return None
    for d in [given] if given else NANOGPT_DIRS:
        if all((d / name).is_file() for name in NANOGPT_FILES):
            return d
    where = given or " or ".join(map(str, NANOGPT_DIRS))
    fail(
        f"nanoGPT's {' / '.join(NANOGPT_FILES)} are not in {where}; run `bash benchmarks/gpu_session.sh prepare` "
        "where ../shared is and carry benchmarks/peers, or add --skip nanogpt"
    )


def check_torchao(skip: set[str]) -> None:
    """fp8 needs torchao: refused before anything runs where it is missing, unless --skip fp8."""
    if "fp8" in skip or os.environ.get("GPU_SESSION_TORCHAO") == "found":  # gpu_session.sh probed it already
        return
    probe = subprocess.run([PY, "-c", "import torchao.float8"], capture_output=True, env=ENV)
    if probe.returncode != 0:
        fail(
            "torchao is not importable here (the fp8 run needs it); carry its wheel in benchmarks/peers/wheels "
            "(`bash benchmarks/gpu_session.sh prepare`), or add --skip fp8"
        )


def device_facts() -> dict:
    import torch

    facts = {"gpu": "cpu", "torch": torch.__version__}
    if torch.cuda.is_available():
        props = torch.cuda.get_device_properties(0)
        facts.update(
            gpu=torch.cuda.get_device_name(),
            cuda=torch.version.cuda,
            capability=f"{props.major}.{props.minor}",
            memory_bytes=props.total_memory,
            gpus=torch.cuda.device_count(),
        )
    return facts


def arguments() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("part", choices=("first", "memory", "targets", "features"))
    parser.add_argument("--out", type=Path, help="results directory (default $OUT, else gpu-results/)")
    parser.add_argument("--from", dest="earlier", type=Path, metavar="FILE", help="an earlier call's results JSON")
    parser.add_argument("--work", type=Path, default=Path(tempfile.gettempdir()) / "pretrain-gpu")
    parser.add_argument("--data", type=Path, metavar="DIR", help="a prepared data directory (default: made here)")
    parser.add_argument("--dry-run", action="store_true", help="tiny shapes on the CPU: checks the code path")
    parser.add_argument("--budget", type=float, metavar="SECONDS", help="start nothing past SECONDS; cap every run")
    parser.add_argument(
        "--nanogpt", type=Path, metavar="DIR", help="nanoGPT's files (default benchmarks/peers/nanoGPT)"
    )
    parser.add_argument("--skip", default="", metavar="LIST", help=f"comma list of {', '.join(SKIPPABLE)}")
    parser.add_argument("--cells", type=int, metavar="N", help="memory: run at most N cells not yet in the file")
    args = parser.parse_args()
    args.skip = {x for x in args.skip.split(",") if x}
    if args.skip - set(SKIPPABLE):
        fail(f"--skip {','.join(sorted(args.skip - set(SKIPPABLE)))}: give a comma list of {', '.join(SKIPPABLE)}")
    if args.budget is not None and not args.budget > 0:
        fail(f"--budget {args.budget:g}: give a positive number of seconds")
    if args.cells is not None and args.cells < 1:
        fail(f"--cells {args.cells}: give at least 1")
    if args.earlier is not None and not args.earlier.is_file():
        fail(f"--from {args.earlier}: no such file; give the JSON an earlier call wrote")
    if args.data is not None and not (args.data / "meta.json").is_file():
        fail(f"--data {args.data}: no meta.json there; give a directory `pretrain prepare` wrote")
    return args


def main() -> None:
    args = arguments()
    budget = Budget(args.budget)
    nanogpt = nanogpt_dir(args.nanogpt, args.skip) if args.part in ("first", "targets") else None
    if args.part in ("first", "features"):
        check_torchao(args.skip)
    facts = device_facts()
    if facts["gpu"] == "cpu" and not args.dry_run:
        fail("no CUDA GPU here; use --dry-run to check the code path on a CPU")
    out = (args.out or Path(os.environ.get("OUT") or "gpu-results")).resolve()
    earlier = json.loads(args.earlier.read_text()) if args.earlier else None
    os.chdir(ROOT)
    results = Results(out / f"{args.part}.json", {**facts, "dry_run": args.dry_run}, budget, earlier)
    results.put(shown=facts)  # the machine, first: what ran where even if nothing else is measured
    session = Session(results, budget, args.work.resolve(), out / "runs", args.dry_run, args.data)
    args.work.mkdir(parents=True, exist_ok=True)
    if args.part == "first":
        first(session, nanogpt, args.skip)
    elif args.part == "targets":
        targets(session, nanogpt)
    elif args.part == "features":
        features(session)
    else:
        memory(session, args.cells)
    print(f"{args.part}: done in {budget.elapsed():.0f} s; results in {results.path}", flush=True)


if __name__ == "__main__":
    sys.exit(main())
