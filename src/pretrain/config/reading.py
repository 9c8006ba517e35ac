"""From text to typed values: a YAML file read safely (duplicate keys, alias bombs, one-line errors), a
`section.key=value` override split, each value coerced to its key's type, and the unknown-key hint."""

from __future__ import annotations

import dataclasses
import difflib
import types
import typing
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeVar, Union, cast

from ..errors import ConfigError
from ..files import read_bounded
from ..hf_config import from_hf_config
from ..presets import preset

if TYPE_CHECKING:
    from _typeshed import DataclassInstance
    from yaml import MappingNode, Node

Section = TypeVar("Section", bound="DataclassInstance")  # one of schema.py's SECTIONS


def read_yaml(path: str | Path | None) -> dict[str, Any]:
    if path is None:
        return {}
    import yaml  # PyYAML: a light import, only when a file is read

    path = Path(path)
    try:
        text = read_bounded(path).decode("utf-8")
    except FileNotFoundError:
        raise ConfigError(f"config file {path} does not exist; give a YAML file (see configs/)") from None
    except IsADirectoryError:
        raise ConfigError(f"config file {path} is a directory; give a YAML file (see configs/)") from None
    except UnicodeDecodeError as e:
        raise ConfigError(
            f"config file {path} is not UTF-8 text (byte {e.start}); give a YAML file (see configs/)"
        ) from None
    except OSError as e:  # a device or FIFO, too large, unreadable
        raise ConfigError(
            f"config file {path}: cannot read it ({e.strerror}); give a YAML file (see configs/)"
        ) from None
    try:
        data = _load_yaml(text, path)
    except yaml.YAMLError as e:
        where = getattr(e, "problem_mark", None)
        line = f" line {where.line + 1}" if where else ""
        problem = str(getattr(e, "problem", e))
        raise ConfigError(f"{path}{line}: not valid YAML ({problem[:200]})") from None
    except RecursionError:
        raise ConfigError(f"{path}: nested too deeply to be a config; give sections of key: value") from None
    if data is None:  # an empty file
        return {}
    if not isinstance(data, dict):
        raise ConfigError(f"{path}: the top level must be a mapping of sections (model:, train:, ...)")
    return cast(dict[str, Any], data)  # YAML's keys: a section named 1 or true is refused by from_dict


# Values a YAML file may expand to, aliases (*name) counted as often as they are used: a config has ~100. The
# bound refuses a "billion laughs" file (nested aliases: 300 bytes that expand to ~10^9 values) before
# anything walks or prints the expansion.
MAX_YAML_VALUES = 100_000


def _load_yaml(text: str, path: Path) -> Any:
    """yaml.safe_load, refusing (one line each) a key given twice in one mapping (YAML 1.2 forbids it; PyYAML
    keeps the last silently), a duplicate section, and aliases expanding to more than MAX_YAML_VALUES."""
    import yaml

    loader: Any = yaml.SafeLoader(text)  # Any: PyYAML's stubs leave construct_document and dispose untyped
    try:
        root = loader.get_single_node()
        if root is None:
            return None
        _check_yaml_nodes(root, path)
        try:
            return loader.construct_document(root)
        except ValueError as e:  # int() of 5,000 digits, a date 2024-13-45: PyYAML lets Python's error through
            problem = f"a value it cannot convert: {str(e).split(';')[0]}"
            raise yaml.constructor.ConstructorError(problem=problem) from None
    finally:
        loader.dispose()


def _check_yaml_nodes(root: Node, path: Path) -> None:
    import yaml

    expanded: dict[int, int] = {}  # id(node) -> values it expands to: each shared node is counted once

    def size(node: Node, open_nodes: set[int]) -> int:
        if id(node) in expanded:
            return expanded[id(node)]
        if id(node) in open_nodes:
            raise ConfigError(
                f"{path} line {node.start_mark.line + 1}: an alias refers to a value that contains "
                "it (a recursive structure); write the values out"
            )
        open_nodes.add(id(node))
        n = 1
        if isinstance(node, yaml.MappingNode):
            _refuse_duplicate_keys(node, path, node is root)
            n += sum(size(key, open_nodes) + size(value, open_nodes) for key, value in node.value)
        elif isinstance(node, yaml.SequenceNode):
            n += sum(size(item, open_nodes) for item in node.value)
        open_nodes.discard(id(node))
        if n > MAX_YAML_VALUES:
            raise ConfigError(
                f"{path}: its aliases expand to more than {MAX_YAML_VALUES:,} values (a config has "
                "~100); write the values out instead of nesting aliases"
            )
        expanded[id(node)] = n
        return n

    size(root, set())


def _refuse_duplicate_keys(node: MappingNode, path: Path, top_level: bool) -> None:
    first: dict[tuple[str, str], int] = {}  # (tag, text) of a key -> the line it first appears on
    for key, _ in node.value:
        if not isinstance(key.value, str) or key.tag == "tag:yaml.org,2002:merge":
            continue  # a complex key, or `<<: *defaults` (YAML's merge key: its keys may be overridden)
        line = key.start_mark.line + 1
        if (key.tag, key.value) in first:
            what = "section" if top_level else "key"
            raise ConfigError(
                f"{path} line {line}: {what} {shown(key.value)} is given twice (first at line "
                f"{first[key.tag, key.value]}); YAML would keep only the last: keep one"
            )
        first[key.tag, key.value] = line


def shown(value: object, limit: int = 80) -> str:
    """A value echoed in an error, at most `limit` characters of its repr (a value from a file can be huge)."""
    text = repr(value)
    return text if len(text) <= limit else f"{text[: limit - 3]}..."


def split_override(item: str) -> tuple[str, str]:
    if "=" not in item:
        raise ConfigError(f"override {item!r} must look like section.key=value (e.g. train.lr=3e-4)")
    key, value = item.split("=", 1)
    key = key.strip()
    if "." not in key:
        raise ConfigError(f"override {item!r} must name a section: section.key=value (e.g. model.preset=gpt2)")
    return key, value.strip()


def resolve_model(user: dict[str, Any]) -> dict[str, Any]:
    """preset or hf_config first, then the keys the user gave on top of it."""
    base: dict[str, Any] = {}
    if user.get("preset") not in (None, "", "null", "none"):
        base = preset(str(user["preset"]))
    if user.get("hf_config") not in (None, "", "null"):
        base = from_hf_config(str(user["hf_config"]))
    base.update({k: v for k, v in user.items()})
    return base


def build_section(section: str, cls: type[Section], values: dict[str, Any]) -> Section:
    hints = typing.get_type_hints(cls)
    names = [f.name for f in dataclasses.fields(cls)]
    kwargs: dict[str, Any] = {}
    for key, value in values.items():
        if key not in hints:
            raise ConfigError(unknown(f"{section}.{key}", [f"{section}.{n}" for n in names], "key"))
        kwargs[key] = coerce(f"{section}.{key}", value, hints[key])
    obj = cls(**kwargs)
    for f in dataclasses.fields(cls):
        choices = f.metadata.get("choices")
        value = getattr(obj, f.name)
        items = cast(list[Any], value) if isinstance(value, list) else [value]
        for one in items:  # a list's choices apply to each item
            if choices and one not in choices:
                allowed = " | ".join(str(c) for c in choices)
                raise ConfigError(f"{section}.{f.name}: {shown(one)} is not allowed; choose one of {allowed}")
    return obj


def unknown(name: str, allowed: list[str], what: str) -> str:
    close = difflib.get_close_matches(name, allowed, n=1, cutoff=0.6)
    hint = f"did you mean {close[0]}?" if close else "see `pretrain config --docs` for all keys"
    return f"unknown config {what} {name!r}; {hint}"


_NULLS = ("null", "~", "None")
_TRUE = ("true", "yes", "on", "1")
_FALSE = ("false", "no", "off", "0")


def coerce(key: str, value: Any, tp: Any) -> Any:
    """Turn a YAML value or a command-line string into the field's type, or say what was expected."""
    origin = typing.get_origin(tp)
    if origin in (Union, types.UnionType):
        return _coerce_union(key, value, tp)
    if origin is list:
        return _coerce_list(key, value, tp)
    if tp is bool:
        if isinstance(value, bool):
            return value
        if isinstance(value, str) and value.lower() in _TRUE + _FALSE:
            return value.lower() in _TRUE
        raise ConfigError(f"{key}: expected true or false, got {shown(value)}")
    if tp is int:
        return _coerce_int(key, value)
    if tp is float:
        if isinstance(value, bool):
            raise ConfigError(f"{key}: expected a number, got {shown(value)}")
        number = _number(value)
        if number is None:
            raise ConfigError(f"{key}: expected a number, got {shown(value)}")
        return float(number)
    if _is_mapping(tp):  # a data.mixture entry (on the command line the whole list is YAML), model.rope_scaling
        value = _yaml_string(key, value, "mapping")  # model.rope_scaling={rope_type: yarn, factor: 4, ...}
        if not isinstance(value, dict):
            raise ConfigError(f"{key}: expected a mapping like {{name: value, ...}}, got {shown(value)}")
        return dict(cast(dict[str, Any], value))
    if tp is str:
        if isinstance(value, (dict, list)):
            raise ConfigError(f"{key}: expected a string, got {shown(cast(object, value))}")
        return str(value)
    raise ConfigError(f"{key}: unsupported type {tp}")  # pragma: no cover - schema bug


def _coerce_union(key: str, value: Any, tp: Any) -> Any:
    options = [a for a in typing.get_args(tp) if a is not type(None)]
    if value is None or (isinstance(value, str) and value in _NULLS):
        if type(None) in typing.get_args(tp):
            return None
    # Prefer int over float for "100" and float over int for "0.005".
    errors: list[str] = []
    for option in sorted(options, key=lambda t: 0 if t is int else 1):
        try:
            return coerce(key, value, option)
        except ConfigError as e:
            errors.append(str(e))
    raise ConfigError(errors[-1])


def _coerce_list(key: str, value: Any, tp: Any) -> list[Any]:
    (inner,) = typing.get_args(tp)
    if _is_mapping(inner):  # data.mixture=[{dir: a, weight: 0.7}, ...]
        value = _yaml_string(key, value, "list")
    if isinstance(value, str):
        value = [v for v in value.strip("[]() ").split(",") if v.strip()]
    if not isinstance(value, (list, tuple)):
        raise ConfigError(f"{key}: expected a list like [0.9, 0.95], got {shown(value)}")
    return [coerce(key, v, inner) for v in cast(Sequence[Any], value)]


def _is_mapping(tp: Any) -> bool:
    """A schema type of a mapping: `dict[str, Any]` (model.rope_scaling, a data.mixture entry)."""
    return tp is dict or typing.get_origin(tp) is dict


def _yaml_string(key: str, value: Any, what: str) -> Any:
    """A command-line string of YAML (a list of mappings, a mapping) read as YAML; anything else as it is."""
    if not isinstance(value, str):
        return value
    import yaml

    try:
        return _load_yaml(value, Path(key))
    except yaml.YAMLError as e:
        raise ConfigError(f"{key}: not a YAML {what} ({' '.join(str(e).split())[:120]})") from None
    except RecursionError:  # 10,000 nested [ or {: PyYAML's parser recurses
        raise ConfigError(f"{key}: nested too deeply to be a YAML {what}") from None


def _coerce_int(key: str, value: Any) -> int:
    if isinstance(value, bool):
        raise ConfigError(f"{key}: expected an integer, got {shown(value)}")
    if isinstance(value, int):
        return value
    try:  # exactly, before a float would round a large integer
        return int(str(value).replace("_", ""))
    except ValueError:
        pass
    counted = suffixed_count(value)
    if counted is not None:
        return counted
    number = _number(value)  # 1.4e12 and 2_000 are integers too
    if number is not None and float(number).is_integer():
        return int(number)
    raise ConfigError(
        f"{key}: expected a whole number (4096, 4e9, 15T; K/M/B/T are 1e3/1e6/1e9/1e12), got {shown(value)}"
    )


# Counts as practitioners write them: 15T tokens, a 4M-token batch, a 32K vocabulary. Decimal, as in papers
# (Llama 3's "15T tokens" is 15e12), never binary.
COUNT_SUFFIXES = {"K": 10**3, "M": 10**6, "B": 10**9, "T": 10**12}


def suffixed_count(value: Any) -> int | None:
    """15T -> 15_000_000_000_000, 1.5B -> 1_500_000_000, 32k -> 32_000; None when `value` has no such suffix
    or is not a whole number once scaled (exact: 1.5B is not rounded through a float)."""
    from fractions import Fraction

    if not isinstance(value, str) or len(value.strip()) < 2:
        return None
    text = value.strip().replace("_", "")
    scale = COUNT_SUFFIXES.get(text[-1].upper())
    if scale is None:
        return None
    try:
        number = Fraction(text[:-1].strip()) * scale
    except (ValueError, ZeroDivisionError):
        return None
    return int(number) if number.denominator == 1 else None


def count_argument(text: str) -> int:
    """argparse's type for a count flag (--vocab-size 32K, --max-docs 2K): an integer, with K/M/B/T allowed."""
    import argparse

    try:
        return coerce("count", text, int)
    except ConfigError:
        raise argparse.ArgumentTypeError(f"expected a whole number such as 2000 or 2K, got {text!r}") from None


def _number(value: Any) -> float | None:
    if isinstance(value, (int, float)):
        return value
    if isinstance(value, str):
        try:
            return float(value.replace("_", ""))
        except ValueError:
            return None
    return None


def deep_copy(data: dict[str, Any] | None) -> dict[str, Any]:
    return {k: (deep_copy(cast(dict[str, Any], v)) if isinstance(v, dict) else v) for k, v in (data or {}).items()}
