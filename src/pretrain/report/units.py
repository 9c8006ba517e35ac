"""Numbers as a reader of a training report expects them: 13.1M tokens, 52.3K tokens/s, 61.2 GiB, 41.5 %."""

from __future__ import annotations

from ..units import human, nbytes  # noqa: F401 - re-exported for the report's modules


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
