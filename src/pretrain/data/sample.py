"""A small English corpus on every machine, no download: the documentation bundled with Python.

`pydoc_data.topics` holds the text `help()` shows for keywords and topics (Python 3.11: 79 topics,
~465 KB). Each topic becomes one JSONL document, in sorted topic order, so the file is the same on every
run of the same Python version (other versions ship slightly different text).
"""

from __future__ import annotations

import json
from pathlib import Path

from ..errors import UsageError

FILE_NAME = "pydoc_topics.jsonl"


def write_sample_corpus(out_dir: str | Path, docstrings: bool = False) -> Path:
    """Write out_dir/pydoc_topics.jsonl ({"title", "text"} per topic) and return its path. With `docstrings`,
    the standard library's own docstrings follow, one document per module (`pretrain demo`: ~1 MB more on
    Python 3.11, so its 200 steps read the corpus ~2x rather than ~7x, within the ~4 epochs that repetition
    is worth; Muennighoff et al. 2023)."""
    try:
        from pydoc_data.topics import topics
    except ImportError:
        raise UsageError(
            "this Python has no pydoc_data (some distributions strip it); install the full "
            "standard library or give your own corpus"
        ) from None
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    path = out_dir / FILE_NAME
    records = [{"title": name, "text": topics[name]} for name in sorted(topics)]
    if docstrings:
        records += stdlib_docstrings()
    lines = [json.dumps(record, ensure_ascii=False) for record in records]
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")
    return path


def stdlib_docstrings() -> list[dict]:
    """{"title": module, "text": its docstrings} for each top-level standard-library module whose source this
    Python ships, in name order: the module's, its classes' and its functions', read with `ast` (nothing is
    imported). A module without source (a stripped install) is left out."""
    import ast
    import sys
    import sysconfig

    lib = Path(sysconfig.get_paths()["stdlib"])
    out = []
    for name in sorted(getattr(sys, "stdlib_module_names", ())):  # Python >= 3.10
        source = next((f for f in (lib / f"{name}.py", lib / name / "__init__.py") if f.is_file()), None)
        if source is None:
            continue
        try:
            tree = ast.parse(source.read_text(encoding="utf-8"))
        except (OSError, SyntaxError, UnicodeDecodeError, ValueError):
            continue
        kinds = (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)
        docs = [doc for node in ast.walk(tree) if isinstance(node, kinds) and (doc := ast.get_docstring(node))]
        if docs:
            out.append({"title": name, "text": "\n\n".join(docs)})
    return out
