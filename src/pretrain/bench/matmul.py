"""Achievable matmul throughput per dtype over a sweep of shapes: TFLOP/s = 2*m*n*k / median seconds.

The classic test times one 16384^2 product. Throughput depends on the shape (tile quantisation, wave
quantisation over the SMs, which kernel cuBLAS picks), so, like the public "maximum achievable matmul FLOPS"
finders, we sweep squares and the GEMMs of a transformer layer and report the best (the ceiling a training
run can reach, what the planner should divide by) and the median (what a mix of shapes gets).

Operands are random normal: all-zero inputs switch fewer transistors, draw less power and clock higher,
which flatters the result.
"""

from __future__ import annotations

import contextlib
import statistics
import time

import torch

from ..precision import TORCH_DTYPES
from .timing import median_seconds, synchronize

# (m, n, k): squares, and a layer's GEMMs at 16384 tokens per micro-batch: qkv and MLP up/down of an
# H=4096, H'=14336 model (Llama 3 8B), and an H=8192 square.
GPU_SHAPES = [(n, n, n) for n in (2048, 4096, 6144, 8192, 12288, 16384)] + [
    (16384, 4096, 4096),
    (16384, 12288, 4096),
    (16384, 14336, 4096),
    (16384, 4096, 14336),
    (16384, 8192, 8192),
]
GPU_QUICK_SHAPES = [(4096, 4096, 4096), (8192, 8192, 8192), (16384, 14336, 4096), (16384, 16384, 16384)]
# A CPU is 100-1000x slower, and fp16 on most CPUs is emulated (a 1024^3 product takes seconds): the budget
# check in `sweep` stops a dtype at the first shape it could not finish.
CPU_SHAPES = [(n, n, n) for n in (256, 512, 768, 1024, 1536, 2048)] + [(1024, 2816, 1024), (2048, 1024, 2816)]
CPU_QUICK_SHAPES = [(256, 256, 256), (512, 512, 512), (1024, 1024, 1024)]

# A shape is tried only if its estimated cost (per-call time extrapolated from the previous shape's TFLOP/s,
# times this margin for throughput that falls with size, times the calls of one measurement) fits the budget.
ESTIMATE_MARGIN = 2.0
CALLS_PER_MEASUREMENT = 5  # the warm-up calls and the minimum repeats of timing.py


def shapes(device: torch.device, quick: bool) -> list[tuple[int, int, int]]:
    if device.type == "cuda":
        chosen = GPU_QUICK_SHAPES if quick else GPU_SHAPES
    else:
        chosen = CPU_QUICK_SHAPES if quick else CPU_SHAPES
    return sorted(chosen, key=lambda s: s[0] * s[1] * s[2])


def unavailable(dtype: str, device: torch.device) -> str | None:
    """Why `dtype` cannot be measured on `device`, or None when it can."""
    if dtype == "fp8":
        if device.type != "cuda":
            return "fp8 matmuls need a CUDA GPU of compute capability >= 8.9 (Ada, Hopper or newer)"
        major, minor = torch.cuda.get_device_capability(device)
        if (major, minor) < (8, 9):
            return f"fp8 needs compute capability >= 8.9; this GPU has {major}.{minor}"
        try:  # the backend may still refuse (a ROCm card, an old cuBLASLt): ask it with a small product
            matmul_fn(256, 256, 256, dtype, device)()
            synchronize(device)
        except RuntimeError as e:
            return f"fp8 matmul failed: {str(e).splitlines()[0]}"
    if dtype == "bf16" and device.type == "cuda" and not torch.cuda.is_bf16_supported(including_emulation=False):
        return "this GPU has no bf16 tensor cores (Volta, Turing)"
    return None


@contextlib.contextmanager
def fp32_precision(dtype: str, device: torch.device):
    """tf32 is an fp32 matmul with TF32 tensor cores allowed, as `pretrain train` runs fp32 on CUDA."""
    if device.type != "cuda":
        yield
        return
    previous = torch.get_float32_matmul_precision()
    torch.set_float32_matmul_precision("high" if dtype == "tf32" else "highest")
    try:
        yield
    finally:
        torch.set_float32_matmul_precision(previous)


def matmul_fn(m: int, n: int, k: int, dtype: str, device: torch.device):
    """A closure computing one (m, k) @ (k, n) product in `dtype`."""
    if dtype == "fp8":
        # ROCm's MI300 implements the "fnuz" variant of e4m3. _scaled_mm wants b column-major and per-tensor
        # fp32 scales; it writes bf16. No fast accumulation: quicker on Hopper, but it loses precision.
        fp8 = torch.float8_e4m3fnuz if torch.version.hip else torch.float8_e4m3fn
        a = torch.randn(m, k, device=device, dtype=torch.bfloat16).to(fp8)
        b = torch.randn(n, k, device=device, dtype=torch.bfloat16).to(fp8).t()
        scale = torch.ones((), device=device, dtype=torch.float32)
        return lambda: torch._scaled_mm(a, b, scale_a=scale, scale_b=scale, out_dtype=torch.bfloat16)
    a = torch.randn(m, k, device=device, dtype=TORCH_DTYPES[dtype])
    b = torch.randn(k, n, device=device, dtype=TORCH_DTYPES[dtype])
    return lambda: a @ b


def measure(m: int, n: int, k: int, dtype: str, device: torch.device, budget: float) -> dict:
    """One shape: median seconds per product and the TFLOP/s it gives."""
    with fp32_precision(dtype, device):
        seconds = median_seconds(matmul_fn(m, n, k, dtype, device), device, budget)
    return {"dtype": dtype, "m": m, "n": n, "k": k, "seconds": seconds, "tflops": 2 * m * n * k / seconds / 1e12}


def sweep(
    dtype: str,
    device: torch.device,
    budget: float,
    quick: bool = False,
    on_shape=None,
    todo: list[tuple[int, int, int]] | None = None,
) -> list[dict]:
    """Measure `dtype` over the shape list (or `todo`: a later round's, the first round's shapes), smallest
    first, within about `budget` seconds.

    Stops before a shape whose estimated cost exceeds what is left (the smallest shape always runs).
    `on_shape(result or None)` is called once per shape of the list, None for a skipped one.
    """
    todo = todo or shapes(device, quick)
    work = [m * n * k for m, n, k in todo]
    results: list[dict] = []
    left = budget
    for i, (m, n, k) in enumerate(todo):
        if results:
            estimate = 2 * work[i] / (results[-1]["tflops"] * 1e12) * ESTIMATE_MARGIN
            if estimate * CALLS_PER_MEASUREMENT > left:
                for _ in todo[i:]:
                    if on_shape:
                        on_shape(None)
                break
        start = time.perf_counter()
        # A share of the budget in proportion to the shape's FLOPs: about as many repeats for each shape.
        results.append(measure(m, n, k, dtype, device, left * work[i] / sum(work[i:])))
        left -= time.perf_counter() - start
        if on_shape:
            on_shape(results[-1])
    return results


def summary(results: list[dict]) -> tuple[float, float]:
    """Best and median TFLOP/s over the measured shapes."""
    tflops = [r["tflops"] for r in results]
    return max(tflops), statistics.median(tflops)
