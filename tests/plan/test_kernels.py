"""Grouped-query attention: where SDPA takes grouped k/v heads, and the repeat path the model takes elsewhere.

One rule (pretrain.plan.kernels) decides for the model and the planner; the repeat path must compute the same
attention as SDPA's own GQA, and the planner must count what it keeps, to the byte.
"""

import functools
import itertools

import pytest

from pretrain.config import load_config
from pretrain.plan.kernels import native_gqa, planned_native_gqa, torch_version_tuple

torch = pytest.importorskip("torch")


@pytest.mark.parametrize(
    "device, half, head_dim, version, flash_gpu, expected",
    [
        ("cpu", False, 64, "2.6.0+cpu", True, False),  # CPU flash takes GQA from torch 2.9 on
        ("cpu", True, 64, "2.8.1", True, False),
        ("cpu", False, 64, "2.9.0", True, True),
        ("cpu", False, 64, "2.13.0+cpu", True, True),
        ("cpu", False, 64, None, True, True),  # unknown version: a recent one
        ("cuda", True, 128, "2.6.0+cu124", True, True),  # flash attention
        ("cuda", False, 128, "2.13.0", True, False),  # fp32 runs on the memory-efficient kernel: no GQA
        ("cuda", True, 512, "2.13.0", True, False),  # flash stops at head_dim 256
        ("cuda", True, 128, "2.13.0", False, False),  # V100 / T4: no flash attention
    ],
)
def test_the_rule(device, half, head_dim, version, flash_gpu, expected):
    assert native_gqa(device, half, head_dim, version, flash_gpu) is expected


def test_version_parsing():
    assert torch_version_tuple("2.10.0.dev20250101+cu128") == (2, 10)
    assert torch_version_tuple("") is None and torch_version_tuple(None) is None


@pytest.mark.parametrize(
    "gpu, precision, expected",
    [
        ("h100-sxm", "bf16-mixed", True),
        ("h100-sxm", "fp32", False),
        ("a100-80gb", "fp16-mixed", True),
        ("v100-32gb", "fp16-mixed", False),
        ("t4", "fp16-mixed", False),
    ],
)
def test_the_planner_applies_it_to_the_config(gpu, precision, expected):
    c = load_config(overrides=["model.preset=llama3-8b", f"hardware.gpu={gpu}", f"train.precision={precision}"])
    assert planned_native_gqa(c) is expected


def test_repeated_heads_cost_what_the_planner_says_in_a_full_plan():
    from pretrain.plan import make_plan

    base = [
        "model.preset=llama3-8b",
        "train.seq_len=4096",
        "train.micro_batch_size=1",
        "parallel.gpus=8",
        "parallel.zero_stage=3",
    ]
    native = make_plan(load_config(overrides=base + ["hardware.gpu=h100-sxm", "train.precision=bf16-mixed"]))
    repeat = make_plan(load_config(overrides=base + ["hardware.gpu=v100-32gb", "train.precision=fp16-mixed"]))
    # LLaMA-3-8B (32 query heads, 8 k/v heads): repeating k/v keeps 3*4096 per token instead of the qkv
    # output (4096 + 2*1024) and rotated q, k (4096 + 1024): 2 bytes x 1024 more per token and layer.
    extra = 2 * 1024 * 4096 * 32
    # And the chunked loss keeps dL/dW of the output layer in fp32 under fp16, in bf16 under bf16: 2 x V*h more.
    extra += 2 * 128_256 * 4096
    assert repeat["memory_bytes"]["activations"] - native["memory_bytes"]["activations"] == extra


def _model(native: bool, overrides=()):
    from pretrain.model import build_model

    c = load_config(
        overrides=[
            "model.preset=debug",
            "model.num_layers=2",
            "train.seq_len=32",
            "train.micro_batch_size=2",
            "hardware.gpu=cpu",
            *overrides,
        ]
    )
    torch.manual_seed(0)
    model = build_model(c.model, attention=c.train.attention, seed=1)
    for block in model.blocks:
        block.attn.native_gqa = native
    return c, model


def test_repeating_heads_computes_the_same_attention():
    _, native = _model(True)
    _, repeat = _model(False)
    x = torch.randint(0, 512, (2, 32))
    torch.testing.assert_close(repeat(x), native(x), rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize(
    "precision, recompute", list(itertools.product(["fp32", "bf16-mixed", "bf16"], ["none", "selective", "full"]))
)
def test_the_repeat_path_keeps_what_the_planner_counts(precision, recompute):
    from pretrain.distributed.recompute import apply_activation_checkpointing
    from pretrain.plan.activations import activation_bytes
    from pretrain.train.measure import measure_forward

    c, model = _model(False, [f"train.precision={precision}", f"train.activation_checkpointing={recompute}"])
    if precision == "bf16":
        model = model.to(torch.bfloat16)
    apply_activation_checkpointing(model, recompute)
    x, y = torch.randint(0, 512, (2, 32)), torch.randint(0, 512, (2, 32))
    autocast = functools.partial(
        torch.autocast, "cpu", dtype=torch.bfloat16, cache_enabled=False, enabled=precision.endswith("-mixed")
    )
    _, saved = measure_forward(model, x, y, autocast)
    planned = activation_bytes(c.model, c.train, c.parallel, native_gqa=False)["total"]
    assert saved["activations"] == planned
