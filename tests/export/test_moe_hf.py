"""Mixture-of-Experts models to and from Hugging Face: the export is MixtralForCausalLM, Qwen3MoeForCausalLM or
OlmoeForCausalLM as the model's QK-norm says, transformers computes the same logits (fp32, 1e-4), the
directory reads back exactly (model.init_from), and what none of those classes builds is refused in one line."""

import json

import pytest
import torch

from pretrain.config import load_config
from pretrain.errors import UsageError
from pretrain.export.hf import export_hf
from pretrain.model import build_model
from pretrain.model.hf import from_hf, load_hf_into

MOE = ["model.preset=moe-debug", "model.num_shared_experts=0", "model.rope_theta=5000", "model.norm_eps=1e-6"]
VARIANTS = {  # overrides, class
    "qwen3_moe": (["model.first_dense_layers=1", "model.norm_topk_prob=false"], "Qwen3MoeForCausalLM"),
    "mixtral": (
        [
            "model.qk_norm=false",
            "model.first_dense_layers=0",
            "model.moe_intermediate_size=176",
            "model.router_aux_loss_coef=0.04",
        ],
        "MixtralForCausalLM",
    ),
    "olmoe": (
        [
            "model.qk_norm_over=projection",
            "model.first_dense_layers=0",
            "model.moe_intermediate_size=176",
            "model.norm_topk_prob=false",
        ],
        "OlmoeForCausalLM",
    ),
}


def make(overrides, seed=0):
    torch.manual_seed(seed)
    model = build_model(load_config(overrides=[*MOE, *overrides]).model).eval()
    with torch.no_grad():
        for p in model.parameters():  # norm weights of exactly 1 would hide a swapped or dropped tensor
            p.add_(torch.randn_like(p) * 0.05)
    return model


@pytest.fixture(scope="module")
def batch():
    return torch.randint(0, 512, (2, 24), generator=torch.Generator().manual_seed(1))


@pytest.mark.parametrize("variant", VARIANTS)
def test_transformers_loads_the_export_and_agrees(variant, batch, tmp_path):
    from transformers import AutoModelForCausalLM

    overrides, architecture = VARIANTS[variant]
    model = make(overrides)
    out = export_hf(model, tmp_path / "hf")
    theirs, info = AutoModelForCausalLM.from_pretrained(out, dtype=torch.float32, output_loading_info=True)
    assert type(theirs).__name__ == architecture
    assert not info["missing_keys"] and not info["unexpected_keys"], info
    theirs.eval()
    with torch.no_grad():
        assert (theirs(batch).logits - model(batch)).abs().max() < 1e-4
    # The directory reads back as the same model: its keys through model.hf_config, its weights exactly.
    keys, state = from_hf(out)
    again = build_model(load_config({"model": keys}).model).eval()
    for key in (
        "num_experts",
        "experts_per_token",
        "moe_intermediate_size",
        "first_dense_layers",
        "norm_topk_prob",
        "qk_norm",
        "qk_norm_over",
        "router_aux_loss_coef",
    ):
        want = getattr(model.config, key)
        if key == "moe_intermediate_size" and variant != "qwen3_moe":
            want = None  # Mixtral's and OLMoE's experts are intermediate_size wide
        assert getattr(again.config, key) == pytest.approx(want), key
    load_hf_into(again, out)  # what model.init_from runs
    with torch.no_grad():
        assert torch.equal(again(batch), model(batch))
    assert set(state) == {k for k in again.state_dict() if not k.endswith(".expert_bias")}


@pytest.mark.parametrize(
    "overrides, named",
    [
        (["model.num_shared_experts=1"], "Qwen3MoeForCausalLM .* does not build shared experts"),
        (["model.num_shared_experts=0", "model.router=sigmoid"], "does not build a sigmoid router"),
        (["model.num_shared_experts=0", "model.qk_norm=false"], "dense first blocks"),
    ],
)
def test_what_the_classes_do_not_build_is_refused(overrides, named, tmp_path):
    model = build_model(load_config(overrides=["model.preset=moe-debug", *overrides]).model)
    with pytest.raises(UsageError, match=named):
        export_hf(model, tmp_path / "hf")
    assert not (tmp_path / "hf").exists()


def test_moved_routing_biases_are_refused(tmp_path):
    model = make(VARIANTS["qwen3_moe"][0])
    model.blocks[1].mlp.expert_bias[0] = 0.01
    with pytest.raises(UsageError, match="routing biases"):
        export_hf(model, tmp_path / "hf")


def test_hub_configs_read_into_moe_keys(tmp_path):
    """The config.json fields of the published models (Qwen3-30B-A3B's, Mixtral-8x7B's, OLMoE-1B-7B's)."""
    shape = dict(
        vocab_size=1000,
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=512,
    )
    configs = {
        "qwen3_moe": dict(
            shape,
            num_experts=128,
            num_experts_per_tok=8,
            moe_intermediate_size=32,
            norm_topk_prob=True,
            decoder_sparse_step=1,
            mlp_only_layers=[],
            head_dim=16,
            router_aux_loss_coef=0.001,
            output_router_logits=False,
            max_window_layers=48,
        ),
        "mixtral": dict(
            shape,
            num_local_experts=8,
            num_experts_per_tok=2,
            router_aux_loss_coef=0.02,
            sliding_window=None,
            output_router_logits=False,
        ),
        "olmoe": dict(
            shape,
            num_experts=64,
            num_experts_per_tok=8,
            norm_topk_prob=False,
            clip_qkv=None,
            router_aux_loss_coef=0.01,
            output_router_logits=False,
        ),
    }
    got = {}
    for kind, hf in configs.items():
        (tmp_path / kind).mkdir()
        (tmp_path / kind / "config.json").write_text(json.dumps(dict(hf, model_type=kind)))
        got[kind] = load_config(overrides=[f"model.hf_config={tmp_path / kind}", "train.seq_len=64"]).model
    q, m, o = got["qwen3_moe"], got["mixtral"], got["olmoe"]
    assert (q.num_experts, q.experts_per_token, q.moe_intermediate_size, q.qk_norm) == (128, 8, 32, True)
    assert q.router_aux_loss_coef == pytest.approx(0.008)  # transformers' convention is k times ours
    assert (m.num_experts, m.experts_per_token, m.norm_topk_prob, m.qk_norm) == (8, 2, True, False)
    assert (o.num_experts, o.norm_topk_prob, o.qk_norm, o.qk_norm_over) == (64, False, True, "projection")
