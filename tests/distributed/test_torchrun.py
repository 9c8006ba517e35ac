"""Data parallelism under a real torchrun on the CPU (gloo, 2 processes): DDP and ZeRO 1-3 train the same
model as one process with the same global batch, hold per rank exactly what the planner predicts, save
sharded checkpoints that resume on 1 or 2 ranks, and stop together on one rank's SIGTERM."""

import json
import os
import signal
import subprocess
import time

import pytest

from support import (
    finished_run,
    finished_torchrun,
    losses,
    needs_compiler,
    params,
    run_here,
    task_rows,
    torchrun,
    write_mc_task,
)

torch = pytest.importorskip("torch")
pytest.importorskip("psutil")

from pretrain.distributed.parallelize import FSDP_CPU_TORCH  # noqa: E402
from pretrain.plan.kernels import torch_version_tuple  # noqa: E402

OLD_TORCH = torch_version_tuple(torch.__version__) < FSDP_CPU_TORCH
needs_cpu_fsdp = pytest.mark.skipif(OLD_TORCH, reason=f"FSDP2 on CPUs needs torch >= 2.9 ({torch.__version__})")


def settings(prepared, run_dir, micro_batch, *extra):
    return [
        "model.preset=debug",
        "model.vocab_size=515",
        "model.intermediate_size=175",  # odd: uneven shards
        "train.seq_len=32",
        f"train.micro_batch_size={micro_batch}",
        "train.grad_accum_steps=2",
        "train.precision=fp32",
        "train.device=cpu",
        "train.lr=3e-3",
        "train.warmup=1",
        "train.max_steps=6",
        f"data.dir={prepared}",
        f"run.dir={run_dir}",
        "run.log_every=1",
        "run.eval_every=0",
        "run.eval_batches=2",
        "run.checkpoint_every=3",
        "run.progress=false",
        "hardware.peak_tflops=0.05",
        *extra,
    ]


@pytest.fixture(scope="module")
def mc_task(tmp_path_factory):
    """A local downstream task for run.eval_tasks (every 3 steps): data parallel ranks split its examples. Nine
    examples: at micro-batch 4, rank 0 scores 13 requests in 4 batches, rank 1 11 in 3 (FSDP's ranks must still
    run as many forwards)."""
    path = write_mc_task(tmp_path_factory.mktemp("mc") / "mc.jsonl", examples=9)
    return ["run.eval_tasks_every=3", f"run.eval_tasks=[{path}]"]


@pytest.fixture(scope="module")
def single(prepared, mc_task, tmp_path_factory):
    """One process, micro-batch 8: the same global batch as 2 ranks x micro-batch 4."""
    run_dir = tmp_path_factory.mktemp("single") / "run"
    return finished_run(run_dir, *settings(prepared, run_dir, 8, *mc_task))


@pytest.mark.parametrize("stage", [0, 1, pytest.param(2, marks=needs_cpu_fsdp), pytest.param(3, marks=needs_cpu_fsdp)])
def test_data_parallel_matches_one_process(prepared, single, mc_task, tmp_path, stage):
    run_dir = tmp_path / "run"
    # debug.check_sharding: every rank asserts it holds exactly the planner's per-rank model-state bytes.
    finished_torchrun(
        *settings(prepared, run_dir, 4, f"parallel.zero_stage={stage}", "debug.check_sharding=true", *mc_task)
    )
    # The logged loss is the global batch's mean: it equals the single process's (fp32 reduction order
    # differs, hence a tolerance of 1e-5 relative; parameters after 6 AdamW steps within 3e-5 absolute:
    # AdamW divides each gradient element by its own running RMS, so an element whose gradient is nearly
    # zero moves by a good part of lr = 3e-3 on rounding alone; measured 8.9e-6 with the plain loss, 1.6e-5
    # with the chunked one, both on one element of blocks.0.mlp.up.weight, whose fp32 gradients are equally
    # close to fp64's: 3.0e-7 relative).
    a, b = losses(single), losses(run_dir)
    assert a.keys() == b.keys()
    assert all(b[k] == pytest.approx(a[k], rel=1e-5) for k in a)
    pa, pb = params(single), params(run_dir)
    for k in pa:
        torch.testing.assert_close(pb[k], pa[k], rtol=1e-5, atol=3e-5)
    report = json.loads((run_dir / "plan_vs_run.json").read_text())
    rows = {x["name"]: x for x in report["rows"]}
    for name in ("parameters", "gradients", "optimizer_states"):
        assert rows[name]["planned"] == rows[name]["measured"]
    # run.eval_tasks: each rank scored half of the examples; the reduced metrics are the single process's
    a, b = task_rows(single), task_rows(run_dir)
    assert list(a) == list(b) == [3, 6]
    for step in a:
        assert a[step] == pytest.approx(b[step], rel=1e-5)


def test_activations_under_ddp_with_full_recomputation_match_the_plan(prepared, tmp_path):
    # The meter sees the DDP wrapper, not our model: the recomputed block it must add is the wrapped one's.
    run_dir = tmp_path / "run"
    finished_torchrun(*settings(prepared, run_dir, 4, "parallel.zero_stage=0", "train.activation_checkpointing=full"))
    rows = {x["name"]: x for x in json.loads((run_dir / "plan_vs_run.json").read_text())["rows"]}
    assert rows["activations"]["measured"] == rows["activations"]["planned"]


@needs_cpu_fsdp
@needs_compiler
def test_fsdp_compiles_block_by_block_without_graph_breaks(prepared, single, tmp_path, monkeypatch):
    """ZeRO-3 with train.compile: each block compiled before sharding (FSDP2's hooks stay outside the graphs;
    a whole-model compile falls back to eager at them). Same losses as one eager process."""
    monkeypatch.setenv("TORCH_LOGS", "graph_breaks")
    run_dir = tmp_path / "run"
    r = finished_torchrun(*settings(prepared, run_dir, 4, "parallel.zero_stage=3", "train.compile=true"))
    assert "Graph break" not in r.stderr
    a, b = losses(single), losses(run_dir)
    assert b[1] == pytest.approx(a[1], rel=1e-5)
    assert all(b[k] == pytest.approx(a[k], rel=2e-3) for k in a)  # see test_compiled_step_trains_like_eager


# Imported first by every Python process (PYTHONPATH): each rank's process lists the checkpoint files it opens
# for reading, through Python's audit hook on open() (https://peps.python.org/pep-0578/).
OPENED_FILES = """
import os, sys

def _audit(event, args):
    if event == "open" and isinstance(args[0], str) and "/checkpoints/" in args[0] and isinstance(args[1], str) \\
            and "r" in args[1] and "+" not in args[1]:
        with open(os.path.join(os.environ["OPENED_FILES_DIR"], f"rank{os.environ['RANK']}.txt"), "a") as f:
            f.write(args[0] + "\\n")

if "RANK" in os.environ:
    sys.addaudithook(_audit)
"""


@needs_cpu_fsdp
def test_sharded_checkpoint_resumes_on_one_and_two_ranks(prepared, tmp_path, monkeypatch):
    from pretrain.checkpoint.format import _files, checkpoint_dir, checksums

    opened = tmp_path / "opened"
    opened.mkdir()
    (opened / "sitecustomize.py").write_text(OPENED_FILES)
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join([str(opened), *filter(None, [os.environ.get("PYTHONPATH")])]))
    monkeypatch.setenv("OPENED_FILES_DIR", str(opened))
    straight = tmp_path / "straight"
    finished_torchrun(*settings(prepared, straight, 4, "parallel.zero_stage=3"))
    monkeypatch.undo()
    checkpoint = checkpoint_dir(straight, 3)
    shards = list((checkpoint / "state").glob("*.distcp"))
    assert len(shards) == 2  # one file per rank: the checkpoint is sharded
    # The manifest the ranks hashed together is the one a single hasher of every file makes ...
    manifest = json.loads((checkpoint / "manifest.json").read_text())["files"]
    assert manifest == checksums(checkpoint, _files(checkpoint))
    # ... and each rank read only its own files to hash them: rank 0 never rank 1's.
    read = {r: (opened / f"rank{r}.txt").read_text().splitlines() for r in (0, 1)}
    step = str(checkpoint.name)
    assert any(f"{step}.tmp/state/__1_0.distcp" in f for f in read[1])
    assert any(f"{step}.tmp/rng_rank1.pt" in f for f in read[1])
    assert not [f for f in read[0] if "__1_" in f or "rng_rank1" in f], read[0]
    assert not [f for f in read[1] if "__0_" in f or "rng_rank0" in f or ".metadata" in f], read[1]

    # One job stopped after its step-3 checkpoint, resumed on 2 ranks and (a copy of it) on one process.
    two, one = tmp_path / "two", tmp_path / "one"
    finished_torchrun(*settings(prepared, two, 4, "parallel.zero_stage=3", "debug.stop_after_step=3"))
    subprocess.run(["cp", "-r", two, one], check=True)
    finished_torchrun("--resume", two, "debug.stop_after_step=0")
    a, b = params(straight), params(two)
    assert all(torch.equal(a[k], b[k]) for k in a)  # same ranks, same order of operations: bitwise

    r = run_here("train", "--resume", one, "debug.stop_after_step=0", "train.micro_batch_size=8")
    assert r.returncode == 0, r.stderr
    assert "resumed from" in r.stdout
    la, lb = losses(straight), losses(one)
    assert all(lb[k] == pytest.approx(la[k], rel=1e-5) for k in (4, 5, 6))
    a, b = params(straight), params(one)
    for k in a:
        torch.testing.assert_close(b[k], a[k], rtol=1e-5, atol=1e-5)


def test_one_ranks_sigterm_stops_the_whole_job(prepared, tmp_path):
    import psutil

    from pretrain.checkpoint.format import list_checkpoints

    run_dir = tmp_path / "run"
    proc = torchrun(*settings(prepared, run_dir, 4, "train.max_steps=200", "debug.step_sleep=0.2"), wait=False)
    deadline = time.time() + 120
    while time.time() < deadline:
        path = run_dir / "metrics.jsonl"
        if path.exists() and len(path.read_text().splitlines()) >= 2:
            break
        time.sleep(0.1)
    workers = [c for c in psutil.Process(proc.pid).children(recursive=True) if "pretrain" in " ".join(c.cmdline())]
    assert len(workers) == 2
    os.kill(workers[-1].pid, signal.SIGTERM)  # only one rank is told
    out, err = proc.communicate(timeout=120)
    assert proc.returncode == 0, err[-3000:]
    assert "resume with: pretrain train --resume" in out
    step = int(list_checkpoints(run_dir)[-1].name.split("_")[1])
    assert 2 <= step < 200


def test_ranks_agree_on_a_rollback(prepared, tmp_path):
    """A NaN on one micro-batch of the data stream (every rank reads its share of it): the global loss is
    NaN on every rank, so all roll back together to the same checkpoint and skip the same data."""
    run_dir = tmp_path / "run"
    finished_torchrun(
        *settings(
            prepared,
            run_dir,
            4,
            "parallel.zero_stage=1",
            "train.max_steps=8",
            "run.checkpoint_every=2",
            "debug.inject_nan_batches=[8]",
        )
    )
    events = [json.loads(x) for x in (run_dir / "events.jsonl").read_text().splitlines()]
    (rollback,) = [e for e in events if e["event"] == "rollback"]
    assert (rollback["step"], rollback["to_step"]) == (5, 4)
    assert losses(run_dir)[8] == losses(run_dir)[8]  # finished with a finite loss


@needs_cpu_fsdp
def test_ranks_skip_an_overflow_in_one_ranks_shard_alike(prepared, tmp_path):
    """fp16 with a loss scaler under FSDP: at step 3 rank 0's gradient of one embedding row becomes inf (the
    loss stays finite), and after the reduce-scatter only the rank holding that row's shard sees it. Both
    ranks must skip that step and lower their scale alike (the scaler's flag is reduced over the mesh), or
    their shards drift apart: each rank's AdamW step count and loss scale are what it applied."""
    run_dir = tmp_path / "run"
    finished_torchrun(
        *settings(
            prepared,
            run_dir,
            4,
            "parallel.zero_stage=3",
            "train.precision=fp16-mixed",
            "debug.inject_inf_grad_batches=[4]",
        )
    )
    events = [json.loads(x) for x in (run_dir / "events.jsonl").read_text().splitlines()]
    assert [e["step"] for e in events if e["event"] == "nonfinite_skip"] == [3]
    ranks = [json.loads((run_dir / f"faults.rank{r}.json").read_text()) for r in range(2)]
    # 6 steps, 1 skipped; GradScaler starts at 2^16 and halves once (it grows only after 2000 good steps).
    assert ranks[0] == ranks[1] == {"optimizer_steps": [5], "loss_scale": 2.0**15}


@pytest.mark.skipif(not OLD_TORCH, reason="this torch runs FSDP2 on CPUs")
def test_fsdp_on_cpus_with_an_old_torch_is_refused_in_one_line(prepared, tmp_path):
    r = torchrun(*settings(prepared, tmp_path / "run", 4, "parallel.zero_stage=3"))
    assert r.returncode != 0
    assert "pretrain train: error: parallel.zero_stage: FSDP (stages 2 and 3) on CPUs needs torch >= 2.9" in r.stderr


def test_a_bad_config_is_said_once_not_once_per_rank(tmp_path):
    # Every rank reads the same config and fails the same way; the user reads the line once.
    r = torchrun(
        "model.preset=debug",
        f"data.dir={tmp_path / 'absent'}",
        f"run.dir={tmp_path / 'run'}",
        "train.device=cpu",
        nproc=2,
    )
    assert r.returncode != 0
    lines = [x for x in r.stderr.splitlines() if x.startswith("pretrain train: error:")]
    assert len(lines) == 1 and "absent: no meta.json" in lines[0], r.stderr[-2000:]


def test_a_global_batch_stays_the_same_on_two_ranks(prepared, single, tmp_path):
    # train.global_batch_tokens=512 is the single process's batch (micro-batch 8 x 2 steps x 32 tokens); on 2
    # ranks at micro-batch 2 the trainer derives 4 accumulation steps itself (2 x 32 x 2 ranks x 4 = 512).
    run_dir = tmp_path / "run"
    finished_torchrun(*settings(prepared, run_dir, 2, "train.global_batch_tokens=512", "train.grad_accum_steps=1"))
    a, b = losses(single), losses(run_dir)
    assert a.keys() == b.keys() and all(b[k] == pytest.approx(a[k], rel=1e-5) for k in a)
    train = [json.loads(x) for x in (run_dir / "metrics.jsonl").read_text().splitlines() if '"loss"' in x]
    assert {r["batch_tokens"] for r in train} == {512}


def test_a_layout_for_more_processes_than_torchrun_started_says_to_change_nproc(prepared, tmp_path):
    r = torchrun(*settings(prepared, tmp_path / "run", 4, "model.num_layers=4", "parallel.pipeline=4"))
    assert r.returncode != 0
    assert (
        "pretrain train: error: parallel.tensor x parallel.pipeline = 1 x 4 = 4 ranks per model replica do not "
        "divide the 2 processes torchrun started: change --nproc-per-node so that they are a multiple of 4"
    ) in r.stderr
