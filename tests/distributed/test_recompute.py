"""Activation checkpointing applied from outside the model (pretrain.distributed.recompute).

The parameter names must not change (they seed the per-parameter init and key optimizer groups, DCP
checkpoints and export); the recorded reference losses of none / selective / full must come out bit for bit;
the recomputation must really happen (FLOPs counted), also in `pretrain bench`'s block and under
torch.compile with fullgraph=True.
"""

import json
import os
import subprocess
import sys

import pytest

torch = pytest.importorskip("torch")

from torch.utils.flop_counter import FlopCounterMode  # noqa: E402

from pretrain.bench.block import block_step  # noqa: E402
from pretrain.config import load_config  # noqa: E402
from pretrain.distributed.parallelize import FSDP_CPU_TORCH  # noqa: E402
from pretrain.distributed.recompute import (  # noqa: E402
    apply_activation_checkpointing,
    checkpoint_mode,
    checkpointed_modules,
    is_checkpointed,
)
from pretrain.model import build_model  # noqa: E402
from pretrain.model.transformer import Block, rotary_tables  # noqa: E402
from pretrain.plan.kernels import torch_version_tuple  # noqa: E402
from support import ROOT, needs_compiler, run_here, tiny  # noqa: E402

MODES = ["none", "selective", "full"]
SHAPES = {
    "llama": ["model.preset=debug"],
    "gpt2": [
        "model.preset=debug",
        "model.family=gpt2",
        "model.num_kv_heads=4",
        "model.intermediate_size=256",
        "model.tie_embeddings=true",
    ],
}


def model_for(shape, mode):
    c = load_config(overrides=["model.num_layers=2", "train.seq_len=16", *SHAPES[shape]])
    return apply_activation_checkpointing(build_model(c.model, seed=1), mode)


@pytest.mark.parametrize("shape", SHAPES)
@pytest.mark.parametrize("mode", ["selective", "full"])
def test_names_and_values_stay_as_without_recomputation(shape, mode):
    plain, checkpointed = model_for(shape, "none"), model_for(shape, mode)
    assert [n for n, _ in checkpointed.named_parameters()] == [n for n, _ in plain.named_parameters()]
    assert checkpointed.state_dict().keys() == plain.state_dict().keys()
    assert all(torch.equal(a, b) for a, b in zip(plain.state_dict().values(), checkpointed.state_dict().values()))


def test_which_modules_are_checkpointed():
    assert checkpointed_modules(model_for("llama", "none")) == []
    full = model_for("llama", "full")
    assert checkpointed_modules(full) == list(full.blocks)
    selective = model_for("llama", "selective")  # whole blocks, under the operator-level policy
    assert checkpointed_modules(selective) == list(selective.blocks)
    assert [checkpoint_mode(b) for b in selective.blocks] == ["selective"] * 2
    # Applying twice checkpoints once: the checkpoint runs the block's class forward, not a second checkpoint.
    model = apply_activation_checkpointing(model_for("llama", "none"), "full")
    once = model.blocks[0].forward
    block = apply_activation_checkpointing(model, "full").blocks[0]
    assert is_checkpointed(block) and block.forward is once
    with pytest.raises(ValueError, match="one of none, selective, full"):
        apply_activation_checkpointing(model_for("llama", "none"), "some")


@pytest.mark.parametrize("shape", SHAPES)
def test_gradients_are_the_same_and_full_recomputes_every_block(shape):
    # Selective keeps qkv's and the MLP's first matmul's outputs and SDPA's: of the matmuls it re-runs the output
    # projection only; the down projection, whose output backward never needs, is skipped by the checkpoint's
    # early stop.
    x, y = (torch.randint(0, 512, (2, 16), generator=torch.Generator().manual_seed(i)) for i in range(2))
    flops, grads = {}, {}
    for mode in MODES:
        model = model_for(shape, mode)
        with FlopCounterMode(display=False) as counter:
            model(x, y).backward()
        flops[mode] = counter.get_total_flops()
        grads[mode] = [p.grad for p in model.parameters()]
    for mode in ("selective", "full"):
        assert all(torch.equal(a, b) for a, b in zip(grads["none"], grads[mode])), mode
    c = load_config(overrides=["model.num_layers=2", "train.seq_len=16", *SHAPES[shape]]).model
    projection = 2 * x.numel() * c.num_heads * c.head_dim * c.hidden_size  # forward FLOPs of one block's
    assert flops["selective"] == flops["none"] + 2 * projection
    assert flops["full"] > flops["none"]  # each block's matmuls run again


@pytest.mark.parametrize("mode", ["none", "full"])
def test_bench_block_measures_the_runs_recomputation(mode):
    """`pretrain bench`'s block step recomputes as the run would (it used to ignore the key)."""
    base = load_config(
        overrides=["model.preset=debug", "train.seq_len=16", "train.micro_batch_size=2", "train.precision=fp32"]
    )
    chosen = load_config(
        overrides=[
            "model.preset=debug",
            "train.seq_len=16",
            "train.micro_batch_size=2",
            "train.precision=fp32",
            f"train.activation_checkpointing={mode}",
        ]
    )
    counted = {}
    for name, config in (("base", base), ("chosen", chosen)):
        with FlopCounterMode(display=False) as counter:
            block_step(config, torch.device("cpu"))()
        counted[name] = counter.get_total_flops()
    # Full recomputation runs the block's matmuls of forward a second time in backward.
    assert counted["chosen"] > counted["base"] if mode == "full" else counted["chosen"] == counted["base"]


@needs_compiler
@pytest.mark.parametrize("mode", ["selective", "full"])
def test_a_checkpointed_block_compiles_as_one_graph(mode):
    c = load_config(overrides=["model.preset=debug"])
    torch.manual_seed(0)
    block = Block(c.model, "sdpa")
    x = torch.randn(2, 16, c.model.hidden_size, requires_grad=True)
    rope = rotary_tables(c.model.head_dim, 16, c.model.rope_theta)
    block(x, rope).sum().backward()
    eager = x.grad.clone()
    x.grad = None
    apply_activation_checkpointing(block, mode)
    block.compile(fullgraph=True)  # fails on a graph break
    block(x, rope).sum().backward()
    torch.testing.assert_close(x.grad, eager)


@pytest.mark.slow
@pytest.mark.parametrize("case", ["llama_fp32", "llama_selective", "llama_full"])
def test_reference_losses_bitwise(case, prepared, tmp_path):
    """The trainer's logged losses with train.loss=plain, as recorded before this change (bitwise on a machine
    that recorded them, within the kernels' allowance elsewhere: tests/train/record_reference_losses.py)."""
    sys.path.insert(0, str(ROOT / "tests" / "train"))
    from record_reference_losses import assert_losses, reference, run_case

    found = reference(case)
    if found is None:
        pytest.skip(f"no recording on torch {torch.__version__}")
    assert_losses(run_case(case, prepared, tmp_path, ["train.loss=plain"]), *found)


@pytest.mark.slow
@pytest.mark.skipif(torch_version_tuple(torch.__version__) < FSDP_CPU_TORCH, reason="FSDP2 on CPUs")
def test_fsdp_with_full_recomputation_trains_as_one_process(prepared, tmp_path):
    """ZeRO-3 (FSDP2) shards blocks whose forward is checkpointed: its hooks gather the parameters again before
    backward reaches the recomputation. 2 ranks x micro-batch 2 against one process x micro-batch 4."""

    def run(name, nproc, micro_batch):
        args = tiny(
            prepared,
            tmp_path / name,
            f"train.micro_batch_size={micro_batch}",
            "train.max_steps=4",
            "run.eval_every=0",
            "train.activation_checkpointing=full",
            "parallel.zero_stage=3",
        )
        if nproc == 1:
            r = run_here("train", *args)
        else:
            r = subprocess.run(
                [
                    sys.executable,
                    "-m",
                    "torch.distributed.run",
                    "--standalone",
                    f"--nproc-per-node={nproc}",
                    "-m",
                    "pretrain",
                    "train",
                    *args,
                ],
                capture_output=True,
                text=True,
                env={**os.environ, "OMP_NUM_THREADS": "1"},
                timeout=600,
            )
        assert r.returncode == 0, r.stderr[-3000:]
        rows = [json.loads(x) for x in (tmp_path / name / "metrics.jsonl").read_text().splitlines()]
        return [row["loss"] for row in rows if "loss" in row]

    single, sharded = run("single", 1, 4), run("fsdp", 2, 2)
    assert len(single) == 4 and sharded == pytest.approx(single, rel=1e-5)
