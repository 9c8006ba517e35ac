"""The GPU targets, measured within a time budget, each figure written the moment it exists.

    python benchmarks/gpu_acceptance.py targets [--budget S] [--nanogpt DIR]   # one 10-minute command, H100
    python benchmarks/gpu_acceptance.py memory  [--budget S] [--cells N]       # resumable: call it again
    python benchmarks/gpu_acceptance.py features [--budget S]                 # fp8, document masking, MoE
    python benchmarks/gpu_acceptance.py targets --dry-run                      # the same code, tiny, on a CPU

targets, most wanted first: the Llama-3.2-1B shape at seq 2048, bf16-mixed, accumulation 4, compiled (tokens/s,
MFU against 989.4 TFLOP/s, the SDPA kernel that ran, peak memory against the plan's eager and compiled
figures); GPT-2 124M against nanoGPT's own train.py (unmodified, MIT; `--nanogpt`, default benchmarks/peers/
nanoGPT, which `gpu_session.sh prepare` fills), same model, batch, sequence and dtype; the 1B shape eager; the
1B eager with each speed switch on, train.cache_weight_casts then train.half_residual (tokens/s, MFU, peak, and
`cache_weight_casts_speedup` / `half_residual_speedup` over the eager run without it); then a second GPT-2 /
nanoGPT round (A B A B: a machine that slows down slows both). A run starts only if its estimated time fits in
what is left of --budget, and is stopped when the budget ends. `targets` resumes: a 1B run already in today's
results file is not run again, so a second call (the GPT-2 round and the 1B runs the first call's budget left
out, e.g. the speed switches when the runs take their estimated times) completes the figures.
memory: precision x recomputation x micro-batch x accumulation x vocabulary, eager then compiled, one `pretrain
sweep` process per cell (a fresh torch.compile cache each: one process for all of them would run the later
"compiled" cells eager once dynamo's recompile limit is reached). Each cell's row is written as it finishes;
a cell already in the results file is not run again, so later calls carry on where the last one stopped.

features: this round's training features against their baseline on the same shape, each pair run back to back:
the Llama-3.2-1B shape compiled in bf16-mixed and in fp8 (torchao tensorwise: the speed-up the planner models,
both MFUs), on a machine with 2 GPUs or more the same fp8 run with tensor and sequence parallelism over 2 of
them with bf16 and then float8 collectives (torchao's float8 all-gather; on one GPU it says it cannot), with
train.document_masking off and on (FlexAttention's document mask: its cost against plain causal
SDPA), and a small Qwen3-MoE-like model (64 experts, top 8) eager, the grouped GEMM's tokens/s and MFU on active
parameters. fp8 needs torchao on the GPU machine; a run that fails is recorded as not measured.

Results: benchmarks/results/<gpu>-<YYYY-MM-DD>.json (--out to choose; a dry run writes WORK/dry-run.json),
rewritten atomically after every figure: gpu, torch, mfu_llama_1b, tokens_per_s_llama_1b, attention_kernel,
gpt2_tokens_per_s, nanogpt_tokens_per_s, memory_matrix ([{"overrides", "planned_bytes", "measured_bytes",
"compiled"}]), and beside them the eager run's figures, the peaks, the seconds each run took and the memory
cells that measured nothing. A figure not measured is absent, never zero.
"""

from __future__ import annotations

import argparse
import datetime
import itertools
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
NANOGPT_DIRS = (ROOT / "benchmarks" / "peers" / "nanoGPT", ROOT.parent / "shared" / "peers" / "nanoGPT")
NANOGPT_FILES = ("train.py", "model.py", "configurator.py")
PY = sys.executable
# Prepended: packages installed beside the system's (a GPU image's extra site directory) stay importable.
ENV = {
    **os.environ,
    "PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT / "src"), os.environ.get("PYTHONPATH")])),
    "PYTHONUNBUFFERED": "1",
    "HF_HUB_OFFLINE": "1",
}
# Seconds a run is expected to take on one H100 (compile included) and on the 2-core CPU with --dry-run: a run
# starts only if this much of the budget is left. Rewrite them from the results' "seconds" after a session.
EXPECTED = {
    "llama_1b": (150, 120),
    "llama_1b_eager": (90, 30),
    "gpt2": (70, 25),
    "nanogpt": (80, 25),
    "memory_cell": (60, 12),
    "memory_cell_compiled": (120, 60),
    "feature": (150, 40),
}
CELL_LIMIT = 300  # a memory cell still running after this long is recorded as timed out, not retried


class Budget:
    """The seconds left of --budget (None: no limit)."""

    def __init__(self, seconds: float | None):
        self.start = time.monotonic()
        self.end = None if seconds is None else self.start + seconds

    def left(self) -> float:
        return float("inf") if self.end is None else self.end - time.monotonic()

    def allows(self, what: str, dry: bool) -> bool:
        expected = EXPECTED[what][dry]
        if self.left() >= expected:
            return True
        print(f"budget: {self.left():.0f} s left, {what} expects {expected} s: not started", flush=True)
        return False

    def elapsed(self) -> float:
        return time.monotonic() - self.start


class Results:
    """The results file, rewritten (temp + rename) after every figure."""

    def __init__(self, path: Path, device: dict, budget: Budget):
        self.path, self.budget = path, budget
        self.data = json.loads(path.read_text()) if path.exists() else {}
        self.data.update(device)

    def put(self, timing: tuple[str, float] | None = None, shown=None, **figures) -> None:
        """Record `figures`, and `timing` (what ran, its seconds) in the "seconds" table; print `shown` (default
        the figures)."""
        if timing is not None:
            figures["seconds"] = {**self.data.get("seconds", {}), timing[0]: round(timing[1], 1)}
        self.data.update(figures)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        tmp = self.path.with_name(self.path.name + ".tmp")
        tmp.write_text(json.dumps(self.data, indent=1) + "\n")
        os.replace(tmp, self.path)
        print(f"recorded at {self.budget.elapsed():.0f} s:", json.dumps(shown or figures)[:400], flush=True)


def fail(message: str):
    """A fault the caller can fix: one line on stderr, exit 2."""
    print(f"gpu_acceptance: {message}", file=sys.stderr)
    sys.exit(2)


def device_facts() -> dict:
    import torch

    gpu = torch.cuda.get_device_name() if torch.cuda.is_available() else "cpu"
    return {"gpu": gpu, "torch": torch.__version__}


def run(cmd: list, timeout: float, **kw) -> subprocess.CompletedProcess | None:
    """A subprocess; None (and its last output) when it fails or outlives `timeout`."""
    try:
        limit = None if timeout == float("inf") else max(timeout, 1)  # no --budget: no limit
        r = subprocess.run([str(x) for x in cmd], capture_output=True, text=True, timeout=limit, **kw)
    except subprocess.TimeoutExpired as e:
        print(f"stopped after {timeout:.0f} s: {' '.join(map(str, cmd[:6]))} ...", flush=True)
        print((e.stderr or b"")[-2000:].decode(errors="replace") if isinstance(e.stderr, bytes) else e.stderr or "")
        return None
    if r.returncode != 0:
        print(
            f"exit {r.returncode}: {' '.join(map(str, cmd[:6]))} ...",
            r.stdout[-2000:],
            r.stderr[-3000:],
            sep="\n",
            flush=True,
        )
        return None
    return r


def pretrain(*args, timeout: float) -> subprocess.CompletedProcess | None:
    return run([PY, "-m", "pretrain", *args], timeout, env=ENV)


def prepare_data(work: Path, vocab: int) -> Path:
    """Python's bundled documentation as tokens (the step time does not depend on the text)."""
    data = work / f"data{vocab}"
    if (data / "meta.json").exists():
        return data
    corpus, tok = work / "corpus", work / f"tok{vocab}"
    ok = (
        run(
            [PY, "-c", f"from pretrain.data import write_sample_corpus; write_sample_corpus({str(corpus)!r})"],
            120,
            env=ENV,
        )
        and pretrain("tokenizer", "train", "--input", corpus, "--vocab-size", vocab, "--out", tok, timeout=120)
        and pretrain(
            "prepare", "--input", corpus, "--tokenizer", tok, "--out", data, "--val-fraction", "0.05", timeout=120
        )
    )
    if not ok:
        fail("preparing the sample data failed (above)")
    return data


def train_run(
    name: str, work: Path, data: Path, overrides: list[str], steps: int, timeout: float, nproc: int = 1
) -> dict | None:
    """A short `pretrain train` without checkpoints (under torchrun over `nproc` GPUs if more than one); the
    steady tokens/s and MFU of its metrics lines and the peak memory of its plan_vs_run.json, against the plan's
    eager and (when it models one) compiled peak."""
    out = work / "runs" / name
    shutil.rmtree(out, ignore_errors=True)
    torchrun = [PY, "-m", "torch.distributed.run", "--standalone", f"--nproc-per-node={nproc}", "-m", "pretrain"]
    r = run(
        [
            *(torchrun if nproc > 1 else [PY, "-m", "pretrain"]),
            "train",
            *overrides,
            f"data.dir={data}",
            f"run.dir={out}",
            f"train.max_steps={steps}",
            "run.log_every=2",
            "run.eval_every=0",
            "run.eval_batches=1",
            "run.checkpoint_every=0",
            "run.progress=false",
            "stability.spike_detection=false",
        ],
        timeout,
        env=ENV,
    )
    if r is None:
        return None
    lines = [json.loads(x) for x in (out / "metrics.jsonl").read_text().splitlines()]
    steady = [x for x in lines if "loss" in x and x["step"] > steps // 2]
    report = json.loads((out / "plan_vs_run.json").read_text())
    got = {
        "tokens_per_s": statistics.median(x["tokens_per_s"] for x in steady),
        "mfu": statistics.median(x["mfu"] for x in steady),
        "attention_kernel": report.get("attention_kernel"),
    }
    if "tensor_parallel" in report.get("fp8", {}):  # what fp8's tensor-parallel collectives carried
        got["tensor_parallel"] = report["fp8"]["tensor_parallel"]
    peak = {row["name"]: row for row in report["rows"]}.get("peak allocated")
    if peak is not None:  # a GPU's allocator peak; on a CPU it is not measured, so absent
        mem = report["plan"]["memory_bytes"]
        got["peak"] = {
            "measured_bytes": peak["measured"],
            "planned_eager_bytes": peak["planned"],
            "error_pct_vs_eager": peak["error_pct"],
        }
        if isinstance(mem.get("compiled"), (int, float)):  # the compiled step's peak, on the eager total's basis
            planned = mem["compiled"] - mem["cuda_context"]
            got["peak"].update(
                planned_compiled_bytes=planned, error_pct_vs_compiled=100.0 * (peak["measured"] - planned) / planned
            )
    return got


def nanogpt_run(nanogpt: Path, work: Path, data: Path, args: list[str], timeout: float) -> float | None:
    """nanoGPT's train.py as its README runs it, on the same tokens; tokens/s over its later iterations."""
    home = work / "nanogpt"
    (home / "data" / "ours").mkdir(parents=True, exist_ok=True)
    for name in NANOGPT_FILES:
        shutil.copy(nanogpt / name, home / name)
    for split in ("train", "val"):
        target = home / "data" / "ours" / f"{split}.bin"
        if not target.exists():
            os.symlink(data / f"{split}.bin", target)
    r = run(
        [
            PY,
            "train.py",
            "--dataset=ours",
            "--eval_interval=1000000",
            "--eval_iters=1",
            "--log_interval=1",
            "--always_save_checkpoint=False",
            "--wandb_log=False",
            *args,
        ],
        timeout,
        cwd=home,
        env={**os.environ, "PYTHONUNBUFFERED": "1"},
    )
    if r is None:
        return None
    times = [
        float(line.split("time ")[1].split("ms")[0])
        for line in r.stdout.splitlines()
        if line.startswith("iter ") and "time " in line
    ]
    flag = {x.split("=")[0]: int(x.split("=")[1]) for x in args if x.split("=")[1].isdigit()}
    tokens_per_iter = flag["--batch_size"] * flag["--block_size"] * flag["--gradient_accumulation_steps"]
    return tokens_per_iter / (statistics.median(times[len(times) // 2 :]) / 1000)


def targets(results: Results, work: Path, dry: bool, budget: Budget, nanogpt: Path | None) -> None:
    device, steps = ("cpu", 6) if dry else ("cuda", 20)
    # Llama-3.2-1B's shape, seq 2048, bf16-mixed, accumulation 4, one GPU.
    llama = [
        "configs/llama-1b.yaml",
        "parallel.gpus=1",
        "parallel.zero_stage=0",
        "train.grad_accum_steps=4",
        "train.micro_batch_size=8",
        "train.batch_ramp_tokens=0",
        f"train.device={device}",
    ]
    if dry:
        llama += [
            "model.num_layers=2",
            "model.hidden_size=128",
            "model.intermediate_size=256",
            "model.num_heads=4",
            "model.num_kv_heads=2",
            "model.vocab_size=8192",
            "train.seq_len=64",
            "train.micro_batch_size=2",
            "train.precision=fp32",
            "hardware.peak_tflops=0.1",
        ]
    # GPT-2 124M against nanoGPT: the same model (vocab padded to 50,304, no biases), batch, sequence and dtype.
    batch, seq, accum = (2, 64, 2) if dry else (12, 1024, 4)
    ours = [
        "configs/gpt2-124m.yaml",
        "model.pad_vocab_to=64",
        "model.bias=false",
        f"train.seq_len={seq}",
        f"train.micro_batch_size={batch}",
        f"train.grad_accum_steps={accum}",
        f"train.device={device}",
        f"train.compile={str(not dry).lower()}",
    ]
    theirs = [
        f"--batch_size={batch}",
        f"--block_size={seq}",
        f"--gradient_accumulation_steps={accum}",
        f"--max_iters={steps}",
        f"--device={device}",
        f"--compile={not dry}",
        f"--dtype={'float32' if dry else 'bfloat16'}",
    ]
    if dry:
        ours += [
            "model.num_layers=2",
            "model.hidden_size=64",
            "model.num_heads=2",
            "model.intermediate_size=256",
            "train.precision=fp32",
            "hardware.peak_tflops=0.1",
        ]
        theirs += ["--n_layer=2", "--n_embd=64", "--n_head=2"]
    data = prepare_data(work, 8192)
    speeds: dict[str, list[float]] = {"gpt2": [], "nanogpt": []}

    eager_speed: dict[str, float] = {}  # this call's eager 1B tokens/s, switch by switch ("" = none on)

    def llama_1b(key: str, compiled: bool, switch: str = "") -> None:
        """The 1B run `key`, compiled or eager; `switch`: eager with that train.* speed switch on, and its
        tokens/s over the eager run's without it (issue #31 item 11: a CPU shows no gain, a GPU answers)."""
        if f"tokens_per_s_{key}" in results.data:  # measured by an earlier call today: `targets` resumes
            print(f"{key}: recorded by an earlier call, not run again", flush=True)
            return
        if not budget.allows("llama_1b" if compiled else "llama_1b_eager", dry):
            return
        started = time.monotonic()
        overrides = llama + [f"train.compile={str(compiled).lower()}"]
        if dry and not compiled:  # the switches act under autocast only
            overrides.append("train.precision=bf16-mixed")
        if switch:
            overrides.append(f"train.{switch}=true")
        got = train_run(key, work, data, overrides, steps, budget.left())
        figures = {}
        if got is not None:
            figures = {f"mfu_{key}": got["mfu"], f"tokens_per_s_{key}": got["tokens_per_s"]}
            if "peak" in got:
                figures[f"peak_{key}"] = got["peak"]
            if compiled:
                figures["attention_kernel"] = got["attention_kernel"]
            else:
                eager_speed[switch] = got["tokens_per_s"]
            baseline = eager_speed.get("", results.data.get("tokens_per_s_llama_1b_eager"))
            if switch and baseline:
                figures[f"{switch}_speedup"] = got["tokens_per_s"] / baseline
        results.put((key, time.monotonic() - started), **figures)

    def gpt2_side(name: str, i: int) -> None:
        started = time.monotonic()
        if name == "gpt2":
            got = train_run(f"gpt2-{i}", work, data, ours, steps, budget.left())
            got = got and got["tokens_per_s"]
        else:
            got = nanogpt_run(nanogpt, work, data, theirs, budget.left())
        if got:
            speeds[name].append(got)
        figures = {f"{k}_tokens_per_s": statistics.median(v) for k, v in speeds.items() if v}
        if len(figures) == 2:
            figures["gpt2_vs_nanogpt"] = figures["gpt2_tokens_per_s"] / figures["nanogpt_tokens_per_s"]
        results.put((f"{name}-{i}", time.monotonic() - started), **figures)

    def gpt2_round(i: int) -> None:
        if budget.allows("gpt2", dry):
            gpt2_side("gpt2", i)
        if nanogpt is not None and budget.allows("nanogpt", dry):
            gpt2_side("nanogpt", i)

    llama_1b("llama_1b", compiled=True)
    gpt2_round(0)
    llama_1b("llama_1b_eager", compiled=False)
    # Eager: a compiled block casts its weights inside its graph, so the cast cache acts on eager blocks only.
    llama_1b("llama_1b_cast_cache", compiled=False, switch="cache_weight_casts")
    llama_1b("llama_1b_half_residual", compiled=False, switch="half_residual")
    gpt2_round(1)


def memory_cells(dry: bool) -> list[dict]:
    """Every cell, eager ones first: {"overrides": {...}, "compiled": bool}."""
    grid = {
        "train.precision": ["bf16-mixed", "bf16", "fp16-mixed", "fp32"],
        "train.activation_checkpointing": ["none", "selective", "full"],
        "train.micro_batch_size": [1, 4, 8],
        "train.grad_accum_steps": [1, 4],
    }
    vocabs = (512,) if dry else (32000, 128256)
    return [
        {"overrides": {**dict(zip(grid, values)), "model.vocab_size": vocab}, "compiled": compiled}
        for compiled in (False, True)
        for vocab in vocabs
        for values in itertools.product(*grid.values())
    ]


def memory(results: Results, work: Path, dry: bool, budget: Budget, cells: int | None) -> None:
    """Planned peak against torch.cuda.max_memory_allocated (a CPU: the tensors counted), cell by cell."""
    # A given peak: MFU is not what these cells are for, and no cell measures one.
    model = (
        ["model.preset=debug", "train.seq_len=32", "hardware.peak_tflops=0.1"]
        if dry
        else ["model.preset=llama3.2-1b", "model.num_layers=4", "train.seq_len=2048", "hardware.peak_tflops=989.4"]
    )
    device = "cpu" if dry else "cuda"
    rows = list(results.data.get("memory_matrix", []))
    missed = list(results.data.get("memory_not_measured", []))
    done = [(x["overrides"], x["compiled"]) for x in rows + missed]
    todo = [c for c in memory_cells(dry) if (c["overrides"], c["compiled"]) not in done]
    print(f"memory: {len(done)} cells already in {results.path}, {len(todo)} to go", flush=True)
    for i, cell in enumerate(todo[:cells]):
        kind = "memory_cell_compiled" if cell["compiled"] else "memory_cell"
        if not budget.allows(kind, dry):
            print(f"memory: {len(todo) - i} cells to go: call again", flush=True)
            return
        limit = min(CELL_LIMIT, budget.left())
        settings = [
            *model,
            f"train.compile={str(cell['compiled']).lower()}",
            f"train.device={device}",
            *(f"{k}={v}" for k, v in cell["overrides"].items()),
        ]
        r = pretrain("sweep", *settings, "--steps", "1", "--json", "--out", work / "cell", timeout=limit)
        if r is None and limit < CELL_LIMIT:  # stopped by the budget: the cell is run again next time
            print(f"memory: {len(todo) - i} cells to go: call again", flush=True)
            return
        swept = json.loads(r.stdout)["cells"][0] if r is not None else {"status": "failed or timed out"}
        if swept.get("memory_measured_bytes") is None:
            missed.append({**cell, "status": swept["status"], "error": swept.get("error")})
            results.put(shown=missed[-1], memory_not_measured=missed)
            continue
        planned = swept["memory_planned_bytes"]  # the eager plan, on the device's basis (sweep.planned_memory)
        if cell["compiled"] and not dry:
            plan = pretrain("plan", *settings, "--json", timeout=60)
            mem = json.loads(plan.stdout)["memory_bytes"] if plan is not None else {}
            if isinstance(mem.get("compiled"), (int, float)):
                planned = mem["compiled"] - mem["cuda_context"]
        rows.append({**cell, "planned_bytes": planned, "measured_bytes": swept["memory_measured_bytes"]})
        results.put(shown=rows[-1], memory_matrix=rows)


def features(results: Results, work: Path, dry: bool, budget: Budget) -> None:
    """Each feature beside its baseline on one shape: (figure name, overrides) pairs, run in this order, each
    recorded as it finishes; a ratio once both sides of a pair are in."""
    device, steps = ("cpu", 6) if dry else ("cuda", 20)
    llama = [
        "configs/llama-1b.yaml",
        "parallel.gpus=1",
        "parallel.zero_stage=0",
        "train.grad_accum_steps=4",
        "train.micro_batch_size=8",
        "train.batch_ramp_tokens=0",
        f"train.device={device}",
        "hardware.gpu=h100-sxm",
    ]
    moe = [
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
        f"train.device={device}",
        "hardware.gpu=h100-sxm",
    ]
    if dry:
        tiny = [
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
        llama += tiny
        moe += [*tiny, "model.moe_intermediate_size=64", "model.num_experts=8", "model.experts_per_token=2"]
    compiled = f"train.compile={str(not dry).lower()}"
    fp8 = [*llama, compiled, "train.precision=fp8", "train.fp8_min_features=16" if dry else ""]
    runs = [
        ("bf16", [*llama, compiled, "train.precision=bf16-mixed"]),
        ("fp8", fp8),
        *fp8_tensor_parallel(fp8, dry),
        ("unmasked", [*llama, compiled, "train.precision=bf16-mixed"]),
        ("masked", [*llama, compiled, "train.precision=bf16-mixed", "train.document_masking=true"]),
        ("moe", [*moe, "train.compile=false"]),
    ]
    data = prepare_data(work, 8192)
    got: dict[str, dict] = {}
    for name, overrides in runs:
        if not budget.allows("feature", dry):
            return
        started = time.monotonic()
        gpus = 2 if name.startswith("fp8_tp") else 1
        figures = train_run(f"feature-{name}", work, data, [x for x in overrides if x], steps, budget.left(), gpus)
        if figures is None:
            results.put((f"feature-{name}", time.monotonic() - started), shown={name: "not measured"})
            continue
        got[name] = figures
        shown = {f"{name}_{k}": v for k, v in figures.items() if k != "peak"}
        for new, base in (("fp8", "bf16"), ("fp8_tp", "fp8_tp_bf16"), ("masked", "unmasked")):
            if name == new and base in got:
                shown[f"{new}_over_{base}_tokens_per_s"] = figures["tokens_per_s"] / got[base]["tokens_per_s"]
        results.put((f"feature-{name}", time.monotonic() - started), **shown)


def fp8_tensor_parallel(fp8: list[str], dry: bool) -> list[tuple[str, list[str]]]:
    """fp8 with tensor and sequence parallelism over 2 GPUs, its collectives in bf16 (debug.fp8_check keeps them
    bf16: its shadow needs the linears' inputs before the float8 cast; it runs after step 1 only, outside the
    steady steps measured) and in float8 (torchao's Float8ColwiseParallel / Float8RowwiseParallel, the default
    on CUDA). None on a machine with one GPU, which says so. A dry run splits over 2 CPU ranks (gloo: bf16)."""
    import torch

    gpus = torch.cuda.device_count()
    if not dry and gpus < 2:
        print(f"fp8 with tensor parallelism: needs 2 GPUs, this machine has {gpus}: not run", flush=True)
        return []
    tensor = [*fp8, "parallel.gpus=2", "parallel.tensor=2", "parallel.sequence_parallel=true"]
    return [("fp8_tp_bf16", [*tensor, "debug.fp8_check=1"]), ("fp8_tp", tensor)]


def nanogpt_dir(given: Path | None) -> Path | None:
    """--nanogpt, else the first of NANOGPT_DIRS that holds nanoGPT's files; None (skipped, said) if none does."""
    for d in [given] if given else NANOGPT_DIRS:
        if all((d / name).is_file() for name in NANOGPT_FILES):
            return d
        if given:
            fail(
                f"--nanogpt {given}: no {' / '.join(NANOGPT_FILES)} there; copy nanoGPT's files there with "
                "`bash benchmarks/gpu_session.sh prepare` (from ../shared/peers/nanoGPT)"
            )
    print(
        f"nanoGPT not found in {' or '.join(map(str, NANOGPT_DIRS))}: its runs are skipped "
        "(run `bash benchmarks/gpu_session.sh prepare` first)",
        flush=True,
    )
    return None


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("part", choices=("targets", "memory", "features"))
    parser.add_argument("--out", type=Path, help="results file (default benchmarks/results/<gpu>-<date>.json)")
    parser.add_argument("--work", type=Path, default=Path(tempfile.gettempdir()) / "pretrain-gpu")
    parser.add_argument("--dry-run", action="store_true", help="tiny shapes on the CPU: checks the code path")
    parser.add_argument(
        "--budget",
        type=float,
        metavar="SECONDS",
        help="start nothing that would not end within SECONDS; stop what runs when they end",
    )
    parser.add_argument(
        "--nanogpt",
        type=Path,
        metavar="DIR",
        help="nanoGPT's train.py, model.py, configurator.py "
        "(default benchmarks/peers/nanoGPT, else ../shared/peers/nanoGPT)",
    )
    parser.add_argument("--cells", type=int, metavar="N", help="memory: run at most N cells not yet in the file")
    args = parser.parse_args()
    if args.budget is not None and not args.budget > 0:
        fail(f"--budget {args.budget:g}: give a positive number of seconds")
    if args.cells is not None and args.cells < 1:
        fail(f"--cells {args.cells}: give at least 1")
    budget = Budget(args.budget)
    nanogpt = nanogpt_dir(args.nanogpt) if args.part == "targets" else None
    facts = device_facts()
    if facts["gpu"] == "cpu" and not args.dry_run:
        fail("no CUDA GPU here; use --dry-run to check the code path on a CPU")
    args.work.mkdir(parents=True, exist_ok=True)
    name = facts["gpu"].lower().replace("nvidia ", "").replace(" ", "-")
    out = args.out or (
        args.work / "dry-run.json"
        if args.dry_run
        else ROOT / "benchmarks" / "results" / f"{name}-{datetime.date.today():%Y-%m-%d}.json"
    )
    os.chdir(ROOT)
    results, work = Results(out.resolve(), facts, budget), args.work.resolve()
    results.put(shown=facts)  # the machine, first: what ran where even if nothing else is measured
    if args.part == "targets":
        targets(results, work, args.dry_run, budget, nanogpt)
    elif args.part == "features":
        features(results, work, args.dry_run, budget)
    else:
        memory(results, work, args.dry_run, budget, args.cells)
    print(f"{args.part}: done in {budget.elapsed():.0f} s; results in {out}", flush=True)


if __name__ == "__main__":
    main()
