"""`model:` keys from a Hugging Face `config.json` (`model.hf_config`, and the import of a checkpoint): a
config.json's fields checked against their classification (fields.py: every field read, ignored or refused by
name), then each family's read into our keys (the llama-like families with their RoPE scaling, sliding window
and experts; gpt2; DeepSeek-V3 and gpt-oss for the planner).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, cast

from ..errors import ConfigError, json_kind
from ..files import read_json
from ..rope_scaling import checked_rope_scaling
from .fields import FIELDS, PLANNED, UNBUILT, Neutral


def from_hf_config(path: str | Path) -> dict[str, Any]:
    """`model:` keys from a Hugging Face `config.json` (a file, or a directory holding one)."""
    path = Path(path)
    if path.is_dir():
        path = path / "config.json"
    return model_keys(_read(path), f"model.hf_config: {path}")


def model_keys(hf: dict[str, Any], where: str) -> dict[str, Any]:
    """`model:` keys from a config.json's contents; `where` starts each error (the file, or the pasted text)."""
    kind = hf.get("model_type")
    if not isinstance(kind, str) or kind not in FIELDS:
        if isinstance(kind, str):
            what = f"{kind} is not built{_unbuilt(kind, hf)}"
        elif kind is None:
            what = "no model_type"
        else:
            what = f"model_type {_shown(kind)} is {json_kind(kind)}, not a string"
        raise ConfigError(
            f"{where}: {what}; supported model_type: {', '.join(k for k in FIELDS if k not in PLANNED)}"
            f" (planner only: {', '.join(PLANNED)})"
        )
    refused = [
        _refusal(name, hf[name], rule)
        for name, rule in FIELDS[kind].items()
        if isinstance(rule, Neutral) and name in hf and hf[name] not in rule.values
    ]
    if refused:
        raise ConfigError(f"{where}: {kind}: {'; '.join(refused)}")
    try:
        keys = (
            _gpt2_keys(hf)
            if kind == "gpt2"
            else _planned_keys(hf, kind, where)
            if kind in PLANNED
            else _llama_keys(hf, kind, where)
        )
    except KeyError as e:
        raise ConfigError(
            f"{where} has no {e.args[0]!r}, which a {kind} config.json needs; give the model's complete config.json"
        ) from None
    if "initializer_range" in hf:
        keys["init_std"] = hf["initializer_range"]
    return keys


def _read(path: Path) -> dict[str, Any]:
    fix = "give a Hugging Face config.json"
    hf = read_json(path, "model.hf_config", fix)
    if not isinstance(hf, dict):
        raise ConfigError(f"model.hf_config: {path} holds {json_kind(hf)}, not a mapping of keys; {fix}")
    return cast(dict[str, Any], hf)


def _shown(value: Any) -> str:
    """A value of the file as its JSON, cut at 60 characters (an error quotes no more of it)."""
    text = json.dumps(value)
    return text if len(text) <= 60 else text[:57] + "..."


def _refusal(name: str, value: Any, rule: Neutral) -> str:
    if isinstance(value, dict):  # rope_scaling: its type says what it is
        mapping = cast(dict[str, Any], value)
        value = mapping.get("rope_type", mapping.get("type", "..."))
    shown = repr(value) if len(repr(value)) <= 60 else repr(value)[:57] + "..."
    return f"{name} ({shown}) is not built yet: {rule.fix}"


def _unbuilt(kind: str, hf: dict[str, Any]) -> str:
    """What a model_type we do not build has beyond ours, in brackets (nothing when none of its fields says)."""
    if kind in UNBUILT:
        return f" ({UNBUILT[kind]})"
    known = set[str]().union(*FIELDS.values())
    unknown = [name for name, value in hf.items() if name not in known and value not in (None, False, 0, [], {})]
    return f" ({', '.join(unknown[:8])})" if unknown else ""


def _gpt2_keys(hf: dict[str, Any]) -> dict[str, Any]:
    h = hf["n_embd"]
    return dict(
        family="gpt2",
        vocab_size=hf["vocab_size"],
        hidden_size=h,
        num_layers=hf["n_layer"],
        num_heads=hf["n_head"],
        intermediate_size=hf.get("n_inner") or 4 * h,
        max_seq_len=hf["n_positions"],
        tie_embeddings=hf.get("tie_word_embeddings", True),
        bias=True,
        norm_eps=hf.get("layer_norm_epsilon", 1e-5),
    )


def _llama_keys(hf: dict[str, Any], kind: str, where: str) -> dict[str, Any]:
    layers = hf["num_hidden_layers"]
    keys: dict[str, Any] = dict(
        family="llama",
        vocab_size=hf["vocab_size"],
        hidden_size=hf["hidden_size"],
        intermediate_size=hf["intermediate_size"],
        num_layers=layers,
        num_heads=hf["num_attention_heads"],
        num_kv_heads=_count(hf, "num_key_value_heads", where) or hf["num_attention_heads"],
        max_seq_len=hf.get("max_position_embeddings", 2048),
        tie_embeddings=hf.get("tie_word_embeddings", False),
        qkv_bias=kind == "qwen2",
        qk_norm=kind in ("qwen3", "qwen3_moe"),
        norm_eps=hf.get("rms_norm_eps", 1e-6),
    )
    keys["rope_theta"], keys["rope_scaling"] = _rope(hf, where)
    head_dim = _count(hf, "head_dim", where)
    if head_dim is not None:
        keys["head_dim"] = head_dim
    window = _window(hf, kind, layers, where)
    if window is not None and window < keys["max_seq_len"]:
        keys["sliding_window"] = window
    if kind in ("mixtral", "qwen3_moe", "olmoe"):
        keys.update(_moe_keys(hf, kind, where))
    return keys


def _moe_keys(hf: dict[str, Any], kind: str, where: str) -> dict[str, Any]:
    """The Mixture-of-Experts keys of a Mixtral, Qwen3-MoE or OLMoE config.json. None has shared experts or a
    routing bias; all route with a softmax. Mixtral always renormalises the top-k weights. transformers' aux
    loss is E * sum_i (tokens routed to i / tokens) * P_i, k times ours (whose f_i divides by the k routed
    pairs per token, as Switch and Megatron): its coefficient is multiplied by k to give the same gradient."""
    experts = hf.get("num_local_experts") if kind == "mixtral" else hf.get("num_experts", hf.get("num_local_experts"))
    if experts is None:
        raise KeyError("num_local_experts" if kind == "mixtral" else "num_experts")
    k = hf["num_experts_per_tok"]
    keys = dict(
        num_experts=experts,
        experts_per_token=k,
        router="softmax",
        norm_topk_prob=True if kind == "mixtral" else bool(hf.get("norm_topk_prob", False)),
        router_aux_loss_coef=k * hf.get("router_aux_loss_coef", 0.001 if kind != "olmoe" else 0.01),
    )
    if kind == "qwen3_moe":
        keys["moe_intermediate_size"] = hf["moe_intermediate_size"]
        dense = sorted(hf.get("mlp_only_layers") or [])
        if dense != list(range(len(dense))):
            raise ConfigError(
                f"{where}: mlp_only_layers {dense} is not built: pretrain's dense blocks are the "
                "first ones (model.first_dense_layers); use a config whose dense layers come first"
            )
        keys["first_dense_layers"] = len(dense)
    if kind == "olmoe":
        keys.update(qk_norm=True, qk_norm_over="projection")  # OLMoE norms the whole q and k projections
    return keys


def _planned_keys(hf: dict[str, Any], kind: str, where: str) -> dict[str, Any]:
    """DeepSeek-V3 (MLA, shared and routed experts, dense first blocks) and gpt-oss (attention sinks, biases on
    attention and experts) as `model:` keys that `pretrain plan` counts exactly as transformers builds them."""
    rope = _mapping(hf, "rope_parameters", where) or {}
    keys: dict[str, Any] = dict(
        family="llama",
        vocab_size=hf["vocab_size"],
        hidden_size=hf["hidden_size"],
        intermediate_size=hf["intermediate_size"],
        num_layers=hf["num_hidden_layers"],
        num_heads=hf["num_attention_heads"],
        num_kv_heads=_count(hf, "num_key_value_heads", where) or hf["num_attention_heads"],
        max_seq_len=hf.get("max_position_embeddings", 2048),
        tie_embeddings=hf.get("tie_word_embeddings", False),
        norm_eps=hf.get("rms_norm_eps", 1e-6),
        rope_theta=_rope_theta(hf, rope, where),
        experts_per_token=hf.get("num_experts_per_tok") or hf["experts_per_token"],
    )
    if "router_aux_loss_coef" in hf:
        keys["router_aux_loss_coef"] = hf["router_aux_loss_coef"]
    if kind == "deepseek_v3":  # MLA's heads: no grouped keys/values; head_dim is the query/key head, nope + rope
        rope_dim = hf["qk_rope_head_dim"]
        return keys | dict(
            num_kv_heads=hf["num_attention_heads"],
            head_dim=hf["qk_nope_head_dim"] + rope_dim,
            qk_rope_head_dim=rope_dim,
            v_head_dim=hf["v_head_dim"],
            kv_lora_rank=hf["kv_lora_rank"],
            q_lora_rank=hf.get("q_lora_rank") or 0,
            num_experts=hf["n_routed_experts"],
            moe_intermediate_size=hf["moe_intermediate_size"],
            num_shared_experts=hf.get("n_shared_experts") or 0,
            first_dense_layers=hf.get("first_k_dense_replace", 0),
            router=hf.get("scoring_func", "sigmoid"),
            norm_topk_prob=hf.get("norm_topk_prob", True),
            expert_groups=hf.get("n_group") or 1,
            expert_groups_per_token=hf.get("topk_group") or 1,
            mtp_layers=hf.get("num_nextn_predict_layers") or 0,
        )
    bias = hf.get("attention_bias", True)
    return keys | dict(
        head_dim=_count(hf, "head_dim", where) or hf["hidden_size"] // hf["num_attention_heads"],
        num_experts=hf["num_local_experts"],
        moe_intermediate_size=hf["intermediate_size"],
        attention_bias=bias,
        attention_sinks=True,
        expert_bias=True,
    )


def _rope(hf: dict[str, Any], where: str) -> tuple[float, dict[str, Any] | None]:
    """(model.rope_theta, model.rope_scaling). transformers 4 writes rope_theta beside a rope_scaling mapping;
    transformers 5 one rope_parameters mapping holding both, and reads a rope_scaling mapping before it."""
    rope = dict(_mapping(hf, "rope_scaling", where) or _mapping(hf, "rope_parameters", where) or {})
    theta = _rope_theta(hf, rope, where)
    rope.pop("rope_theta", None)
    if rope.pop("partial_rotary_factor", 1.0) != 1.0:
        raise ConfigError(
            f"{where}: partial_rotary_factor (rotary on part of each head) is not built; use a "
            "config that rotates whole heads"
        )
    if rope.get("rope_type", rope.get("type")) in ("llama3", "yarn"):  # as transformers standardises it
        rope.setdefault("original_max_position_embeddings", hf.get("max_position_embeddings"))
    return theta, checked_rope_scaling(rope or None, where=f"{where}: rope_scaling")


def _rope_theta(hf: dict[str, Any], rope: dict[str, Any], where: str) -> float:
    """rope_theta beside the mapping (transformers 4) or inside it (5); 10000, transformers' default, when
    neither gives one. A base that is not a positive number is refused: RoPE's angles would be complex or
    infinite."""
    theta = hf.get("rope_theta")
    theta = rope.get("rope_theta") if theta is None else theta
    if theta is None:
        return 10000.0
    if isinstance(theta, bool) or not isinstance(theta, (int, float)):
        raise ConfigError(f"{where}: rope_theta {theta!r} is not a number; fix the config.json")
    if not 0 < theta < float("inf"):
        raise ConfigError(
            f"{where}: rope_theta {theta!r} must be a positive number (Llama 3: 500000); fix the config.json"
        )
    return float(theta)


def _mapping(hf: dict[str, Any], name: str, where: str) -> dict[str, Any] | None:
    """A field that is a mapping or null (rope_scaling, rope_parameters); anything else refused by name."""
    value = hf.get(name)
    if value is not None and not isinstance(value, dict):
        raise ConfigError(
            f"{where}: {name} {_shown(value)} is {json_kind(value)}, not a mapping of rope_type and its "
            "parameters (or null); fix the config.json"
        )
    return cast(dict[str, Any] | None, value)


def _count(hf: dict[str, Any], name: str, where: str) -> int | None:
    """A size transformers fills with its default when null or missing (None here), else a positive integer:
    0 is not "unset", and a zero head or no key/value head is no model."""
    value = hf.get(name)
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ConfigError(
            f"{where}: {name} {_shown(value)} must be a positive integer (or null for transformers' default); "
            "fix the config.json"
        )
    return value


def _window(hf: dict[str, Any], kind: str, layers: int, where: str) -> int | None:
    """The sliding attention window some layer uses, or None. Our attention is full causal attention, which
    is the window's exactly for sequences no longer than it: model.sliding_window bounds train.seq_len
    (config/checks.py). Mistral slides in every layer; Qwen2/3 only with use_sliding_window, in the layers
    layer_types names (by default those from max_window_layers on), as transformers builds them."""
    window = hf.get("sliding_window")
    types = hf.get("layer_types")
    if kind in ("mistral", "mixtral"):
        slides = True
    elif isinstance(types, list):
        other = sorted({str(t) for t in cast(list[Any], types)} - {"full_attention", "sliding_attention"})
        if other:
            raise ConfigError(
                f"{where}: layer_types {other[0]!r} is not built (pretrain builds full_attention "
                "and sliding_attention up to the window); use a config without it"
            )
        slides = "sliding_attention" in types and hf.get("use_sliding_window", False)
    else:
        slides = hf.get("use_sliding_window", False) and hf.get("max_window_layers", layers) < layers
    if window is None or not slides:
        return None
    if isinstance(window, bool) or not isinstance(window, int) or window < 1:
        raise ConfigError(f"{where}: sliding_window {window!r} is not a positive integer; fix the config.json")
    return window
