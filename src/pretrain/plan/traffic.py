"""Memory traffic of a micro-batch's activations and weights, for the step-time model (pretrain.plan.step_time)
and the advice: what the kept tensors, eager mode's elementwise kernels and the weight reads move through HBM."""

from __future__ import annotations

import dataclasses
from typing import TYPE_CHECKING, Any

from .activation_terms import COMPUTE_BYTES, residual_bytes
from .activations import activation_bytes

if TYPE_CHECKING:
    from ..config.job_sections import ParallelConfig
    from ..config.schema import ResolvedModelConfig, ResolvedTrainConfig


def weight_reads(t: ResolvedTrainConfig) -> int:
    """How often a micro-batch reads the matmul weights: forward, backward for the activations' gradients and
    for the weights' gradients (3), and once more with full recomputation, which reruns the forward."""
    return 4 if t.activation_checkpointing == "full" else 3


def eager_elementwise_traffic(
    m: ResolvedModelConfig, t: ResolvedTrainConfig, parallel: ParallelConfig, layers: int, b: int | None = None
) -> int:
    """Bytes per GPU that one micro-batch's elementwise kernels move through its `layers` blocks in eager mode,
    where each op is a kernel that reads its inputs from HBM and writes its output there (torch.compile fuses
    each chain into one kernel, which leaves about the kept tensors' traffic). Per token and block, forward,
    our model's ops (a: compute bytes, r: residual bytes):
      norms      2 x the norm (r x h in; under autocast fp32 out, 4h, then cast for the matmul, 4h in and
                 a x h out; else a x h out)
      rotary     q and k (width w = q + kv): 4 products of halves (read w/2, write w/2), 2 sums (read w, write
                 w/2) and the concatenation (read w, write w): 9 x a x w
      residual   2 adds: the branch (a) and the stream (r) read, the stream written: 2 x (a + 2r) x h
      MLP        SwiGLU: silu(gate) (read and write H') and its product with up (read 2H', write H'): 5 x a x H';
                 GELU: 2 x a x H'
    Backward moves twice the forward's bytes (each op reads the gradient and its saved inputs and writes the
    gradients of its inputs); recomputation runs the forward's ops again (selective: all but the last residual
    add, whose output backward never needs; full: all). Attention (SDPA) and the matmuls are not elementwise:
    counted elsewhere."""
    b = b or t.micro_batch_size
    a, r = COMPUTE_BYTES[t.precision], residual_bytes(t, parallel)
    h, I = m.hidden_size, m.intermediate_size
    tp, sp = parallel.tensor, parallel.sequence_parallel
    llama = m.family == "llama"
    width = (m.num_heads + m.num_kv_heads) * m.head_dim if llama else 0
    norm_out = (4 + 4 + a) * h if t.precision.endswith("-mixed") else a * h
    norms = 2 * (r * h + norm_out) / (tp if sp else 1)
    residual = 2 * (a + 2 * r) * h / (tp if sp else 1)
    activation = (5 if llama else 2) * a * I / tp
    per_token = norms + residual + 9 * a * width / tp + activation
    again = {"none": 0, "selective": per_token - residual / 2, "full": per_token}[t.activation_checkpointing]
    return int(b * t.seq_len * layers * (3 * per_token + again))


def kept_tensor_traffic(
    m: ResolvedModelConfig,
    t: ResolvedTrainConfig,
    parallel: ParallelConfig,
    b: int | None = None,
    native_gqa: bool = True,
    imbalance: float = 1.0,
) -> tuple[float, dict[str, Any]]:
    """Bytes per GPU that the tensors kept for backward move: each written once in forward and read once in
    backward. Recomputed tensors are written and read all the same, so counted as if nothing were recomputed.
    Also returns that count's activation_bytes (its "layers" is the layers on this GPU)."""
    act = activation_bytes(
        m, dataclasses.replace(t, activation_checkpointing="none"), parallel, b, native_gqa, imbalance=imbalance
    )
    return 2 * (act["layers"] * act["per_layer"] + act["once"]), act
