"""run_bench's hardware profile: documented keys, CPU conventions, and `pretrain plan` reading it."""

import json

import pytest
import torch

from pretrain.bench import bandwidth, matmul, run_bench, write_profile
from pretrain.bench.run import bench_config, parse_dtypes
from pretrain.config import load_config
from pretrain.distributed.runtime import resolve_device
from pretrain.errors import UsageError
from pretrain.plan import make_plan
from pretrain.plan.hardware import load_profile

# The keys docs/bench.md documents.
PROFILE_KEYS = {
    "device",
    "device_type",
    "torch",
    "date",
    "peak_tflops",
    "median_tflops",
    "shapes",
    "memory_bandwidth_gbps",
    "host_to_device_gbps",
    "op_seconds",
    "block",
    "rounds",
    "threads",
    "threads_chosen_as",
    "spread_pct",
    "warnings",
}


@pytest.fixture
def tiny_bench(monkeypatch):
    """Tiny shapes and buffers: the whole bench finishes in about a second on 2 CPU cores."""
    monkeypatch.setattr(matmul, "CPU_SHAPES", [(64, 64, 64), (128, 128, 128)])
    monkeypatch.setattr(bandwidth, "CPU_COPY_BYTES", 4 << 20)


@pytest.fixture
def tiny_config():
    # The debug preset (H=64, 2 layers) at 2 x 64 tokens: one block step takes about a millisecond.
    return {"model": {"preset": "debug"}, "train": {"seq_len": 64, "micro_batch_size": 2}}


@pytest.fixture
def profile(tiny_bench, tiny_config):
    return run_bench(tiny_config, seconds=1.0, device="cpu")


def test_profile_has_the_documented_keys_and_sane_numbers(profile):
    assert PROFILE_KEYS <= set(profile)
    assert profile["device_type"] == "cpu" and profile["torch"] == torch.__version__ and profile["device"]
    assert set(profile["peak_tflops"]) == {"fp32", "tf32", "fp16", "bf16"}
    assert profile["peak_tflops"]["tf32"] == profile["peak_tflops"]["fp32"]  # no TF32 units on a CPU
    assert "fp8" in profile["skipped"]
    for dtype, best in profile["peak_tflops"].items():
        assert best >= profile["median_tflops"][dtype] > 0
    assert {s["dtype"] for s in profile["shapes"]} == {"fp32", "fp16", "bf16"}
    assert profile["memory_bandwidth_gbps"] > 0 and profile["host_to_device_gbps"] is None
    assert 0 < profile["op_seconds"] < 0.01  # a CPU's eager op: microseconds (the planner's CPU step reads it)
    block = profile["block"]
    assert block["tokens_per_s"] > 0 and 0 < block["mfu"]
    assert block["peak_tflops"] == profile["peak_tflops"]["bf16"]  # bf16-mixed: this run's best bf16
    assert block["config"]["model"]["hidden_size"] == 64 and block["config"]["seq_len"] == 64
    assert json.loads(json.dumps(profile)) == profile  # JSON-ready


def test_a_dtype_subset_is_measured_alone(tiny_bench, tiny_config):
    profile = run_bench(tiny_config, dtypes="bf16", seconds=0.5, device="cpu")
    assert set(profile["peak_tflops"]) == {"bf16"} and profile["skipped"] == {}
    profile = run_bench(tiny_config, ["train.precision=fp32"], dtypes=["tf32"], seconds=0.5, device="cpu")
    assert set(profile["peak_tflops"]) == {"fp32", "tf32"}  # tf32 on a CPU is the fp32 measurement
    assert profile["block"]["peak_source"] == "measured fp32 best, this run"


def test_block_peak_falls_back_to_the_catalog_and_a_cpu_has_none(tiny_bench, tiny_config):
    profile = run_bench(tiny_config, dtypes="fp32", seconds=0.5, device="cpu")  # block runs in bf16
    assert profile["block"]["mfu"] is None and "no data-sheet peak" in profile["block"]["peak_source"]
    profile = run_bench(tiny_config, ["hardware.peak_tflops=2"], dtypes="fp32", seconds=0.5, device="cpu")
    assert profile["block"]["peak_tflops"] == 2 and profile["block"]["mfu"] > 0


def test_plan_divides_by_the_profile_peak(profile, tmp_path):
    path = tmp_path / "profile.json"
    write_profile(profile, path)
    assert load_profile(path)["peak_tflops"] == profile["peak_tflops"]
    for precision, dtype in (("bf16-mixed", "bf16"), ("fp32", "tf32"), ("fp16-mixed", "fp16")):
        config = load_config(None, ["hardware.gpu=cpu", f"hardware.profile={path}", f"train.precision={precision}"])
        hardware = make_plan(config)["hardware"]
        assert hardware["peak_tflops"] == profile["peak_tflops"][dtype]
        # where the figure came from: the file, and what the profile says it measured (threads, torch, date)
        assert hardware["peak_source"].startswith(f"measured {dtype} in {path}: threads ")
        assert f"torch {torch.__version__}, on {profile['date']}" in hardware["peak_source"]


def test_default_block_is_a_small_llama_unless_the_model_is_given(tiny_config):
    cpu = torch.device("cpu")
    default = bench_config(None, [], cpu)
    assert (default.model.hidden_size, default.model.num_layers) == (2048, 22)  # TinyLlama 1.1B
    assert (default.train.seq_len, default.train.micro_batch_size) == (256, 1)
    gpu = bench_config(None, [], torch.device("cuda"))
    assert (gpu.train.seq_len, gpu.train.micro_batch_size) == (2048, 4)
    given = bench_config(None, ["model.preset=gpt2", "train.seq_len=32"], cpu)
    assert (given.model.hidden_size, given.train.seq_len) == (768, 32)
    assert bench_config(tiny_config, ["train.seq_len=16"], cpu).train.seq_len == 16


def test_bad_input_is_a_usage_error_that_names_the_fix(tmp_path, tiny_config):
    with pytest.raises(UsageError, match="unknown dtype fp64; choose from fp32,tf32,fp16,bf16,fp8"):
        parse_dtypes("bf16,fp64")
    with pytest.raises(UsageError, match="use auto, cpu, cuda or cuda:N"):
        resolve_device("tpu", "--device")
    with pytest.raises(UsageError, match="positive number of seconds"):
        run_bench(tiny_config, seconds=0, device="cpu")
    (tmp_path / "file").write_text("")
    with pytest.raises(UsageError, match="cannot write it"):
        write_profile({}, tmp_path / "file" / "profile.json")


@pytest.mark.skipif(torch.cuda.is_available(), reason="this machine has a CUDA GPU")
def test_cuda_without_a_gpu_is_a_usage_error():
    with pytest.raises(UsageError, match="no CUDA GPU is visible.*use --device cpu"):
        resolve_device("cuda", "--device")


def test_rounds_measure_every_figure_in_turn_and_report_medians_and_spreads(tiny_bench, tiny_config, monkeypatch):
    from pretrain.bench import run as bench_run

    order, real_sweep, real_block = [], matmul.sweep, bench_run.block_throughput

    def sweep(*args, **kw):
        order.append(("matmul", torch.get_num_threads()))
        return real_sweep(*args, **kw)

    def block(*args, **kw):
        order.append(("block", torch.get_num_threads()))
        return real_block(*args, **kw)

    monkeypatch.setattr(matmul, "sweep", sweep)
    monkeypatch.setattr(bench_run, "block_throughput", block)
    before = torch.get_num_threads()
    profile = run_bench(tiny_config, dtypes="fp32", seconds=0.6, device="cpu", rounds=3, threads=2)
    assert order == [("matmul", 2), ("block", 2)] * 3  # round by round, not each figure 3 times in a row
    assert torch.get_num_threads() == before
    assert (profile["rounds"], profile["threads"], profile["threads_chosen_as"]) == (3, 2, "--threads")
    noise = profile["spread_pct"]
    assert set(noise) == {"peak_tflops", "memory_bandwidth_gbps", "host_to_device_gbps", "block_tokens_per_s"}
    assert noise["peak_tflops"]["fp32"] >= 0 and noise["block_tokens_per_s"] >= 0
    assert noise["host_to_device_gbps"] is None  # a CPU has no transfer
    noisy = [k for k, v in [*noise["peak_tflops"].items(), *noise.items()] if isinstance(v, float) and v > 10]
    assert len(profile["warnings"]) == len(noisy)
    for s in profile["shapes"]:
        assert s["tflops"] == pytest.approx(2 * s["m"] * s["n"] * s["k"] / s["seconds"] / 1e12)
    assert profile["peak_tflops"]["fp32"] == max(s["tflops"] for s in profile["shapes"])


def test_one_round_has_no_spread(tiny_bench, tiny_config):
    profile = run_bench(tiny_config, dtypes="fp32", seconds=0.3, device="cpu", rounds=1, threads=1)
    assert profile["spread_pct"]["block_tokens_per_s"] is None and profile["warnings"] == []
    with pytest.raises(UsageError, match="--rounds: must be at least 1"):
        run_bench(tiny_config, device="cpu", rounds=0)
