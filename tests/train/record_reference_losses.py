"""Record the losses the trainer logs on the tests' tiny configs, to hold a refactor to them bitwise.

    python tests/train/record_reference_losses.py    # adds (or replaces) this machine's recording

Run it on the trainer before a change; `test_reference_losses.py` re-runs every case on the trainer after it
and asserts the same losses. Floating-point results depend on the machine's kernels as well as the code: ATen
picks its vector kernels by CPU capability (AVX-512, AVX2 or none, `ATEN_CPU_CAPABILITY`), and MKL and oneDNN
pick theirs by CPU model. So each recording names its machine (`fingerprint()`): where the machine running the
test matches one, the check is bit for bit; on any other machine with the same torch it is within
`ALLOWANCE`, measured across kernels (below). A new machine's own recording, made at the revision before a
change, gives it the bitwise guard back.
"""

from __future__ import annotations

import json
import os
import platform
import re
import subprocess
import sys
import tempfile
from pathlib import Path

HERE = Path(__file__).resolve().parent
FILE = HERE / "reference_losses.json"
sys.path.insert(0, str(HERE.parent))

# name -> (processes, overrides on top of the tiny config). The trainer's defaults as they were when the
# first recording was made; BEHAVIOUR selects what has changed since (the plain loss, FSDP gradients reduced
# once per step), so every recording holds the same behaviour.
CASES = {
    "llama_fp32": (1, []),
    "llama_selective": (1, ["train.activation_checkpointing=selective"]),
    "llama_full": (1, ["train.activation_checkpointing=full"]),
    "llama_bf16_mixed": (1, ["train.precision=bf16-mixed"]),
    "llama_bf16": (1, ["train.precision=bf16"]),
    "llama_mha_tied": (1, ["model.num_kv_heads=4", "model.tie_embeddings=true"]),
    "gpt2": (
        1,
        ["model.family=gpt2", "model.num_kv_heads=null", "model.intermediate_size=256", "model.max_seq_len=64"],
    ),
    "spike_rollback": (
        1,
        [
            "debug.inject_spike_batches=[15,16,17,18,19,20]",
            "stability.min_history=3",
            "stability.patience=2",
            "stability.window=8",
            "run.checkpoint_every=2",
        ],
    ),
    "ddp": (2, ["parallel.zero_stage=0"]),
    "zero1": (2, ["parallel.zero_stage=1"]),
    "zero3": (2, ["parallel.zero_stage=3"]),
}
BEHAVIOUR = ["train.loss=plain", "parallel.grad_sync=step"]

# Relative allowance per step's loss on a machine without a recording of its own, by the precision of the
# case's arithmetic. Measured on one AMD EPYC (Zen 4, torch 2.13.0) by recording every case under each of
# ATEN_CPU_CAPABILITY=avx512, avx2 and default: the fp32 cases drift apart by at most 1.7e-7 in 12 steps
# (one or two float32 ulps of a loss near 6), the bf16 ones by at most 7.3e-5 (bf16 rounds to 8 bits, so a
# different summation order moves a step's update by a bf16 ulp). The allowances are ~10x the worst drift
# seen: loose enough for another CPU's kernels, tight enough that a refactor's changed arithmetic (a term
# dropped, a scale moved, a different reduction) shows by the second step.
ALLOWANCE = {"fp32": 2e-6, "bf16": 5e-4}


def precision(name: str) -> str:
    return "bf16" if any(o.startswith("train.precision=bf16") for o in CASES[name][1]) else "fp32"


def fingerprint() -> dict[str, str]:
    """What decides the bits of a recording besides the code: torch, Python, the CPU and the vector kernels
    ATen runs on it. Threads are not in it: run_case runs every process with one OpenMP thread."""
    import torch

    cpuinfo = Path("/proc/cpuinfo")
    first: dict[str, str] = {}
    for line in cpuinfo.read_text().splitlines() if cpuinfo.exists() else []:
        key, _, value = (part.strip() for part in line.partition(":"))
        first.setdefault(key, value)
    flags = first.get("flags", "").split()
    return {
        "torch": torch.__version__,
        "python": platform.python_version(),
        "cpu": f"{platform.machine()} {first.get('vendor_id', '')} {first.get('model name', '')}".strip(),
        "cpu_flags": " ".join(f for f in ("avx2", "avx512f", "avx512_bf16", "avx512_fp16", "amx_bf16") if f in flags),
        "aten_capability": torch.backends.cpu.get_cpu_capability(),
    }


def reference(name: str) -> tuple[list[list], float] | None:
    """The recorded losses of a case (zero1's are DDP's: both build the same fused AdamW) and the relative
    allowance to compare them with: 0 (bitwise) where this machine made a recording, ALLOWANCE on another
    machine with the same torch and Python, None where none was made on this torch (nothing to compare)."""
    key = "ddp" if name == "zero1" else name
    here = fingerprint()
    recordings = json.loads(FILE.read_text())["recordings"]
    same_build = [r for r in recordings if (r["torch"], r["python"]) == (here["torch"], here["python"])]
    for r in same_build:
        if {k: r[k] for k in here} == here:
            return r["cases"][key], 0.0
    return (same_build[0]["cases"][key], ALLOWANCE[precision(name)]) if same_build else None


def assert_losses(got: list[list], want: list[list], rel: float) -> None:
    """Every step's loss equal to the recording's (rel 0: bit for bit) or within rel of it."""
    import pytest

    assert [step for step, _ in got] == [step for step, _ in want]
    for (step, loss), (_, expected) in zip(got, want):
        assert loss == pytest.approx(expected, rel=rel, abs=0), f"step {step}"


def run_case(name: str, data_dir: Path, root: Path, extra: list[str] = ()) -> list[list]:
    """[[step, loss], ...] of one case's metrics.jsonl (loss lines only)."""
    nproc, overrides = CASES[name]
    run_dir = root / name
    args = ["train", *tiny_config(data_dir, run_dir), *overrides, *extra]
    env = {**os.environ, "PYTHONUNBUFFERED": "1", "OMP_NUM_THREADS": "1"}
    if nproc == 1:
        cmd = [sys.executable, "-m", "pretrain", *args]
    else:
        cmd = [
            sys.executable,
            "-m",
            "torch.distributed.run",
            "--standalone",
            f"--nproc-per-node={nproc}",
            "-m",
            "pretrain",
            *args,
        ]
    r = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=600)
    if r.returncode != 0:
        raise RuntimeError(f"{name}: exit {r.returncode}\n{r.stderr[-3000:]}")
    rows = [json.loads(x) for x in (run_dir / "metrics.jsonl").read_text().splitlines()]
    return [[row["step"], row["loss"]] for row in rows if "loss" in row]


def tiny_config(data_dir, run_dir) -> list[str]:
    from support import tiny

    return tiny(data_dir, run_dir)


def prepare_data(root: Path) -> Path:
    from pretrain.data import prepare, train_tokenizer, write_sample_corpus

    corpus = write_sample_corpus(root / "corpus")
    train_tokenizer([str(corpus)], 512, root / "tokenizer")
    prepare([str(corpus)], str(root / "tokenizer"), root / "data", val_fraction=0.1, workers=1)
    return root / "data"


def main() -> None:
    here = fingerprint()
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        data = prepare_data(root)
        cases = {}
        for name in CASES:
            if name != "zero1":  # its losses are DDP's (reference())
                cases[name] = run_case(name, data, root, BEHAVIOUR)
                print(name, cases[name][-1], flush=True)
    recordings = json.loads(FILE.read_text())["recordings"] if FILE.exists() else []
    recordings = [r for r in recordings if {k: r[k] for k in here} != here] + [{**here, "cases": cases}]
    tmp_file = FILE.with_suffix(".json.tmp")
    text = json.dumps({"recordings": recordings}, indent=1)
    tmp_file.write_text(re.sub(r"\[\s+(\d+),\s+(\S+)\s+\]", r"[\1, \2]", text) + "\n")  # a step per line
    tmp_file.replace(FILE)


if __name__ == "__main__":
    main()
