"""A tiny trained run and its Hugging Face export, shared by the evaluation tests; a small local task."""

import pytest

from support import finished_run, run_cli, tiny, write_mc_task


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
    return write_mc_task(tmp_path_factory.mktemp("task") / "python_mc.jsonl")
