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


def write_sample_corpus(out_dir: str | Path) -> Path:
    """Write out_dir/pydoc_topics.jsonl ({"title", "text"} per topic) and return its path."""
    try:
        from pydoc_data.topics import topics
    except ImportError:
        raise UsageError("this Python has no pydoc_data (some distributions strip it); install the full "
                         "standard library or give your own corpus") from None
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    path = out_dir / FILE_NAME
    lines = [json.dumps({"title": name, "text": topics[name]}, ensure_ascii=False) for name in sorted(topics)]
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")
    return path
