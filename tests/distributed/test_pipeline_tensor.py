"""Pipeline x tensor parallelism under a real torchrun on the CPU (gloo): 2 stages, each split over 2 tensor
ranks (with and without sequence parallelism, and with 2 data-parallel replicas on 8 ranks, ZeRO 0 and 1), train the
tiny LLaMA as one process with the same global batch
does, every rank holds exactly the planner's bytes for its (stage, tensor rank), and the checkpoint is the
single-process one: it resumes in one process and exports."""

import json

import pytest

from support import (
    exported_tensors,
    finished_run,
    finished_torchrun,
    losses,
    params,
    per_rank_reports,
    run_here,
    same_task_rows,
    write_mc_task,
)

torch = pytest.importorskip("torch")

STEPS = 10


def settings(prepared, run_dir, *extra):
    # The debug preset's 4 heads / 2 k/v heads split over 2 tensor ranks; an odd vocabulary padded to 518
    # rows, 259 per tensor rank; 4 micro-batches of 8 for 2 stages: 1F1B's steady state runs.
    return [
        "model.preset=debug",
        "model.vocab_size=517",
        "model.pad_vocab_to=2",
        "train.seq_len=32",
        "train.micro_batch_size=8",
        "train.grad_accum_steps=4",
        "train.precision=fp32",
        "train.device=cpu",
        "train.optimizer=adamw",
        "train.lr=3e-3",
        "train.warmup=1",
        f"train.max_steps={STEPS}",
        f"data.dir={prepared}",
        f"run.dir={run_dir}",
        "run.log_every=1",
        "run.eval_every=5",
        "run.eval_batches=2",
        "run.checkpoint_every=5",
        "run.progress=false",
        "hardware.peak_tflops=0.05",
        *extra,
    ]


def val_losses(run_dir) -> dict:
    rows = map(json.loads, (run_dir / "metrics.jsonl").read_text().splitlines())
    return {r["step"]: r["val_loss"] for r in rows if "val_loss" in r}


def assert_same_run(reference, run_dir, steps=range(1, STEPS + 1)):
    # Column- and row-split matmuls and the all-reduces sum in other orders than one process: the issue's
    # relative 1e-4 (measured: equal to the 4 printed decimals).
    a, b = losses(reference), losses(run_dir)
    assert set(steps) <= b.keys() <= a.keys()
    assert all(b[k] == pytest.approx(a[k], rel=1e-4) for k in steps), (a, b)
    va, vb = val_losses(reference), val_losses(run_dir)
    assert all(vb[k] == pytest.approx(va[k], rel=1e-4) for k in vb if k in steps)


@pytest.fixture(scope="module")
def mc_task(tmp_path_factory):
    """A local downstream task for run.eval_tasks (at steps 5 and 10), scored by every rank of the pipeline's
    grid together: the last stage's tensor ranks each gather the whole logits."""
    path = write_mc_task(tmp_path_factory.mktemp("mc") / "mc.jsonl", examples=9)
    return ["run.eval_tasks_every=5", f"run.eval_tasks=[{path}]"]


@pytest.fixture(scope="module")
def single(prepared, mc_task, tmp_path_factory):
    """One process: the global batch of (pipeline 2 x tensor 2), whose one data-parallel rank reads 4 x 8."""
    run_dir = tmp_path_factory.mktemp("single") / "run"
    return finished_run(run_dir, *settings(prepared, run_dir, *mc_task))


@pytest.fixture(scope="module")
def grid(prepared, mc_task, tmp_path_factory):
    """(pipeline 2, tensor 2) on 4 ranks, scoring the task in the loop; every rank asserts it holds the
    planner's bytes for its place."""
    run_dir = tmp_path_factory.mktemp("grid") / "run"
    finished_torchrun(
        *settings(
            prepared,
            run_dir,
            "parallel.pipeline=2",
            "parallel.tensor=2",
            "debug.check_sharding=true",
            "debug.plan_vs_run_per_rank=true",
            *mc_task,
        ),
        nproc=4,
    )
    return run_dir


def test_two_stages_of_two_tensor_ranks_train_as_one_process(single, grid):
    assert_same_run(single, grid)
    same_task_rows(single, grid, steps=[5, 10])
    # Each (stage, tensor rank) saved its part; the checkpoint reads back as the single-process model,
    # fused q|k|v and gate|up rows in their own order.
    pa, pb = params(single), params(grid)
    assert pa.keys() == pb.keys()
    for k in pa:  # AdamW's rounding on near-zero gradients, as tests/distributed/test_torchrun.py allows
        torch.testing.assert_close(pb[k], pa[k], rtol=1e-5, atol=3e-5)


def test_every_rank_holds_its_stage_and_tensor_rank_share_as_planned(grid):
    # Ranks numbered tensor fastest, then data, then pipeline (distributed/mesh.py).
    reports = per_rank_reports(grid, 4)
    assert [(place["pipeline"], place["tensor"]) for place, _ in reports] == [(0, 0), (0, 1), (1, 0), (1, 1)]
    held = [rows["parameters"]["measured"] for _, rows in reports]
    # The two tensor ranks of a stage hold equal parts; the stages differ (the embedding on the first, the
    # final norm and the output layer on the last); together they are the model, each split part once.
    assert held[0] == held[1] and held[2] == held[3] and held[0] != held[2]
    from pretrain.config import load_config
    from pretrain.plan.model_states import tensor_parallel_shape
    from pretrain.plan.params import param_shapes

    c = load_config(overrides=settings("data", "run")[:3])
    whole = sum(4 * torch.Size(tensor_parallel_shape(n, s, 2)).numel() for n, s in param_shapes(c.model))
    assert held[0] + held[2] == whole


def test_sequence_parallel_stages_train_as_one_process(prepared, single, mc_task, tmp_path):
    # Between the stages each tensor rank sends its part of the sequence to its peer of the next stage; the
    # task's last hidden states too, which the output layer's tensor ranks gather before their logits.
    run_dir = tmp_path / "run"
    finished_torchrun(
        *settings(
            prepared,
            run_dir,
            "parallel.pipeline=2",
            "parallel.tensor=2",
            "parallel.sequence_parallel=true",
            "debug.check_sharding=true",
            *mc_task,
        ),
        nproc=4,
    )
    assert_same_run(single, run_dir)
    same_task_rows(single, run_dir, steps=[5, 10])


def test_pipeline_x_data_x_tensor_on_eight_ranks_trains_as_one_process(prepared, single, tmp_path):
    # 3D: each stage's two data-parallel replicas (ZeRO-0, micro-batch 4: the same global batch) average
    # their tensor ranks' local gradients over the "dp" group.
    run_dir = tmp_path / "run"
    finished_torchrun(
        *settings(
            prepared,
            run_dir,
            "parallel.pipeline=2",
            "parallel.tensor=2",
            "parallel.zero_stage=0",
            "train.micro_batch_size=4",
            "debug.check_sharding=true",
        ),
        nproc=8,
    )
    assert_same_run(single, run_dir)


def test_zero1_per_stage_of_tensor_ranks_resumes_in_one_process(prepared, single, tmp_path):
    # ZeRO-1 per stage: each replica updates and broadcasts the tensor-rank parts it owns (the planner's
    # partition: check_sharding holds every rank to its optimizer bytes) and saves their states; the
    # checkpoint holds each state once, and one process continues with every state in place.
    run_dir = tmp_path / "run"
    finished_torchrun(
        *settings(
            prepared,
            run_dir,
            "parallel.pipeline=2",
            "parallel.tensor=2",
            "parallel.zero_stage=1",
            "train.micro_batch_size=4",
            "debug.check_sharding=true",
            "debug.stop_after_step=5",
        ),
        nproc=8,
    )
    assert_same_run(single, run_dir, steps=range(1, 6))
    r = run_here(
        "train",
        "--resume",
        run_dir,
        "debug.stop_after_step=0",
        "parallel.pipeline=1",
        "parallel.tensor=1",
        "train.micro_batch_size=8",
    )
    assert r.returncode == 0, r.stderr
    assert "resumed from" in r.stdout and "step 5," in r.stdout
    assert_same_run(single, run_dir)


def test_a_pipeline_x_tensor_checkpoint_resumes_in_one_process(prepared, single, tmp_path):
    run_dir = tmp_path / "run"
    finished_torchrun(
        *settings(prepared, run_dir, "parallel.pipeline=2", "parallel.tensor=2", "debug.stop_after_step=5"), nproc=4
    )
    assert max(losses(run_dir)) == 5
    r = run_here("train", "--resume", run_dir, "debug.stop_after_step=0", "parallel.pipeline=1", "parallel.tensor=1")
    assert r.returncode == 0, r.stderr
    assert "resumed from" in r.stdout and "step 5," in r.stdout
    assert_same_run(single, run_dir, steps=range(6, STEPS + 1))


def test_export_from_a_pipeline_x_tensor_checkpoint(grid, tmp_path):
    hf, ours = exported_tensors(grid, tmp_path / "hf"), params(grid)
    q = 4 * 16  # debug preset: 4 heads of 16; block 0 on stage 0, block 1 on stage 1
    assert torch.equal(hf["model.layers.0.self_attn.q_proj.weight"], ours["blocks.0.attn.qkv.weight"][:q])
    assert torch.equal(hf["model.layers.1.self_attn.q_proj.weight"], ours["blocks.1.attn.qkv.weight"][:q])
    assert torch.equal(hf["lm_head.weight"], ours["lm_head.weight"][:517])
