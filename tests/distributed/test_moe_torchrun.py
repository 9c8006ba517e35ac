"""The tiny Mixture-of-Experts under a real torchrun on the CPU (gloo, 2 processes): FSDP2 gives the same
losses and weights as one process with the same global batch, and the same routing biases, which every rank
moves from the expert counts summed over the ranks; expert parallelism (each rank 4 of the 8 experts, tokens
exchanged by all-to-all) gives the same losses, and its checkpoint resumes in one process."""

import json

import pytest

from support import finished_run, finished_torchrun, losses, params, run_cli

torch = pytest.importorskip("torch")

from pretrain.distributed.parallelize import FSDP_CPU_TORCH  # noqa: E402
from pretrain.plan.kernels import torch_version_tuple  # noqa: E402


def settings(prepared, run_dir, micro_batch, *extra):
    # The aux loss is off: it is not linear in the batch (each rank's f_i x P_i is not the global one's).
    return ["model.preset=moe-debug", "model.router_aux_loss_coef=0", "model.router_z_loss_coef=0.001",
            "model.router_bias_update_rate=0.01", "train.seq_len=32", f"train.micro_batch_size={micro_batch}",
            "train.grad_accum_steps=2", "train.precision=fp32", "train.device=cpu", "train.lr=3e-3",
            "train.warmup=1", "train.max_steps=4", f"data.dir={prepared}", f"run.dir={run_dir}", "run.log_every=1",
            "run.eval_every=0", "run.checkpoint_every=4", "run.progress=false", "hardware.peak_tflops=0.05", *extra]


@pytest.fixture(scope="module")
def single(prepared, tmp_path_factory):
    run_dir = tmp_path_factory.mktemp("single")
    return finished_run(run_dir, *settings(prepared, run_dir, 8))


@pytest.mark.skipif(torch_version_tuple(torch.__version__) < FSDP_CPU_TORCH, reason="FSDP2 on CPUs needs torch 2.9")
def test_fsdp_matches_one_process(prepared, single, tmp_path):
    finished_torchrun(*settings(prepared, tmp_path / "fsdp", 4, "parallel.zero_stage=3"))
    a, b = losses(single), losses(tmp_path / "fsdp")
    assert a.keys() == b.keys()
    assert all(b[k] == pytest.approx(a[k], rel=1e-5) for k in a)
    pa, pb = params(single), params(tmp_path / "fsdp")
    assert pa.keys() == pb.keys()
    for k in pa:
        torch.testing.assert_close(pb[k], pa[k], rtol=1e-5, atol=3e-5)
    bias = pb["blocks.1.mlp.expert_bias"]
    assert bias.abs().sum() > 0 and torch.equal(bias, pa["blocks.1.mlp.expert_bias"])


def test_expert_parallel_matches_one_process_and_resumes_in_one(prepared, single, tmp_path):
    # EP=2 x DP=2 on 2 processes (one expert-parallel group) for 3 steps, then its checkpoint (experts gathered
    # to the full [E, ...]) resumed at EP=1 in one process for step 4: the losses of one process throughout.
    ep = tmp_path / "ep"
    finished_torchrun(*settings(prepared, ep, 4, "parallel.expert=2", "debug.stop_after_step=3"))
    report = json.loads((ep / "plan_vs_run.json").read_text())
    held = next(r for r in report["rows"] if r["name"] == "parameters")
    sizes = report["plan"]["params"]
    assert held["measured"] == held["planned"] == 4 * (sizes["total"] - sizes["routed_experts"] // 2)  # E/2 each
    r = run_cli("train", "--resume", ep, "debug.stop_after_step=0", "train.micro_batch_size=8", "parallel.expert=1")
    assert r.returncode == 0, r.stderr
    assert "resumed from" in r.stdout
    a, b = losses(single), losses(ep)
    assert a.keys() == b.keys() == {1, 2, 3, 4}
    assert all(b[k] == pytest.approx(a[k], rel=1e-4) for k in a), (a, b)
    pa, pb = params(single), params(ep)
    assert pb["blocks.1.mlp.experts.up"].shape == pa["blocks.1.mlp.experts.up"].shape
    for k in pa:
        torch.testing.assert_close(pb[k], pa[k], rtol=1e-4, atol=1e-4)
