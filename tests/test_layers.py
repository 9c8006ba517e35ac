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
    "errors": 0,
    "files": 0,
    "units": 0,
    "progress": 0,
    "precision": 0,
    "gpus": 0,
    "presets": 0,
    "hf_config": 0,
    "rope_scaling": 0,
    "config": 0,
    "config_args": 0,
    "lock": 0,
    "task_catalog": 0,
    "machine": 0,
    "plan": 1,  # the planner: arithmetic on a config, never torch
    "data": 2,
    "model": 2,  # side by side: neither imports the other
    "distributed": 3,  # wrapping a model for DDP / FSDP / ZeRO
    "checkpoint": 3,  # a run's checkpoints: written by the trainer, read by it, eval, export and generate
    "bench": 3,  # measuring the device (matmul, bandwidth, one block): the trainer measures its peak with it
    "train": 4,  # the trainer, its step and callbacks
    "eval": 4,  # downstream tasks scored: by `pretrain eval` and by the trainer's in-loop callback (train imports eval)
    "sweep": 5,
    "report": 5,
    "export": 5,  # tools built on training runs
    "cli": 6,
    "demo": 6,
    "config_command": 6,
    "__main__": 6,  # entry points
}
APART = {("data", "model"), ("model", "data")}  # same stage, yet independent


def module_name(path: Path, root: Path) -> str:
    parts = list(path.relative_to(root.parent).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def imported_modules(path: Path, root: Path, module_level: bool = False) -> set[str]:
    """Every module of `root`'s package that `path` imports, anywhere in the file, relative imports resolved.

    module_level: only the imports that run when the module is imported (not those inside a function, nor under
    `if TYPE_CHECKING:`), and `from . import step` counts as importing the module step, not its package too.
    """
    name = module_name(path, root)
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    tree = ast.parse(path.read_text(encoding="utf-8"))
    found = set()
    for node in _run_on_import(tree) if module_level else ast.walk(tree):
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")[: len(package.split(".")) - node.level + 1]
                module = ".".join(base + ([node.module] if node.module else []))
            else:
                module = node.module
            # `from .. import precision` imports a module; `from ..config import load_config` a name.
            modules = {
                f"{module}.{alias.name}" for alias in node.names if _is_module(root.parent, f"{module}.{alias.name}")
            }
            found.update(modules)
            if not (module_level and len(modules) == len(node.names)):
                found.add(module)
    return {m for m in found if m.split(".")[0] == root.name}


def _run_on_import(node: ast.AST):
    """The statements that run when a module is imported: not function bodies, not `if TYPE_CHECKING:` blocks."""
    for child in ast.iter_child_nodes(node):
        if isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda)):
            continue
        if isinstance(child, ast.If) and "TYPE_CHECKING" in ast.unparse(child.test):
            yield from (n for s in child.orelse for n in [s, *_run_on_import(s)])
            continue
        yield child
        yield from _run_on_import(child)


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


def import_cycles(module_level: bool = True) -> list[list[str]]:
    """Each import cycle among src/pretrain's modules, as the modules in it (module_level: see imported_modules)."""
    graph = {
        module_name(path, PACKAGE): imported_modules(path, PACKAGE, module_level)
        for path in sorted(PACKAGE.rglob("*.py"))
    }
    cycles, done = [], set()
    for start in sorted(graph):
        # depth-first from `start`, through modules after it in order only: each cycle is found once, from its
        # smallest module
        stack = [(start, [start])]
        while stack:
            module, trail = stack.pop()
            for target in sorted(graph.get(module, ())):
                if target == start:
                    cycles.append(trail)
                elif target > start and target not in trail and (start, target) not in done:
                    done.add((start, target))
                    stack.append((target, [*trail, target]))
    return cycles


def test_every_part_has_a_stage():
    parts = {
        p.stem if p.is_file() else p.name
        for p in PACKAGE.iterdir()
        if (p.suffix == ".py" and p.name != "__init__.py") or (p / "__init__.py").is_file()
    }
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


def test_module_level_reader_skips_function_bodies_and_type_checking(tmp_path):
    root = tmp_path / "pkg"
    root.mkdir()
    for name in ("__init__.py", "a.py", "b.py", "c.py", "d.py"):
        (root / name).touch()
    (root / "a.py").write_text(
        "from typing import TYPE_CHECKING\nfrom . import b\ntry:\n    from .c import x\n"
        "except ImportError:\n    pass\nif TYPE_CHECKING:\n    from .d import y\n\n"
        "def f():\n    from .d import z\n"
    )
    assert imported_modules(root / "a.py", root, module_level=True) == {"pkg.b", "pkg.c"}


def test_no_import_cycles():
    """No module imports, at its top level, a module that imports it back, directly or through others.

    A cycle makes the import order matter (the first module half-initialised while the second runs) and the two
    modules one. Imports inside a function are allowed and not counted: they run after every module is loaded.
    """
    assert import_cycles() == [], "import cycles (break each: move the shared name down, or import it in the function)"


def test_no_function_local_loops_between_modules():
    """Function-local imports too: two modules that need each other's names are one idea split in two, or share a
    name that belongs below both (train/state.py, distributed/engines.py, checkpoint/). A loop through a package's
    __init__ whose modules all lie inside that package is not one: its lazy front door imports its own parts when
    asked (the root's hands out load_config, make_plan and load_model). A loop that leaves the package is."""
    packages = {module_name(p, PACKAGE) for p in PACKAGE.rglob("__init__.py")}
    loops = [c for c in import_cycles(module_level=False) if not any(_front_door_of(p, c) for p in packages & set(c))]
    assert loops == []


def _front_door_of(package: str, loop: list[str]) -> bool:
    return all(m == package or m.startswith(package + ".") for m in loop)


def test_the_front_door_exception_covers_only_its_own_package():
    # eval.models -> train (its __init__) -> train.trainer -> train.callbacks.tasks -> eval.models: the loop the
    # train package's front door once hid (issue #42), which leaves that package
    assert _front_door_of("pretrain.train", ["pretrain.train", "pretrain.train.trainer"])
    assert not _front_door_of(
        "pretrain.train",
        ["pretrain.eval.models", "pretrain.train", "pretrain.train.trainer", "pretrain.train.callbacks.tasks"],
    )


def part_graph() -> dict[str, set[str]]:
    """part -> the other parts it imports (anywhere in a file, type hints included)."""
    graph: dict[str, set[str]] = {}
    for importer, targets in import_graph().items():
        own = part(importer)
        if own is not None:
            graph.setdefault(own, set()).update(p for t in targets if (p := part(t)) not in (None, own))
    return graph


def test_no_two_parts_import_each_other():
    """Parts of one stage may import each other's modules, but only one way: train/ imports eval/ (the in-loop
    callback), never the reverse; a part that both need (a checkpoint read by both) goes below them."""
    graph = part_graph()

    def reached(start: str) -> set[str]:
        seen, todo = set(), [start]
        while todo:
            for other in graph.get(todo.pop(), ()):
                if other not in seen:
                    seen.add(other)
                    todo.append(other)
        return seen

    both_ways = sorted({tuple(sorted((a, b))) for a in graph for b in reached(a) if a != b and a in reached(b)})
    assert both_ways == [], "parts that import each other: move what both need into a lower part"


def test_the_planner_imports_no_torch():
    # Every module of plan/, as `pretrain plan` may load them: the planner runs on a laptop without torch.
    modules = sorted(module_name(p, PACKAGE) for p in (PACKAGE / "plan").rglob("*.py"))
    code = (
        f"import sys\nfor m in {modules!r}:\n    __import__(m)\n"
        "print(sorted(m for m in ('torch', 'numpy') if m in sys.modules))"
    )
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
    code = (
        f"import importlib\nfor m in {modules!r}:\n    mod = importlib.import_module(m)\n"
        "    print(*[f'{m}.{n}' for n in mod.__all__ if not hasattr(mod, n)])"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.split() == []
