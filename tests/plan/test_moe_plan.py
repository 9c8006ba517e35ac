"""Mixture-of-Experts in the planner: active parameters behind FLOPs and MFU, experts sharded over EP x ZeRO,
routed-token activations at an explicit imbalance, the all-to-all, the EP degree --fit picks.

moe-debug by hand: V 512, H 64, H' 176, L 2 (block 0 dense), 4 heads of 16 with 2 key/value heads, E 8 routed
experts of H_e 32, top-2, per-head QK-norm.
    attention per block (64 + 2 x 32) x 64 + 64 x 64 = 12,288; norms 2 x 64 + 2 x 16 = 160
    dense MLP 3 x 64 x 176 = 33,792; MoE: router 8 x 64 = 512, routed experts 8 x 3 x 64 x 32 = 49,152
    total = 2 x 32,768 (embedding, output) + 2 x 12,288 + 33,792 + 512 + 49,152 + 2 x 160 + 64 = 173,952
    active = 173,952 - 6/8 x 49,152 = 137,088
"""

from pretrain.config import load_config
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
    # Per routed token, bf16 (2 bytes): its input and output 2 x 2 x h 64, its SwiGLU 4 x 2 x H_e 32; the busiest
    # rank computes 0.5 x b*s*k = 0.5 x 8 x 256 x 2 more of them in each of the 2 (now MoE) blocks.
    routed_token = 2 * 2 * 64 + 4 * 2 * 32
    assert skewed - balanced == 2 * (8 * 256 * 2 // 2) * routed_token


def test_explain_says_at_which_imbalance_the_run_stops_fitting():
    base = ["parallel.gpus=2", "parallel.expert=2", "train.micro_batch_size=64", "hardware.gpu=h100-sxm"]

    def peak(f):
        return _plan(*base, f"plan.routing_imbalance={f}")["memory_bytes"]["total"]

    memory_gb = (peak(1.2) + peak(1.4)) / 2 / 0.9 / 1e9  # usable: 90 % of the card, between the two
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
    # 48 MoE layers x 4 all-to-alls (dispatch, combine; forward, backward) x load 1.72 x 7/8 of b*s*k*h bf16
    assert step["all_to_all_s"] == 48 * 4 * 1.72 * 7 / 8 * (2 * 4096 * 8 * 2048) / (intra * 1e9)
    # the busiest rank runs 0.72 x its routed experts' FLOPs more: 6 x 48 layers x k 8 x 3 x 2048 x 768 a token
    assert step["expert_imbalance_s"] == 0.72 * (6 * 48 * 8 * 3 * 2048 * 768) * 4096 / (
        step["achievable_tflops"] * 1e12
    )
    assert step["micro_batch_s"] > one["micro_batch_s"]


def test_fit_searches_the_expert_parallel_degree():
    from pretrain.plan.fit import fit, layouts

    config = load_config(overrides=["model.preset=moe-debug", "parallel.gpus=4", "hardware.gpu=h100-sxm"])
    found, _ = layouts(config)
    # divisors of gcd(E 8, data parallel): 4 data-parallel ranks take EP 1, 2, 4; 2 (beside TP 2) take 1, 2
    assert sorted((s["tensor"], s["expert"]) for s in found if s["pipeline"] == 1) == [
        (1, 1),
        (1, 2),
        (1, 4),
        (2, 1),
        (2, 2),
    ]
    result = fit(config, top=3)
    # the trainer runs EP 2 and 4 under DDP and FSDP: weighed (here slower, by their all-to-all), not refused;
    # under ZeRO-1 the trainer's refusal names parallel.expert
    ep = [
        r
        for r in result["candidates"] + result["rejected"]
        if r["overrides"].get("parallel.expert", 1) > 1
        and r["overrides"]["parallel.tensor"] == r["overrides"]["parallel.pipeline"] == 1
    ]
    built = [r for r in ep if r["overrides"]["parallel.zero_stage"] != 1]
    assert {r["overrides"]["parallel.zero_stage"] for r in built} == {0, 2, 3}
    assert all("refuses" not in r.get("why", "") for r in built)
    assert all("parallel.expert" in r["why"] for r in ep if r["overrides"]["parallel.zero_stage"] == 1)


def test_the_checkpoint_holds_every_expert_whatever_the_expert_parallelism():
    one, ep = (_plan("parallel.gpus=4", f"parallel.expert={e}")["checkpoint_bytes"] for e in (1, 4))
    tensors = len(param_shapes(load_config(overrides=["model.preset=moe-debug"]).model))
    assert one == ep == 12 * TOTAL + 4 * tensors  # fp32 weights, m and v of every parameter; a step count a tensor


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
