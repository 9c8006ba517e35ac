"""One transformer block's forward/backward: FLOPs per token from the planner, tokens/s, MFU."""

import pytest
import torch

from pretrain.bench.block import block_flops_per_token, block_throughput
from pretrain.config import load_config
from pretrain.precision import matmul_dtype

CPU = torch.device("cpu")


def tiny(*overrides):
    return load_config(None, ["model.preset=debug", "train.seq_len=64", "train.micro_batch_size=2", *overrides])


def test_block_flops_per_token_is_six_times_the_layer_plus_attention():
    # debug preset (presets.py): H=64, H'=176, 4 query heads and 2 key/value heads of 16, 2 layers.
    # per layer: q 64x64 + k,v 2 x 64x32 + o 64x64 = 12,288; SwiGLU 3 x 64 x 176 = 33,792; norms 128.
    per_layer = 12_288 + 33_792 + 128
    attention = 12 * 4 * 16 * 64  # PaLM: 12 x heads x head_dim x seq, per layer
    assert block_flops_per_token(tiny()) == 6 * per_layer + attention


@pytest.mark.parametrize(
    "overrides",
    [
        [],
        ["train.precision=fp32"],
        ["train.precision=bf16"],
        [
            "model.preset=gpt2",
            "model.num_layers=1",
            "model.hidden_size=64",
            "model.num_heads=4",
            "model.intermediate_size=256",
        ],
    ],
)
def test_block_throughput_is_positive_and_mfu_is_achieved_over_peak(overrides):
    result = block_throughput(tiny(*overrides), CPU, budget=0.05, peak_tflops=0.5)
    assert result["tokens_per_step"] == 128 and result["tokens_per_s"] > 0
    assert result["achieved_tflops"] == pytest.approx(result["tokens_per_s"] * result["flops_per_token"] / 1e12)
    assert result["mfu"] == pytest.approx(result["achieved_tflops"] / 0.5)


def test_block_mfu_is_none_without_a_peak():
    assert block_throughput(tiny(), CPU, budget=0.02, peak_tflops=None)["mfu"] is None


def test_compute_dtype_follows_the_trainer():
    assert matmul_dtype("fp32", "cuda") == "tf32"  # the trainer allows TF32 on CUDA
    assert matmul_dtype("fp32", "cpu") == "fp32"
    assert matmul_dtype("bf16-mixed", "cpu") == "bf16" and matmul_dtype("fp16-mixed", "cpu") == "fp16"
