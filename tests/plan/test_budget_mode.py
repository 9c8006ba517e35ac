"""Budget mode: what GPU time buys (Hoffmann et al. 2022), a LLaMA-style shape, its data, and a config that fits."""

import json
import math

import pytest

from pretrain.config import load_config
from pretrain.plan import make_plan, plan_with_explain
from pretrain.plan.budget_mode import INFERENCE_AWARE_SHRINK, spendable_compute
from pretrain.plan.scaling import approach_3_optimum, chinchilla_loss, llama_shape
from support import run_cli

A100_14_DAYS = ["budget.days=14", "parallel.gpus=8", "hardware.gpu=a100-80gb"]
H100_30_DAYS = ["budget.days=30", "parallel.gpus=64", "hardware.gpu=h100-sxm"]


def test_chinchilla_itself_is_reproduced():
    # Chinchilla: 70B parameters on 1.4T tokens (Hoffmann et al. 2022, section 4), C = 6 x 70e9 x 1.4e12 =
    # 5.88e23 FLOPs: N_opt = sqrt(C / 120) = 70.0B, D_opt = 1.40T.
    compute = 6 * 70e9 * 1.4e12
    assert math.sqrt(compute / 120) == pytest.approx(70e9)
    # At LLaMA-7B's size the conventions give LLaMA-7B's width, heads and MLP (8/3 x 4096 = 10,922.7 -> 11,008);
    # 36 layers instead of 32, as 8 key/value heads (LLaMA-3) leave room for more of them.
    shape = llama_shape(6.7e9, 32000, 4096)
    assert (shape["hidden_size"], shape["num_heads"], shape["num_kv_heads"]) == (4096, 32, 8)
    assert (shape["intermediate_size"], shape["num_layers"]) == (11008, 36)


@pytest.mark.parametrize("overrides, gpus, peak", [(A100_14_DAYS, 8, 312.0), (H100_30_DAYS, 64, 989.4)])
def test_budget_gives_n_opt_d_opt_a_shape_and_a_fitting_config(overrides, gpus, peak):
    config = load_config(overrides=overrides)
    p = make_plan(config)
    b = p["budget"]
    days = 14 if gpus == 8 else 30
    # GPU-seconds x 6N x the tokens a GPU trains per second, by the step-time model of the chosen config.
    compute = gpus * days * 86400 * 6 * b["model_params"] * p["step_time"]["tokens_per_second"] / gpus
    assert b["compute_flops"] == pytest.approx(compute, rel=1e-12)
    assert b["gpu_hours"] == pytest.approx(gpus * days * 24)
    assert b["params"] == pytest.approx(math.sqrt(compute / 120))  # approaches 1-2: C = 6ND, D = 20N
    assert b["tokens"] == pytest.approx(20 * b["params"])
    m = b["model"]
    # LLaMA conventions: head_dim 128, intermediate = 8/3 H rounded up to a multiple of 256, ~128 width per layer.
    assert m["head_dim"] == 128 and m["num_heads"] * 128 == m["hidden_size"]
    assert m["intermediate_size"] % 256 == 0 and 0 <= m["intermediate_size"] - 8 * m["hidden_size"] / 3 < 256
    assert m["num_heads"] % m["num_kv_heads"] == 0 and m["num_kv_heads"] in (4, 8)
    assert 0.5 < m["hidden_size"] / m["num_layers"] / 128 < 2
    # Near N_opt; below it where the shape at N_opt needs more recomputation and is slower (a smaller one is
    # chosen, its own speed buying at least its size).
    assert b["model_params"] == pytest.approx(b["params"], rel=0.15) and b["model_params"] <= b["params"] * 1.05
    assert 6 * b["model_params"] * b["model_tokens"] == pytest.approx(compute, rel=1e-6)
    assert b["storage_bytes"] == 2 * b["model_tokens"]  # uint16 ids for the 32,000-token vocabulary
    # The plan that follows is that model's, on those GPUs, and it fits.
    assert p["params"]["total"] == b["model_params"] and p["tokens"]["total"] == b["model_tokens"]
    assert p["parallel"]["world"] == gpus and p["fits"] is True and b["fit"]["fits"] is True
    assert p["memory_bytes"]["total"] == b["fit"]["memory_bytes"]
    # Planning the shape and the fit's overrides by hand gives the same plan (the contract of `--fit` too).
    by_hand = [f"model.{k}={v}" for k, v in m.items()] + [f"{k}={v}" for k, v in b["fit"]["overrides"].items()]
    q = make_plan(load_config(overrides=[*overrides[1:], f"train.tokens={b['model_tokens']}", *by_hand]))
    assert q["memory_bytes"] == p["memory_bytes"] and q["time"] == p["time"]
    # The inference-aware row: half the parameters on twice the tokens, a loss above the fit's optimum.
    small = b["inference_aware"]
    assert small["params"] == pytest.approx(b["params"] / 2, rel=0.1)
    assert 6 * small["params"] * small["tokens"] == pytest.approx(small["compute_flops"], rel=1e-6)  # its own speed
    assert small["loss"] == pytest.approx(chinchilla_loss(small["params"], small["tokens"]))
    assert small["loss_penalty"] == pytest.approx(small["loss"] - b["loss_optimum"]) and small["loss_penalty"] >= 0
    assert b["loss_penalty"] >= 0 and small["fit"]["fits"] is True
    # The labels hold: the compute-optimal row predicts the lower loss, next to the fit's own optimum.
    assert b["loss"] < small["loss"] and b["loss_penalty"] < 0.005


def test_approach_3_optimum_is_the_minimum_of_the_fit_and_agrees_with_approaches_1_2():
    # Hoffmann et al. 2022, equation 4 with the approach-3 coefficients as Besiroglu et al. 2024 refitted them
    # (E 1.8172, A 482.01, B 2085.43, alpha 0.3478, beta 0.3658): L(N, C / 6N) is lowest there, and there is
    # about approaches 1-2's N_opt = sqrt(C / 120) (20 tokens per parameter), from 1e20 to 1e25 FLOPs. The
    # published coefficients put it at a third of N_opt, under budget mode's "compute-optimal" row (issue 43).
    for compute in (1e20, 1e22, 1e25):
        n = approach_3_optimum(compute)
        loss = lambda x, c=compute: chinchilla_loss(x, c / (6 * x))  # noqa: E731
        assert loss(n) < loss(n * 1.05) and loss(n) < loss(n / 1.05)
        assert n == pytest.approx(math.sqrt(compute / 120), rel=0.15)


def test_explain_explains_each_figure():
    _, ex = plan_with_explain(load_config(overrides=A100_14_DAYS + ["data.bytes_per_token=3.5"]), advice=False)
    explained = {name for section, name, _, _ in ex.lines if section == "budget"}
    for name in (
        "gpu_hours",
        "compute_flops",
        "params",
        "tokens",
        "loss_optimum",
        "model.shape",
        "model.params",
        "model.tokens",
        "model.loss",
        "model.loss_penalty",
        "model.storage_bytes",
        "model.fits",
        "inference_aware.shape",
        "inference_aware.loss_penalty",
        "inference_aware.fits",
    ):
        assert name in explained, name
    text = ex.render()
    assert "budget.days 14 x 24 x parallel.gpus 8" in text and "Hoffmann et al. 2022, approaches 1-2" in text
    assert "raw text" in text  # with data.bytes_per_token: the text the tokens take


def test_cost_budget_and_json_contract():
    r = run_cli("plan", "budget.cost=10000", "hardware.price_per_gpu_hour=2.5", "parallel.gpus=8", "--json")
    assert r.returncode == 0, r.stderr
    b = json.loads(r.stdout)["budget"]
    assert b["gpu_hours"] == pytest.approx(4000)
    assert {"compute_flops", "params", "tokens", "model"} <= set(b)
    assert {"hidden_size", "num_layers", "num_heads", "num_kv_heads", "intermediate_size"} <= set(b["model"])
    table = run_cli("plan", "budget.cost=10000", "hardware.price_per_gpu_hour=2.5", "parallel.gpus=8")
    assert table.stdout.startswith("budget: 4,000 GPU-hours") and "inference-aware" in table.stdout


@pytest.mark.parametrize(
    "overrides, message",
    [
        (["budget.cost=1000"], "budget.cost: needs hardware.price_per_gpu_hour"),
        (["budget.days=3", "budget.gpu_hours=100"], "give one of"),
        (["budget.days=-1"], "budget.days: must be > 0"),
        (["budget.days=3", "hardware.gpu=cpu"], "budget: cpu: no data-sheet peak"),
    ],
)
def test_bad_budgets_are_one_line(overrides, message):
    r = run_cli("plan", *overrides)
    assert r.returncode == 2 and message in r.stderr and r.stderr.count("\n") == 1, r.stderr


def test_the_loaded_config_is_never_changed():
    # A loaded config stays as loaded: budget mode plans a new config of the model it chooses, and the
    # result's budget.overrides rebuild that config from the caller's.
    config = load_config(overrides=A100_14_DAYS)
    before = config.to_dict()
    p = make_plan(config)
    assert config.to_dict() == before
    from pretrain.plan import planned_config

    chosen = planned_config(config, p)
    assert chosen is not config and chosen.budget.days is None
    assert chosen.model.hidden_size == p["budget"]["model"]["hidden_size"]
    assert make_plan(chosen)["memory_bytes"] == p["memory_bytes"]
    table = run_cli("plan", *A100_14_DAYS)
    m = p["budget"]["model"]
    assert f"{p['params']['total'] / 1e9:.3g}B" in table.stdout.split("pretrain plan:")[1].splitlines()[0]
    assert f"H {m['hidden_size']}, L {m['num_layers']}" in table.stdout


LLAMA3_8B_BUDGET = ["model.preset=llama3-8b", "hardware.gpu=h100-sxm", "parallel.gpus=8", "budget.gpu_hours=1000"]


@pytest.mark.parametrize(
    "extra, given", [([], "model.preset=llama3-8b"), (["hardware.hfu=0.5"], "model.preset=llama3-8b")]
)
def test_a_given_model_is_kept_and_the_budget_buys_its_tokens(extra, given):
    # The issue: this plan used to be a 3.41B "custom" model. The model given stays; the budget buys the tokens
    # whose planned time (the plan's own: the step-time model, or hardware.hfu given) is the budget's 1,000
    # GPU-hours, in whole optimizer steps.
    p = make_plan(load_config(overrides=[*LLAMA3_8B_BUDGET, *extra]))
    b = p["budget"]
    plain = make_plan(load_config(overrides=[*LLAMA3_8B_BUDGET[:3], *extra]))
    assert p["model"] == plain["model"] and p["params"] == plain["params"]
    assert b["model_given"] == given and b["overrides"]["train.tokens"] == b["model_tokens"] == p["tokens"]["total"]
    one_step = p["time"]["gpu_hours"] / p["steps"]["total"]
    assert 1000 - one_step < p["time"]["gpu_hours"] <= 1000
    # Exactly the plan of those tokens, the budget block beside it.
    by_hand = make_plan(load_config(overrides=[*LLAMA3_8B_BUDGET[:3], *extra, f"train.tokens={b['model_tokens']}"]))
    assert {k: v for k, v in p.items() if k != "budget"} == by_hand
    assert b["loss"] == pytest.approx(chinchilla_loss(b["model_params"], b["model_tokens"])) and b["loss_penalty"] > 0


def test_shape_keys_fix_the_model_too_and_the_table_says_so():
    r = run_cli(
        "plan",
        "model.hidden_size=2048",
        "model.num_heads=16",
        "hardware.gpu=h100-sxm",
        "parallel.gpus=8",
        "budget.days=1",
    )
    assert r.returncode == 0, r.stderr
    assert r.stdout.startswith("budget: 192 GPU-hours buy ") and "(model.hidden_size=2048)" in r.stdout
    assert "custom (llama, 2.83B)" in r.stdout.split("pretrain plan:")[1].splitlines()[0]


@pytest.mark.parametrize(
    "overrides, message",
    [
        (
            LLAMA3_8B_BUDGET + ["train.tokens=1e9"],
            "budget.gpu_hours: buys the training tokens of the model given "
            "(model.preset=llama3-8b), and train.tokens=1000000000 fixes them too; drop train.tokens",
        ),
        (
            ["hardware.gpu=h100-sxm", "budget.days=2", "train.max_steps=100"],
            "budget.days: chooses the model and its "
            "tokens, and train.max_steps=100 fixes the tokens; drop train.max_steps",
        ),
    ],
)
def test_a_length_beside_a_budget_is_a_contradiction_in_one_line(overrides, message):
    r = run_cli("plan", *overrides)
    assert r.returncode == 2 and message in r.stderr and r.stderr.count("\n") == 1, r.stderr


@pytest.mark.parametrize(
    "overrides, message",
    [
        # Budget mode choosing the model: 1e12 GPU-hours used to fail on model.num_layers, 1e-6 to plan 0.0B tokens.
        (["budget.gpu_hours=1e12"], "parameters budget mode builds"),
        (["budget.gpu_hours=1e-6"], "parameters budget mode builds"),
        # A model given: less than one optimizer step, or more tokens than train.tokens holds.
        (["budget.gpu_hours=1e-6", "model.preset=llama3-8b"], "less than one optimizer step"),
        (["budget.gpu_hours=1e12", "model.preset=llama3-8b"], "more than train.tokens holds"),
    ],
)
def test_budgets_out_of_range_name_the_key_and_its_range(overrides, message):
    r = run_cli("plan", "hardware.gpu=h100-sxm", "parallel.gpus=8", *overrides)
    assert r.returncode == 2 and r.stderr.count("\n") == 1, r.stderr
    assert r.stderr.startswith("pretrain plan: error: budget.gpu_hours: ") and message in r.stderr
    low, high = (float(x) for x in r.stderr.split("give budget.gpu_hours from ")[1].split(" (")[0].split(" to "))
    # The range's ends plan (at the low end: a model of the family, on at least one step's tokens).
    p = make_plan(
        load_config(
            overrides=["hardware.gpu=h100-sxm", "parallel.gpus=8", *overrides[1:], f"budget.gpu_hours={low * 1.01}"]
        )
    )
    assert p["tokens"]["total"] >= p["steps"]["tokens_per_step"]
    assert low < high


def test_the_range_ends_are_the_smallest_and_largest_models_budget_mode_builds():
    # Chosen models: N_opt = sqrt(C / 120) from twice the smallest shape (width 128, one layer: the
    # inference-aware row's N_opt / 2 is then that shape) to the largest (width 65,536 at the planner's
    # 1,000-layer limit), so every shape within the range is one the planner plans.
    from pretrain.plan import MAX_LAYERS

    low, high = spendable_compute(32000, 2048)
    top = llama_shape(math.sqrt(high / 120), 32000, 2048)
    assert (top["hidden_size"], top["num_layers"]) == (65536, MAX_LAYERS)
    assert llama_shape(math.sqrt(high * 1.01 / 120), 32000, 2048)["num_layers"] > MAX_LAYERS
    bottom = llama_shape(math.sqrt(low / 120) / INFERENCE_AWARE_SHRINK, 32000, 2048)
    assert (bottom["hidden_size"], bottom["num_layers"]) == (128, 1)
    # The refusal gives that range in the key's own units: GPU-hours at each end shape's own speed (6N x tokens
    # per GPU-second, the step-time model).
    r = run_cli("plan", "hardware.gpu=h100-sxm", "budget.gpu_hours=1e12")
    per_hour = []
    for shape in (llama_shape(math.sqrt(x / 120), 32000, 2048) for x in (low, high)):
        p = plan_with_explain(
            load_config(overrides=["hardware.gpu=h100-sxm", *(f"model.{k}={v}" for k, v in shape.items())]),
            advice=False,
        )[0]
        per_hour.append(3600 * 6 * p["params"]["total"] * p["step_time"]["tokens_per_second"])  # one GPU
    assert (
        f"give budget.gpu_hours from {low / per_hour[0]:.3g} to {high / per_hour[1]:.3g} (on h100-sxm at the "
        "step-time model's MFU " in r.stderr
    )
