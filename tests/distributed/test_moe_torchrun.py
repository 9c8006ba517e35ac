"""The tiny Mixture-of-Experts under a real torchrun on the CPU (gloo), 10 AdamW steps against one process with
the same global batch: FSDP2 at ep = 1 gives the same losses, weights and routing biases (every rank moves them
from the expert counts summed over the ranks); expert parallelism (each rank 4 of the 8 experts, tokens
exchanged by all-to-all) gives the same losses with DDP, its checkpoint resuming at ep = 1 under DDP, and with
FSDP2 under selective recomputation (the routed part and its all-to-alls run again in backward). With tensor
parallelism the MoE layer routes each tensor rank's part of the sequence and the expert-parallel group spans
data x tensor ranks: tensor 2 with expert 2 (no data parallelism) and tensor 2 x data 2 with expert 4 under
FSDP2 give one process's losses too, the latter killed with SIGKILL and resumed bitwise. Past one expert per
rank FSDP2 shards the experts' tensors on dim 1. Every layout the fit proposes for the tiny MoE on two ranks
trains. Each rank holds exactly the planner's parameter, gradient and optimizer bytes."""

import json

import pytest

from support import (
    finished_run,
    finished_torchrun,
    kill_job,
    params,
    per_rank_reports,
    torchrun,
    train_layouts,
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
    # The aux loss is off: it is not linear in the batch (each rank's f_i x P_i is not the global one's). No
    # QK-norm: tensor parallelism does not split it yet.
    return [
        "model.preset=moe-debug",
        "model.qk_norm=false",
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
    """The losses of one process within `rel`, its gradient norms and final weights within 1e-4 (FSDP's
    reduction order: 1.0e-5 measured at a step of ep = 1; a weight 1.6e-5 apart after 10 AdamW steps, whose
    division by sqrt(v) amplifies it), the routing biases equal."""
    for column, tolerance in (("loss", rel), ("grad_norm", 1e-4)):
        a, b = logged(single, column), logged(run_dir, column)
        assert a.keys() == b.keys() == set(range(1, 11))
        assert all(b[k] == pytest.approx(a[k], rel=tolerance) for k in a), (column, a, b)
    pa, pb = params(single), params(run_dir)
    assert pa.keys() == pb.keys()
    assert pb["blocks.1.mlp.experts.up"].shape == pa["blocks.1.mlp.experts.up"].shape  # all 8 experts saved
    for k in pa:
        torch.testing.assert_close(pb[k], pa[k], rtol=1e-4, atol=1e-4)
    bias = pb["blocks.1.mlp.expert_bias"]
    assert bias.abs().sum() > 0 and torch.equal(bias, pa["blocks.1.mlp.expert_bias"])


@pytest.mark.kernels
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
def test_expert_parallel_with_fsdp_and_selective_recomputation_matches_one_process(prepared, single, tmp_path):
    # EP=2 with FSDP2 on the same 2 ranks (experts sharded over their expert-data-parallel group of 1, the rest
    # over both) under selective recomputation: the top-k choice kept, the router, the permutation, the experts
    # and the all-to-alls run again in backward.
    run_dir = tmp_path / "ep_fsdp"
    finished_torchrun(
        *settings(
            prepared,
            run_dir,
            4,
            "parallel.expert=2",
            "parallel.zero_stage=3",
            "debug.plan_vs_run_per_rank=true",
            "train.activation_checkpointing=selective",
        )
    )
    per_rank_reports(run_dir, 2)
    same_training(single, run_dir, rel=1e-5)


def test_tensor_and_expert_parallel_without_data_parallel_matches_one_process(prepared, single, tmp_path):
    # Tensor 2 (sequence parallel) x data 1, EP=2: each tensor rank routes its half of the sequence, and the two
    # tensor ranks are the expert-parallel group (4 experts each); the router's gradients summed over them.
    run_dir = tmp_path / "tp_ep"
    finished_torchrun(
        *settings(
            prepared,
            run_dir,
            8,
            "parallel.tensor=2",
            "parallel.sequence_parallel=true",
            "parallel.expert=2",
            "debug.plan_vs_run_per_rank=true",
        )
    )
    grids = [grid for grid, _ in per_rank_reports(run_dir, 2)]
    assert [g["tensor"] for g in grids] == [0, 1] and {g["data"] for g in grids} == {0}
    same_training(single, run_dir, rel=1e-5)


@needs_cpu_fsdp
def test_expert_group_over_tensor_and_data_ranks_with_fsdp_matches_one_process_and_survives_kill_9(
    prepared, single, tmp_path
):
    # Tensor 2 x data 2 on 4 ranks, EP=4 (the group spans both: one expert-parallel group of 2 experts a rank),
    # FSDP2 (ZeRO-3), full recomputation (the all-to-alls run again); every process SIGKILLed after the
    # checkpoint of step 5, resumed by torchrun without recomputation.
    run_dir = tmp_path / "tp_dp_ep"
    job = torchrun(
        *settings(
            prepared,
            run_dir,
            4,
            "parallel.tensor=2",
            "parallel.sequence_parallel=true",
            "parallel.expert=4",
            "parallel.zero_stage=3",
            "debug.plan_vs_run_per_rank=true",
            "debug.step_sleep=0.5",
            "train.activation_checkpointing=full",
        ),
        nproc=4,
        wait=False,
    )
    try:
        wait_for_steps(run_dir, 7, job)
    finally:
        kill_job(job)
    before = lost_steps(run_dir, after=5)
    assert len(before) >= 2 and max(before) < 10, before
    per_rank_reports(run_dir, 4)
    r = torchrun("--resume", run_dir, "debug.step_sleep=0", "train.activation_checkpointing=none", nproc=4)
    assert r.returncode == 0, r.stderr[-3000:]
    assert "resumed from" in r.stdout
    after = lost_steps(run_dir, after=5)
    # the steps the kill lost, computed again without recomputation: the same losses, gradient norms and expert
    # loads (so the same routing biases), bit for bit
    assert {k: after[k] for k in before} == before
    same_training(single, run_dir, rel=1e-5)


@needs_cpu_fsdp
def test_fsdp_shards_experts_on_dim_1_past_one_expert_a_rank(prepared, tmp_path):
    # One routed expert under FSDP2 over 2 ranks: on dim 0 one rank would hold it whole and the other nothing;
    # on dim 1 each holds half its rows (torchtitan's shard_placement_fn), as the planner counts; the
    # checkpoint holds the expert whole.
    run_dir = tmp_path / "dim1"
    finished_torchrun(
        *settings(prepared, run_dir, 4, "parallel.zero_stage=3", "debug.plan_vs_run_per_rank=true"),
        "model.num_experts=1",
        "model.experts_per_token=1",
        "train.max_steps=2",
    )
    for _, rows in per_rank_reports(run_dir, 2):
        assert rows["parameters"]["measured"] > 0
    assert params(run_dir)["blocks.1.mlp.experts.up"].shape == (1, 64, 64)


def test_every_moe_layout_the_fit_proposes_trains(prepared, tmp_path):
    # `pretrain plan --fit` for the tiny MoE on 2 GPUs: every layout it emits (its candidates and, each layout
    # once, the slower ones that fit: tensor 1 or 2, expert 1 or 2, ZeRO 0-3, every recomputation) trains one
    # step under torchrun on 2 CPU ranks, through the trainer `pretrain train` runs, with one process's first loss.
    from pretrain.config import load_config
    from pretrain.plan.fit import _layout_key, fit

    shape = ["model.preset=moe-debug", "model.qk_norm=false", "train.precision=fp32", "train.seq_len=32"]
    batch = ["train.micro_batch_size=2", "train.grad_accum_steps=2", "parallel.gpus=2", "hardware.gpu=h100-sxm"]
    result = fit(load_config(overrides=[*shape, *batch]))
    layouts = {}
    for row in result["candidates"] + [r for r in result["rejected"] if r["why"].startswith("slower")]:
        layouts.setdefault(_layout_key(row["overrides"]), row["overrides"])
    found = {(o["parallel.tensor"], o["parallel.expert"], o["parallel.zero_stage"]) for o in layouts.values()}
    assert found == {(1, 1, 0), (1, 1, 1), (1, 1, 2), (1, 1, 3), (1, 2, 0), (1, 2, 2), (1, 2, 3), (2, 1, 0), (2, 2, 0)}
    base = [*shape, *batch, "train.device=cpu", f"data.dir={prepared}", "train.max_steps=1", "run.eval_every=0"]
    base += ["run.checkpoint_every=0", "run.progress=false"]
    train_layouts(tmp_path, base, list(layouts.values()), timeout=600)
    runs = json.loads((tmp_path / "results.json").read_text())
    assert len(runs) == len(layouts) == 27  # 3 recomputations x 9
    first = runs[0]["train_loss"]
    assert all(run["step"] == 1 and run["train_loss"] == pytest.approx(first, rel=1e-5) for run in runs)
