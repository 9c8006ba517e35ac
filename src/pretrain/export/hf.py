"""Export a model as a Hugging Face directory: Llama / Qwen2 / Qwen3ForCausalLM or GPT2LMHeadModel, with
its config, generation config and tokenizer. The two namings and the import live in model/hf.py.
"""

from __future__ import annotations

import json
import shutil
import uuid
from pathlib import Path
from typing import Any

import torch

from ..errors import UsageError
from ..files import swap_in
from ..model.hf import CONV1D, EXPERT_TENSORS, VOCAB_ROWS, hf_pairs, model_moe_naming
from ..plan.params import fused_rows

# The tokens `pretrain tokenizer` reserves; a tokenizer_config.json naming others takes precedence.
SPECIAL_TOKENS = {"bos": "<bos>", "eos": "<eos>", "pad": "<pad>"}
TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json")


# --- export ---------------------------------------------------------------------------------------------


def to_hf_state_dict(model) -> dict[str, torch.Tensor]:
    """Our parameters under Hugging Face names (views, not copies).

    A tied output layer is left out: transformers ties `lm_head.weight` to the embedding again on load.
    GPT-2 without biases (`model.bias: false`) gets zero biases, which compute the same thing: Hugging Face's
    GPT-2 always has them. The rows `model.pad_vocab_to` adds to the embedding and output layer are dropped:
    no id reaches them, and the exported vocabulary is the real one.
    """
    cfg = model.config
    if any(b.any() for name, b in model.named_buffers() if name.endswith(".expert_bias")):
        raise UsageError(
            "the model's MoE routing biases (model.router_bias_update_rate) are not zero, and "
            "Mixtral, Qwen3-MoE and OLMoE have none: their routing would differ; keep the pretrain "
            "checkpoint"
        )
    params = dict(model.named_parameters())  # a tied lm_head is listed once, as embed.weight
    out = {}
    for ours, theirs in hf_pairs(cfg.family, cfg.num_layers, model_moe_naming(cfg)):
        tensor = params.get(ours)
        if ours in VOCAB_ROWS and tensor is not None:
            tensor = tensor[: cfg.vocab_size]
        if tensor is None and cfg.family == "gpt2" and ours.endswith(".bias"):
            weight = params[ours.removesuffix(".bias") + ".weight"]
            tensor = weight.new_zeros(weight.shape[0])
        if tensor is None:  # not in this model: a tied lm_head, LLaMA's q/k/v biases
            continue
        tensor = tensor.detach()
        if ours.endswith(EXPERT_TENSORS):  # [E, rows, cols]: each expert's projections, in the order of `theirs`
            parts = tensor.reshape(len(theirs), -1, tensor.shape[-1]).unbind()
        else:
            parts = tensor.split(fused_rows(ours, cfg)) if len(theirs) > 1 else [tensor]
        for name, part in zip(theirs, parts):
            out[name] = part.t() if CONV1D.search(name) else part
    return out


def hf_config(model_cfg, token_ids: dict[str, int] | None = None, dtype: torch.dtype = torch.float32) -> dict:
    """config.json of the exported model. `token_ids`: bos/eos/pad ids ({"eos": 2, ...}) from the tokenizer.

    LLaMA with q/k/v biases is exported as Qwen2: LlamaConfig's `attention_bias` would add an output
    projection bias too, which our model does not have. LLaMA with QK-norm is Qwen3 (whose `attention_bias`
    also biases the output projection, so QK-norm with q/k/v biases has no architecture). Token ids are
    written even when unknown (null): left out, LlamaConfig and GPT2Config would fill in their own defaults
    (1/2, 50256).
    """
    m = model_cfg
    ids = {f"{k}_token_id": (token_ids or {}).get(k) for k in SPECIAL_TOKENS}
    common = dict(
        vocab_size=m.vocab_size,
        tie_word_embeddings=m.tie_embeddings,
        initializer_range=m.init_std,
        torch_dtype=str(dtype).removeprefix("torch."),
        **ids,
    )
    if m.family == "gpt2":
        return _gpt2_config(m, common)
    if m.qk_norm and m.qkv_bias:
        raise UsageError(
            "model.qk_norm with model.qkv_bias has no Hugging Face architecture (Qwen3's "
            "attention_bias biases o_proj too); train without one of them to export"
        )
    if m.num_experts:
        return _moe_config(m, common)
    return _dense_config(m, common)


def _gpt2_config(m, common: dict) -> dict:
    return dict(
        architectures=["GPT2LMHeadModel"],
        model_type="gpt2",
        n_embd=m.hidden_size,
        n_layer=m.num_layers,
        n_head=m.num_heads,
        n_inner=m.intermediate_size,
        n_positions=m.max_seq_len,
        activation_function="gelu_new",
        layer_norm_epsilon=m.norm_eps,
        resid_pdrop=m.dropout,
        embd_pdrop=m.dropout,
        attn_pdrop=m.dropout,
        **common,
    )


def _dense_config(m, common: dict) -> dict:
    """A dense LLaMA-family model as LLaMA, Qwen2 (q/k/v biases) or Qwen3 (QK-norm per head)."""
    if m.qk_norm and m.qk_norm_over == "projection":
        raise UsageError(
            "model.qk_norm_over: projection is OLMoE's QK-norm; a dense model with it has no Hugging "
            "Face architecture here (Qwen3's is per head): keep the pretrain checkpoint"
        )
    kind = "qwen3" if m.qk_norm else "qwen2" if m.qkv_bias else "llama"
    architecture = {"llama": "LlamaForCausalLM", "qwen2": "Qwen2ForCausalLM", "qwen3": "Qwen3ForCausalLM"}[kind]
    config: dict[str, Any] = dict(
        architectures=[architecture],
        model_type=kind,
        hidden_size=m.hidden_size,
        intermediate_size=m.intermediate_size,
        num_hidden_layers=m.num_layers,
        num_attention_heads=m.num_heads,
        num_key_value_heads=m.num_kv_heads,
        head_dim=m.head_dim,
        max_position_embeddings=m.max_seq_len,
        hidden_act="silu",
        rms_norm_eps=m.norm_eps,
        # transformers 4 reads rope_theta and rope_scaling (below), 5 rope_parameters
        rope_theta=m.rope_theta,
        rope_parameters={**(m.rope_scaling or dict(rope_type="default")), "rope_theta": m.rope_theta},
        attention_dropout=m.dropout,
        **common,
    )
    if m.rope_scaling:  # transformers 5 reads it before rope_parameters: the same mapping, the same frequencies
        config.update(rope_scaling=m.rope_scaling)
    if kind != "llama":
        config.update(use_sliding_window=False, sliding_window=None)
    if kind != "qwen2":
        config.update(attention_bias=False)
    if kind == "llama":
        config.update(mlp_bias=False)
    return config


MOE_ARCHITECTURES = {"mixtral": "MixtralForCausalLM", "qwen3_moe": "Qwen3MoeForCausalLM", "olmoe": "OlmoeForCausalLM"}


def _moe_config(m, common: dict) -> dict:
    """config.json of a Mixture-of-Experts model: Mixtral without QK-norm, Qwen3-MoE with it per head, OLMoE
    over the projection (model.hf.moe_naming). Refused, in one line: what none of them builds."""
    naming = model_moe_naming(m)
    assert naming is not None  # an MoE model (model.num_experts > 0) always has one
    kind, _ = naming
    name = MOE_ARCHITECTURES[kind]
    unbuilt = [
        what
        for what, present in (
            ("shared experts (model.num_shared_experts)", m.num_shared_experts),
            ("a sigmoid router (model.router)", m.router != "softmax"),
            ("q/k/v biases (model.qkv_bias)", m.qkv_bias),
            ("dense first blocks (model.first_dense_layers)", m.first_dense_layers and kind != "qwen3_moe"),
            ("un-normalised top-k weights (model.norm_topk_prob=false)", not m.norm_topk_prob and kind == "mixtral"),
            ("a sliding window (model.sliding_window)", m.sliding_window and kind != "mixtral"),
            (
                "experts of another width than the dense MLP (model.moe_intermediate_size)",
                kind != "qwen3_moe" and m.moe_intermediate_size not in (None, m.intermediate_size),
            ),
        )
        if present
    ]
    if unbuilt:
        raise UsageError(
            f"{name} (chosen by model.qk_norm / model.qk_norm_over) does not build {unbuilt[0]}; "
            "train without it to export, or keep the pretrain checkpoint"
        )
    config: dict[str, Any] = dict(
        architectures=[name],
        model_type=kind,
        hidden_size=m.hidden_size,
        intermediate_size=m.intermediate_size,
        num_hidden_layers=m.num_layers,
        num_attention_heads=m.num_heads,
        num_key_value_heads=m.num_kv_heads,
        head_dim=m.head_dim,
        max_position_embeddings=m.max_seq_len,
        hidden_act="silu",
        rms_norm_eps=m.norm_eps,
        rope_theta=m.rope_theta,
        rope_parameters=dict(rope_type="default", rope_theta=m.rope_theta),
        attention_dropout=m.dropout,
        num_experts_per_tok=m.experts_per_token,
        # transformers' aux loss is k times ours (pretrain.hf_config._moe_keys)
        router_aux_loss_coef=m.router_aux_loss_coef / m.experts_per_token,
        **common,
    )
    if kind == "mixtral":
        config.update(num_local_experts=m.num_experts, sliding_window=m.sliding_window, router_jitter_noise=0.0)
    else:
        config.update(num_experts=m.num_experts, norm_topk_prob=m.norm_topk_prob, attention_bias=False)
    if kind == "qwen3_moe":
        config.update(
            moe_intermediate_size=m.moe_intermediate_size or m.intermediate_size,
            decoder_sparse_step=1,
            mlp_only_layers=list(range(m.first_dense_layers)),
            use_sliding_window=False,
            sliding_window=None,
        )
    if kind == "olmoe":
        config.update(clip_qkv=None)
    return config


def export_hf(
    model,
    out_dir: str | Path,
    tokenizer_dir: str | Path | None = None,
    dtype: torch.dtype = torch.float32,
    overwrite: bool = False,
) -> Path:
    """Write a Hugging Face model directory that `AutoModelForCausalLM.from_pretrained` loads.

    Files: model.safetensors, config.json, generation_config.json and, from `tokenizer_dir` (a directory or
    its tokenizer.json), the tokenizer files (a tokenizer_config.json is written when there is none, so that
    `AutoTokenizer` works). Everything is written to a temporary directory beside `out_dir` and renamed into
    place at the end: `out_dir` is never half-written. An existing `out_dir` is refused unless `overwrite`;
    then it is replaced only once the new one is complete.
    """
    from safetensors.torch import save_file

    out_dir = Path(out_dir)
    if out_dir.exists() and not out_dir.is_dir():
        raise UsageError(f"{out_dir} is a file; choose a new directory")
    if out_dir.exists() and not overwrite:
        raise UsageError(f"{out_dir} already exists; choose a new directory or overwrite it (--overwrite)")
    tokenizer = _tokenizer_files(tokenizer_dir) if tokenizer_dir is not None else {}
    token_ids = _special_token_ids(tokenizer) if tokenizer else {}
    # Beside out_dir, so on the same filesystem: the final rename is atomic.
    tmp = out_dir.with_name(f".{out_dir.name}.partial-{uuid.uuid4().hex[:8]}")
    try:
        out_dir.parent.mkdir(parents=True, exist_ok=True)
        tmp.mkdir()
    except OSError as e:
        raise UsageError(f"cannot write {out_dir} ({e.strerror}); choose a directory you can write") from None
    try:
        # Owned contiguous copies: safetensors refuses views that share memory (the slices of a fused qkv).
        tensors = {
            name: t.to("cpu", dtype, copy=True, memory_format=torch.contiguous_format)
            for name, t in to_hf_state_dict(model).items()
        }
        save_file(tensors, tmp / "model.safetensors", metadata={"format": "pt"})
        _write_json(tmp / "config.json", hf_config(model.config, token_ids, dtype))
        _write_json(tmp / "generation_config.json", {f"{k}_token_id": v for k, v in token_ids.items()})
        for name, path in tokenizer.items():
            shutil.copyfile(path, tmp / name)
        if tokenizer and "tokenizer_config.json" not in tokenizer:
            _write_json(tmp / "tokenizer_config.json", _tokenizer_config(tokenizer, token_ids, model.config))
        swap_in(tmp, out_dir, out_dir.with_name(f".{out_dir.name}.old-{uuid.uuid4().hex[:8]}"))
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return out_dir


def _write_json(path: Path, data: dict) -> None:
    path.write_text(json.dumps(data, indent=2) + "\n")


def _tokenizer_files(path: str | Path) -> dict[str, Path]:
    path = Path(path)
    folder = path.parent if path.is_file() else path
    files = {name: folder / name for name in TOKENIZER_FILES if (folder / name).is_file()}
    if path.is_file():
        files["tokenizer.json"] = path
    if "tokenizer.json" not in files:
        raise UsageError(f"{path}: no tokenizer.json there; give the directory `pretrain tokenizer` wrote")
    return files


def _special_token_names(files: dict[str, Path]) -> dict[str, str]:
    names = dict(SPECIAL_TOKENS)
    if "tokenizer_config.json" in files:
        config = json.loads(files["tokenizer_config.json"].read_text())
        for kind in SPECIAL_TOKENS:
            token = config.get(f"{kind}_token")
            token = token.get("content") if isinstance(token, dict) else token  # AddedToken, serialised
            if isinstance(token, str):
                names[kind] = token
    return names


def _special_token_ids(files: dict[str, Path]) -> dict[str, int]:
    from tokenizers import Tokenizer

    tokenizer = Tokenizer.from_file(str(files["tokenizer.json"]))
    ids = {kind: tokenizer.token_to_id(token) for kind, token in _special_token_names(files).items()}
    return {kind: i for kind, i in ids.items() if i is not None}


def _tokenizer_config(files: dict[str, Path], token_ids: dict[str, int], model_cfg) -> dict:
    """A minimal tokenizer_config.json: the fast tokenizer as it is, with its special tokens named."""
    names = {f"{kind}_token": token for kind, token in _special_token_names(files).items() if kind in token_ids}
    return dict(tokenizer_class="PreTrainedTokenizerFast", model_max_length=model_cfg.max_seq_len, **names)
