"""Training on a 70/30 mixture of the two vendored corpora: tokens per source in every metrics line, validation
per source, bitwise-exact resume after a SIGKILL, the repetition warning, and one-line refusals of bad
mixtures."""

import json

import pytest

from support import ROOT, finished_run, losses, params, run_cli, run_here, start, tiny, wait_for_steps

torch = pytest.importorskip("torch")


def mixture(two_corpora, shakespeare="weight: 0.7", zh="weight: 0.3"):
    return f"data.mixture=[{{dir: {two_corpora['shakespeare']}, {shakespeare}}}, {{dir: {two_corpora['zh']}, {zh}}}]"


def mixed(two_corpora, run_dir, *extra):
    """The tiny run's overrides with the mixture in place of data.dir."""
    return [a for a in tiny("unused", run_dir) if not a.startswith("data.dir=")] + [mixture(two_corpora), *extra]


def rows(run_dir):
    return [json.loads(x) for x in (run_dir / "metrics.jsonl").read_text().splitlines()]


@pytest.fixture(scope="module")
def uninterrupted(two_corpora, tmp_path_factory):
    run_dir = tmp_path_factory.mktemp("mixture") / "run"
    return finished_run(run_dir, *mixed(two_corpora, run_dir))


def test_every_training_line_carries_tokens_per_source_and_validation_is_per_source(uninterrupted):
    train = [r for r in rows(uninterrupted) if "loss" in r]
    assert [r["step"] for r in train] == list(range(1, 13))
    for r in train:  # every window is seq_len tokens: the sources add up to the tokens trained on
        assert set(r["source_tokens"]) == {"shakespeare", "zh"}
        assert sum(r["source_tokens"].values()) == r["tokens"]
    last = train[-1]["source_tokens"]
    assert abs(last["shakespeare"] / train[-1]["tokens"] - 0.7) < 0.02  # 96 windows: within one or two
    val = [r for r in rows(uninterrupted) if "val_loss" in r]
    assert [r["step"] for r in val] == [6, 12]
    for r in val:  # the mixture-weighted mean of the sources' losses
        assert r["val_loss"] == pytest.approx(0.7 * r["val_loss/shakespeare"] + 0.3 * r["val_loss/zh"])
        assert r["val_loss/shakespeare"] != r["val_loss/zh"]
    events = b"".join(p.read_bytes() for p in (uninterrupted / "tensorboard").iterdir())
    assert b"source_tokens/shakespeare" in events and b"val_loss/zh" in events  # TensorBoard's scalar tags


def test_sigkill_then_resume_is_bitwise_identical(two_corpora, uninterrupted, tmp_path):
    run_dir = tmp_path / "run"
    proc = start(["train", *mixed(two_corpora, run_dir, "debug.step_sleep=0.3")])
    try:
        wait_for_steps(run_dir, 6, proc)  # past the checkpoint of step 4, before the one of step 8
        proc.kill()
        proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert max(losses(run_dir)) < 12
    r = run_cli("train", "--resume", run_dir, "debug.step_sleep=0")
    assert r.returncode == 0, r.stderr
    assert "resumed from" in r.stdout
    assert losses(run_dir) == losses(uninterrupted)
    assert [r["source_tokens"] for r in rows(run_dir) if "loss" in r][-1] == [
        r["source_tokens"] for r in rows(uninterrupted) if "loss" in r
    ][-1]
    pa, pb = params(run_dir), params(uninterrupted)
    assert all(torch.equal(pa[k], pb[k]) for k in pa)


def test_a_source_past_four_epochs_is_warned_about_once_with_the_evidence(two_corpora, tmp_path):
    """Shakespeare at seq_len 256 has 130 windows: 90 % of 8 windows a step, all 8 once zh is spent at its cap,
    passes 4 epochs near step 71."""
    run_dir = tmp_path / "run"
    args = [a for a in mixed(two_corpora, run_dir) if not a.startswith("data.mixture")]
    r = run_here(
        "train",
        *args,
        mixture(two_corpora, "weight: 0.9", "weight: 0.1, max_epochs: 0.2"),
        "train.seq_len=256",
        "train.max_steps=80",
        "run.eval_every=0",
        "run.checkpoint_every=0",
    )
    assert r.returncode == 0, r.stderr
    warnings = [x for x in r.stdout.splitlines() if x.startswith("warning: mixture source")]
    assert len(warnings) == 2, r.stdout
    assert "'zh' reached its max_epochs" in warnings[0] and "cap 0.2" in warnings[0]
    assert "'shakespeare' is past 4 epochs" in warnings[1] and "Muennighoff et al. 2023" in warnings[1]
    assert "Scaling Data-Constrained Language Models" in warnings[1]
    events = [json.loads(x) for x in (run_dir / "events.jsonl").read_text().splitlines()]
    (past,) = [e for e in events if e["event"] == "mixture_epochs" and e["source"] == "shakespeare"]
    assert 4 < past["epochs"] < 4.1 and past["cap"] == 4


@pytest.mark.parametrize(
    "entries, words",
    [
        ("[{dir: A, weight: 0.7}, {dir: B, weight: 0}]", ["data.mixture[1].weight", "> 0"]),
        ("[{dir: A, weight: 1}, {dir: A, weight: 1}]", ["two sources are named"]),
        ("[{dir: A, weigth: 1}]", ["did you mean data.mixture[0].weight"]),
        ("[{dir: A, weight: 1, max_epochs: -1}]", ["max_epochs", "> 0"]),
    ],
)
def test_a_bad_mixture_is_one_line_and_exit_2(two_corpora, tmp_path, entries, words):
    entries = entries.replace("A", str(two_corpora["shakespeare"])).replace("B", str(two_corpora["zh"]))
    args = [a for a in mixed(two_corpora, tmp_path / "run") if not a.startswith("data.mixture")]
    r = run_here("train", *args, f"data.mixture={entries}")
    assert r.returncode == 2, r.stderr
    (line,) = r.stderr.strip().splitlines()
    assert all(w in line for w in words), line


def test_mixture_with_data_dir_or_another_tokenizer_is_refused(two_corpora, prepared, tmp_path):
    r = run_here("train", *mixed(two_corpora, tmp_path / "run", f"data.dir={prepared}"))
    assert r.returncode == 2
    (line,) = r.stderr.strip().splitlines()
    assert "exclusive with data.dir" in line
    args = [a for a in mixed(two_corpora, tmp_path / "run") if not a.startswith("data.mixture")]
    r = run_here(
        "train", *args, f"data.mixture=[{{dir: {two_corpora['zh']}, weight: 1}}, {{dir: {prepared}, weight: 1}}]"
    )
    assert r.returncode == 2
    (line,) = r.stderr.strip().splitlines()
    assert "different tokenizers" in line and str(prepared) in line and str(two_corpora["zh"]) in line
    assert not (tmp_path / "run" / "metrics.jsonl").exists()


def test_export_of_a_mixture_run_takes_the_sources_tokenizer(uninterrupted, two_corpora, tmp_path):
    r = run_here("export", uninterrupted, tmp_path / "hf")
    assert r.returncode == 0, r.stderr
    assert "no tokenizer" not in r.stdout
    assert (tmp_path / "hf" / "tokenizer.json").read_bytes() == (
        two_corpora["shakespeare"] / "tokenizer" / "tokenizer.json"
    ).read_bytes()
    # Into a source's directory: refused, as into data.dir (--overwrite would replace what the run read).
    before = sorted(p.name for p in two_corpora["zh"].iterdir())
    r = run_here("export", uninterrupted, two_corpora["zh"] / "hf", "--overwrite")
    assert r.returncode == 2 and "overlaps the data.mixture source" in r.stderr, r.stderr[-2000:]
    assert sorted(p.name for p in two_corpora["zh"].iterdir()) == before


def test_two_ranks_read_the_single_process_mixture(two_corpora, uninterrupted, tmp_path):
    """torchrun, 2 CPU ranks x micro-batch 2 against the uninterrupted run's 1 process x micro-batch 4: the
    ranks' windows together are its batches (the loss equal up to fp32 reduction order, as in
    tests/distributed/test_torchrun.py), and rank 0 logs the tokens of both ranks per source."""
    import os
    import subprocess
    import sys

    pytest.importorskip("psutil")
    run_dir = tmp_path / "run"
    cmd = [
        sys.executable,
        "-m",
        "torch.distributed.run",
        "--standalone",
        "--nproc-per-node=2",
        "-m",
        "pretrain",
        "train",
        *mixed(two_corpora, run_dir, "train.micro_batch_size=2"),
    ]
    r = subprocess.run(
        cmd,
        capture_output=True,
        text=True,
        timeout=600,
        env={**os.environ, "PYTHONUNBUFFERED": "1", "OMP_NUM_THREADS": "1"},
    )
    assert r.returncode == 0, r.stderr[-3000:]
    a, b = losses(uninterrupted), losses(run_dir)
    assert a.keys() == b.keys() and all(b[k] == pytest.approx(a[k], rel=1e-5) for k in a)
    drawn = [[r["source_tokens"] for r in rows(d) if "loss" in r] for d in (uninterrupted, run_dir)]
    assert drawn[0] == drawn[1]


def test_a_resume_with_other_sources_is_one_line_and_changes_nothing(two_corpora, uninterrupted, tmp_path):
    import shutil

    run_dir = shutil.copytree(uninterrupted, tmp_path / "run")
    before = (run_dir / "metrics.jsonl").read_text(), (run_dir / "config.yaml").read_text()
    r = run_here(
        "train",
        "--resume",
        run_dir,
        f"data.mixture=[{{dir: {two_corpora['zh']}, weight: 1}}]",
        "train.max_steps=14",
        "train.schedule_restart=true",
    )  # the longer cosine is not what is tested
    assert r.returncode == 2, r.stderr
    (line,) = r.stderr.strip().splitlines()
    # (30,703 - 1) // 32 and (50,458 - 1) // 32: the train splits of the two prepared fixtures
    assert "shakespeare (1,040 windows), zh (1,684 windows)" in line and "same data.mixture sources" in line
    assert ((run_dir / "metrics.jsonl").read_text(), (run_dir / "config.yaml").read_text()) == before


def test_sources_with_another_end_of_document_id_are_refused(two_corpora, tmp_path):
    """The same tokenizer.json, but one source's tokenizer_config.json names <pad> as its eos_token: its
    documents end with id 2, the other's with 0. One line naming both ids, before any training."""
    import shutil

    from pretrain.data import prepare

    tokenizer = shutil.copytree(two_corpora["tokenizer"], tmp_path / "tokenizer")
    config = json.loads((tokenizer / "tokenizer_config.json").read_text())
    (tokenizer / "tokenizer_config.json").write_text(json.dumps({**config, "eos_token": "<pad>"}))
    padded = tmp_path / "zh_pad"
    prepare(
        [str(ROOT / "tests" / "fixtures" / "zh_classics_sample.jsonl")],
        str(tokenizer),
        padded,
        val_fraction=0.1,
        workers=1,
    )
    args = [a for a in mixed(two_corpora, tmp_path / "run") if not a.startswith("data.mixture")]
    r = run_here(
        "train", *args, f"data.mixture=[{{dir: {two_corpora['shakespeare']}, weight: 1}}, {{dir: {padded}, weight: 1}}]"
    )
    assert r.returncode == 2, r.stderr
    (line,) = r.stderr.strip().splitlines()
    assert "token id 0" in line and "token id 2" in line and str(padded) in line, line
    assert not (tmp_path / "run" / "metrics.jsonl").exists()


def test_a_resume_switching_between_mixture_and_data_dir_is_one_line_both_ways(
    two_corpora, prepared, uninterrupted, tmp_path
):
    import shutil

    run_dir = shutil.copytree(uninterrupted, tmp_path / "mixed")
    before = (run_dir / "metrics.jsonl").read_text(), (run_dir / "config.yaml").read_text()
    r = run_here("train", "--resume", run_dir, "data.mixture=[]", f"data.dir={prepared}", "train.max_steps=14")
    assert r.returncode == 2, r.stderr
    (line,) = r.stderr.strip().splitlines()
    assert "the checkpoint's data state is for data.mixture (shakespeare, zh)" in line, line
    assert f"this run reads data.dir {prepared}" in line, line
    assert ((run_dir / "metrics.jsonl").read_text(), (run_dir / "config.yaml").read_text()) == before

    plain = tmp_path / "plain"
    finished_run(plain, *tiny(prepared, plain, "train.max_steps=4", "run.eval_every=0"))
    r = run_here("train", "--resume", plain, "data.dir=null", mixture(two_corpora), "train.max_steps=6")
    assert r.returncode == 2, r.stderr
    (line,) = r.stderr.strip().splitlines()
    assert f"the checkpoint's data state is for data.dir {prepared}" in line, line
    assert "this run reads data.mixture (shakespeare, zh)" in line, line


def test_a_resume_with_other_weights_says_so_in_the_log_and_as_an_event(two_corpora, uninterrupted, tmp_path):
    import shutil

    run_dir = shutil.copytree(uninterrupted, tmp_path / "run")
    r = run_here(
        "train",
        "--resume",
        run_dir,
        mixture(two_corpora, "weight: 7", "weight: 3"),
        "train.max_steps=13",
        "train.schedule_restart=true",
    )  # a longer run, its cosine restretched on purpose
    assert r.returncode == 0, r.stderr
    assert "mixture weights changed" not in r.stdout  # 7 / 3 is 0.7 / 0.3
    r = run_here(
        "train",
        "--resume",
        run_dir,
        mixture(two_corpora, "weight: 1", "weight: 1"),
        "train.max_steps=14",
        "train.schedule_restart=true",
    )
    assert r.returncode == 0, r.stderr
    (line,) = [x for x in r.stdout.splitlines() if "mixture weights changed" in x]
    assert "at step 13: shakespeare 0.7 -> 0.5, zh 0.3 -> 0.5" in line, line
    events = [json.loads(x) for x in (run_dir / "events.jsonl").read_text().splitlines()]
    (changed,) = [e for e in events if e["event"] == "mixture_weights"]
    assert changed["step"] == 13 and changed["old"] == {"shakespeare": 0.7, "zh": 0.3}
    assert changed["new"] == {"shakespeare": 0.5, "zh": 0.5}


@pytest.mark.parametrize("fault", ["truncate train.bin", "delete the source", "truncate val.bin"])
def test_a_source_changed_under_the_run_stops_it_with_a_checkpoint_and_one_line(
    two_corpora, uninterrupted, tmp_path, fault
):
    """The run reads copies of the sources; zh's is damaged after step 5. Truncating a token file under a memory
    map killed the trainer by SIGBUS; deleting the source or truncating val.bin was a traceback at the next
    evaluation. Now: exit 2, one line naming the source, a checkpoint of the last complete step, and a resume
    once the source is restored continues bitwise as if nothing had happened."""
    import os
    import shutil

    from pretrain.checkpoint.format import list_checkpoints, step_of

    copies = {name: shutil.copytree(two_corpora[name], tmp_path / "sources" / name) for name in ("shakespeare", "zh")}
    run_dir = tmp_path / "run"
    proc = start(["train", *mixed(copies, run_dir, "debug.step_sleep=0.3")])
    try:
        wait_for_steps(run_dir, 5, proc)  # past the checkpoint of step 4, before the evaluation of step 6
        if fault == "delete the source":
            shutil.rmtree(copies["zh"])
        else:
            path = copies["zh"] / fault.split()[1]
            os.truncate(path, path.stat().st_size // 2)
        _, stderr = proc.communicate(timeout=120)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 2, stderr
    (line,) = stderr.strip().splitlines()
    assert "data.mixture source 'zh'" in line and str(copies["zh"]) in line, line
    assert ("was deleted" if fault == "delete the source" else "was truncated") in line, line
    stopped = max(losses(run_dir))
    assert step_of(list_checkpoints(run_dir)[-1]) == stopped and f"after step {stopped}" in line, line
    events = [json.loads(x) for x in (run_dir / "events.jsonl").read_text().splitlines()]
    (changed,) = [e for e in events if e["event"] == "data_changed"]
    assert changed["step"] == stopped and changed["source"] == "data.mixture source 'zh'"
    shutil.rmtree(copies["zh"], ignore_errors=True)
    shutil.copytree(two_corpora["zh"], copies["zh"])
    r = run_cli("train", "--resume", run_dir, "debug.step_sleep=0")
    assert r.returncode == 0, r.stderr
    assert losses(run_dir) == losses(uninterrupted)
    pa, pb = params(run_dir), params(uninterrupted)
    assert all(torch.equal(pa[k], pb[k]) for k in pa)
