"""What every report figure shares: the token axis's tick labels, one colour per run, PNG bytes. Below the
figure modules (plots, tasks, mixture), which all draw with it."""

from __future__ import annotations

import io

from matplotlib.figure import Figure
from matplotlib.ticker import FuncFormatter

from .. import units
from .runs import Run

TOKENS_AXIS = FuncFormatter(lambda v, _: units.human(v, digits=4))  # 4 digits: ticks at 51,250 and 51,500 differ


def run_colors(runs: list[Run]) -> list[str]:
    return [f"C{i % 10}" for i in range(len(runs))]


def figure_png(fig: Figure) -> bytes:
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=100)
    return buf.getvalue()
