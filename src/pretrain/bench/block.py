"""One transformer block, forward and backward, as `pretrain train` runs it (its activation checkpointing
included): tokens/s and MFU.

One block rather than the whole model: it is what every layer repeats, it fits any card whatever the model's
size, and the embedding and output layer (a V x H matmul) would blur a per-layer figure. Model FLOPs per
token of one block come from the planner's convention (PaLM): 6 x the block's parameters + the attention
term / L, so block MFU = tokens/s x that / peak, directly comparable with the planner's MFU.
"""

from __future__ import annotations

import contextlib

import torch

from ..distributed.recompute import apply_activation_checkpointing
from ..model.transformer import Block, rotary_tables
from ..plan import plan
from ..plan.hardware import COMPUTE_DTYPE
from .matmul import fp32_precision
from .timing import median_seconds

AUTOCAST = {"fp16-mixed": torch.float16, "bf16-mixed": torch.bfloat16}


def compute_dtype(precision: str, device: torch.device) -> str:
    """The dtype a run's matmuls execute in: fp32 runs as tf32 on CUDA (the trainer allows it), fp32 on CPU."""
    dtype = COMPUTE_DTYPE[precision]
    return "fp32" if dtype == "tf32" and device.type != "cuda" else dtype


def block_flops_per_token(config) -> int:
    """Model FLOPs per token of one block, from the planner: 6 x per-layer parameters + attention / L."""
    p = plan(config)
    return 6 * p["params"]["per_layer"] + p["flops"]["attention_per_token"] // config.model.num_layers


def block_step(config, device: torch.device):
    """A closure running one forward and backward of a block on a micro-batch of random activations."""
    m, t = config.model, config.train
    with torch.device(device):
        block = Block(m, t.attention)  # nn.Linear's default init: the values do not change the speed
    width = torch.float32
    if t.precision == "bf16":  # pure bf16: weights and activations
        block, width = block.to(torch.bfloat16), torch.bfloat16
    apply_activation_checkpointing(block, t.activation_checkpointing)  # the recomputation a run would do
    x = torch.randn(t.micro_batch_size, t.seq_len, m.hidden_size, device=device, dtype=width, requires_grad=True)
    grad = torch.randn_like(x)
    rope = None if m.family == "gpt2" else rotary_tables(m.head_dim, t.seq_len, m.rope_theta, device=device)
    autocast = (torch.autocast(device.type, dtype=AUTOCAST[t.precision]) if t.precision in AUTOCAST
                else contextlib.nullcontext())

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
    return {"tokens_per_s": tokens_per_s, "step_seconds": seconds, "tokens_per_step": tokens,
            "flops_per_token": per_token, "achieved_tflops": achieved,
            "mfu": achieved / peak_tflops if peak_tflops else None}
