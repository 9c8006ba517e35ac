"""A tiny trained run and its Hugging Face export, shared by the evaluation tests; a small local task."""

import json

import pytest

from support import finished_run, run_cli, tiny

# Short multiple-choice examples in the words of the sample corpus (Python's documentation): choices of
# different lengths, so that acc and acc_norm can disagree.
EXAMPLES = [
    ("The for statement", [" iterates over the items of any sequence", " is a fish", " returns"], 0),
    ("A function is defined with the keyword", [" def", " class", " import", " banana"], 0),
    ("Python is an interpreted", [" language", " mountain range in the north"], 0),
    ("To read a file, call", [" open()", " the doctor", " sleep"], 0),
    ("The dictionary maps keys to", [" values", " trees", " nothing at all today"], 0),
    ("An exception is raised when", [" an error occurs", " the sun sets"], 1),
    ("Lists are", [" mutable sequences", " purple"], 0),
    ("The module", [" os", " sys", " provides functions for the operating system"], 2),
    ("import", [" os", " the"], 1),
    ("A class defines", [" a new type of object", " a river"], 0),
    ("Strings in Python are", [" immutable", " loud", " made of glass"], 0),
    ("The return statement", [" exits a function", " is green"], 1),
]


@pytest.fixture(scope="session")
def run_and_export(prepared, tmp_path_factory):
    """A 6-step tiny run and `pretrain export RUN --to hf`."""
    root = tmp_path_factory.mktemp("eval")
    run_dir = finished_run(root / "run", *tiny(prepared, root / "run", "train.max_steps=6", "run.eval_every=0"))
    r = run_cli("export", run_dir, "--to", "hf", root / "hf")
    assert r.returncode == 0, r.stderr
    return run_dir, root / "hf"


@pytest.fixture(scope="session")
def local_task(tmp_path_factory):
    path = tmp_path_factory.mktemp("task") / "python_mc.jsonl"
    path.write_text("".join(json.dumps({"context": c, "choices": ch, "gold": g}) + "\n" for c, ch, g in EXAMPLES))
    return path
