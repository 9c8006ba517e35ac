"""Which SDPA kernel attention runs on, chosen on Hopper and newer, and recorded everywhere.

On an H100 the cuDNN and flash kernels are the fast ones for training shapes, and the memory-efficient one can
be up to 2x slower; torch picks by a priority list that has changed between releases. In 16-bit on compute
capability 9.0+, the trainer leaves SDPA only those two. Which one ran is found by running one attention of
the run's shape and watching the aten op it dispatches to, and goes into plan_vs_run.json.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch.utils._python_dispatch import TorchDispatchMode

from .. import precision as precisions
from ..model.transformer import takes_gqa

# The fused kernels' aten ops (SDPA itself is a composite: it dispatches to one of these, else to plain math).
KERNELS = {
    "_scaled_dot_product_flash_attention": "flash",
    "_scaled_dot_product_flash_attention_for_cpu": "flash",
    "_scaled_dot_product_cudnn_attention": "cudnn",
    "_scaled_dot_product_efficient_attention": "efficient",
}


def restrict_kernels(device: torch.device, precision: str) -> bool:
    """On Hopper and newer in 16-bit: SDPA may use only cuDNN and flash attention. Returns whether it did."""
    if device.type != "cuda" or precisions.half_dtype(precision) is None:
        return False
    if torch.cuda.get_device_capability(device) < (9, 0):
        return False
    torch.backends.cuda.enable_mem_efficient_sdp(False)
    torch.backends.cuda.enable_math_sdp(False)
    return True


class _Ops(TorchDispatchMode):
    def __init__(self):
        super().__init__()
        self.names: list[str] = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        self.names.append(func.overloadpacket.__name__)
        return func(*args, **(kwargs or {}))


def kernel_that_runs(config, device: torch.device) -> str:
    """flash | cudnn | efficient | math: the kernel one training attention of this run's shape runs on."""
    m, t = config.model, config.train
    if t.attention == "eager":
        return "math"
    half = precisions.half_dtype(t.precision)
    dtype = half or torch.float32
    gqa = m.num_kv_heads != m.num_heads and takes_gqa(device, half is not None, m.head_dim)
    kv_heads = m.num_kv_heads if gqa else m.num_heads
    q = torch.zeros(1, m.num_heads, t.seq_len, m.head_dim, device=device, dtype=dtype, requires_grad=True)
    k = torch.zeros(1, kv_heads, t.seq_len, m.head_dim, device=device, dtype=dtype, requires_grad=True)
    ops = _Ops()
    with ops:
        F.scaled_dot_product_attention(q, k, k, dropout_p=m.dropout, is_causal=True, enable_gqa=gqa)
    return next((KERNELS[name] for name in ops.names if name in KERNELS), "math")
