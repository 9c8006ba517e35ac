"""The `model:` section: the architecture (family, shape, attention, positions, initialisation, Mixture of
Experts, multi-head latent attention). Its own module because it is the largest section and the one a new model
family extends; `model.preset` and `model.hf_config` fill these keys (reading.py)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from ..presets import PRESETS
from .key_doc import doc

FAMILIES = ("llama", "gpt2")


@dataclass(frozen=True)
class ModelConfig:
    preset: str | None = doc(None, "named model shape: " + " | ".join(PRESETS) + "; keys given beside it override it")
    hf_config: str | None = doc(None, "a Hugging Face config.json (or its directory) to take the shape from")
    family: str = doc(
        "llama",
        "llama (RMSNorm, RoPE, SwiGLU, no biases) | gpt2 (LayerNorm, learned positions, "
        "GELU MLP, biases, tied embeddings)",
        FAMILIES,
    )
    vocab_size: int = doc(32000, "vocabulary size V")
    hidden_size: int = doc(4096, "model width H")
    intermediate_size: int = doc(11008, "MLP width H' (SwiGLU: each of gate, up; GPT-2: 4H)")
    num_layers: int = doc(32, "transformer blocks L")
    num_heads: int = doc(32, "attention (query) heads")
    num_kv_heads: int | None = doc(
        None, "key/value heads; fewer than num_heads = grouped-query attention (default num_heads)"
    )
    max_seq_len: int = doc(2048, "the model's context length (GPT-2: size of the position table)")
    head_dim: int | None = doc(None, "size of one head (default hidden_size / num_heads)")
    sliding_window: int | None = doc(
        None,
        "the attention window of a checkpoint's config.json (model.hf_config "
        "sets it: Mistral, Qwen2/3 with use_sliding_window); pretrain's full "
        "attention is the window's exactly while train.seq_len <= it, so a longer "
        "train.seq_len is refused",
    )
    tie_embeddings: bool = doc(False, "output layer shares the input embedding matrix")
    qkv_bias: bool = doc(False, "biases on the q, k, v projections (Qwen2 style)")
    qk_norm: bool = doc(
        False,
        "llama family: RMSNorm over each head's query and key before RoPE, a weight of head_dim each (Qwen3 style)",
    )
    qk_norm_over: str = doc(
        "head",
        "model.qk_norm's extent: head (Qwen3: one weight of head_dim shared by the "
        "heads) | projection (OLMoE: one weight over the whole q and the whole k projection)",
        ("head", "projection"),
    )
    bias: bool = doc(True, "gpt2 family: biases in linear layers and LayerNorm (false = nanoGPT bias-free)")
    dropout: float = doc(0.0, "dropout probability (pretraining uses 0)")
    norm_eps: float = doc(1e-5, "epsilon of RMSNorm / LayerNorm")
    rope_theta: float = doc(10000.0, "llama family: RoPE base frequency")
    rope_scaling: dict[str, Any] | None = doc(
        None,
        "llama family: RoPE stretched for a longer context, a mapping as Hugging "
        "Face writes it: {rope_type: llama3, factor: 8, low_freq_factor: 1, "
        "high_freq_factor: 4, original_max_position_embeddings: 8192} (Llama 3.1) or "
        "{rope_type: yarn, factor, original_max_position_embeddings, beta_fast, "
        "beta_slow, attention_factor} (docs/train.md: Long context)",
    )
    position_reset: bool | None = doc(
        None,
        "positions restart at 0 after each <eos> (RoPE angles; GPT-2's learned "
        "positions): null = as train.document_masking (docs/train.md: Document "
        "masking)",
    )
    init_std: float = doc(
        0.02, "std of the normal initialisation; residual projections get init_std / sqrt(2 * num_layers)"
    )
    init_from: str | None = doc(None, "a local Hugging Face model directory to start from (continued pretraining)")
    pad_vocab_to: int = doc(
        1,
        "round the embedding and output-layer rows up to a multiple of this (64: GPT-2's "
        "50,257 -> 50,304, faster matmuls); the padded rows are never a target, export drops them",
    )
    num_experts: int = doc(
        0, "Mixture-of-Experts (llama family): routed experts per MoE layer; 0 = a dense model (docs/moe.md)"
    )
    experts_per_token: int = doc(2, "MoE: routed experts each token is sent to (top-k token-choice routing)")
    moe_intermediate_size: int | None = doc(
        None, "MoE: SwiGLU width of one routed or shared expert (default intermediate_size)"
    )
    num_shared_experts: int = doc(0, "MoE: always-on experts of moe_intermediate_size that every token passes")
    first_dense_layers: int = doc(0, "MoE: the first blocks keep a dense MLP of intermediate_size (DeepSeek-V3: 3)")
    router: str = doc(
        "softmax", "MoE: router scores: softmax (Mixtral, Qwen3, OLMoE) | sigmoid (DeepSeek-V3)", ("softmax", "sigmoid")
    )
    expert_groups: int = doc(
        1,
        "MoE: the routed experts in this many equal groups, a token's experts chosen from its "
        "expert_groups_per_token best groups (DeepSeek-V3's node-limited routing: 8 and 4); 1 = no "
        "limit. Planner only: the dispatch's nodes reached",
    )
    expert_groups_per_token: int = doc(1, "MoE: how many of the expert_groups a token's experts may come from")
    mtp_layers: int = doc(
        0,
        "multi-token prediction modules (DeepSeek-V3: 1), planner only: each predicts one token further "
        "through one more block like the last, a 2h -> h projection and two norms, sharing the embedding and "
        "the output layer; their FLOPs and time on the last pipeline stage are planned, their parameters "
        "reported beside params.total",
    )
    norm_topk_prob: bool = doc(
        True, "MoE: rescale the top-k routing weights to sum to 1 (Mixtral, Qwen3: yes; OLMoE: no)"
    )
    router_aux_loss_coef: float = doc(0.01, "MoE: weight of the Switch-style load-balancing loss (0 = off)")
    router_z_loss_coef: float = doc(
        0.0, "MoE: weight of the router z-loss, mean squared logsumexp of the router logits (OLMoE: 0.001)"
    )
    router_bias_update_rate: float = doc(
        0.0,
        "MoE: DeepSeek-V3's auxiliary-loss-free balancing: after each "
        "optimizer step every expert's routing bias moves by this towards equal "
        "load (0 = off; DeepSeek-V3: 0.001)",
    )
    kv_lora_rank: int = doc(
        0,
        "multi-head latent attention (DeepSeek-V3), planner only: width of the compressed "
        "key/value latent; 0 = ordinary attention. head_dim is then the query/key head (nope + "
        "rope parts)",
    )
    q_lora_rank: int = doc(0, "MLA: width of the compressed query latent (0 = a direct query projection)")
    qk_rope_head_dim: int = doc(0, "MLA: the rotary part of each query/key head, with its key shared by all heads")
    v_head_dim: int | None = doc(None, "MLA: size of a value head (default head_dim)")
    attention_bias: bool = doc(
        False,
        "biases on q, k, v and the attention output projection (gpt-oss), planner "
        "only; model.qkv_bias is q, k, v alone",
    )
    attention_sinks: bool = doc(False, "a learned sink logit per attention head (gpt-oss), planner only")
    expert_bias: bool = doc(
        False, "MoE: biases on the router and on every expert's projections (gpt-oss), planner only"
    )
