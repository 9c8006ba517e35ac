"""model.hf_config: every field of a supported family's config.json is read, ignored as no part of the model's
math, or refused by name; none is dropped without a word."""

import json

import pytest

from pretrain.config import load_config
from pretrain.errors import ConfigError
from pretrain.hf_config.fields import FIELDS, IGNORED, READ, Neutral
from pretrain.plan.params import count_params

transformers = pytest.importorskip("transformers")

CLASSES = {
    "llama": "LlamaConfig",
    "mistral": "MistralConfig",
    "qwen2": "Qwen2Config",
    "qwen3": "Qwen3Config",
    "gpt2": "GPT2Config",
    "mixtral": "MixtralConfig",
    "qwen3_moe": "Qwen3MoeConfig",
    "olmoe": "OlmoeConfig",
    "deepseek_v3": "DeepseekV3Config",
    "gpt_oss": "GptOssConfig",
}
LLAMA_SHAPE = dict(
    vocab_size=1000,
    hidden_size=256,
    intermediate_size=512,
    num_hidden_layers=2,
    num_attention_heads=4,
    num_key_value_heads=2,
    max_position_embeddings=512,
)


@pytest.mark.parametrize("kind", CLASSES)
def test_every_field_of_transformers_config_is_classified(kind):
    # A field a new transformers adds fails here instead of being dropped silently.
    config = getattr(transformers, CLASSES[kind])()
    assert set(config.to_dict()) <= set(FIELDS[kind]), sorted(set(config.to_dict()) - set(FIELDS[kind]))
    # ... and the defaults transformers writes are accepted: every refused field has its default neutral.
    for name, rule in FIELDS[kind].items():
        assert rule in (READ, IGNORED) or isinstance(rule, Neutral)
        if isinstance(rule, Neutral) and name in config.to_dict():
            assert config.to_dict()[name] in rule.values, name


def _model(tmp_path, **hf):
    (tmp_path / "config.json").write_text(json.dumps(hf))
    return load_config(overrides=[f"model.hf_config={tmp_path}", "train.seq_len=64"]).model


def _refusal(tmp_path, **hf) -> str:
    with pytest.raises(ConfigError) as e:
        _model(tmp_path, **hf)
    message = str(e.value)
    assert "\n" not in message
    return message


@pytest.mark.parametrize(
    "model_type, field, value",
    [
        ("llama", "hidden_act", "gelu"),
        ("llama", "attention_bias", True),
        ("llama", "mlp_bias", True),
        ("qwen3", "attention_bias", True),
        ("mistral", "hidden_act", "relu"),
    ],
)
def test_a_field_not_at_its_neutral_value_is_refused_by_name(tmp_path, model_type, field, value):
    message = _refusal(tmp_path, model_type=model_type, **LLAMA_SHAPE, **{field: value})
    assert f"{field} (" in message and "not built" in message


LLAMA31 = {
    "rope_type": "llama3",
    "factor": 8.0,
    "low_freq_factor": 1.0,
    "high_freq_factor": 4.0,
    "original_max_position_embeddings": 8192,
}


def test_rope_scaling_is_read_as_either_transformers_writes_it(tmp_path):
    # transformers 4: rope_theta beside rope_scaling; 5: one rope_parameters mapping holding both
    four = _model(tmp_path, model_type="llama", **LLAMA_SHAPE, rope_theta=500000.0, rope_scaling=LLAMA31)
    five = _model(tmp_path, model_type="llama", **LLAMA_SHAPE, rope_parameters={**LLAMA31, "rope_theta": 5e5})
    assert four.rope_scaling == five.rope_scaling == LLAMA31 and four.rope_theta == five.rope_theta == 5e5
    # transformers fills a missing original_max_position_embeddings from max_position_embeddings
    yarn = _model(tmp_path, model_type="qwen2", **LLAMA_SHAPE, rope_scaling={"type": "yarn", "factor": 4.0})
    assert yarn.rope_scaling == {"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 512}
    default = _model(
        tmp_path, model_type="llama", **LLAMA_SHAPE, rope_parameters={"rope_type": "default", "rope_theta": 5e5}
    )
    assert default.rope_scaling is None and default.rope_theta == 5e5


def test_rope_scaling_not_built_is_refused_by_name(tmp_path):
    message = _refusal(
        tmp_path,
        model_type="llama",
        **LLAMA_SHAPE,
        rope_parameters={"rope_type": "longrope", "rope_theta": 5e5, "factor": 8.0},
    )
    assert "rope_scaling: rope_type 'longrope' is not built; choose one of llama3 | yarn" in message
    message = _refusal(tmp_path, model_type="llama", **LLAMA_SHAPE, rope_scaling={"rope_type": "llama3", "factor": 8})
    assert "rope_type llama3 needs low_freq_factor, high_freq_factor" in message
    message = _refusal(
        tmp_path,
        model_type="llama",
        **LLAMA_SHAPE,
        rope_parameters={"rope_type": "default", "rope_theta": 5e5, "partial_rotary_factor": 0.5},
    )
    assert "partial_rotary_factor (rotary on part of each head) is not built" in message


def test_other_families_are_refused_naming_what_is_missing(tmp_path):
    gemma2 = transformers.Gemma2Config(**LLAMA_SHAPE).to_dict()
    message = _refusal(tmp_path, **gemma2)
    assert message.startswith(
        f"model.hf_config: {tmp_path / 'config.json'}: gemma2 is not built (attn_logit_softcapping, "
        "final_logit_softcapping"
    )
    assert message.endswith(
        "); supported model_type: llama, mistral, qwen2, qwen3, gpt2, mixtral, "
        "qwen3_moe, olmoe (planner only: deepseek_v3, gpt_oss)"
    )
    # A family not in the list: its fields that no supported family has, or nothing when none is unknown
    message = _refusal(tmp_path, model_type="falcon", **LLAMA_SHAPE, parallel_attn=True, alibi=False)
    assert "falcon is not built (parallel_attn); supported" in message
    assert "foo is not built; supported" in _refusal(tmp_path, model_type="foo", **LLAMA_SHAPE)
    assert "no model_type" in _refusal(tmp_path, **LLAMA_SHAPE)
    message = _refusal(tmp_path, model_type=["llama"], **LLAMA_SHAPE)
    assert 'model_type ["llama"] is an array, not a string' in message


@pytest.mark.parametrize(
    "model_type, changes, window",
    [
        ("mistral", dict(sliding_window=128), 128),  # every layer slides: full attention up to the window
        ("mistral", dict(sliding_window=None), None),
        ("mistral", dict(sliding_window=4096), None),  # a window beyond the context changes nothing
        ("qwen2", dict(sliding_window=128, use_sliding_window=False), None),  # Qwen2.5's: switched off
        ("qwen2", dict(sliding_window=128, use_sliding_window=True, max_window_layers=2), None),  # no layer slides
        ("qwen3", dict(sliding_window=128, use_sliding_window=True, max_window_layers=1), 128),
        (
            "qwen3",
            dict(sliding_window=128, use_sliding_window=True, layer_types=["full_attention", "sliding_attention"]),
            128,
        ),
    ],
)
def test_a_sliding_window_bounds_the_sequence(tmp_path, model_type, changes, window):
    m = _model(tmp_path, model_type=model_type, **LLAMA_SHAPE, **changes)
    assert (m.sliding_window, m.max_seq_len) == (window, 512)


def test_mistral_7b_trains_within_its_window_and_refuses_beyond_it(tmp_path):
    # Mistral-7B v0.1: a 4,096-token window, 32,768 positions
    hf = dict(model_type="mistral", **{**LLAMA_SHAPE, "max_position_embeddings": 32768}, sliding_window=4096)
    (tmp_path / "config.json").write_text(json.dumps(hf))
    source = f"model.hf_config={tmp_path}"
    assert load_config(overrides=[source, "train.seq_len=4096"]).train.seq_len == 4096
    assert load_config(overrides=[source]).train.seq_len == 2048
    with pytest.raises(
        ConfigError,
        match=r"train.seq_len: 8192 is longer than model.sliding_window 4096, .*"
        r"use train.seq_len <= 4096$",
    ):
        load_config(overrides=[source, "train.seq_len=8192"])
    (tmp_path / "config.json").write_text(json.dumps({**hf, "sliding_window": 1024}))
    assert load_config(overrides=[source]).train.seq_len == 1024  # the default length stays within it


def test_qwen3_counts_as_transformers_builds_it(tmp_path):
    import torch

    hf = transformers.Qwen3Config(**LLAMA_SHAPE, head_dim=32, tie_word_embeddings=True)
    hf.save_pretrained(tmp_path)
    m = load_config(overrides=[f"model.hf_config={tmp_path}"]).model
    assert m.qk_norm and not m.qkv_bias and m.head_dim == 32
    with torch.device("meta"):
        theirs = transformers.AutoModelForCausalLM.from_config(hf)
    assert count_params(m).total == sum(p.numel() for p in theirs.parameters())
    assert count_params(m).norm == 2 * (2 * 256 + 2 * 32) + 256  # QK-norm: 2 x head_dim a layer


def test_gpt2_has_no_qk_norm():
    with pytest.raises(ConfigError, match="model.qk_norm: the gpt2 family has no QK-norm"):
        load_config(overrides=["model.preset=gpt2", "model.qk_norm=true"])


@pytest.mark.parametrize(
    "field, value, words",
    [
        # Each was replaced by a default before: unscaled RoPE, a base of 10000, head_dim H / heads, no GQA.
        ("rope_scaling", "linear", 'rope_scaling "linear" is a string, not a mapping'),
        ("rope_scaling", [1, 2], "rope_scaling [1, 2] is an array, not a mapping"),
        ("rope_parameters", "default", 'rope_parameters "default" is a string, not a mapping'),
        ("rope_theta", 0, "rope_theta 0 must be a positive number"),
        ("rope_theta", -1, "rope_theta -1 must be a positive number"),
        ("head_dim", 0, "head_dim 0 must be a positive integer"),
        ("num_key_value_heads", 0, "num_key_value_heads 0 must be a positive integer"),
        ("num_key_value_heads", 2.5, "num_key_value_heads 2.5 must be a positive integer"),
    ],
)
def test_a_malformed_value_is_refused_by_name_not_replaced_by_a_default(tmp_path, field, value, words):
    # The llama-like reading and the planner-only one (DeepSeek-V3's; gpt-oss's head_dim; their rope_scaling
    # is ignored: it changes no count)
    planned = {"head_dim": ["gpt_oss"], "rope_scaling": []}.get(field, ["deepseek_v3"])
    for kind in ("llama", *planned):
        hf = transformers.AutoConfig.for_model(kind, **LLAMA_SHAPE).to_dict() if kind != "llama" else LLAMA_SHAPE
        message = _refusal(tmp_path, **{**hf, "model_type": kind, field: value})
        assert words in message and message.endswith("fix the config.json"), message


def test_null_is_transformers_default_and_a_byte_order_mark_is_skipped(tmp_path):
    given = _model(tmp_path, model_type="llama", **LLAMA_SHAPE, rope_theta=None, head_dim=None, rope_scaling=None)
    assert (given.rope_theta, given.head_dim, given.rope_scaling) == (10000.0, 64, None)
    # A config.json saved by a Windows editor starts with U+FEFF: the same model, not "not valid JSON"
    (tmp_path / "config.json").write_bytes(
        b"\xef\xbb\xbf" + json.dumps({"model_type": "llama", **LLAMA_SHAPE}).encode()
    )
    assert load_config(overrides=[f"model.hf_config={tmp_path}", "train.seq_len=64"]).model == _model(
        tmp_path, model_type="llama", **LLAMA_SHAPE
    )
