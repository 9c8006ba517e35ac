"""A step on a CPU, as eager PyTorch runs it: the step-time model's CPU terms (pretrain.plan.step_time).

A small model's step on a CPU is not its FLOPs: each of the ~170 aten ops a LLaMA block dispatches in forward
and backward costs microseconds of Python, dispatcher and autograd (and OpenMP's fork and join with several
threads) whatever its size, so a 160K-parameter model spends most of its step there. Per micro-batch:
    ops x op_seconds + elementwise bytes / memory bandwidth
beside the matmul and attention FLOPs at the matmul rate (step_time's terms), and per optimizer step its own
ops x op_seconds + the update's bytes / memory bandwidth.
  ops       the aten ops one micro-batch dispatches: per block and around the blocks (embedding, final norm,
            the chunked loss: more per chunk of train.loss_chunk_tokens), counted below a dispatch mode on
            torch 2.13 (tests/plan/test_cpu_time.py counts them again for each case and holds the table to it);
            a step adds its own (clipping, fused AdamW, zero_grad).
  op_seconds  the seconds one of our model's ops costs on this CPU at these threads, measured (the trainer's
            per-user profile or `pretrain bench`'s: a training step of the debug shape, less its FLOPs at the
            measured peak, divided by its ops: pretrain.bench.cpu_profile), else OP_SECONDS, said to be assumed.
  bytes     eager mode's elementwise traffic (pretrain.plan.traffic: every op reads its inputs and writes its
            output), the loss's passes over the chunk's logits (LOGIT_PASSES), and the update's (parameters and
            states read and written, gradients read) at the measured copy bandwidth (else hardware.bandwidth_gbps,
            else BANDWIDTH_GBPS, assumed). Weights and a small model's activations sit in the caches: the
            memory's bandwidth makes these an upper bound there, where the ops' overhead is most of the step.
Pure Python, as the rest of the planner.
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING

from ..gpus import mixed_precision
from .activations import activation_bytes
from .collectives import bytes_per_value
from .expert_parallel import rank_params
from .fp8 import gemms
from .hardware import cpu_figures
from .params import padded_vocab_size
from .traffic import eager_elementwise_traffic

if TYPE_CHECKING:
    from ..config.schema import ResolvedConfig
    from .explain import Explain
    from .params import ParamCounts

# aten ops of one micro-batch, forward and backward, fp32, no recomputation (counted: the module docstring)
BLOCK_OPS = {"llama": 173, "gpt2": 100}
AROUND_BLOCKS_OPS = {"llama": 86, "gpt2": 72}  # embedding, final norm, output layer and a loss of one chunk
LOSS_CHUNK_OPS = 39  # each chunk of train.loss_chunk_tokens after the first
QK_NORM_OPS = 50  # a block's two QK-norms (Qwen3, OLMoE)
MOE_OPS = (100, 3)  # per MoE block (routing, sort, grouped GEMMs, combine) beyond a dense one's; the loss's sum
AUTOCAST_OPS = (16, 8)  # per block, around the blocks: the casts of bf16-mixed, fp16-mixed and fp8
RECOMPUTED_OPS = {"none": 0, "selective": 107, "full": 106}  # a block's forward again, in backward
DOCUMENT_OPS = (84, 20)  # per block, around the blocks: train.document_masking's per-document attention
FP8_LINEAR_OPS = 64  # a float8 linear's amax, scale, casts and their backward (torchao's eager emulation)
STEP_OPS = 31  # a step's own: clipping (foreach), fused AdamW, zero_grad
MOE_STEP_OPS = 16  # the routing biases' update and the step's expert counts
# one op, without a measurement: the debug shape's on a 2-core EPYC VM, one thread, torch 2.13 (bench/cpu_profile:
# 6 us for a nano model's ops on a quiet moment, 18 us for the debug shape's with a core shared)
OP_SECONDS = 10e-6
BANDWIDTH_GBPS = 10.0  # without a measurement: an elementwise op on one core of the same VM
# train.precision=fp8 on a CPU: no float8 units, so torchao's casts (amax, scale, convert, and the upcast for an
# fp32 matmul) run element by element, far below the memory's bandwidth: the cast bytes of plan/fp8.py at this
# rate, fitted to the fp8 / bf16-mixed step ratio measured on a hidden-128 model (benchmarks/fp8_cpu.py: 2.2x to
# 4.9x over three runs on a shared 2-core VM, one thread; the plan gives 2.5x to 4.9x as the profile varies).
FP8_CAST_GBPS = 0.36
LOGIT_PASSES = 6  # over a chunk's fp32 logits: written, max, exp and sum forward; softmax - 1 and scale backward


def block_ops(c: ResolvedConfig) -> int:
    """aten ops of one block's forward and backward in one micro-batch (the average block: MoE ones weighted)."""
    m, t = c.model, c.train
    ops = BLOCK_OPS[m.family] + RECOMPUTED_OPS[t.activation_checkpointing]
    ops += QK_NORM_OPS * m.qk_norm + AUTOCAST_OPS[0] * mixed_precision(t.precision)
    ops += DOCUMENT_OPS[0] * t.document_masking
    if t.precision == "fp8":  # each converted linear's casts, separate eager ops on a CPU (no float8 units)
        ops += FP8_LINEAR_OPS * gemms(c)["linears"] / m.num_layers
    if m.num_experts:
        ops += MOE_OPS[0] * (m.num_layers - m.first_dense_layers) / m.num_layers
    return round(ops)


def micro_batch_ops(c: ResolvedConfig, layers: int) -> int:
    """aten ops of one micro-batch on this rank: its `layers` blocks and what is around them."""
    t = c.train
    chunks = math.ceil(t.micro_batch_size * t.seq_len / t.loss_chunk_tokens) if t.loss == "chunked" else 1
    around = AROUND_BLOCKS_OPS[c.model.family] + LOSS_CHUNK_OPS * (chunks - 1)
    around += AUTOCAST_OPS[1] * mixed_precision(t.precision) + DOCUMENT_OPS[1] * t.document_masking
    around += MOE_OPS[1] * bool(c.model.num_experts)
    return layers * block_ops(c) + around


def micro_batch_terms(c: ResolvedConfig, ex: Explain) -> tuple[float, float, int]:
    """(seconds of elementwise traffic, seconds of op overhead, blocks on this rank) of one micro-batch."""
    m, t, par = c.model, c.train, c.parallel
    op_s, gbps, how = cpu_figures(c.hardware)
    op_s, gbps = op_s or OP_SECONDS, gbps or BANDWIDTH_GBPS
    layers = activation_bytes(m, t, par)["layers"]
    tokens = t.micro_batch_size * t.seq_len
    logits = LOGIT_PASSES * 4 * min(tokens, t.loss_chunk_tokens) * padded_vocab_size(m) / par.tensor
    chunks = math.ceil(tokens / min(tokens, t.loss_chunk_tokens))
    moved = eager_elementwise_traffic(m, t, par, layers) + chunks * logits
    traffic_s = moved / (gbps * 1e9)
    ex.add(
        "step_time",
        "activation_traffic_s",
        traffic_s,
        f"{moved:.4g} bytes: eager mode's elementwise ops in {layers} blocks and {LOGIT_PASSES} passes over the "
        f"loss's fp32 logits, at {gbps:.4g} GB/s ({how['bandwidth']})",
    )
    ops = micro_batch_ops(c, layers)
    overhead_s = ops * op_s
    ex.add(
        "step_time",
        "kernel_overhead_s",
        overhead_s,
        f"({layers} blocks x {block_ops(c)} + {ops - layers * block_ops(c)} around them) aten ops of eager "
        f"PyTorch x {op_s * 1e6:.3g} us ({how['ops']})",
    )
    return traffic_s, overhead_s, layers


def optimizer_seconds(c: ResolvedConfig, counts: ParamCounts, ex: Explain) -> float:
    """The step's own work on a CPU: its ops' overhead, and the update, clipping's norm included, at the
    memory's bandwidth."""
    t, par = c.train, c.parallel
    op_s, gbps, how = cpu_figures(c.hardware)
    op_s, gbps = op_s or OP_SECONDS, gbps or BANDWIDTH_GBPS
    dp = par.gpus // (par.tensor * par.pipeline)
    params = rank_params(c, counts) / (par.tensor * par.pipeline)
    owned = params / (dp if dp > 1 and par.zero_stage >= 1 else 1)
    grad_b, param_b = bytes_per_value(t)
    states = {"adamw": 2, "sgd": 1 if t.momentum else 0, "adafactor": 0}[t.optimizer]
    moved = owned * (2 * param_b * (1 + states) + grad_b) + params * grad_b  # the update; clipping's norm
    ops = STEP_OPS + MOE_STEP_OPS * bool(c.model.num_experts)
    seconds = moved / (gbps * 1e9) + ops * op_s
    ex.add(
        "step_time",
        "optimizer_s",
        seconds,
        f"{moved:.4g} bytes (the update's parameters and states read and written, gradients read by it and by "
        f"clipping) at {gbps:.4g} GB/s ({how['bandwidth']}) + {ops} aten ops x {op_s * 1e6:.3g} us ({how['ops']})",
    )
    return seconds
