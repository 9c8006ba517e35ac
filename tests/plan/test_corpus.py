"""Tokens a corpus holds and the epochs a run needs: data.raw_bytes / data.bytes_per_token, or a prepared
data.dir's meta.json; the advice past 4 epochs (Muennighoff et al. 2023)."""

import json

import pytest

from pretrain.config import load_config
from pretrain.errors import ConfigError
from pretrain.plan import make_plan, plan_with_explain
from support import run_cli, run_here


def test_raw_text_gives_tokens_and_epochs():
    # 300 GB of Chinese text at an assumed 2.1 bytes per token (an input here; `data.bytes_per_token` is the
    # user's measured figure for their tokenizer) holds 142,857,142,857 tokens; 2T training tokens read it 14 times.
    config = load_config(
        overrides=["model.preset=llama-7b", "train.tokens=2e12", "data.raw_bytes=300e9", "data.bytes_per_token=2.1"]
    )
    p, ex = plan_with_explain(config)
    assert p["data"]["tokens_available"] == 142_857_142_857
    assert p["data"]["epochs"] == pytest.approx(2e12 / 142_857_142_857)
    assert any(line.startswith("data: the run reads its 1.43e+11 available tokens 14 times") for line in p["advice"])
    assert "raw text 3e+11 bytes / 2.1 bytes per token" in ex.render()
    # Enough text: no advice.
    p = make_plan(
        load_config(
            overrides=[
                "model.preset=llama-7b",
                "train.tokens=2e12",
                "data.raw_bytes=3000e9",
                "data.bytes_per_token=2.1",
            ]
        )
    )
    assert p["data"]["epochs"] < 4 and not any(line.startswith("data:") for line in p["advice"])


def test_no_corpus_no_data_key():
    assert "data" not in make_plan(load_config(overrides=["model.preset=llama-7b"]))


def test_a_prepared_directory_knows_its_tokens(prepared):
    meta = json.loads((prepared / "meta.json").read_text())
    p = make_plan(load_config(overrides=["model.preset=debug", f"data.dir={prepared}", "train.tokens=1e7"]))
    assert p["data"]["tokens_available"] == meta["num_tokens"]["train"]
    assert p["data"]["bytes_per_token"] == meta["bytes_per_token"]
    assert p["data"]["epochs"] == pytest.approx(1e7 / meta["num_tokens"]["train"])


def test_a_directory_not_prepared_yet_is_no_error(tmp_path):
    assert "data" not in make_plan(load_config(overrides=["model.preset=debug", f"data.dir={tmp_path}"]))


def test_raw_bytes_needs_bytes_per_token():
    with pytest.raises(ConfigError, match="data.bytes_per_token"):
        load_config(overrides=["data.raw_bytes=3e9"])
    r = run_cli("plan", "data.raw_bytes=3e9")
    assert r.returncode == 2 and r.stderr.count("\n") == 1


def test_a_vocabulary_larger_than_the_models_is_refused_by_the_plan_as_by_the_trainer(prepared, tmp_path):
    # `pretrain plan model.preset=moe-debug data.dir=demo/data` planned a 512-token embedding silently where
    # `pretrain train` refused the 2048-token data: both now say the same line, exit 2 (a mixture's too).
    vocab = json.loads((prepared / "meta.json").read_text())["vocab_size"]
    small = [f"model.vocab_size={vocab - 1}", "model.preset=debug"]
    plan = run_here("plan", *small, f"data.dir={prepared}")
    train = run_here("train", *small, f"data.dir={prepared}", f"run.dir={tmp_path / 'run'}", "train.device=cpu")
    said = f"model.vocab_size: {vocab - 1} is smaller than the vocabulary of {prepared} ({vocab}); set"
    for r in (plan, train):
        assert r.returncode == 2 and said in r.stderr and r.stderr.count("\n") == 1, r.stderr
    with pytest.raises(ConfigError, match="is smaller than the vocabulary"):
        make_plan(load_config(overrides=[*small, f"data.mixture=[{{dir: {prepared}, weight: 1}}]"]))
