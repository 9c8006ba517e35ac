"""The stage map as a test: which part of `pretrain` may import which (docs/architecture.md draws the same map).

Imports are read from the source with `ast`, not by importing, so a function-local import counts as much as
one at the top of a file: it runs the first time the function does. Only the planner's "no torch" is checked by
importing, in a fresh interpreter, because that is a property of what actually gets loaded.
"""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

SRC = Path(__file__).resolve().parents[1] / "src"
PACKAGE = SRC / "pretrain"

# A part (a folder of src/pretrain, or a module beside them) may import its own stage and any lower one.
STAGE = {
    # the ground floor: errors, files, units, precision rules, the GPU catalog, presets, config.json fields
    # and the config schema
    "errors": 0, "files": 0, "units": 0, "progress": 0, "precision": 0, "gpus": 0, "presets": 0, "hf_config": 0,
    "rope_scaling": 0, "config": 0,
    "config_args": 0, "lock": 0, "task_catalog": 0,
    "plan": 1,  # the planner: arithmetic on a config, never torch
    "data": 2, "model": 2,  # side by side: neither imports the other
    "distributed": 3,  # wrapping a model for DDP / FSDP / ZeRO
    "bench": 3,  # measuring the device (matmul, bandwidth, one block): the trainer measures its peak with it
    "train": 4,  # the trainer, its step, checkpoints and callbacks
    "eval": 4,  # downstream tasks scored: by `pretrain eval` and by the trainer's in-loop callback
    "sweep": 5, "report": 5, "export": 5,  # tools built on training runs
    "cli": 6, "demo": 6, "config_command": 6, "__main__": 6,  # entry points
}
APART = {("data", "model"), ("model", "data")}  # same stage, yet independent


def module_name(path: Path, root: Path) -> str:
    parts = list(path.relative_to(root.parent).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def imported_modules(path: Path, root: Path) -> set[str]:
    """Every module of `root`'s package that `path` imports, anywhere in the file, relative imports resolved."""
    name = module_name(path, root)
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    found = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")[: len(package.split(".")) - node.level + 1]
                module = ".".join(base + ([node.module] if node.module else []))
            else:
                module = node.module
            found.add(module)
            # `from .. import precision` imports a module; `from ..config import load_config` a name.
            found.update(f"{module}.{alias.name}" for alias in node.names
                         if _is_module(root.parent, f"{module}.{alias.name}"))
    return {m for m in found if m.split(".")[0] == root.name}


def _is_module(src: Path, dotted: str) -> bool:
    path = src.joinpath(*dotted.split("."))
    return path.with_suffix(".py").is_file() or (path / "__init__.py").is_file()


def part(module: str) -> str | None:
    """pretrain.train.step -> "train"; the package root (lazy: it imports nothing on its own) -> None."""
    pieces = module.split(".")
    return pieces[1] if len(pieces) > 1 else None


def import_graph() -> dict[str, set[str]]:
    return {module_name(path, PACKAGE): imported_modules(path, PACKAGE) for path in sorted(PACKAGE.rglob("*.py"))}


def upward_imports() -> dict[tuple[str, str], set[str]]:
    """(importing module, imported part) -> the modules imported, for each import against the stage map."""
    bad = {}
    for importer, targets in import_graph().items():
        own = part(importer)
        if own is None:
            continue  # the root's lazy __getattr__ hands out load_config, make_plan and load_model: a front door
        for target in targets:
            other = part(target)
            if other is None or other == own:
                continue
            if STAGE[other] > STAGE[own] or (own, other) in APART:
                bad.setdefault((importer, other), set()).add(target)
    return bad


def test_every_part_has_a_stage():
    parts = {p.stem if p.is_file() else p.name for p in PACKAGE.iterdir()
             if (p.suffix == ".py" and p.name != "__init__.py") or (p / "__init__.py").is_file()}
    assert parts == set(STAGE), "a new folder or top-level module: give it a stage here and in docs/architecture.md"


def test_the_reader_sees_relative_and_function_local_imports(tmp_path):
    root = tmp_path / "pkg"
    (root / "low").mkdir(parents=True)
    for name in ("__init__.py", "top.py", "low/__init__.py", "low/a.py", "low/b.py"):
        (root / name).touch()
    (root / "low" / "a.py").write_text("from . import b\nimport os\n\ndef f():\n    from ..top import g\n")
    (root / "low" / "__init__.py").write_text("from .a import f\n")
    assert imported_modules(root / "low" / "a.py", root) == {"pkg.low", "pkg.low.b", "pkg.top"}
    assert imported_modules(root / "low" / "__init__.py", root) == {"pkg.low.a"}


def test_the_planner_imports_no_torch():
    # Every module of plan/, as `pretrain plan` may load them: the planner runs on a laptop without torch.
    modules = sorted(module_name(p, PACKAGE) for p in (PACKAGE / "plan").rglob("*.py"))
    code = (f"import sys\nfor m in {modules!r}:\n    __import__(m)\n"
            "print(sorted(m for m in ('torch', 'numpy') if m in sys.modules))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "[]"


def test_model_imports_nothing_from_later_stages():
    later = {"data", "distributed", "train", "bench", "sweep", "report", "export", "cli", "demo"}
    got = {(m, part(t)) for m, ts in import_graph().items() if part(m) == "model" for t in ts if part(t) in later}
    assert got == set()


def test_data_imports_nothing_from_model_or_train():
    banned = {"model", "distributed", "train", "bench", "sweep", "report", "export", "cli", "demo"}
    got = {(m, part(t)) for m, ts in import_graph().items() if part(m) == "data" for t in ts if part(t) in banned}
    assert got == set()


def test_no_module_imports_upward():
    bad = {key: sorted(targets) for key, targets in upward_imports().items()}
    assert bad == {}, "an import against the stage map (tests/test_layers.py, docs/architecture.md)"


def test_every_public_name_exists():
    # `__all__` is a package's front door: a name renamed without it (plan.plan -> make_plan) breaks `import *`.
    modules = sorted(module_name(p, PACKAGE) for p in PACKAGE.rglob("*.py") if "__all__ =" in p.read_text())
    assert len(modules) > 5, "too few modules with __all__: the test reads nothing"
    code = (f"import importlib\nfor m in {modules!r}:\n    mod = importlib.import_module(m)\n"
            "    print(*[f'{m}.{n}' for n in mod.__all__ if not hasattr(mod, n)])")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.split() == []
