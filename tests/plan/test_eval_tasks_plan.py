"""The plan prices run.eval_tasks: forward FLOPs per evaluation from the task sizes and the limit, its time as
a share of the run; a plan without it is unchanged."""

import json
import subprocess
import sys

import pytest

from pretrain.config import load_config
from pretrain.plan import make_plan
from pretrain.plan.eval_tasks import TASK_SIZES

BASE = ["model.preset=gpt2", "train.tokens=1e9", "run.eval_every=1000"]


def test_every_named_task_has_its_size():
    from pretrain.task_catalog import ALL

    assert set(TASK_SIZES) == set(ALL)


def test_eval_tasks_cost_follows_the_task_sizes_the_limit_and_the_cadence():
    plain = make_plan(load_config(None, BASE))
    assert "eval_tasks" not in plain and "eval_tasks_seconds" not in plain["time"]
    plan = make_plan(
        load_config(
            None, BASE + ["run.eval_tasks=[hellaswag,piqa]", "run.eval_tasks_limit=100", "run.eval_tasks_every=500"]
        )
    )
    ev = plan["eval_tasks"]
    size = TASK_SIZES["hellaswag"][2]
    assert ev["tasks"]["hellaswag"] == {"examples": 100, "requests": 400, "tokens": round(400 * size / 4.0)}
    assert ev["evaluations"] == (plan["steps"]["total"] - 1) // 500 + 1
    assert ev["flops_per_evaluation"] == ev["tokens_per_evaluation"] * plan["flops"]["per_token"] / 3
    train = plan["time"]["seconds"]
    assert train == plain["time"]["seconds"]  # training's own time is the same
    assert ev["share_of_run"] == pytest.approx(ev["seconds"] / (train + ev["seconds"]))
    assert plan["time"]["eval_tasks_share"] == ev["share_of_run"]
    double = make_plan(
        load_config(
            None, BASE + ["run.eval_tasks=[hellaswag,piqa]", "run.eval_tasks_limit=200", "run.eval_tasks_every=500"]
        )
    )["eval_tasks"]
    assert double["tokens_per_evaluation"] == pytest.approx(2 * ev["tokens_per_evaluation"], rel=1e-4)


def test_under_pipeline_parallelism_requests_are_padded_and_one_stage_computes_at_a_time():
    # The in-loop evaluation pads every batch to train.seq_len and runs the stages one after the other.
    tasks = ["run.eval_tasks=[piqa]", "run.eval_tasks_limit=100", "parallel.gpus=4", "train.seq_len=1024"]
    flat = make_plan(load_config(None, BASE + tasks))
    piped = make_plan(load_config(None, BASE + tasks + ["parallel.pipeline=2", "model.tie_embeddings=false"]))
    assert flat["eval_tasks"]["tokens_per_evaluation"] < 200 * 1024
    ev = piped["eval_tasks"]
    assert ev["tasks"]["piqa"] == {"examples": 100, "requests": 200, "tokens": 200 * 1024}
    rate = 4 / 2 * piped["hardware"]["peak_tflops"] * 1e12 * piped["time"]["utilisation"]
    assert ev["seconds_per_evaluation"] == pytest.approx(ev["flops_per_evaluation"] / rate)


def test_a_local_task_file_is_sized_from_the_file_and_the_plan_imports_no_torch(tmp_path):
    path = tmp_path / "mine.jsonl"
    path.write_text(json.dumps({"context": "abcd", "choices": ["efgh", "ijklmnop"], "gold": 0}) + "\n")
    plan = make_plan(load_config(None, BASE + [f"run.eval_tasks=[{path}]"]))
    assert plan["eval_tasks"]["tasks"][str(path)] == {"examples": 1, "requests": 2, "tokens": 5}  # 10 bytes / 4
    code = (
        "import sys; from pretrain.config import load_config; from pretrain.plan import make_plan; "
        f"make_plan(load_config(None, {BASE + ['run.eval_tasks=[small]']!r})); print('torch' in sys.modules)"
    )
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert r.returncode == 0 and r.stdout.strip() == "False", r.stderr


def test_a_task_file_not_written_yet_is_said_not_priced_at_zero_tokens(tmp_path):
    # The demo plans before it writes its cloze.jsonl: the row said "0.0 minutes ... x 0 tokens ()".
    from pretrain.plan.table import render

    missing = str(tmp_path / "cloze.jsonl")
    config = load_config(None, BASE + [f"run.eval_tasks=[{missing}]"])
    plan = make_plan(config)
    assert plan["eval_tasks"]["tasks"] == {} and plan["eval_tasks"]["unread"] == [missing]
    (row,) = [line for line in render(config, plan).splitlines() if line.lstrip().startswith("Eval tasks")]
    assert "n/a" in row and f"{missing}: not found" in row and "0 tokens ()" not in row
    assert "unread" not in make_plan(load_config(None, BASE + ["run.eval_tasks=[piqa]"]))["eval_tasks"]
