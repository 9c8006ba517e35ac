"""Export to Hugging Face: transformers loads the directory and computes what our model computes."""

import json

import pytest
import torch
from safetensors.torch import load_file

from pretrain.config import load_config
from pretrain.errors import UsageError
from pretrain.export import hf
from pretrain.export.generate import generate
from pretrain.export.hf import export_hf
from pretrain.model import build_model
from pretrain.model.hf import from_hf, load_hf_into

GPT2 = ["model.family=gpt2", "model.num_kv_heads=4", "model.intermediate_size=256"]
VARIANTS = {
    "llama-gqa": [],  # the debug preset: 4 query heads share 2 key/value heads
    "llama-tied": ["model.tie_embeddings=true"],
    "llama-head_dim": ["model.num_kv_heads=4", "model.head_dim=32"],  # head_dim != hidden / heads
    "qwen2": ["model.qkv_bias=true", "model.tie_embeddings=true"],
    "qwen3": ["model.qk_norm=true", "model.num_kv_heads=4", "model.head_dim=32"],
    # RoPE scaling with the original context inside the batch's 24 positions, so that it changes the logits
    "llama3.1-rope": [
        "model.rope_scaling={rope_type: llama3, factor: 8, low_freq_factor: 1, high_freq_factor: 4, "
        "original_max_position_embeddings: 16}"
    ],
    "yarn-rope": ["model.rope_scaling={rope_type: yarn, factor: 4, original_max_position_embeddings: 16}"],
    "gpt2-tied": GPT2 + ["model.tie_embeddings=true"],
    "gpt2-untied-nobias": GPT2 + ["model.tie_embeddings=false", "model.bias=false"],  # zero biases exported
}
ARCHITECTURES = {
    "llama-gqa": "LlamaForCausalLM",
    "llama-tied": "LlamaForCausalLM",
    "llama-head_dim": "LlamaForCausalLM",
    "llama3.1-rope": "LlamaForCausalLM",
    "yarn-rope": "LlamaForCausalLM",
    "qwen2": "Qwen2ForCausalLM",
    "qwen3": "Qwen3ForCausalLM",
    "gpt2-tied": "GPT2LMHeadModel",
    "gpt2-untied-nobias": "GPT2LMHeadModel",
}


@pytest.mark.parametrize("variant", VARIANTS)
def test_transformers_loads_the_export_and_agrees(variant, make_model, batch, tmp_path):
    from transformers import AutoModelForCausalLM

    model = make_model(VARIANTS[variant])
    out = export_hf(model, tmp_path / "hf")
    assert sorted(p.name for p in out.iterdir()) == ["config.json", "generation_config.json", "model.safetensors"]
    theirs, info = AutoModelForCausalLM.from_pretrained(out, dtype=torch.float32, output_loading_info=True)
    assert type(theirs).__name__ == ARCHITECTURES[variant]
    assert not info["missing_keys"] and not info["unexpected_keys"], info
    theirs.eval()
    with torch.no_grad():
        assert (theirs(batch).logits - model(batch)).abs().max() < 1e-4
    # Greedy decoding: transformers' generate (with its key/value cache) and ours pick the same tokens.
    prompt = batch[:1, :8]
    hf_tokens = theirs.generate(prompt, max_new_tokens=6, do_sample=False)
    assert torch.equal(hf_tokens, generate(model, prompt, max_new_tokens=6, temperature=0))


def test_tied_output_layer_is_stored_once(make_model, tmp_path):
    out = export_hf(make_model(["model.tie_embeddings=true"]), tmp_path / "hf")
    tensors = load_file(out / "model.safetensors")
    assert "lm_head.weight" not in tensors and "model.embed_tokens.weight" in tensors
    assert json.loads((out / "config.json").read_text())["tie_word_embeddings"] is True


def test_config_carries_the_shape(make_model, tmp_path):
    model = make_model(["model.qkv_bias=true"])
    config = json.loads((export_hf(model, tmp_path / "hf") / "config.json").read_text())
    # Values of the debug preset and of make_model's overrides.
    assert config["model_type"] == "qwen2" and config["architectures"] == ["Qwen2ForCausalLM"]
    assert (config["vocab_size"], config["hidden_size"], config["intermediate_size"]) == (512, 64, 176)
    assert (config["num_attention_heads"], config["num_key_value_heads"], config["head_dim"]) == (4, 2, 16)
    assert config["rope_theta"] == 5000 and config["rms_norm_eps"] == 1e-6
    assert config["max_position_embeddings"] == 256 and config["torch_dtype"] == "float32"
    assert config["eos_token_id"] is None  # no tokenizer: no ids, and not LlamaConfig's default 2


@pytest.mark.parametrize("variant", VARIANTS)
def test_round_trip_is_exact(variant, make_model, batch, tmp_path):
    model = make_model(VARIANTS[variant])
    keys, state = from_hf(export_hf(model, tmp_path / "hf"))
    again = build_model(load_config({"model": keys}).model).eval()
    again.load_state_dict(state)
    with torch.no_grad():
        assert torch.equal(again(batch), model(batch))
    for key in (
        "family",
        "vocab_size",
        "hidden_size",
        "intermediate_size",
        "num_layers",
        "num_heads",
        "max_seq_len",
        "tie_embeddings",
        "norm_eps",
        "qkv_bias",
        "qk_norm",
        "init_std",
        "rope_scaling",
        *(("rope_theta",) if model.config.family == "llama" else ()),
    ):
        assert getattr(again.config, key) == getattr(model.config, key), key


def test_bfloat16_export(make_model, tmp_path):
    out = export_hf(make_model(), tmp_path / "hf", dtype=torch.bfloat16)
    assert json.loads((out / "config.json").read_text())["torch_dtype"] == "bfloat16"
    assert {t.dtype for t in load_file(out / "model.safetensors").values()} == {torch.bfloat16}


def test_tokenizer_files_and_special_token_ids(make_model, tokenizer_dir, tmp_path):
    from tokenizers import Tokenizer
    from transformers import AutoTokenizer, GenerationConfig

    out = export_hf(make_model(), tmp_path / "hf", tokenizer_dir=tokenizer_dir)
    # The conftest tokenizer: <pad> 0, <bos> 1, <eos> 2.
    config = json.loads((out / "config.json").read_text())
    assert (config["pad_token_id"], config["bos_token_id"], config["eos_token_id"]) == (0, 1, 2)
    generation = GenerationConfig.from_pretrained(out)
    assert (generation.pad_token_id, generation.bos_token_id, generation.eos_token_id) == (0, 1, 2)
    theirs = AutoTokenizer.from_pretrained(out)
    assert theirs.eos_token == "<eos>" and theirs.pad_token_id == 0
    text = "w1 w2 w3 w59"
    assert theirs(text)["input_ids"] == Tokenizer.from_file(str(tokenizer_dir / "tokenizer.json")).encode(text).ids


def test_missing_tokenizer_is_refused_before_writing(make_model, tmp_path):
    with pytest.raises(UsageError, match="no tokenizer.json"):
        export_hf(make_model(), tmp_path / "hf", tokenizer_dir=tmp_path)
    assert not (tmp_path / "hf").exists()


def test_existing_directory_is_refused_unless_overwrite(make_model, tmp_path):
    out = tmp_path / "hf"
    out.mkdir()
    (out / "keep.txt").write_text("mine")
    with pytest.raises(UsageError, match="already exists"):
        export_hf(make_model(), out)
    assert [p.name for p in out.iterdir()] == ["keep.txt"]
    export_hf(make_model(), out, overwrite=True)
    assert not (out / "keep.txt").exists() and (out / "model.safetensors").is_file()
    assert [p.name for p in tmp_path.iterdir()] == ["hf"]  # no temporary or old directory left behind


@pytest.mark.parametrize("existing", [False, True])
def test_failed_export_leaves_nothing_half_written(existing, make_model, tmp_path, monkeypatch):
    out = tmp_path / "hf"
    if existing:
        out.mkdir()
        (out / "keep.txt").write_text("mine")

    def fail(*args, **kwargs):  # fails after model.safetensors is written, before the rename
        raise RuntimeError("disk full")

    monkeypatch.setattr(hf, "hf_config", fail)
    with pytest.raises(RuntimeError, match="disk full"):
        export_hf(make_model(), out, overwrite=True)
    assert [p.name for p in tmp_path.iterdir()] == (["hf"] if existing else [])
    if existing:
        assert [p.name for p in out.iterdir()] == ["keep.txt"]


PADDED = ["model.vocab_size=500", "model.pad_vocab_to=64"]  # 512 embedding and output rows for 500 ids


@pytest.mark.parametrize("variant", ["llama-gqa", "gpt2-tied"])
def test_padded_vocabulary_is_trimmed_on_export(variant, make_model, tmp_path):
    from transformers import AutoModelForCausalLM

    model = make_model(VARIANTS[variant] + PADDED)
    assert model.embed.weight.shape[0] == 512
    out = export_hf(model, tmp_path / "hf")
    assert json.loads((out / "config.json").read_text())["vocab_size"] == 500
    tensors = load_file(out / "model.safetensors")
    assert all(
        t.shape[0] == 500
        for name, t in tensors.items()
        if "embed_tokens" in name or "wte" in name or name == "lm_head.weight"
    )
    theirs = AutoModelForCausalLM.from_pretrained(out, dtype=torch.float32).eval()
    batch = torch.randint(0, 500, (2, 24), generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        ours = model(batch)
        assert ours.shape[-1] == 500 and (theirs(batch).logits - ours).abs().max() < 1e-4
        # The same distribution, so the same loss: the padded rows take no part in the softmax.
        logits = theirs(batch).logits[:, :-1].reshape(-1, 500)
        loss = torch.nn.functional.cross_entropy(logits, batch[:, 1:].reshape(-1))
        assert model(batch[:, :-1], batch[:, 1:]) == pytest.approx(loss.item(), rel=1e-5)
    # Imported back into a padded model (continued pretraining): the real rows are the checkpoint's.
    again = make_model(VARIANTS[variant] + PADDED, seed=1)
    load_hf_into(again, out)
    with torch.no_grad():
        assert torch.equal(again(batch), ours)


def test_qk_norm_with_qkv_bias_has_no_architecture(make_model, tmp_path):
    with pytest.raises(UsageError, match="model.qk_norm with model.qkv_bias has no Hugging Face architecture"):
        export_hf(make_model(["model.qk_norm=true", "model.qkv_bias=true"]), tmp_path / "hf")
    assert not (tmp_path / "hf").exists()
