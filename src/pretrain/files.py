"""Files: writing one so that a reader (or a crash) never sees half of it; reading a JSON file a config key
names, with a one-line error for each way it can be wrong; the checksum that vouches for a file."""

from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path

from .errors import ConfigError


def read_json(path: Path, key: str, fix: str):
    """The JSON in `path`, which config key `key` names; ConfigError (naming key, path and `fix`) when it is
    missing, a directory, unreadable, not UTF-8 or not JSON."""
    try:
        return json.loads(Path(path).read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise ConfigError(f"{key}: no such file {path}; {fix}") from None
    except IsADirectoryError:
        raise ConfigError(f"{key}: {path} is a directory; give the JSON file, or {fix}") from None
    except UnicodeDecodeError:
        raise ConfigError(f"{key}: {path} is not UTF-8 text; {fix}") from None
    except json.JSONDecodeError as e:
        raise ConfigError(f"{key}: {path} is not valid JSON ({e.msg} at line {e.lineno})") from None
    except OSError as e:
        raise ConfigError(f"{key}: cannot read {path} ({e.strerror}); {fix}") from None


def write_atomic(path: str | Path, data: str | bytes) -> Path:
    """Write `data` to a temporary file beside `path`, then rename it over `path` (atomic on POSIX).
    On any error the old file, if there was one, is left as it was and the temporary file is removed."""
    path = Path(path)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    try:
        if isinstance(data, str):
            tmp.write_text(data, encoding="utf-8")
        else:
            tmp.write_bytes(data)
        os.replace(tmp, path)
    finally:
        tmp.unlink(missing_ok=True)
    return path


def sha256_file(path) -> str:
    """Hex sha256 of a file's bytes, read in 4 MiB blocks (checkpoint shards may be larger than memory)."""
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 22), b""):
            h.update(block)
    return h.hexdigest()
