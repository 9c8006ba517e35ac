"""`pretrain report` as a user runs it: a subprocess, exit codes, one line on stderr for bad input."""

import subprocess
import sys


def pretrain(*args, cwd=None):
    return subprocess.run(
        [sys.executable, "-m", "pretrain", "report", *map(str, args)],
        cwd=cwd,
        capture_output=True,
        text=True,
        timeout=60,
    )


def test_report_of_two_runs_prints_paths_and_summaries(tmp_path, run_dir, make_run):
    make_run(tmp_path / "other", steps=80, seed=2)
    result = pretrain(run_dir, tmp_path / "other", cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    lines = result.stdout.splitlines()
    assert lines[:2] == ["wrote report/report.png", "wrote report/report.html"]  # ./report for several runs
    assert lines[2].startswith("gpt2-small: step 300, ") and lines[3].startswith("other: step 80, ")
    assert (tmp_path / "report" / "report.html").is_file()


def test_missing_run_dir_is_one_line_and_exit_2(tmp_path):
    result = pretrain(tmp_path / "nope")
    assert result.returncode == 2
    assert result.stderr.splitlines() == [
        f"pretrain report: error: {tmp_path / 'nope'}: no such run directory; pass the run.dir of a "
        "`pretrain train` run"
    ]


def test_dir_without_metrics_is_one_line_and_exit_2(tmp_path):
    result = pretrain(tmp_path)
    assert result.returncode == 2
    [line] = result.stderr.splitlines()
    assert str(tmp_path / "metrics.jsonl") in line and "not found" in line


def test_unwritable_out_is_one_line_and_exit_2(tmp_path, run_dir):
    (tmp_path / "a-file").write_text("")
    result = pretrain(run_dir, "--out", tmp_path / "a-file")
    assert result.returncode == 2
    [line] = result.stderr.splitlines()
    assert "cannot write the report" in line and "--out" in line


def test_help_stays_light():
    # `pretrain --help` imports every command module: this one must not pull in matplotlib or numpy
    code = (
        "import sys, pretrain.cli; pretrain.cli.build_parser(); "
        "print(sorted(m for m in ('matplotlib', 'numpy', 'yaml') if m in sys.modules))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "[]"


def test_a_report_replaces_only_the_files_it_wrote(tmp_path, run_dir):
    # a directory of the user's own, holding files of the report's names: refused, nothing touched
    mine = tmp_path / "mine"
    mine.mkdir()
    own = {"report.html": b"<p>my notes</p>", "report.png": b"my figure", "loss.png": b"my loss plot"}
    for name, data in own.items():
        (mine / name).write_bytes(data)
    result = pretrain(run_dir, "--out", mine, "--per-panel")
    assert result.returncode == 2
    [line] = result.stderr.splitlines()
    assert f"{mine} holds report.png, report.html, loss.png, which pretrain report did not write" in line
    assert {p.name: p.read_bytes() for p in mine.iterdir()} == own
    # its own directory: a second report replaces what the first wrote, and leaves a user's file beside them
    ours = tmp_path / "ours"
    assert pretrain(run_dir, "--out", ours).returncode == 0
    (ours / "notes.txt").write_text("mine")
    (ours / "report.html").write_text("an edit of ours-7f3a")
    result = pretrain(run_dir, "--out", ours)
    assert result.returncode == 0, result.stderr
    assert (ours / "notes.txt").read_text() == "mine" and "ours-7f3a" not in (ours / "report.html").read_text()
