"""The tiny Mixture-of-Experts under a real torchrun on the CPU (gloo, 2 processes, FSDP2): the same losses
and weights as one process with the same global batch, and the same routing biases, which every rank moves
from the expert counts summed over the ranks."""

import pytest

from support import finished_run, finished_torchrun, losses, params

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


@pytest.mark.skipif(torch_version_tuple(torch.__version__) < FSDP_CPU_TORCH, reason="FSDP2 on CPUs needs torch 2.9")
def test_fsdp_matches_one_process(prepared, tmp_path):
    single = finished_run(tmp_path / "single", *settings(prepared, tmp_path / "single", 8))
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
