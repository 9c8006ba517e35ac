"""Staged context extension: `--resume` at a longer train.seq_len (here with model.rope_scaling) continues the
run as a new stage (the same tokens per step under train.global_batch_tokens, the data stream at the same
share of its epoch), said in events.jsonl; resuming the new stage again is bitwise; a change that leaves the run's
length ill-defined is
one line before any tensor is loaded."""

import json
import math
import shutil

import pytest

from pretrain.checkpoint.choice import resume_point
from pretrain.checkpoint.compatibility import stage_change
from pretrain.config import load_config
from pretrain.errors import UsageError
from support import finished_run, losses, run_cli, run_here, tiny

pytest.importorskip("torch")


def events(run_dir, name) -> list[dict]:
    rows = [json.loads(x) for x in (run_dir / "events.jsonl").read_text().splitlines()]
    return [r for r in rows if r["event"] == name]


def test_a_longer_seq_len_on_resume_is_a_new_stage_and_resumes_bitwise(prepared, tmp_path):
    first, second = tmp_path / "first", tmp_path / "second"
    # 2,048 tokens at 256 per step: 8 steps; stage 1 (seq 32, 4 x 32 x 2) stops after step 4.
    finished_run(
        first,
        *tiny(
            prepared,
            first,
            "train.max_steps=null",
            "train.tokens=2048",
            "run.eval_every=0",
            "train.global_batch_tokens=256",
            "debug.stop_after_step=4",
        ),
    )
    shutil.copytree(first, second)
    # Stage 2 doubles the window and stretches RoPE to it as YaRN does (2 x the 32 positions of stage 1).
    yarn = "model.rope_scaling={rope_type: yarn, factor: 2, original_max_position_embeddings: 32}"
    r = run_cli("train", "--resume", first, "train.seq_len=64", yarn, "debug.stop_after_step=0")
    assert r.returncode == 0, r.stderr
    assert "new stage from step 4: train.seq_len 32 -> 64, 256 tokens per step" in r.stdout
    [stage] = events(first, "stage_changed")
    assert (stage["seq_len_before"], stage["seq_len_after"]) == (32, 64)
    assert (stage["tokens_per_step_before"], stage["tokens_per_step_after"]) == (256, 256)
    # 1,024 tokens read, 32 windows of 32 = 16 windows of 64 into the same epoch
    assert (stage["step"], stage["tokens"], stage["data_epoch"], stage["data_position"]) == (4, 1024, 0, 16)
    loss = losses(first)
    assert sorted(loss) == list(range(1, 9)) and all(math.isfinite(x) for x in loss.values())

    # The same stage change, stopped after step 6 and resumed again (now at its own seq_len and RoPE scaling,
    # read back from the run's config.yaml): bitwise the same.
    r = run_cli("train", "--resume", second, "train.seq_len=64", yarn, "debug.stop_after_step=6")
    assert r.returncode == 0, r.stderr
    r = run_cli("train", "--resume", second, "debug.stop_after_step=0")
    assert r.returncode == 0, r.stderr
    assert [losses(second)[s] for s in (7, 8)] == [loss[7], loss[8]]
    assert len(events(second, "stage_changed")) == 1  # the second resume is no new stage

    # Without global_batch_tokens the tokens per step double (seq 64 -> 128, one micro-batch of 4 a step)
    # under a length counted in tokens: refused; counted in steps it is well defined.
    checkpoint = resume_point(first)[0]
    changed = load_config(first / "config.yaml", ["train.seq_len=128", "train.global_batch_tokens=null"])
    with pytest.raises(
        UsageError,
        match=r"128 here, 64 in checkpoint .* tokens per step go from 256 to 512, "
        r".*train.global_batch_tokens=256",
    ):
        stage_change(checkpoint, changed)
    counted_in_steps = load_config(
        first / "config.yaml", ["train.seq_len=128", "train.global_batch_tokens=null", "train.max_steps=12"]
    )
    assert stage_change(checkpoint, counted_in_steps)["tokens_per_step_after"] == 512


def test_a_stage_after_a_finished_run_says_its_length_in_one_key_and_trains_it(prepared, tmp_path):
    # The docs' stage 2 after a finished stage 1 printed "new stage", trained 0 steps and logged stage_changed
    # (again on the next resume, which did train). Now: a stage of nothing is one line before any tensor, and
    # train.stage_tokens is its length, spent into the run's train.max_steps.
    run = tmp_path / "run"
    finished_run(run, *tiny(prepared, run, "train.max_steps=4", "run.eval_every=0", "train.schedule=wsd"))
    config = (run / "config.yaml").read_text()
    r = run_here("train", "--resume", run, "train.seq_len=64")
    assert r.returncode == 2 and r.stderr.count("\n") == 1, r.stderr
    assert "finished its run (step 4 of 4): a new stage at 64 would train nothing" in r.stderr
    assert "train.stage_tokens=N" in r.stderr and (run / "config.yaml").read_text() == config
    assert events(run, "stage_changed") == []
    # 1,024 tokens at 4 x 64 x 2 = 512 a step: steps 5 and 6, to the end of the run
    r = run_here("train", "--resume", run, "train.seq_len=64", "train.stage_tokens=1024")
    assert r.returncode == 0, r.stderr
    assert "1,024 tokens (train.stage_tokens): to step 6" in r.stdout
    [stage] = events(run, "stage_changed")
    assert (stage["stage_tokens"], stage["ends_at_step"], stage["step"]) == (1024, 6, 4)
    assert sorted(losses(run)) == [1, 2, 3, 4, 5, 6]
    assert "max_steps: 6" in (run / "config.yaml").read_text()
    # resuming the finished stage: nothing more, and no second stage_changed
    assert run_here("train", "--resume", run).returncode == 0 and len(events(run, "stage_changed")) == 1
    r = run_here("train", "--resume", run, "train.stage_tokens=512")  # outside a new stage: one line
    assert r.returncode == 2 and "train.stage_tokens: the length of a new stage" in r.stderr
