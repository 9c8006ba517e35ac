"""Hugging Face checkpoints and ours: the two namings, and loading a Hugging Face checkpoint into our model
(`model.init_from`, continued pretraining). Export (model/ -> a Hugging Face directory) is export/hf.py's.

The two namings differ in three ways, all handled by `NAMES` below:
- we fuse q, k, v into `attn.qkv` and the SwiGLU gate and up projections into `mlp.up` (rows stacked in the
  order listed; `plan.params.fused_rows` gives the blocks); LLaMA checkpoints keep them apart (GPT-2's
  `c_attn` is fused like ours);
- GPT-2's linear layers are `Conv1D`, whose weight is stored (in, out): the transpose of ours;
- a tied output layer is one tensor, stored once under the embedding's name, as transformers does.
Rotary embeddings need no q/k permutation: ours already use Hugging Face's rotate-half layout.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

import torch

from ..errors import UsageError
from ..hf_config import from_hf_config

# Our parameter name -> its Hugging Face name, or names when our tensor is theirs stacked along dim 0.
NAMES: dict[str, dict[str, str | tuple[str, ...]]] = {
    "llama": {
        "embed.weight": "model.embed_tokens.weight",
        "blocks.{i}.attn_norm.weight": "model.layers.{i}.input_layernorm.weight",
        "blocks.{i}.attn.qkv.weight": (
            "model.layers.{i}.self_attn.q_proj.weight",
            "model.layers.{i}.self_attn.k_proj.weight",
            "model.layers.{i}.self_attn.v_proj.weight",
        ),
        "blocks.{i}.attn.qkv.bias": (
            "model.layers.{i}.self_attn.q_proj.bias",
            "model.layers.{i}.self_attn.k_proj.bias",
            "model.layers.{i}.self_attn.v_proj.bias",
        ),
        "blocks.{i}.attn.proj.weight": "model.layers.{i}.self_attn.o_proj.weight",
        "blocks.{i}.attn.q_norm.weight": "model.layers.{i}.self_attn.q_norm.weight",  # Qwen3's QK-norm
        "blocks.{i}.attn.k_norm.weight": "model.layers.{i}.self_attn.k_norm.weight",
        "blocks.{i}.mlp_norm.weight": "model.layers.{i}.post_attention_layernorm.weight",
        "blocks.{i}.mlp.up.weight": ("model.layers.{i}.mlp.gate_proj.weight", "model.layers.{i}.mlp.up_proj.weight"),
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
# Mixture-of-Experts blocks (docs/moe.md), as the checkpoints on the Hub and transformers' save_pretrained
# store them: the router, and each expert's gate, up and down projections apart. Ours stack the experts:
# `mlp.experts.up` [E, 2I, H] holds expert 0's gate and up rows, then expert 1's ..., `mlp.experts.down`
# [E, H, I] each expert's down projection.
MOE_NAMES = {  # kind -> (router, one expert's prefix, its gate / up / down projections)
    "mixtral": (
        "model.layers.{i}.block_sparse_moe.gate.weight",
        "model.layers.{i}.block_sparse_moe.experts.{e}.",
        ("w1", "w3", "w2"),
    ),
    "qwen3_moe": (
        "model.layers.{i}.mlp.gate.weight",
        "model.layers.{i}.mlp.experts.{e}.",
        ("gate_proj", "up_proj", "down_proj"),
    ),
}
MOE_NAMES["olmoe"] = MOE_NAMES["qwen3_moe"]
EXPERT_TENSORS = (".mlp.experts.up", ".mlp.experts.down")
# GPT-2's Conv1D weights, stored transposed.
CONV1D = re.compile(r"\.h\.\d+\.(attn|mlp)\.c_\w+\.weight$")
# Our tensors with one row per vocabulary id (padded by model.pad_vocab_to).
VOCAB_ROWS = ("embed.weight", "lm_head.weight")
# Buffers that older checkpoints saved beside the weights (GPT-2's causal mask, LLaMA's rotary frequencies).
IGNORED = re.compile(r"(\.attn\.(masked_)?bias|\.rotary_emb\.inv_freq)$")


def hf_pairs(family: str, num_layers: int, moe: tuple[str, int] | None = None) -> list[tuple[str, tuple[str, ...]]]:
    """(our name, Hugging Face names) of every tensor a model of this family and depth can have; `moe`: the
    Mixture-of-Experts kind and expert count (moe_naming)."""
    pairs = []
    for ours, theirs in NAMES[family].items():
        theirs = (theirs,) if isinstance(theirs, str) else theirs
        for i in range(num_layers) if "{i}" in ours else [0]:
            pairs.append((ours.format(i=i), tuple(name.format(i=i) for name in theirs)))
    if moe is not None:
        (router, expert, (gate, up, down)), experts = MOE_NAMES[moe[0]], range(moe[1])
        for i in range(num_layers):
            names = {proj: [f"{expert.format(i=i, e=e)}{proj}.weight" for e in experts] for proj in (gate, up, down)}
            pairs += [
                (f"blocks.{i}.mlp.router.weight", (router.format(i=i),)),
                (f"blocks.{i}.mlp.experts.up", tuple(n for pair in zip(names[gate], names[up]) for n in pair)),
                (f"blocks.{i}.mlp.experts.down", tuple(names[down])),
            ]
    return pairs


def moe_naming(num_experts: int, qk_norm: bool, qk_norm_over: str) -> tuple[str, int] | None:
    """The Hugging Face MoE class a model of ours is (None: dense): QK-norm per head is Qwen3-MoE's, over the
    projection OLMoE's, none Mixtral's."""
    if not num_experts:
        return None
    kind = ("olmoe" if qk_norm_over == "projection" else "qwen3_moe") if qk_norm else "mixtral"
    return kind, num_experts


def model_moe_naming(cfg) -> tuple[str, int] | None:
    return moe_naming(cfg.num_experts, cfg.qk_norm, cfg.qk_norm_over)


# --- import ---------------------------------------------------------------------------------------------


def from_hf(hf_dir: str | Path) -> tuple[dict, dict[str, torch.Tensor]]:
    """(`model:` keys, state dict with our names) of a local Hugging Face LLaMA, Mistral, Qwen2, Qwen3, GPT-2,
    Mixtral, Qwen3-MoE or OLMoE.

    The state dict has the keys of our model's `state_dict()`, so `load_state_dict(state)` is strict.

    Reads model.safetensors or pytorch_model.bin, sharded (with an index) or not. Refuses a checkpoint our
    model would compute differently (pretrain.hf_config.fields names the config.json fields; tensors it has no
    place for here).
    """
    hf_dir = Path(hf_dir)
    if not hf_dir.is_dir():
        raise UsageError(f"{hf_dir} is not a directory; give a local Hugging Face model directory")
    keys = from_hf_config(hf_dir)  # refuses, by name, every config.json field our model would compute otherwise
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
    moe = moe_naming(keys.get("num_experts", 0), keys.get("qk_norm", False), keys.get("qk_norm_over", "head"))
    for ours, theirs in hf_pairs(family, keys["num_layers"], moe):
        present = [name for name in theirs if name in tensors]
        if not present:
            continue
        if len(present) < len(theirs):
            missing = ", ".join(name for name in theirs if name not in tensors)
            raise UsageError(f"{hf_dir}: has {present[0]} but not {missing}; the checkpoint is incomplete")
        parts = [tensors.pop(name) for name in theirs]
        parts = [p.t() if CONV1D.search(name) else p for name, p in zip(theirs, parts)]
        state[ours] = torch.cat(parts) if len(parts) > 1 else parts[0].contiguous()
        if ours.endswith(EXPERT_TENSORS):  # [E x rows, cols] -> [E, rows, cols]
            state[ours] = state[ours].view(keys["num_experts"], -1, state[ours].shape[-1])
    if keys["tie_embeddings"] and "embed.weight" in state:
        state["lm_head.weight"] = state["embed.weight"]  # as in our model's state_dict(): one tensor, two names
    if tensors:
        names = ", ".join(sorted(tensors)[:4]) + (", ..." if len(tensors) > 4 else "")
        raise UsageError(
            f"{hf_dir}: {len(tensors)} tensors have no place in a pretrain model ({names}); "
            "the architecture has parts pretrain does not build (e.g. output-projection or MLP "
            "biases)"
        )
    return keys, state


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
    raise UsageError(
        f"{hf_dir}: no model.safetensors or pytorch_model.bin (or their sharded index); "
        "give a Hugging Face model directory"
    )


def load_hf_into(model, hf_dir: str | Path) -> None:
    """Copy a Hugging Face checkpoint's weights into `model`, built with its shape (continued pretraining)."""
    keys, state = from_hf(hf_dir)
    params = model.state_dict(keep_vars=True)  # the parameters themselves, a tied one under both names
    cfg = model.config
    for name in [n for n in params if n.endswith(".expert_bias")]:
        del params[name]  # MoE routing biases: none in these classes, they start at 0 (model/moe.py)
    hf_names = {
        ours: " + ".join(theirs) for ours, theirs in hf_pairs(cfg.family, cfg.num_layers, model_moe_naming(cfg))
    }
    fix = f"take the model: keys from the checkpoint (model.hf_config: {hf_dir})"
    # The other way round is fine: an untied model starts its output layer as a copy of the embedding.
    if cfg.tie_embeddings and not keys["tie_embeddings"]:
        raise UsageError(f"{hf_dir} has an output layer of its own but model.tie_embeddings is true; {fix}")
    for name, param in params.items():
        if name not in state:
            raise UsageError(f"{hf_dir} has no {hf_names[name]} for the model's {name}; {fix}")
        if name in VOCAB_ROWS and param.shape[0] > cfg.vocab_size:
            param = param[: cfg.vocab_size]  # the rows model.pad_vocab_to adds keep their initial values
        if state[name].shape != param.shape:
            raise UsageError(
                f"{hf_dir}: {hf_names[name]} has shape {tuple(state[name].shape)} but the model's "
                f"{name} is {tuple(param.shape)}; {fix}"
            )
    extra = sorted(state.keys() - params.keys())
    if extra:
        raise UsageError(
            f"{hf_dir} has {', '.join(hf_names[n] for n in extra)}, which the model lacks "
            f"(tie_embeddings, bias, qkv_bias or qk_norm differ); {fix}"
        )
    with torch.no_grad():
        for name, param in params.items():
            param[: state[name].shape[0]].copy_(state[name])
