"""The planner's memory against what a real training step holds, tensor by tensor, on the CPU.

Model states (parameters, gradients, optimizer states) and autocast's weight copies must match exactly;
activations (every tensor autograd saves for backward, plus what recomputation holds) too, for every family,
precision, recomputation mode and attention kernel. One documented exception: on the CPU, LayerNorm keeps its
mean and rstd in bf16 for bf16 inputs where CUDA keeps fp32; the planner follows CUDA (0.3% here).
"""

import functools
import itertools

import pytest

torch = pytest.importorskip("torch")

from pretrain.config import load_config  # noqa: E402
from pretrain.distributed.recompute import apply_activation_checkpointing  # noqa: E402
from pretrain.model import build_model  # noqa: E402
from pretrain.plan import plan  # noqa: E402
from pretrain.train.measure import measure_forward, model_state_bytes  # noqa: E402
from pretrain.train.optim import build_optimizer  # noqa: E402

SHAPES = {
    "llama-gqa": ["model.preset=debug"],
    "llama-mha-bias": ["model.preset=debug", "model.num_kv_heads=4", "model.qkv_bias=true"],
    "llama-tied": ["model.preset=debug", "model.tie_embeddings=true"],
    "gpt2": ["model.preset=debug", "model.family=gpt2", "model.num_kv_heads=4", "model.intermediate_size=256",
             "model.tie_embeddings=true"],
}


def measure(overrides, optimizer="adamw"):
    c = load_config(overrides=["model.num_layers=3", "train.seq_len=32", "train.micro_batch_size=2",
                               "hardware.gpu=cpu", f"train.optimizer={optimizer}", *overrides])
    torch.manual_seed(0)
    model = build_model(c.model, attention=c.train.attention, loss=c.train.loss,
                        loss_chunk_tokens=c.train.loss_chunk_tokens)
    if c.train.precision == "bf16":
        model = model.to(torch.bfloat16)
    apply_activation_checkpointing(model, c.train.activation_checkpointing)
    opt = build_optimizer(model, c.model, c.train)
    x, y = torch.randint(0, 512, (2, 32)), torch.randint(0, 512, (2, 32))
    autocast = functools.partial(torch.autocast, "cpu", dtype=torch.bfloat16, cache_enabled=False,
                                 enabled=c.train.precision.endswith("-mixed"))
    loss, saved = measure_forward(model, x, y, autocast)
    loss.backward()
    opt.step()
    return plan(c), model_state_bytes(model, opt), saved


@pytest.mark.parametrize("shape, precision, recompute, attention, loss", list(itertools.product(
    SHAPES, ["fp32", "bf16-mixed", "bf16"], ["none", "selective", "full"], ["sdpa", "eager"], ["chunked", "plain"])))
def test_activations_and_copies_exact(shape, precision, recompute, attention, loss):
    # train.loss_chunk_tokens=24 does not divide b*s = 64: three chunks, the last one short.
    p, states, saved = measure(SHAPES[shape] + [f"train.precision={precision}",
                                                f"train.activation_checkpointing={recompute}",
                                                f"train.attention={attention}", f"train.loss={loss}",
                                                "train.loss_chunk_tokens=24"])
    assert p["model_states"]["working_copies"] == saved["working_copies"]
    planned = p["memory_bytes"]["activations"]
    if shape == "gpt2" and precision == "bf16":
        assert saved["activations"] == pytest.approx(planned, rel=0.01)
    else:
        assert saved["activations"] == planned


@pytest.mark.parametrize("shape, precision, optimizer", list(itertools.product(
    SHAPES, ["fp32", "bf16-mixed", "bf16"], ["adamw", "adafactor", "sgd"])))
def test_model_states_exact(shape, precision, optimizer):
    p, states, _ = measure(SHAPES[shape] + [f"train.precision={precision}"], optimizer=optimizer)
    assert {k: p["model_states"][k] for k in states} == states
