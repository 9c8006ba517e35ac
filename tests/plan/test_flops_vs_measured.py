"""The planner's FLOPs per token against a FLOP counter over one real training step (forward + backward).

`torch.utils.flop_counter.FlopCounterMode` counts matmuls (mm, addmm, bmm), so the step runs the eager
attention, whose QK^T and AV are bmm's over the full seq x seq square: PaLM's attention term. What the counter
cannot see is the 6N convention's own approximation: norm weights and biases are counted by the planner as if
they were matmul weights (6 FLOPs per token each, 2 more when recomputed), so the test takes exactly those out.
"""

import itertools

import pytest

torch = pytest.importorskip("torch")

from torch.utils.flop_counter import FlopCounterMode  # noqa: E402

from pretrain.config import load_config  # noqa: E402
from pretrain.model import build_model  # noqa: E402
from pretrain.plan import plan  # noqa: E402

SHAPES = {
    "llama-gqa": ["model.preset=debug"],
    "llama-tied-bias": ["model.preset=debug", "model.tie_embeddings=true", "model.qkv_bias=true"],
    "llama-dropout": ["model.preset=debug", "model.dropout=0.1"],  # a mask after the down projection: re-run
    "gpt2": ["model.preset=debug", "model.family=gpt2", "model.num_kv_heads=4", "model.intermediate_size=256",
             "model.tie_embeddings=true"],
}
BATCH, SEQ = 2, 32


def elementwise_params(module) -> int:
    """Norm weights and biases: parameters that take part in no matmul."""
    return sum(p.numel() for p in module.parameters() if p.ndim == 1)


@pytest.mark.parametrize("shape, recompute", list(itertools.product(SHAPES, ["none", "selective", "full"])))
def test_planned_flops_equal_a_counted_training_step(shape, recompute):
    c = load_config(overrides=["model.num_layers=3", f"train.seq_len={SEQ}", f"train.micro_batch_size={BATCH}",
                               "hardware.gpu=cpu", "train.precision=fp32", "train.attention=eager",
                               f"train.activation_checkpointing={recompute}", *SHAPES[shape]])
    model = build_model(c.model, attention="eager")
    for block in model.blocks:
        block.recompute = recompute
    x, y = torch.randint(0, 512, (BATCH, SEQ)), torch.randint(0, 512, (BATCH, SEQ))
    with FlopCounterMode(display=False) as counter:
        model(x, y).backward()
    counted = counter.get_total_flops() / (BATCH * SEQ)

    flops = plan(c)["flops"]
    not_matmul = 6 * elementwise_params(model)
    if recompute == "full":
        not_matmul += 2 * elementwise_params(model.blocks)
    assert counted == flops["per_token_hardware"] - not_matmul
    if recompute != "full":  # selective recomputation re-runs norms and activations: no matmul FLOPs
        assert flops["per_token_hardware"] == flops["per_token"]
