"""The README's main command, shortened: plan, tokenizer, prepare, train, report, export, generate; and run again
over its own output."""

import json

import pytest

from support import run_cli

pytest.importorskip("torch")


# The first, 2-step run only shows the rerun: a smaller model than the demo's 4 layers x 256 does (grouped-query
# attention kept: 4 heads sharing 2 k/v heads); the checked run trains the demo's own model.
SMALL = [
    "model.hidden_size=128",
    "model.intermediate_size=344",
    "model.num_layers=2",
    "model.num_heads=4",
    "model.num_kv_heads=2",
]


def test_demo_end_to_end(tmp_path):
    # First a 2-step demo, then the full one over its output: a rerun replaces the directories the demo made
    # before (they carry its mark), and every check below is of the second run's files.
    quick = [
        "train.max_steps=2",
        "run.eval_every=2",
        "run.checkpoint_every=2",
        "train.warmup=1",
        "run.progress=false",
        "run.eval_batches=1",
    ]
    r = run_cli("demo", "--out", tmp_path / "demo", *SMALL, *quick, cwd=tmp_path)
    assert r.returncode in (0, 1) and "6/6 export" in r.stdout, r.stderr[-3000:]
    r = run_cli(
        "demo",
        "--out",
        tmp_path / "demo",
        "train.max_steps=60",
        "run.eval_every=30",
        "run.checkpoint_every=30",
        "train.warmup=6",
        "run.progress=false",
        cwd=tmp_path,
        timeout=1800,  # ~2 minutes on 2 idle cores; a hang guard, not a speed test (ATen's plain kernels, a busy CPU)
    )
    assert r.returncode == 0, r.stderr[-3000:]
    out = tmp_path / "demo"
    for step in ("1/6 plan", "2/6 tokenizer", "3/6 prepare", "4/6 train", "5/6 report", "6/6 export"):
        assert step in r.stdout
    assert "planner storage_bytes predicts" in r.stdout and "(equal)" in r.stdout
    assert (out / "run" / "report" / "report.png").exists() and (out / "run" / "report" / "report.html").exists()
    assert (out / "hf" / "model.safetensors").exists() and (out / "hf" / "tokenizer.json").exists()
    assert "gives the same greedy text: True" in r.stdout
    rows = [json.loads(x) for x in (out / "run" / "metrics.jsonl").read_text().splitlines()]
    val = [x["val_loss"] for x in rows if "val_loss" in x]
    assert val[-1] < val[0]
    assert "nats better than counting tokens" in r.stdout  # and the exit code says it beat the unigram entropy
    # the in-loop task the demo writes (sentences of the validation split to end): a line per evaluation, and its
    # panel with the chance line in the report (tasks.png, also in report.png and the page)
    assert len((out / "cloze.jsonl").read_text().splitlines()) == 100
    tasks = [x for x in rows if "eval/cloze/acc_norm" in x]
    assert [x["step"] for x in tasks] == [30, 60] and tasks[-1]["eval/cloze/chance"] == 0.25
    assert (out / "run" / "report" / "tasks.png").exists()
    assert 'alt="downstream tasks"' in (out / "run" / "report" / "report.html").read_text()
    assert "cloze (in the loop, report panel cloze): acc_norm" in r.stdout


def _tree(folder):
    return sorted((str(p.relative_to(folder)), p.read_bytes() if p.is_file() else None) for p in folder.rglob("*"))


@pytest.mark.parametrize("case", ["data.dir", "run.dir", "--out"])
def test_demo_refuses_a_directory_it_did_not_create(case, tmp_path):
    mine = tmp_path / "mine"  # a user's dataset or run: the demo must not replace it
    mine.mkdir()
    (mine / "meta.json").write_text("{}")
    (mine / "checkpoints").mkdir()
    before = _tree(mine)
    args = ["--out", mine] if case == "--out" else ["--out", tmp_path / "demo", f"{case}={mine}"]
    r = run_cli("demo", *args, cwd=tmp_path)
    lines = r.stderr.strip().splitlines()
    assert r.returncode == 2 and len(lines) == 1 and "did not" in lines[0], r.stderr[-2000:]
    assert case in lines[0] and r.stdout == ""
    assert _tree(mine) == before
