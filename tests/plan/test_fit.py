"""`pretrain plan --fit`: the fastest layout that fits, its JSON contract, the search's rules, and a
candidate's overrides planned alone giving the same memory and speed."""

import json
import math

import pytest

from pretrain.config import load_config, replaced
from pretrain.config.trainable import check_trainable
from pretrain.errors import ConfigError
from pretrain.plan.fit import REFUSED, command_line, fit, render
from support import run_cli

LLAMA3_8B_8_H100 = ["model.preset=llama3-8b", "parallel.gpus=8", "hardware.gpu=h100-sxm", "train.seq_len=8192"]
LLAMA3_70B_64_H100 = ["model.preset=llama3-70b", "parallel.gpus=64", "hardware.gpu=h100-sxm", "train.seq_len=8192"]
CANDIDATE_KEYS = {"overrides", "memory_bytes", "fits", "tokens_per_s", "mfu", "step_time_s"}


def test_json_contract_and_a_candidate_planned_alone_is_the_same():
    r = run_cli("plan", *LLAMA3_8B_8_H100, "--fit", "--json")
    assert r.returncode == 0, r.stderr
    result = json.loads(r.stdout)
    assert set(result) == {"candidates", "rejected", "fp8_vs_bf16"}  # an H100: fp8 weighed (test_fp8_plan.py)
    cands = result["candidates"]
    assert len(cands) == 10 and all(set(c) == CANDIDATE_KEYS and c["fits"] is True for c in cands)
    speeds = [c["tokens_per_s"] for c in cands]
    assert speeds == sorted(speeds, reverse=True)  # fastest first
    assert all(set(x) == {"overrides", "why"} for x in result["rejected"])
    assert any(x["why"].startswith("does not fit") for x in result["rejected"])
    for cand in (cands[0], cands[-1]):
        alone = run_cli("plan", *LLAMA3_8B_8_H100, *command_line(cand["overrides"]).split(), "--json")
        p = json.loads(alone.stdout)
        assert p["memory_bytes"] == cand["memory_bytes"] and p["fits"] is True
        st = p["step_time"]
        assert (st["tokens_per_second"], st["mfu"], st["seconds"]) == (
            cand["tokens_per_s"],
            cand["mfu"],
            cand["step_time_s"],
        )


@pytest.mark.parametrize("overrides", [LLAMA3_8B_8_H100, LLAMA3_70B_64_H100])
def test_the_search_keeps_the_rules_and_the_global_batch(overrides):
    config = load_config(overrides=overrides)
    m, par = config.model, config.parallel
    sequences = config.train.micro_batch_size * config.train.grad_accum_steps * par.gpus
    result = fit(config)
    assert result["candidates"]
    for entry in result["candidates"] + result["rejected"]:
        o = entry["overrides"]
        tp, pp = o["parallel.tensor"], o["parallel.pipeline"]
        # Tensor divides the heads and the key/value heads and stays in a node; pipeline divides the layers.
        assert m.num_heads % tp == 0 and m.num_kv_heads % tp == 0 and tp <= par.gpus_per_node
        assert m.num_layers % pp == 0 and par.gpus % (tp * pp) == 0
        if "train.micro_batch_size" in o and not entry.get("why", "").startswith("the global batch"):
            assert o["train.micro_batch_size"] * o["train.grad_accum_steps"] * par.gpus // (tp * pp) == sequences
    # Fits with the fragmentation allowance: at most 90% of the H100's 81,559 MiB.
    assert all(c["memory_bytes"]["total"] <= 0.9 * 81559 * 1024**2 for c in result["candidates"])


def test_the_table_ranks_and_says_why_the_others_lost():
    r = run_cli("plan", *LLAMA3_70B_64_H100, "--fit")
    assert r.returncode == 0, r.stderr
    out = r.stdout
    assert "micro x accum" in out and "tokens/s" in out and "MFU" in out and "memory GiB" in out
    assert "Why the others lost:" in out and "does not fit" in out and "slower:" in out
    rows = [line for line in out.splitlines() if line[:4].strip().isdigit()]
    assert len(rows) == 10
    speeds = [float(line.split()[-3].replace(",", "")) for line in rows]
    assert speeds == sorted(speeds, reverse=True)
    explained = run_cli("plan", *LLAMA3_70B_64_H100, "--fit", "--explain", "--top", "2")
    assert "[step_time]" in explained.stdout and "bubble (p-1)/(m+p-1)" in explained.stdout


def test_offload_is_searched_only_when_nothing_fits_without_it_and_refused_as_the_trainer_refuses_it():
    # Llama-3-8B on one H100: 18 bytes/param of model states (144 GB) fit only with the optimizer on the host,
    # which the planner models and `pretrain train` does not run: no candidate, and the rows say why.
    config = load_config(overrides=["model.preset=llama3-8b", "parallel.gpus=1", "hardware.gpu=h100-sxm"])
    result = fit(config)
    assert not result["candidates"]
    offloaded = [r for r in result["rejected"] if r["overrides"].get("parallel.offload", "none") != "none"]
    assert offloaded and all(r["why"].startswith(f"{REFUSED}: parallel.offload: ") for r in offloaded)
    assert "(none fits, or none is one `pretrain train` runs: see below)" in render(config, result)
    with_gpus = fit(load_config(overrides=LLAMA3_8B_8_H100))
    assert all(c["overrides"]["parallel.offload"] == "none" for c in with_gpus["candidates"])


@pytest.mark.parametrize(
    "args, message",
    [
        (["model.preset=debug", "hardware.gpu=cpu", "--fit"], "--fit ranks layouts by speed and needs a peak FLOP/s"),
        ([*LLAMA3_8B_8_H100, "--fit", "--top", "0"], "--top: must be at least 1"),
    ],
)
def test_bad_input_is_one_line(args, message):
    r = run_cli("plan", *args)
    assert r.returncode == 2 and message in r.stderr and r.stderr.count("\n") == 1, r.stderr


def test_a_pipeline_that_does_not_divide_the_batch_is_refused_with_why():
    # 4 sequences per step on 8 GPUs: data parallel 8 cannot split them; tensor/pipeline 2 x 4 (data 1) can.
    config = load_config(
        overrides=[
            "model.preset=llama3-8b",
            "parallel.gpus=8",
            "parallel.tensor=2",
            "parallel.pipeline=4",
            "train.grad_accum_steps=4",
            "hardware.gpu=h100-sxm",
        ]
    )
    result = fit(config)
    why = [x["why"] for x in result["rejected"] if x["why"].startswith("the global batch")]
    assert any("does not divide over data parallel 8" in w for w in why)
    assert all(
        math.prod((c["overrides"]["parallel.tensor"], c["overrides"]["parallel.pipeline"])) >= 2
        for c in result["candidates"]
    )


def test_budget_mode_fits_the_model_the_budget_buys():
    # --fit with budget keys searches the layouts of the chosen model (budget mode's plan), not the default one.
    r = run_cli("plan", "budget.days=14", "parallel.gpus=8", "hardware.gpu=a100-80gb", "--fit", "--json", "--top", "3")
    assert r.returncode == 0, r.stderr
    cands = json.loads(r.stdout)["candidates"]
    assert len(cands) == 3 and all(c["fits"] for c in cands)
    b = json.loads(run_cli("plan", "budget.days=14", "parallel.gpus=8", "hardware.gpu=a100-80gb", "--json").stdout)
    alone = run_cli(
        "plan",
        "parallel.gpus=8",
        "hardware.gpu=a100-80gb",
        *[f"{k}={'null' if v is None else v}" for k, v in b["budget"]["overrides"].items()],
        *command_line(cands[0]["overrides"]).split(),
        "--json",
    )
    assert json.loads(alone.stdout)["memory_bytes"] == cands[0]["memory_bytes"]


def test_the_documented_fit_table_is_what_the_planner_prints():
    from pathlib import Path

    from pretrain.plan.fit import render

    readme = (Path(__file__).resolve().parents[2] / "docs" / "plan.md").read_text()
    head = "$ pretrain plan " + " ".join(LLAMA3_8B_8_H100) + " --fit --top 5\n"
    shown = readme[readme.index(head) + len(head) : readme.index("```", readme.index(head))]
    config = load_config(overrides=LLAMA3_8B_8_H100)
    table = render(config, fit(config, top=5), command="pretrain plan " + " ".join(LLAMA3_8B_8_H100))
    assert shown == table + "\n", "rerun the command and paste its table into docs/plan.md"


def _trainer_says(config, overrides: dict) -> str | None:
    """The trainer's own acceptance check (what `pretrain train` refuses with): None, or its one line."""
    try:
        check_trainable(replaced(config, overrides), needs_data=False)
    except ConfigError as e:
        return str(e)
    return None


TINY_8_RANKS = [
    "model.preset=debug",
    "model.num_kv_heads=4",
    "parallel.gpus=8",
    "parallel.gpus_per_node=4",
    "hardware.gpu=h100-sxm",
    "train.seq_len=64",
    "train.micro_batch_size=2",
    "train.grad_accum_steps=4",
]


STAGES = {(1, 1), (2, 1), (4, 1)}  # (tensor, pipeline) without a pipeline


@pytest.mark.parametrize(
    "extra, grid",
    [
        ([], STAGES | {(1, 2), (2, 2), (4, 2)}),
        (["model.tie_embeddings=true"], STAGES),  # the trainer does not synchronise a tied embedding across stages
        (["train.precision=fp16-mixed"], STAGES),  # nor skip an fp16 step on every stage together
        (["model.family=gpt2"], {(1, 1), (1, 2)}),  # tensor parallelism is built for LLaMA
        # MoE: no pipeline yet; expert parallelism over data x tensor ranks, every recomputation
        (["model.preset=moe-debug", "model.qk_norm=false"], STAGES),
    ],
    ids=["llama", "tied", "fp16", "gpt2", "moe"],
)
def test_every_layout_the_fit_can_emit_is_one_the_trainer_accepts(extra, grid):
    # A tiny model on 8 ranks, every layout the fit weighs (tensor 1/2/4, pipeline 1/2, ZeRO 0-3): whatever
    # `--top`, the fit emits its candidates and, each layout once, the slower ones that fit: every one passes
    # `pretrain train`'s own check, and each row rejected as refused is refused by it, in its words. Without
    # the check in fit, tied embeddings across stages and ZeRO 2/3 per stage were emitted (and here 41 more);
    # with it once per ZeRO stage under the user's recomputation, MoE rows of the other recomputations.
    config = load_config(overrides=TINY_8_RANKS + extra)
    result = fit(config)
    emitted = result["candidates"] + [r for r in result["rejected"] if r["why"].startswith("slower")]
    assert len(emitted) > 10
    for c in emitted:
        assert _trainer_says(config, c["overrides"]) is None, c["overrides"]
    for r in result["rejected"]:
        if r["why"].startswith(REFUSED):
            assert r["why"] == f"{REFUSED}: {_trainer_says(config, r['overrides'])}"
    assert {(c["overrides"]["parallel.tensor"], c["overrides"]["parallel.pipeline"]) for c in emitted} == grid


def test_every_llama3_70b_row_on_64_h100s_is_one_the_trainer_accepts():
    # The case: tensor 4 x pipeline 8 with ZeRO 2/3 ranked first, and `pretrain train` refused them.
    config = load_config(overrides=LLAMA3_70B_64_H100)
    result = fit(config)
    assert len(result["candidates"]) == 10
    for c in result["candidates"]:
        assert _trainer_says(config, c["overrides"]) is None, c["overrides"]
    refusals = {r["why"].split(":")[1].strip() for r in result["rejected"] if r["why"].startswith(REFUSED)}
    assert refusals == {"parallel.zero_stage"}  # FSDP per stage; DDP / ZeRO-1 beside tensor parallelism
    table = render(config, result)
    assert (
        f"x {REFUSED}; e.g. TP 1 PP 2 ZeRO 3 recompute full micro 1 offload none: parallel.zero_stage: FSDP "
        "(stages 2 and 3) per pipeline stage is not built" in table
    )


def test_fit_keeps_the_global_batch_on_every_row():
    from pretrain.config import load_config
    from pretrain.plan.fit import fit

    c = load_config(
        overrides=[
            "model.preset=llama3-8b",
            "hardware.gpu=h100-sxm",
            "parallel.gpus=64",
            "train.seq_len=8192",
            "train.global_batch_tokens=4194304",
        ]
    )
    rows = fit(c, 10)["candidates"]
    assert rows
    for row in rows:
        o = {**{"parallel.tensor": 1, "parallel.pipeline": 1}, **row["overrides"]}
        data = 64 // (o["parallel.tensor"] * o["parallel.pipeline"])
        assert o["train.micro_batch_size"] * o["train.grad_accum_steps"] * data * 8192 == 4194304, row


def test_the_micro_batch_search_is_bounded_by_what_fits_not_by_the_batch():
    # A global batch of 8 x 2^40 sequences: the micro-batch sizes were every divisor of a rank's 2^43
    # sequences, found by trying each number up to it (hours); now only those up to the largest that fits.
    r = run_cli(
        "plan", *LLAMA3_8B_8_H100, "train.grad_accum_steps=1099511627776", "--fit", "--json", "--top", "2", timeout=120
    )
    assert r.returncode == 0, r.stderr
    for cand in json.loads(r.stdout)["candidates"]:
        o = cand["overrides"]
        assert (
            o["train.micro_batch_size"]
            * o["train.grad_accum_steps"]
            * 8
            // (o["parallel.tensor"] * o["parallel.pipeline"])
            == 8 * 2**40
        )
    from pretrain.plan.fit import _divisors

    for n in (1, 12, 36, 97, 360, 1024):
        for most in (None, 1, 5, 6, 19, 1000):
            assert _divisors(n, most) == [k for k in range(1, n + 1) if n % k == 0 and (most is None or k <= most)]
    assert _divisors(2**62, 8) == [1, 2, 4, 8] and len(_divisors(2**40)) == 41


def test_gpus_beyond_the_documented_maximum_are_refused_in_one_line():
    # 10^9 GPUs is a slip of the keyboard: refused before any planning (its --fit took seconds for nothing).
    r = run_cli("plan", "model.preset=llama3-70b", "hardware.gpu=h100-sxm", "parallel.gpus=1000000000", "--fit")
    assert r.returncode == 2 and r.stderr.count("\n") == 1, r.stderr
    assert "parallel.gpus: 1,000,000,000 is more than the 1,048,576 (2^20)" in r.stderr
    assert run_cli("plan", "model.preset=llama3-70b", "hardware.gpu=h100-sxm", f"parallel.gpus={2**20}").returncode == 0


def test_the_expert_parallel_search_is_bounded_as_a_dense_models_is():
    # 720,720 experts on 720,720 GPUs: every divisor of gcd(experts, data parallel) was a split, 1,632 of them
    # (240 expert degrees on 1 x 1), and --fit took 46 s. Now at most 21 degrees a (tensor, pipeline), a ladder
    # of doublings, so the splits are those of the dense search x 21 at most, whatever the counts.
    from pretrain.plan.fit import MOST_EXPERT_DEGREES, expert_degrees, layouts

    config = load_config(overrides=["model.preset=mixtral-8x7b", "model.num_experts=720720", "parallel.gpus=720720"])
    splits, _ = layouts(config)
    per_split: dict[tuple[int, int], list[int]] = {}
    for s in splits:
        per_split.setdefault((s["tensor"], s["pipeline"]), []).append(s["expert"])
    assert MOST_EXPERT_DEGREES == 21 and len(per_split) <= 20  # tensor 1-8 x pipeline 1-16 at most
    assert len(splits) <= len(per_split) * 21 < 300 and max(map(len, per_split.values())) <= 21
    assert per_split[1, 1] == expert_degrees(720720) and per_split[1, 1][-1] == 720720  # 1 to all of them
    # every ladder step at least doubles: 1, 2, 4, 8, 16, 33, 66, ... 360360, 720720
    assert all(b >= 2 * a for a, b in zip(per_split[1, 1], per_split[1, 1][1:]))
    # The published counts (powers of two) and a small count like Qwen1.5-MoE's 60 keep every divisor
    assert expert_degrees(256) == [1, 2, 4, 8, 16, 32, 64, 128, 256]
    assert expert_degrees(60) == [1, 2, 3, 4, 5, 6, 10, 12, 15, 20, 30, 60]
    assert expert_degrees(2**20) == [2**k for k in range(21)]
    # the fit itself answers on it (nothing fits: 946,060 GiB of experts per GPU at EP 1, no layout trains)
    assert fit(config, top=2)["candidates"] == []


def test_a_model_the_trainer_cannot_build_is_ranked_labelled_not_trainable(tmp_path):
    # gpt-oss-20b (openai/gpt-oss-20b's config.json, as tests/plan/test_params.py counts it): the planner counts
    # it, the trainer refuses its attention sinks; --fit refused every layout and proposed nothing.
    layers = ["sliding_attention", "full_attention"] * 12
    gpt_oss = dict(
        model_type="gpt_oss",
        vocab_size=201088,
        hidden_size=2880,
        intermediate_size=2880,
        num_hidden_layers=24,
        num_attention_heads=64,
        num_key_value_heads=8,
        head_dim=64,
        num_local_experts=32,
        num_experts_per_tok=4,
        experts_per_token=4,
        attention_bias=True,
        sliding_window=128,
        max_position_embeddings=131072,
        layer_types=layers,
        rope_theta=150000,
        swiglu_limit=7.0,
        rope_scaling={"rope_type": "yarn", "factor": 32.0, "original_max_position_embeddings": 4096},
    )
    (tmp_path / "config.json").write_text(json.dumps(gpt_oss))
    config = load_config(overrides=[f"model.hf_config={tmp_path}", "parallel.gpus=8", "hardware.gpu=h100-sxm"])
    result = fit(config, top=3)
    assert "attention sinks (gpt-oss) is not built yet" in result["not_trainable"]
    assert len(result["candidates"]) == 3 and all(c["fits"] for c in result["candidates"])
    # each layout weighed by the rest of the trainer's check: MoE with tensor parallelism is refused still
    refused = [r for r in result["rejected"] if r["why"].startswith(REFUSED)]
    assert refused and not any("attention sinks" in r["why"] for r in refused)
    assert all(r["overrides"]["parallel.tensor"] == 1 for r in result["candidates"])
    table = render(config, result).splitlines()
    assert table[1].startswith("  ! not trainable here: model.attention_sinks:") and table[1].endswith("for sizing")
    assert any(line.startswith("  The fastest, to plan: ") for line in table)  # not "to plan or train"
    assert "not_trainable" not in fit(load_config(overrides=LLAMA3_8B_8_H100), top=1)
