"""Sweep config values over the real training step: it/s, tokens/s, TFLOP/s, MFU and memory per combination,
each beside the planner's figure for it.

`run_sweep(config_path, overrides, sweep={"train.seq_len": [256, 1024]}, ...)` returns a JSON-ready dict and
writes sweep.csv, sweep.json and sweep.png; `parse_items(items)` splits command-line items into the config
file, the fixed overrides and the swept lists. See docs/sweep.md.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from .grid import parse_items

if TYPE_CHECKING:  # what __getattr__ hands out, named for the type checker without importing torch at runtime
    from .run import run_sweep
    from .synthetic import SyntheticTokens

__all__ = ["run_sweep", "parse_items", "SyntheticTokens"]


def __getattr__(name: str) -> object:
    # Imported on first use: `pretrain --help` imports pretrain.sweep.command, hence this package, and must
    # not pay for importing torch.
    if name == "run_sweep":
        from .run import run_sweep

        return run_sweep
    if name == "SyntheticTokens":
        from .synthetic import SyntheticTokens

        return SyntheticTokens
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
