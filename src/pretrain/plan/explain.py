"""The trail behind every planned figure: `pretrain plan --explain` prints it."""

from __future__ import annotations

from typing import TypeVar

V = TypeVar("V")


class Explain:
    """Collects (section, name, value, formula with the numbers substituted)."""

    def __init__(self) -> None:
        self.lines: list[tuple[str, str, str, str]] = []

    def add(self, section: str, name: str, value: V, formula: str) -> V:
        self.lines.append((section, name, fmt(value), formula))
        return value

    def render(self) -> str:
        out: list[str] = []
        current = None
        for section, name, value, formula in self.lines:
            if section != current:
                out.append(f"\n[{section}]")
                current = section
            out.append(f"  {name} = {value}")
            if formula:
                out.append(f"      = {formula}")
        return "\n".join(out).lstrip("\n")


def fmt(value: object) -> str:
    """Numbers as a reader checks them by hand: grouped integers, 4 significant digits otherwise."""
    if isinstance(value, bool) or value is None:
        return str(value)
    if isinstance(value, int):
        return f"{value:,}"
    if isinstance(value, float):
        if value != 0.0 and (abs(value) >= 1e7 or abs(value) < 1e-3):
            return f"{value:.4g}"
        return f"{value:,.4g}" if abs(value) >= 1000 else f"{value:.4g}"
    return str(value)
