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
    return subprocess.run([sys.executable, "-m", module, *args], cwd=ROOT, capture_output=True, text=True,
                          timeout=600)


def test_ruff_finds_nothing():
    r = run_tool("ruff", "check", "--no-cache", "src", "tests")
    assert r.returncode == 0, r.stdout + r.stderr


def test_pyright_finds_nothing_in_the_checked_slice():
    # --pythonpath: the interpreter running the tests, whose site-packages hold torch, numpy, yaml ...
    r = run_tool("pyright", "--pythonpath", sys.executable)
    assert r.returncode == 0, r.stdout + r.stderr
    assert "0 errors" in r.stdout
