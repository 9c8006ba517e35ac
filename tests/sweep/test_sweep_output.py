"""The sweep's files and table from a hand-made result (no torch): CSV, JSON, table, plot axis."""

import json

from rich.console import Console

from pretrain.sweep import output


def cell(index, values, status="ok", **figures):
    base = {
        "cell": index,
        "values": values,
        "status": status,
        "plan_verdict": "fits",
        "it_per_s": None,
        "tokens_per_s": None,
        "achieved_tflops": None,
        "mfu": None,
        "memory_measured_bytes": None,
        "memory_planned_bytes": 3 * 1024**2,
        "memory_error_pct": None,
        "planned_tokens_per_s": 5e4,
        "tokens_per_step": 256,
        "step_seconds": None,
        "peak_tflops": 0.1,
        "loss": None,
        "seconds": 0.5,
        "error": None,
        "planned_mfu": 0.4,
        "planned_basis": "step-time model",
        "rounds": 0,
        "tokens_per_s_min": None,
        "tokens_per_s_max": None,
        "spread_pct": None,
        "noisy": False,
        "threads": 1,
    }
    return {**base, **figures}


def result(cells, swept):
    return {
        "device": "test CPU",
        "device_type": "cpu",
        "warmup_steps": 2,
        "steps": 3,
        "rounds": 3,
        "threads": 1,
        "swept": swept,
        "peak_tflops": {"fp32": {"tflops": 0.1, "source": "test"}},
        "memory_measured_as": "tensor count",
        "cells": cells,
        "files": {},
    }


OK = dict(
    it_per_s=40.0,
    tokens_per_s=10240.0,
    achieved_tflops=0.01,
    mfu=0.1,
    memory_measured_bytes=3 * 1024**2,
    memory_error_pct=0.0,
    step_seconds=0.025,
    loss=float("nan"),
    rounds=3,
    tokens_per_s_min=10000.0,
    tokens_per_s_max=10400.0,
    spread_pct=3.9,
    noisy=False,
)


def test_x_axis_is_the_numeric_key_with_most_values():
    swept = {
        "train.activation_checkpointing": ["none", "full"],
        "train.micro_batch_size": [1, 4],
        "train.seq_len": [32, 64, 128],
    }
    assert output.x_key(result([], swept)) == "train.seq_len"
    assert (
        output.x_key(result([], {"train.activation_checkpointing": ["none", "full"]}))
        == "train.activation_checkpointing"
    )
    assert output.x_key(result([], {})) is None


def test_column_names_shorten_unless_ambiguous():
    assert output.column_names(["train.seq_len", "model.dropout", "run.dir", "data.dir"]) == {
        "train.seq_len": "seq_len",
        "model.dropout": "dropout",
        "run.dir": "run.dir",
        "data.dir": "data.dir",
    }


def test_csv_json_and_table_with_every_status(tmp_path):
    swept = {"train.seq_len": [32, 64, 128, 256]}
    cells = [
        cell(0, {"train.seq_len": 32}, **OK),
        cell(1, {"train.seq_len": 64}, "OOM", error="OutOfMemoryError: x"),
        cell(2, {"train.seq_len": 128}, "skipped: does not fit", plan_verdict="does not fit"),
        cell(3, {"train.seq_len": 256}, "skipped: budget"),
    ]
    r = result(cells, swept)
    rows = output.to_csv(r).splitlines()
    assert rows[0].split(",")[:4] == ["cell", "train.seq_len", "status", "plan_verdict"]
    assert rows[2].startswith("1,64,OOM,fits,,")
    assert json.loads(output.to_json(r))["cells"][0]["loss"] == "nan"  # no bare NaN in the JSON
    console = Console(width=200, record=True)
    console.print(output.table(r))
    text = console.export_text()
    assert "status" in text and "skipped: budget" in text and "OOM" in text and "+0.0%" in text
    assert "median of 3 interleaved rounds, 1 CPU thread" in text and " 4% " in text
    files = output.write_all(r, tmp_path / "out")
    assert sorted(files) == ["csv", "json", "png"]
    assert (tmp_path / "out" / "sweep.png").read_bytes()[:4] == b"\x89PNG"
    assert sorted(p.name for p in (tmp_path / "out").iterdir()) == ["sweep.csv", "sweep.json", "sweep.png"]


def test_a_spread_above_ten_percent_is_a_warning_naming_the_cell():
    quiet = cell(0, {"train.seq_len": 32}, **OK)
    busy = cell(
        1,
        {"train.seq_len": 64},
        **{
            **OK,
            "tokens_per_s_min": 4.0e3,
            "tokens_per_s_max": 85.6e3,
            "tokens_per_s": 29.8e3,
            "spread_pct": 274.0,
            "noisy": True,
        },
    )
    [line] = output.noise_warnings([quiet, busy])
    assert line.startswith("warning: cell train.seq_len=64: tokens/s spread 274% over 3 rounds (4K to 85.6K)")
    console = Console(width=200, record=True)
    console.print(output.table(result([quiet, busy], {"train.seq_len": [32, 64]})))
    assert "274% !" in console.export_text() and "4% !" not in console.export_text()


def test_planned_lines_that_coincide_are_dashed_in_turn():
    # Two groups whose planned figures are equal (a swept key the plan does not see) drew one line over the
    # other: each group's dashes now start where the previous group's end, so both colours show.
    from pretrain.sweep.output import _interleaved

    assert _interleaved(0, 1) == "-"
    (a_start, (a_on, a_off)), (b_start, (b_on, _)) = _interleaved(0, 2), _interleaved(1, 2)
    assert a_start + a_on <= b_start < a_start + a_on + a_off and a_on == b_on
