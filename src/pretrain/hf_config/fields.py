"""Every field of a supported family's Hugging Face `config.json`, classified for `model.hf_config` and the
import of a checkpoint (`FIELDS`; `PLANNED`: the families only the planner counts), so nothing is dropped
without a word:
  READ     becomes a `model:` key (a sliding window: model.sliding_window, which bounds train.seq_len);
  IGNORED  no part of the function the model computes: token ids, dtypes, caching, output options, dropout
           (a training choice: model.dropout sets ours), a sequence-classification head's settings;
  Neutral  refused by name unless at a value our model computes the same way (a bias we do not build,
           another activation ...).
tests/model/test_hf_config.py walks every field of each transformers Config class and fails on one that is
not here. A field no family of ours knows (another model's) is ignored: transformers ignores it too.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

READ, IGNORED = "read", "ignored"


@dataclass(frozen=True)
class Neutral:
    """A field refused by name unless its value is one of `values` (a missing field is neutral)."""

    values: tuple[Any, ...]
    fix: str


Rule = str | Neutral  # READ, IGNORED or a Neutral


# Fields of every PreTrainedConfig that do not change what the model computes.
_COMMON = dict.fromkeys(
    (
        "_name_or_path",
        "architectures",
        "transformers_version",
        "model_type",
        "dtype",
        "torch_dtype",
        "use_cache",
        "bos_token_id",
        "eos_token_id",
        "pad_token_id",
        "id2label",
        "label2id",
        "problem_type",
        "return_dict",
        "output_attentions",
        "output_hidden_states",
        "chunk_size_feed_forward",
        "is_encoder_decoder",
    ),
    IGNORED,
) | {"initializer_range": READ, "tie_word_embeddings": READ}

_LLAMA_LIKE = (
    _COMMON
    | dict.fromkeys(
        (
            "vocab_size",
            "hidden_size",
            "intermediate_size",
            "num_hidden_layers",
            "num_attention_heads",
            "num_key_value_heads",
            "head_dim",
            "max_position_embeddings",
            "rms_norm_eps",
            "rope_theta",
            "rope_parameters",
            "rope_scaling",  # model.rope_theta and model.rope_scaling (_rope)
        ),
        READ,
    )
    | {
        "attention_dropout": IGNORED,
        "hidden_act": Neutral(("silu",), "pretrain's MLP is SwiGLU; use a silu config"),
    }
)
_BIAS_FREE = {  # LlamaConfig / Qwen3Config: attention_bias biases o_proj too, mlp_bias every MLP projection
    "attention_bias": Neutral(
        (False,), "pretrain has q/k/v biases only (model.qkv_bias, as Qwen2); use a config without it"
    ),
    "mlp_bias": Neutral((False,), "pretrain's MLP has no biases; use a config without it"),
}
_QWEN_WINDOW = dict.fromkeys(("sliding_window", "use_sliding_window", "max_window_layers", "layer_types"), READ)

FIELDS: dict[str, dict[str, Rule]] = {
    # pretraining_tp: Meta's matmuls split in slices, the same product (transformers 5 no longer reads it)
    "llama": _LLAMA_LIKE | _BIAS_FREE | {"pretraining_tp": IGNORED},
    "mistral": _LLAMA_LIKE | {"sliding_window": READ},  # in every layer
    "qwen2": _LLAMA_LIKE | _QWEN_WINDOW,  # q/k/v biases always: model.qkv_bias
    "qwen3": _LLAMA_LIKE | _QWEN_WINDOW | {"attention_bias": _BIAS_FREE["attention_bias"]},  # QK-norm always
    "gpt2": _COMMON
    | dict.fromkeys(("vocab_size", "n_embd", "n_layer", "n_head", "n_inner", "n_positions", "layer_norm_epsilon"), READ)
    | {
        "n_ctx": IGNORED,  # older configs: n_positions sizes the position table
        "resid_pdrop": IGNORED,
        "embd_pdrop": IGNORED,
        "attn_pdrop": IGNORED,
        "reorder_and_upcast_attn": IGNORED,  # the fp32 attention matmul of mixed precision: the same math
        # GPT2DoubleHeadsModel's classification head, not the language model
        **dict.fromkeys(
            (
                "summary_type",
                "summary_use_proj",
                "summary_activation",
                "summary_proj_to_labels",
                "summary_first_dropout",
            ),
            IGNORED,
        ),
        "activation_function": Neutral(
            ("gelu_new", "gelu_pytorch_tanh"), "pretrain's GPT-2 MLP is gelu_new; use a gelu_new config"
        ),
        "scale_attn_weights": Neutral((True,), "pretrain scales attention scores by 1/sqrt(head_dim); set it to true"),
        "scale_attn_by_inverse_layer_idx": Neutral(
            (False,), "pretrain scales no layer's scores by its depth; set it to false"
        ),
        "add_cross_attention": Neutral((False,), "pretrain builds decoder-only blocks; set it to false"),
    },
}
# Mixture-of-Experts families (the keys of docs/moe.md). Their routers' options are read; a router's training
# noise (Mixtral's jitter) and the router-logit outputs are training choices, ignored like dropout.
_MOE = {
    "num_experts_per_tok": READ,
    "norm_topk_prob": READ,
    "router_aux_loss_coef": READ,
    "output_router_logits": IGNORED,
}
FIELDS.update(
    {
        "mixtral": FIELDS["mistral"] | _MOE | {"num_local_experts": READ, "router_jitter_noise": IGNORED},
        "qwen3_moe": FIELDS["qwen3"]
        | _MOE
        | {
            "num_experts": READ,
            "num_local_experts": READ,
            "moe_intermediate_size": READ,
            "mlp_only_layers": READ,
            "decoder_sparse_step": Neutral(
                (1,),
                "pretrain's MoE blocks are every block after the dense ones "
                "(model.first_dense_layers); use decoder_sparse_step 1",
            ),
        },
        "olmoe": _LLAMA_LIKE
        | _MOE
        | {
            "num_experts": READ,
            "attention_bias": _BIAS_FREE["attention_bias"],
            "clip_qkv": Neutral((None,), "pretrain does not clamp q, k, v; use a config without clip_qkv"),
        },
    }
)


# Planner only (`pretrain plan` counts them; config/trainable.py refuses to train them): every field that sizes a
# parameter or a FLOP is read, and DeepSeek-V3's routing groups (the nodes a token's dispatch reaches); otherwise
# how tokens are routed, RoPE scaling, the quantised storage of the published weights
# and the sliding window of half of gpt-oss's layers change no count (its attention FLOPs are counted over the full
# sequence in every layer, an upper bound), so they are ignored here rather than refused.
_PLANNED = (
    _LLAMA_LIKE
    | dict.fromkeys(("rope_scaling", "quantization_config", "auto_map", "output_router_logits"), IGNORED)
    | dict.fromkeys(("num_experts_per_tok", "router_aux_loss_coef"), READ)
)
PLANNED: dict[str, dict[str, Rule]] = {
    # num_nextn_predict_layers: DeepSeek-V3's multi-token-prediction module, which transformers does not build
    # (the hub's 685B = 671B + 14B of it): read as model.mtp_layers, its FLOPs and time planned beside the model
    "deepseek_v3": _PLANNED
    | dict.fromkeys(
        (
            "moe_intermediate_size",
            "n_routed_experts",
            "n_shared_experts",
            "first_k_dense_replace",
            "q_lora_rank",
            "kv_lora_rank",
            "qk_nope_head_dim",
            "qk_rope_head_dim",
            "v_head_dim",
            "qk_head_dim",
            "scoring_func",
            "norm_topk_prob",
            "n_group",
            "topk_group",
            "num_nextn_predict_layers",
        ),
        READ,
    )
    | dict.fromkeys(
        (
            "routed_scaling_factor",
            "topk_method",
            "rope_interleave",
            "ep_size",
            "aux_loss_alpha",
            "seq_aux",
            "pretraining_tp",
        ),
        IGNORED,
    )
    | {
        "attention_bias": _BIAS_FREE["attention_bias"],
        "moe_layer_freq": Neutral((1,), "pretrain plans an MoE layer in every block after first_k_dense_replace"),
    },
    # swiglu_alpha, swiglu_limit: gpt-oss's clamped SwiGLU, the same parameters and FLOPs as ours
    "gpt_oss": _PLANNED
    | dict.fromkeys(("num_local_experts", "experts_per_token", "attention_bias"), READ)
    | dict.fromkeys(
        ("sliding_window", "layer_types", "initial_context_length", "swiglu_alpha", "swiglu_limit"), IGNORED
    ),
}
FIELDS.update(PLANNED)

# What a few well-known families build beyond ours, to name in the refusal (other types: their unknown fields).
UNBUILT = {
    "gemma": "GeGLU MLP (hidden_activation), embeddings scaled by sqrt(hidden_size), (1 + weight) RMSNorm",
    "gemma2": "attn_logit_softcapping, final_logit_softcapping, query_pre_attn_scalar, GeGLU MLP "
    "(hidden_activation), pre/post-feedforward norms, embeddings scaled by sqrt(hidden_size)",
    "gemma3": "GeGLU MLP (hidden_activation), QK-norm with (1 + weight), pre/post-feedforward norms, "
    "local/global rope_parameters, embeddings scaled by sqrt(hidden_size)",
    "qwen2_moe": "mixture-of-experts MLP (num_experts, shared_expert_intermediate_size)",
    "phi3": "fused qkv_proj / gate_up_proj naming, partial rotary, rope_scaling (longrope)",
    "gpt_neox": "parallel attention and MLP (use_parallel_residual), partial rotary (rotary_pct), LayerNorm",
}
