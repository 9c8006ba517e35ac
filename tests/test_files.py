"""A file a config names is read only as a regular file of at most a stated size (files.read_bounded): a
device, a FIFO or a huge sparse file is one line and exit 2 at once, or, where the planner goes on without
the file (a data.dir not prepared yet, a task file it cannot size), the plan goes on. Real processes on real
special files, under an address-space limit, so a reader that takes /dev/zero whole fails here, not the machine."""

import json
import os
import resource
import subprocess
import sys
import time

import pytest


def limited(*args: str, code: str | None = None) -> subprocess.CompletedProcess:
    """`pretrain ARGS` (or `python -c CODE`) with 2 GiB of address space and 30 s: reading /dev/zero or the
    sparse file whole ends in MemoryError, waiting on a FIFO in a timeout, each a failure of the test."""

    def limit():
        resource.setrlimit(resource.RLIMIT_AS, (2 << 30, 2 << 30))

    command = [sys.executable, "-c", code] if code else [sys.executable, "-m", "pretrain", *args]
    return subprocess.run(command, capture_output=True, text=True, timeout=30, preexec_fn=limit)


@pytest.fixture(scope="module")
def special(tmp_path_factory):
    """{"fifo": a FIFO nobody writes, "sparse": a 10 GiB file of no blocks, "zero": /dev/zero}."""
    folder = tmp_path_factory.mktemp("special")
    os.mkfifo(folder / "fifo.json")
    with open(folder / "sparse.json", "wb") as f:
        f.truncate(10 << 30)
    return {"fifo": folder / "fifo.json", "sparse": folder / "sparse.json", "zero": "/dev/zero"}


WHAT = {"fifo": "a FIFO (named pipe), not a regular file", "zero": "a character device, not a regular file"}


@pytest.mark.parametrize("kind", ["zero", "fifo", "sparse"])
def test_a_config_path_is_one_line_and_exit_2_at_once(special, kind):
    path = special[kind]
    what = WHAT.get(kind, f"{10 << 30:,} bytes, over the 16 MiB a config file may hold")  # files.MAX_CONFIG_BYTES
    for args, key in (
        ((f"model.hf_config={path}",), "model.hf_config"),
        (("model.preset=gpt2", f"hardware.profile={path}"), "hardware.profile"),
        ((str(path),), "config file"),
        *([((f"model.hf_config={path}", "--serve", "--port", "0"), "model.hf_config")] if kind == "fifo" else []),
    ):  # the page's start, once
        began = time.perf_counter()
        r = limited("plan", *args)
        assert r.returncode == 2 and r.stderr.count("\n") == 1, (args, r.stderr[-2000:])
        assert r.stderr.startswith(f"pretrain plan: error: {key}") and f"({what})" in r.stderr, r.stderr
        assert time.perf_counter() - began < 20


def test_the_planner_goes_on_without_a_special_meta_json_or_task_file(special, tmp_path):
    """data.dir, a data.mixture source and run.eval_tasks name files the planner reads when they are there and
    plans without otherwise: a FIFO or a huge file there is the same as none."""
    for kind in ("fifo", "sparse"):
        dataset = tmp_path / kind
        dataset.mkdir()
        os.symlink(special[kind], dataset / "meta.json")
        os.symlink(special[kind], tmp_path / f"{kind}.jsonl")
        tasks = f"run.eval_tasks=[{tmp_path / f'{kind}.jsonl'}]"
        for items in ((f"data.dir={dataset}", tasks), (f"data.mixture=[{{dir: {dataset}, weight: 1}}]",)):
            r = limited("plan", "model.preset=gpt2", "train.max_steps=100", *items, "--json")
            assert r.returncode == 0, (items, r.stderr[-2000:])
            json.loads(r.stdout)


def test_the_trainers_meta_json_is_read_bounded_too(special, tmp_path):
    (tmp_path / "meta.json").symlink_to(special["sparse"])
    code = (
        "from pretrain.data.loader import PreparedData\n"
        "from pretrain.errors import UsageError\n"
        f"try: PreparedData({str(tmp_path)!r})\n"
        "except UsageError as e: print(e)"
    )
    r = limited(code=code)
    assert r.returncode == 0, r.stderr[-2000:]
    assert r.stdout.startswith(f"{tmp_path / 'meta.json'}: cannot read it (") and "over the 16 MiB" in r.stdout


def test_json_nested_past_the_parser_is_one_line(tmp_path):
    deep = tmp_path / "config.json"
    deep.write_text("[" * 100_000 + "]" * 100_000)
    huge = tmp_path / "huge.json"
    huge.write_text('{"model_type": "llama", "hidden_size": ' + "9" * 5000 + "}")
    for path, why in ((deep, "nested too deeply"), (huge, "a number of more digits than Python reads")):
        r = limited("plan", f"model.hf_config={path}")
        assert r.returncode == 2 and r.stderr.count("\n") == 1, r.stderr[-2000:]
        assert f"is not a config ({why})" in r.stderr
