"""The tiny Mixture-of-Experts under a real torchrun on the CPU (gloo, 2 processes), 10 AdamW steps against
one process with the same global batch: FSDP2 at ep = 1 gives the same losses, weights and routing biases
(every rank moves them from the expert counts summed over the ranks); expert parallelism (each rank 4 of the
8 experts, tokens exchanged by all-to-all) gives the same losses with DDP, its checkpoint resuming at ep = 1
under DDP, and with FSDP2, where a kill -9 and a --resume redo the lost steps bitwise; both expert-parallel
runs recompute every block in backward (train.activation_checkpointing=full) until they are resumed without.
Each rank holds exactly the planner's parameter, gradient and optimizer bytes."""

import json

import pytest

from support import (
    finished_run,
    finished_torchrun,
    kill_job,
    params,
    per_rank_reports,
    torchrun,
    wait_for_steps,
)

torch = pytest.importorskip("torch")
pytest.importorskip("psutil")

from pretrain.distributed.parallelize import FSDP_CPU_TORCH  # noqa: E402
from pretrain.plan.kernels import torch_version_tuple  # noqa: E402

needs_cpu_fsdp = pytest.mark.skipif(
    torch_version_tuple(torch.__version__) < FSDP_CPU_TORCH, reason="FSDP2 on CPUs needs torch 2.9"
)


def settings(prepared, run_dir, micro_batch, *extra):
    # The aux loss is off: it is not linear in the batch (each rank's f_i x P_i is not the global one's).
    return [
        "model.preset=moe-debug",
        "model.router_aux_loss_coef=0",
        "model.router_z_loss_coef=0.001",
        "model.router_bias_update_rate=0.01",
        "train.seq_len=32",
        f"train.micro_batch_size={micro_batch}",
        "train.grad_accum_steps=2",
        "train.precision=fp32",
        "train.device=cpu",
        "train.lr=3e-3",
        "train.warmup=1",
        "train.max_steps=10",
        f"data.dir={prepared}",
        f"run.dir={run_dir}",
        "run.log_every=1",
        "run.eval_every=0",
        "run.checkpoint_every=5",
        "run.progress=false",
        "hardware.peak_tflops=0.05",
        *extra,
    ]


@pytest.fixture(scope="module")
def single(prepared, tmp_path_factory):
    run_dir = tmp_path_factory.mktemp("single")
    return finished_run(run_dir, *settings(prepared, run_dir, 8))


def logged(run_dir, column: str) -> dict:
    rows = [json.loads(x) for x in (run_dir / "metrics.jsonl").read_text().splitlines()]
    return {r["step"]: r[column] for r in rows if column in r}


def same_training(single, run_dir, rel):
    """The losses and final weights of one process within `rel`, the gradient norms within 1e-4 (FSDP's
    reduction order: 1.0e-5 measured at a step of ep = 1), the routing biases equal."""
    for column, tolerance in (("loss", rel), ("grad_norm", 1e-4)):
        a, b = logged(single, column), logged(run_dir, column)
        assert a.keys() == b.keys() == set(range(1, 11))
        assert all(b[k] == pytest.approx(a[k], rel=tolerance) for k in a), (column, a, b)
    pa, pb = params(single), params(run_dir)
    assert pa.keys() == pb.keys()
    assert pb["blocks.1.mlp.experts.up"].shape == pa["blocks.1.mlp.experts.up"].shape  # all 8 experts saved
    for k in pa:
        torch.testing.assert_close(pb[k], pa[k], rtol=rel, atol=rel)
    bias = pb["blocks.1.mlp.expert_bias"]
    assert bias.abs().sum() > 0 and torch.equal(bias, pa["blocks.1.mlp.expert_bias"])


@needs_cpu_fsdp
def test_fsdp_matches_one_process(prepared, single, tmp_path):
    finished_torchrun(*settings(prepared, tmp_path / "fsdp", 4, "parallel.zero_stage=3"))
    same_training(single, tmp_path / "fsdp", rel=1e-5)


def test_expert_parallel_with_ddp_matches_one_process_and_resumes_at_ep_1(prepared, single, tmp_path):
    # EP=2 x DP=2 on 2 processes (one expert-parallel group) for 6 steps, with full recomputation (each block's
    # all-to-alls run again in backward, its tokens counted once), then its checkpoint (experts gathered to the
    # full [E, ...]) resumed at EP=1 x DP=2 (every rank all experts), without recomputation, for steps 7-10:
    # one process's run.
    ep = tmp_path / "ep"
    finished_torchrun(
        *settings(
            prepared,
            ep,
            4,
            "parallel.expert=2",
            "debug.stop_after_step=6",
            "debug.plan_vs_run_per_rank=true",
            "train.activation_checkpointing=full",
        )
    )
    per_rank_reports(ep, 2)  # each rank: E/2 experts, the rest whole, exactly as planned
    r = finished_torchrun(
        "--resume", ep, "debug.stop_after_step=0", "parallel.expert=1", "train.activation_checkpointing=none"
    )
    assert "resumed from" in r.stdout
    same_training(single, ep, rel=1e-4)


def lost_steps(run_dir, after: int) -> dict:
    """{step: the metrics line} of the steps past checkpoint `after` (what a resume computes again)."""
    rows = [json.loads(x) for x in (run_dir / "metrics.jsonl").read_text().splitlines()]
    return {
        r["step"]: {k: v for k, v in r.items() if k not in ("time", "tokens_per_s", "mfu", "peak_mem_bytes")}
        for r in rows
        if "loss" in r and r["step"] > after
    }


@needs_cpu_fsdp
def test_expert_parallel_with_fsdp_matches_one_process_and_survives_kill_9(prepared, single, tmp_path):
    # EP=2 with FSDP2 on the same 2 ranks (experts sharded over their expert-data-parallel group of 1, the rest
    # over both), with full recomputation (FSDP gathers a block's weights again for it, its all-to-alls run
    # again), every process SIGKILLed after the checkpoint of step 5, resumed by torchrun without recomputation.
    run_dir = tmp_path / "ep_fsdp"
    job = torchrun(
        *settings(
            prepared,
            run_dir,
            4,
            "parallel.expert=2",
            "parallel.zero_stage=3",
            "debug.plan_vs_run_per_rank=true",
            "debug.step_sleep=0.5",
            "train.activation_checkpointing=full",
        ),
        wait=False,
    )
    try:
        wait_for_steps(run_dir, 7, job)
    finally:
        kill_job(job)
    before = lost_steps(run_dir, after=5)
    assert len(before) >= 2 and max(before) < 10, before
    per_rank_reports(run_dir, 2)
    r = torchrun("--resume", run_dir, "debug.step_sleep=0", "train.activation_checkpointing=none")
    assert r.returncode == 0, r.stderr[-3000:]
    assert "resumed from" in r.stdout
    after = lost_steps(run_dir, after=5)
    # the steps the kill lost, computed again without recomputation: the same losses, gradient norms and expert
    # loads (so the same routing biases), bit for bit
    assert {k: after[k] for k in before} == before
    same_training(single, run_dir, rel=1e-4)
