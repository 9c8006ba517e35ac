"""A resume that changes the run's length follows the schedule of its new length, said in events.jsonl: wsd
extends its stable phase and decays anew at the new end; cosine and linear are refused in one line unless
train.schedule_restart=true; inverse_sqrt has no end and goes on unchanged."""

import json

import pytest

from support import finished_run, run_here, tiny

pytest.importorskip("torch")


def lrs(run_dir) -> dict:
    """{step: learning rate} of a run's metrics.jsonl."""
    rows = [json.loads(x) for x in (run_dir / "metrics.jsonl").read_text().splitlines()]
    return {r["step"]: r["lr"] for r in rows if "lr" in r}


def events(run_dir, name) -> list[dict]:
    rows = [json.loads(x) for x in (run_dir / "events.jsonl").read_text().splitlines()]
    return [r for r in rows if r["event"] == name]


def test_a_finished_wsd_run_extended_keeps_its_stable_lr_and_decays_anew_at_the_new_end(prepared, tmp_path):
    run_dir = tmp_path / "run"
    # 12 steps, lr 3e-3, the decay over the last 3 (steps 10-12) down to 3e-4.
    finished_run(run_dir, *tiny(prepared, run_dir, "train.schedule=wsd", "train.decay_fraction=0.25"))
    assert lrs(run_dir)[12] == pytest.approx(3e-4)
    r = run_here("train", "--resume", run_dir, "train.max_steps=20")
    assert r.returncode == 0, r.stderr
    lr = lrs(run_dir)
    # 20 steps: the decay is the last 5 (steps 16-20); steps 13-15 are back at the stable LR.
    assert [lr[s] for s in (13, 14, 15)] == [pytest.approx(3e-3)] * 3
    assert [lr[s] for s in range(16, 21)] == pytest.approx([3e-3 - 2.7e-3 * k / 5 for k in range(1, 6)])
    [e] = events(run_dir, "schedule_changed")
    assert e["old_total"] == 12 and e["new_total"] == 20 and e["step"] == 12 and e["schedule"] == "wsd"
    assert e["lr_at_resume_before"] == pytest.approx(3e-4) and e["lr_at_resume_after"] == pytest.approx(3e-3)
    assert e["inside_old_decay"] is True and e["old_decay_start"] == 9 and e["decay_start"] == 15
    assert "inside the old decay" in r.stdout


def test_a_cosine_run_lengthened_is_refused_in_one_line_unless_schedule_restart(prepared, tmp_path):
    run_dir = tmp_path / "run"
    finished_run(run_dir, *tiny(prepared, run_dir))  # cosine, 12 steps
    before = sorted(p.name for p in (run_dir / "checkpoints").iterdir()), (run_dir / "config.yaml").read_text()
    r = run_here("train", "--resume", run_dir, "train.max_steps=16")
    assert r.returncode == 2 and len(r.stderr.strip().splitlines()) == 1, r.stderr
    assert "train.schedule_restart=true" in r.stderr and "Traceback" not in r.stderr
    assert (
        sorted(p.name for p in (run_dir / "checkpoints").iterdir()),
        (run_dir / "config.yaml").read_text(),
    ) == before
    r = run_here("train", "--resume", run_dir, "train.max_steps=16", "train.schedule_restart=true")
    assert r.returncode == 0, r.stderr
    from pretrain.plan.schedule import learning_rate

    lr = lrs(run_dir)
    assert [lr[s] for s in range(13, 17)] == pytest.approx(
        [
            learning_rate(s - 1, total_steps=16, warmup=2, peak=3e-3, min_ratio=0.1, schedule="cosine")
            for s in range(13, 17)
        ]
    )
    [e] = events(run_dir, "schedule_changed")
    assert (e["old_total"], e["new_total"]) == (12, 16)
    assert e["lr_at_resume_after"] > e["lr_at_resume_before"] == pytest.approx(3e-4)


def test_a_linear_run_interrupted_and_shortened_is_refused_too(prepared, tmp_path):
    run_dir = tmp_path / "run"
    finished_run(run_dir, *tiny(prepared, run_dir, "train.schedule=linear", "debug.stop_after_step=4"))
    r = run_here("train", "--resume", run_dir, "train.max_steps=8")
    assert r.returncode == 2 and "train.schedule_restart" in r.stderr and len(r.stderr.strip().splitlines()) == 1


def test_inverse_sqrt_has_no_end_its_lr_goes_on_unchanged_and_the_warmup_keeps_its_steps():
    from pretrain.config import load_config
    from pretrain.plan.schedule import resumed_schedule

    train = load_config(None, ["train.schedule=inverse_sqrt", "train.warmup=0.1"]).train
    warmup, e = resumed_schedule(train, {"step": 100, "total_steps": 100, "warmup_steps": 10}, 1000)
    assert warmup == 10  # not 0.1 x 1000: the warm-up is done
    assert e["lr_at_resume_after"] == e["lr_at_resume_before"]
    assert resumed_schedule(train, {"step": 50, "total_steps": 100, "warmup_steps": 10}, 100) == (10, None)
