"""Dispatch as it runs (pretrain.plan.expert_dispatch) and the grouped GEMM's shapes (pretrain.plan.gemm_shapes,
pretrain.plan.expert_parallel): each term against its formula by hand.

Qwen3-30B-A3B: 48 MoE layers, hidden 2,048, 128 experts of width 768, top-8; bf16 rows of 2 x 2,048 bytes. An
H100 node: 8 GPUs, NVLink 450 GB/s x 0.8 = 360, one 50 GB/s NIC per GPU x 0.8 = 40 (pretrain.gpus.LINKS).
"""

import pytest

from pretrain.config import load_config, replaced
from pretrain.plan import make_plan
from pretrain.plan.expert_dispatch import COUNTS_EXCHANGE_S, none_of_k
from pretrain.plan.gemm_shapes import gemm_intensity

QWEN = ["model.preset=qwen3-30b-a3b", "hardware.gpu=h100-sxm", "train.seq_len=4096", "plan.routing_imbalance=1"]
ROW = 2 * 2048  # one routed token's hidden state, bf16


def step(*overrides):
    return make_plan(load_config(overrides=[*QWEN, *overrides]))["step_time"]


def test_rows_cross_nvlink_inside_the_node_and_the_nic_beyond_it():
    # ep 16 over two nodes of 8: of a rank's b*s*k rows, 7/16 go to its node's other ranks over NVLink and 8/16
    # to the other node over its own NIC, at once; the NIC's share takes longer. 4 exchanges a layer.
    ep16 = step("parallel.gpus=16", "parallel.expert=16")
    rows = 4096 * 8
    assert ep16["all_to_all_s"] == pytest.approx(48 * 4 * max(rows * 7 / 16 * ROW / 360e9, rows * 8 / 16 * ROW / 40e9))
    # the counts are exchanged, and read by the host, before every dispatch: once a layer's forward
    assert ep16["counts_exchange_s"] == pytest.approx(48 * COUNTS_EXCHANGE_S)
    assert ep16["dispatch_exposed_s"] == pytest.approx(ep16["all_to_all_s"] + ep16["counts_exchange_s"])
    ep8 = step("parallel.gpus=16", "parallel.expert=8")  # the group inside one node: NVLink only
    assert ep8["all_to_all_s"] == pytest.approx(48 * 4 * rows * 7 / 8 * ROW / 360e9)


def test_sequence_parallel_ranks_dispatch_their_share_of_the_tokens():
    # Tensor parallel 2 with sequence parallelism: each tensor rank routes b*s/2 tokens (expert tensor
    # parallelism 1), so it sends half the rows, and its expert GEMMs' and permutations' share halves too.
    one = step("parallel.gpus=16", "parallel.expert=8")
    two = step("parallel.gpus=32", "parallel.expert=8", "parallel.tensor=2", "parallel.sequence_parallel=true")
    assert two["all_to_all_s"] == pytest.approx(one["all_to_all_s"] / 2)
    assert two["permutation_s"] == pytest.approx(one["permutation_s"] / 2)


def test_either_recomputation_runs_the_routed_part_and_its_exchanges_again():
    # Selective recomputation keeps only an MoE block's top-k choice (pretrain.distributed.recompute), so backward
    # reruns its permutation and its two exchanges as full recomputation does: 6 exchanges a layer, not 4, the
    # counts read twice, the permutation's passes 3 times, and the routed GEMMs' FLOPs 4/3 of a step's.
    plain = step("parallel.gpus=16", "parallel.expert=16")
    for recompute in ("selective", "full"):
        again = step("parallel.gpus=16", "parallel.expert=16", f"train.activation_checkpointing={recompute}")
        assert again["all_to_all_s"] == pytest.approx(plain["all_to_all_s"] * 6 / 4)
        assert again["counts_exchange_s"] == pytest.approx(2 * plain["counts_exchange_s"])
        assert again["permutation_s"] == pytest.approx(plain["permutation_s"] * 3 / 2)


def test_deepep_sends_a_token_once_per_node_and_rank_it_reaches():
    # A token's 8 experts drawn evenly from 128: it misses a given rank of 8 experts with chance C(120,8)/C(128,8)
    # and the other node of 64 with C(64,8)/C(128,8). DeepEP sends it over the NIC once per node it reaches and
    # over NVLink once per other rank of its node.
    assert none_of_k(128, 64, 8) == pytest.approx(
        (64 * 63 * 62 * 61 * 60 * 59 * 58 * 57) / (128 * 127 * 126 * 125 * 124 * 123 * 122 * 121)
    )
    deepep = step("parallel.gpus=16", "parallel.expert=16", "parallel.expert_dispatch=deepep")
    network = 4096 * (1 - none_of_k(128, 64, 8)) * ROW
    nvlink = 4096 * 14 * (1 - none_of_k(128, 8, 8)) * ROW
    assert deepep["all_to_all_s"] == pytest.approx(48 * 4 * max(network / 40e9, nvlink / 360e9))
    plain = step("parallel.gpus=16", "parallel.expert=16")
    assert deepep["all_to_all_s"] < plain["all_to_all_s"] / 3  # k / 2 = 4 copies per token cross the NIC
    assert deepep["permutation_s"] == pytest.approx(plain["permutation_s"] * 2 / 5)  # 2 passes, not 3 + 2


def test_group_limited_routing_reaches_fewer_nodes():
    # DeepSeek-V3's config.json (n_group 8, topk_group 4): a token's 8 experts come from its 4 best of 8 groups
    # of 32. At expert parallel 64 over 8 nodes each node holds one group, so a token reaches a given other node
    # only if that group is among its 4 (chance 4/8) and one of its 8 experts, drawn from those 4 x 32, lands in
    # it: 1 - C(96, 8) / C(128, 8); without groups, 1 - C(224, 8) / C(256, 8). DeepEP sends it once per node.
    from support import ROOT

    base = [f"model.hf_config={ROOT}/tests/plan/published_cfg/deepseek-v3", "hardware.gpu=h100-sxm"]
    base += ["train.seq_len=4096", "parallel.gpus=64", "parallel.expert=64", "parallel.expert_dispatch=deepep"]
    config = load_config(overrides=base)
    assert (config.model.expert_groups, config.model.expert_groups_per_token) == (8, 4)
    grouped = make_plan(config)["step_time"]["all_to_all_s"]
    anywhere = make_plan(replaced(config, {"model.expert_groups": 1, "model.expert_groups_per_token": 1}))
    anywhere = anywhere["step_time"]["all_to_all_s"]
    per_node = 1 / 2 * (1 - none_of_k(128, 32, 8))
    assert per_node == pytest.approx(0.4536, abs=1e-4)
    assert grouped / anywhere == pytest.approx(per_node / (1 - none_of_k(256, 32, 8)))  # the NIC's share


def test_an_overlapped_dispatch_waits_only_for_what_the_compute_does_not_cover():
    plain = step("parallel.gpus=16", "parallel.expert=16")
    hidden = step("parallel.gpus=16", "parallel.expert=16", "parallel.expert_dispatch_overlap=true")
    # the other micro-batch's every kernel on the compute stream hides the exchanges (Megatron's combined 1F1B
    # interleaves whole sub-modules): its GEMMs and attention, and its memory-bound passes and casts too
    window = hidden["micro_batch_s"] - hidden["dispatch_exposed_s"]
    assert window > hidden["matmul_s"] + hidden["attention_s"] + hidden["permutation_s"]
    a2a = hidden["all_to_all_s"]
    covered = min(a2a, window)
    # the covered seconds slow the compute beside them by 18.9 % (pretrain.plan.collectives.OVERLAP_SLOWDOWN)
    expected = a2a - covered + 0.189 * covered + hidden["counts_exchange_s"]
    assert hidden["dispatch_exposed_s"] == pytest.approx(expected)
    assert hidden["seconds"] < plain["seconds"]


def test_dispatchers_the_trainer_does_not_run_are_planned_never_trained_nor_proposed():
    from pretrain.config.trainable import check_trainable
    from pretrain.errors import ConfigError
    from pretrain.plan.fit import fit

    config = load_config(
        overrides=["model.preset=moe-debug", "parallel.gpus=4", "hardware.gpu=h100-sxm", "parallel.expert=2"]
    )
    for key, value in (
        ("parallel.expert_dispatch", "deepep"),
        ("parallel.expert_dispatch_overlap", True),
        ("model.expert_groups", 2),  # group-limited routing: planned (the nodes reached), not built
    ):
        with pytest.raises(ConfigError, match=key):
            check_trainable(replaced(config, {key: value}), needs_data=False)
    result = fit(replaced(config, {"parallel.expert_dispatch": "deepep"}), top=3)
    assert result["candidates"]
    for row in result["candidates"]:
        assert row["overrides"]["parallel.expert_dispatch"] == "all_to_all"


def test_narrow_experts_stream_more_bytes_per_flop():
    # Qwen3's experts (2,048 -> 2 x 768, 768 -> 2,048) do 2 K N / (2 (K + N)) = 878 and 558 FLOPs per bf16 byte,
    # where a dense MLP of intermediate_size 6,144 would do 1,755 and 1,536; with thousands of rows per expert the
    # weights add little (their K N / M per row).
    m = load_config(overrides=QWEN).model
    dense = replaced(load_config(overrides=QWEN), {"model.num_experts": 0}).model
    assert gemm_intensity(m, 1, 2, 4096) < gemm_intensity(dense, 1, 2)
    few = gemm_intensity(m, 1, 2, 64)  # 64 rows an expert: its weights dominate the bytes
    assert few < gemm_intensity(m, 1, 2, 4096) / 2


def test_an_experts_rows_fill_its_gemm_tiles():
    # b*s = 512 tokens x k 8 / 128 experts = 32 rows an expert at ep 1: a quarter of a 128-row tile, so the
    # routed GEMMs take 4x their full-tile time; at 4,096 tokens (256 rows) the tiles are full.
    small = step("parallel.gpus=8", "train.seq_len=512", "model.max_seq_len=512")
    assert small["expert_tile"] == pytest.approx(0.25)
    routed = 6 * 48 * 8 * 3 * 2048 * 768  # training FLOPs of a token's 8 experts
    full_tiles = routed * 512 / (small["achievable_tflops"] * 1e12)
    assert small["expert_tile_s"] == pytest.approx(full_tiles * (1 / 0.25 - 1))
    assert step("parallel.gpus=8")["expert_tile"] == 1.0


def test_expert_gradients_sync_over_their_own_ranks_and_links():
    # DDP on 16 H100s (two nodes) at ep 8: the routed experts' fp32 gradients, 1/8 of them on a rank, are
    # all-reduced over the 2 ranks holding the same experts, one per node: one 40 GB/s NIC each; the rest over
    # all 16 data ranks, NCCL's rings through the node's 8 NICs (320 GB/s, under NVLink's 360).
    config = load_config(overrides=[*QWEN, "parallel.gpus=16", "parallel.expert=8"])
    p = make_plan(config)
    total, routed = p["params"]["total"], p["params"]["routed_experts"]
    experts = routed // 8
    dense = total - routed
    expected = 2 * 15 / 16 * 4 * dense / 320e9 + 2 * 1 / 2 * 4 * experts / 40e9
    assert p["step_time"]["data_parallel_s"] == pytest.approx(expected)
