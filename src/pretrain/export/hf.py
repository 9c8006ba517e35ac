"""Hugging Face checkpoints: export as LlamaForCausalLM / Qwen2ForCausalLM / GPT2LMHeadModel, and import.

The two namings differ in three ways, all handled by `NAMES` below:
- we fuse q, k, v into `attn.qkv` and the SwiGLU gate and up projections into `mlp.up` (rows stacked in the
  order listed); LLaMA checkpoints keep them apart (GPT-2's `c_attn` is fused like ours);
- GPT-2's linear layers are `Conv1D`, whose weight is stored (in, out): the transpose of ours;
- a tied output layer is one tensor, stored once under the embedding's name, as transformers does.
Rotary embeddings need no q/k permutation: ours already use Hugging Face's rotate-half layout.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import uuid
from pathlib import Path

import torch

from ..errors import UsageError
from ..presets import from_hf_config

# Our parameter name -> its Hugging Face name, or names when our tensor is theirs stacked along dim 0.
NAMES: dict[str, dict[str, str | tuple[str, ...]]] = {
    "llama": {
        "embed.weight": "model.embed_tokens.weight",
        "blocks.{i}.attn_norm.weight": "model.layers.{i}.input_layernorm.weight",
        "blocks.{i}.attn.qkv.weight": ("model.layers.{i}.self_attn.q_proj.weight",
                                       "model.layers.{i}.self_attn.k_proj.weight",
                                       "model.layers.{i}.self_attn.v_proj.weight"),
        "blocks.{i}.attn.qkv.bias": ("model.layers.{i}.self_attn.q_proj.bias",
                                     "model.layers.{i}.self_attn.k_proj.bias",
                                     "model.layers.{i}.self_attn.v_proj.bias"),
        "blocks.{i}.attn.proj.weight": "model.layers.{i}.self_attn.o_proj.weight",
        "blocks.{i}.mlp_norm.weight": "model.layers.{i}.post_attention_layernorm.weight",
        "blocks.{i}.mlp.up.weight": ("model.layers.{i}.mlp.gate_proj.weight",
                                     "model.layers.{i}.mlp.up_proj.weight"),
        "blocks.{i}.mlp.down.weight": "model.layers.{i}.mlp.down_proj.weight",
        "norm.weight": "model.norm.weight",
        "lm_head.weight": "lm_head.weight",
    },
    "gpt2": {
        "embed.weight": "transformer.wte.weight",
        "pos_embed.weight": "transformer.wpe.weight",
        "blocks.{i}.attn_norm.weight": "transformer.h.{i}.ln_1.weight",
        "blocks.{i}.attn_norm.bias": "transformer.h.{i}.ln_1.bias",
        "blocks.{i}.attn.qkv.weight": "transformer.h.{i}.attn.c_attn.weight",
        "blocks.{i}.attn.qkv.bias": "transformer.h.{i}.attn.c_attn.bias",
        "blocks.{i}.attn.proj.weight": "transformer.h.{i}.attn.c_proj.weight",
        "blocks.{i}.attn.proj.bias": "transformer.h.{i}.attn.c_proj.bias",
        "blocks.{i}.mlp_norm.weight": "transformer.h.{i}.ln_2.weight",
        "blocks.{i}.mlp_norm.bias": "transformer.h.{i}.ln_2.bias",
        "blocks.{i}.mlp.up.weight": "transformer.h.{i}.mlp.c_fc.weight",
        "blocks.{i}.mlp.up.bias": "transformer.h.{i}.mlp.c_fc.bias",
        "blocks.{i}.mlp.down.weight": "transformer.h.{i}.mlp.c_proj.weight",
        "blocks.{i}.mlp.down.bias": "transformer.h.{i}.mlp.c_proj.bias",
        "norm.weight": "transformer.ln_f.weight",
        "norm.bias": "transformer.ln_f.bias",
        "lm_head.weight": "lm_head.weight",
    },
}
# GPT-2's Conv1D weights, stored transposed.
CONV1D = re.compile(r"\.h\.\d+\.(attn|mlp)\.c_\w+\.weight$")
# Our tensors with one row per vocabulary id (padded by model.pad_vocab_to).
VOCAB_ROWS = ("embed.weight", "lm_head.weight")
# Buffers that older checkpoints saved beside the weights (GPT-2's causal mask, LLaMA's rotary frequencies).
IGNORED = re.compile(r"(\.attn\.(masked_)?bias|\.rotary_emb\.inv_freq)$")
# The tokens `pretrain tokenizer` reserves; a tokenizer_config.json naming others takes precedence.
SPECIAL_TOKENS = {"bos": "<bos>", "eos": "<eos>", "pad": "<pad>"}
TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json")


def _pairs(family: str, num_layers: int) -> list[tuple[str, tuple[str, ...]]]:
    """(our name, Hugging Face names) of every tensor a model of this family and depth can have."""
    pairs = []
    for ours, theirs in NAMES[family].items():
        theirs = (theirs,) if isinstance(theirs, str) else theirs
        for i in range(num_layers) if "{i}" in ours else [0]:
            pairs.append((ours.format(i=i), tuple(name.format(i=i) for name in theirs)))
    return pairs


def _fused_rows(cfg, name: str) -> list[int]:
    """Rows of our fused tensor that each Hugging Face tensor takes: q, k, v or gate, up."""
    if ".attn.qkv." in name:
        q, kv = cfg.num_heads * cfg.head_dim, cfg.num_kv_heads * cfg.head_dim
        return [q, kv, kv]
    return [cfg.intermediate_size, cfg.intermediate_size]


# --- export ---------------------------------------------------------------------------------------------

def to_hf_state_dict(model) -> dict[str, torch.Tensor]:
    """Our parameters under Hugging Face names (views, not copies).

    A tied output layer is left out: transformers ties `lm_head.weight` to the embedding again on load.
    GPT-2 without biases (`model.bias: false`) gets zero biases, which compute the same thing: Hugging Face's
    GPT-2 always has them. The rows `model.pad_vocab_to` adds to the embedding and output layer are dropped:
    no id reaches them, and the exported vocabulary is the real one.
    """
    cfg = model.config
    params = dict(model.named_parameters())  # a tied lm_head is listed once, as embed.weight
    out = {}
    for ours, theirs in _pairs(cfg.family, cfg.num_layers):
        tensor = params.get(ours)
        if ours in VOCAB_ROWS and tensor is not None:
            tensor = tensor[:cfg.vocab_size]
        if tensor is None and cfg.family == "gpt2" and ours.endswith(".bias"):
            weight = params[ours.removesuffix(".bias") + ".weight"]
            tensor = weight.new_zeros(weight.shape[0])
        if tensor is None:  # not in this model: a tied lm_head, LLaMA's q/k/v biases
            continue
        tensor = tensor.detach()
        parts = tensor.split(_fused_rows(cfg, ours)) if len(theirs) > 1 else [tensor]
        for name, part in zip(theirs, parts):
            out[name] = part.t() if CONV1D.search(name) else part
    return out


def hf_config(model_cfg, token_ids: dict[str, int] | None = None, dtype: torch.dtype = torch.float32) -> dict:
    """config.json of the exported model. `token_ids`: bos/eos/pad ids ({"eos": 2, ...}) from the tokenizer.

    LLaMA with q/k/v biases is exported as Qwen2: LlamaConfig's `attention_bias` would add an output
    projection bias too, which our model does not have. Token ids are written even when unknown (null):
    left out, LlamaConfig and GPT2Config would fill in their own defaults (1/2, 50256).
    """
    m = model_cfg
    ids = {f"{k}_token_id": (token_ids or {}).get(k) for k in SPECIAL_TOKENS}
    common = dict(vocab_size=m.vocab_size, tie_word_embeddings=m.tie_embeddings, initializer_range=m.init_std,
                  torch_dtype=str(dtype).removeprefix("torch."), **ids)
    if m.family == "gpt2":
        return dict(architectures=["GPT2LMHeadModel"], model_type="gpt2", n_embd=m.hidden_size,
                    n_layer=m.num_layers, n_head=m.num_heads, n_inner=m.intermediate_size,
                    n_positions=m.max_seq_len, activation_function="gelu_new", layer_norm_epsilon=m.norm_eps,
                    resid_pdrop=m.dropout, embd_pdrop=m.dropout, attn_pdrop=m.dropout, **common)
    qwen2 = m.qkv_bias
    config = dict(architectures=["Qwen2ForCausalLM" if qwen2 else "LlamaForCausalLM"],
                  model_type="qwen2" if qwen2 else "llama", hidden_size=m.hidden_size,
                  intermediate_size=m.intermediate_size, num_hidden_layers=m.num_layers,
                  num_attention_heads=m.num_heads, num_key_value_heads=m.num_kv_heads, head_dim=m.head_dim,
                  max_position_embeddings=m.max_seq_len, hidden_act="silu", rms_norm_eps=m.norm_eps,
                  # transformers 4 reads rope_theta, 5 reads rope_parameters
                  rope_theta=m.rope_theta, rope_parameters=dict(rope_type="default", rope_theta=m.rope_theta),
                  attention_dropout=m.dropout, **common)
    if qwen2:
        config.update(use_sliding_window=False, sliding_window=None)
    else:
        config.update(attention_bias=False, mlp_bias=False)
    return config


def export_hf(model, out_dir: str | Path, tokenizer_dir: str | Path | None = None,
              dtype: torch.dtype = torch.float32, overwrite: bool = False) -> Path:
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
        tensors = {name: t.to("cpu", dtype, copy=True, memory_format=torch.contiguous_format)
                   for name, t in to_hf_state_dict(model).items()}
        save_file(tensors, tmp / "model.safetensors", metadata={"format": "pt"})
        _write_json(tmp / "config.json", hf_config(model.config, token_ids, dtype))
        _write_json(tmp / "generation_config.json", {f"{k}_token_id": v for k, v in token_ids.items()})
        for name, path in tokenizer.items():
            shutil.copyfile(path, tmp / name)
        if tokenizer and "tokenizer_config.json" not in tokenizer:
            _write_json(tmp / "tokenizer_config.json", _tokenizer_config(tokenizer, token_ids, model.config))
        if out_dir.exists():
            old = out_dir.with_name(f".{out_dir.name}.old-{uuid.uuid4().hex[:8]}")
            os.rename(out_dir, old)
            try:
                os.rename(tmp, out_dir)
            except BaseException:
                os.rename(old, out_dir)
                raise
            shutil.rmtree(old)
        else:
            os.rename(tmp, out_dir)
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


# --- import ---------------------------------------------------------------------------------------------

def from_hf(hf_dir: str | Path) -> tuple[dict, dict[str, torch.Tensor]]:
    """(`model:` keys, state dict with our names) of a local Hugging Face LLaMA, Mistral, Qwen2 or GPT-2.

    The state dict has the keys of our model's `state_dict()`, so `load_state_dict(state)` is strict.

    Reads model.safetensors or pytorch_model.bin, sharded (with an index) or not. Refuses a checkpoint our
    model would compute differently (RoPE scaling, another activation, tensors it has no place for).
    """
    hf_dir = Path(hf_dir)
    if not hf_dir.is_dir():
        raise UsageError(f"{hf_dir} is not a directory; give a local Hugging Face model directory")
    keys = _model_keys(hf_dir)
    family = keys["family"]
    tensors = {}
    for name, tensor in _read_weights(hf_dir).items():
        if family == "gpt2" and not name.startswith(("transformer.", "lm_head.")):
            name = "transformer." + name  # the original GPT-2 checkpoints have no `transformer.` prefix
        if not IGNORED.search(name):
            tensors[name] = tensor
    if keys["tie_embeddings"]:
        tensors.pop("lm_head.weight", None)  # some tied checkpoints store the shared matrix twice
    state = {}
    for ours, theirs in _pairs(family, keys["num_layers"]):
        present = [name for name in theirs if name in tensors]
        if not present:
            continue
        if len(present) < len(theirs):
            missing = ", ".join(name for name in theirs if name not in tensors)
            raise UsageError(f"{hf_dir}: has {present[0]} but not {missing}; the checkpoint is incomplete")
        parts = [tensors.pop(name) for name in theirs]
        parts = [p.t() if CONV1D.search(name) else p for name, p in zip(theirs, parts)]
        state[ours] = torch.cat(parts) if len(parts) > 1 else parts[0].contiguous()
    if keys["tie_embeddings"] and "embed.weight" in state:
        state["lm_head.weight"] = state["embed.weight"]  # as in our model's state_dict(): one tensor, two names
    if tensors:
        names = ", ".join(sorted(tensors)[:4]) + (", ..." if len(tensors) > 4 else "")
        raise UsageError(f"{hf_dir}: {len(tensors)} tensors have no place in a pretrain model ({names}); "
                         "the architecture has parts pretrain does not build (e.g. output-projection or MLP "
                         "biases)")
    return keys, state


def _model_keys(hf_dir: Path) -> dict:
    """`model:` keys of the checkpoint's config.json, refusing settings our model does not implement."""
    keys = from_hf_config(hf_dir)
    hf = json.loads((hf_dir / "config.json").read_text())
    rope = hf.get("rope_parameters") or hf.get("rope_scaling") or {}
    rope_type = rope.get("rope_type", rope.get("type", "default"))
    if keys["family"] == "llama":
        activation, allowed = hf.get("hidden_act", "silu"), ("silu",)
    else:
        activation, allowed = hf.get("activation_function", "gelu_new"), ("gelu_new", "gelu_pytorch_tanh")
    problems = [f"activation {activation!r} (pretrain: {allowed[0]})"] if activation not in allowed else []
    if rope_type != "default":
        problems.append(f"RoPE scaling {rope_type!r} (pretrain: plain RoPE)")
    if hf.get("scale_attn_by_inverse_layer_idx"):
        problems.append("scale_attn_by_inverse_layer_idx")
    if problems:
        raise UsageError(f"{hf_dir}: pretrain's model cannot reproduce this checkpoint: {'; '.join(problems)}")
    # Mistral's sliding-window attention equals our full attention up to the window: use no longer context.
    window = hf.get("sliding_window") if hf.get("use_sliding_window", True) else None
    if window and window < keys["max_seq_len"]:
        keys["max_seq_len"] = window
    return keys


def _read_weights(hf_dir: Path) -> dict[str, torch.Tensor]:
    from safetensors.torch import load_file

    def load_bin(path):
        return torch.load(path, map_location="cpu", weights_only=True)  # weights_only: no pickled code runs

    for single, load in (("model.safetensors", load_file), ("pytorch_model.bin", load_bin)):
        if (hf_dir / single).is_file():
            return load(hf_dir / single)
        index = hf_dir / f"{single}.index.json"
        if index.is_file():
            tensors = {}
            for shard in sorted(set(json.loads(index.read_text())["weight_map"].values())):
                tensors.update(load(hf_dir / shard))
            return tensors
    raise UsageError(f"{hf_dir}: no model.safetensors or pytorch_model.bin (or their sharded index); "
                     "give a Hugging Face model directory")


def load_hf_into(model, hf_dir: str | Path) -> None:
    """Copy a Hugging Face checkpoint's weights into `model`, built with its shape (continued pretraining)."""
    keys, state = from_hf(hf_dir)
    params = model.state_dict(keep_vars=True)  # the parameters themselves, a tied one under both names
    cfg = model.config
    hf_names = {ours: " + ".join(theirs) for ours, theirs in _pairs(cfg.family, cfg.num_layers)}
    fix = f"take the model: keys from the checkpoint (model.hf_config: {hf_dir})"
    # The other way round is fine: an untied model starts its output layer as a copy of the embedding.
    if cfg.tie_embeddings and not keys["tie_embeddings"]:
        raise UsageError(f"{hf_dir} has an output layer of its own but model.tie_embeddings is true; {fix}")
    for name, param in params.items():
        if name not in state:
            raise UsageError(f"{hf_dir} has no {hf_names[name]} for the model's {name}; {fix}")
        if name in VOCAB_ROWS and param.shape[0] > cfg.vocab_size:
            param = param[:cfg.vocab_size]  # the rows model.pad_vocab_to adds keep their initial values
        if state[name].shape != param.shape:
            raise UsageError(f"{hf_dir}: {hf_names[name]} has shape {tuple(state[name].shape)} but the model's "
                             f"{name} is {tuple(param.shape)}; {fix}")
    extra = sorted(state.keys() - params.keys())
    if extra:
        raise UsageError(f"{hf_dir} has {', '.join(hf_names[n] for n in extra)}, which the model lacks "
                         f"(tie_embeddings, bias or qkv_bias differ); {fix}")
    with torch.no_grad():
        for name, param in params.items():
            param[:state[name].shape[0]].copy_(state[name])
