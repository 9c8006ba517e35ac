"""`pretrain sweep --from-fit N`: the fit's fastest layouts timed on this machine (a CPU here), measured beside
predicted, the ranking model's error printed, the fastest that ran chosen."""

import json

import pytest

from support import run_cli

pytest.importorskip("torch")

ENV = {"OMP_NUM_THREADS": "1"}  # see tests/sweep/test_sweep_cli.py
TINY = [
    "model.preset=debug",
    "train.device=cpu",
    "train.precision=fp32",
    "train.seq_len=64",
    "train.micro_batch_size=4",
    "train.grad_accum_steps=2",
]


def test_three_candidates_measured_beside_predicted(tmp_path):
    done = run_cli(
        "sweep",
        *TINY,
        "--from-fit",
        "3",
        "--steps",
        "2",
        "--rounds",
        "2",
        "--json",
        "--out",
        tmp_path,
        env=ENV,
        timeout=300,
    )
    assert done.returncode == 0, done.stderr
    result = json.loads(done.stdout)
    rows = result["candidates"]
    assert [r["rank"] for r in rows] == [1, 2, 3] and all(r["status"] == "ok" for r in rows)
    predicted = [r["predicted_tokens_per_s"] for r in rows]
    assert predicted == sorted(predicted, reverse=True)  # the fit's order
    for r in rows:
        o = r["overrides"]
        # The global batch of 8 sequences is kept by every candidate.
        assert o["train.micro_batch_size"] * o["train.grad_accum_steps"] == 8
        assert r["measured_tokens_per_s"] > 0 and r["rounds"] == 2
        each = r["measured_tokens_per_s_each_round"]
        assert r["measured_tokens_per_s"] == pytest.approx(sum(each) / 2)  # the median of two rounds
        assert r["spread_pct"] == pytest.approx(100 * (max(each) - min(each)) / r["measured_tokens_per_s"])
        assert r["error_pct"] == pytest.approx(100 * (r["measured_tokens_per_s"] / r["predicted_tokens_per_s"] - 1))
    assert result["rounds"] == 2 and result["threads"] >= 1 and result["threads_chosen_as"].startswith("auto")
    fastest = max(rows, key=lambda r: r["measured_tokens_per_s"])
    assert result["chosen"] == fastest
    errors = [abs(r["error_pct"]) for r in rows]
    assert result["error"]["mean_abs_pct"] == pytest.approx(sum(errors) / 3)
    assert json.loads((tmp_path / "from_fit.json").read_text())["candidates"] == rows
    # The candidates are the fit's: `pretrain plan --fit` on this CPU with the same measured profile lists them first.
    measured = [f"{key}={value}" for key, value in result["hardware"].items()]
    assert result["hardware"].keys() == {"hardware.profile"}  # a CPU: its own profile, kept per machine
    fit = run_cli("plan", *TINY, "hardware.gpu=cpu", *measured, "--fit", "--json", env=ENV)
    assert [c["overrides"] for c in json.loads(fit.stdout)["candidates"][:3]] == [r["overrides"] for r in rows]


def test_the_table_prints_the_error_and_the_choice(tmp_path):
    done = run_cli(
        "sweep",
        *TINY,
        "hardware.peak_tflops=0.05",
        "--from-fit",
        "2",
        "--steps",
        "1",
        "--out",
        tmp_path,
        env=ENV,
        timeout=300,
    )
    assert done.returncode == 0, done.stderr
    out = done.stdout
    assert "predicted" in out and "measured" in out and "ranking model's error: mean |measured / predicted - 1|" in out
    assert "chosen (fastest measured): #" in out and "train.micro_batch_size=" in out


@pytest.mark.parametrize(
    "args, words",
    [
        (["--from-fit", "0"], "--from-fit: must be at least 1"),
        (["train.seq_len=32,64", "--from-fit", "2"], "--from-fit: the layouts come from the fit"),
        (
            ["train.grad_dtype=same", "--from-fit", "2"],
            "train.grad_dtype: same (half-precision gradients) is a planning option",
        ),
        # One process cannot hold 2 tensor ranks: say how to launch them (was "make gpus a multiple of 2", and
        # parallel.gpus=2 then divided by zero); test_layouts_of_several_ranks_... follows the advice.
        (["parallel.tensor=2", "--from-fit", "2"], "launch with `torchrun --nproc-per-node 2 -m pretrain sweep ...`"),
        (
            ["parallel.tensor=2", "parallel.gpus=2", "--from-fit", "2"],
            "launch with `torchrun --nproc-per-node 2 -m pretrain sweep ...`",
        ),
    ],
)
def test_bad_input_is_one_line(tmp_path, args, words):
    done = run_cli("sweep", "model.preset=debug", "train.device=cpu", *args, "--out", tmp_path / "o", env=ENV)
    assert done.returncode == 2 and done.stderr.count("\n") == 1 and words in done.stderr, done.stderr
    assert not (tmp_path / "o").exists()


def test_the_candidates_are_timed_in_interleaved_rounds(tmp_path, monkeypatch):
    from pretrain.plan.fit import command_line
    from pretrain.sweep import from_fit

    order, real = [], from_fit.run_sweep

    def run_sweep(path, items, *args, **kw):
        order.append(" ".join(items))
        assert kw["rounds"] == 1 and kw["threads"] == 1
        return real(path, items, *args, **kw)

    monkeypatch.setattr(from_fit, "run_sweep", run_sweep)
    result = from_fit.run_from_fit(
        None, [*TINY, "hardware.peak_tflops=0.05"], 2, steps=1, rounds=2, threads=1, out_dir=None
    )
    first, second = (command_line(r["overrides"]) for r in result["candidates"])
    assert order[0].endswith(first) and order[1].endswith(second) and first != second
    assert order == [order[0], order[1], order[0], order[1]]  # A B A B
    assert [r["rounds"] for r in result["candidates"]] == [2, 2]


def test_layouts_of_several_ranks_are_measured_under_torchrun(tmp_path):
    # 4 CPU ranks: the fit for this world ranks tensor 2 x data 2 (ZeRO 0-3) right behind data 4, and every
    # row is measured on the 4 ranks, tensor parallelism beside DDP and ZeRO-1 included. Before, --from-fit
    # kept data-parallel layouts only. The config's own parallel.tensor=2 (which one process is told to launch
    # under torchrun, test_bad_input_is_one_line) takes the world torchrun gives as parallel.gpus: it was
    # refused with "parallel.gpus: 1 ...", and parallel.gpus=4 divided by zero.
    import os
    import subprocess
    import sys

    cmd = [
        sys.executable,
        "-m",
        "torch.distributed.run",
        "--standalone",
        "--nproc-per-node=4",
        "-m",
        "pretrain",
        "sweep",
        *TINY,
        "hardware.peak_tflops=0.05",
        "parallel.gpus_per_node=4",
        "parallel.tensor=2",
        "--from-fit",
        "8",
        "--steps",
        "1",
        "--out",
        str(tmp_path),
    ]
    done = subprocess.run(cmd, capture_output=True, text=True, env={**os.environ, **ENV}, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    rows = json.loads((tmp_path / "from_fit.json").read_text())["candidates"]
    layouts = {(r["overrides"]["parallel.tensor"], r["overrides"]["parallel.zero_stage"]) for r in rows}
    assert {(2, 0), (2, 1), (1, 0)} <= layouts
    assert all(r["status"] == "ok" and r["measured_tokens_per_s"] > 0 for r in rows)
