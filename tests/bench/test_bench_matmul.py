"""Matmul sweep and the timing under it, on CPU with tiny shapes."""

import time

import pytest
import torch

from pretrain.bench import matmul, timing

CPU = torch.device("cpu")


def test_median_seconds_times_the_call_after_warm_up():
    calls = []

    def fn():
        calls.append(1)
        time.sleep(0.01)

    seconds = timing.median_seconds(fn, CPU, budget=0.05)
    assert 0.01 <= seconds < 0.1  # sleep(0.01) never returns early; a busy machine may make it late
    # warm-up, then at least MIN_REPEATS timed repeats of one call (10 ms > MIN_REPEAT_SECONDS)
    assert len(calls) >= timing.WARMUP_CALLS + timing.MIN_REPEATS


@pytest.mark.parametrize("dtype", ["fp32", "fp16", "bf16"])
def test_matmul_fn_computes_the_product(dtype):
    torch.manual_seed(0)
    out = matmul.matmul_fn(32, 48, 16, dtype, CPU)()
    torch.manual_seed(0)  # the same operands again
    expected = torch.randn(32, 16, dtype=matmul.TORCH_DTYPES[dtype]) @ torch.randn(16, 48, dtype=out.dtype)
    assert out.dtype == matmul.TORCH_DTYPES[dtype]
    torch.testing.assert_close(out, expected)


def test_fp8_product_calls_scaled_mm_as_the_gpu_path_does():
    # torch's CPU build implements _scaled_mm too: this checks the call (column-major b, fp32 scales, bf16
    # out) that runs on Ada/Hopper, though `pretrain bench` does not measure fp8 on a CPU.
    torch.manual_seed(0)
    try:
        out = matmul.matmul_fn(32, 48, 16, "fp8", CPU)()
    except (RuntimeError, NotImplementedError) as e:
        pytest.skip(f"this torch build has no CPU _scaled_mm ({type(e).__name__})")
    torch.manual_seed(0)
    a = torch.randn(32, 16, dtype=torch.bfloat16).to(torch.float8_e4m3fn).float()
    b = torch.randn(48, 16, dtype=torch.bfloat16).to(torch.float8_e4m3fn).float().t()
    assert out.dtype == torch.bfloat16
    torch.testing.assert_close(out, (a @ b).bfloat16())


@pytest.mark.parametrize("dtype", ["fp32", "bf16"])
def test_sweep_gives_positive_tflops_from_2mnk(monkeypatch, dtype):
    monkeypatch.setattr(matmul, "CPU_SHAPES", [(64, 64, 64), (128, 128, 128)])
    monkeypatch.setattr(matmul, "ESTIMATE_MARGIN", 0.0)  # measure every shape, however busy the machine is
    results = matmul.sweep(dtype, CPU, budget=0.2)
    assert [(r["m"], r["n"], r["k"]) for r in results] == [(64, 64, 64), (128, 128, 128)]
    for r in results:
        assert r["dtype"] == dtype and r["seconds"] > 0
        assert r["tflops"] == pytest.approx(2 * r["m"] * r["n"] * r["k"] / r["seconds"] / 1e12)
    best, median = matmul.summary(results)
    assert best == max(r["tflops"] for r in results) and 0 < median <= best


def test_sweep_stops_before_a_shape_the_budget_cannot_pay_for(monkeypatch):
    # 8192^3 in fp32 is ~1 TFLOP: tens of seconds on a CPU, far beyond a 0.1 s budget.
    monkeypatch.setattr(matmul, "CPU_SHAPES", [(64, 64, 64), (8192, 8192, 8192)])
    seen = []
    results = matmul.sweep("fp32", CPU, budget=0.1, on_shape=seen.append)
    assert len(results) == 1 and len(seen) == 2 and seen[1] is None


def test_summary_is_best_and_median():
    results = [{"tflops": t} for t in (1.0, 3.0, 2.0, 10.0)]
    assert matmul.summary(results) == (10.0, 2.5)


def test_fp8_is_unavailable_on_cpu_and_the_others_are_not():
    assert "capability >= 8.9" in matmul.unavailable("fp8", CPU)
    assert all(matmul.unavailable(d, CPU) is None for d in ("fp32", "tf32", "fp16", "bf16"))


def test_shapes_are_smallest_first():
    for device in (CPU, torch.device("cuda")):
        for quick in (False, True):
            flops = [m * n * k for m, n, k in matmul.shapes(device, quick)]
            assert flops == sorted(flops)
    # the classic 16384^2 product is in every GPU sweep
    assert (16384, 16384, 16384) in matmul.shapes(torch.device("cuda"), quick=True)
