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
    table = CONFIG_DOC[CONFIG_DOC.index(start) + len(start) : CONFIG_DOC.index(end)]
    assert table == docs_markdown(), "regenerate the table with `pretrain config --docs`"


@pytest.mark.parametrize(
    "path",
    sorted((ROOT / "configs").glob("*.yaml")) + sorted((ROOT / "src/pretrain/configs").glob("*.yaml")),
    ids=lambda p: p.name,
)
def test_shipped_configs_load(path):
    load_config(path)


def test_ci_runs_the_readme_test_command():
    ci = (ROOT / ".ci/run").read_text()
    command = (
        "bash scripts/setup.sh dev && .venv/bin/python -m pytest -n 2"
        " && ATEN_CPU_CAPABILITY=default .venv/bin/python -m pytest -n 2 -m kernels"
    )
    assert command in README and command in ci
    assert "bash scripts/setup.sh && .venv/bin/pretrain demo" in README


def test_the_readme_plan_table_is_what_the_planner_prints():
    import shlex

    from pretrain.config_args import split_items
    from pretrain.plan import make_plan
    from pretrain.plan.table import render

    examples = README.split("$ pretrain plan ")[1:]
    assert len(examples) == 2  # a dense model and a Mixture-of-Experts one
    for example in examples:
        command = example.split("\npretrain plan: ", 1)[0]  # up to the table's first line
        items = shlex.split(command.replace("\\\n", " "))
        path, overrides = split_items(items)
        config = load_config(path, overrides)
        table = render(config, make_plan(config))
        assert table in README, f"rerun `pretrain plan {command}` and paste its table into the README"


def test_the_parallelism_guide_quotes_the_planner():
    # docs/parallel.md's Llama-3-70B table: each row's memory, tokens/s and MFU as `pretrain plan` gives them
    # today, so a planner change that moves them fails here until the table is redone.
    from pretrain.plan import make_plan

    doc = (ROOT / "docs" / "parallel.md").read_text()
    section = doc[doc.index("### Llama-3-70B on 64 H100s") : doc.index("What the numbers say")]
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
    table = readme[readme.index("## Guarantees") :]
    table = table[: table.index("\n## ")]
    refs = re.findall(r"`(tests/[\w/]+\.py)(?:::(\w+))?`", table)
    assert len(refs) > 20
    for path, name in refs:
        source = (ROOT / path).read_text()
        assert not name or re.search(rf"^def {name}\(", source, re.M), f"{path}::{name} is not a test"


WHAT_TRAINS = ("<!-- what-trains:start -->\n", "\n<!-- what-trains:end -->")


def _what_trains() -> str:
    """docs/parallel.md's "what trains" table, from the trainer's own acceptance check (what `pretrain train`
    refuses with, and `pretrain plan --fit` weighs every layout by) on 8 ranks of the LLaMA debug model."""
    from pretrain.config.trainable import check_trainable
    from pretrain.errors import ConfigError

    lines = [
        "| tensor | pipeline | tied embeddings | ZeRO 0 | ZeRO 1 | ZeRO 2 | ZeRO 3 |",
        "|---|---|---|---|---|---|---|",
    ]
    for tensor in (1, 2):
        for pipeline in (1, 2):
            for tied in ("no", "yes"):
                cells = []
                for zero in range(4):
                    config = load_config(
                        overrides=[
                            "model.preset=debug",
                            "parallel.gpus=8",
                            f"parallel.tensor={tensor}",
                            f"parallel.pipeline={pipeline}",
                            f"parallel.zero_stage={zero}",
                            f"model.tie_embeddings={tied == 'yes'}",
                        ]
                    )
                    try:
                        check_trainable(config, needs_data=False)
                        cells.append("trains")
                    except ConfigError as e:
                        cells.append(f"refused (`{str(e).split(':')[0]}`)")
                lines.append(f"| {tensor} | {pipeline} | {tied} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


WHAT_TRAINS_MOE = ("<!-- what-trains-moe:start -->\n", "\n<!-- what-trains-moe:end -->")


def _what_trains_moe() -> str:
    """docs/parallel.md's MoE table, from the same check, on 8 ranks of moe-debug without QK-norm: tensor,
    sequence parallelism, pipeline and expert parallelism (the group over data x tensor ranks) by ZeRO stage."""
    from pretrain.config.trainable import check_trainable
    from pretrain.errors import ConfigError

    lines = [
        "| tensor | sequence parallel | pipeline | expert | ZeRO 0 | ZeRO 1 | ZeRO 2 | ZeRO 3 |",
        "|---|---|---|---|---|---|---|---|",
    ]
    rows = [(1, "no", 1, 1), (1, "no", 1, 8), (2, "yes", 1, 1), (2, "yes", 1, 2), (2, "yes", 1, 8)]
    for tensor, sp, pipeline, expert in rows + [(2, "no", 1, 2), (1, "no", 2, 1)]:
        cells = []
        for zero in range(4):
            overrides = ["model.preset=moe-debug", "model.qk_norm=false", "parallel.gpus=8"]
            overrides += [f"parallel.tensor={tensor}", f"parallel.sequence_parallel={sp == 'yes'}"]
            overrides += [f"parallel.pipeline={pipeline}", f"parallel.expert={expert}", f"parallel.zero_stage={zero}"]
            try:
                check_trainable(load_config(overrides=overrides), needs_data=False)
                cells.append("trains")
            except ConfigError as e:
                cells.append(f"refused (`{str(e).split(':')[0]}`)")
        lines.append(f"| {tensor} | {sp} | {pipeline} | {expert} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def test_the_what_trains_table_is_the_trainers_own_check():
    # A doc that says a layout trains where `pretrain train` refuses it, or the reverse, fails here.
    doc = (ROOT / "docs" / "parallel.md").read_text()
    for (start, end), table in ((WHAT_TRAINS, _what_trains()), (WHAT_TRAINS_MOE, _what_trains_moe())):
        assert doc[doc.index(start) + len(start) : doc.index(end)] == table, (
            "redo docs/parallel.md's what-trains tables from the trainer's check (tests/test_docs.py)"
        )


def _documented_train_commands():
    """Every `... -m pretrain train ...` command of docs/*.md with a literal world size, continuation lines
    joined: (where, world, its parallel.* and train.* overrides, its model.preset and model.qk_norm)."""
    import re
    import shlex

    for path in sorted((ROOT / "docs").glob("*.md")):
        text = path.read_text().replace("\\\n", " ")
        for line in text.splitlines():
            if "-m pretrain train" not in line:
                continue
            words = shlex.split(line.split("#")[0].replace("'", " "))
            flag = {w: n for w, n in zip(words, words[1:]) if w in ("--nproc-per-node", "--nnodes")}
            if not all(n.isdigit() for n in flag.values()):
                continue  # a world size from the scheduler ($SLURM_NNODES): not one layout
            flag = {w: int(n) for w, n in flag.items()}
            world = flag.get("--nproc-per-node", 1) * flag.get("--nnodes", 1)
            items = [
                w
                for w in words[words.index("train") + 1 :]
                if re.fullmatch(r"(parallel|train)\.\w+=[\w.-]+|model\.(preset|qk_norm)=[\w.-]+", w)
            ]
            yield f"{path.name}: {line.strip()[:60]}", world, items


def test_every_documented_train_command_is_one_the_trainer_accepts():
    # The layouts the docs launch with torchrun, on a LLaMA model of 32 heads (8 key/value heads), 32 layers,
    # or on the preset the command names.
    from pretrain.config.trainable import check_trainable
    from pretrain.errors import ConfigError

    commands = [c for c in _documented_train_commands() if any(i.startswith("parallel.") for i in c[2])]
    assert len(commands) >= 8
    for where, world, items in commands:
        try:
            check_trainable(
                load_config(overrides=["model.preset=llama3-8b", f"parallel.gpus={world}", *items]), needs_data=False
            )
        except ConfigError as e:
            pytest.fail(f"{where}: `pretrain train` refuses it: {e}")


def test_the_readme_command_table_lists_every_subcommand_and_setup_says_what_it_installs():
    # Every subcommand of cli.COMMANDS has a row of its own in the README's table; `pretrain eval` lacked one.
    from pretrain.cli import COMMANDS

    table = README[README.index("## Commands") : README.index("## Training")]
    rows = [line for line in table.splitlines() if line.startswith("| `pretrain ")]
    for name in COMMANDS:
        assert any(row.startswith(f"| `pretrain {name}") for row in rows), (
            f"README's command table: no `pretrain {name}`"
        )
    # setup.sh dev installs packages system-wide as root (apt-get): the README says so where it describes setup.sh.
    setup = (ROOT / "scripts/setup.sh").read_text()
    assert "apt-get" in setup and "apt-get install" in README and "chromium" in README.split("## A plan")[0]


def test_docs_moe_describes_the_moe_debug_preset_as_it_is():
    # docs/moe.md's sentence on moe-debug: its experts, top-k and shared experts as presets.py builds them.
    import re

    from pretrain.presets import PRESETS

    preset = PRESETS["moe-debug"]
    text = (ROOT / "docs/moe.md").read_text()
    said = re.search(r"`moe-debug` preset \(([^)]*)\)", text)
    assert said, "docs/moe.md describes the moe-debug preset in one parenthesis"
    words = said.group(1)
    assert f"{preset['num_experts']} routed experts" in words and f"top-{preset['experts_per_token']}" in words
    shared = preset.get("num_shared_experts", 0)
    assert ("no shared expert" in words) == (shared == 0), words
