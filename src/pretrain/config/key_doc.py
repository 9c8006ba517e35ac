"""How a config key is declared and how its value is written: `doc` makes a section's dataclass field with its
meaning, allowed values and what the trainer runs, read by docs/config.md's key table (key_table.py) and by
`untrained` (trainable.py); `shown_value` writes a value as YAML does. Its own module because every section's
module declares its keys with it, below the schema that gathers them."""

from __future__ import annotations

from dataclasses import field
from typing import Any, cast


def doc(default: Any, text: str, choices: tuple[Any, ...] | None = None, trains: tuple[Any, ...] | None = None) -> Any:
    """A dataclass field with its documentation, the allowed values (for strings) and, when the trainer runs
    fewer values than the planner models, the ones it runs (`trains`): `check_trainable` refuses the others
    and docs/config.md's key table says so, both from this one place."""
    metadata: dict[str, Any] = {"doc": text, "choices": choices, "trains": trains}
    if isinstance(default, list):
        items = cast(list[Any], default)
        return field(default_factory=lambda: list(items), metadata=metadata)
    return field(default=default, metadata=metadata)


def shown_value(v: object) -> str:
    return str(v).lower() if isinstance(v, bool) else str(v)
