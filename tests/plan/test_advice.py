"""Planner advice (`pretrain.plan.advice`): each rule fires on a config that breaks it, and a sane config is
silent. Thresholds and sources: docs/advice.md."""

import json
import math
import re

import pytest

from pretrain.config import load_config
from pretrain.plan import make_plan
from pretrain.plan.advice import LR_REFERENCE, loglog
from support import ROOT, run_cli

# LLaMA-7B on 64 A100-80GB with ZeRO-3: 1.4e11 tokens (20.8 per parameter, Chinchilla's ~20), 4.19M tokens
# per step (4 x 2048 x 8 x 64; LLaMA used 4M) ramped over the first 4B tokens as GPT-3 did, LLaMA's peak
# 3e-4, the default 0.5% warm-up and MFU 0.4. Fits: 61.1 GiB of 72 usable.
SANE = [
    "model.preset=llama-7b",
    "train.tokens=1.4e11",
    "train.micro_batch_size=4",
    "train.grad_accum_steps=8",
    "parallel.gpus=64",
    "parallel.zero_stage=3",
    "train.batch_ramp_tokens=4e9",
    "train.lr=3e-4",
    "hardware.gpu=a100-80gb",
]


def advice(*overrides, base=SANE):
    p = make_plan(load_config(overrides=[*base, *overrides]))
    return p, p["advice"]


def tags(lines):
    return [line.split(":", 1)[0] for line in lines]


def test_sane_config_is_silent_and_fits():
    p, lines = advice()
    assert lines == []
    assert p["fits"]


def test_demo_and_debug_models_are_silent():
    # A ~4M-parameter CPU demo: short, small batches and a long warm-up on purpose.
    p = make_plan(load_config(ROOT / "src/pretrain/configs/demo.yaml"))
    assert p["advice"] == []
    assert make_plan(load_config(overrides=["model.preset=debug", "hardware.gpu=a100-80gb"]))["advice"] == []


def test_tokens_under_trained_names_the_chinchilla_optimal_model():
    # 1.4e10 tokens for 6.74B params: 2.08 per parameter, 9.6x below 20. Same compute C = 6ND = 5.66e20:
    # N_opt = sqrt(C / 120) = 2.17B params on D_opt = 20 N_opt = 43.4B tokens.
    p, lines = advice("train.tokens=1.4e10")
    assert tags(lines) == ["tokens"]
    n = p["params"]["total"]
    n_opt = math.sqrt(6 * n * 1.4e10 / 120)
    assert n_opt == pytest.approx(2.17e9, rel=0.01)
    assert "2.08 tokens per parameter" in lines[0] and "9.63x below" in lines[0]
    assert "~2.17B params" in lines[0] and "~43.4B tokens" in lines[0]


def test_tokens_over_trained_is_information():
    # LLaMA-7B's 1T tokens: 148 per parameter, 7.4x above 20: a deliberate choice, worded as such.
    _, lines = advice("train.tokens=1e12")
    assert tags(lines) == ["tokens"]
    assert "148 tokens per parameter" in lines[0] and "7.42x above" in lines[0] and "LLaMA" in lines[0]


def test_epochs_beyond_four():
    # 7M examples x 2048 tokens = 14.3B unique tokens, 10 epochs = 1.43e11 tokens (21 per parameter).
    _, lines = advice("train.tokens=null", "train.examples=7000000", "train.epochs=10")
    assert tags(lines) == ["epochs"]
    assert "10 passes" in lines[0] and "Muennighoff" in lines[0]
    _, lines = advice("train.tokens=null", "train.examples=17500000", "train.epochs=4")
    assert lines == []


def test_batch_far_below_gpt3():
    # 4 x 2048 x 2 x 8 = 131,072 tokens per step; GPT-3 used 2M at 6.7B: 15x below.
    _, lines = advice("parallel.gpus=8", "train.grad_accum_steps=2", "train.activation_checkpointing=selective")
    assert tags(lines) == ["batch"]
    assert "131,072 tokens per step" in lines[0] and "16x below" in lines[0]  # GPT-3 6.7B: 1,024 x 2,048 tokens
    assert "train.grad_accum_steps=32" in lines[0]


def test_batch_far_above_gpt3():
    # 4 x 2048 x 256 x 64 = 134M tokens per step: 67x GPT-3's 2M.
    _, lines = advice("train.grad_accum_steps=256")
    assert tags(lines) == ["batch"]
    assert "134,217,728 tokens per step" in lines[0] and "64x above" in lines[0]


def test_large_batch_without_ramp():
    _, lines = advice("train.batch_ramp_tokens=0")
    assert tags(lines) == ["batch"]
    assert "4.19M tokens per step" in lines[0] and "32K" in lines[0] and "train.batch_ramp_tokens=4e9" in lines[0]
    # The suggested ramp is a value the config reads back.
    assert load_config(overrides=[*SANE, "train.batch_ramp_tokens=4e9"]).train.batch_ramp_tokens == 4_000_000_000


def test_small_batches_are_fine_for_small_models():
    # The debug preset (~0.1M params) and gpt2 with a big enough batch: the batch rule only speaks >= 100M.
    _, lines = advice(base=["model.preset=debug", "hardware.gpu=a100-80gb", "train.micro_batch_size=1"])
    assert "batch" not in tags(lines)


def test_lr_far_from_published_peaks():
    # The reference at 6.74B: geometric mean of GPT-3's 1.2e-4 and LLaMA's 3e-4 at 6.7B = 1.9e-4.
    assert loglog(LR_REFERENCE, 6.7e9) == pytest.approx(math.sqrt(1.2e-4 * 3e-4))
    assert loglog(LR_REFERENCE, 125e6) == 6e-4 and loglog(LR_REFERENCE, 175e9) == pytest.approx(0.6e-4)
    _, lines = advice("train.lr=3e-3")
    assert tags(lines) == ["lr"] and "15.8x above" in lines[0]
    _, lines = advice("train.lr=1e-5")
    assert tags(lines) == ["lr"] and "19x below" in lines[0]
    # The LLM survey's 1e-4 (Zhao et al. 2023: peaks of 5e-5 to 1e-4) is within 3x for every size in the tables.
    assert advice("train.lr=1e-4")[1] == []


def test_warmup_outside_the_published_range():
    # A practitioner's 1.2B run (Hugging Face Trainer) used warmup_ratio 0.1: 10% of the steps, 20x the survey's 0.5%.
    _, lines = advice("train.warmup=0.1")
    assert tags(lines) == ["warmup"] and "10.00% of the steps" in lines[0]
    _, lines = advice("train.warmup=0")
    assert tags(lines) == ["warmup"] and "no warm-up" in lines[0]
    _, lines = advice("train.warmup=10")
    assert tags(lines) == ["warmup"] and "0.03% of the steps (10 of 35,820)" in lines[0]
    assert advice("train.warmup=0.001")[1] == [] and advice("train.warmup=100")[1] == []


def test_mfu_outside_the_usual_range(tmp_path):
    _, lines = advice("hardware.mfu=0.7")
    assert tags(lines) == ["mfu"] and "0.7" in lines[0] and "0.3-0.55" in lines[0]
    _, lines = advice("hardware.mfu=0.2")
    assert tags(lines) == ["mfu"] and "pessimistic" in lines[0]
    p, lines = advice("hardware.mfu=0.7", "measured.tokens_per_second=5e6")  # a measured speed: use its MFU
    assert f"set hardware.mfu={p['mfu']:.2g}" in lines[0] and "pretrain bench" not in lines[0]
    profile = tmp_path / "profile.json"
    profile.write_text(json.dumps({"device": "a100", "peak_tflops": {"bf16": 280.0}}))
    assert advice("hardware.mfu=0.7", f"hardware.profile={profile}")[1] == []


def test_bandwidth_bound_micro_batch_from_a_v100_log():
    # A practitioner's V100 log: a ~100M model with cutoff_len 1 was memory-bound. GPT-2 (124M) with seq 1 moves its
    # weights 3x in fp16 (0.74 GB) for 0.74 GFLOP: ~1 FLOP/byte, far below the V100's 125e12 / 900e9 = 139.
    # With the plain loss, as in that log: the chunked one also writes and reads back its dL/dW (V x h).
    p, lines = advice(
        "train.seq_len=1",
        "train.micro_batch_size=1",
        base=["model.preset=gpt2", "hardware.gpu=v100-32gb", "train.precision=fp16-mixed", "train.loss=plain"],
    )
    line = next(x for x in lines if x.startswith("bandwidth:"))
    assert "0.743 GB" in line and "0.742 GFLOP" in line and "139" in line
    need = int(re.search(r"micro-batch >= (\d+) would be compute-bound and fits", line).group(1))
    assert 100 < need <= p["max_micro_batch_size"]
    # seq 1024 x micro-batch 8 (the 3.3 it/s row of a practitioner's V100 log) is compute-bound: no bandwidth line.
    _, lines = advice(
        "train.seq_len=1024",
        "train.micro_batch_size=8",
        base=["model.preset=gpt2", "hardware.gpu=v100-32gb", "train.precision=fp16-mixed"],
    )
    assert "bandwidth" not in tags(lines)


def test_bandwidth_on_the_sane_config_and_cpu():
    _, lines = advice("train.seq_len=1", "train.micro_batch_size=1", "train.batch_ramp_tokens=0")
    assert "bandwidth" in tags(lines) and "a100-80gb's 153" in lines[-1]
    _, lines = advice(
        "train.seq_len=1",
        "train.micro_batch_size=1",
        "train.batch_ramp_tokens=0",
        "hardware.gpu=cpu",
        "hardware.peak_tflops=2",
    )
    assert "bandwidth" not in tags(lines)  # no memory bandwidth in the catalog for a CPU


def _fix_overrides(line: str, which: int = 0) -> list[str]:
    fix = line.split("cheapest fix: ", 1)[1].split("; or: ")[which]
    return re.findall(r"\b\w+\.\w+=\S+", fix.split(" (")[0])


@pytest.mark.parametrize(
    "overrides",
    [
        ["parallel.zero_stage=0"],  # DDP on 64: 195 GiB
        ["parallel.gpus=8", "train.micro_batch_size=16", "train.grad_accum_steps=3"],
        ["model.preset=llama-65b", "parallel.gpus=8", "train.micro_batch_size=1"],
        [
            "model.preset=llama-7b",
            "parallel.gpus=1",
            "parallel.zero_stage=0",
            "train.micro_batch_size=1",
            "train.batch_ramp_tokens=0",
        ],  # 16K tokens per step: below the 32K a ramp would start from
    ],
)
def test_memory_fix_really_fits(overrides):
    p, lines = advice(*overrides)
    assert not p["fits"]
    line = next(x for x in lines if x.startswith("memory:"))
    assert re.search(r"does not fit: [\d.]+ GiB > 72\.0 GiB usable", line)
    for which in range(1 + line.count("; or: ")):
        fix = _fix_overrides(line, which)
        assert fix, line
        fixed = make_plan(load_config(overrides=[*SANE, *overrides, *fix]))
        assert fixed["fits"], (fix, fixed["memory_bytes"]["total"] / 2**30)
        gib = float(re.search(r"\(([\d.]+) GiB", line.split("; or: ")[which]).group(1))
        assert fixed["memory_bytes"]["total"] / 2**30 == pytest.approx(gib, abs=0.05)


def test_memory_fix_prefers_recomputation_and_keeps_the_global_batch():
    # 131K tokens per step on 8 GPUs with the plain loss, 64.3 GiB at the loss's backward, on 63.2 GiB usable
    # after 21% fragmentation: selective recomputation is the cheapest fix. The chunked loss (the default) alone
    # makes it fit (62.6 GiB).
    assert "memory" not in tags(advice("parallel.gpus=8", "train.grad_accum_steps=2", "hardware.fragmentation=0.21")[1])
    p, lines = advice("parallel.gpus=8", "train.grad_accum_steps=2", "hardware.fragmentation=0.21", "train.loss=plain")
    line = next(x for x in lines if x.startswith("memory:"))
    assert _fix_overrides(line) == ["train.activation_checkpointing=selective"]
    # The micro-batch alternative keeps micro-batch x grad accum = 8 sequences per rank.
    alt = dict(kv.split("=") for kv in _fix_overrides(line, 1))
    assert int(alt["train.micro_batch_size"]) * int(alt["train.grad_accum_steps"]) == 4 * 2


def test_a_memory_fix_on_many_gpus_keeps_the_batch_near_the_original_and_comes_cheapest_first():
    # 131K tokens per step of a 70B model on 16 GB cards: a fix that needs 1,024 GPUs must not keep 64
    # accumulation steps (a 134M-token batch that the batch rule then flags), and the fix that needs fewer
    # GPUs is named first.
    base = [
        "model.preset=llama2-70b",
        "hardware.gpu=v100-16gb",
        "train.precision=fp16-mixed",
        "train.micro_batch_size=1",
        "train.grad_accum_steps=64",
        "parallel.gpus=1",
        "parallel.zero_stage=0",
    ]
    _, lines = advice(base=base)
    line = next(x for x in lines if x.startswith("memory:"))
    gpus = [int(re.search(r"parallel\.gpus=(\d+)", fix).group(1)) for fix in line.split("; or: ")]
    assert gpus == sorted(gpus)
    for which in range(len(gpus)):
        fixed, after = advice(*_fix_overrides(line, which), base=base)
        assert fixed["fits"] and not any(x.startswith("batch") and "above" in x for x in after), after


def test_llamas_4m_batch_is_in_range_at_half_a_billion():
    # GPT-3's "0.5M" at 125M-760M is 256 x 2,048 = 2**19 tokens; 4M = 2**22 is 8x it, the edge of the range.
    _, lines = advice(
        "model.preset=qwen2.5-0.5b",
        "train.micro_batch_size=8",
        "train.grad_accum_steps=4",
        "train.tokens=1e10",
        "train.lr=6e-4",
    )
    assert "batch" not in tags(lines)


def test_a_short_ramp_is_not_reported_as_zero_percent():
    _, lines = advice("train.tokens=1e13", "train.batch_ramp_tokens=0")
    line = next(x for x in lines if "batch_ramp_tokens=4e9" in x)
    assert "over 0.04% of the run" in line


def test_memory_nothing_fits_says_so():
    _, lines = advice("model.preset=llama-65b", "model.max_seq_len=1000000", "train.seq_len=1000000")
    line = next(x for x in lines if x.startswith("memory:"))
    assert "no fix found" in line and "offload" in line


def test_advice_leads_with_memory_when_nothing_fits():
    # its speed is measured by benchmarks/plan_speed.py, not asserted here (a loaded CI machine is no clock)
    p = make_plan(load_config(overrides=["model.preset=llama-65b", "parallel.gpus=8"]))
    assert p["advice"] and p["advice"][0].startswith("memory:")


def test_cli_prints_the_advice():
    r = run_cli("plan", "model.preset=llama-7b")
    assert r.returncode == 0, r.stderr
    advice_lines = [x for x in r.stdout.splitlines() if x.startswith("  ! ")]
    assert any(x.startswith("  ! memory: does not fit") for x in advice_lines)
    assert any(x.startswith("  ! batch: 16,384 tokens per step") for x in advice_lines)
    p = json.loads(run_cli("plan", "model.preset=llama-7b", "--json").stdout)
    assert [x[4:] for x in advice_lines] == p["advice"]
