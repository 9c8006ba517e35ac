"""data.mixture checked and completed (`mixture_sources`): the trainer and the planner both read a mixture
through it, so they agree on each source's name and share. Its own module because a mixture's entries are
mappings checked key by key, as the rest of a config is by its schema."""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

from ..errors import ConfigError
from .job_sections import DataConfig
from .reading import coerce, shown, unknown

MIXTURE_KEYS = ("dir", "weight", "name", "max_epochs")


def mixture_sources(data: DataConfig) -> list[dict[str, Any]]:
    """data.mixture checked and completed: [{name, dir, weight (normalised to sum 1), max_epochs or None}].
    The trainer and the planner both read the mixture through this, so they agree on names and shares."""
    sources: list[dict[str, Any]] = []
    for i, entry in enumerate(data.mixture):
        key = f"data.mixture[{i}]"
        extra = [k for k in entry if k not in MIXTURE_KEYS]
        if extra:
            raise ConfigError(unknown(f"{key}.{extra[0]}", [f"{key}.{k}" for k in MIXTURE_KEYS], "key"))
        for required in ("dir", "weight"):
            if entry.get(required) in (None, ""):
                raise ConfigError(
                    f"{key}: no {required}; each source is {{dir: DIR, weight: W}} (weights count tokens)"
                )
        directory = coerce(f"{key}.dir", entry["dir"], str)
        weight = coerce(f"{key}.weight", entry["weight"], float)
        if not math.isfinite(weight) or weight <= 0:
            raise ConfigError(f"{key}.weight: must be a finite number > 0, got {weight}")
        max_epochs = entry.get("max_epochs")
        if max_epochs is not None:
            max_epochs = coerce(f"{key}.max_epochs", max_epochs, float)
            if not math.isfinite(max_epochs) or max_epochs <= 0:
                raise ConfigError(f"{key}.max_epochs: must be a finite number > 0, got {max_epochs}")
        name = coerce(f"{key}.name", entry.get("name") or Path(directory.rstrip("/")).name, str)
        if not name or "/" in name:  # names become metric keys: val_loss/<name>, source_tokens/<name>
            raise ConfigError(f"{key}.name: {shown(name)} is not a usable name; give a non-empty name without '/'")
        if any(s["name"] == name for s in sources):
            raise ConfigError(f"{key}.name: two sources are named {name!r}; give each a distinct name")
        sources.append({"name": name, "dir": directory, "weight": weight, "max_epochs": max_epochs})
    total = sum(s["weight"] for s in sources)
    return [{**s, "weight": s["weight"] / total} for s in sources]
