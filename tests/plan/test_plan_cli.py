"""`pretrain plan` as a user runs it: instant, no torch, JSON contract, explain, one-line errors."""

import json
import subprocess
import sys

import pytest

from support import run_cli

JSON_KEYS = {"params", "flops", "tokens", "storage_bytes", "checkpoint_bytes", "steps", "time", "memory_bytes",
             "model_states", "fits", "max_micro_batch_size", "parallel", "hardware", "model"}


def test_importing_the_planner_does_not_import_torch():
    code = "import sys, pretrain.plan, pretrain.config, pretrain.cli; print('torch' in sys.modules, 'numpy' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "False False"


def test_plan_json_contract():
    r = run_cli("plan", "model.preset=llama-7b", "--json")
    assert r.returncode == 0, r.stderr
    p = json.loads(r.stdout)
    assert JSON_KEYS <= set(p)
    assert p["params"]["total"] == 6_738_415_616
    assert {"total", "embedding", "non_embedding"} <= set(p["params"])
    assert {"per_token", "per_token_6n", "total", "total_6n", "attention_per_token", "per_token_hardware",
            "convention"} <= set(p["flops"])
    assert set(p["memory_bytes"]) == {"weights", "gradients", "optimizer", "activations", "buffers", "cuda_context",
                                      "total", "host"}
    assert {"total", "chinchilla"} <= set(p["tokens"])
    assert {"tokens_per_step", "total"} <= set(p["steps"])
    assert {"seconds", "days", "gpu_hours", "cost"} <= set(p["time"])


def test_measured_section_gives_mfu_and_hfu():
    r = run_cli("plan", "model.preset=gpt2", "measured.tokens_per_second=57000", "hardware.gpu=a100-80gb",
                "train.activation_checkpointing=full", "--json")
    p = json.loads(r.stdout)
    assert p["mfu"] > 0 and p["hfu"] == pytest.approx(p["mfu"] * p["flops"]["per_token_hardware"] / p["flops"]["per_token"])


def test_table_and_explain():
    r = run_cli("plan", "model.preset=llama3.2-1b", "parallel.gpus=8", "hardware.gpu=h100-sxm", "--explain")
    assert r.returncode == 0, r.stderr
    assert "Parameters" in r.stdout and "1,235,814,400" in r.stdout and "GiB" in r.stdout
    assert "[memory]" in r.stdout and "= " in r.stdout  # formulas with numbers substituted


def test_yaml_file_and_overrides(tmp_path):
    cfg = tmp_path / "run.yaml"
    cfg.write_text("model:\n  preset: gpt2\ntrain:\n  tokens: 1.4e12\n  seq_len: 1024\nparallel:\n  gpus: 8\n")
    p = json.loads(run_cli("plan", cfg, "train.micro_batch_size=4", "--json").stdout)
    assert p["tokens"]["total"] == 1_400_000_000_000
    assert p["steps"]["tokens_per_step"] == 1024 * 4 * 8 * 8


@pytest.mark.parametrize("args, words", [
    (["train.lrr=1"], "train.lrr"),
    (["model.preset=llama-8b"], "model.preset"),
    (["model.hidden_size=100", "model.num_heads=3"], "model.num_heads"),
    (["parallel.gpus=6", "parallel.tensor=4"], "parallel.gpus"),
    (["train.micro_batch_size=-2"], "train.micro_batch_size"),
    (["train.tokens=-5"], "train.tokens"),
    (["train.precision=fp8"], "train.precision"),
    (["hardware.gpu=tpu"], "hardware.gpu"),
    (["nosection=1"], "section"),
    (["missing.yaml"], "missing.yaml"),
    (["train.seq_len=99999", "model.preset=gpt2"], "train.seq_len"),
    (["model.preset=llama-7b", "hardware.gpu=v100-32gb"], "train.precision"),
])
def test_bad_input_is_one_line_and_exit_2(args, words):
    r = run_cli("plan", *args)
    assert r.returncode == 2
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1 and words in lines[0] and "Traceback" not in r.stderr


def test_unknown_flag_is_one_line():
    r = run_cli("plan", "--bogus")
    assert r.returncode == 2 and len(r.stderr.strip().splitlines()) == 1


def test_python_dash_m_matches_the_script():
    import shutil
    from pathlib import Path

    beside = Path(sys.executable).parent / "pretrain"  # the venv's script, also when the venv is not activated
    script = str(beside) if beside.exists() else shutil.which("pretrain")
    if script is None:
        pytest.skip("the pretrain console script is not installed")
    a = subprocess.run([script, "plan", "model.preset=gpt2", "--json"], capture_output=True, text=True).stdout
    assert a == run_cli("plan", "model.preset=gpt2", "--json").stdout
