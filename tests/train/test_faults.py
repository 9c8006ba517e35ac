"""Training that survives: NaNs and loss spikes roll back and skip the data; SIGTERM checkpoints and exits 0;
SIGKILL at any moment (also mid-checkpoint) loses nothing but time; a full disk stops cleanly."""

import json
import random
import signal
import time

import pytest

from support import params, run_cli, run_here, start, tiny, wait_for_steps

torch = pytest.importorskip("torch")


def events(run_dir, kind=None):
    path = run_dir / "events.jsonl"
    rows = [json.loads(x) for x in path.read_text().splitlines()] if path.exists() else []
    return [r for r in rows if kind is None or r["event"] == kind]


# Steps 7, 8, 9 (micro-batches 12..17, 2 per step) have a 20x loss; judged after 3 steps of history, a
# spike lasting 3 steps rolls back.
SPIKE_AT_STEPS_7_TO_9 = [
    "debug.inject_spike_batches=[" + ",".join(str(i) for i in range(12, 18)) + "]",
    "stability.min_history=3",
    "stability.patience=3",
]


def train_losses(run_dir):
    return [json.loads(x)["loss"] for x in (run_dir / "metrics.jsonl").read_text().splitlines() if '"loss"' in x]


def final_val_loss(run_dir):
    rows = [json.loads(x) for x in (run_dir / "metrics.jsonl").read_text().splitlines()]
    return [r["val_loss"] for r in rows if "val_loss" in r][-1]


@pytest.fixture(scope="module")
def clean(prepared, tmp_path_factory):
    run_dir = tmp_path_factory.mktemp("clean") / "run"
    assert run_here("train", *tiny(prepared, run_dir, "train.max_steps=16")).returncode == 0
    return run_dir


def test_nan_batch_is_skipped_and_rolled_back(prepared, clean, tmp_path):
    run_dir = tmp_path / "run"
    # Micro-batch 14 is the first of step 8 (2 micro-batches per step): its loss becomes NaN.
    r = run_here("train", *tiny(prepared, run_dir, "train.max_steps=16", "debug.inject_nan_batches=[14]"))
    assert r.returncode == 0, r.stderr
    skip = events(run_dir, "nonfinite_skip")
    assert [e["step"] for e in skip] == [8]
    (rollback,) = events(run_dir, "rollback")
    assert rollback["step"] == 8 and rollback["to_step"] == 4  # the newest good checkpoint
    assert rollback["skipped_micro_batches"] == [8, 16]  # everything seen since step 4, the NaN batch included
    assert all(torch.isfinite(p).all() for p in params(run_dir).values())
    assert abs(final_val_loss(run_dir) - final_val_loss(clean)) < 0.15


def test_persistent_spike_rolls_back_to_a_good_checkpoint(prepared, clean, tmp_path):
    run_dir = tmp_path / "run"
    # The checkpoint of step 8 is written during the spike, so the rollback (at step 9) must skip it and go
    # to step 4.
    r = run_here(
        "train",
        *tiny(
            prepared,
            run_dir,
            "train.max_steps=16",
            *SPIKE_AT_STEPS_7_TO_9,
            "stability.lr_scale=0.5",
            "stability.lr_scale_steps=3",
        ),
    )
    assert r.returncode == 0, r.stderr
    assert [e["step"] for e in events(run_dir, "spike")] == [7, 8]
    (rollback,) = events(run_dir, "rollback")
    assert (rollback["step"], rollback["to_step"]) == (9, 4)
    assert rollback["skipped_micro_batches"] == [8, 18]
    assert any(e["step"] == 8 and e["good"] is False for e in events(run_dir, "checkpoint"))
    lrs = {
        json.loads(x)["step"]: json.loads(x)["lr"]
        for x in (run_dir / "metrics.jsonl").read_text().splitlines()
        if "lr" in json.loads(x)
    }
    from pretrain.plan.schedule import learning_rate

    expected = learning_rate(4, total_steps=16, warmup=2, peak=3e-3, min_ratio=0.1, schedule="cosine")
    assert lrs[5] == pytest.approx(0.5 * expected)  # lowered for 3 steps after the rollback
    assert abs(final_val_loss(run_dir) - final_val_loss(clean)) < 0.15


def test_spike_detection_without_a_spike_changes_nothing(prepared, clean, tmp_path):
    # Spike detection saves a step-0 checkpoint; making its optimizer states must not count as an Adam step.
    run_dir = tmp_path / "run"
    r = run_here("train", *tiny(prepared, run_dir, "train.max_steps=16", "stability.spike_detection=false"))
    assert r.returncode == 0, r.stderr
    assert train_losses(run_dir) == train_losses(clean)


def test_an_inf_gradient_under_a_finite_loss_skips_the_update_only(prepared, tmp_path):
    # Micro-batch 4 is the first of step 3: one embedding row's gradient becomes inf while the loss stays
    # finite, as in an fp16 overflow. The fused AdamW is handed the overflow flag on the device and leaves
    # that step out (its step count says 5 of 6); nothing rolls back, the weights stay finite.
    run_dir = tmp_path / "run"
    r = run_here(
        "train", *tiny(prepared, run_dir, "train.max_steps=6", "run.eval_every=0", "debug.inject_inf_grad_batches=[4]")
    )
    assert r.returncode == 0, r.stderr
    assert [e["step"] for e in events(run_dir, "nonfinite_skip")] == [3]
    assert not events(run_dir, "rollback")
    assert json.loads((run_dir / "faults.rank0.json").read_text())["optimizer_steps"] == [5]
    assert all(torch.isfinite(p).all() for p in params(run_dir).values())
    last = sorted((run_dir / "checkpoints").glob("step_*/trainer.json"))[-1]
    assert json.loads(last.read_text())["nonfinite_skips"] == 1  # the counter the trainer keeps


def test_a_rollback_discards_the_checkpoints_it_abandons(prepared, tmp_path):
    from pretrain.checkpoint.format import list_checkpoints

    run_dir = tmp_path / "run"
    # Spike at steps 7-9 -> back to step 4 (step 8's checkpoint was written in the spike); then a NaN at the
    # next step stops the run (max one rollback) before step 8 is reached again: nothing newer than the
    # rollback target may be left for a resume to pick up.
    r = run_here(
        "train",
        *tiny(
            prepared,
            run_dir,
            "train.max_steps=16",
            *SPIKE_AT_STEPS_7_TO_9,
            "debug.inject_nan_batches=[18]",
            "stability.max_rollbacks=1",
        ),
    )
    assert r.returncode == 2, r.stderr
    assert [(e["step"], e["to_step"]) for e in events(run_dir, "rollback")] == [(9, 4)]
    assert [int(p.name.split("_")[1]) for p in list_checkpoints(run_dir)] == [0, 4]
    assert not list((run_dir / "checkpoints").glob("*.tmp"))


def test_a_stop_at_a_checkpoint_step_writes_it_once(prepared, tmp_path):
    run_dir = tmp_path / "run"
    r = run_here("train", *tiny(prepared, run_dir, "debug.stop_after_step=4"))  # checkpoint_every=4
    assert r.returncode == 0, r.stderr
    assert [e["step"] for e in events(run_dir, "checkpoint")] == [0, 4]
    assert events(run_dir, "preempted")[0]["path"].endswith("step_00000004")


def test_too_many_rollbacks_stop_with_a_message(prepared, tmp_path):
    run_dir = tmp_path / "run"
    bad = ",".join(str(i) for i in range(6, 400))  # the data is poisoned from step 4 on
    r = run_here(
        "train",
        *tiny(
            prepared, run_dir, "train.max_steps=16", f"debug.inject_nan_batches=[{bad}]", "stability.max_rollbacks=2"
        ),
    )
    assert r.returncode == 2
    (line,) = r.stderr.strip().splitlines()
    assert "rollbacks" in line and "--resume" in line
    assert len(events(run_dir, "rollback")) == 2 and events(run_dir, "stopped")


def test_sigterm_checkpoints_and_exits_zero(prepared, tmp_path):
    from pretrain.checkpoint.format import list_checkpoints

    run_dir = tmp_path / "run"
    proc = start(
        ["train", *tiny(prepared, run_dir, "train.max_steps=40", "debug.step_sleep=1", "run.checkpoint_every=100")]
    )
    wait_for_steps(run_dir, 3, proc)
    # Step 3's metrics line is written, then its 1-second step_sleep (debug.*: the end of step 3) begins: the
    # signal comes in that step, and the run stops after it, as the line on stderr says (it trained one more).
    in_flight = sum('"loss"' in x for x in (run_dir / "metrics.jsonl").read_text().splitlines())
    proc.send_signal(signal.SIGTERM)
    out, err = proc.communicate(timeout=120)
    assert proc.returncode == 0, err
    assert "SIGTERM: stopping after this step with a checkpoint" in err
    assert "stopped by SIGTERM" in out and f"pretrain train --resume {run_dir}" in out
    stopped_at = int(list_checkpoints(run_dir)[-1].name.split("_")[1])
    assert stopped_at == in_flight >= 3
    (pre,) = events(run_dir, "preempted")
    assert pre["step"] == stopped_at
    before = len((run_dir / "metrics.jsonl").read_text().splitlines())
    r = run_cli("train", "--resume", run_dir, "train.max_steps=40", "debug.step_sleep=0")
    assert r.returncode == 0, r.stderr
    new = [json.loads(x) for x in (run_dir / "metrics.jsonl").read_text().splitlines()[before:]]
    assert [x["step"] for x in new if "loss" in x][0] == stopped_at + 1


def test_second_signal_exits_at_once(prepared, tmp_path):
    run_dir = tmp_path / "run"
    proc = start(["train", *tiny(prepared, run_dir, "train.max_steps=40", "debug.step_sleep=2")])
    wait_for_steps(run_dir, 1, proc)
    proc.send_signal(signal.SIGTERM)
    # Two SIGTERMs sent before the process runs again are one to the kernel: wait for the first's answer.
    for line in proc.stderr:
        if "SIGTERM: stopping after this step" in line:
            break
    proc.send_signal(signal.SIGTERM)
    proc.communicate(timeout=60)
    assert proc.returncode == 128 + signal.SIGTERM


def test_checkpoint_every_0_writes_no_checkpoint_not_even_at_the_end(prepared, tmp_path):
    from pretrain.checkpoint.format import list_checkpoints

    run_dir = tmp_path / "run"
    r = run_here("train", *tiny(prepared, run_dir, "train.max_steps=6", "run.checkpoint_every=0"))
    assert r.returncode == 0, r.stderr
    assert list_checkpoints(run_dir) == [] and events(run_dir, "checkpoint") == []
    assert "final validation loss" in r.stdout


def test_sigterm_with_checkpoint_every_0_stops_without_one_and_says_so(prepared, tmp_path):
    from pretrain.checkpoint.format import list_checkpoints

    run_dir = tmp_path / "run"
    proc = start(
        ["train", *tiny(prepared, run_dir, "train.max_steps=40", "debug.step_sleep=0.2", "run.checkpoint_every=0")]
    )
    wait_for_steps(run_dir, 3, proc)
    proc.send_signal(signal.SIGTERM)
    out, err = proc.communicate(timeout=120)
    assert proc.returncode == 0, err
    assert "stopping after this step without a checkpoint (run.checkpoint_every=0)" in err
    assert "no checkpoint written (run.checkpoint_every=0), so this run cannot be resumed" in out
    assert list_checkpoints(run_dir) == []
    (pre,) = events(run_dir, "preempted")
    assert pre["path"] is None and pre["step"] >= 3


def test_a_nan_with_checkpoint_every_0_stops_with_one_line(prepared, tmp_path):
    """No checkpoint, no rollback target (spike detection saves no step-0 one either): the run stops and says
    why, instead of searching the run directory for a checkpoint it was told not to write."""
    from pretrain.checkpoint.format import list_checkpoints

    run_dir = tmp_path / "run"
    r = run_here(
        "train",
        *tiny(prepared, run_dir, "train.max_steps=16", "debug.inject_nan_batches=[14]", "run.checkpoint_every=0"),
    )
    assert r.returncode == 2, r.stderr
    (line,) = r.stderr.strip().splitlines()
    assert "at step 8" in line and "run.checkpoint_every=0 keeps no checkpoint to roll back to" in line
    assert list_checkpoints(run_dir) == [] and events(run_dir, "stopped")[0]["step"] == 8


def test_sigkill_at_random_moments_loses_nothing(prepared, tmp_path):
    """The crash harness: 10 SIGKILLs (half of them while a checkpoint is being written), a resume after
    each; the final parameters are bitwise those of an uninterrupted run."""
    steps = 60
    straight = tmp_path / "straight"
    common = (f"train.max_steps={steps}", "run.checkpoint_every=2", "run.log_every=5")
    assert run_cli("train", *tiny(prepared, straight, *common)).returncode == 0
    run_dir = tmp_path / "crashed"
    args = tiny(prepared, run_dir, *common, "run.resume=auto", "debug.step_sleep=0.1", "debug.checkpoint_sleep=0.1")
    rng = random.Random(0)
    kills = mid_checkpoint = 0
    while kills < 10:
        proc = start(["train", *args])
        if kills % 2:  # kill inside a checkpoint write: its .tmp directory exists
            while proc.poll() is None and not list(run_dir.glob("checkpoints/*.tmp")):
                time.sleep(0.005)
            mid_checkpoint += proc.poll() is None
        else:
            time.sleep(rng.uniform(2.5, 5.0))
        if proc.poll() is not None:
            break  # the run finished before this kill
        proc.kill()
        proc.communicate(timeout=60)
        kills += 1
    assert kills == 10 and mid_checkpoint == 5
    r = run_cli("train", *args)  # resume to the end
    assert r.returncode == 0, r.stderr
    assert not list(run_dir.glob("checkpoints/*.tmp"))
    a, b = params(straight), params(run_dir)
    assert all(torch.equal(a[k], b[k]) for k in a)


def test_disk_full_keeps_the_previous_checkpoint(prepared, tmp_path):
    from pretrain.checkpoint.format import list_checkpoints, verify

    run_dir = tmp_path / "run"
    r = run_here("train", *tiny(prepared, run_dir, "debug.inject_disk_full_step=8"))
    assert r.returncode == 2
    (line,) = r.stderr.strip().splitlines()
    assert "disk full" in line and "step_00000004 is intact" in line
    done = list_checkpoints(run_dir)
    assert done[-1].name == "step_00000004" and verify(done[-1]) is None
    assert not list((run_dir / "checkpoints").glob("*.tmp"))


def test_data_dir_truncated_under_the_run_stops_it_with_a_checkpoint(prepared, tmp_path):
    """As for a mixture source (tests/train/test_mixture_train.py): a SIGBUS before the reads were pread."""
    import os
    import shutil

    from pretrain.checkpoint.format import list_checkpoints, step_of

    data = shutil.copytree(prepared, tmp_path / "data")
    run_dir = tmp_path / "run"
    proc = start(["train", *tiny(data, run_dir, "debug.step_sleep=0.3")])
    try:
        wait_for_steps(run_dir, 2, proc)
        os.truncate(data / "train.bin", (data / "train.bin").stat().st_size // 2)
        _, stderr = proc.communicate(timeout=120)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 2, stderr
    (line,) = stderr.strip().splitlines()
    assert line.startswith(f"pretrain train: error: data.dir: {data / 'train.bin'} was truncated to"), line
    assert step_of(list_checkpoints(run_dir)[-1]) == max(
        json.loads(x)["step"] for x in (run_dir / "metrics.jsonl").read_text().splitlines()
    )
