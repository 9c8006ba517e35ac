"""Exact parameter counts from the `model:` section.

LLaMA family, V vocabulary, H width, H' MLP width, L layers, with n_q query and n_kv key/value heads of size d:
    per layer  = H*(n_q*d) + 2*H*(n_kv*d) + (n_q*d)*H      attention q, k, v, o (+ q,k,v biases for Qwen2)
               + 3*H*H'                                    SwiGLU gate, up, down
               + 2*H                                       two RMSNorm weights (+ 2*d: Qwen3's QK-norm)
    total      = V*H (embedding) + L*per_layer + H (final norm) + V*H (output, unless tied)
With n_q = n_kv and d = H/n_q this is the textbook 2VH + H + L(4H^2 + 3HH' + 2H): LLaMA-7B = 6,738,415,616.

GPT-2 family adds learned positions (max_seq_len*H), biases on every linear layer and LayerNorm, and ties the
output layer to the embedding: GPT-2 small = 124,439,808.

With `model.pad_vocab_to` the embedding and output layer have V rounded up to a multiple of it (GPT-2's
50,257 -> 50,304 at 64, as nanoGPT pads: matmul dimensions that are multiples of 64 run on whole tensor-core
tiles). The padded rows are real parameters (counted here, in FLOPs and memory) that no token id reaches.
"""

from __future__ import annotations

from dataclasses import dataclass

from ..config.schema import padded_vocab_size


@dataclass(frozen=True)
class ParamCounts:
    token_embedding: int     # V*H: the input lookup table
    position_embedding: int  # GPT-2's learned positions (a lookup too)
    attention: int           # all layers
    mlp: int                 # all layers
    norm: int                # all layers + final norm
    output: int              # untied output layer (0 when tied: the embedding matrix is reused)
    per_layer: int
    vocab_hidden: int        # V*H, the output matmul's weights whether tied or not

    @property
    def total(self) -> int:
        return (self.token_embedding + self.position_embedding + self.attention + self.mlp + self.norm
                + self.output)

    @property
    def embedding(self) -> int:
        """Input-embedding lookups: token table plus learned positions."""
        return self.token_embedding + self.position_embedding

    @property
    def non_embedding(self) -> int:
        return self.total - self.embedding

    @property
    def flops(self) -> int:
        """N of the PaLM/torchtitan MFU convention: all parameters but the input lookups; a tied output
        layer still does a V*H matmul per token, so it counts."""
        return self.non_embedding + (self.vocab_hidden if self.output == 0 else 0)

    def as_dict(self) -> dict:
        return dict(total=self.total, embedding=self.embedding, non_embedding=self.non_embedding,
                    token_embedding=self.token_embedding, position_embedding=self.position_embedding,
                    attention=self.attention, mlp=self.mlp, norm=self.norm, output=self.output,
                    per_layer=self.per_layer, flops=self.flops)


def count_params(model) -> ParamCounts:
    """`model` is a resolved ModelConfig (num_kv_heads and head_dim filled in)."""
    V, H, I, L = padded_vocab_size(model), model.hidden_size, model.intermediate_size, model.num_layers
    q_width = model.num_heads * model.head_dim
    kv_width = model.num_kv_heads * model.head_dim
    if model.family == "llama":
        attention = H * q_width + 2 * H * kv_width + q_width * H
        if model.qkv_bias:
            attention += q_width + 2 * kv_width
        mlp = 3 * H * I
        norms = 2 * H + (2 * model.head_dim if model.qk_norm else 0)
        final_norm = H
        positions = 0
    else:  # gpt2: fused qkv (c_attn) and c_proj; MLP c_fc and c_proj; LayerNorm weight (+ bias)
        b = 1 if model.bias else 0
        attention = H * 3 * H + b * 3 * H + H * H + b * H
        mlp = H * I + b * I + I * H + b * H
        norms = 2 * (H + b * H)
        final_norm = H + b * H
        positions = model.max_seq_len * H
    return ParamCounts(
        token_embedding=V * H,
        position_embedding=positions,
        attention=L * attention,
        mlp=L * mlp,
        norm=L * norms + final_norm,
        output=0 if model.tie_embeddings else V * H,
        per_layer=attention + mlp + norms,
        vocab_hidden=V * H,
    )


def fused_rows(name: str, model) -> list[int] | None:
    """The row blocks a fused parameter stacks, in order: [q, k, v] for `attn.qkv` (weight and bias), [gate,
    up] for LLaMA's `mlp.up`; None for any other parameter. The export splits them into Hugging Face's
    separate tensors and tensor parallelism hands each rank its share of every block."""
    if name.endswith((".attn.qkv.weight", ".attn.qkv.bias")):
        q, kv = model.num_heads * model.head_dim, model.num_kv_heads * model.head_dim
        return [q, kv, kv]
    if model.family == "llama" and name.endswith(".mlp.up.weight"):
        return [model.intermediate_size, model.intermediate_size]
    return None


def param_shapes(model) -> list[tuple[str, tuple[int, ...]]]:
    """Every parameter tensor of the built model, in module order, with our names: the one layout table the
    planner counts, the export names (model/hf.py) and a test holds against the model's named_parameters()."""
    V, H, I = padded_vocab_size(model), model.hidden_size, model.intermediate_size
    q_width, kv_width = model.num_heads * model.head_dim, model.num_kv_heads * model.head_dim
    llama = model.family == "llama"
    bias = (not llama) and model.bias
    shapes: list[tuple[str, tuple[int, ...]]] = [("embed.weight", (V, H))]
    if not llama:
        shapes.append(("pos_embed.weight", (model.max_seq_len, H)))

    def norm(prefix):
        shapes.append((f"{prefix}.weight", (H,)))
        if bias:
            shapes.append((f"{prefix}.bias", (H,)))

    def linear(prefix, out_features, in_features, has_bias):
        shapes.append((f"{prefix}.weight", (out_features, in_features)))
        if has_bias:
            shapes.append((f"{prefix}.bias", (out_features,)))

    for i in range(model.num_layers):
        p = f"blocks.{i}"
        norm(f"{p}.attn_norm")
        linear(f"{p}.attn.qkv", q_width + 2 * kv_width, H, bias or (llama and model.qkv_bias))
        linear(f"{p}.attn.proj", H, q_width, bias)
        if llama and model.qk_norm:
            shapes += [(f"{p}.attn.q_norm.weight", (model.head_dim,)), (f"{p}.attn.k_norm.weight", (model.head_dim,))]
        norm(f"{p}.mlp_norm")
        linear(f"{p}.mlp.up", 2 * I if llama else I, H, bias)
        linear(f"{p}.mlp.down", H, I, bias)
    norm("norm")
    if not model.tie_embeddings:
        shapes.append(("lm_head.weight", (V, H)))
    return shapes
