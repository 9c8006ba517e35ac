"""Nothing a user owns is lost: one trainer per run directory (a lock the OS releases when the process dies),
a resume that fails changes nothing, corrupt checkpoints are never restarted over or pruned, a fresh run never
appends to an old history, and a model too big for the machine is refused before it is allocated."""

import json
import os
import resource
import shutil
import socket
import subprocess
import sys

import pytest

from support import finished_run, kill_job, run_cli, run_here, start, tiny, wait_for_steps

torch = pytest.importorskip("torch")


def one_line(r, *words):
    """Exit 2 and one line on stderr holding each of `words`."""
    lines = r.stderr.strip().splitlines()
    assert r.returncode == 2 and len(lines) == 1, r.stderr
    for w in words:
        assert str(w) in lines[0], lines[0]
    return lines[0]


def snapshot(run_dir):
    """Every file of a run and its bytes (the lock file, rewritten by each process that takes it, aside)."""
    return {p: p.read_bytes() for p in sorted(run_dir.rglob("*")) if p.is_file() and p.name != ".lock"}


def flip_a_byte(checkpoint):
    shard = next((checkpoint / "state").glob("*.distcp"))
    data = bytearray(shard.read_bytes())
    data[len(data) // 2] ^= 0xFF  # the size stays right, the checksum does not
    shard.write_bytes(bytes(data))
    return bytes(data)


def steps_logged(run_dir):
    return [json.loads(x)["step"] for x in (run_dir / "metrics.jsonl").read_text().splitlines() if '"loss"' in x]


@pytest.fixture(scope="module")
def stopped(prepared, tmp_path_factory):
    """A run stopped after step 9: checkpoints of steps 0 (spike detection's), 4, 8 and 9."""
    run_dir = tmp_path_factory.mktemp("stopped") / "run"
    return finished_run(run_dir, *tiny(prepared, run_dir, "debug.stop_after_step=9", "run.keep_checkpoints=5"))


@pytest.fixture
def run_dir(stopped, tmp_path):
    """A copy of the stopped run for one test to damage."""
    return shutil.copytree(stopped, tmp_path / "run")


# --- item 1: one trainer per run directory ---------------------------------------------------------------


def test_a_second_trainer_is_refused_and_a_killed_one_leaves_no_lock(prepared, tmp_path):
    run_dir = tmp_path / "run"
    first = start(
        ["train", *tiny(prepared, run_dir, "train.max_steps=200", "debug.step_sleep=0.2", "run.checkpoint_every=4")]
    )
    try:
        wait_for_steps(run_dir, 5, first)
        before = steps_logged(run_dir)
        for args in (["--resume", run_dir], tiny(prepared, run_dir, "run.resume=auto")):
            r = run_cli("train", *args)
            one_line(r, f"PID {first.pid}", socket.gethostname(), run_dir)
        assert first.poll() is None  # the first one trains on
        first.kill()  # SIGKILL: no handler runs, only the OS can release the lock
        first.communicate(timeout=60)
    finally:
        if first.poll() is None:
            first.kill()
    assert len(steps_logged(run_dir)) >= len(before)
    r = run_cli("train", "--resume", run_dir, "train.max_steps=8", "train.schedule_restart=true", "debug.step_sleep=0")
    assert r.returncode == 0, r.stderr
    assert "resumed from" in r.stdout


def test_two_trainers_started_at_once_exactly_one_runs(prepared, tmp_path):
    run_dir = tmp_path / "run"
    args = ["train", *tiny(prepared, run_dir, "train.max_steps=6", "debug.step_sleep=0.3")]
    procs = [start(args), start(args)]
    results = [(p.pid, p.returncode, *p.communicate(timeout=300)) for p in procs]
    codes = sorted(p.returncode for p in procs)
    assert codes == [0, 2], [r[3] for r in results]
    (winner,) = [r for r in results if procs[results.index(r)].returncode == 0]
    (loser,) = [r for r in results if procs[results.index(r)].returncode == 2]
    (line,) = loser[3].strip().splitlines()
    assert f"PID {winner[0]}" in line
    assert steps_logged(run_dir) == [1, 2, 3, 4, 5, 6]  # one history, not two interleaved


def test_rank_0_of_a_torchrun_job_holds_the_lock(prepared, tmp_path):
    psutil = pytest.importorskip("psutil")
    run_dir = tmp_path / "run"
    cmd = [
        sys.executable,
        "-m",
        "torch.distributed.run",
        "--standalone",
        "--nproc-per-node=2",
        "-m",
        "pretrain",
        "train",
        *tiny(prepared, run_dir, "train.max_steps=200", "debug.step_sleep=0.2"),
    ]
    job = subprocess.Popen(
        cmd,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env={**os.environ, "PYTHONUNBUFFERED": "1"},
        start_new_session=True,
    )
    try:
        wait_for_steps(run_dir, 2, job)
        r = run_cli("train", "--resume", run_dir)
        line = one_line(r, "PID", socket.gethostname())
        holder = int(line.split("PID ")[1].split()[0])
        ranks = {p.pid: p.environ().get("RANK") for p in psutil.Process(job.pid).children(recursive=True)}
        assert ranks.get(holder) == "0", (holder, ranks)
    finally:
        kill_job(job)  # the launcher and both ranks (a killpg of the launcher left them training for 40 s)
    r = run_cli("train", "--resume", run_dir, "train.max_steps=4", "train.schedule_restart=true", "debug.step_sleep=0")
    assert r.returncode == 0, r.stderr


# --- item 4: a failed resume changes nothing ------------------------------------------------------------


@pytest.mark.parametrize(
    "overrides, key",
    [
        (["model.hidden_size=128"], "model.hidden_size"),
        (["model.family=gpt2", "model.num_kv_heads=4"], "model.family"),
        (["model.num_layers=3"], "model.num_layers"),
    ],
)
def test_a_resume_that_changes_the_model_is_one_line_and_changes_nothing(run_dir, overrides, key):
    before = snapshot(run_dir)
    r = run_here("train", "--resume", run_dir, *overrides)
    one_line(r, key, "step_00000009")
    assert snapshot(run_dir) == before  # config.yaml above all: a plain --resume must still work
    r = run_here("train", "--resume", run_dir, "debug.stop_after_step=10")
    assert r.returncode == 0, r.stderr
    assert "step 9" in r.stdout


def test_a_resume_may_change_what_leaves_the_tensors_alone(run_dir):
    r = run_here(
        "train", "--resume", run_dir, "model.max_seq_len=512", "model.dropout=0.1", "debug.stop_after_step=10"
    )  # a LLaMA has no position table: its context may grow
    assert r.returncode == 0, r.stderr
    assert "step 9" in r.stdout


# --- items 6 and 8: corrupt checkpoints are never trained over -----------------------------------------


def test_resume_with_every_checkpoint_corrupt_exits_2_and_changes_nothing(run_dir):
    checkpoints = sorted((run_dir / "checkpoints").iterdir())
    assert len(checkpoints) == 4
    for c in checkpoints:
        flip_a_byte(c)
    before = snapshot(run_dir)
    r = run_here("train", "--resume", run_dir)
    line = one_line(r, "corrupt", run_dir)
    assert "step 0" not in r.stdout and "starting from the beginning" not in r.stdout, line
    assert snapshot(run_dir) == before


def test_a_corrupt_checkpoint_is_set_aside_never_pruned_or_overwritten(run_dir):
    corrupt = flip_a_byte(run_dir / "checkpoints" / "step_00000009")
    # keep_checkpoints=1 prunes all but the newest; checkpoint_every=3 writes a step 9 of its own.
    r = run_here(
        "train",
        "--resume",
        run_dir,
        "train.max_steps=16",
        "train.schedule_restart=true",
        "run.keep_checkpoints=1",
        "run.checkpoint_every=3",
    )
    assert r.returncode == 0, r.stderr
    assert "step_00000009" in r.stderr and "corrupt" in r.stderr
    assert "resumed from" in r.stdout and "step 8" in r.stdout
    kept = [p for p in run_dir.rglob("*.distcp") if p.read_bytes() == corrupt]
    assert len(kept) == 1 and "step_00000009" in str(kept[0])


def test_a_missing_manifest_is_named_not_skipped_silently(run_dir):
    (run_dir / "checkpoints" / "step_00000009" / "manifest.json").unlink()
    r = run_here("train", "--resume", run_dir, "debug.stop_after_step=10")
    assert r.returncode == 0, r.stderr
    assert "step_00000009" in r.stderr and "manifest.json" in r.stderr
    assert "resumed from" in r.stdout and "step 8" in r.stdout


def test_an_empty_manifest_does_not_vouch_for_a_tampered_trainer_state(run_dir):
    step9 = run_dir / "checkpoints" / "step_00000009"
    (step9 / "manifest.json").write_text(json.dumps({"step": 9, "files": {}}))
    trainer = json.loads((step9 / "trainer.json").read_text())
    (step9 / "trainer.json").write_text(json.dumps({**trainer, "step": 7}))
    r = run_here("train", "--resume", run_dir, "debug.stop_after_step=10")
    assert r.returncode == 0, r.stderr
    assert "step_00000009" in r.stderr and "trainer.json" in r.stderr
    assert "resumed from" in r.stdout and "step 8" in r.stdout


def test_the_manifest_lists_every_file_the_format_requires(stopped):
    from pretrain.checkpoint.format import REQUIRED_FILES, list_checkpoints

    for c in list_checkpoints(stopped):
        listed = set(json.loads((c / "manifest.json").read_text())["files"])
        on_disk = {str(p.relative_to(c)) for p in c.rglob("*") if p.is_file() and p.name != "manifest.json"}
        assert listed == on_disk and set(REQUIRED_FILES) <= listed
        assert "state/.metadata" in listed and "rng_rank0.pt" in listed


def test_verify_names_an_unlisted_file_a_loader_reads_and_ignores_a_note(stopped, tmp_path):
    from pretrain.checkpoint.format import verify

    c = shutil.copytree(stopped / "checkpoints" / "step_00000008", tmp_path / "step_00000008")
    (c / "NOTES.txt").write_text("copied to the archive on Monday")
    assert verify(c) is None
    shutil.copy(c / "rng_rank0.pt", c / "rng_rank1.pt")  # rank 1 of a resume on two ranks would load it
    assert "rng_rank1.pt is not listed in manifest.json" == verify(c)


# --- item 10: a fresh run never appends to an old history -----------------------------------------------


def test_a_fresh_run_sets_an_old_history_aside(prepared, tmp_path):
    run_dir = tmp_path / "run"
    killed = start(
        [
            "train",
            *tiny(
                prepared,
                run_dir,
                "train.max_steps=200",
                "debug.step_sleep=0.2",
                "run.checkpoint_every=100",
                "stability.spike_detection=false",
            ),
        ]
    )
    wait_for_steps(run_dir, 3, killed)
    killed.kill()
    killed.communicate(timeout=60)
    old = (run_dir / "metrics.jsonl").read_bytes()
    assert not list((run_dir / "checkpoints").glob("step_*")) if (run_dir / "checkpoints").exists() else True
    r = run_cli("train", *tiny(prepared, run_dir, "train.max_steps=3"))
    assert r.returncode == 0, r.stderr
    assert steps_logged(run_dir) == [1, 2, 3]  # the new run's history only
    (aside,) = [p for p in run_dir.glob("*/metrics.jsonl")]
    assert aside.read_bytes() == old and aside.parent.name in r.stdout + r.stderr


# --- item 11: --resume A run.dir=B ------------------------------------------------------------------------


def test_resume_into_another_run_dir_is_refused(run_dir, tmp_path):
    other = tmp_path / "other"
    r = run_here("train", "--resume", run_dir, f"run.dir={other}")
    one_line(r, "run.dir", run_dir)
    assert not other.exists()


# --- item 14: stray entries in checkpoints/ --------------------------------------------------------------


def test_stray_entries_in_checkpoints_are_ignored_with_one_warning(run_dir):
    root = run_dir / "checkpoints"
    shutil.copytree(root / "step_00000004", root / "step_00000006_backup")
    (root / "step_00000099").mkdir()
    (root / "step_00000099" / "junk.bin").write_bytes(os.urandom(100))
    (root / "notes.txt").write_text("a user's note")
    r = run_here(
        "train", "--resume", run_dir, "train.max_steps=16", "train.schedule_restart=true", "run.keep_checkpoints=1"
    )
    assert r.returncode == 0, r.stderr
    assert "resumed from" in r.stdout and "step 9" in r.stdout
    stray = [x for x in r.stderr.splitlines() if "step_00000006_backup" in x]
    assert len(stray) == 1 and "notes.txt" in stray[0]
    assert (root / "step_00000006_backup").is_dir() and (root / "notes.txt").is_file()  # not pruned
    assert any("step_00000099" in x for x in r.stderr.splitlines())


# --- item 15: a model too big for the machine -------------------------------------------------------------


def test_a_model_too_big_for_the_host_is_refused_before_it_is_allocated(prepared, tmp_path):
    """The default config (6.7B parameters, ~100 GiB planned for AdamW in fp32) on a CPU. The address
    space is capped at 8 GiB so that code which does allocate fails here instead of swapping the machine."""

    def cap():
        resource.setrlimit(resource.RLIMIT_AS, (8 << 30, 8 << 30))

    run = tmp_path / "run"
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    r = subprocess.run(
        [sys.executable, "-m", "pretrain", "train", f"data.dir={prepared}", "train.device=cpu", f"run.dir={run}"],
        capture_output=True,
        text=True,
        env=env,
        preexec_fn=cap,
        timeout=300,
    )
    one_line(r, "GiB", "plan")
    assert not run.exists()


# --- item 21: an empty run config ----------------------------------------------------------------------------


@pytest.mark.parametrize("text", ["", "{}\n", "[not, a, mapping]\n", "model: {hidden_size: [\n"])
def test_a_broken_run_config_names_the_file_and_the_copy_to_recover_from(run_dir, text):
    (run_dir / "config.yaml").write_text(text)
    r = run_here("train", "--resume", run_dir)
    one_line(r, run_dir / "config.yaml", "step_00000009/config.yaml")
