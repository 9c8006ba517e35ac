"""The README's main command, shortened: plan, tokenizer, prepare, train, report, export, generate."""

import json

import pytest

from support import run_cli

pytest.importorskip("torch")


def test_demo_end_to_end(tmp_path):
    r = run_cli("demo", "--out", tmp_path / "demo", "train.max_steps=60", "run.eval_every=30",
                "run.checkpoint_every=30", "train.warmup=6", "run.progress=false", cwd=tmp_path)
    assert r.returncode == 0, r.stderr[-3000:]
    out = tmp_path / "demo"
    for step in ("1/6 plan", "2/6 tokenizer", "3/6 prepare", "4/6 train", "5/6 report", "6/6 export"):
        assert step in r.stdout
    assert "planner storage_bytes predicts" in r.stdout and "(equal)" in r.stdout
    assert (out / "run" / "report" / "report.png").exists() and (out / "run" / "report" / "report.html").exists()
    assert (out / "hf" / "model.safetensors").exists() and (out / "hf" / "tokenizer.json").exists()
    assert "gives the same greedy text: True" in r.stdout
    rows = [json.loads(x) for x in (out / "run" / "metrics.jsonl").read_text().splitlines()]
    val = [x["val_loss"] for x in rows if "val_loss" in x]
    assert val[-1] < val[0]
    assert "nats better than counting tokens" in r.stdout  # and the exit code says it beat the unigram entropy
