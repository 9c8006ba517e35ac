import json

import pytest

from pretrain import units
from pretrain.errors import UsageError
from pretrain.report.runs import read_run, summarize, summary_line


def test_later_line_for_a_step_replaces_the_earlier_one(run_dir):
    run = read_run(run_dir)
    steps = [r["step"] for r in run.train]
    assert steps == list(range(1, 301))  # 180-200 and 240-250 were written twice; 301 is half-written
    # the diverged branch had +3.0 on the loss at steps 191-200; the replay after the rollback does not
    assert run.train[194]["loss"] < 4.0
    assert len(run.series("loss")[0]) == 299  # the NaN loss of step 100 is left out of the curve
    assert [r["step"] for r in run.evals] == [50, 100, 150, 200, 250, 300]


def test_lines_past_a_rollback_that_was_not_replayed_are_dropped(tmp_path):
    # Trained to step 11 (eval at 10), rolled back to step 8, stopped at step 10: steps 11 and the eval at 10
    # belong to the abandoned branch, the step-9 and step-10 lines to the one the run is on.
    rows = [{"step": s, "tokens": s, "loss": 5.0} for s in range(1, 12)]
    rows.insert(10, {"step": 10, "tokens": 10, "val_loss": 5.5})
    rows += [{"step": s, "tokens": s, "loss": 4.0} for s in (9, 10)]
    (tmp_path / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    run = read_run(tmp_path)
    assert [(r["step"], r["loss"]) for r in run.train] == [(s, 5.0) for s in range(1, 9)] + [(9, 4.0), (10, 4.0)]
    assert run.evals == []
    assert summarize(run)["last_step"] == 10


def test_summary_of_a_run(run_dir):
    s = summarize(read_run(run_dir))
    assert s["last_step"] == 300
    assert s["best_val_step"] == 300 and 3.3 < s["best_val_loss"] < 3.5
    assert 50_000 < s["tokens_per_s_median"] < 54_000
    # checkpoints and the preemption are not counted
    assert s["events"] == {"nonfinite_skip": 1, "spike": 1, "rollback": 1, "resumed": 1}
    assert s["model"] == "gpt2: hidden 768, layers 12, heads 12, vocab 50257, context 1024"
    line = summary_line(s)
    assert line.startswith("gpt2-small: step 300, 34.7M tokens, train loss 3.")
    assert "52" in line and "K tokens/s median" in line


def test_a_run_that_has_just_started(tmp_path):
    # three lines on a CPU (mfu and peak memory null), no optional files, a torn line in the middle
    lines = [
        {
            "step": s,
            "tokens": 4096 * s,
            "loss": 10.8 - 0.1 * s,
            "lr": 1e-5 * s,
            "batch_tokens": 4096,
            "grad_norm": 1.0,
            "tokens_per_s": 900.0,
            "mfu": None,
            "peak_mem_bytes": None,
            "time": s,
        }
        for s in (1, 2, 3)
    ]
    text = [json.dumps(x) for x in lines]
    text.insert(1, '{"step": 9, "tokens": 1{"step": 2')  # a line cut by a crash, glued to the next write
    (tmp_path / "metrics.jsonl").write_text("\n".join(text) + "\n")
    run = read_run(tmp_path, name="live")
    assert [r["step"] for r in run.train] == [1, 2, 3]
    assert run.series("mfu") == ([], []) and run.series("val_loss") == ([], [])
    assert (run.events, run.plan_vs_run, run.config) == ([], None, None)
    s = summarize(run)
    assert s["best_val_loss"] is None and s["model"] is None
    assert summary_line(s) == "live: step 3, 12.3K tokens, train loss 10.5, 900 tokens/s median"


def test_empty_metrics_file(tmp_path):
    (tmp_path / "metrics.jsonl").write_text("")
    s = summarize(read_run(tmp_path, name="new"))
    assert summary_line(s) == "new: no training steps logged yet"


def test_unreadable_optional_files_become_notes(run_dir):
    (run_dir / "plan_vs_run.json").write_text('{"rows": [')
    (run_dir / "config.yaml").write_text("model: [unclosed")
    run = read_run(run_dir)
    assert run.plan_vs_run is None and run.config is None
    assert [n.split(":")[0] for n in run.notes] == ["plan_vs_run.json", "config.yaml"]


def test_bad_run_dirs(tmp_path):
    with pytest.raises(UsageError, match="no such run directory"):
        read_run(tmp_path / "missing")
    with pytest.raises(UsageError, match="metrics.jsonl: not found"):
        read_run(tmp_path)


@pytest.mark.parametrize(
    "value, text",
    [
        (None, "-"),
        (950, "950"),
        (1500, "1.5K"),
        (34_652_160, "34.7M"),
        (2.1e9, "2.1B"),
        (1.4e12, "1.4T"),
    ],
)
def test_human(value, text):
    assert units.human(value) == text


def test_number():
    # `pretrain train` writes a non-finite loss in events.jsonl as a string
    assert [units.number(v) for v in (3.28219, None, "nan", float("inf"))] == ["3.282", "-", "nan", "inf"]


@pytest.mark.parametrize(
    "value, unit, text",
    [
        (21.4 * 1024**3, "bytes", "21.40 GiB"),
        (497_759_232, "bytes", "474.7 MiB"),
        (0.385, "fraction", "38.5 %"),
        (52_000, "tokens/s", "52K tokens/s"),
        (1.25, "s", "1.25 s"),
        (None, "bytes", "-"),
    ],
)
def test_quantity(value, unit, text):
    assert units.quantity(value, unit) == text
