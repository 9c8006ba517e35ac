"""Document masking (train.document_masking) on the CPU: what it costs, and what it does to the loss.

  python benchmarks/document_masking.py                  # both parts, a few minutes on one core
  python benchmarks/document_masking.py --part cost      # (a) only
  python benchmarks/document_masking.py --part loss      # (b) only
  python benchmarks/document_masking.py --out result.json # the result JSON also in a file (the trainer logs
                                                          # to stdout too)

(a) cost: one training step (forward, backward, AdamW) of a small LLaMA (hidden 256, 4 layers, 4 heads of 64,
    vocabulary 512) on 2 windows of seq 1024 whose documents are ~300 tokens (lengths drawn from a geometric
    distribution of mean 300), masked (the CPU's per-document kernel, positions restarted) and not, in the order
    A B A B ..., the ratio of the medians. Target (issue #25): <= 1.3x.
(b) loss: two tiny models trained by `Trainer` on the same real corpus (../shared/data/tinyshakespeare.txt, one
    document per blank-line block: speeches) for the same steps, seed and windows, masking on and off. Both are
    evaluated on the same validation windows with masking (each document on its own, from position 0), so
    the comparison asks how well each models a document by itself; the off model is evaluated as trained too.
"""

from __future__ import annotations

import argparse
import json
import statistics
import tempfile
import time
from pathlib import Path

import torch

SHARED = Path(__file__).resolve().parents[1].parent / "shared" / "data"  # --data overrides
EOS = 0


def cost(rounds: int) -> dict:
    from pretrain.config import load_config
    from pretrain.model import Documents, build_model

    c = load_config(
        {
            "model": {
                "vocab_size": 512,
                "hidden_size": 256,
                "intermediate_size": 688,
                "num_layers": 4,
                "num_heads": 4,
                "max_seq_len": 1024,
            }
        }
    )
    g = torch.Generator().manual_seed(0)
    tokens = torch.randint(1, 512, (2, 1025), generator=g)
    tokens[torch.rand(tokens.shape, generator=g) < 1 / 300] = EOS  # geometric lengths, mean 300
    x, y = tokens[:, :-1], tokens[:, 1:]
    arms = {"off": None, "on": Documents(EOS, masking=True, position_reset=True, kernel="loop")}
    models = {name: build_model(c.model, seed=1, documents=d) for name, d in arms.items()}
    optims = {name: torch.optim.AdamW(m.parameters(), lr=1e-4) for name, m in models.items()}
    times: dict[str, list[float]] = {name: [] for name in arms}
    for r in range(rounds + 1):  # round 0 warms up
        for name in arms:  # A B A B: the machine's drift falls on both
            start = time.perf_counter()
            models[name](x, y).backward()
            optims[name].step()
            optims[name].zero_grad()
            if r:
                times[name].append(time.perf_counter() - start)
    docs = [len(torch.nonzero(row == EOS)) + 1 for row in x]
    median = {name: statistics.median(t) for name, t in times.items()}
    return {
        "seq_len": 1024,
        "batch": 2,
        "documents_per_window": docs,
        "rounds": rounds,
        "step_s_off": median["off"],
        "step_s_on": median["on"],
        "ratio": median["on"] / median["off"],
        "ratio_per_round": [a / b for a, b in zip(times["on"], times["off"])],
    }


def loss(data: Path, steps: int) -> dict:
    from pretrain.config import load_config
    from pretrain.data import prepare, train_tokenizer
    from pretrain.distributed.runtime import init_runtime
    from pretrain.model import Documents
    from pretrain.train.callbacks.evaluation import _mean_loss
    from pretrain.train.trainer import Trainer

    work = Path(tempfile.mkdtemp(prefix="document_masking_"))
    corpus = [str(data / "tinyshakespeare.txt")]
    train_tokenizer(corpus, 512, work / "tokenizer", split_blank_lines=True)
    meta = prepare(corpus, str(work / "tokenizer"), work / "data", val_fraction=0.05, workers=1, split_blank_lines=True)
    result = {
        "corpus": "tinyshakespeare.txt, one document per blank-line block",
        "steps": steps,
        "train_tokens": meta["num_tokens"]["train"],
        "documents": meta["num_docs"]["train"],
        "mean_doc_tokens": meta["num_tokens"]["train"] / meta["num_docs"]["train"],
    }
    rt = init_runtime("cpu")
    masked_eval = Documents(meta["eos_id"], masking=True, position_reset=True, kernel="loop")
    for arm in ("off", "on"):
        c = load_config(
            {
                "model": {
                    "preset": "debug",
                    "hidden_size": 128,
                    "intermediate_size": 344,
                    "num_layers": 4,
                    "num_heads": 4,
                    "num_kv_heads": 4,
                    "vocab_size": 512,
                },
                "train": {
                    "seq_len": 256,
                    "micro_batch_size": 8,
                    "grad_accum_steps": 1,
                    "max_steps": steps,
                    "precision": "fp32",
                    "device": "cpu",
                    "lr": 3e-3,
                    "warmup": 20,
                    "document_masking": arm == "on",
                },
                "data": {"dir": str(work / "data")},
                "run": {
                    "dir": str(work / f"run_{arm}"),
                    "eval_every": 0,
                    "eval_batches": 40,
                    "checkpoint_every": 0,
                    "progress": False,
                    "loggers": [],
                },
                "hardware": {"peak_tflops": 0.05},
            }
        )
        trainer = Trainer(c, rt)
        start = time.perf_counter()
        final = trainer.fit()
        result[f"seconds_{arm}"] = time.perf_counter() - start
        result[f"val_loss_{arm}_as_trained"] = final["val_loss"]
        trainer.engine.module.documents = masked_eval
        trainer.engine.set_training(False)
        with torch.no_grad():
            result[f"val_loss_{arm}_per_document"] = _mean_loss(trainer, trainer.data)
    return result


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--part", choices=("cost", "loss", "both"), default="both")
    p.add_argument("--rounds", type=int, default=6, help="(a): timed A B rounds")
    p.add_argument("--steps", type=int, default=300, help="(b): optimizer steps per model")
    p.add_argument("--data", type=Path, default=SHARED)
    p.add_argument("--out", type=Path, help="also write the result JSON here (the runs' logs share stdout)")
    args = p.parse_args()
    torch.set_num_threads(1)
    out = {}
    if args.part in ("cost", "both"):
        out["cost"] = cost(args.rounds)
    if args.part in ("loss", "both"):
        out["loss"] = loss(args.data, args.steps)
    text = json.dumps(out, indent=2) + "\n"
    print(text, end="")
    if args.out:
        from pretrain.files import write_atomic

        write_atomic(args.out, text)


if __name__ == "__main__":
    main()
