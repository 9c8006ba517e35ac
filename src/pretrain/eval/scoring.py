"""Scoring: the log-likelihood of each request's continuation given its context, and a task's metrics.

The metrics are METRICS' rows, the one list that `pretrain eval`'s table, its JSON and the in-loop metrics line
read. Per example, with ll_i the summed log-probability of choice i's continuation tokens:
  acc           argmax_i ll_i is the gold choice (the raw sum; long choices lose)
  acc_norm      argmax_i ll_i / characters_i (lm-evaluation-harness's acc_norm, OLMo's len_norm)
  acc_bytes     argmax_i ll_i / UTF-8 bytes_i (the same per byte: does not depend on the tokenizer)
  bits_per_byte -ll_gold / bytes_gold / ln 2 (OLMo's bpb: lower is better)
Ties go to the first choice, as numpy's and torch's argmax. Each metric is a mean over examples, with the
standard error of that mean (sample standard deviation / sqrt(n), as lm-evaluation-harness reports).
"""

from __future__ import annotations

import math
from collections import defaultdict
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import torch

if TYPE_CHECKING:
    from .models import HFModel, OurModel, PipelinedModel
    from .tasks import Request, Task

Choices = list[tuple[float, "Request"]]  # an example's choices in order: (ll_i, the choice's request)


@dataclass(frozen=True)
class Metric:
    name: str  # the key in `pretrain eval --json` and, as eval/<task>/<name>, in metrics.jsonl
    of_example: Callable[[Choices, int], float]  # its value for one example: (choices, the gold index) -> value
    heading: str  # its column in `pretrain eval`'s table
    with_stderr: bool  # its standard error shown in the table and logged in the loop (as <name>_stderr)


def _hit(scores: list[float], gold: int) -> float:
    return float(scores.index(max(scores)) == gold)  # index(): the first of tied maxima, as argmax


METRICS = (
    Metric("acc", lambda choices, gold: _hit([ll for ll, _ in choices], gold), "acc", True),
    Metric("acc_norm", lambda choices, gold: _hit([ll / r.chars for ll, r in choices], gold), "acc_norm", True),
    Metric("acc_bytes", lambda choices, gold: _hit([ll / r.bytes for ll, r in choices], gold), "acc_bytes", False),
    Metric(
        "bits_per_byte",
        lambda choices, gold: -choices[gold][0] / choices[gold][1].bytes / math.log(2),
        "bits/byte",
        False,
    ),
)


def reported(task: dict[str, Any]) -> dict[str, Any]:
    """What the loop logs of a task's results (summarize's): each metric, the standard errors the table shows,
    and the chance level."""
    keys = [k for m in METRICS for k in ([m.name, f"{m.name}_stderr"] if m.with_stderr else [m.name])]
    return {k: task[k] for k in [*keys, "chance"]}


@torch.no_grad()
def loglikelihoods(
    lm: OurModel | PipelinedModel | HFModel,
    requests: list[Request],
    batch_size: int,
    advance: Callable[[int], object] | None = None,
) -> list[float]:
    """The continuation log-likelihood of each request, in request order. Batches of similar lengths (longest
    first: a batch that does not fit fails at once, not at the end), right-padded: the model is causal, so
    padding after a position changes nothing before it. A context longer than the model's window loses its
    first tokens. `advance(n)` is called after each batch of n requests (a progress bar)."""
    order = sorted(range(len(requests)), key=lambda i: (-len(requests[i].tokens), i))
    out = [0.0] * len(requests)
    for start in range(0, len(order), batch_size):
        batch = order[start : start + batch_size]
        inputs = [requests[i].tokens[:-1][-lm.max_len :] for i in batch]  # the last token is only a target
        x = torch.zeros(len(batch), max(map(len, inputs)), dtype=torch.long)
        rows, cols, targets, owners = [], [], [], []
        for b, (i, tokens) in enumerate(zip(batch, inputs)):
            x[b, : len(tokens)] = torch.tensor(tokens)
            n, c = len(tokens), min(requests[i].cont_len, len(tokens))
            # position j predicts token j + 1: the continuation's c tokens come from the last c positions
            rows += [b] * c
            cols += range(n - c, n)
            targets += requests[i].tokens[-c:]
            owners += [b] * c
        logprobs = lm.token_logprobs(x.to(lm.device), torch.tensor(rows), torch.tensor(cols), torch.tensor(targets))
        sums = torch.zeros(len(batch), dtype=torch.float64).index_add_(0, torch.tensor(owners), logprobs.double().cpu())
        for b, i in enumerate(batch):
            out[i] = float(sums[b])
        if advance is not None:
            advance(len(batch))
    return out


def per_example(requests: list[Request], lls: list[float]) -> dict[str, list[float]]:
    """Each metric's value for each example (a 0/1 hit, or bits per byte), examples in order."""
    docs = defaultdict(list)
    for r, ll in zip(requests, lls):
        docs[r.doc].append((r.choice, ll, r))
    values: dict[str, list[float]] = {m.name: [] for m in METRICS}
    for doc in sorted(docs):
        choices = [(ll, r) for _, ll, r in sorted(docs[doc], key=lambda t: t[0])]
        gold = choices[0][1].gold
        for m in METRICS:
            values[m.name].append(m.of_example(choices, gold))
    return values


def moments(values: dict[str, list[float]]) -> dict[str, list[float]]:
    """Each metric's (n, sum, sum of squares): what ranks add up to share the mean and its standard error."""
    return {m: [len(v), sum(v), sum(x * x for x in v)] for m, v in values.items()}


def summarize(sums: dict[str, list[float]], chance: float) -> dict[str, Any]:
    """The JSON of one task from its metrics' moments: each mean, its standard error (None for one example)."""
    out: dict = {}
    for m, (n, total, squares) in sums.items():
        mean = total / n
        variance = max(squares - n * mean * mean, 0.0) / (n - 1) if n > 1 else None
        out[m] = mean
        out[f"{m}_stderr"] = math.sqrt(variance / n) if variance is not None else None
    out["chance"] = chance
    out["examples"] = int(sums["acc"][0])
    return out


def task_metrics(task: Task, lls: list[float]) -> dict[str, Any]:
    """The metrics of one task from the log-likelihoods of all its requests."""
    return summarize(moments(per_example(task.requests, lls)), task.chance)
