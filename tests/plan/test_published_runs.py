"""The step-time model against published, measured training runs (tests/plan/published_runs.yaml: the shared
golden sets' 25 dense and 9 Mixture-of-Experts cases and our own, each with its citation), scored in process as
benchmarks/published_runs.py prints it. Issue #32's targets hold on the dense runs, issue #41's on the MoE runs;
a ratchet at today's level keeps the model from getting worse."""

import importlib.util
import math

import pytest

from support import ROOT

_spec = importlib.util.spec_from_file_location("published_runs", ROOT / "benchmarks" / "published_runs.py")
published = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(published)

# Measured 2026-11-26 (benchmarks/published_runs.py): 21 of 41 within +-15 %, median |log ratio| 0.137 before
# Hopper's GEMM share was fitted; then 29, 0.105, ratios 0.64-1.27; then (FSDP per pipeline stage, async TP,
# Megatron's default dropout in the SC21 rows) 32 of 41, 0.092, 0.72-1.25; then attention by head dimension:
# median 0.081.
# Then (issue #41: the busiest pipeline stage sets the pace, the output layer on the last; Llama 3's and BLOOM's
# balanced splits) 33 of 41, 0.081.
# Raise these as the model improves; never lower them to pass.
WITHIN_15_TODAY = 33 / 41
MEDIAN_ABS_LOG_TODAY = 0.081
RATCHET_RANGE = (0.7, 1.3)  # today's range rounded outwards; the issue's is x0.67-x1.5
# Mixture-of-Experts (issue #41), measured 2026-11-28: before the dispatch, grouped-GEMM and pipeline-stage terms
# the shared golden set's 8 planned cases had none within +-15 % and a median |log ratio| of 0.597; then 9 of 16,
# 0.105; the folded expert-parallel groups' merge 7 of 16, 0.171. Then (the routed part's recomputation counted,
# the overlapped exchanges behind the other micro-batch's whole work, DeepSeek-V3's overlap, node-limited routing
# and MTP module, the busiest rank's load from its experts') 11 of 16, 0.078.
MOE_WITHIN_15_TODAY = 11 / 16
MOE_MEDIAN_ABS_LOG_TODAY = 0.078


@pytest.fixture(scope="module")
def cases():
    return published.load_cases()


@pytest.fixture(scope="module")
def scored(cases):
    return [published.score(c) for c in cases]


@pytest.fixture(scope="module")
def rows(scored):
    """The dense runs: issue #32's set."""
    return [r for r in scored if not r["moe"]]


@pytest.fixture(scope="module")
def moe_rows(scored):
    return [r for r in scored if r["moe"]]


def test_every_case_is_cited_and_complete(cases):
    ids = [c["id"] for c in cases]
    assert len(ids) == len(set(ids))
    assert sum(c["origin"] == "golden" for c in cases) == 25 + 9 and sum(c["origin"] == "own" for c in cases) >= 8 + 7
    for c in cases:
        assert c["origin"] in ("golden", "own") and c["tier"] in ("A", "B"), c["id"]
        where = (
            c["source"].get("commit") or c["source"].get("paper") or c["source"].get("pr") or c["source"].get("issue")
        )
        assert c["source"].get("url") and where, c["id"]
        assert c["framework"] and c["hardware"] and c["layout"] and c["notes"], c["id"]
        m = c["measured"]
        assert m.get("tokens_per_s_per_gpu", 0) > 0 or 0 < m.get("mfu", 0) < 1, c["id"]


def test_the_model_is_no_worse_than_today(rows):
    lo, hi = RATCHET_RANGE
    outside = {r["id"]: round(r["ratio"], 2) for r in rows if not lo <= r["ratio"] <= hi}
    assert not outside, f"planned / measured beyond x{lo}-x{hi}: {outside}"
    s = published.summary(rows)
    assert s["within_15"] >= WITHIN_15_TODAY - 1e-9, s
    assert s["median_abs_log"] <= MEDIAN_ABS_LOG_TODAY + 5e-4, s


def test_issue_32_targets(rows):
    s = published.summary(rows)
    lo, hi = published.TARGET_RANGE
    worst = max(rows, key=lambda r: abs(math.log(r["ratio"])))
    assert s["within_15"] >= published.TARGET_WITHIN_15, s
    assert s["median_abs_log"] <= published.TARGET_MEDIAN_ABS_LOG, s
    assert lo <= worst["ratio"] <= hi, (worst["id"], worst["ratio"])


def test_the_plans_time_range_is_the_models_measured_error(rows, moe_rows):
    # The plan's Wall-clock range (pretrain.plan.length.STEP_TIME_ERROR) is the 10th and 90th percentile of
    # these ratios: a retuned model must carry its own error, not the old one's.
    import statistics

    from pretrain.plan.length import MOE_STEP_TIME_ERROR, STEP_TIME_ERROR

    deciles = statistics.quantiles([r["ratio"] for r in rows], n=10)
    assert STEP_TIME_ERROR == (round(deciles[0], 2), round(deciles[-1], 2))
    moe = statistics.quantiles([r["ratio"] for r in moe_rows], n=10)  # an MoE plan carries the MoE runs' error
    assert MOE_STEP_TIME_ERROR == (round(moe[0], 2), round(moe[-1], 2))


def test_every_moe_case_plans_within_issue_41s_median(moe_rows):
    # Every published layout plans (a layout the planner's expert-parallel rule still refuses, EP beyond the
    # data-parallel degree, is planned with its fallback_overrides until that rule goes: counted here).
    assert len(moe_rows) == 16
    s = published.summary(moe_rows)
    assert s["median_abs_log"] <= published.MOE_TARGET_MEDIAN_ABS_LOG, s


def test_issue_41_share_within_15(moe_rows):
    s = published.summary(moe_rows)
    assert s["within_15"] >= published.MOE_TARGET_WITHIN_15 - 1e-9, s


def test_the_moe_model_is_no_worse_than_today(moe_rows):
    s = published.summary(moe_rows)
    assert s["within_15"] >= MOE_WITHIN_15_TODAY - 1e-9, s
    assert s["median_abs_log"] <= MOE_MEDIAN_ABS_LOG_TODAY + 5e-4, s
