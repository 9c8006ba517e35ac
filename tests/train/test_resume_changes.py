"""What a `--resume` of a Mixture-of-Experts run may change (checkpoint/compatibility.py): the experts'
shape and the router's score function are refused in one line naming the key, before any tensor loads (a
changed shape was a 55-line traceback from the state-dict load); top-k and document masking go on, said in one
line and a `settings_changed` event (they changed silently before)."""

import json
import shutil

import pytest

from support import finished_run, run_here, tiny

pytest.importorskip("torch")

MOE = ("model.preset=moe-debug", "train.max_steps=6")


@pytest.fixture(scope="module")
def stopped(prepared, tmp_path_factory):
    """moe-debug (8 experts of width 32, top-2, softmax, blocks.0 dense) stopped after step 2, with its checkpoint."""
    run_dir = tmp_path_factory.mktemp("moe") / "run"
    return finished_run(run_dir, *tiny(prepared, run_dir, *MOE, "debug.stop_after_step=2"))


def files(run_dir):
    return {p: p.read_bytes() for p in sorted(run_dir.rglob("*")) if p.is_file() and p.name != ".lock"}


@pytest.mark.parametrize(
    "override, words",
    [
        ("model.num_experts=4", "model.num_experts: 4 here, but checkpoint"),
        ("model.moe_intermediate_size=16", "model.moe_intermediate_size: 16 here"),
        ("model.num_shared_experts=1", "model.num_shared_experts: 1 here"),
        ("model.first_dense_layers=0", "model.first_dense_layers: 0 here"),
        ("model.router=sigmoid", "learnt to score with softmax"),
    ],
)
def test_a_changed_experts_shape_or_router_is_one_line_and_changes_nothing(stopped, override, words):
    before = files(stopped)
    r = run_here("train", "--resume", stopped, override)
    lines = r.stderr.strip().splitlines()
    assert r.returncode == 2 and len(lines) == 1, r.stderr[-2000:]
    assert words in lines[0] and "step_00000002" in lines[0] and "start a new run.dir" in lines[0], lines[0]
    assert files(stopped) == before


def test_other_top_k_and_document_masking_go_on_said_in_one_line_and_an_event(stopped, tmp_path):
    run_dir = shutil.copytree(stopped, tmp_path / "run")
    r = run_here(
        "train",
        "--resume",
        run_dir,
        "model.experts_per_token=3",
        "train.document_masking=true",
        "debug.stop_after_step=3",
    )
    assert r.returncode == 0, r.stderr[-2000:]
    said = [x for x in r.stdout.splitlines() if x.startswith("resumed with other settings")]
    assert len(said) == 1 and "model.experts_per_token 2 -> 3, train.document_masking false -> true" in said[0]
    events = [json.loads(x) for x in (run_dir / "events.jsonl").read_text().splitlines()]
    (changed,) = [e for e in events if e["event"] == "settings_changed"]
    assert changed["changes"] == [
        {"key": "model.experts_per_token", "before": 2, "after": 3},
        {"key": "train.document_masking", "before": False, "after": True},
        {"key": "model.position_reset", "before": False, "after": True},  # unset: as document masking
    ]
    # a plain resume of the same settings says nothing more
    again = run_here("train", "--resume", run_dir, "debug.stop_after_step=4")
    assert again.returncode == 0 and "other settings" not in again.stdout, again.stderr[-2000:]
