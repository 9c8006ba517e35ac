"""Decoder-only transformers, LLaMA and GPT-2 families, built from the `model:` config section.

LLaMA: RMSNorm, rotary positions (Hugging Face's rotate-half layout), SwiGLU MLP, grouped-query attention,
no biases (q/k/v biases for Qwen2), optional QK-norm (Qwen3), optional tied embeddings.
GPT-2: LayerNorm, learned positions, GELU MLP, biases, tied embeddings.

q, k, v are one fused matmul (`qkv`) and the SwiGLU gate and up projections another (`mlp.up`): one kernel
instead of three (two), and one saved copy of the block input for backward instead of three (two). The export
to Hugging Face splits them again.

Initialisation (GPT-2 / nanoGPT / Megatron): every matmul weight and embedding ~ N(0, init_std), residual
output projections (attention `proj`, MLP `down`) ~ N(0, init_std / sqrt(2 * num_layers)) so the residual
stream's variance does not grow with depth; biases 0, norm weights 1.
"""

from __future__ import annotations

import math
import zlib
from typing import TYPE_CHECKING, cast

import torch
import torch.nn.functional as F
from torch import nn

from ..plan.params import padded_vocab_size
from . import documents as docs
from .attention import Attention, takes_gqa
from .loss import build_loss
from .moe import MoE, moe_width, router_loss
from .norm import RMSNorm
from .rope import inverse_frequencies

if TYPE_CHECKING:
    from ..config import ResolvedConfig
    from ..config.schema import ResolvedModelConfig


def rotary_tables(
    head_dim: int, seq_len: int, theta: float, device=None, scaling: dict | None = None
) -> tuple[torch.Tensor, torch.Tensor]:
    """cos and sin of position * theta^(-2i/d), shape (seq_len, head_dim / 2), fp32; with model.rope_scaling
    the frequencies are stretched and both tables scaled by YaRN's attention factor (model/rope.py)."""
    inv_freq, attention_factor = inverse_frequencies(head_dim, theta, scaling, device=device)
    angles = torch.outer(torch.arange(seq_len, dtype=torch.float32, device=device), inv_freq)
    return angles.cos() * attention_factor, angles.sin() * attention_factor  # x 1.0 leaves them bitwise as they are


class SwiGLU(nn.Module):
    """silu(gate) * up over the fused gate|up projection (Shazeer 2020, "GLU Variants Improve Transformer").
    A module of its own, without parameters, so that activation checkpointing can take it alone."""

    def forward(self, h):
        gate, up = h.chunk(2, dim=-1)
        return F.silu(gate) * up


class MLP(nn.Module):
    def __init__(self, cfg, intermediate_size: int | None = None):
        super().__init__()
        swiglu = cfg.family == "llama"
        bias = cfg.bias if cfg.family == "gpt2" else False
        inner = intermediate_size or cfg.intermediate_size  # another width: MoE's shared experts
        self.up = nn.Linear(cfg.hidden_size, 2 * inner if swiglu else inner, bias=bias)  # SwiGLU: gate, up fused
        self.act = SwiGLU() if swiglu else nn.GELU(approximate="tanh")  # GPT-2's gelu_new
        self.down = nn.Linear(inner, cfg.hidden_size, bias=bias)

    def forward(self, x):
        return self.down(self.act(self.up(x)))


class Block(nn.Module):
    """Pre-norm residual block. Activation checkpointing is applied from outside
    (pretrain.distributed.recompute): the block itself always computes and keeps everything."""

    def __init__(self, cfg, attention: str, index: int = 0):
        super().__init__()
        self.attn_norm = _norm(cfg)
        self.attn = Attention(cfg, attention)
        self.mlp_norm = _norm(cfg)
        self.mlp = MLP(cfg) if not is_moe_block(cfg, index) else MoE(cfg, shared_experts(cfg))
        self.dropout = cfg.dropout

    def forward(self, x, rope, mask=None):
        x = x + self._dropout(self.attn(self.attn_norm(x), rope, mask))
        return x + self._dropout(self.mlp(self.mlp_norm(x)))

    def _dropout(self, x):
        # Only when asked: even p=0 dropout keeps a mask for backward.
        return F.dropout(x, self.dropout, self.training) if self.dropout else x


def is_moe_block(cfg, index: int) -> bool:
    """Block `index`'s feed-forward is routed experts (model.num_experts), after model.first_dense_layers."""
    return cfg.num_experts > 0 and index >= cfg.first_dense_layers


def shared_experts(cfg) -> MLP | None:
    return MLP(cfg, cfg.num_shared_experts * moe_width(cfg)) if cfg.num_shared_experts else None


def _device_of(p) -> torch.device:
    local = getattr(p, "_local_tensor", p)
    return local.device


@torch.no_grad()
def _fill(p, init, row_order=None) -> None:
    """Apply `init` to the whole logical tensor, in fp32 whatever the parameter's dtype. A DTensor (FSDP2's
    chunks of ceil(d0 / n) rows, tensor parallelism's rows or columns, or both) gets this rank's part of the
    full tensor, made one parameter at a time. `row_order`: the full tensor's rows in the order the parameter
    holds them, of which it holds the first p.shape[0]: all of them for a fused projection under tensor
    parallelism (pretrain.distributed.tensor_parallel), a rank's own experts under expert parallelism."""
    local = getattr(p, "_local_tensor", None)
    rows = p.shape[0] if row_order is None else len(row_order)
    full = init(torch.empty((rows, *p.shape[1:]), dtype=torch.float32, device=_device_of(p)))
    if row_order is not None:
        full = full[row_order[: p.shape[0]].to(full.device)]
    if local is None:
        p.copy_(full)
        return
    from torch.distributed.tensor._utils import compute_local_shape_and_global_offset

    shape, offset = compute_local_shape_and_global_offset(p.shape, p.device_mesh, p.placements)
    local.copy_(full[tuple(slice(o, o + n) for o, n in zip(offset, shape))])


def _norm(cfg) -> nn.Module:
    if cfg.family == "llama":
        return RMSNorm(cfg.hidden_size, cfg.norm_eps)
    return nn.LayerNorm(cfg.hidden_size, eps=cfg.norm_eps, bias=cfg.bias)


# The matmuls that write into the residual stream (their init is scaled down with depth); MoE: the experts'
# down projections and the shared experts' (`mlp.shared.down.weight`).
RESIDUAL_OUTPUTS = ("attn.proj.weight", "mlp.down.weight", "mlp.experts.down", "shared.down.weight")


class Transformer(nn.Module):
    config: ResolvedModelConfig
    training_config: ResolvedConfig  # the whole run's, set by load_model (checkpoint/contents.py): data dir, tokenizer

    def __init__(self, cfg, attention: str = "sdpa", loss: str = "chunked", loss_chunk_tokens: int = 4096):
        super().__init__()
        self.config = cfg
        rows = padded_vocab_size(cfg)  # model.pad_vocab_to: whole tensor-core tiles for the output matmul
        self.embed = nn.Embedding(rows, cfg.hidden_size)
        self.pos_embed = nn.Embedding(cfg.max_seq_len, cfg.hidden_size) if cfg.family == "gpt2" else None
        self.blocks = nn.ModuleList(Block(cfg, attention, i) for i in range(cfg.num_layers))
        self.norm = _norm(cfg)
        self.lm_head = nn.Linear(cfg.hidden_size, rows, bias=False)
        if cfg.tie_embeddings:
            self.lm_head.weight = self.embed.weight
        # Output layer + loss (no parameters of its own); padded rows take no part in the softmax.
        self.loss = build_loss(loss, loss_chunk_tokens, cfg.vocab_size)
        self.rope: tuple[torch.Tensor, torch.Tensor] | None = None  # rotary tables, built on first use
        # The documents of a window (train.document_masking, model.position_reset); None: packing as is.
        self.documents: docs.Documents | None = None
        # Fused parameters whose rows are held in another order (tensor parallelism: name -> row order).
        self.row_orders: dict[str, torch.Tensor] = {}
        self.lm_loss: torch.Tensor | None = None  # MoE: the last training loss without the balancing terms
        # train.half_residual: the dtype the residual stream is cast to after the embedding (None: as it comes,
        # fp32 under autocast, which then makes every residual add fp32)
        self.residual_dtype: torch.dtype | None = None

    def reset_parameters(self, seed: int = 0):
        """Initialise every parameter from its own generator, seeded by (seed, parameter name): the values do
        not depend on module order, and a sharded parameter (FSDP, built on the meta device) gets exactly the
        rows a single process would give it."""
        std = self.config.init_std
        residual_std = std / math.sqrt(2 * self.config.num_layers)
        for name, p in self.named_parameters():
            if p.is_meta:  # another pipeline stage's: that stage's rank initialises it
                continue
            order = self.row_orders.get(name)
            if name.endswith("norm.weight"):
                _fill(p, lambda t: t.fill_(1.0))
            elif name.endswith(".bias"):
                _fill(p, lambda t: t.zero_())
            else:
                scale = residual_std if name.endswith(RESIDUAL_OUTPUTS) else std
                g = torch.Generator(device=_device_of(p)).manual_seed(seed * 1_000_003 + zlib.crc32(name.encode()))
                _fill(p, lambda t, s=scale, g=g: t.normal_(0.0, s, generator=g), order)
        for module in self.modules():
            if isinstance(module, MoE):
                module.reset_buffers()

    def fix_attention_kernel(self, device: torch.device, half: bool) -> bool:
        """Decide once, for this device and compute dtype, whether SDPA takes the grouped k/v heads (a
        constant for torch.compile instead of a per-call check); returns the decision."""
        decision = takes_gqa(device, half, self.config.head_dim)
        for block in self.blocks:
            cast(Block, block).attn.native_gqa = decision
        return decision

    def rotary(self, seq_len: int, device):
        """The (cos, sin) tables for seq_len positions, built on first use (call it before torch.compile:
        a table built inside the compiled forward would make it compile twice)."""
        if self.pos_embed is not None:
            return None
        if self.rope is None or self.rope[0].shape[0] < seq_len or self.rope[0].device != device:
            cfg = self.config
            self.rope = rotary_tables(
                cfg.head_dim, max(seq_len, 1), cfg.rope_theta, device=device, scaling=cfg.rope_scaling
            )
        return self.rope

    def embed_tokens(self, tokens, positions=None):
        """tokens (batch, seq) -> the residual stream's input (batch, seq, hidden): what the first pipeline
        stage computes before its blocks. `positions` (batch, seq): each token's place in its document (GPT-2's
        learned positions restart with it), else 0 .. seq-1."""
        x = self.embed(tokens)
        if self.pos_embed is not None:
            x = x + self.pos_embed(
                torch.arange(tokens.shape[1], device=tokens.device) if positions is None else positions
            )
        if self.config.dropout:
            x = F.dropout(x, self.config.dropout, self.training)
        return x if self.residual_dtype is None else x.to(self.residual_dtype)

    def window_layout(self, tokens):
        """(positions, rope, mask) of a batch of windows: each token's place in its document (None: 0 .. seq-1),
        the rotary tables or each token's rows of them, and the attention mask (None: causal) that every block
        takes (pretrain.model.documents)."""
        positions, mask = docs.layout(tokens, self.documents)
        rope = self.rotary(tokens.shape[1], tokens.device)
        if rope is not None and positions is not None:
            rope = tuple(t[positions] for t in rope)  # each token's angle: its place in its document
        return positions, rope, mask

    def hidden_states(self, tokens):
        """tokens (batch, seq) -> the final norm's output (batch, seq, hidden): what the output layer reads."""
        positions, rope, mask = self.window_layout(tokens)
        x = self.embed_tokens(tokens, positions)
        for block in self.blocks:
            x = block(x, rope, mask)
        return self.norm(x)

    def forward(self, tokens, targets=None):
        """tokens (batch, seq) -> logits (batch, seq, vocab), or the mean cross-entropy when targets are given."""
        x = self.hidden_states(tokens)
        if targets is None:
            # Padded rows (model.pad_vocab_to) are for the matmul's shape only: no token is one of them, so
            # they are never sampled and the distribution is the exported model's.
            return self.lm_head(x)[..., : self.config.vocab_size]
        loss = self.loss(x, self.lm_head.weight, targets)
        balancing = router_loss(self) if self.config.num_experts else None
        if balancing is None:
            return loss
        self.lm_loss = loss.detach()  # what the trainer reports as the loss: cross-entropy alone
        return loss + balancing
