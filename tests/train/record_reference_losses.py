"""Record the losses the trainer logs on the tests' tiny configs, to hold a refactor to them bitwise.

    python tests/train/record_reference_losses.py        # writes tests/train/reference_losses.json

Run once on the trainer before a change; `test_reference_losses.py` re-runs every case on the trainer after
it and asserts the same losses, bit for bit (same torch, same Python: the file records both).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))

# name -> (processes, overrides on top of the tiny config). The trainer's defaults as they were when the
# file was written, so that the test can add the keys that select the old behaviour where defaults changed.
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


def tiny_config(data_dir, run_dir) -> list[str]:
    from support import tiny

    return tiny(data_dir, run_dir)


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


def prepare_data(root: Path) -> Path:
    from pretrain.data import prepare, train_tokenizer, write_sample_corpus

    corpus = write_sample_corpus(root / "corpus")
    train_tokenizer([str(corpus)], 512, root / "tokenizer")
    prepare([str(corpus)], str(root / "tokenizer"), root / "data", val_fraction=0.1, workers=1)
    return root / "data"


def main() -> None:
    import platform

    import torch

    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        data = prepare_data(root)
        cases = {}
        for name in CASES:
            cases[name] = run_case(name, data, root)
            print(name, cases[name][-1], flush=True)
    out = {"torch": torch.__version__, "python": platform.python_version(), "cases": cases}
    (HERE / "reference_losses.json").write_text(json.dumps(out, indent=1) + "\n")


if __name__ == "__main__":
    main()
