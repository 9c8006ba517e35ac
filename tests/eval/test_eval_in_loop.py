"""run.eval_tasks: downstream tasks scored in the loop, one metrics.jsonl line per evaluation, none lost or
duplicated across a rollback and a stop + resume; the numbers are `pretrain eval`'s; the report's panel."""

import json

import pytest

from support import run_cli, tiny

torch = pytest.importorskip("torch")


def test_task_rows_survive_a_rollback_and_a_resume_once_each(prepared, local_task, tmp_path):
    run_dir = tmp_path / "run"
    # Micro-batch 14 (step 8) is NaN: a rollback to step 4's checkpoint; the run then stops after step 9.
    args = tiny(
        prepared,
        run_dir,
        f"run.eval_tasks=[{local_task}]",
        "run.eval_tasks_every=2",
        "run.eval_every=0",
        "debug.inject_nan_batches=[14]",
    )
    first = run_cli("train", *args, "debug.stop_after_step=9")
    assert first.returncode == 0, first.stderr
    assert "python_mc acc_norm" in first.stdout
    second = run_cli("train", "--resume", run_dir, "debug.stop_after_step=0")
    assert second.returncode == 0, second.stderr

    written = [json.loads(x) for x in (run_dir / "metrics.jsonl").read_text().splitlines()]
    task_steps = [r["step"] for r in written if "eval/python_mc/acc" in r]
    assert task_steps.count(6) == 2  # logged before the rollback and again after it: the test has teeth
    from pretrain.report.runs import read_run

    run = read_run(run_dir)
    assert [r["step"] for r in run.tasks] == [2, 4, 6, 8, 10, 12]  # the last one: the end of the run
    assert [r["step"] for r in run.evals] == [12]  # the validation line is not taken for a task line
    final = run.tasks[-1]
    assert final["tokens"] == run.train[-1]["tokens"] and final["eval/python_mc/chance"] == pytest.approx(
        sum(1 / n for n in (3, 4, 2, 3, 3, 2, 2, 3, 2, 2, 3, 2)) / 12
    )

    # The in-loop numbers are pretrain eval's on the final checkpoint.
    r = run_cli("eval", run_dir, "--tasks", local_task, "--json")
    assert r.returncode == 0, r.stderr
    ours = json.loads(r.stdout)["tasks"]["python_mc"]
    for metric in ("acc", "acc_norm", "acc_bytes"):
        assert final[f"eval/python_mc/{metric}"] == ours[metric]
    assert final["eval/python_mc/bits_per_byte"] == pytest.approx(ours["bits_per_byte"], rel=1e-5)

    from pretrain.report import make_report

    files = make_report(run_dir, tmp_path / "report")["files"]
    assert str(tmp_path / "report" / "tasks.png") in files
    assert 'alt="downstream tasks"' in (tmp_path / "report" / "report.html").read_text()
    # report.png closes its grid with the task's panel: one more row of panels (3.3 inches at 100 dpi) than the
    # seven panels and the legend take
    from pretrain.report.plots import PANELS

    height = int.from_bytes((tmp_path / "report" / "report.png").read_bytes()[20:24], "big")  # PNG's IHDR
    assert height == round(330 * -(-(len(PANELS) + 1 + 1) // 2)) > round(330 * -(-(len(PANELS) + 1) // 2))


def test_unknown_task_names_are_refused_before_training():
    from pretrain.config import load_config
    from pretrain.errors import ConfigError

    with pytest.raises(ConfigError, match="run.eval_tasks: unknown task 'hellaswagg'"):
        load_config(None, ["run.eval_tasks=[hellaswagg]"])
