"""The `[CONFIG.yaml] [section.key=value ...]` arguments every config-taking subcommand shares."""

from __future__ import annotations

import argparse

from .config import ResolvedConfig, load_config
from .errors import ConfigError


def add_config_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "items",
        nargs="*",
        metavar="CONFIG|KEY=VALUE",
        help="an optional YAML config file, then section.key=value overrides (e.g. train.lr=3e-4)",
    )


def split_items(items: list[str]) -> tuple[str | None, list[str]]:
    """The first item without '=' is the config file; everything else is an override."""
    paths = [i for i in items if "=" not in i]
    if len(paths) > 1:
        raise ConfigError(
            f"more than one config file given ({', '.join(paths)}); give one YAML file and section.key=value overrides"
        )
    if paths and not paths[0].strip():
        raise ConfigError("the config file name is empty; give a YAML file or leave it out")
    if paths and items[0] != paths[0]:
        raise ConfigError(f"the config file {paths[0]} must come before the key=value overrides")
    return (paths[0] if paths else None), [i for i in items if "=" in i]


def config_from_args(args: argparse.Namespace) -> ResolvedConfig:
    path, overrides = split_items(args.items)
    return load_config(path, overrides)
