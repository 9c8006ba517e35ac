"""zstandard (.zst inputs) and datatrove (`prepare --tasks`) are optional: without them the package imports,
`pretrain prepare` and `train` work, and asking for what needs them is one line and exit 2 (the GPU image has
neither). The interpreter here has both, so each run blocks them the way Python reports a missing module:
`sys.modules[name] = None` makes `import name` raise ModuleNotFoundError."""

import subprocess
import sys

from support import tiny

BLOCK = (
    "import runpy, sys\n"
    "for name in ('zstandard', 'datatrove'):\n"
    "    sys.modules[name] = None\n"
    "sys.argv = ['pretrain', *sys.argv[1:]]\n"
    "runpy.run_module('pretrain', run_name='__main__')\n"
)


def without_them(*args):
    return subprocess.run([sys.executable, "-c", BLOCK, *map(str, args)], capture_output=True, text=True, timeout=300)


def test_prepare_and_train_run_without_zstandard_and_datatrove(tmp_path, prepared):
    corpus = prepared.parent / "corpus"
    r = without_them("tokenizer", "train", "--input", corpus, "--vocab-size", 512, "--out", tmp_path / "tok")
    assert r.returncode == 0, r.stderr
    r = without_them(
        "prepare",
        "--input",
        corpus,
        "--tokenizer",
        tmp_path / "tok",
        "--out",
        tmp_path / "data",
        "--val-fraction",
        0.1,
        "--workers",
        1,
    )
    assert r.returncode == 0, r.stderr
    r = without_them("train", *tiny(tmp_path / "data", tmp_path / "run", "train.max_steps=3", "run.eval_every=0"))
    assert r.returncode == 0, r.stderr
    assert "zstandard" not in r.stderr and "datatrove" not in r.stderr


def test_a_zst_input_without_zstandard_is_one_line(tmp_path, prepared):
    (tmp_path / "in").mkdir()
    (tmp_path / "in" / "a.jsonl.zst").write_bytes(b"\x28\xb5\x2f\xfd")  # never read: refused first
    for command in (
        ["prepare", "--out", tmp_path / "out"],
        ["tokenizer", "train", "--vocab-size", 300, "--out", tmp_path / "tok"],
    ):
        extra = ["--tokenizer", prepared / "tokenizer"] if command[0] == "prepare" else []
        r = without_them(*command, "--input", tmp_path / "in", *extra)
        assert r.returncode == 2, r.stderr
        assert r.stderr.count("\n") == 1 and "a.jsonl.zst" in r.stderr and "pip install zstandard" in r.stderr
    assert not (tmp_path / "out").exists()


def test_prepare_tasks_without_datatrove_is_one_line(tmp_path, prepared):
    r = without_them(
        "prepare",
        "--input",
        prepared.parent / "corpus",
        "--tokenizer",
        prepared / "tokenizer",
        "--out",
        tmp_path / "out",
        "--tasks",
        2,
    )
    assert r.returncode == 2, r.stderr
    assert r.stderr.count("\n") == 1 and "pip install datatrove" in r.stderr and "--tasks" in r.stderr
    assert not (tmp_path / "out").exists()
