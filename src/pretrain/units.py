"""Numbers as people read them: 6.74B parameters, 52.3K tokens/s, 61.20 GiB. Pure Python, shared by the
planner's table, the trainer's plan-vs-run table and the report."""

from __future__ import annotations

_SUFFIXES = ((1e12, "T"), (1e9, "B"), (1e6, "M"), (1e3, "K"))


def human(n: float | None, digits: int = 3) -> str:
    """Counts (parameters, tokens, tokens/s) with a decimal suffix: 1500 -> 1.5K, 2.1e9 -> 2.1B."""
    if n is None:
        return "-"
    for scale, suffix in _SUFFIXES:
        if abs(n) >= scale:
            return f"{n / scale:.{digits}g}{suffix}"
    return f"{n:.{digits}g}"


def nbytes(n: float | None) -> str:
    """Memory in binary units, as allocators and `nvidia-smi` report it."""
    if n is None:
        return "-"
    if abs(n) >= 1024**3:
        return f"{n / 1024**3:.2f} GiB"
    return f"{n / 1024**2:.1f} MiB"
