"""Published model shapes, as `model:` keys. Pure data: the planner and the model builder both read it.

Each entry is copied from the model's Hugging Face `config.json` (or its paper where that is the source);
`tests/plan/test_params.py` builds every preset with `transformers` on the meta device and checks that the
parameter counts agree.
"""

from __future__ import annotations

from typing import Any

from .errors import ConfigError

_GPT2 = dict(family="gpt2", vocab_size=50257, max_seq_len=1024, tie_embeddings=True, bias=True, norm_eps=1e-5)
_LLAMA1 = dict(family="llama", vocab_size=32000, max_seq_len=2048, norm_eps=1e-6, rope_theta=10000.0)
_LLAMA2 = dict(family="llama", vocab_size=32000, max_seq_len=4096, norm_eps=1e-5, rope_theta=10000.0)
_LLAMA3 = dict(family="llama", vocab_size=128256, norm_eps=1e-5, rope_theta=500000.0)
_QWEN25 = dict(family="llama", vocab_size=151936, max_seq_len=32768, qkv_bias=True, norm_eps=1e-6, rope_theta=1000000.0)
_QWEN3_MOE = dict(
    family="llama",
    vocab_size=151936,
    head_dim=128,
    max_seq_len=40960,
    norm_eps=1e-6,
    rope_theta=1000000.0,
    qk_norm=True,
    num_experts=128,
    experts_per_token=8,
    router_aux_loss_coef=0.001,
)


def _llama3_rope(factor: float) -> dict[str, Any]:
    """Llama 3.1 / 3.2's RoPE scaling of the 8K pretraining context (their config.json's rope_scaling)."""
    return dict(
        rope_type="llama3",
        factor=factor,
        low_freq_factor=1.0,
        high_freq_factor=4.0,
        original_max_position_embeddings=8192,
    )


PRESETS: dict[str, dict[str, Any]] = {
    # GPT-2 (openai-community/gpt2*): n_embd, n_layer, n_head; MLP is 4 x n_embd.
    "gpt2": dict(_GPT2, hidden_size=768, num_layers=12, num_heads=12, intermediate_size=3072),
    "gpt2-medium": dict(_GPT2, hidden_size=1024, num_layers=24, num_heads=16, intermediate_size=4096),
    "gpt2-large": dict(_GPT2, hidden_size=1280, num_layers=36, num_heads=20, intermediate_size=5120),
    "gpt2-xl": dict(_GPT2, hidden_size=1600, num_layers=48, num_heads=25, intermediate_size=6400),
    # LLaMA 1 (Touvron et al. 2023, table 2) and LLaMA 2 (huggyllama/*, meta-llama/Llama-2-*-hf).
    "llama-7b": dict(_LLAMA1, hidden_size=4096, intermediate_size=11008, num_layers=32, num_heads=32),
    "llama-13b": dict(_LLAMA1, hidden_size=5120, intermediate_size=13824, num_layers=40, num_heads=40),
    "llama-33b": dict(_LLAMA1, hidden_size=6656, intermediate_size=17920, num_layers=60, num_heads=52),
    "llama-65b": dict(_LLAMA1, hidden_size=8192, intermediate_size=22016, num_layers=80, num_heads=64),
    "llama2-7b": dict(_LLAMA2, hidden_size=4096, intermediate_size=11008, num_layers=32, num_heads=32),
    "llama2-13b": dict(_LLAMA2, hidden_size=5120, intermediate_size=13824, num_layers=40, num_heads=40),
    "llama2-70b": dict(_LLAMA2, hidden_size=8192, intermediate_size=28672, num_layers=80, num_heads=64, num_kv_heads=8),
    # Llama 3 / 3.1 / 3.2 (meta-llama/*): grouped-query attention, 128K vocabulary.
    "llama3-8b": dict(
        _LLAMA3,
        hidden_size=4096,
        intermediate_size=14336,
        num_layers=32,
        num_heads=32,
        num_kv_heads=8,
        max_seq_len=8192,
    ),
    "llama3-70b": dict(
        _LLAMA3,
        hidden_size=8192,
        intermediate_size=28672,
        num_layers=80,
        num_heads=64,
        num_kv_heads=8,
        max_seq_len=8192,
    ),
    # Llama 3.1 8B: Llama 3 8B's shape, its context extended to 128K by RoPE scaling (meta-llama/Llama-3.1-8B)
    "llama3.1-8b": dict(
        _LLAMA3,
        hidden_size=4096,
        intermediate_size=14336,
        num_layers=32,
        num_heads=32,
        num_kv_heads=8,
        max_seq_len=131072,
        rope_scaling=_llama3_rope(8.0),
    ),
    "llama3.2-1b": dict(
        _LLAMA3,
        hidden_size=2048,
        intermediate_size=8192,
        num_layers=16,
        num_heads=32,
        num_kv_heads=8,
        head_dim=64,
        tie_embeddings=True,
        max_seq_len=131072,
        rope_scaling=_llama3_rope(32.0),
    ),
    "llama3.2-3b": dict(
        _LLAMA3,
        hidden_size=3072,
        intermediate_size=8192,
        num_layers=28,
        num_heads=24,
        num_kv_heads=8,
        head_dim=128,
        tie_embeddings=True,
        max_seq_len=131072,
        rope_scaling=_llama3_rope(32.0),
    ),
    "tinyllama-1.1b": dict(
        _LLAMA2, hidden_size=2048, intermediate_size=5632, num_layers=22, num_heads=32, num_kv_heads=4, max_seq_len=2048
    ),
    # Qwen2.5 (Qwen/Qwen2.5-*): biases on q, k, v only.
    "qwen2.5-0.5b": dict(
        _QWEN25,
        hidden_size=896,
        intermediate_size=4864,
        num_layers=24,
        num_heads=14,
        num_kv_heads=2,
        tie_embeddings=True,
    ),
    "qwen2.5-1.5b": dict(
        _QWEN25,
        hidden_size=1536,
        intermediate_size=8960,
        num_layers=28,
        num_heads=12,
        num_kv_heads=2,
        tie_embeddings=True,
    ),
    "qwen2.5-7b": dict(
        _QWEN25,
        vocab_size=152064,
        hidden_size=3584,
        intermediate_size=18944,
        num_layers=28,
        num_heads=28,
        num_kv_heads=4,
    ),
    # Mistral 7B v0.1 (mistralai/Mistral-7B-v0.1).
    "mistral-7b": dict(
        family="llama",
        vocab_size=32000,
        hidden_size=4096,
        intermediate_size=14336,
        num_layers=32,
        num_heads=32,
        num_kv_heads=8,
        max_seq_len=32768,
        norm_eps=1e-5,
        rope_theta=10000.0,
    ),
    # A tiny model for tests and CPU smoke runs (torchtitan's "debug model" idea).
    "debug": dict(
        family="llama",
        vocab_size=512,
        hidden_size=64,
        intermediate_size=176,
        num_layers=2,
        num_heads=4,
        num_kv_heads=2,
        max_seq_len=256,
        norm_eps=1e-5,
    ),
    # Mixture-of-Experts (docs/moe.md), each counted against transformers' class of the same config.json:
    # Mixtral 8x7B (mistralai/Mixtral-8x7B-v0.1): 8 experts of the dense width, top-2, no shared expert.
    "mixtral-8x7b": dict(
        family="llama",
        vocab_size=32000,
        hidden_size=4096,
        intermediate_size=14336,
        num_layers=32,
        num_heads=32,
        num_kv_heads=8,
        max_seq_len=32768,
        norm_eps=1e-5,
        rope_theta=1000000.0,
        num_experts=8,
        experts_per_token=2,
        moe_intermediate_size=14336,
        router_aux_loss_coef=0.02,
    ),
    # Qwen3 MoE (Qwen/Qwen3-30B-A3B, Qwen/Qwen3-235B-A22B): 128 experts, top-8, per-head QK-norm.
    "qwen3-30b-a3b": dict(
        _QWEN3_MOE,
        hidden_size=2048,
        intermediate_size=6144,
        moe_intermediate_size=768,
        num_layers=48,
        num_heads=32,
        num_kv_heads=4,
    ),
    "qwen3-235b-a22b": dict(
        _QWEN3_MOE,
        hidden_size=4096,
        intermediate_size=12288,
        moe_intermediate_size=1536,
        num_layers=94,
        num_heads=64,
        num_kv_heads=4,
    ),
    # OLMoE-1B-7B (allenai/OLMoE-1B-7B-0924): 64 experts, top-8 without renormalising, QK-norm over the whole
    # q and k projections.
    "olmoe-1b-7b": dict(
        family="llama",
        vocab_size=50304,
        hidden_size=2048,
        intermediate_size=1024,
        moe_intermediate_size=1024,
        num_layers=16,
        num_heads=16,
        max_seq_len=4096,
        norm_eps=1e-5,
        rope_theta=10000.0,
        num_experts=64,
        experts_per_token=8,
        norm_topk_prob=False,
        qk_norm=True,
        qk_norm_over="projection",
        router_z_loss_coef=0.001,
    ),
    # A tiny Mixture-of-Experts for tests, shaped as transformers' Qwen3MoeForCausalLM builds it (a dense first
    # block = its mlp_only_layers [0]; Qwen3-MoE has no shared expert): 8 routed experts, top-2, QK-norm.
    "moe-debug": dict(
        family="llama",
        vocab_size=512,
        hidden_size=64,
        intermediate_size=176,
        num_layers=2,
        num_heads=4,
        num_kv_heads=2,
        max_seq_len=256,
        norm_eps=1e-5,
        num_experts=8,
        experts_per_token=2,
        moe_intermediate_size=32,
        first_dense_layers=1,
        qk_norm=True,
    ),
}


def preset(name: str) -> dict[str, Any]:
    """The `model:` keys of a named preset."""
    if name not in PRESETS:
        raise ConfigError(f"model.preset: unknown preset {name!r}; choose one of {', '.join(PRESETS)}")
    return dict(PRESETS[name])
