"""What `pretrain plan` answers, the same text for its command line (command.py) and its page (serve.py): the
--json text, and --fit's ranking with the config whose layouts it searched."""

from __future__ import annotations

import json
from typing import Any

from ..config import ResolvedConfig


def as_json(result: dict[str, Any]) -> str:
    """The text of `--json` (without print's newline); the page's /api/plan and /api/fit answer the same."""
    return json.dumps(result, indent=2)


def fit_result(config: ResolvedConfig, top: int) -> tuple[ResolvedConfig, dict[str, Any]]:
    """(the config whose layouts were searched, the --fit ranking): in budget mode, the model it buys."""
    from ..errors import UsageError
    from . import plan_with_explain, planned_config
    from .budget_mode import budget_requested
    from .fit import fit
    from .fit_fp8 import weigh

    if top < 1:
        raise UsageError(f"--top: must be at least 1, got {top}")
    if budget_requested(config):  # budget mode: the layouts of the model the budget buys (its advice unread)
        config = planned_config(config, plan_with_explain(config, advice=False)[0])
    result = fit(config, top=top)
    weighed = weigh(config, result)  # a card with float8: the other precision's fastest beside (plan/fit_fp8.py)
    return config, {**result, "fp8_vs_bf16": weighed} if weighed else result
