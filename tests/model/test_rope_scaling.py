"""model.rope_scaling: the frequencies transformers computes, and one-line refusals of bad mappings."""

import pytest
import torch

from pretrain.config import load_config
from pretrain.errors import ConfigError
from pretrain.model.rope import inverse_frequencies
from support import run_cli

LLAMA31 = {
    "rope_type": "llama3",
    "factor": 8.0,
    "low_freq_factor": 1.0,
    "high_freq_factor": 4.0,
    "original_max_position_embeddings": 8192,
}
SCALINGS = {
    "llama3.1": LLAMA31,
    "llama3-short": {**LLAMA31, "factor": 4.0, "low_freq_factor": 2.0, "original_max_position_embeddings": 64},
    "yarn": {"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 2048},
    "yarn-betas": {
        "rope_type": "yarn",
        "factor": 16.0,
        "original_max_position_embeddings": 4096,
        "beta_fast": 16.0,
        "beta_slow": 2.0,
        "truncate": False,
    },
    "yarn-attention_factor": {
        "rope_type": "yarn",
        "factor": 2.0,
        "original_max_position_embeddings": 512,
        "attention_factor": 0.9,
    },
    "yarn-mscale": {
        "rope_type": "yarn",
        "factor": 40.0,
        "original_max_position_embeddings": 4096,
        "mscale": 1.0,
        "mscale_all_dim": 0.707,
    },  # DeepSeek-V3's
}


@pytest.mark.parametrize("name", SCALINGS)
@pytest.mark.parametrize("head_dim, theta", [(128, 500000.0), (16, 5000.0)])
def test_frequencies_and_attention_factor_are_transformers(name, head_dim, theta):
    from transformers import LlamaConfig
    from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS

    scaling = SCALINGS[name]
    hf = LlamaConfig(
        hidden_size=head_dim * 4,
        num_attention_heads=4,
        head_dim=head_dim,
        max_position_embeddings=131072,
        rope_parameters={**scaling, "rope_theta": theta},
    )
    theirs, their_factor = ROPE_INIT_FUNCTIONS[scaling["rope_type"]](hf)
    config = load_config(
        overrides=[
            "model.preset=debug",
            f"model.head_dim={head_dim}",
            f"model.rope_theta={theta}",
            "model.max_seq_len=131072",
            f"model.rope_scaling={scaling}",
        ]
    )
    ours, our_factor = inverse_frequencies(head_dim, theta, config.model.rope_scaling)
    assert torch.equal(ours, theirs) and our_factor == their_factor
    unscaled, _ = inverse_frequencies(head_dim, theta, None)
    assert not torch.equal(ours, unscaled)  # the scaling changes some frequency at this shape


@pytest.mark.parametrize(
    "value, words",
    [
        ("{rope_type: linear, factor: 2}", "rope_type 'linear' is not built; choose one of llama3 | yarn"),
        ("{rope_type: yarn, factor: 4}", "rope_type yarn needs original_max_position_embeddings"),
        (
            "{rope_type: llama3, factor: 8, original_max_position_embeddings: 8192}",
            "needs low_freq_factor, high_freq_factor",
        ),
        (
            "{rope_type: yarn, factor: 4, original_max_position_embeddings: 64, rope_theta: 3}",
            "unknown key 'rope_theta' for rope_type yarn; set model.rope_theta instead",
        ),
        ("{rope_type: yarn, factor: 4, original_max_position_embeddings: 64, betafast: 3}", "unknown key 'betafast'"),
        ("{rope_type: yarn, factor: 0.5, original_max_position_embeddings: 64}", "factor: 0.5 shrinks the context"),
        ("{rope_type: yarn, factor: 4, original_max_position_embeddings: 6.5}", "a positive whole number"),
        ("{rope_type: yarn, factor: abc, original_max_position_embeddings: 64}", "factor: expected a finite number"),
        (
            "{rope_type: yarn, factor: 4, original_max_position_embeddings: 64, beta_fast: 1, beta_slow: 2}",
            "beta_fast 1.0 is below beta_slow 2.0",
        ),
        (
            "{rope_type: llama3, factor: 8, low_freq_factor: 4, high_freq_factor: 1,"
            " original_max_position_embeddings: 64}",
            "needs 0 < low_freq_factor < high_freq_factor",
        ),
        ("[1, 2]", "expected a mapping"),
    ],
)
def test_bad_mappings_are_refused_naming_the_key(value, words):
    with pytest.raises(ConfigError, match="^model.rope_scaling") as e:
        load_config(overrides=["model.preset=debug", f"model.rope_scaling={value}"])
    assert words in str(e.value) and "\n" not in str(e.value)


def test_gpt2_has_no_rope_to_scale_and_the_cli_says_so_in_one_line():
    r = run_cli("plan", "model.preset=gpt2", f"model.rope_scaling={LLAMA31}")
    lines = r.stderr.strip().splitlines()
    assert r.returncode == 2 and len(lines) == 1 and "gpt2 family has learned positions" in lines[0], r.stderr


def test_default_and_type_spellings_normalise():
    def scaling(value):
        return load_config(overrides=["model.preset=debug", f"model.rope_scaling={value}"]).model.rope_scaling

    assert scaling("{rope_type: default}") is None and scaling("null") is None
    # transformers before 4.45 wrote `type`; integers become the float factors transformers validates
    assert scaling("{type: yarn, factor: 4, original_max_position_embeddings: 64}") == {
        "rope_type": "yarn",
        "factor": 4.0,
        "original_max_position_embeddings": 64,
    }
