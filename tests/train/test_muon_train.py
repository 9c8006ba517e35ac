"""`train.optimizer: muon` in one process: the optimizer states the plan predicts, byte for byte (one momentum
per block matrix, AdamW's moments and step for the rest; the routed experts' [E, A, B] included), and a run
killed with SIGKILL and resumed ends bitwise as the one never stopped."""

import json

import pytest

from support import losses, params, run_here, start, tiny, wait_for_steps

torch = pytest.importorskip("torch")
pytestmark = pytest.mark.skipif(not hasattr(torch.optim, "Muon"), reason="train.optimizer=muon: torch >= 2.9")

MUON = ("train.optimizer=muon", "train.max_steps=8")
MOE = ("model.preset=moe-debug", "model.router_aux_loss_coef=0", "train.max_steps=3", "run.eval_every=0")


@pytest.fixture(scope="module")
def uninterrupted(prepared, tmp_path_factory):
    run_dir = tmp_path_factory.mktemp("muon") / "run"
    r = run_here("train", *tiny(prepared, run_dir, *MUON))
    assert r.returncode == 0, r.stderr
    return run_dir


def _rows(run_dir) -> dict:
    return {x["name"]: x for x in json.loads((run_dir / "plan_vs_run.json").read_text())["rows"]}


@pytest.mark.parametrize("moe", [False, True], ids=["dense", "moe"])
def test_the_plans_optimizer_states_are_the_trainers_bytes(prepared, uninterrupted, tmp_path, moe):
    run_dir = tmp_path / "moe"
    if moe:
        r = run_here("train", *tiny(prepared, run_dir, *MUON, *MOE))
        assert r.returncode == 0, r.stderr
    rows = _rows(run_dir if moe else uninterrupted)
    for name in ("parameters", "gradients", "optimizer_states"):
        assert rows[name]["planned"] == rows[name]["measured"], name
    # One momentum for the block matrices instead of AdamW's two moments: well under AdamW's 2 x parameters.
    assert rows["optimizer_states"]["measured"] < 0.8 * 2 * rows["parameters"]["measured"]


def test_sigkill_and_resume_is_bitwise_identical(prepared, uninterrupted, tmp_path):
    run_dir = tmp_path / "run"
    proc = start(["train", *tiny(prepared, run_dir, *MUON, "debug.step_sleep=0.3")])
    try:
        wait_for_steps(run_dir, 5, proc)  # past the step-4 checkpoint, its momentum buffers in it
    finally:
        proc.kill()
        proc.communicate(timeout=60)
    assert max(losses(run_dir)) < 8
    r = run_here("train", "--resume", run_dir, "debug.step_sleep=0")
    assert r.returncode == 0, r.stderr
    assert "resumed from" in r.stdout and "step 4" in r.stdout
    assert losses(run_dir) == losses(uninterrupted)
    a, b = params(uninterrupted), params(run_dir)
    assert all(torch.equal(a[k], b[k]) for k in a)
