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
from pretrain.plan import count_params, make_plan, plan_with_explain

TOTAL, ACTIVE, VH = 173_952, 137_088, 512 * 64


def _plan(*overrides, preset="moe-debug"):
    return make_plan(load_config(overrides=[f"model.preset={preset}", *overrides]))


def test_moe_debug_by_hand():
    counts = count_params(load_config(overrides=["model.preset=moe-debug"]).model)
    assert (counts.total, counts.active, counts.routed_experts) == (TOTAL, ACTIVE, 49_152)


def test_flops_and_mfu_come_from_active_parameters():
    seq = 256
    p = _plan(f"train.seq_len={seq}", "measured.tokens_per_second=1000", "hardware.gpu=cpu",
              "hardware.peak_tflops=1")
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
