"""`pretrain bench` as a user runs it: a real subprocess, its JSON, its table, its one-line errors."""

import importlib.util
import json
import subprocess
import sys

import pytest

from support import run_here

# The debug model at 64 tokens, a 1-second budget, no fp16 (emulated on most CPUs, the slowest dtype): the
# run takes a few seconds with start-up.
TINY = ["model.preset=debug", "train.seq_len=64", "--seconds", "1", "--quick", "--dtypes", "fp32,tf32,bf16"]


def pretrain(*args, timeout=120):
    return subprocess.run(
        [sys.executable, "-m", "pretrain", *map(str, args)], capture_output=True, text=True, timeout=timeout
    )


@pytest.fixture(scope="module")
def profile_file(tmp_path_factory):
    path = tmp_path_factory.mktemp("bench") / "profile.json"
    result = pretrain("bench", "--json", "--out", path, *TINY)
    assert result.returncode == 0, result.stderr
    printed = json.loads(result.stdout)
    assert json.loads(path.read_text()) == printed
    return path


def test_json_profile_from_the_command(profile_file):
    profile = json.loads(profile_file.read_text())
    assert profile["device_type"] == "cpu" and profile["budget_seconds"] == 1
    assert set(profile["peak_tflops"]) == {"fp32", "tf32", "bf16"}
    assert profile["peak_tflops"]["tf32"] == profile["peak_tflops"]["fp32"] > 0
    assert profile["block"]["tokens_per_s"] > 0 and profile["block"]["config"]["model"]["hidden_size"] == 64
    assert profile["rounds"] == 3 and profile["threads"] >= 1 and "block_tokens_per_s" in profile["spread_pct"]


@pytest.mark.skipif(
    importlib.util.find_spec("pretrain.plan.command") is None,
    reason="`pretrain plan` (pretrain.plan.command) is not written yet",
)
def test_plan_command_uses_the_profile(profile_file):
    result = pretrain("plan", "hardware.gpu=cpu", f"hardware.profile={profile_file}", "--json")
    assert result.returncode == 0, result.stderr
    profile = json.loads(profile_file.read_text())
    hardware = json.loads(result.stdout)["hardware"]
    assert hardware["peak_tflops"] == profile["peak_tflops"]["bf16"]  # default precision bf16-mixed


def test_table_output():
    result = pretrain("bench", *TINY[:-1], "bf16")
    assert result.returncode == 0, result.stderr
    for row in ("bf16 matmul", "device memory copy", "block fwd+bwd", "block MFU"):
        assert row in result.stdout
    assert "median of 3 rounds" in result.stdout and "spread" in result.stdout


@pytest.mark.parametrize(
    "args, message",
    [
        (["--dtypes", "fp64"], "--dtypes: unknown dtype fp64"),
        (["--device", "tpu"], "--device 'tpu' is not a device"),
        (["model.hidden_sise=64"], "unknown config key 'model.hidden_sise'; did you mean model.hidden_size?"),
        (["--out", "/proc/profile.json"], "--out /proc/profile.json:"),  # refused before measuring
        (["--out", "/"], "is a directory"),
        (["--rounds", "0"], "--rounds: must be at least 1"),
        (["--threads", "0"], "--threads: must be at least 1"),
    ],
)
def test_bad_input_is_one_line_on_stderr_and_exit_2(args, message):
    result = run_here("bench", *args)  # refused before anything is measured: no process of its own needed
    assert result.returncode == 2 and result.stdout == ""
    assert result.stderr.count("\n") == 1 and result.stderr.startswith("pretrain bench: error: ")
    assert message in result.stderr


def test_cuda_without_a_gpu_exits_2():
    import torch

    if torch.cuda.is_available():
        pytest.skip("this machine has a CUDA GPU")
    result = run_here("bench", "--device", "cuda")
    assert result.returncode == 2 and "no CUDA GPU is visible" in result.stderr


def test_importing_the_command_does_not_import_torch():
    code = "import sys, pretrain.bench.command; assert 'torch' not in sys.modules"
    assert subprocess.run([sys.executable, "-c", code]).returncode == 0
