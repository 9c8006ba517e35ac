"""Numbers as people read them: 6.74B parameters, 52.3K tokens/s, 61.20 GiB, 41.5 %. Pure Python, the one
home of these rules for the planner, the trainer's plan-vs-run table, the sweep and the report."""

from __future__ import annotations

GiB = 1024**3  # memory in binary units, as allocators and `nvidia-smi` report it
MiB = 1024**2
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
    if abs(n) >= GiB:
        return gib(n)
    return f"{n / MiB:.1f} MiB"


def gib(n: float) -> str:
    """Memory in GiB whatever its size (the planner's --explain lines, which compare terms)."""
    return f"{n / GiB:.2f} GiB"


def quantity(value: float | None, unit: str) -> str:
    """A plan-vs-run value in its unit (`plan_vs_run.json` names the unit of every row)."""
    if value is None:
        return "-"
    if unit == "bytes":
        return nbytes(value)
    if unit == "fraction":
        return f"{100 * value:.1f} %"
    if unit == "tokens/s":
        return f"{human(value)} tokens/s"
    return f"{value:.4g} {unit}".rstrip()


def number(value, digits: int = 4) -> str:
    """A loss or a norm; the trainer writes a non-finite one in events as a string ("nan", "inf")."""
    if value is None:
        return "-"
    return f"{value:.{digits}g}" if isinstance(value, (int, float)) else str(value)
