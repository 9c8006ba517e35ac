"""Config files as YAML: a key or section given twice, an alias bomb, a huge value: one short line each, at once."""

import pytest

from support import run_cli

BOMB = (
    "\n".join(
        ["a: &a [x, x, x, x, x, x, x, x, x]"]
        + [
            f"{chr(98 + i)}: &{chr(98 + i)} [*{chr(97 + i)}, *{chr(97 + i)}, *{chr(97 + i)}, *{chr(97 + i)}, "
            f"*{chr(97 + i)}, *{chr(97 + i)}, *{chr(97 + i)}, *{chr(97 + i)}, *{chr(97 + i)}]"
            for i in range(8)
        ]
    )
    + "\n"
)


@pytest.mark.parametrize(
    "text, message",
    [
        ("train:\n  lr: 1.0e-3\n  warmup: 10\n  lr: 3.0e-4\n", "line 4: key 'lr' is given twice (first at line 2)"),
        (
            "train:\n  lr: 1.0e-3\nmodel:\n  preset: debug\ntrain:\n  warmup: 10\n",
            "line 5: section 'train' is given twice (first at line 1)",
        ),
        ("train: {lr: 1.0e-3, lr: 2.0e-3}\n", "line 1: key 'lr' is given twice"),
        (BOMB, "aliases expand to more than 100,000 values"),
        ("model: &m\n  x: *m\n", "line 1: an alias refers to a value that contains it"),
        ("model: [" + ", ".join(["layer"] * 50_000) + "]\n", "model: must be a mapping of keys, got ['layer', "),
        ("train:\n  lr: [" + ", ".join(["1"] * 50_000) + "]\n", "train.lr: expected a number, got [1, 1, "),
    ],
    ids=[
        "duplicate key",
        "duplicate section",
        "duplicate in a flow mapping",
        "alias bomb",
        "recursive alias",
        "huge section",
        "huge value",
    ],
)
def test_bad_yaml_is_one_short_line(tmp_path, text, message):
    config = tmp_path / "config.yaml"
    config.write_text(text)
    assert len(BOMB) < 400  # the "300-byte" file of the issue
    r = run_cli("plan", config, timeout=120)
    lines = r.stderr.strip().splitlines()
    assert r.returncode == 2 and len(lines) == 1 and len(lines[0]) < 400, r.stderr[:1000]
    assert message in lines[0], lines[0]


def test_a_merge_key_may_be_overridden(tmp_path):
    config = tmp_path / "config.yaml"
    config.write_text("train: &base\n  lr: 1.0e-3\n  warmup: 10\nrun:\n  dir: runs/x\n")
    assert run_cli("plan", config).returncode == 0
    config.write_text("train:\n  <<: {lr: 1.0e-3, warmup: 10}\n  lr: 2.0e-3\n")
    r = run_cli("config", config)
    assert r.returncode == 0 and "lr: 0.002" in r.stdout, r.stdout + r.stderr
