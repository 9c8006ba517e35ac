"""The plan of `train.optimizer: muon`'s step: Newton-Schulz's FLOPs as torch counts them on the trainer's own
iteration, and FSDP2's owners sharing the matrices where DDP replicas each orthogonalise all of them."""

import pytest

from pretrain.config import load_config
from pretrain.plan import make_plan
from pretrain.plan.muon import newton_schulz_flops

torch = pytest.importorskip("torch")


@pytest.mark.parametrize("shape, parts", [((48, 16), None), ((3, 24, 40), None), ((48, 24), [32, 8, 8])])
def test_newton_schulz_flops_are_torchs_count(shape, parts):
    from torch.utils.flop_counter import FlopCounterMode

    from pretrain.distributed.muon import newton_schulz

    x = torch.randn(shape).bfloat16()
    with FlopCounterMode(display=False) as counter:
        for block in x.split(parts, dim=-2) if parts else [x]:
            newton_schulz(block, 5)
    assert newton_schulz_flops(shape, parts or [shape[-2]], 5) == counter.get_total_flops()


def _muon_step(*overrides):
    plan = make_plan(load_config(overrides=["model.preset=debug", "hardware.gpu=h100-sxm", *overrides]))
    return plan["step_time"]


def test_fsdp_owners_share_the_matrices_ddp_replicas_each_orthogonalise_all():
    one = _muon_step("train.optimizer=muon")["muon"]
    ddp = _muon_step("train.optimizer=muon", "parallel.gpus=4", "parallel.zero_stage=0")["muon"]
    fsdp = _muon_step("train.optimizer=muon", "parallel.gpus=4", "parallel.zero_stage=3")["muon"]
    assert ddp["matrices"] == one["matrices"] == 8  # 2 blocks x qkv, proj, up, down
    assert ddp["newton_schulz_flops"] == one["newton_schulz_flops"] and ddp["exchange_bytes"] == 0
    assert fsdp["matrices"] == 2 and fsdp["newton_schulz_flops"] < one["newton_schulz_flops"] / 2
    assert fsdp["exchange_bytes"] > 0 and fsdp["newton_schulz_s"] > 0
    assert "muon" not in _muon_step()  # AdamW's step as it was
