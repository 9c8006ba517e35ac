"""One config schema for every subcommand: `plan`, `train`, `sweep` and `bench` read the same sections.

A config is a YAML file plus `section.key=value` overrides. Every field carries a `doc` string; the key table
of docs/config.md is generated from it (`pretrain config --docs`), so the code and the docs cannot drift apart.
Pure Python: importing this package imports neither torch nor numpy.

schema.py: the whole config and its sections by name, each section's keys declared (`key_doc.py`) in
model_section.py, job_sections.py (train, parallel, data), planner_sections.py and trainer_sections.py;
reading.py: YAML and values from text; checks.py: what a config must satisfy; mixture.py: data.mixture's
entries checked and completed; trainable.py: what the trainer runs of it; here: loading and variants
(`load_config`, `replaced`).
"""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any

from ..errors import ConfigError
from .checks import resolve, validate
from .key_table import docs_markdown
from .mixture import mixture_sources
from .reading import build_section, deep_copy, read_yaml, resolve_model, shown, split_override, unknown
from .schema import SECTIONS, Config, ResolvedConfig, compile_enabled, half_residual_enabled
from .trainable import untrained

__all__ = [
    "Config",
    "ResolvedConfig",
    "SECTIONS",
    "load_config",
    "replaced",
    "from_dict",
    "resolve",
    "validate",
    "untrained",
    "mixture_sources",
    "compile_enabled",
    "half_residual_enabled",
    "docs_markdown",
]


def load_config(
    path: str | Path | dict[str, Any] | None = None, overrides: list[str] | tuple[str, ...] = ()
) -> ResolvedConfig:
    """Read a YAML file (or a dict), apply `section.key=value` overrides, resolve the model, validate."""
    raw = read_yaml(path) if not isinstance(path, dict) else deep_copy(path)
    for item in overrides:
        key, value = split_override(item)
        section, name = key.split(".", 1)
        if raw.get(section) is None:  # absent, or `train:` with nothing under it
            raw[section] = {}
        if not isinstance(raw[section], dict):
            raise ConfigError(f"{section}: must be a mapping of keys, got {shown(raw[section])}")
        raw[section][name] = value
    return from_dict(raw)


def replaced(config: Config, overrides: dict[str, Any]) -> ResolvedConfig:
    """A new Config: `config` with {"section.key": value} applied (values already typed), then validated.
    `config` itself is left as loaded: the planner's budget mode and `--fit` plan the configs they choose
    through this, never by writing into the caller's."""
    by_section: dict[str, dict[str, Any]] = {}
    for key, value in overrides.items():
        section, name = key.split(".", 1)
        if section not in SECTIONS or name not in {f.name for f in dataclasses.fields(SECTIONS[section])}:
            raise ConfigError(
                unknown(key, [f"{s}.{f.name}" for s, cls in SECTIONS.items() for f in dataclasses.fields(cls)], "key")
            )
        by_section.setdefault(section, {})[name] = value
    new = dataclasses.replace(
        config, **{s: dataclasses.replace(getattr(config, s), **v) for s, v in by_section.items()}
    )
    return resolve(new)


def from_dict(raw: dict[str, Any]) -> ResolvedConfig:
    raw = deep_copy(raw)
    for section in raw:
        if section not in SECTIONS:  # a YAML key may be a number or a boolean
            raise ConfigError(unknown(str(section), list(SECTIONS), "section"))
        if raw[section] is None:
            raw[section] = {}
        if not isinstance(raw[section], dict):
            raise ConfigError(f"{section}: must be a mapping of keys, got {shown(raw[section])}")
    raw["model"] = resolve_model(raw.get("model", {}))
    sections = {name: build_section(name, cls, raw.get(name, {})) for name, cls in SECTIONS.items()}
    return resolve(Config(**sections))
