"""Mixture-of-Experts in the planner: active parameters behind FLOPs and MFU, experts sharded over EP x ZeRO,
routed-token activations at an explicit imbalance, the all-to-all, the EP degree --fit picks.

moe-debug by hand: V 512, H 64, H' 176, L 2 (block 0 dense), 4 heads of 16 with 2 key/value heads, E 8 routed
experts of H_e 32, top-2, per-head QK-norm.
    attention per block (64 + 2 x 32) x 64 + 64 x 64 = 12,288; norms 2 x 64 + 2 x 16 = 160
    dense MLP 3 x 64 x 176 = 33,792; MoE: router 8 x 64 = 512, routed experts 8 x 3 x 64 x 32 = 49,152
    total = 2 x 32,768 (embedding, output) + 2 x 12,288 + 33,792 + 512 + 49,152 + 2 x 160 + 64 = 173,952
    active = 173,952 - 6/8 x 49,152 = 137,088
"""

import pytest

from pretrain.config import load_config, replaced
from pretrain.plan import count_params, make_plan, param_shapes, plan_with_explain

TOTAL, ACTIVE, VH = 173_952, 137_088, 512 * 64


def _plan(*overrides, preset="moe-debug"):
    return make_plan(load_config(overrides=[f"model.preset={preset}", *overrides]))


def test_moe_debug_by_hand():
    counts = count_params(load_config(overrides=["model.preset=moe-debug"]).model)
    assert (counts.total, counts.active, counts.routed_experts) == (TOTAL, ACTIVE, 49_152)


def test_flops_and_mfu_come_from_active_parameters():
    seq = 256
    p = _plan(f"train.seq_len={seq}", "measured.tokens_per_second=1000", "hardware.gpu=cpu", "hardware.peak_tflops=1")
    fl = p["flops"]
    attention = 12 * 2 * 4 * 16 * seq  # PaLM's full square
    assert fl["per_token"] == 6 * (ACTIVE - VH) + attention
    assert fl["per_token_6n"] == 6 * ACTIVE
    moe = fl["moe"]
    assert moe["per_token_full_attention"] == fl["per_token"]
    assert moe["per_token_causal_attention"] == 6 * (ACTIVE - VH) + attention // 2
    assert moe["per_token_6n_total"] == 6 * TOTAL
    assert p["mfu"] == 1000 * fl["per_token"] / 1e12  # one GPU at 1 TFLOP/s
    causal = _plan(f"train.seq_len={seq}", "flops.causal_attention=true")["flops"]
    assert causal["per_token"] == moe["per_token_causal_attention"]


def test_full_recomputation_reruns_the_active_experts():
    fl = _plan("train.activation_checkpointing=full", "train.seq_len=128")["flops"]
    blocks = ACTIVE - 2 * VH - 64  # the blocks' active parameters: no embedding, output layer, final norm
    down = 176 * 64 + 2 * 32 * 64  # the dense block's down projection, and two routed experts'
    attention = 12 * 2 * 4 * 16 * 128
    assert fl["per_token_hardware"] - fl["per_token"] == 2 * (blocks - down) + attention // 3


def test_dense_plans_have_no_moe_figures():
    p = _plan(preset="debug")
    assert "moe" not in p["flops"] and p["params"]["active"] == p["params"]["total"]
    assert "routed_experts" not in p["params"]


def test_experts_are_sharded_over_expert_parallel_then_zero():
    experts = 8 * 2 * 32 * 64 + 8 * 64 * 32  # moe-debug's stacked experts: up (8, 64, 64), down (8, 64, 32)
    assert experts == 49_152
    ep2 = _plan("parallel.gpus=2", "parallel.expert=2")["model_states"]
    assert ep2["parameters"] == 4 * (TOTAL - experts // 2)  # fp32 parameters, half the experts on each rank
    # ZeRO-3 over 4 ranks: the experts split 4 ways whether EP 2 x ZeRO 2 or ZeRO 4 alone
    zero3 = [
        _plan("parallel.gpus=4", "parallel.zero_stage=3", f"parallel.expert={ep}")["model_states"] for ep in (1, 2, 4)
    ]
    assert zero3[0]["parameters"] == zero3[1]["parameters"] == zero3[2]["parameters"]


def test_each_rank_holds_the_optimizer_states_of_its_own_expert_shard():
    from pretrain.plan.model_states import model_state_tensors

    # data ranks r, r + ep, ... hold the same experts and FSDP-shard them: rank r's piece is its place r // ep
    # among them (taken as r, the ranks from dp / ep on fell past the pieces: no expert states, 0.48 MiB for
    # the 0.66 rank 1 measured at 2 GPUs)
    for gpus in (2, 4):
        config = load_config(
            overrides=["model.preset=moe-debug", f"parallel.gpus={gpus}", "parallel.zero_stage=3", "parallel.expert=2"]
        )
        per_rank = [model_state_tensors(config, rank=r)["optimizer_states"] for r in range(gpus)]
        assert per_rank == [model_state_tensors(config)["optimizer_states"]] * gpus


def test_routed_activations_follow_the_imbalance_only_under_expert_parallelism():
    def act(*overrides):
        p = _plan("parallel.gpus=2", "train.micro_batch_size=8", "model.first_dense_layers=0", *overrides)
        return p["memory_bytes"]["activations"], p["moe"]

    one, moe = act("plan.routing_imbalance=1")
    assert moe["routed_load"] == 1 and moe["fits_up_to_imbalance"] is None  # no device: nothing to fit
    assert act("plan.routing_imbalance=3")[0] == one  # every expert on the rank: b*s*k tokens whatever the load
    balanced, _ = act("parallel.expert=2", "plan.routing_imbalance=1")
    skewed, moe = act("parallel.expert=2", "plan.routing_imbalance=1.5")
    assert moe["routed_load"] == 1.5
    # Per routed pair it computes, bf16 (2 bytes): its input 2 x h 64, its SwiGLU 4 x 2 x H_e 32, its place in
    # the owner's re-sort and back 2 x 8 (int64); the busiest rank computes 0.5 x b*s*k = 0.5 x 8 x 256 x 2 more
    # of them in each of the 2 (now MoE) blocks. Its own pairs' outputs come back whatever the load.
    routed_token = 2 * 64 + 4 * 2 * 32 + 2 * 8
    assert skewed - balanced == 2 * (8 * 256 * 2 // 2) * routed_token


def test_explain_says_at_which_imbalance_the_run_stops_fitting():
    base = ["parallel.gpus=2", "parallel.expert=2", "train.micro_batch_size=64", "hardware.gpu=h100-sxm"]

    def peak(f):
        return _plan(*base, f"plan.routing_imbalance={f}")["memory_bytes"]["total"]

    memory_gb = (peak(1.2) + 2 * peak(1.4)) / 3 / 0.9 / 1e9  # usable: 90 % of the card, between the two
    p = _plan(*base, f"hardware.memory_gb={memory_gb}")
    limit = p["moe"]["fits_up_to_imbalance"]
    assert 1.2 < limit < 1.4 and p["fits"] is False  # planned at the default 1.72
    assert _plan(*base, f"hardware.memory_gb={memory_gb}", f"plan.routing_imbalance={limit}")["fits"]
    assert not _plan(*base, f"hardware.memory_gb={memory_gb}", f"plan.routing_imbalance={limit + 0.01}")["fits"]
    _, ex = plan_with_explain(
        load_config(overrides=["model.preset=moe-debug", *base, f"hardware.memory_gb={memory_gb}"]), advice=False
    )
    why = next(f for s, n, _, f in ex.lines if (s, n) == ("memory", "fits up to imbalance"))
    assert why.startswith(f"stops fitting above a routing imbalance of {limit:.3g}")


def test_other_frameworks_do_not_model_moe():
    for framework in ("megatron", "deepspeed", "zero-paper"):
        fw = _plan(f"plan.framework={framework}")["framework"]
        assert "memory_bytes" not in fw and fw["not_modelled"].startswith("Mixture-of-Experts is not modelled")


def test_step_time_adds_the_all_to_all_and_the_busiest_rank():
    from pretrain.plan.step_time import links

    base = ["parallel.gpus=16", "hardware.gpu=h100-sxm", "train.seq_len=4096"]
    one = _plan(*base, preset="qwen3-30b-a3b")["step_time"]
    assert one["all_to_all_s"] == 0 and one["expert_imbalance_s"] == 0  # every expert on the rank: no load
    config = load_config(overrides=["model.preset=qwen3-30b-a3b", *base, "parallel.expert=8"])
    step = make_plan(config)["step_time"]
    intra, _, _ = links(config)
    # 48 MoE layers x 4 all-to-alls (dispatch, combine; forward, backward) x load 1.72 x 7/8 of b*s*k*h bf16: the
    # 8 ranks of the group share a node, so every row crosses NVLink
    assert step["all_to_all_s"] == pytest.approx(48 * 4 * 1.72 * 7 / 8 * (2 * 4096 * 8 * 2048) / (intra * 1e9))
    # the busiest rank runs 0.72 x its routed experts' FLOPs more: 6 x 48 layers x k 8 x 3 x 2048 x 768 a token
    assert step["expert_imbalance_s"] == 0.72 * (6 * 48 * 8 * 3 * 2048 * 768) * 4096 / (
        step["achievable_tflops"] * 1e12
    )
    assert step["micro_batch_s"] > one["micro_batch_s"]


def test_fit_searches_the_expert_parallel_degree():
    from pretrain.plan.fit import fit, layouts

    config = load_config(overrides=["model.preset=moe-debug", "parallel.gpus=4", "hardware.gpu=h100-sxm"])
    found, _ = layouts(config)
    # divisors of gcd(E 8, data x tensor ranks): the 4 ranks take EP 1, 2, 4 with or without TP 2 (whole
    # experts: the expert-parallel group may take tensor ranks)
    assert sorted((s["tensor"], s["expert"]) for s in found if s["pipeline"] == 1) == [
        (1, 1),
        (1, 2),
        (1, 4),
        (2, 1),
        (2, 2),
        (2, 4),
    ]
    result = fit(config, top=3)
    # the trainer runs EP 2 and 4 under DDP and FSDP: weighed (here slower, by their all-to-all), not refused;
    # under ZeRO-1 the trainer's refusal names parallel.zero_stage
    ep = [
        r
        for r in result["candidates"] + result["rejected"]
        if r["overrides"].get("parallel.expert", 1) > 1
        and r["overrides"]["parallel.tensor"] == r["overrides"]["parallel.pipeline"] == 1
    ]
    built = [r for r in ep if r["overrides"]["parallel.zero_stage"] != 1]
    assert {r["overrides"]["parallel.zero_stage"] for r in built} == {0, 2, 3}
    assert all("refuses" not in r.get("why", "") for r in built)
    assert all(
        "parallel.zero_stage: Mixture-of-Experts with expert or tensor parallelism" in r["why"]
        for r in ep
        if r["overrides"]["parallel.zero_stage"] == 1
    )


def test_the_checkpoint_holds_every_expert_whatever_the_expert_parallelism():
    one, ep = (_plan("parallel.gpus=4", f"parallel.expert={e}")["checkpoint_bytes"] for e in (1, 4))
    tensors = len(param_shapes(load_config(overrides=["model.preset=moe-debug"]).model))
    assert one == ep == 12 * TOTAL + 4 * tensors  # fp32 weights, m and v of every parameter; a step count a tensor


def test_moe_mfu_is_stated_in_every_convention_in_the_plan_and_plan_vs_run():
    from pretrain.plan.table import render
    from pretrain.train.plan_check import compare

    config = load_config(overrides=["model.preset=qwen3-30b-a3b", "parallel.gpus=8", "hardware.gpu=h100-sxm"])
    p = make_plan(config)
    st, conventions = p["step_time"], p["flops"]["moe"]
    # the same tokens/s times each convention's FLOPs per token: ours (flops.convention) is `mfu` itself
    for key, flops_per_token in conventions.items():
        if key.startswith("per_token"):
            assert st["moe_mfu"][key] == pytest.approx(st["mfu"] * flops_per_token / p["flops"]["per_token"])
    assert st["moe_mfu"]["per_token_full_attention"] == pytest.approx(st["mfu"])
    assert "MoE MFU" in render(config, p)
    states = {k: p["model_states"][k] for k in ("parameters", "gradients", "optimizer_states")}
    rows = {r["name"]: r for r in compare(p, states, None, None, 1000.0, 0.05, st["mfu"], "cuda:0")["rows"]}
    six_n = conventions["per_token_6n_active"] / p["flops"]["per_token"]
    assert rows["mfu_6n_active"]["measured"] == pytest.approx(0.05 * six_n)
    assert rows["mfu_6n_active"]["planned"] == pytest.approx(st["moe_mfu"]["per_token_6n_active"])
    assert rows["mfu_causal_attention"]["measured"] < 0.05  # fewer FLOPs counted for the same speed
    dense = make_plan(load_config(overrides=["model.preset=llama3-8b"]))
    assert "moe_mfu" not in dense["step_time"]


def test_moe_advice_and_length_go_by_active_parameters():
    # DeepSeek-V3's published peak lr, 2.2e-4, at 671B total is 37.6B active: within 3x of the published lr for
    # that size, so no lr line; the default length is Chinchilla's 20 tokens per active parameter.
    from support import ROOT

    deepseek = [f"model.hf_config={ROOT / 'tests/plan/published_cfg/deepseek-v3'}", "train.seq_len=4096"]
    p = plan_with_explain(load_config(overrides=[*deepseek, "train.lr=2.2e-4", "train.tokens=14.8e12"]))[0]
    assert not [line for line in p["advice"] if line.startswith("lr:")]  # 3.7x above 671B's 6e-5 it was
    tokens = [line for line in p["advice"] if line.startswith("tokens:")]
    assert tokens and "394 tokens per active parameter" in tokens[0] and "(8 of 256 experts" in tokens[0]
    assert p["tokens"]["per_parameter"] == pytest.approx(14.8e12 / p["params"]["active"])
    default = make_plan(load_config(overrides=["model.preset=qwen3-30b-a3b"]))
    assert default["tokens"]["total"] == 20 * default["params"]["active"]


def test_mixtral_8x7b_fits_64_h100s_its_experts_sharded_on_dim_1():
    # Mixtral-8x7B's 8 experts under FSDP2 over 64 data ranks: on dim 0 each rank held a whole expert (ceil(8/64)
    # = 1), 63 GiB of its optimizer states at 64 and at 512 GPUs alike; on dim 1 (torchtitan's placement, what the
    # trainer runs) the 64 ranks split each expert's rows, and ZeRO-3 at 64 H100s fits (Megatron-Core published
    # Mixtral-8x7B on 64 H100s: TP 1, PP 4, EP 8). --fit finds layouts there, and the advice a fix on fewer GPUs.
    from pretrain.plan.fit import fit

    h100 = ["hardware.gpu=h100-sxm", "train.seq_len=4096", "parallel.zero_stage=3"]
    at = {n: _plan(f"parallel.gpus={n}", *h100, preset="mixtral-8x7b") for n in (64, 512)}
    assert at[64]["fits"] is True
    states = {n: p["model_states"]["optimizer_states"] for n, p in at.items()}
    assert states[64] < 6 * 2**30 and states[512] < states[64] / 7  # 8x the ranks: ~1/8 of the states each
    config = load_config(overrides=["model.preset=mixtral-8x7b", "parallel.gpus=64", *h100[:2]])
    assert fit(config, top=3)["candidates"]
    _, ex = plan_with_explain(replaced(config, {"parallel.zero_stage": 3}), advice=False)
    why = next(f for s, n, _, f in ex.lines if (s, n) == ("memory", "optimizer"))
    assert "the routed experts, 8 a rank (expert parallel 1), over the 64 ranks holding the same ones, on dim 1" in why
    advice = " ".join(
        make_plan(load_config(overrides=["model.preset=mixtral-8x7b", "parallel.gpus=8", *h100[:2]]))["advice"]
    )
    assert "no fix found" not in advice and "parallel.zero_stage=3" in advice


def test_the_plan_header_and_the_fits_columns_name_the_expert_degree():
    # The header gave data, tensor and pipeline but not the expert degree; --fit printed "EP n" after the step
    # column, under no header. A dense plan's JSON and header stay as they were.
    from pretrain.plan.fit import fit, render
    from pretrain.plan.table import render as table

    config = load_config(overrides=["model.preset=moe-debug", "parallel.gpus=4", "parallel.expert=2"])
    p = make_plan(config)
    assert p["parallel"]["expert"] == 2 and "expert" not in make_plan(load_config(overrides=[]))["parallel"]
    assert "(data 4, tensor 1, pipeline 1, expert 2, ZeRO-0)" in table(config, p).splitlines()[0]
    lines = render(config, fit(config, top=3)).splitlines()
    header = next(line for line in lines if line.lstrip().startswith("#"))
    column = header.index(" EP") + 3  # right-aligned under its header
    rows = [line for line in lines if line[:4].strip().isdigit()]
    assert rows and all(line[column - 1] in "1248" and line[column] == " " for line in rows), lines
    assert not any(" EP " in line for line in rows)  # the degree in its column, not "EP n" after the step
