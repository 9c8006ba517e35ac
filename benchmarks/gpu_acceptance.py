"""The GPU targets, measured in one command, each figure written the moment it exists.

    python benchmarks/gpu_acceptance.py targets [--out FILE]   # < 10 min on one H100
    python benchmarks/gpu_acceptance.py memory  [--out FILE]   # the planned-vs-measured peak matrix
    python benchmarks/gpu_acceptance.py targets --dry-run      # the same code path, tiny shapes, on a CPU

targets: the Llama-3.2-1B shape at seq 2048, bf16-mixed, accumulation 4, compiled then eager (tokens/s, MFU
against 989.4 TFLOP/s, peak memory against the plan, the SDPA kernel that ran); then GPT-2 124M against
nanoGPT's own train.py (../shared/peers/nanoGPT, unmodified, MIT), same batch and sequence, in A B A B order.
memory: precision x recomputation x micro-batch x accumulation, eager and compiled, through `pretrain sweep`.

Results accumulate in benchmarks/results/<gpu>-<YYYY-MM-DD>.json (the contract: gpu, torch, mfu_llama_1b,
tokens_per_s_llama_1b, attention_kernel, gpt2_tokens_per_s, nanogpt_tokens_per_s, memory_matrix); a figure
not measured is absent, never zero. The file is rewritten atomically after every figure.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
NANOGPT = ROOT.parent / "shared" / "peers" / "nanoGPT"
PY = sys.executable
ENV = {**os.environ, "PYTHONPATH": str(ROOT / "src"), "PYTHONUNBUFFERED": "1", "HF_HUB_OFFLINE": "1"}


class Results:
    """The results file, rewritten (temp + rename) after every figure."""

    def __init__(self, path: Path, device: dict):
        self.path = path
        self.data = json.loads(path.read_text()) if path.exists() else {}
        self.data.update(device)

    def put(self, **figures) -> None:
        self.data.update(figures)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        tmp = self.path.with_suffix(".tmp")
        tmp.write_text(json.dumps(self.data, indent=1) + "\n")
        os.replace(tmp, self.path)
        print("recorded", json.dumps(figures)[:400], flush=True)


def device_facts() -> dict:
    import torch

    gpu = torch.cuda.get_device_name() if torch.cuda.is_available() else "cpu"
    return {"gpu": gpu, "torch": torch.__version__}


def pretrain(*args, timeout=400) -> subprocess.CompletedProcess:
    r = subprocess.run([PY, "-m", "pretrain", *map(str, args)], env=ENV, capture_output=True, text=True,
                       timeout=timeout)
    if r.returncode != 0:
        print(r.stdout[-2000:], r.stderr[-3000:], sep="\n", flush=True)
    return r


def prepare_data(work: Path, vocab: int) -> Path:
    """Python's bundled documentation as tokens (the step time does not depend on the text)."""
    data = work / f"data{vocab}"
    if (data / "meta.json").exists():
        return data
    subprocess.run([PY, "-c", f"from pretrain.data import write_sample_corpus; write_sample_corpus({str(work / 'corpus')!r})"],
                   env=ENV, check=True)
    pretrain("tokenizer", "train", "--input", work / "corpus", "--vocab-size", vocab, "--out", work / f"tok{vocab}")
    pretrain("prepare", "--input", work / "corpus", "--tokenizer", work / f"tok{vocab}", "--out", data,
             "--val-fraction", "0.05")
    return data


def train_run(name: str, work: Path, data: Path, overrides: list[str], steps: int) -> dict | None:
    """A short `pretrain train`; its plan_vs_run.json and the steady tokens/s of its metrics lines."""
    run = work / "runs" / name
    shutil.rmtree(run, ignore_errors=True)
    r = pretrain("train", *overrides, f"data.dir={data}", f"run.dir={run}", f"train.max_steps={steps}",
                 "run.log_every=2", "run.eval_every=0", "run.eval_batches=1", "run.checkpoint_every=0",
                 "run.progress=false", "stability.spike_detection=false")
    if r.returncode != 0:
        return None
    lines = [json.loads(x) for x in (run / "metrics.jsonl").read_text().splitlines()]
    steady = [x["tokens_per_s"] for x in lines if "loss" in x and x["step"] > steps // 2]
    report = json.loads((run / "plan_vs_run.json").read_text())
    rows = {row["name"]: row for row in report["rows"]}
    peak = rows.get("peak allocated", {})
    return {"tokens_per_s": statistics.median(steady), "mfu": statistics.median(
                [x["mfu"] for x in lines if "loss" in x and x["step"] > steps // 2]),
            "attention_kernel": report.get("attention_kernel"), "peak_measured_bytes": peak.get("measured"),
            "peak_planned_bytes": peak.get("planned"), "peak_error_pct": peak.get("error_pct")}


def nanogpt_run(work: Path, data: Path, args: list[str]) -> float | None:
    """nanoGPT's train.py as its README runs it, on the same tokens; tokens/s over its later iterations."""
    if not NANOGPT.is_dir():
        print(f"{NANOGPT} absent: nanoGPT comparison skipped", flush=True)
        return None
    home = work / "nanogpt"
    (home / "data" / "ours").mkdir(parents=True, exist_ok=True)
    for name in ("train.py", "model.py", "configurator.py"):
        shutil.copy(NANOGPT / name, home / name)
    for split in ("train", "val"):
        target = home / "data" / "ours" / f"{split}.bin"
        if not target.exists():
            os.symlink(data / f"{split}.bin", target)
    r = subprocess.run([PY, "train.py", "--dataset=ours", "--eval_interval=1000000", "--eval_iters=1",
                        "--log_interval=1", "--always_save_checkpoint=False", "--wandb_log=False", *args],
                       cwd=home, env={**os.environ, "PYTHONUNBUFFERED": "1"}, capture_output=True, text=True,
                       timeout=400)
    if r.returncode != 0:
        print(r.stdout[-2000:], r.stderr[-3000:], sep="\n", flush=True)
        return None
    times = [float(line.split("time ")[1].split("ms")[0]) for line in r.stdout.splitlines()
             if line.startswith("iter ") and "time " in line]
    tokens_per_iter = int(next(x.split("=")[1] for x in args if x.startswith("--batch_size"))) * int(
        next(x.split("=")[1] for x in args if x.startswith("--block_size"))) * int(
        next(x.split("=")[1] for x in args if x.startswith("--gradient_accumulation_steps")))
    later = times[len(times) // 2:]
    return tokens_per_iter / (statistics.median(later) / 1000)


def targets(results: Results, work: Path, dry: bool) -> None:
    device = "cpu" if dry else "cuda"
    # Llama-3.2-1B's shape, seq 2048, bf16-mixed, accumulation 4, one GPU.
    llama = ["configs/llama-1b.yaml", "parallel.gpus=1", "parallel.zero_stage=0", "train.grad_accum_steps=4",
             "train.micro_batch_size=8", "train.batch_ramp_tokens=0", f"train.device={device}"]
    if dry:
        llama += ["model.num_layers=2", "model.hidden_size=128", "model.intermediate_size=256", "model.num_heads=4",
                  "model.num_kv_heads=2", "model.vocab_size=8192", "train.seq_len=64", "train.micro_batch_size=2",
                  "train.precision=fp32", "hardware.peak_tflops=0.1"]
    data = prepare_data(work, 8192)
    steps = 6 if dry else 30
    for compiled in ("true", "false"):
        got = train_run(f"llama-1b-compile-{compiled}", work, data, llama + [f"train.compile={compiled}"], steps)
        if got is None:
            continue
        key = "llama_1b" if compiled == "true" else "llama_1b_eager"
        figures = {f"mfu_{key}": got["mfu"], f"tokens_per_s_{key}": got["tokens_per_s"]}
        if got["peak_measured_bytes"] is not None:  # GPU only: a figure not measured is absent
            figures[f"peak_{key}"] = {k: got[k] for k in ("peak_measured_bytes", "peak_planned_bytes",
                                                           "peak_error_pct")}
        if compiled == "true":
            figures["attention_kernel"] = got["attention_kernel"]
        results.put(**figures)
    # GPT-2 124M against nanoGPT: the same model (vocab padded to 50,304, no biases), batch, sequence and dtype.
    batch, seq, accum = (2, 64, 2) if dry else (12, 1024, 4)
    ours = ["configs/gpt2-124m.yaml", "model.pad_vocab_to=64", "model.bias=false", f"train.seq_len={seq}",
            f"train.micro_batch_size={batch}", f"train.grad_accum_steps={accum}", f"train.device={device}"]
    theirs = [f"--batch_size={batch}", f"--block_size={seq}", f"--gradient_accumulation_steps={accum}",
              f"--max_iters={steps}", f"--device={device}", f"--compile={not dry}",
              f"--dtype={'float32' if dry else 'bfloat16'}"]
    if dry:
        ours += ["model.num_layers=2", "model.hidden_size=64", "model.num_heads=2", "model.intermediate_size=256",
                 "train.precision=fp32", "train.compile=false", "hardware.peak_tflops=0.1"]
        theirs += ["--n_layer=2", "--n_embd=64", "--n_head=2"]
    speeds: dict[str, list[float]] = {"gpt2": [], "nanogpt": []}
    for round_ in range(2):  # A B A B: a machine that slows down slows both
        got = train_run(f"gpt2-{round_}", work, data, ours, steps)
        if got:
            speeds["gpt2"].append(got["tokens_per_s"])
        nano = nanogpt_run(work, data, theirs)
        if nano:
            speeds["nanogpt"].append(nano)
        figures = {f"{k}_tokens_per_s": statistics.median(v) for k, v in speeds.items() if v}
        if len(figures) == 2:
            figures["gpt2_vs_nanogpt"] = figures["gpt2_tokens_per_s"] / figures["nanogpt_tokens_per_s"]
        if figures:
            results.put(**figures)


def memory(results: Results, work: Path, dry: bool) -> None:
    """Planned peak vs torch.cuda.max_memory_allocated over the matrix, one sweep per vocabulary and compile."""
    model = (["model.preset=debug", "train.seq_len=32"] if dry else
             ["model.preset=llama3.2-1b", "model.num_layers=4", "train.seq_len=2048"])
    rows = list(results.data.get("memory_matrix", []))
    for vocab in ((512,) if dry else (32000, 128256)):
        for compiled in ("false", "true"):
            out = work / f"sweep-{vocab}-{compiled}"
            grid = ["train.precision=bf16-mixed,bf16,fp16-mixed,fp32", "train.activation_checkpointing=none,selective,full",
                    "train.micro_batch_size=1,4,8", "train.grad_accum_steps=1,4"]
            r = pretrain("sweep", *model, f"model.vocab_size={vocab}", f"train.compile={compiled}",
                         f"train.device={'cpu' if dry else 'cuda'}", *grid, "--json", "--out", out, timeout=1800)
            if r.returncode != 0:
                continue
            for cell in json.loads(r.stdout)["cells"]:
                if cell["memory_measured_bytes"] is None:
                    continue
                rows.append({"overrides": {**cell["values"], "model.vocab_size": vocab},
                             "planned_bytes": cell["memory_planned_bytes"], "measured_bytes": cell["memory_measured_bytes"],
                             "compiled": compiled == "true"})
            results.put(memory_matrix=rows)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("part", choices=("targets", "memory"))
    parser.add_argument("--out", type=Path, help="results file (default benchmarks/results/<gpu>-<date>.json)")
    parser.add_argument("--work", type=Path, default=Path(tempfile.gettempdir()) / "pretrain-gpu")
    parser.add_argument("--dry-run", action="store_true", help="tiny shapes on the CPU: checks the code path")
    args = parser.parse_args()
    facts = device_facts()
    if facts["gpu"] == "cpu" and not args.dry_run:
        sys.exit("gpu_acceptance: no CUDA GPU here; use --dry-run to check the code path on a CPU")
    name = facts["gpu"].lower().replace("nvidia ", "").replace(" ", "-")
    out = args.out or ROOT / "benchmarks" / "results" / f"{name}-{datetime.date.today():%Y-%m-%d}.json"
    args.work.mkdir(parents=True, exist_ok=True)
    os.chdir(ROOT)
    {"targets": targets, "memory": memory}[args.part](Results(out, facts), args.work, args.dry_run)


if __name__ == "__main__":
    main()
