"""The README is part of the contract: every config key documented, the key table generated from the code,
the shipped recipes valid, and CI running exactly the README's test command."""

from pathlib import Path

import pytest

from pretrain.config import SECTIONS, docs_markdown, load_config

ROOT = Path(__file__).resolve().parents[1]
README = (ROOT / "README.md").read_text()
CONFIG_DOC = (ROOT / "docs" / "config.md").read_text()  # the key table lives there


def test_every_config_key_is_in_the_readme():
    import dataclasses

    for section, cls in SECTIONS.items():
        for f in dataclasses.fields(cls):
            assert f"`{section}.{f.name}`" in CONFIG_DOC, f"{section}.{f.name} is not documented"


def test_the_key_table_is_the_generated_one():
    start, end = "<!-- config-keys:start -->\n", "\n<!-- config-keys:end -->"
    table = CONFIG_DOC[CONFIG_DOC.index(start) + len(start):CONFIG_DOC.index(end)]
    assert table == docs_markdown(), "regenerate the table with `pretrain config --docs`"


@pytest.mark.parametrize("path", sorted((ROOT / "configs").glob("*.yaml")) +
                         sorted((ROOT / "src/pretrain/configs").glob("*.yaml")), ids=lambda p: p.name)
def test_shipped_configs_load(path):
    load_config(path)


def test_ci_runs_the_readme_test_command():
    ci = (ROOT / ".ci/run").read_text()
    command = "bash scripts/setup.sh dev && .venv/bin/python -m pytest -n 2"
    assert command in README and command in ci
    assert "bash scripts/setup.sh && .venv/bin/pretrain demo" in README


def test_the_readme_plan_table_is_what_the_planner_prints():
    import shlex

    from pretrain.config_args import split_items
    from pretrain.plan import make_plan
    from pretrain.plan.table import render

    start = README.index("$ pretrain plan ")
    command = README[start + 2:README.index("\n", README.index("hardware.price_per_gpu_hour", start))]
    items = shlex.split(command.replace("\\\n", " "))[2:]
    path, overrides = split_items(items)
    config = load_config(path, overrides)
    table = render(config, make_plan(config))
    assert table in README, "rerun the command and paste its table into the README"


def test_the_parallelism_guide_quotes_the_planner():
    # docs/parallel.md's Llama-3-70B table: each row's memory, tokens/s and MFU as `pretrain plan` gives them
    # today, so a planner change that moves them fails here until the table is redone.
    from pretrain.plan import make_plan

    doc = (ROOT / "docs" / "parallel.md").read_text()
    section = doc[doc.index("### Llama-3-70B on 64 H100s"):doc.index("What the numbers say")]
    base = section.split("`pretrain plan ", 1)[1].split("`", 1)[0].replace("\n", " ").split()
    rows, keys = [r.split(" | ") for r in section.splitlines() if r.startswith("| ") and "`" in r], []
    assert len(rows) == 4
    for row in rows:
        given = row[0].split("`")[1].split()
        keys = keys + given[1:] if given[0] == "..." else given
        p = make_plan(load_config(overrides=base + keys))
        assert row[1] == f"{p['memory_bytes']['total'] / 2**30:.1f} GiB", keys
        if p["fits"]:
            st = p["step_time"]
            assert row[3:5] == [f"{st['tokens_per_second']:,.0f}", f"{st['mfu']:.3f}"], keys


def test_every_guarantee_names_tests_that_exist():
    # The README's Guarantees table is a promise backed by tests: a renamed or deleted test must fail here.
    import re

    readme = (ROOT / "README.md").read_text()
    table = readme[readme.index("## Guarantees"):]
    table = table[:table.index("\n## ")]
    refs = re.findall(r"`(tests/[\w/]+\.py)(?:::(\w+))?`", table)
    assert len(refs) > 20
    for path, name in refs:
        source = (ROOT / path).read_text()
        assert not name or re.search(rf"^def {name}\(", source, re.M), f"{path}::{name} is not a test"
