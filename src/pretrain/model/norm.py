"""RMSNorm, the LLaMA family's norm (blocks, final norm, QK-norm)."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn


class RMSNorm(nn.Module):
    """x / sqrt(mean(x^2) + eps) * weight, computed in fp32 whatever the input dtype (Zhang and Sennrich 2019).

    Through `F.rms_norm` where torch has it (2.4 on). On the CPU it runs the same ops as the formula written
    out below: bitwise the same output and gradients, and the same tensors kept for backward, which is what
    the planner counts (tests/model/test_norm.py). On CUDA (torch >= 2.8) it runs a fused kernel that keeps
    fewer tensors (the input and 1/rms), which the plan counts there (pretrain.plan.kernels.fused_rms_norm);
    under torch.compile the norm is one fused kernel either way.
    """

    def __init__(self, dim: int, eps: float):
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(dim))

    def forward(self, x):
        # A bf16 input under an fp32 weight (QK-norm under autocast) has no fused kernel: F.rms_norm falls back
        # to this formula, warning on every call; the formula itself is bitwise the same (tests/model/test_norm.py).
        if _HAS_RMS_NORM and x.dtype == self.weight.dtype:
            return F.rms_norm(x, (x.shape[-1],), self.weight, self.eps)
        x32 = x.float()
        normed = x32 * torch.rsqrt(x32.pow(2).mean(-1, keepdim=True) + self.eps)
        return (normed * self.weight).type_as(x)


_HAS_RMS_NORM = hasattr(F, "rms_norm")
