"""train.document_masking through `pretrain train`: the run says it masked (plan_vs_run.json), the offset index
is checked against the <eos> ids, and what cannot mask is refused in one line."""

from __future__ import annotations

import json
import shutil

import numpy as np
import pytest

from pretrain.config import load_config
from pretrain.config.trainable import check_trainable
from pretrain.errors import ConfigError
from support import run_cli, tiny


def test_a_masked_run_says_so_in_plan_vs_run(prepared, tmp_path):
    run = run_cli(
        "train",
        *tiny(prepared, tmp_path / "run", "train.max_steps=4", "run.checkpoint_every=0", "train.document_masking=true"),
    )
    assert run.returncode == 0, run.stderr
    assert "plan: document masking on: each token attends within its own document" in run.stdout  # said at start
    report = json.loads((tmp_path / "run" / "plan_vs_run.json").read_text())
    assert report["document_masking"] is True
    assert report["attention_kernel"] == "flash"  # the CPU's fused kernel takes the boolean mask
    rows = {r["name"]: r for r in report["rows"]}  # the loop's per-document outputs and per-token tables planned
    assert rows["activations"]["measured"] == rows["activations"]["planned"]


def test_an_offset_index_that_disagrees_with_the_eos_ids_is_one_line(prepared, tmp_path):
    data = tmp_path / "data"
    shutil.copytree(prepared, data)
    starts = np.load(data / "train.idx.npy")
    starts[3] += 1  # the fourth document said to start one token late
    np.save(data / "train.idx.npy", starts)
    run = run_cli("train", *tiny(data, tmp_path / "run", "train.document_masking=true"))
    assert run.returncode == 2
    lines = run.stderr.strip().splitlines()
    assert len(lines) == 1 and "train.idx.npy disagrees with the <eos> ids" in lines[0], run.stderr
    assert f"token {starts[3] - 1:,} is not <eos>" in lines[0]  # the fourth document's first token


def test_a_pipeline_cannot_mask_documents():
    config = load_config(
        {
            "model": {"preset": "debug"},
            "train": {"document_masking": True},
            "parallel": {"gpus": 2, "pipeline": 2},
            "data": {"dir": "d"},
        }
    )
    with pytest.raises(ConfigError, match="later pipeline stage sees no tokens"):
        check_trainable(config)
