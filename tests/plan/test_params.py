"""Parameter counts: the published figures, every preset against `transformers`, and against our model."""

import pytest

from pretrain.config import load_config
from pretrain.plan import count_params, param_shapes
from pretrain.presets import PRESETS


def model_cfg(preset, *overrides):
    return load_config(overrides=[f"model.preset={preset}", *overrides]).model


def test_llama_7b_textbook_formula():
    # 2VH + H + L(4H^2 + 3HH' + 2H), V=32000, H=4096, H'=11008, L=32 (Touvron et al. 2023, LLaMA-7B: 6,738,415,616).
    V, H, I, L = 32000, 4096, 11008, 32
    assert 2 * V * H + H + L * (4 * H * H + 3 * H * I + 2 * H) == 6_738_415_616
    assert count_params(model_cfg("llama-7b")).total == 6_738_415_616


@pytest.mark.parametrize(
    "preset, total",
    [
        ("gpt2", 124_439_808),  # GPT-2 small, as nanoGPT reports it with the position table
        ("llama3.2-1b", 1_235_814_400),  # "Number of trainable parameters" in the seed's HF Trainer log (002)
        ("llama-65b", 65_285_660_672),
        ("qwen2.5-0.5b", 494_032_768),
    ],
)
def test_published_totals(preset, total):
    assert count_params(model_cfg(preset)).total == total


def test_embedding_and_flops_conventions():
    gpt2 = count_params(model_cfg("gpt2"))
    # Tied output: the input lookups (token + position tables) are excluded, the tied V x H matmul counts.
    assert gpt2.embedding == 50257 * 768 + 1024 * 768
    assert gpt2.flops == gpt2.total - 1024 * 768
    llama = count_params(model_cfg("llama-7b"))
    assert llama.flops == llama.total - 32000 * 4096 == llama.non_embedding


@pytest.mark.parametrize("preset", sorted(PRESETS))
def test_shapes_sum_to_the_formula(preset):
    m = model_cfg(preset)
    total = 0
    for _, shape in param_shapes(m):
        n = 1
        for x in shape:
            n *= x
        total += n
    assert total == count_params(m).total


def _hf_model(m):
    """The `transformers` model of the same shape, on the meta device (nothing allocated)."""
    torch = pytest.importorskip("torch")
    transformers = pytest.importorskip("transformers")
    if m.family == "gpt2":
        cfg = transformers.GPT2Config(
            vocab_size=m.vocab_size,
            n_embd=m.hidden_size,
            n_layer=m.num_layers,
            n_head=m.num_heads,
            n_positions=m.max_seq_len,
            n_inner=m.intermediate_size,
            tie_word_embeddings=m.tie_embeddings,
        )
    elif m.num_experts:
        cfg = _hf_moe_config(transformers, m)
    else:
        kind = transformers.Qwen2Config if m.qkv_bias else transformers.LlamaConfig
        cfg = kind(
            vocab_size=m.vocab_size,
            hidden_size=m.hidden_size,
            intermediate_size=m.intermediate_size,
            num_hidden_layers=m.num_layers,
            num_attention_heads=m.num_heads,
            num_key_value_heads=m.num_kv_heads,
            head_dim=m.head_dim,
            tie_word_embeddings=m.tie_embeddings,
            max_position_embeddings=m.max_seq_len,
        )
    with torch.device("meta"):
        return transformers.AutoModelForCausalLM.from_config(cfg)


def _hf_moe_config(transformers, m):
    """The transformers class our MoE preset is: OLMoE (QK-norm over the projections), Qwen3-MoE (per head; a dense
    first block is its mlp_only_layers), Mixtral (no QK-norm); none of them has a shared expert."""
    assert not m.num_shared_experts
    shape = dict(
        vocab_size=m.vocab_size,
        hidden_size=m.hidden_size,
        num_hidden_layers=m.num_layers,
        num_attention_heads=m.num_heads,
        num_key_value_heads=m.num_kv_heads,
        tie_word_embeddings=m.tie_embeddings,
        max_position_embeddings=m.max_seq_len,
        num_experts_per_tok=m.experts_per_token,
    )
    if m.qk_norm and m.qk_norm_over == "projection":
        assert not m.first_dense_layers
        return transformers.OlmoeConfig(**shape, intermediate_size=m.moe_intermediate_size, num_experts=m.num_experts)
    if m.qk_norm:
        return transformers.Qwen3MoeConfig(
            **shape,
            head_dim=m.head_dim,
            intermediate_size=m.intermediate_size,
            moe_intermediate_size=m.moe_intermediate_size,
            num_experts=m.num_experts,
            mlp_only_layers=list(range(m.first_dense_layers)),
        )
    assert not m.first_dense_layers
    return transformers.MixtralConfig(
        **shape, head_dim=m.head_dim, intermediate_size=m.moe_intermediate_size, num_local_experts=m.num_experts
    )


@pytest.mark.parametrize("preset", sorted(p for p in PRESETS if p != "debug"))
def test_every_preset_matches_transformers(preset):
    m = model_cfg(preset)
    hf = _hf_model(m)
    # transformers counts a tied matrix once, as we do.
    assert sum(p.numel() for p in hf.parameters()) == count_params(m).total


@pytest.mark.parametrize(
    "preset, total, active",
    [
        ("mixtral-8x7b", 46_702_792_704, 12_879_925_248),  # published 46.7B / 12.9B
        ("qwen3-30b-a3b", 30_532_122_624, 3_353_032_704),  # 30.5B / 3.3B
        ("qwen3-235b-a22b", 235_093_634_560, 22_190_763_520),  # 235B / 22B
        ("olmoe-1b-7b", 6_919_161_856, 1_282_017_280),  # 6.9B / 1.3B
    ],
)
def test_moe_presets_total_and_active(preset, total, active):
    counts = count_params(model_cfg(preset))
    m = model_cfg(preset)
    assert (counts.total, counts.active) == (total, active)
    # active = total - (E - k)/E x the routed experts; embedding included, the tied-or-not output layer too
    E, k = m.num_experts, m.experts_per_token
    assert counts.total - counts.active == counts.routed_experts * (E - k) // E
    assert counts.as_dict()["active_no_embedding"] == active - m.vocab_size * m.hidden_size
    assert counts.flops == counts.active - counts.embedding  # untied: N of 6N is the active non-embedding


def test_dense_active_equals_total():
    counts = count_params(model_cfg("llama3-8b")).as_dict()
    assert counts["active"] == counts["total"] and counts["active_no_embedding"] == counts["non_embedding"]
    assert "routed_experts" not in counts


@pytest.mark.parametrize("preset", sorted(PRESETS))
def test_every_preset_matches_our_model(preset):
    pytest.importorskip("torch")
    import importlib.util

    from pretrain.model import build_model, count_parameters

    m = model_cfg(preset)
    if m.num_experts and importlib.util.find_spec("pretrain.model.moe") is None:
        pytest.skip("the MoE blocks are built by model/moe.py (issue #24), not on this branch")
    model = build_model(m, device="meta")
    assert count_parameters(model) == count_params(m).total
    assert [(n, tuple(p.shape)) for n, p in model.named_parameters()] == param_shapes(m)


LLAMA_JSON = dict(
    vocab_size=1000,
    hidden_size=256,
    intermediate_size=512,
    num_hidden_layers=2,
    num_attention_heads=4,
    num_key_value_heads=2,
    max_position_embeddings=512,
)


def _from_json(tmp_path, **hf):
    import json

    (tmp_path / "config.json").write_text(json.dumps(hf))
    return load_config(overrides=[f"model.hf_config={tmp_path}"]).model


@pytest.mark.parametrize("key", ["attention_bias", "mlp_bias"])
def test_llama_biases_we_do_not_build_are_refused(tmp_path, key):
    # LlamaConfig's attention_bias also biases o_proj, mlp_bias the three MLP projections; our blocks have
    # only q/k/v biases, so taking the shape would silently drop parameters transformers has.
    from pretrain.errors import ConfigError

    with pytest.raises(ConfigError, match=key):
        _from_json(tmp_path, model_type="llama", **LLAMA_JSON, **{key: True})


@pytest.mark.parametrize("model_type", ["mistral", "qwen2"])
def test_hf_config_counts_match_transformers(tmp_path, model_type):
    # Mistral ignores attention_bias (no biases at all), Qwen2 always has q/k/v biases: both counted as
    # transformers builds them from the same config.json.
    torch = pytest.importorskip("torch")
    transformers = pytest.importorskip("transformers")
    m = _from_json(tmp_path, model_type=model_type, **LLAMA_JSON, attention_bias=True)
    with torch.device("meta"):
        hf = transformers.AutoModelForCausalLM.from_config(transformers.AutoConfig.from_pretrained(tmp_path))
    assert m.qkv_bias == (model_type == "qwen2")
    assert sum(p.numel() for p in hf.parameters()) == count_params(m).total


def test_tied_parameter_formula_has_no_dangling_factor():
    from pretrain.plan import plan_with_explain

    config = load_config(overrides=["model.preset=debug", "model.num_kv_heads=4", "model.tie_embeddings=true"])
    _, ex = plan_with_explain(config, advice=False)
    formula = next(f for s, n, _, f in ex.lines if (s, n) == ("params", "total"))
    # V x H = 512 x 64 = 32,768 once (tied), + final norm 64 + 2 layers.
    assert formula.startswith("VH + H + L(") and ": 32,768 + 64 + 2 x " in formula


def test_vocabulary_padding_counts_the_padded_rows():
    from pathlib import Path

    from pretrain.plan import make_plan
    from pretrain.plan.params import padded_vocab_size
    from pretrain.plan.table import render

    # configs/gpt2-124m.yaml pads GPT-2's 50,257 ids to 50,304 rows (a multiple of 64), as nanoGPT does: 47 more
    # rows of 768 in the tied embedding/output matrix. nanoGPT's "number of parameters: 123.69M" leaves out the
    # position table: our N of 6N, 124,475,904 - 1,024 x 768 = 123,689,472.
    config = load_config(Path(__file__).resolve().parents[2] / "configs/gpt2-124m.yaml")
    assert config.model.vocab_size == 50_257 and padded_vocab_size(config.model) == 50_304
    p = make_plan(config)
    assert p["params"]["total"] == 124_439_808 + 47 * 768 == 124_475_904
    assert p["params"]["flops"] == 123_689_472
    assert "uint16 ids" in render(config, p)  # the data keeps the real vocabulary's ids
    # The presets stay unpadded, so their published counts hold; an untied LLaMA pads both matrices.
    assert padded_vocab_size(model_cfg("gpt2")) == 50_257
    llama = count_params(model_cfg("llama-7b", "model.vocab_size=31999", "model.pad_vocab_to=128"))
    assert llama.total == 6_738_415_616 and llama.flops == 6_738_415_616 - 32_000 * 4_096
    assert dict(param_shapes(model_cfg("debug", "model.vocab_size=500", "model.pad_vocab_to=64")))[
        "lm_head.weight"
    ] == (512, 64)


@pytest.mark.parametrize("preset", ["debug", "llama3-8b", "qwen2.5-0.5b", "gpt2"])
def test_fused_rows_cover_every_fused_tensor(preset):
    from pretrain.plan.params import fused_rows

    m = model_cfg(preset)
    fused = {name: (shape, fused_rows(name, m)) for name, shape in param_shapes(m) if fused_rows(name, m)}
    assert fused and all(sum(rows) == shape[0] for shape, rows in fused.values())
    assert any(".attn.qkv." in name for name in fused)
    assert any(".mlp.up." in name for name in fused) == (m.family == "llama")  # GPT-2's c_fc is one tensor


DEEPSEEK_V3 = dict(  # deepseek-ai/DeepSeek-V3's config.json, the fields that size it
    model_type="deepseek_v3",
    vocab_size=129280,
    hidden_size=7168,
    intermediate_size=18432,
    moe_intermediate_size=2048,
    num_hidden_layers=61,
    num_attention_heads=128,
    num_key_value_heads=128,
    n_shared_experts=1,
    n_routed_experts=256,
    num_experts_per_tok=8,
    first_k_dense_replace=3,
    q_lora_rank=1536,
    kv_lora_rank=512,
    qk_nope_head_dim=128,
    qk_rope_head_dim=64,
    v_head_dim=128,
    n_group=8,
    topk_group=4,
    moe_layer_freq=1,
    scoring_func="sigmoid",
    rope_scaling={"type": "yarn", "factor": 40, "original_max_position_embeddings": 4096},
    max_position_embeddings=163840,
    num_nextn_predict_layers=1,
    rope_theta=10000,
    routed_scaling_factor=2.5,
)
GPT_OSS_120B = dict(  # openai/gpt-oss-120b's
    model_type="gpt_oss",
    vocab_size=201088,
    hidden_size=2880,
    intermediate_size=2880,
    num_hidden_layers=36,
    num_attention_heads=64,
    num_key_value_heads=8,
    head_dim=64,
    num_local_experts=128,
    num_experts_per_tok=4,
    experts_per_token=4,
    attention_bias=True,
    sliding_window=128,
    max_position_embeddings=131072,
    layer_types=["sliding_attention", "full_attention"] * 18,
    rope_theta=150000,
    swiglu_limit=7.0,
    rope_scaling={"rope_type": "yarn", "factor": 32.0, "original_max_position_embeddings": 4096},
)
GPT_OSS_20B = dict(
    GPT_OSS_120B, num_hidden_layers=24, num_local_experts=32, layer_types=["sliding_attention", "full_attention"] * 12
)


@pytest.mark.parametrize(
    "hf, total, active",
    [
        (DEEPSEEK_V3, 671_026_404_352, 37_552_282_624),  # published 671B / 37B (37.6B with the embedding)
        # OpenAI's 5.1B and 3.6B active leave the input embedding out: our active_no_embedding
        (GPT_OSS_120B, 116_829_156_672, 5_132_849_472 + 201088 * 2880),
        (GPT_OSS_20B, 20_914_757_184, 3_608_307_264 + 201088 * 2880),
    ],
    ids=["deepseek-v3", "gpt-oss-120b", "gpt-oss-20b"],
)
def test_planner_only_models_match_transformers(tmp_path, hf, total, active):
    from pretrain.config.trainable import check_trainable
    from pretrain.errors import ConfigError

    torch = pytest.importorskip("torch")
    transformers = pytest.importorskip("transformers")
    m = _from_json(tmp_path, **hf)
    counts = count_params(m)
    assert (counts.total, counts.active) == (total, active)
    with torch.device("meta"):
        model = transformers.AutoModelForCausalLM.from_config(transformers.AutoConfig.from_pretrained(tmp_path))
    assert sum(p.numel() for p in model.parameters()) == total
    # The trainer refuses them, in one line naming what is not built, before any data is needed.
    with pytest.raises(ConfigError, match="not built yet") as refused:
        check_trainable(load_config(overrides=[f"model.hf_config={tmp_path}"]), needs_data=False)
    assert "\n" not in str(refused.value)
    assert ("multi-head latent attention" if hf is DEEPSEEK_V3 else "attention sinks") in str(refused.value)
