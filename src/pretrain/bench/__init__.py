"""Measure what this machine achieves: matmul TFLOP/s per dtype, memory bandwidth, one transformer block.

`run_bench(...)` returns a hardware profile; `write_profile(profile, path)` saves it for
`pretrain plan hardware.profile=PATH`, which then divides by measured peaks instead of data-sheet ones.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:  # the names __getattr__ hands out, for a type checker and an editor
    from .run import run_bench, write_profile

DTYPES = ("fp32", "tf32", "fp16", "bf16", "fp8")  # the keys of a profile's peak_tflops, as plan/hardware.py
__all__ = ["DTYPES", "run_bench", "write_profile"]


def __getattr__(name: str):
    # Imported on first use: `pretrain --help` imports pretrain.bench.command, hence this package, and must
    # not pay for importing torch.
    if name in ("run_bench", "write_profile"):
        from . import run

        return getattr(run, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
