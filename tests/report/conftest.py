"""Synthetic run directories in the format `pretrain train` writes (see src/pretrain/report/runs.py)."""

from __future__ import annotations

import json
import math
import random

import pytest
import yaml

GIB = 1024**3


def train_line(step: int, tokens: int, batch: int, rng: random.Random, gpu: bool, bump: float = 0.0) -> dict:
    # loss falls from ln(50257) = 10.8 towards ~3.3, as a small GPT-2 does on web text
    loss = 3.3 + 7.5 * math.exp(-step / 40) + rng.gauss(0, 0.03) + bump
    lr = 6e-4 * min(1.0, step / 20) * (0.55 + 0.45 * math.cos(math.pi * step / 320))
    return {
        "step": step,
        "tokens": tokens,
        "loss": loss,
        "lr": lr,
        "batch_tokens": batch,
        "grad_norm": abs(0.8 + rng.gauss(0, 0.1)) + bump,
        "tokens_per_s": 52_000 + rng.gauss(0, 1500),
        "mfu": 0.38 + rng.gauss(0, 0.01) if gpu else None,
        "peak_mem_bytes": int(21.4 * GIB) if gpu else None,
        "time": step * 0.9,
    }


def write_run(path, steps: int = 300, eval_every: int = 50, gpu: bool = True, seed: int = 0) -> None:
    """A run with a batch ramp, a non-finite step at 1/3 of the steps (skipped by the trainer), a loss spike at 2/3
    of the steps rolled back 20 steps, a preemption at 5/6
    resumed from a checkpoint 10 steps earlier (with 300 steps: spike at 200, replay of 180-200, preemption
    at 250, replay of 240-250; the later lines are the truth), and a half-written last line."""
    rng = random.Random(seed)
    path.mkdir(parents=True)
    batch_at = [min(131_072, 32_768 + 1024 * s) for s in range(steps + 1)]  # ramp 32K -> 128K tokens
    tokens_at = [sum(batch_at[1 : s + 1]) for s in range(steps + 1)]
    nonfinite, spike, preempt = steps // 3, 2 * steps // 3, 5 * steps // 6
    lines, events = [], []

    def span(first, last, spike_from=None):
        for s in range(first, last + 1):
            bump = 3.0 if spike_from is not None and s >= spike_from else 0.0
            lines.append(train_line(s, tokens_at[s], batch_at[s], rng, gpu, bump))
            if s == nonfinite:  # json.dumps writes NaN / Infinity, which json.loads reads back
                lines[-1].update(loss=float("nan"), grad_norm=float("inf"))
            if s % eval_every == 0:
                val = lines[-1]["loss"] + 0.08
                lines.append(
                    {
                        "step": s,
                        "tokens": tokens_at[s],
                        "val_loss": val,
                        "val_ppl": math.exp(val),
                        "time": s * 0.9 + 0.5,
                    }
                )

    span(1, spike, spike_from=spike - 9)  # the branch that diverged
    # the trainer writes a non-finite loss in events.jsonl as a string
    events.append(
        {
            "event": "nonfinite_skip",
            "step": nonfinite,
            "tokens": tokens_at[nonfinite],
            "loss": "nan",
            "grad_norm": "inf",
            "time": nonfinite * 0.9,
        }
    )
    spike_loss = [line for line in lines if "loss" in line][-1]["loss"]
    events.append(
        {"event": "spike", "step": spike, "tokens": tokens_at[spike], "loss": spike_loss, "time": spike * 0.9}
    )
    events.append(
        {
            "event": "rollback",
            "step": spike,
            "tokens": tokens_at[spike],
            "loss": None,
            "time": spike * 0.9,
            "to_step": spike - 20,
            "skipped_tokens": [tokens_at[spike - 20], tokens_at[spike]],
        }
    )
    span(spike - 20, preempt)
    events.append(
        {"event": "preempted", "step": preempt, "tokens": tokens_at[preempt], "loss": None, "time": preempt * 0.9}
    )
    events.append(
        {
            "event": "resumed",
            "step": preempt - 10,
            "tokens": tokens_at[preempt - 10],
            "loss": None,
            "time": preempt * 0.9 + 60,
        }
    )
    span(preempt - 10, steps)
    events += [
        {"event": "checkpoint", "step": s, "tokens": tokens_at[s], "loss": None, "time": s * 0.9}
        for s in range(10, steps + 1, 10)
    ]

    text = "".join(json.dumps(line) + "\n" for line in lines)
    (path / "metrics.jsonl").write_text(text + f'{{"step": {steps + 1}, "tokens": 3')  # the trainer is mid-write
    (path / "events.jsonl").write_text("".join(json.dumps(e) + "\n" for e in events))
    (path / "plan_vs_run.json").write_text(
        json.dumps(
            {
                "device": "NVIDIA H100 80GB HBM3",
                "rows": [
                    {
                        "name": "parameters",
                        "planned": 497_759_232,
                        "measured": 497_759_232,
                        "unit": "bytes",
                        "error_pct": 0.0,
                    },
                    {
                        "name": "activations",
                        "planned": 12.1 * GIB,
                        "measured": 14.0 * GIB,
                        "unit": "bytes",
                        "error_pct": 15.7,
                    },
                    {"name": "total", "planned": 20.2 * GIB, "measured": 21.4 * GIB, "unit": "bytes", "error_pct": 5.9},
                    {
                        "name": "tokens_per_s",
                        "planned": 55_000,
                        "measured": 52_000,
                        "unit": "tokens/s",
                        "error_pct": -5.5,
                    },
                    {"name": "mfu", "planned": 0.4, "measured": None, "unit": "fraction", "error_pct": None},
                ],
            }
        )
    )
    (path / "config.yaml").write_text(
        yaml.safe_dump(
            {
                "model": {
                    "preset": "gpt2",
                    "hidden_size": 768,
                    "num_layers": 12,
                    "num_heads": 12,
                    "vocab_size": 50257,
                    "max_seq_len": 1024,
                },
                "train": {"seq_len": 1024},
            }
        )
    )


@pytest.fixture
def make_run():
    """write_run, for tests that need several runs or other settings."""
    return write_run


@pytest.fixture
def run_dir(tmp_path):
    path = tmp_path / "gpt2-small"
    write_run(path)
    return path
