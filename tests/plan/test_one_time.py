"""One time (issue 32): the plan's wall-clock time, --fit, budget mode and sweep's planned line are the step-time
model's; hardware.mfu / hfu only override it when given, and the time carries the model's measured error."""

import pytest

from pretrain.config import load_config
from pretrain.plan import make_plan, plan_with_explain
from pretrain.plan.fit import fit
from pretrain.plan.length import STEP_TIME_ERROR
from pretrain.plan.table import render

LLAMA3_8B_64_H100 = ["model.preset=llama3-8b", "parallel.gpus=64", "hardware.gpu=h100-sxm", "parallel.zero_stage=3"]


def test_the_plans_time_is_steps_times_the_step_time_with_the_models_error():
    config = load_config(overrides=LLAMA3_8B_64_H100)
    p, ex = plan_with_explain(config, advice=False)
    t, st, steps = p["time"], p["step_time"], p["steps"]["total"]
    assert t["seconds"] == steps * st["seconds"] and t["basis"] == "step-time model"
    assert t["utilisation"] == st["mfu"] and t["gpu_hours"] == t["seconds"] * 64 / 3600
    assert t["tokens_per_second"] == p["tokens"]["total"] / t["seconds"]
    assert t["seconds_range"] == [t["seconds"] * STEP_TIME_ERROR[0], t["seconds"] * STEP_TIME_ERROR[1]]
    assert STEP_TIME_ERROR[0] < 1 < STEP_TIME_ERROR[1]
    line = next(x for x in render(config, p).splitlines() if "Wall-clock time" in x)
    low, high = (x / 86400 for x in t["seconds_range"])
    assert f"{t['days']:.1f} days   {low:.1f}-{high:.1f} days at the model's published-run error" in line
    assert f"MFU {st['mfu']:.3g} (step-time model)" in line
    assert "10th to 90th percentile" in ex.render()


@pytest.mark.parametrize("key", ["mfu", "hfu"])
def test_hardware_mfu_or_hfu_given_overrides_the_step_time_model(key):
    config = load_config(overrides=[*LLAMA3_8B_64_H100, f"hardware.{key}=0.4"])
    p, ex = plan_with_explain(config, advice=False)
    t, fl = p["time"], p["flops"]
    per_token = fl["per_token_hardware"] if key == "hfu" else fl["per_token"]
    assert t["seconds"] == pytest.approx(p["tokens"]["total"] * per_token / (64 * 989.4e12 * 0.4), rel=1e-12)
    assert t["seconds_range"] is None and t["utilisation"] == 0.4
    assert t["basis"] == f"hardware.{key} (override of the step-time model)"
    assert t["modelled_seconds"] == p["steps"]["total"] * p["step_time"]["seconds"] != t["seconds"]
    assert f"hardware.{key} (override of the step-time model)" in ex.render()  # --explain says so
    assert f"GPU-hours at hardware.{key} 0.4 (given)" in render(config, p)


def test_the_fastest_fit_layout_is_what_the_plan_of_that_layout_says():
    overrides = ["model.preset=llama3-8b", "parallel.gpus=8", "hardware.gpu=h100-sxm", "train.max_steps=1000"]
    best = fit(load_config(overrides=overrides), top=1)["candidates"][0]
    p = make_plan(load_config(overrides=[*overrides, *(f"{k}={v}" for k, v in best["overrides"].items())]))
    assert p["time"]["tokens_per_second"] == pytest.approx(best["tokens_per_s"], rel=1e-12)
    assert p["time"]["seconds"] == 1000 * best["step_time_s"]


@pytest.mark.parametrize("budget", [["model.preset=llama3-8b", "budget.gpu_hours=1000"], ["budget.days=14"]])
def test_budget_mode_buys_the_plans_own_time(budget):
    # A model given or chosen: the plan that follows takes the budget's GPU-hours by the step-time model,
    # within one optimizer step.
    p = make_plan(load_config(overrides=["hardware.gpu=a100-80gb", "parallel.gpus=8", *budget]))
    t, want = p["time"], p["budget"]["gpu_hours"]
    assert t["basis"] == "step-time model" and t["seconds"] == p["steps"]["total"] * p["step_time"]["seconds"]
    assert t["gpu_hours"] == pytest.approx(want, abs=t["gpu_hours"] / p["steps"]["total"])
