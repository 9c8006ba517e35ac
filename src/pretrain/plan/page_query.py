"""A query of the planner page: its `section.key=value` overrides, and the config they load, loaded only when
every file the planner would open for it is one the page may read (docs/plan.md, "The planner page")."""

from __future__ import annotations

from urllib.parse import parse_qsl

from ..config import ResolvedConfig, load_config, mixture_sources
from ..config.reading import shown, split_override
from ..errors import UsageError
from ..task_catalog import task_names

Readable = frozenset[tuple[str, str]]  # (key, path) pairs the page may open


def overrides(query: str) -> list[str]:
    """`a.b=1&c.d=x` -> ["a.b=1", "c.d=x"], as the CLI takes them; a pair without a section is refused."""
    items: list[str] = []
    for key, value in parse_qsl(query, keep_blank_values=True):
        if "." not in key:
            raise UsageError(f"query key {shown(key)} must name a section: section.key=value (e.g. parallel.gpus=64)")
        items.append(f"{key}={value}")
    return items


def read_paths(config: ResolvedConfig) -> set[tuple[str, str]]:
    """(key, path) of every file the planner opens for `config`: model.hf_config (its config.json),
    hardware.profile, data.dir and each data.mixture source's dir (their meta.json), run.eval_tasks' .jsonl
    files. The page reads only the values its start gave them; another is refused before anything is opened,
    in a line that does not say whether it exists. model.init_from and run.dir are paths as well, but the
    planner never opens them: any value of theirs plans."""
    pairs = {
        ("model.hf_config", config.model.hf_config),
        ("hardware.profile", config.hardware.profile),
        ("data.dir", config.data.dir),
    }
    pairs |= {("data.mixture", source["dir"]) for source in mixture_sources(config.data)}
    if config.run.eval_tasks:
        tasks = task_names(",".join(config.run.eval_tasks))
        pairs |= {("run.eval_tasks", name) for name in tasks if name.endswith(".jsonl")}
    return {(key, path) for key, path in pairs if path}


def readable_paths(start: ResolvedConfig) -> Readable:
    """What the page may open: the paths of its starting config, under the same keys, and nothing else."""
    return frozenset(read_paths(start))


def _refuse(key: str) -> UsageError:
    """The line for a path the start did not name; it names the key, not the file, and opens nothing."""
    paste = "paste its config.json into the page, or " if key == "model.hf_config" else ""
    return UsageError(
        f"{key}: the planner page reads only the files named when it was started; {paste}start it with this one "
        f"(pretrain plan {key}=... --serve)"
    )


def page_config(query: str, readable: Readable) -> tuple[list[str], ResolvedConfig]:
    """The query's overrides and their config, loaded only when every path the planner would open is
    `readable`: model.hf_config (read while loading) is checked on the query's text first, the others on the
    loaded config, before any plan opens them."""
    items = overrides(query)
    for item in items:
        key, value = split_override(item)
        if key == "model.hf_config" and value not in ("", "null") and (key, value) not in readable:
            raise _refuse(key)
    config = load_config(None, items)
    refused = sorted(read_paths(config) - readable)
    if refused:
        raise _refuse(refused[0][0])
    return items, config
