"""Every reader of a checkpoint verifies it the same way: `pretrain export`, `pretrain generate` and
`pretrain.load_model` given one checkpoint directory refuse it in one line when a file fails its checksum,
as they do given the run directory; stray entries in checkpoints/ are ignored with one warning."""

import json
import shutil

import pytest

from support import run_cli, run_here

torch = pytest.importorskip("torch")


@pytest.fixture
def run_dir(trained, tmp_path):
    return shutil.copytree(trained, tmp_path / "run")


def corrupt(checkpoint):
    shard = next((checkpoint / "state").glob("*.distcp"))
    data = bytearray(shard.read_bytes())
    data[len(data) // 2] ^= 0xFF
    shard.write_bytes(bytes(data))


def readers(step, out):
    """The command lines of every CLI reader of one checkpoint."""
    return [["export", step, "--to", "hf", out], ["generate", step, "--prompt", "The", "--max-new-tokens", "2"]]


@pytest.mark.parametrize(
    "damage, words",
    [
        ("shard", ["state/", "sha256"]),
        ("no manifest", ["manifest.json"]),
        ("empty manifest", ["manifest.json", "trainer.json"]),
    ],
)
def test_a_named_checkpoint_that_fails_verification_is_refused(run_dir, tmp_path, damage, words):
    from pretrain import load_model
    from pretrain.errors import UsageError

    step = run_dir / "checkpoints" / "step_00000003"
    if damage == "shard":
        corrupt(step)
    elif damage == "no manifest":
        (step / "manifest.json").unlink()
    else:
        (step / "manifest.json").write_text(json.dumps({"step": 3, "files": {}}))
    for args in readers(step, tmp_path / "hf"):
        r = run_here(*args)
        (line,) = r.stderr.strip().splitlines()
        assert r.returncode == 2 and "step_00000003" in line and all(w in line for w in words), r.stderr
    assert not (tmp_path / "hf").exists()
    with pytest.raises(UsageError, match="step_00000003"):
        load_model(step)
    assert load_model(run_dir) is not None  # the run's newest checkpoint is intact


def test_a_run_whose_every_checkpoint_is_corrupt_is_one_line(run_dir, tmp_path):
    for step in (run_dir / "checkpoints").iterdir():
        corrupt(step)
    for args in readers(run_dir, tmp_path / "hf"):
        r = run_here(*args)
        assert r.returncode == 2 and "corrupt" in r.stderr.strip().splitlines()[-1], r.stderr


def test_stray_entries_are_ignored_by_export_and_generate(run_dir, tmp_path):
    root = run_dir / "checkpoints"
    shutil.copytree(root / "step_00000006", root / "step_00000006_backup")
    (root / "notes.txt").write_text("a user's note")
    for args in readers(run_dir, tmp_path / "hf"):
        r = run_cli(*args)
        assert r.returncode == 0, r.stderr
        assert sum("step_00000006_backup" in x for x in r.stderr.splitlines()) == 1, r.stderr
    assert (tmp_path / "hf" / "model.safetensors").is_file()
