"""Self-attention of the LLaMA and GPT-2 families: the q/k/v projections (QK-norm, rotary positions), then one
kernel, chosen by the kind of mask a window has (`mask_kind`) and train.attention:

  causal    no mask: SDPA's causal kernels (flash, memory-efficient), or the eager softmax
  dense     a boolean (batch, 1, seq, seq) mask (True = attends): SDPA with it, or the eager softmax
  lengths   each row's document lengths (document masking on a CPU): causal SDPA on each document alone
  block     a FlexAttention block mask (document masking on CUDA, pretrain.model.documents)

The kernels take q, k, v as (batch, heads, seq, head_dim) and know nothing of the projections that made them,
so that another attention's projections (multi-head latent attention's low-rank ones) reuse them.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import nn

from ..plan.kernels import native_gqa
from . import documents as docs
from .norm import RMSNorm


def apply_rotary(x, cos, sin):
    """Rotate pairs (x_i, x_{i+d/2}) of x (batch, seq, heads, head_dim) by the position's angle."""
    x1, x2 = x.chunk(2, dim=-1)
    return torch.cat((x1 * cos - x2 * sin, x2 * cos + x1 * sin), dim=-1)


def takes_gqa(device: torch.device, half: bool, head_dim: int) -> bool:
    """Does SDPA run grouped k/v heads on a fused kernel here? The rule is pretrain.plan.kernels'."""
    flash_gpu = device.type != "cuda" or torch.cuda.get_device_capability(device) >= (8, 0)
    return native_gqa(device.type, half, head_dim, torch.__version__, flash_gpu)


def mask_kind(mask) -> str:
    """causal (None), lengths (a tuple: each row's document lengths), dense (a boolean tensor) or block (any
    other: FlexAttention's BlockMask)."""
    if mask is None:
        return "causal"
    if isinstance(mask, tuple):
        return "lengths"
    return "dense" if isinstance(mask, torch.Tensor) else "block"


def flex_kernel(q, k, v, mask, dropout: float, gqa: bool):
    """FlexAttention over a block mask (CUDA): no dropout, refused at start (documents.document_kernel)."""
    return docs.flex_attention(q, k, v, mask, enable_gqa=gqa)


def per_document_kernel(q, k, v, lengths: tuple, dropout: float, gqa: bool):
    """Causal SDPA on each document of each row alone (`lengths`: each row's document lengths)."""
    return torch.cat(
        [
            torch.cat(
                [
                    F.scaled_dot_product_attention(*qkv, dropout_p=dropout, is_causal=True, enable_gqa=gqa)
                    for qkv in zip(*(t[row : row + 1].split(row_lengths, dim=2) for t in (q, k, v)))
                ],
                dim=2,
            )
            for row, row_lengths in enumerate(lengths)
        ]
    )


def sdpa_kernel(q, k, v, mask, dropout: float, gqa: bool):
    """torch's scaled_dot_product_attention: causal without a mask, else with the dense mask given."""
    return F.scaled_dot_product_attention(
        q, k, v, attn_mask=mask, dropout_p=dropout, is_causal=mask is None, enable_gqa=gqa
    )


def eager_kernel(q, k, v, mask, dropout: float, gqa: bool):
    """The formula written out: the seq x seq scores are materialised (and kept for backward), the softmax in
    fp32 on every device."""
    if gqa:
        group = q.shape[1] // k.shape[1]
        k, v = k.repeat_interleave(group, dim=1), v.repeat_interleave(group, dim=1)
    scores = (q @ k.transpose(-2, -1)) / math.sqrt(q.shape[-1])
    if mask is None:
        s = q.shape[2]
        mask = torch.ones(s, s, dtype=torch.bool, device=q.device).tril()
    scores = scores.masked_fill(~mask, float("-inf"))
    probs = scores.float().softmax(dim=-1).to(q.dtype)
    return (F.dropout(probs, dropout) if dropout else probs) @ v


class Attention(nn.Module):
    def __init__(self, cfg, attention: str):
        super().__init__()
        self.num_heads, self.num_kv_heads, self.head_dim = cfg.num_heads, cfg.num_kv_heads, cfg.head_dim
        q_width, kv_width = cfg.num_heads * cfg.head_dim, cfg.num_kv_heads * cfg.head_dim
        gpt2 = cfg.family == "gpt2"
        self.qkv = nn.Linear(cfg.hidden_size, q_width + 2 * kv_width, bias=cfg.bias if gpt2 else cfg.qkv_bias)
        self.proj = nn.Linear(q_width, cfg.hidden_size, bias=cfg.bias if gpt2 else False)
        self.rotary = not gpt2
        # Qwen3's QK-norm: one RMSNorm weight of head_dim, shared by every query head (and one by every key head);
        # OLMoE's (qk_norm_over: projection): one over the whole q projection and one over the whole k
        self.whole_qk_norm = cfg.qk_norm_over == "projection"
        q_norm_width, k_norm_width = (q_width, kv_width) if self.whole_qk_norm else (cfg.head_dim, cfg.head_dim)
        self.q_norm = RMSNorm(q_norm_width, cfg.norm_eps) if cfg.qk_norm else None
        self.k_norm = RMSNorm(k_norm_width, cfg.norm_eps) if cfg.qk_norm else None
        self.attention = attention
        self.dropout = cfg.dropout
        self.native_gqa: bool | None = None  # None: decided per call; the trainer fixes it before compiling

    def forward(self, x, rope, mask=None):
        """`rope`: the (cos, sin) tables by position (seq rows and up), or per token (batch, seq, head_dim / 2)
        when positions restart at each document; `mask`: see `mask_kind`."""
        q, k, v = self.project(x, rope)
        b, s = q.shape[:2]
        return self.proj(self.attend(q, k, v, mask).transpose(1, 2).reshape(b, s, -1))

    def project(self, x, rope):
        """q, k, v (batch, seq, heads, head_dim) of x, normed and rotated. Head counts and sequence length come
        from the projection's output, not the config: under tensor parallelism this rank holds kv_heads / t
        whole k/v groups (and their q heads), and under sequence parallelism x is this rank's part of the
        sequence while the projection covers all of it."""
        qkv = self.qkv(x)
        b, s, width = qkv.shape
        group = self.num_heads // self.num_kv_heads
        kv_heads = width // ((group + 2) * self.head_dim)
        heads = group * kv_heads
        q, k, v = qkv.split([heads * self.head_dim, kv_heads * self.head_dim, kv_heads * self.head_dim], dim=-1)
        if self.q_norm is not None and self.k_norm is not None and self.whole_qk_norm:
            q, k = self.q_norm(q), self.k_norm(k)  # over the projection (transformers' OlmoeAttention)
        q = q.view(b, s, heads, self.head_dim)
        k = k.view(b, s, kv_heads, self.head_dim)
        v = v.view(b, s, kv_heads, self.head_dim)
        if self.q_norm is not None and self.k_norm is not None and not self.whole_qk_norm:
            # over each head's vector, before the rotation (transformers' Qwen3Attention)
            q, k = self.q_norm(q), self.k_norm(k)
        if self.rotary:
            cos, sin = ((t[:s, None, :] if t.dim() == 2 else t[:, :, None, :]).to(q.dtype) for t in rope)
            q, k = apply_rotary(q, cos, sin), apply_rotary(k, cos, sin)
        return q, k, v

    def attend(self, q, k, v, mask):
        """The output of each head (batch, heads, seq, head_dim) for q, k, v (batch, seq, heads, head_dim), by
        the kernel of this mask kind (the module docstring's table)."""
        kind = mask_kind(mask)
        gqa = q.shape[2] > k.shape[2]  # grouped-query attention: each k/v head serves a group
        if gqa and self.attention == "sdpa" and kind != "block" and not self.sdpa_takes_gqa(q):
            k, v = self.repeat_kv(k), self.repeat_kv(v)  # so that a fused kernel runs, not the math one
            gqa = False
        # (batch, heads, seq, head_dim) views of (batch, seq, heads, head_dim) memory: attention kernels
        # return their output in the same layout, so the transpose back (forward) is free.
        q, k, v = q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2)
        if kind == "block":
            kernel = flex_kernel
        elif kind == "lengths":
            kernel = per_document_kernel
        else:
            kernel = sdpa_kernel if self.attention == "sdpa" else eager_kernel
        return kernel(q, k, v, mask, self.dropout if self.training else 0.0, gqa)

    def sdpa_takes_gqa(self, q) -> bool:
        if self.native_gqa is not None:
            return self.native_gqa
        return takes_gqa(q.device, q.dtype in (torch.float16, torch.bfloat16), self.head_dim)

    def repeat_kv(self, t):
        """(batch, seq, kv_heads, head_dim) -> (batch, seq, heads, head_dim), each k/v head once per query head
        of its group (the Hugging Face / torchtitan order)."""
        b, s, kv, d = t.shape
        group = self.num_heads // self.num_kv_heads
        return t[:, :, :, None, :].expand(b, s, kv, group, d).reshape(b, s, kv * group, d)
