"""docs/config.md's key table, generated from the schema (`pretrain config --docs`): one place says what each
key is, and the docs cannot drift from it."""

from __future__ import annotations

import dataclasses

from .key_doc import shown_value
from .schema import SECTIONS


def docs_markdown() -> str:
    """The key table of docs/config.md: every section, key, default and meaning."""
    lines = ["| key | default | meaning |", "|---|---|---|"]
    for section, cls in SECTIONS.items():
        for f in dataclasses.fields(cls):
            default = f.default_factory() if f.default_factory is not dataclasses.MISSING else f.default
            shown = "null" if default is None else str(default).lower() if isinstance(default, bool) else default
            trains = f.metadata["trains"]
            note = (
                f" *Planner only beyond {' / '.join(f'`{shown_value(v)}`' for v in trains)}: the trainer runs "
                "only that.*"
                if trains
                else ""
            )
            lines.append(f"| `{section}.{f.name}` | `{shown}` | {f.metadata['doc']}{note} |")
    return "\n".join(lines)
