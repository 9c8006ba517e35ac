"""The grid of a sweep: which config keys take a list of values, and every combination of them.

`train.seq_len=256,1024,4096` sweeps three values; a key whose type is a list (`train.betas=0.9,0.95`) keeps
its own comma syntax and is one value. The cells are the Cartesian product, the first swept key varying
slowest (the order a reader of the table expects); each becomes a `Cell` once loaded and planned. Pure Python:
no torch.
"""

from __future__ import annotations

import itertools
import typing
from dataclasses import dataclass, field

from ..config import SECTIONS, ResolvedConfig
from ..config_args import split_items
from ..errors import UsageError

if typing.TYPE_CHECKING:
    from ..distributed.runtime import Runtime


def is_list_key(key: str) -> bool:
    """True for config keys whose value is itself a list (train.betas, debug.inject_nan_batches)."""
    section, _, name = key.partition(".")
    cls = SECTIONS.get(section)
    if cls is None:
        return False
    hint = typing.get_type_hints(cls).get(name)
    return hint is not None and typing.get_origin(hint) is list


def parse_items(items: list[str]) -> tuple[str | None, list[str], dict[str, list[str]]]:
    """CLI items -> (config file or None, fixed overrides, {swept key: [values]}).

    An override whose value holds a comma is swept, unless its key is list-typed. Unknown keys are left to
    `load_config`, which names them; a later item for the same key replaces an earlier one, as overrides do.
    """
    path, overrides = split_items(items)
    fixed: dict[str, str] = {}
    swept: dict[str, list[str]] = {}
    for item in overrides:
        key, value = (s.strip() for s in item.split("=", 1))
        fixed.pop(key, None)
        swept.pop(key, None)
        if "," in value and not is_list_key(key):
            swept[key] = split_values(key, value)
        else:
            fixed[key] = value
    return path, [f"{k}={v}" for k, v in fixed.items()], swept


def split_values(key: str, value: str) -> list[str]:
    """'32,64,,128' -> an error naming the key; '32, 64' -> ['32', '64']; duplicates are dropped."""
    values = [v.strip() for v in value.split(",")]
    if any(v == "" for v in values):
        raise UsageError(f"{key}: empty value in the list {value!r}; give comma-separated values like {key}=1,2,4")
    return list(dict.fromkeys(values))


def cells(swept: dict[str, list]) -> list[dict[str, str]]:
    """Every combination of the swept values, as {key: value}; one empty cell when nothing is swept."""
    for key, values in swept.items():
        if not values:
            raise UsageError(f"{key}: no values to sweep; give comma-separated values like {key}=1,2,4")
    keys = list(swept)
    return [dict(zip(keys, combo)) for combo in itertools.product(*(swept[k] for k in keys))]


@dataclass
class Cell:
    """One combination of the grid, loaded and planned (sweep/run.py's prepare_cells), as the run and its
    record read it."""

    index: int
    values: dict  # swept key -> value as the config resolved it (int 64, not "64")
    overrides: list[str]  # the cell's own section.key=value items
    config: ResolvedConfig
    device_config: ResolvedConfig  # config as planned on this device (plan_check.config_for_device)
    rt: Runtime
    plan: dict = field(default_factory=dict)


def cell_overrides(cell: dict) -> list[str]:
    """The `section.key=value` overrides of one cell (values as a command line writes them)."""
    return [f"{k}={_text(v)}" for k, v in cell.items()]


def _text(value) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if value is None:
        return "null"
    return str(value)
