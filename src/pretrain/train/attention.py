"""Which SDPA kernel attention runs on, chosen per step on Hopper and newer, and recorded everywhere.

On an H100 the cuDNN and flash kernels are the fast ones for training shapes, and the memory-efficient one can
be up to 2x slower; torch picks by a priority list that has changed between releases. In 16-bit on compute
capability 9.0+, a training step runs under `sdpa_kernel` with cuDNN first, then flash (the memory-efficient
and math kernels stay behind them for shapes neither takes): a context around the step's forward and
backward, so the process's own flags are as they were after it, and an fp32 attention later in the same
process (the fp32 cells of a precision sweep, an evaluation) finds every kernel. Which one ran is found by
running one attention of the run's shape under the same choice and watching the aten op it dispatches to,
and goes into plan_vs_run.json.
"""

from __future__ import annotations

import contextlib
import functools
import inspect
from collections.abc import Callable
from typing import TYPE_CHECKING

import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel
from torch.utils._python_dispatch import TorchDispatchMode

from .. import precision as precisions
from ..model.attention import takes_gqa

if TYPE_CHECKING:
    from ..config.schema import ResolvedConfig

# The fused kernels' aten ops (SDPA itself is a composite: it dispatches to one of these, else to plain math).
KERNELS = {
    "_scaled_dot_product_flash_attention": "flash",
    "_scaled_dot_product_flash_attention_for_cpu": "flash",
    "_scaled_dot_product_cudnn_attention": "cudnn",
    "_scaled_dot_product_efficient_attention": "efficient",
}


# cuDNN, then flash; the others only for shapes neither takes.
HOPPER_ORDER = [SDPBackend.CUDNN_ATTENTION, SDPBackend.FLASH_ATTENTION, SDPBackend.EFFICIENT_ATTENTION, SDPBackend.MATH]
# torch >= 2.6 takes the list as a priority order; an older one only as a set, in its own order: there the
# set is the two fast kernels alone, as the trainer's choice was before set_priority existed.
SET_PRIORITY = "set_priority" in inspect.signature(sdpa_kernel).parameters


# cuDNN attention after Hopper (compute capability 10.x, Blackwell) corrupts grouped-query attention with fewer
# than 8 k/v heads (pytorch#193893): kept to sm_90 there until torch fixes it.
CUDNN_MIN_KV_HEADS_AFTER_HOPPER = 8


def preferred_kernels(
    precision: str, capability: tuple[int, int] | None, kv_heads: int | None = None
) -> list[SDPBackend] | None:
    """The SDPA kernels, in priority order, for a run in `precision` on a GPU of compute `capability` (None:
    not a GPU) whose attention has `kv_heads` k/v heads per rank; None where torch's own choice stands."""
    if capability is None or capability < (9, 0) or precisions.half_dtype(precision) is None:
        return None
    if capability >= (10, 0) and kv_heads is not None and kv_heads < CUDNN_MIN_KV_HEADS_AFTER_HOPPER:
        return [b for b in HOPPER_ORDER if b != SDPBackend.CUDNN_ATTENTION]  # never torch's choice of cuDNN
    return HOPPER_ORDER


def kernel_choice(backends: list[SDPBackend] | None) -> Callable[[], contextlib.AbstractContextManager]:
    """A context factory: SDPA restricted to `backends`, in that order, while it is entered; the flags and
    the priority order as they were after it."""
    if backends is None:
        return contextlib.nullcontext
    if SET_PRIORITY:
        return functools.partial(sdpa_kernel, backends, set_priority=True)
    return functools.partial(sdpa_kernel, backends[:2])


def kernel_context(
    device: torch.device, precision: str, kv_heads: int | None = None
) -> Callable[[], contextlib.AbstractContextManager]:
    """The context a training step of this run enters around its forward and backward passes."""
    capability = torch.cuda.get_device_capability(device) if device.type == "cuda" else None
    return kernel_choice(preferred_kernels(precision, capability, kv_heads))


class _Ops(TorchDispatchMode):
    def __init__(self):
        super().__init__()
        self.names: list[str] = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        self.names.append(func.overloadpacket.__name__)
        return func(*args, **(kwargs or {}))


def kernel_that_runs(config: ResolvedConfig, device: torch.device) -> str:
    """flash | cudnn | efficient | math | flex: the kernel one training attention of this run's shape runs on,
    under the kernel choice its steps make (with train.document_masking: under its mask)."""
    m, t = config.model, config.train
    if t.attention == "eager":
        return "math"
    if t.document_masking and device.type == "cuda":
        return "flex"  # pretrain.model.documents.document_kernel: FlexAttention or a refusal, never unmasked
    half = precisions.half_dtype(t.precision)
    dtype = half or torch.float32
    head_dim, seq_len = m.head_dim, t.seq_len
    gqa = m.num_kv_heads != m.num_heads and takes_gqa(device, half is not None, head_dim)
    kv_heads = m.num_kv_heads if gqa else m.num_heads
    q = torch.zeros(1, m.num_heads, seq_len, head_dim, device=device, dtype=dtype, requires_grad=True)
    k = torch.zeros(1, kv_heads, seq_len, head_dim, device=device, dtype=dtype, requires_grad=True)
    mask = torch.ones(1, 1, seq_len, seq_len, dtype=torch.bool, device=device).tril() if t.document_masking else None
    ops = _Ops()
    with kernel_context(device, t.precision, rank_kv_heads(config))(), ops:
        F.scaled_dot_product_attention(
            q, k, k, attn_mask=mask, dropout_p=m.dropout, is_causal=mask is None, enable_gqa=gqa
        )
    return next((KERNELS[name] for name in ops.names if name in KERNELS), "math")


def rank_kv_heads(config: ResolvedConfig) -> int:
    """The k/v heads of one rank's attention: tensor parallelism splits them."""
    return config.model.num_kv_heads // config.parallel.tensor
