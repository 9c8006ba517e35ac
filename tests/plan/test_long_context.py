"""The planner at 32K-128K tokens a window: layouts that fit (or a clear refusal), activations linear in the
sequence under SDPA and the chunked loss, and the long-context advice (docs/advice.md: context, rope)."""

import pytest

from pretrain.config import load_config
from pretrain.plan import make_plan
from pretrain.plan.fit import fit
from pretrain.plan.long_context import context_advice
from support import run_cli

LLAMA31_128K = ["model.preset=llama3.1-8b", "train.seq_len=131072", "parallel.gpus=64", "hardware.gpu=h100-sxm"]


def test_llama3_8b_at_128k_is_refused_in_one_line_naming_the_extension():
    r = run_cli("plan", "model.preset=llama3-8b", "train.seq_len=131072", "parallel.gpus=64", "--fit")
    lines = r.stderr.strip().splitlines()
    assert r.returncode == 2 and len(lines) == 1, r.stderr
    assert "train.seq_len: 131072 is longer than model.max_seq_len 8192" in lines[0]
    assert "model.rope_scaling as llama3.1-8b does" in lines[0]


def test_fit_at_128k_returns_layouts_that_fit_and_says_to_mask_documents():
    config = load_config(overrides=LLAMA31_128K)
    result = fit(config)
    usable = make_plan(config)["usable_memory_bytes"]
    assert result["candidates"]
    for cand in result["candidates"]:
        # 128K tokens of activations fit one H100 only with every block recomputed, or with selective
        # recomputation (the matmul outputs kept) split over 8 tensor ranks with sequence parallelism
        o = cand["overrides"]
        assert o["train.activation_checkpointing"] == "full" or (
            o["train.activation_checkpointing"] == "selective"
            and o["parallel.tensor"] == 8
            and o["parallel.sequence_parallel"]
        )
        assert cand["fits"] is True and cand["memory_bytes"]["total"] <= usable
    for recompute in ("none", "selective"):
        assert any(
            r["why"].startswith("does not fit") and r["overrides"]["train.activation_checkpointing"] == recompute
            for r in result["rejected"]
        )
    assert [line.split(":")[0] for line in result["advice"]] == ["context"]
    assert "train.document_masking" in result["advice"][0]
    assert "advice" not in fit(
        load_config(overrides=[*LLAMA31_128K[:1], "parallel.gpus=8", "hardware.gpu=h100-sxm", "train.seq_len=8192"])
    )
    # with documents masked the advice has nothing left to say
    assert not context_advice(load_config(overrides=[*LLAMA31_128K, "train.document_masking=true"]))


@pytest.mark.parametrize("recompute", ["none", "full"])
def test_activations_grow_linearly_with_the_window(recompute):
    # SDPA keeps no seq x seq scores and the chunked loss a chunk of 4,096 tokens whatever the window: each
    # doubling of the window adds what the one before added, twice over.
    def activations(s):
        over = [
            *LLAMA31_128K,
            f"train.seq_len={s}",
            f"train.activation_checkpointing={recompute}",
            "parallel.zero_stage=3",
        ]
        return make_plan(load_config(overrides=over))["memory_bytes"]["activations"]

    a = [activations(s) for s in (16384, 32768, 65536, 131072)]
    assert a[2] - a[1] == pytest.approx(2 * (a[1] - a[0]), rel=1e-6)
    assert a[3] - a[2] == pytest.approx(2 * (a[2] - a[1]), rel=1e-6)
    eager = make_plan(
        load_config(overrides=[*LLAMA31_128K, "train.seq_len=32768", "train.attention=eager", "parallel.zero_stage=3"])
    )["memory_bytes"]["activations"]
    assert eager - a[1] >= 32 * 32 * 32768**2 * 4  # eager keeps the fp32 scores: heads x s^2 per layer


def test_rope_advice_names_the_wavelength_and_yarns_reach():
    def lines(*over):
        return context_advice(load_config(overrides=["model.preset=debug", "model.max_seq_len=131072", *over]))

    assert lines("train.seq_len=16384") == []
    # debug's head_dim 16, theta 10000: 2 pi x 10000^(14/16) = 19,869 tokens
    [rope] = lines("train.seq_len=20000")
    assert rope.startswith("rope: RoPE's slowest dimension turns once every 19,869 tokens")
    assert "fewer than the 20,000 of a window" in rope
    assert [x.split(":")[0] for x in lines("train.seq_len=32768", "model.rope_theta=500000")] == ["context"]
    yarn = "model.rope_scaling={rope_type: yarn, factor: 4, original_max_position_embeddings: 4096}"
    [beyond] = [x for x in lines("train.seq_len=32768", "model.rope_theta=500000", yarn) if x.startswith("rope")]
    assert "beyond the 16,384 positions YaRN stretches RoPE to" in beyond
