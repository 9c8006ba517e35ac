"""`model:` keys from a Hugging Face `config.json` (`model.hf_config`, and the import of a checkpoint).

Every field of a supported family's config.json is in `FIELDS`, so nothing is dropped without a word:
  READ     becomes a `model:` key (a sliding window: model.sliding_window, which bounds train.seq_len);
  IGNORED  no part of the function the model computes: token ids, dtypes, caching, output options, dropout
           (a training choice: model.dropout sets ours), a sequence-classification head's settings;
  Neutral  refused by name unless at a value our model computes the same way (a bias we do not build,
           another activation, RoPE scaling ...).
tests/model/test_hf_config.py walks every field of each transformers Config class and fails on one that is
not here. A field no family of ours knows (another model's) is ignored: transformers ignores it too.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from .errors import ConfigError
from .files import read_json

READ, IGNORED = "read", "ignored"


@dataclass(frozen=True)
class Neutral:
    """A field refused by name unless its value is one of `values` (a missing field is neutral)."""
    values: tuple
    fix: str


# Fields of every PreTrainedConfig that do not change what the model computes.
_COMMON = dict.fromkeys((
    "_name_or_path", "architectures", "transformers_version", "model_type", "dtype", "torch_dtype", "use_cache",
    "bos_token_id", "eos_token_id", "pad_token_id", "id2label", "label2id", "problem_type", "return_dict",
    "output_attentions", "output_hidden_states", "chunk_size_feed_forward", "is_encoder_decoder",
), IGNORED) | {"initializer_range": READ, "tie_word_embeddings": READ}

_LLAMA_LIKE = _COMMON | dict.fromkeys((
    "vocab_size", "hidden_size", "intermediate_size", "num_hidden_layers", "num_attention_heads",
    "num_key_value_heads", "head_dim", "max_position_embeddings", "rms_norm_eps", "rope_theta",
    "rope_parameters",  # its rope_theta is read; a rope_type other than default is refused in _rope_theta
), READ) | {
    "attention_dropout": IGNORED,
    "hidden_act": Neutral(("silu",), "pretrain's MLP is SwiGLU; use a silu config"),
    "rope_scaling": Neutral((None,), "remove it from config.json to train at the original context"),
}
_BIAS_FREE = {  # LlamaConfig / Qwen3Config: attention_bias biases o_proj too, mlp_bias every MLP projection
    "attention_bias": Neutral((False,), "pretrain has q/k/v biases only (model.qkv_bias, as Qwen2); use a "
                                        "config without it"),
    "mlp_bias": Neutral((False,), "pretrain's MLP has no biases; use a config without it"),
}
_QWEN_WINDOW = dict.fromkeys(("sliding_window", "use_sliding_window", "max_window_layers", "layer_types"), READ)

FIELDS: dict[str, dict] = {
    # pretraining_tp: Meta's matmuls split in slices, the same product (transformers 5 no longer reads it)
    "llama": _LLAMA_LIKE | _BIAS_FREE | {"pretraining_tp": IGNORED},
    "mistral": _LLAMA_LIKE | {"sliding_window": READ},  # in every layer
    "qwen2": _LLAMA_LIKE | _QWEN_WINDOW,  # q/k/v biases always: model.qkv_bias
    "qwen3": _LLAMA_LIKE | _QWEN_WINDOW | {"attention_bias": _BIAS_FREE["attention_bias"]},  # QK-norm always
    "gpt2": _COMMON | dict.fromkeys((
        "vocab_size", "n_embd", "n_layer", "n_head", "n_inner", "n_positions", "layer_norm_epsilon"), READ) | {
        "n_ctx": IGNORED,  # older configs: n_positions sizes the position table
        "resid_pdrop": IGNORED, "embd_pdrop": IGNORED, "attn_pdrop": IGNORED,
        "reorder_and_upcast_attn": IGNORED,  # the fp32 attention matmul of mixed precision: the same math
        # GPT2DoubleHeadsModel's classification head, not the language model
        **dict.fromkeys(("summary_type", "summary_use_proj", "summary_activation", "summary_proj_to_labels",
                         "summary_first_dropout"), IGNORED),
        "activation_function": Neutral(("gelu_new", "gelu_pytorch_tanh"),
                                       "pretrain's GPT-2 MLP is gelu_new; use a gelu_new config"),
        "scale_attn_weights": Neutral((True,), "pretrain scales attention scores by 1/sqrt(head_dim); set it to "
                                               "true"),
        "scale_attn_by_inverse_layer_idx": Neutral((False,), "pretrain scales no layer's scores by its depth; set "
                                                             "it to false"),
        "add_cross_attention": Neutral((False,), "pretrain builds decoder-only blocks; set it to false"),
    },
}
# Mixture-of-Experts families (the keys of docs/moe.md). Their routers' options are read; a router's training
# noise (Mixtral's jitter) and the router-logit outputs are training choices, ignored like dropout.
_MOE = {"num_experts_per_tok": READ, "norm_topk_prob": READ, "router_aux_loss_coef": READ,
        "output_router_logits": IGNORED}
FIELDS |= {
    "mixtral": FIELDS["mistral"] | _MOE | {"num_local_experts": READ, "router_jitter_noise": IGNORED},
    "qwen3_moe": FIELDS["qwen3"] | _MOE | {
        "num_experts": READ, "num_local_experts": READ, "moe_intermediate_size": READ, "mlp_only_layers": READ,
        "decoder_sparse_step": Neutral((1,), "pretrain's MoE blocks are every block after the dense ones "
                                             "(model.first_dense_layers); use decoder_sparse_step 1"),
    },
    "olmoe": _LLAMA_LIKE | _MOE | {
        "num_experts": READ, "attention_bias": _BIAS_FREE["attention_bias"],
        "clip_qkv": Neutral((None,), "pretrain does not clamp q, k, v; use a config without clip_qkv"),
    },
}
SUPPORTED = tuple(FIELDS)

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


def from_hf_config(path: str | Path) -> dict:
    """`model:` keys from a Hugging Face `config.json` (a file, or a directory holding one)."""
    path = Path(path)
    if path.is_dir():
        path = path / "config.json"
    hf = _read(path)
    kind = hf.get("model_type")
    kind = kind if isinstance(kind, str) else None
    where = f"model.hf_config: {path}"
    if kind not in FIELDS:
        what = f"{kind}: {_unbuilt(kind, hf)} are not built" if kind else "no model_type"
        raise ConfigError(f"{where}: {what}; supported model_type: {', '.join(SUPPORTED)}")
    refused = [_refusal(name, hf[name], rule) for name, rule in FIELDS[kind].items()
               if isinstance(rule, Neutral) and name in hf and hf[name] not in rule.values]
    if refused:
        raise ConfigError(f"{where}: {kind}: {'; '.join(refused)}")
    try:
        keys = _gpt2_keys(hf) if kind == "gpt2" else _llama_keys(hf, kind, where)
    except KeyError as e:
        raise ConfigError(f"{where} has no {e.args[0]!r}, which a {kind} config.json needs; "
                          "give the model's complete config.json") from None
    if "initializer_range" in hf:
        keys["init_std"] = hf["initializer_range"]
    return keys


def _read(path: Path) -> dict:
    fix = "give a Hugging Face config.json"
    hf = read_json(path, "model.hf_config", fix)
    if not isinstance(hf, dict):
        raise ConfigError(f"model.hf_config: {path} holds a JSON {type(hf).__name__}, not a mapping of keys; {fix}")
    return hf


def _refusal(name: str, value, rule: Neutral) -> str:
    if isinstance(value, dict):  # rope_scaling: its type says what it is
        value = value.get("rope_type", value.get("type", "..."))
    shown = repr(value) if len(repr(value)) <= 60 else repr(value)[:57] + "..."
    return f"{name} ({shown}) is not built yet: {rule.fix}"


def _unbuilt(kind: str, hf: dict) -> str:
    if kind in UNBUILT:
        return UNBUILT[kind]
    known = set().union(*FIELDS.values())
    unknown = [name for name, value in hf.items() if name not in known and value not in (None, False, 0, [], {})]
    return ", ".join(unknown[:8]) or "its architecture"


def _gpt2_keys(hf: dict) -> dict:
    h = hf["n_embd"]
    return dict(family="gpt2", vocab_size=hf["vocab_size"], hidden_size=h, num_layers=hf["n_layer"],
                num_heads=hf["n_head"], intermediate_size=hf.get("n_inner") or 4 * h,
                max_seq_len=hf["n_positions"], tie_embeddings=hf.get("tie_word_embeddings", True),
                bias=True, norm_eps=hf.get("layer_norm_epsilon", 1e-5))


def _llama_keys(hf: dict, kind: str, where: str) -> dict:
    layers = hf["num_hidden_layers"]
    keys = dict(family="llama", vocab_size=hf["vocab_size"], hidden_size=hf["hidden_size"],
                intermediate_size=hf["intermediate_size"], num_layers=layers,
                num_heads=hf["num_attention_heads"],
                num_kv_heads=hf.get("num_key_value_heads") or hf["num_attention_heads"],
                max_seq_len=hf.get("max_position_embeddings", 2048),
                tie_embeddings=hf.get("tie_word_embeddings", False), qkv_bias=kind == "qwen2",
                qk_norm=kind in ("qwen3", "qwen3_moe"), norm_eps=hf.get("rms_norm_eps", 1e-6),
                rope_theta=_rope_theta(hf, where))
    if hf.get("head_dim"):
        keys["head_dim"] = hf["head_dim"]
    window = _window(hf, kind, layers, where)
    if window is not None and window < keys["max_seq_len"]:
        keys["sliding_window"] = window
    if kind in ("mixtral", "qwen3_moe", "olmoe"):
        keys.update(_moe_keys(hf, kind, where))
    return keys


def _moe_keys(hf: dict, kind: str, where: str) -> dict:
    """The Mixture-of-Experts keys of a Mixtral, Qwen3-MoE or OLMoE config.json. None has shared experts or a
    routing bias; all route with a softmax. Mixtral always renormalises the top-k weights. transformers' aux
    loss is E * sum_i (tokens routed to i / tokens) * P_i, k times ours (whose f_i divides by the k routed
    pairs per token, as Switch and Megatron): its coefficient is multiplied by k to give the same gradient."""
    experts = hf.get("num_local_experts") if kind == "mixtral" else hf.get("num_experts", hf.get("num_local_experts"))
    if experts is None:
        raise KeyError("num_local_experts" if kind == "mixtral" else "num_experts")
    k = hf["num_experts_per_tok"]
    keys = dict(num_experts=experts, experts_per_token=k, router="softmax",
                norm_topk_prob=True if kind == "mixtral" else bool(hf.get("norm_topk_prob", False)),
                router_aux_loss_coef=k * hf.get("router_aux_loss_coef", 0.001 if kind != "olmoe" else 0.01))
    if kind == "qwen3_moe":
        keys["moe_intermediate_size"] = hf["moe_intermediate_size"]
        dense = sorted(hf.get("mlp_only_layers") or [])
        if dense != list(range(len(dense))):
            raise ConfigError(f"{where}: mlp_only_layers {dense} is not built: pretrain's dense blocks are the "
                              "first ones (model.first_dense_layers); use a config whose dense layers come first")
        keys["first_dense_layers"] = len(dense)
    if kind == "olmoe":
        keys.update(qk_norm=True, qk_norm_over="projection")  # OLMoE norms the whole q and k projections
    return keys


def _rope_theta(hf: dict, where: str) -> float:
    rope = hf.get("rope_parameters")
    rope = rope if isinstance(rope, dict) else {}
    kind = rope.get("rope_type", rope.get("type", "default"))
    if kind != "default":
        raise ConfigError(f"{where}: rope_parameters rope_type {kind!r} (RoPE scaling) is not built yet; remove "
                          "it from config.json to train at the original context")
    theta = hf.get("rope_theta") or rope.get("rope_theta") or 10000.0
    if isinstance(theta, bool) or not isinstance(theta, (int, float)):
        raise ConfigError(f"{where}: rope_theta {theta!r} is not a number; fix the config.json")
    return float(theta)


def _window(hf: dict, kind: str, layers: int, where: str) -> int | None:
    """The sliding attention window some layer uses, or None. Our attention is full causal attention, which
    is the window's exactly for sequences no longer than it: model.sliding_window bounds train.seq_len
    (config/checks.py). Mistral slides in every layer; Qwen2/3 only with use_sliding_window, in the layers
    layer_types names (by default those from max_window_layers on), as transformers builds them."""
    window = hf.get("sliding_window")
    types = hf.get("layer_types")
    if kind in ("mistral", "mixtral"):
        slides = True
    elif isinstance(types, list):
        other = sorted({str(t) for t in types} - {"full_attention", "sliding_attention"})
        if other:
            raise ConfigError(f"{where}: layer_types {other[0]!r} is not built (pretrain builds full_attention "
                              "and sliding_attention up to the window); use a config without it")
        slides = "sliding_attention" in types and hf.get("use_sliding_window", False)
    else:
        slides = hf.get("use_sliding_window", False) and hf.get("max_window_layers", layers) < layers
    if window is None or not slides:
        return None
    if isinstance(window, bool) or not isinstance(window, int) or window < 1:
        raise ConfigError(f"{where}: sliding_window {window!r} is not a positive integer; fix the config.json")
    return window
