"""One transformer block, forward and backward, as `pretrain train` runs it (its activation checkpointing
included): tokens/s and MFU.

One block rather than the whole model: it is what every layer repeats, it fits any card whatever the model's
size, and the embedding and output layer (a V x H matmul) would blur a per-layer figure. Model FLOPs per
token of one block come from the planner's convention (PaLM): 6 x the block's parameters + the attention
term / L, so block MFU = tokens/s x that / peak, directly comparable with the planner's MFU.
"""

from __future__ import annotations

import torch

from .. import precision
from ..distributed.recompute import apply_activation_checkpointing
from ..model.transformer import Block, rotary_tables
from ..plan import make_plan
from ..plan.flops import mfu
from .matmul import fp32_precision
from .timing import median_seconds


def block_flops_per_token(config) -> int:
    """Model FLOPs per token of one block, from the planner: 6 x per-layer parameters + attention / L."""
    p = make_plan(config)
    return 6 * p["params"]["per_layer"] + p["flops"]["attention_per_token"] // config.model.num_layers


def block_step(config, device: torch.device):
    """A closure running one forward and backward of a block on a micro-batch of random activations."""
    m, t = config.model, config.train
    with torch.device(device):
        block = Block(m, t.attention)  # nn.Linear's default init: the values do not change the speed
    width = precision.weight_dtype(t.precision)  # pure bf16: weights and activations in bf16
    block = block.to(width)
    apply_activation_checkpointing(block, t.activation_checkpointing)  # the recomputation a run would do
    x = torch.randn(t.micro_batch_size, t.seq_len, m.hidden_size, device=device, dtype=width, requires_grad=True)
    grad = torch.randn_like(x)
    rope = (
        None
        if m.family == "gpt2"
        else rotary_tables(m.head_dim, t.seq_len, m.rope_theta, device=device, scaling=m.rope_scaling)
    )
    autocast = precision.autocast(t.precision, device)()  # as the trainer casts

    def step():
        block.zero_grad(set_to_none=True)
        x.grad = None
        with autocast:
            y = block(x, rope)
        y.backward(grad)  # a given output gradient: no loss kernel that a real layer would not run

    return step


def block_throughput(config, device: torch.device, budget: float, peak_tflops: float | None) -> dict:
    """tokens/s through one block (forward + backward) and its MFU against `peak_tflops` of the compute dtype."""
    t = config.train
    with fp32_precision("tf32", device):  # as `pretrain train` runs: TF32 allowed on CUDA
        seconds = median_seconds(block_step(config, device), device, budget)
    tokens = t.micro_batch_size * t.seq_len
    per_token = block_flops_per_token(config)
    tokens_per_s = tokens / seconds
    achieved = tokens_per_s * per_token / 1e12
    return {
        "tokens_per_s": tokens_per_s,
        "step_seconds": seconds,
        "tokens_per_step": tokens,
        "flops_per_token": per_token,
        "achieved_tflops": achieved,
        "mfu": mfu(tokens_per_s, per_token, 1, peak_tflops),
    }
