"""The trainer's pieces in-process, beside the subprocess runs that test them together: the spike detector,
which checkpoint a resume or a rollback picks and what pruning keeps, the learning rate after a rollback."""

import pytest
import torch

from pretrain.checkpoint.choice import latest_checkpoint, prune, remove_after, resume_point
from pretrain.checkpoint.format import checkpoint_dir, list_checkpoints, save_checkpoint
from pretrain.config import load_config
from pretrain.plan.schedule import learning_rate
from pretrain.train.spikes import SpikeDetector
from pretrain.train.trainer import TrainState


def detector(**overrides):
    return SpikeDetector(
        load_config({"stability": {"min_history": 5, "window": 10, "patience": 2, **overrides}}).stability
    )


def test_noise_is_no_spike_and_a_jump_is_one_then_a_rollback_after_patience():
    d = detector()
    for loss in [3.0, 3.1, 2.9, 3.05, 2.95, 3.0]:
        assert d.observe(loss) == "ok"
    assert d.observe(9.0) == "spike" and d.active and d.streak == 1
    assert d.observe(9.0) == "rollback"
    assert d.history[-1] == 3.0  # spike losses never enter the reference: a long spike is not the new normal


def test_a_spike_that_ends_resets_the_streak():
    d = detector()
    for loss in [3.0, 3.1, 2.9, 3.05, 2.95]:
        d.observe(loss)
    assert d.observe(9.0) == "spike"
    assert d.observe(3.0) == "ok" and not d.active


def test_non_finite_rolls_back_at_once_even_without_history_or_detection():
    assert detector().observe(float("nan")) == "rollback"
    assert detector(spike_detection=False).observe(float("inf")) == "rollback"
    assert detector(spike_detection=False).observe(100.0) == "ok"


def test_min_rise_keeps_a_flat_curve_from_calling_every_wobble_a_spike():
    d = detector(min_rise=0.1)
    for _ in range(6):
        d.observe(2.0)  # MAD 0: without min_rise any higher loss would be "above the noise"
    assert d.observe(2.1) == "ok"  # 5 % above the median: below min_rise
    assert d.observe(2.3) == "spike"


def test_too_little_history_judges_nothing_and_the_state_round_trips():
    d = detector()
    for loss in [3.0, 3.0, 50.0]:
        assert d.observe(loss) == "ok"  # 2 losses of history < min_history 5
    saved = d.state_dict()
    e = detector()
    e.load_state_dict(saved)
    assert (e.history, e.streak) == (d.history, d.streak)


def test_the_history_is_the_window():
    d = detector(window=6, min_history=5)
    for i in range(20):
        d.observe(3.0 + 0.01 * i)
    assert len(d.history) == 6 and d.history[0] == pytest.approx(3.14)


# --- which checkpoint -----------------------------------------------------------------------------------


def save(run_dir, step, good=True):
    return save_checkpoint(
        run_dir, step, {"w": torch.full((4,), float(step))}, {"step": step, "good": good}, "model: {}\n"
    )


def test_latest_checkpoint_skips_corrupt_bad_and_later_ones(tmp_path):
    for step, good in [(10, True), (20, True), (30, False), (40, True)]:
        save(tmp_path, step, good)
    assert latest_checkpoint(tmp_path).name == "step_00000040"
    assert latest_checkpoint(tmp_path, good_only=True, before_step=35).name == "step_00000020"  # 30 was mid-spike
    with open(checkpoint_dir(tmp_path, 40) / "trainer.json", "a") as f:
        f.write(" ")  # one byte more than the manifest says
    with pytest.warns(UserWarning, match="corrupt"):
        assert latest_checkpoint(tmp_path).name == "step_00000030"
    found, corrupt = resume_point(tmp_path)
    assert found.name == "step_00000030" and [p.name for p, _ in corrupt] == ["step_00000040"]


def test_pruning_keeps_the_newest_and_always_the_newest_good_one(tmp_path):
    for step, good in [(10, True), (20, True), (30, False), (40, False)]:
        save(tmp_path, step, good)
    prune(tmp_path, keep=2)
    assert [p.name for p in list_checkpoints(tmp_path)] == ["step_00000020", "step_00000030", "step_00000040"]
    remove_after(tmp_path, 20)  # a rollback to 20 abandons what the spike wrote
    assert [p.name for p in list_checkpoints(tmp_path)] == ["step_00000020"]


def test_a_checkpoint_without_a_manifest_is_never_pruned_or_chosen(tmp_path):
    save(tmp_path, 10)
    save(tmp_path, 20)
    (checkpoint_dir(tmp_path, 20) / "manifest.json").unlink()  # as if copied by hand, half-way
    prune(tmp_path, keep=1)
    assert [p.name for p in list_checkpoints(tmp_path)] == ["step_00000010", "step_00000020"]
    with pytest.warns(UserWarning):
        assert latest_checkpoint(tmp_path).name == "step_00000010"


# --- the learning rate after a rollback -----------------------------------------------------------------


def test_a_rollback_scales_the_schedule_for_its_steps_then_it_returns():
    schedule = dict(total_steps=100, warmup=10, peak=1e-3, min_ratio=0.1, schedule="cosine", decay_fraction=0.2)
    st = TrainState(step=50, lr_scale=0.5, lr_scale_until=60)
    assert learning_rate(st.step, **schedule) * st.lr_multiplier() == pytest.approx(0.5 * learning_rate(50, **schedule))
    st.step = 60
    assert st.lr_multiplier() == 1.0
    restored = TrainState()
    restored.load_state_dict(TrainState(step=55, lr_scale=0.25, lr_scale_until=70).state_dict())
    assert restored.lr_multiplier() == 0.25  # survives a resume mid-way
