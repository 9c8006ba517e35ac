"""Import from Hugging Face: checkpoints written by transformers itself load into our model and agree."""

import json

import pytest
import torch

from pretrain.config import load_config
from pretrain.errors import UsageError
from pretrain.model import build_model
from pretrain.model.hf import from_hf, load_hf_into

LLAMA_SHAPE = dict(
    vocab_size=300,
    hidden_size=64,
    intermediate_size=160,
    num_hidden_layers=2,
    num_attention_heads=4,
    num_key_value_heads=2,
    max_position_embeddings=128,
    rms_norm_eps=1e-6,
    rope_theta=20000.0,
)


def native(kind: str):
    """A tiny transformers model with random weights, norms and biases included."""
    import transformers as t

    model = {
        "llama": lambda: t.LlamaForCausalLM(t.LlamaConfig(**LLAMA_SHAPE)),
        "llama-tied": lambda: t.LlamaForCausalLM(t.LlamaConfig(**LLAMA_SHAPE, tie_word_embeddings=True)),
        "qwen2": lambda: t.Qwen2ForCausalLM(t.Qwen2Config(**LLAMA_SHAPE, tie_word_embeddings=True)),
        # QK-norm; head_dim 32 is not hidden / heads, and a window that use_sliding_window switches off
        "qwen3": lambda: t.Qwen3ForCausalLM(t.Qwen3Config(**LLAMA_SHAPE, head_dim=32, sliding_window=16)),
        # A window below max_position_embeddings: model.sliding_window, which bounds train.seq_len.
        "mistral": lambda: t.MistralForCausalLM(t.MistralConfig(**LLAMA_SHAPE, sliding_window=64)),
        "gpt2": lambda: t.GPT2LMHeadModel(
            t.GPT2Config(vocab_size=300, n_embd=64, n_layer=2, n_head=4, n_positions=128)
        ),
    }[kind]()
    torch.manual_seed(0)
    with torch.no_grad():
        for p in model.parameters():
            p.add_(torch.randn_like(p) * 0.05)
    return model.eval()


def ours_from(hf_dir):
    keys, state = from_hf(hf_dir)
    model = build_model(load_config({"model": keys}).model).eval()
    model.load_state_dict(state)
    return keys, model


def assert_same_logits(ours, theirs):
    tokens = torch.randint(0, 300, (2, 24), generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        assert (ours(tokens) - theirs(tokens).logits).abs().max() < 1e-4


@pytest.mark.parametrize("kind", ["llama", "llama-tied", "qwen2", "qwen3", "mistral", "gpt2"])
def test_native_checkpoint_imports_and_agrees(kind, tmp_path):
    theirs = native(kind)
    theirs.save_pretrained(tmp_path)
    keys, ours = ours_from(tmp_path)
    assert_same_logits(ours, theirs)
    assert keys["family"] == ("gpt2" if kind == "gpt2" else "llama")
    assert keys.get("qkv_bias", False) == (kind == "qwen2")
    assert keys.get("qk_norm", False) == (kind == "qwen3")
    assert keys["max_seq_len"] == 128 and keys.get("sliding_window") == (64 if kind == "mistral" else None)


def _original_gpt2_layout(model, folder):
    """openai-community/gpt2's pytorch_model.bin: no `transformer.` prefix, causal-mask buffers saved."""
    state = {k.removeprefix("transformer."): v for k, v in model.state_dict().items() if k != "lm_head.weight"}
    for i in range(model.config.n_layer):
        state[f"h.{i}.attn.bias"] = torch.ones(1, 1, 128, 128).tril()
    torch.save(state, folder / "pytorch_model.bin")


@pytest.mark.parametrize("layout", ["pytorch_model.bin", "sharded", "original-gpt2"])
def test_checkpoint_layouts(layout, tmp_path):
    theirs = native("gpt2" if layout == "original-gpt2" else "llama")
    if layout == "sharded":
        theirs.save_pretrained(tmp_path, max_shard_size="100KB")
        assert (tmp_path / "model.safetensors.index.json").is_file()
    else:
        theirs.config.save_pretrained(tmp_path)
        if layout == "original-gpt2":
            _original_gpt2_layout(theirs, tmp_path)
        else:
            torch.save(theirs.state_dict(), tmp_path / "pytorch_model.bin")
    assert_same_logits(ours_from(tmp_path)[1], theirs)


def test_load_hf_into_a_built_model(tmp_path):
    theirs = native("llama")
    theirs.save_pretrained(tmp_path)
    keys, _ = from_hf(tmp_path)
    model = build_model(load_config({"model": keys}).model).eval()
    load_hf_into(model, tmp_path)
    assert_same_logits(model, theirs)


def test_load_hf_into_names_the_mismatched_tensor(tmp_path):
    native("llama").save_pretrained(tmp_path)
    keys, _ = from_hf(tmp_path)
    wider = build_model(load_config({"model": {**keys, "intermediate_size": 192}}).model)
    with pytest.raises(
        UsageError,
        match=r"mlp\.gate_proj\.weight \+ .*up_proj\.weight has shape \(320, 64\) "
        r"but the model's blocks\.0\.mlp\.up\.weight is \(384, 64\)",
    ):
        load_hf_into(wider, tmp_path)
    tied = build_model(load_config({"model": {**keys, "tie_embeddings": True}}).model)
    with pytest.raises(UsageError, match="tie_embeddings"):
        load_hf_into(tied, tmp_path)


def _write_config(folder, **changes):
    from transformers import LlamaConfig

    folder.mkdir(exist_ok=True)
    (folder / "config.json").write_text(json.dumps({**LlamaConfig(**LLAMA_SHAPE).to_dict(), **changes}))


def test_unsupported_checkpoints_are_refused(tmp_path):
    from transformers import LlamaConfig, LlamaForCausalLM

    _write_config(tmp_path / "scaled", rope_parameters=dict(rope_type="linear", rope_theta=5e5, factor=8.0))
    with pytest.raises(UsageError, match="rope_type 'linear' is not built"):
        from_hf(tmp_path / "scaled")
    _write_config(tmp_path / "gelu", hidden_act="gelu")
    with pytest.raises(UsageError, match="hidden_act .'gelu'. is not built"):
        from_hf(tmp_path / "gelu")
    # attention_bias puts a bias on o_proj too, which our model does not have.
    LlamaForCausalLM(LlamaConfig(**LLAMA_SHAPE, attention_bias=True)).save_pretrained(tmp_path / "biased")
    with pytest.raises(UsageError, match=r"attention_bias \(True\) is not built"):
        from_hf(tmp_path / "biased")
    _write_config(tmp_path / "empty")
    with pytest.raises(UsageError, match="no model.safetensors"):
        from_hf(tmp_path / "empty")
    with pytest.raises(UsageError, match="not a directory"):
        from_hf(tmp_path / "missing")
