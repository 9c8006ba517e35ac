"""`train.precision` in torch's terms, one home for the rule (the planner's pure-Python twin is
`pretrain.gpus.COMPUTE_DTYPE`).

  fp32        fp32 weights and matmuls (TF32 on CUDA)
  fp16-mixed  fp32 weights, autocast to fp16 (with a loss scaler)
  bf16-mixed  fp32 weights, autocast to bf16
  bf16        pure bf16 weights, gradients and optimizer states
  fp8         as bf16-mixed, and the blocks' linears multiply in float8 (torchao, distributed/fp8.py)
"""

from __future__ import annotations

import contextlib
import functools

import torch

from .gpus import COMPUTE_DTYPE, mixed_precision

# Matmul dtypes by the planner's names; tf32 is fp32 tensors with TF32 matmuls allowed.
TORCH_DTYPES = {"fp32": torch.float32, "tf32": torch.float32, "fp16": torch.float16, "bf16": torch.bfloat16}


def matmul_dtype(precision: str, device_type: str) -> str:
    """The dtype a run's matmuls execute in, by the planner's names: fp32 runs as tf32 on CUDA (the trainer
    allows it), as fp32 on a CPU (which has no TF32)."""
    dtype = COMPUTE_DTYPE[precision]
    return "fp32" if dtype == "tf32" and device_type != "cuda" else dtype


def half_dtype(precision: str) -> torch.dtype | None:
    """The 16-bit dtype the matmuls run in (fp8: those outside the converted linears), or None for fp32."""
    return {
        "fp16-mixed": torch.float16,
        "bf16-mixed": torch.bfloat16,
        "bf16": torch.bfloat16,
        "fp8": torch.bfloat16,
    }.get(precision)


def weight_dtype(precision: str) -> torch.dtype:
    """The dtype the parameters are stored in."""
    return torch.bfloat16 if precision == "bf16" else torch.float32


def autocast(precision: str, device: torch.device, cache: bool = False):
    """A context factory: autocast for the *-mixed precisions and fp8, nothing otherwise. No weight-cast cache by
    default: the planner counts the casts each matmul keeps for backward, and a cache keeps them until the
    outermost autocast context ends. `cache` (train.cache_weight_casts): the trainer opens one context around a
    step's micro-batches, so each weight is cast once per step (torch caches casts of leaf tensors that require
    grad, and the nested contexts keep the cache)."""
    if mixed_precision(precision):
        return functools.partial(torch.autocast, device.type, dtype=half_dtype(precision), cache_enabled=cache)
    return contextlib.nullcontext
