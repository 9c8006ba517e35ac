"""Exact resume: a run stopped and resumed ends with bitwise the same parameters and the same losses as one
that never stopped; a corrupt checkpoint is skipped for the one before it."""

import pytest

from support import finished_run, losses, params, run_here, tiny

torch = pytest.importorskip("torch")


@pytest.fixture(scope="module")
def uninterrupted(prepared, tmp_path_factory):
    run_dir = tmp_path_factory.mktemp("straight") / "run"
    return finished_run(run_dir, *tiny(prepared, run_dir))


def assert_same_run(a, b):
    assert losses(a) == losses(b)
    pa, pb = params(a), params(b)
    assert pa.keys() == pb.keys()
    assert all(torch.equal(pa[k], pb[k]) for k in pa)


def test_stop_and_resume_is_bitwise_identical(prepared, uninterrupted, tmp_path):
    run_dir = tmp_path / "run"
    first = run_here("train", *tiny(prepared, run_dir, "debug.stop_after_step=5"))
    assert first.returncode == 0, first.stderr
    assert "resume with: pretrain train --resume" in first.stdout
    second = run_here("train", "--resume", run_dir, "debug.stop_after_step=0")
    assert second.returncode == 0, second.stderr
    assert "resumed from" in second.stdout and "step 5" in second.stdout
    assert_same_run(uninterrupted, run_dir)


def test_corrupt_checkpoint_falls_back_to_the_previous_one(prepared, uninterrupted, tmp_path):
    from pretrain.checkpoint.format import list_checkpoints

    run_dir = tmp_path / "run"
    assert run_here("train", *tiny(prepared, run_dir, "debug.stop_after_step=9")).returncode == 0
    newest = list_checkpoints(run_dir)[-1]
    assert newest.name == "step_00000009"
    shard = next((newest / "state").glob("*.distcp"))
    data = bytearray(shard.read_bytes())
    data[len(data) // 2] ^= 0xFF  # one flipped byte: the size is right, the checksum is not
    shard.write_bytes(bytes(data))
    r = run_here("train", "--resume", run_dir, "debug.stop_after_step=0")
    assert r.returncode == 0, r.stderr
    assert "corrupt" in r.stderr and "step_00000009" in r.stderr
    assert "resumed from" in r.stdout and "step 8" in r.stdout
    assert_same_run(uninterrupted, run_dir)


def test_resume_without_a_checkpoint_starts_over_with_a_warning(prepared, tmp_path):
    run_dir = tmp_path / "run"
    r = run_here(
        "train",
        *tiny(
            prepared,
            run_dir,
            "run.resume=auto",
            "train.max_steps=3",
            "stability.spike_detection=false",
            "run.checkpoint_every=0",
        ),
    )
    assert r.returncode == 0, r.stderr
    assert "no complete checkpoint" in r.stdout
