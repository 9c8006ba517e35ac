"""Exact parameter counts from the `model:` section.

LLaMA family, V vocabulary, H width, H' MLP width, L layers, with n_q query and n_kv key/value heads of size d:
    per layer  = H*(n_q*d) + 2*H*(n_kv*d) + (n_q*d)*H      attention q, k, v, o (+ q,k,v biases for Qwen2)
               + 3*H*H'                                    SwiGLU gate, up, down
               + 2*H                                       two RMSNorm weights (+ 2*d: Qwen3's QK-norm)
    total      = V*H (embedding) + L*per_layer + H (final norm) + V*H (output, unless tied)
With n_q = n_kv and d = H/n_q this is the textbook 2VH + H + L(4H^2 + 3HH' + 2H): LLaMA-7B = 6,738,415,616.

GPT-2 family adds learned positions (max_seq_len*H), biases on every linear layer and LayerNorm, and ties the
output layer to the embedding: GPT-2 small = 124,439,808.

Mixture-of-Experts (model.num_experts E > 0): the blocks after model.first_dense_layers replace the MLP by a
router (E x H), E routed SwiGLU experts of width H_e (3*H*H_e each) and the shared experts every token passes;
gpt-oss adds biases to the router and the experts. A token runs k = experts_per_token routed experts, so
    active = total - (E - k)/E x routed-expert parameters          (input embedding included)
(Mixtral-8x7B 46,702,792,704 / 12,879,925,248; DeepSeek-V3 671,026,404,352 / 37,552,282,624, as transformers
builds them). Multi-head latent attention (DeepSeek-V3) projects queries and keys/values through low-rank
latents, each with an RMSNorm; gpt-oss adds an output-projection bias and a sink logit per head.

With `model.pad_vocab_to` the embedding and output layer have V rounded up to a multiple of it (GPT-2's
50,257 -> 50,304 at 64, as nanoGPT pads: matmul dimensions that are multiples of 64 run on whole tensor-core
tiles). The padded rows are real parameters (counted here, in FLOPs and memory) that no token id reaches.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from ..config.schema import ResolvedModelConfig, padded_vocab_size


@dataclass(frozen=True)
class ParamCounts:
    token_embedding: int  # V*H: the input lookup table
    position_embedding: int  # GPT-2's learned positions (a lookup too)
    attention: int  # all layers
    mlp: int  # all layers (MoE: routers, routed and shared experts, dense MLPs)
    norm: int  # all layers + final norm
    output: int  # untied output layer (0 when tied: the embedding matrix is reused)
    per_layer: int  # one block (MoE: one MoE block, every expert)
    vocab_hidden: int  # V*H, the output matmul's weights whether tied or not
    routed_experts: int = 0  # MoE: every routed expert of every layer
    inactive: int = 0  # MoE: the routed-expert parameters a token does not run, (E - k)/E of them
    final_norm: int = 0
    mtp: int = 0  # multi-token prediction modules' own parameters (model.mtp_layers), beside `total`
    mtp_active: int = 0  # what a token runs through in them: their active parameters and the output layer again

    @property
    def total(self) -> int:
        return self.token_embedding + self.position_embedding + self.attention + self.mlp + self.norm + self.output

    @property
    def embedding(self) -> int:
        """Input-embedding lookups: token table plus learned positions."""
        return self.token_embedding + self.position_embedding

    @property
    def non_embedding(self) -> int:
        return self.total - self.embedding

    @property
    def active(self) -> int:
        """The parameters one token runs through (with the input embedding): all of a dense model's."""
        return self.total - self.inactive

    @property
    def active_blocks(self) -> int:
        """The active parameters of all transformer blocks (no embedding, final norm or output layer)."""
        return self.attention + self.mlp + self.norm - self.final_norm - self.inactive

    @property
    def flops(self) -> int:
        """N of the PaLM/torchtitan MFU convention: the active parameters but the input lookups; a tied output
        layer still does a V*H matmul per token, so it counts; and each multi-token prediction module's block,
        projection and norms and its pass through the output layer (Megatron's FLOPs count them alike)."""
        return self.non_embedding + (self.vocab_hidden if self.output == 0 else 0) - self.inactive + self.mtp_active

    def as_dict(self) -> dict[str, Any]:
        moe = dict(routed_experts=self.routed_experts) if self.routed_experts else {}
        if self.mtp:
            moe["mtp"] = self.mtp
        return dict(
            total=self.total,
            embedding=self.embedding,
            non_embedding=self.non_embedding,
            token_embedding=self.token_embedding,
            position_embedding=self.position_embedding,
            attention=self.attention,
            mlp=self.mlp,
            norm=self.norm,
            output=self.output,
            per_layer=self.per_layer,
            flops=self.flops,
            active=self.active,
            active_no_embedding=self.active - self.embedding,
            **moe,
        )


def moe_layers(model: ResolvedModelConfig) -> int:
    """Blocks whose feed-forward is a routed MoE layer: those after model.first_dense_layers."""
    return model.num_layers - model.first_dense_layers if model.num_experts else 0


def expert_width(model: ResolvedModelConfig) -> int:
    """H_e: the SwiGLU width of one routed or shared expert."""
    return model.moe_intermediate_size or model.intermediate_size


def count_params(model: ResolvedModelConfig) -> ParamCounts:
    """`model` is a resolved model section (num_kv_heads and head_dim filled in)."""
    V, H, I, L = padded_vocab_size(model), model.hidden_size, model.intermediate_size, model.num_layers
    E, k = max(model.num_experts, 1), model.experts_per_token
    routed = router = shared = 0
    if model.family == "llama":
        attention = sum(numel(shape) for _, shape in _attention_shapes(model))
        mlp = 3 * H * I
        norms = 2 * H + sum(numel(shape) for _, shape in _qk_norm_shapes(model))
        final_norm = H
        positions = 0
        if model.num_experts:
            He = expert_width(model)
            b = 1 if model.expert_bias else 0
            router = E * H + b * E
            routed = E * (3 * H * He + b * (2 * He + H))
            shared = 3 * H * model.num_shared_experts * He
    else:  # gpt2: fused qkv (c_attn) and c_proj; MLP c_fc and c_proj; LayerNorm weight (+ bias)
        b = 1 if model.bias else 0
        attention = H * 3 * H + b * 3 * H + H * H + b * H
        mlp = H * I + b * I + I * H + b * H
        norms = 2 * (H + b * H)
        final_norm = H + b * H
        positions = model.max_seq_len * H
    sparse = moe_layers(model)
    moe_mlp = router + routed + shared
    last = attention + (moe_mlp if sparse else mlp) + norms  # the last block, which an MTP module repeats
    # an MTP module: that block, the 2H -> H projection of [its input's norm, the next token's embedding's
    # norm] and the norm before the shared output layer (DeepSeek-V3, section 2.2)
    module = last + 2 * H * H + 3 * H
    inactive_block = routed // E * (E - k) if sparse else 0
    return ParamCounts(
        token_embedding=V * H,
        position_embedding=positions,
        attention=L * attention,
        mlp=(L - sparse) * mlp + sparse * moe_mlp,
        norm=L * norms + final_norm,
        output=0 if model.tie_embeddings else V * H,
        per_layer=attention + (moe_mlp if sparse else mlp) + norms,
        vocab_hidden=V * H,
        routed_experts=sparse * routed,
        inactive=sparse * routed // E * (E - k) if sparse else 0,
        final_norm=final_norm,
        mtp=model.mtp_layers * module,
        mtp_active=model.mtp_layers * (module - inactive_block + V * H),
    )


def numel(shape: tuple[int, ...]) -> int:
    n = 1
    for x in shape:
        n *= x
    return n


def _attention_shapes(model: ResolvedModelConfig) -> list[tuple[str, tuple[int, ...]]]:
    """A LLaMA-family block's attention tensors (our names below `attn.`), every variant the planner counts."""
    H, d, n = model.hidden_size, model.head_dim, model.num_heads
    out: list[tuple[str, tuple[int, ...]]] = []
    if model.kv_lora_rank:  # MLA, as DeepSeek-V2/V3 (and transformers' DeepseekV3Attention) build it
        rope, v = model.qk_rope_head_dim, model.v_head_dim or d
        if model.q_lora_rank:
            out += [
                ("q_a.weight", (model.q_lora_rank, H)),
                ("q_a_norm.weight", (model.q_lora_rank,)),
                ("q_b.weight", (n * d, model.q_lora_rank)),
            ]
        else:
            out.append(("q.weight", (n * d, H)))
        out += [
            ("kv_a.weight", (model.kv_lora_rank + rope, H)),
            ("kv_a_norm.weight", (model.kv_lora_rank,)),
            ("kv_b.weight", (n * (d - rope + v), model.kv_lora_rank)),
            ("proj.weight", (H, n * v)),
        ]
        return out
    q, kv = n * d, model.num_kv_heads * d
    out.append(("qkv.weight", (q + 2 * kv, H)))
    if model.qkv_bias or model.attention_bias:
        out.append(("qkv.bias", (q + 2 * kv,)))
    out.append(("proj.weight", (H, q)))
    if model.attention_bias:
        out.append(("proj.bias", (H,)))
    if model.attention_sinks:
        out.append(("sinks", (n,)))
    return out


def _qk_norm_shapes(model: ResolvedModelConfig) -> list[tuple[str, tuple[int, ...]]]:
    """QK-norm weights: a head's width (Qwen3) or the whole projection's (OLMoE)."""
    if not model.qk_norm:
        return []
    if model.qk_norm_over == "projection":
        return [
            ("q_norm.weight", (model.num_heads * model.head_dim,)),
            ("k_norm.weight", (model.num_kv_heads * model.head_dim,)),
        ]
    return [
        ("q_norm.weight", (model.head_dim,)),
        ("k_norm.weight", (model.head_dim,)),
    ]


def fused_rows(name: str, model: ResolvedModelConfig) -> list[int] | None:
    """The row blocks a fused parameter stacks, in order: [q, k, v] for `attn.qkv` (weight and bias), [gate,
    up] for LLaMA's `mlp.up` and an MoE block's `mlp.shared.up`; None for any other parameter. The export
    splits them into Hugging Face's separate tensors and tensor parallelism hands each rank its share of every
    block."""
    if name.endswith((".attn.qkv.weight", ".attn.qkv.bias")):
        q, kv = model.num_heads * model.head_dim, model.num_kv_heads * model.head_dim
        return [q, kv, kv]
    if model.family == "llama" and name.endswith(".mlp.shared.up.weight"):
        return [model.num_shared_experts * expert_width(model)] * 2
    if model.family == "llama" and name.endswith(".mlp.up.weight"):
        return [model.intermediate_size, model.intermediate_size]
    return None


def param_shapes(model: ResolvedModelConfig) -> list[tuple[str, tuple[int, ...]]]:
    """Every parameter tensor of the built model, in module order, with our names: the one layout table the
    planner counts, the export names (model/hf.py) and a test holds against the model's named_parameters()."""
    V, H, I = padded_vocab_size(model), model.hidden_size, model.intermediate_size
    q_width, kv_width = model.num_heads * model.head_dim, model.num_kv_heads * model.head_dim
    llama = model.family == "llama"
    bias = (not llama) and model.bias

    def norm(prefix: str) -> list[tuple[str, tuple[int, ...]]]:
        return [(f"{prefix}.weight", (H,))] + ([(f"{prefix}.bias", (H,))] if bias else [])

    def linear(prefix: str, out_features: int, in_features: int, has_bias: bool) -> list[tuple[str, tuple[int, ...]]]:
        return [(f"{prefix}.weight", (out_features, in_features))] + (
            [(f"{prefix}.bias", (out_features,))] if has_bias else []
        )

    # One block of each kind, by name suffix, then every block (the planner lists the tensors of 1,000 layers).
    if llama:
        attention = [(f".attn.{name}", shape) for name, shape in _attention_shapes(model) + _qk_norm_shapes(model)]
    else:
        attention = linear(".attn.qkv", q_width + 2 * kv_width, H, bias) + linear(".attn.proj", H, q_width, bias)
    dense = (
        norm(".attn_norm")
        + attention
        + norm(".mlp_norm")
        + linear(".mlp.up", 2 * I if llama else I, H, bias)
        + linear(".mlp.down", H, I, bias)
    )
    sparse = (
        norm(".attn_norm") + attention + norm(".mlp_norm") + _moe_shapes(model, ".mlp") if moe_layers(model) else dense
    )
    shapes: list[tuple[str, tuple[int, ...]]] = [("embed.weight", (V, H))]
    if not llama:
        shapes.append(("pos_embed.weight", (model.max_seq_len, H)))
    for i in range(model.num_layers):
        p = f"blocks.{i}"
        shapes += [(p + name, shape) for name, shape in (sparse if i >= model.first_dense_layers else dense)]
    shapes += norm("norm")
    if not model.tie_embeddings:
        shapes.append(("lm_head.weight", (V, H)))
    return shapes


def _moe_shapes(model: ResolvedModelConfig, prefix: str) -> list[tuple[str, tuple[int, ...]]]:
    """An MoE block's feed-forward: the router, the routed experts stacked in one tensor each (gate and up fused
    as in the dense MLP, rows of every expert after each other: the grouped GEMM's operand) and the shared
    experts fused into one SwiGLU of num_shared_experts x H_e."""
    E, H, He, S = model.num_experts, model.hidden_size, expert_width(model), model.num_shared_experts
    out: list[tuple[str, tuple[int, ...]]] = [(f"{prefix}.router.weight", (E, H))]
    if model.expert_bias:
        out.append((f"{prefix}.router.bias", (E,)))
    out += [(f"{prefix}.experts.up", (E, 2 * He, H)), (f"{prefix}.experts.down", (E, H, He))]
    if model.expert_bias:
        out += [(f"{prefix}.experts.up_bias", (E, 2 * He)), (f"{prefix}.experts.down_bias", (E, H))]
    if S:
        out += [(f"{prefix}.shared.up.weight", (2 * S * He, H)), (f"{prefix}.shared.down.weight", (H, S * He))]
    return out
