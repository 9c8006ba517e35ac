"""Training the tiny Mixture-of-Experts (moe-debug) on the CPU: the loss falls, metrics.jsonl carries the
balancing losses and expert load, the routing biases move and a stopped run resumes bitwise, biases included;
what is not built is refused in one line."""

import json

import pytest

from support import finished_run, losses, needs_compiler, params, run_cli, tiny

torch = pytest.importorskip("torch")

MOE = (
    "model.preset=moe-debug",
    "model.router_bias_update_rate=0.01",
    "model.router_z_loss_coef=0.001",
    "train.max_steps=8",
)


@pytest.fixture(scope="module")
def uninterrupted(prepared, tmp_path_factory):
    run_dir = tmp_path_factory.mktemp("moe") / "run"
    return finished_run(run_dir, *tiny(prepared, run_dir, *MOE))


def test_loss_falls_and_metrics_carry_expert_load(uninterrupted):
    rows = [json.loads(x) for x in (uninterrupted / "metrics.jsonl").read_text().splitlines()]
    steps = [r for r in rows if "loss" in r]
    assert steps[-1]["loss"] < steps[0]["loss"] - 0.3
    for r in steps:
        assert "moe/dropped_fraction" not in r  # dropless: no panel of zeros
        assert r["moe/load_max_over_mean"] >= 1.0
        assert len(r["moe/load_max_over_mean_per_layer"]) == 1  # blocks.0 is dense (first_dense_layers=1)
        assert r["moe/aux_loss"] > 0 and r["moe/z_loss"] > 0
    bias = params(uninterrupted)["blocks.1.mlp.expert_bias"]
    assert bias.abs().sum() > 0  # moved once per step by +-0.01
    assert torch.allclose(bias * 100, (bias * 100).round(), atol=1e-4)


def test_stop_and_resume_is_bitwise_identical_routing_biases_included(prepared, uninterrupted, tmp_path):
    run_dir = tmp_path / "run"
    first = run_cli("train", *tiny(prepared, run_dir, *MOE, "debug.stop_after_step=3"))
    assert first.returncode == 0, first.stderr
    second = run_cli("train", "--resume", run_dir, "debug.stop_after_step=0")
    assert second.returncode == 0, second.stderr
    assert "resumed from" in second.stdout
    assert losses(uninterrupted) == losses(run_dir)
    pa, pb = params(uninterrupted), params(run_dir)
    assert pa.keys() == pb.keys() and "blocks.1.mlp.expert_bias" in pa
    assert all(torch.equal(pa[k], pb[k]) for k in pa)


@pytest.mark.parametrize("recompute", ["full", "selective"])
def test_recomputation_trains_the_same_losses_and_routing_biases(prepared, uninterrupted, tmp_path, recompute):
    """Each MoE layer runs again in backward (selective: its routed part, the top-k choice kept); its tokens are
    counted once: the bias updates are the same."""
    run_dir = finished_run(
        tmp_path / "run", *tiny(prepared, tmp_path / "run", *MOE, f"train.activation_checkpointing={recompute}")
    )
    assert losses(run_dir) == pytest.approx(losses(uninterrupted), rel=1e-6, abs=0)
    pa, pb = params(uninterrupted), params(run_dir)
    assert torch.equal(pa["blocks.1.mlp.expert_bias"], pb["blocks.1.mlp.expert_bias"])


@pytest.mark.slow
@needs_compiler
def test_compiled_blocks_train_like_eager(prepared, uninterrupted, tmp_path):
    """train.compile=true: attention and norms compiled, each MoE block's routed feed-forward eager (a graph
    break around it); the same losses up to fused-kernel rounding, the same expert loads, no recompilation."""
    run_dir = tmp_path / "run"
    r = run_cli("train", *tiny(prepared, run_dir, *MOE, "train.compile=true"), env={"TORCH_LOGS": "recompiles"})
    assert r.returncode == 0, r.stderr[-3000:]
    eager, compiled = losses(uninterrupted), losses(run_dir)
    assert compiled[1] == pytest.approx(eager[1], rel=1e-5)
    assert compiled == pytest.approx(eager, rel=2e-3)  # AdamW amplifies rounding (test_train_options.py)
    # Block.forward compiled twice, once per kind of block (blocks.0 dense, blocks.1 MoE), then never again
    assert r.stderr.count("Recompiling function") == 1 and "type MLP" in r.stderr, r.stderr[-3000:]
    first = [
        next(json.loads(x) for x in (d / "metrics.jsonl").read_text().splitlines() if "loss" in x)
        for d in (uninterrupted, run_dir)
    ]
    assert first[0]["moe/load_max_over_mean_per_layer"] == first[1]["moe/load_max_over_mean_per_layer"]


GPT2 = ("model.family=gpt2", "model.num_kv_heads=4", "model.qk_norm=false")


@pytest.mark.parametrize(
    "overrides, named",
    [
        (GPT2, "LLaMA family"),
        (("parallel.pipeline=2", "parallel.gpus=2"), "with pipeline parallelism"),
        (("parallel.tensor=2", "parallel.gpus=2", "model.qk_norm=false"), "parallel.sequence_parallel"),
        (("parallel.expert=2", "parallel.gpus=2", "parallel.zero_stage=1"), "parallel.zero_stage"),
        (("parallel.tensor=2", "parallel.gpus=4", "parallel.expert_tensor=2"), "parallel.expert_tensor: 2 is planned"),
        (("model.experts_per_token=9",), "model.experts_per_token"),
    ],
)
def test_what_is_not_built_is_refused_in_one_line(overrides, named):
    from pretrain.config import load_config
    from pretrain.config.trainable import check_trainable
    from pretrain.errors import ConfigError

    with pytest.raises(ConfigError, match=named) as e:
        check_trainable(load_config(None, ["model.preset=moe-debug", *overrides]), needs_data=False)
    assert "\n" not in str(e.value)


def test_the_cli_refuses_before_any_work(prepared, tmp_path):
    r = run_cli("train", *tiny(prepared, tmp_path / "run", "model.preset=moe-debug", *GPT2))
    assert r.returncode == 2 and len(r.stderr.strip().splitlines()) == 1, r.stderr
    assert "Mixture-of-Experts" in r.stderr
