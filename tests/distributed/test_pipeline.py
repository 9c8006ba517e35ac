"""Pipeline parallelism under a real torchrun on the CPU (gloo): 2 and 4 stages, with and without data
parallelism (ZeRO-0 and ZeRO-1 per stage), train the same model as one process with the same global batch,
evaluate the same validation loss, and write checkpoints that resume at pp=2 and in one plain process."""

import json
import subprocess

import pytest

from support import finished_run, finished_torchrun, params, run_here, same_task_rows, torchrun, write_mc_task

torch = pytest.importorskip("torch")


def settings(prepared, run_dir, micro_batch, *extra):
    return [
        "model.preset=debug",
        "model.vocab_size=515",
        "model.intermediate_size=175",
        "train.seq_len=32",
        f"train.micro_batch_size={micro_batch}",
        "train.grad_accum_steps=4",
        "train.precision=fp32",
        "train.device=cpu",
        "train.lr=3e-3",
        "train.warmup=1",
        "train.max_steps=10",
        f"data.dir={prepared}",
        f"run.dir={run_dir}",
        "run.log_every=1",
        "run.eval_every=5",
        "run.eval_batches=2",
        "run.checkpoint_every=5",
        "run.progress=false",
        "hardware.peak_tflops=0.05",
        # every rank asserts it holds exactly the planner's bytes for its stage and data-parallel rank
        "debug.check_sharding=true",
        *extra,
    ]


def records(run_dir):
    """{(step, "loss" | "val_loss"): value} of a run's metrics."""
    out = {}
    for row in map(json.loads, (run_dir / "metrics.jsonl").read_text().splitlines()):
        for key in ("loss", "val_loss"):
            if key in row:
                out[row["step"], key] = row[key]
    return out


def same_run(a_dir, b_dir, rel=1e-4, atol=3e-5):
    a, b = records(a_dir), records(b_dir)
    assert a.keys() == b.keys()
    assert all(b[k] == pytest.approx(a[k], rel=rel) for k in a), (a, b)
    pa, pb = params(a_dir), params(b_dir)
    for k in pa:  # see test_torchrun.py for AdamW's rounding on near-zero gradients
        torch.testing.assert_close(pb[k], pa[k], rtol=1e-5, atol=atol)


@pytest.fixture(scope="module")
def mc_task(tmp_path_factory):
    """A local downstream task for run.eval_tasks (at steps 5 and 10): the stages of a pipeline score the same
    examples together, the data ranks split them (9 examples: 5 and 4)."""
    path = write_mc_task(tmp_path_factory.mktemp("mc") / "mc.jsonl", examples=9)
    return ["run.eval_tasks_every=5", f"run.eval_tasks=[{path}]"]


@pytest.fixture(scope="module")
def single(prepared, mc_task, tmp_path_factory):
    """One process, micro-batch 8: the global batch of (pp=2, dp=1) x 8 and (pp=2, dp=2) x 4."""
    run_dir = tmp_path_factory.mktemp("single") / "run"
    return finished_run(run_dir, *settings(prepared, run_dir, 8, *mc_task))


@pytest.fixture(scope="module")
def two_stages(prepared, mc_task, tmp_path_factory):
    run_dir = tmp_path_factory.mktemp("pp2") / "run"
    finished_torchrun(*settings(prepared, run_dir, 8, "parallel.pipeline=2", *mc_task), nproc=2)
    return run_dir


def test_two_stages_match_one_process(single, two_stages):
    # The logged loss is the last stage's, the same on every rank; the validation loss runs forward
    # through both stages. Each stage saved its own tensors: together they load as the whole model.
    same_run(single, two_stages)
    # run.eval_tasks: the task's batches go through the validation loss's forward-only schedule, padded to
    # its shape (8 x 32), and the last stage scores them
    same_task_rows(single, two_stages, steps=[5, 10])
    shards = list((two_stages / "checkpoints" / "step_00000010" / "state").glob("*.distcp"))
    assert len(shards) == 2


def test_export_works_from_a_pipeline_checkpoint(two_stages, tmp_path):
    r = run_here("export", two_stages, "--to", "hf", tmp_path / "hf")
    assert r.returncode == 0, r.stderr
    assert (tmp_path / "hf" / "config.json").is_file()


@pytest.mark.parametrize("zero_stage", [0, 1])
def test_two_stages_times_two_data_parallel_match_one_process(prepared, single, mc_task, tmp_path, zero_stage):
    run_dir = tmp_path / "run"
    finished_torchrun(
        *settings(prepared, run_dir, 4, "parallel.pipeline=2", f"parallel.zero_stage={zero_stage}", *mc_task),
        nproc=4,
    )
    same_run(single, run_dir)
    same_task_rows(single, run_dir, steps=[5, 10])  # each pipeline scored its data rank's examples


def test_four_stages_match_one_process(prepared, tmp_path):
    deep = ("model.num_layers=4",)
    one, four = tmp_path / "one", tmp_path / "four"
    r = run_here("train", *settings(prepared, one, 8, *deep))
    assert r.returncode == 0, r.stderr
    finished_torchrun(*settings(prepared, four, 8, *deep, "parallel.pipeline=4"), nproc=4)
    same_run(one, four)


def test_a_pipeline_checkpoint_resumes_at_two_stages_and_in_one_process(prepared, single, two_stages, tmp_path):
    stopped = tmp_path / "stopped"
    finished_torchrun(*settings(prepared, stopped, 8, "parallel.pipeline=2", "debug.stop_after_step=5"), nproc=2)
    (tmp_path / "copy").mkdir()
    one = tmp_path / "copy" / "run"
    subprocess.run(["cp", "-r", str(stopped), str(one)], check=True)

    finished_torchrun("--resume", stopped, "debug.stop_after_step=0", nproc=2)
    a, b = params(two_stages), params(stopped)
    assert all(torch.equal(a[k], b[k]) for k in a)  # same ranks, same order of operations: bitwise

    r = run_here("train", "--resume", one, "debug.stop_after_step=0", "parallel.pipeline=1")
    assert r.returncode == 0, r.stderr
    assert "resumed from" in r.stdout
    la, lb = records(single), records(one)
    assert all(lb[k] == pytest.approx(la[k], rel=1e-5) for k in la if k[0] > 5)


def test_a_batch_ramp_and_a_short_validation_batch_match_one_process(prepared, tmp_path):
    # The ramp's first steps have 1 micro-batch for 2 stages (GPipe's order runs them), then more (1F1B);
    # the whole validation split is read, its last batch shorter than the others (each shape its schedule).
    ramp = ("train.batch_ramp_tokens=4000", "train.batch_ramp_start=256", "run.eval_batches=1000")
    one, two = tmp_path / "one", tmp_path / "two"
    r = run_here("train", *settings(prepared, one, 8, *ramp))
    assert r.returncode == 0, r.stderr
    finished_torchrun(*settings(prepared, two, 8, *ramp, "parallel.pipeline=2"), nproc=2)
    batches = [
        json.loads(x)["batch_tokens"] for x in (two / "metrics.jsonl").read_text().splitlines() if '"batch_tokens"' in x
    ]
    assert batches[0] == 256 and batches[-1] >= 512  # 1 micro-batch of 8 x 32 tokens, then 2 or more
    same_run(one, two)


def test_a_tied_embedding_is_refused_in_one_line(prepared, tmp_path):
    r = torchrun(*settings(prepared, tmp_path / "run", 8, "parallel.pipeline=2", "model.tie_embeddings=true"), nproc=2)
    assert r.returncode != 0
    assert "pretrain train: error: parallel.pipeline: a tied embedding" in r.stderr


def test_interleaved_1f1b_matches_one_process(prepared, tmp_path):
    # 4 layers on 2 ranks of 2 chunks (rank 0: layers 0 and 2, rank 1: 1 and 3). Under a batch ramp the
    # step's micro-batches go from 1 up: interleaved 1F1B runs the counts it takes (m % max(1, m // p) == 0),
    # looped BFS the others, and both give the one-process losses.
    extra = ("model.num_layers=4", "train.batch_ramp_tokens=4000", "train.batch_ramp_start=256")
    one, two = tmp_path / "one", tmp_path / "two"
    r = run_here("train", *settings(prepared, one, 8, *extra))
    assert r.returncode == 0, r.stderr
    r = torchrun(
        *settings(prepared, two, 8, *extra, "parallel.pipeline=2", "parallel.pipeline_schedule=interleaved_1f1b"),
        nproc=2,
    )
    assert r.returncode == 0, r.stderr[-3000:]
    accums = {
        json.loads(x)["batch_tokens"] // 256
        for x in (two / "metrics.jsonl").read_text().splitlines()
        if '"batch_tokens"' in x
    }
    assert {1, 2, 3} <= accums  # looped BFS (fewer micro-batches than ranks), then interleaved 1F1B
    same_run(one, two)
