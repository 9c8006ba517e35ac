"""Where a corpus's files come from: paths, directories (searched for SUFFIXES), globs, fsspec URLs
(`hf://`, `s3://`, ...: read where the machine has network) and Hugging Face `save_to_disk` directories,
listed in sorted order so every build reads the documents in the same order. Reading them is readers.py's."""

from __future__ import annotations

import glob
import json
import posixpath
import re
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, NamedTuple, cast

from ..errors import UsageError
from ..files import display_path

if TYPE_CHECKING:
    from fsspec.core import OpenFile

# What a directory is searched for; a file named explicitly is read whatever its suffix (as text under auto).
SUFFIXES = (".txt", ".jsonl", ".jsonl.gz", ".jsonl.zst", ".parquet", ".arrow")
URL = re.compile(r"[a-zA-Z][a-zA-Z0-9+.-]*://")  # hf://datasets/..., s3://..., https://..., file://...


@dataclass(frozen=True)
class RemoteFile:
    """A corpus file behind an fsspec URL (https://filesystem-spec.readthedocs.io), read streaming through
    fsspec: `hf://datasets/OWNER/NAME/...` (Hugging Face's HfFileSystem, network needed), `s3://`, ...
    What the readers use of a Path: name, stat(), resolve(), and open() in place of open(path)."""

    url: str
    size: int
    mtime_ns: int = 0  # 0 where the file system gives none

    @property
    def name(self) -> str:
        return posixpath.basename(self.url)

    def stat(self) -> _Stat:
        return _Stat(self.size, self.mtime_ns)

    def resolve(self) -> RemoteFile:
        return self

    def open(self):
        import fsspec

        return cast("OpenFile", fsspec.open(self.url, "rb")).open()  # one URL: an OpenFile, not OpenFiles

    def __str__(self) -> str:
        return self.url


class _Stat(NamedTuple):
    st_size: int
    st_mtime_ns: int


def file_name(path: str | Path | RemoteFile) -> str:
    """A corpus file as text for messages and meta.json: its URL, or its path (odd bytes as \\xNN)."""
    return path.url if isinstance(path, RemoteFile) else display_path(path)


def open_file(path: Path | RemoteFile):
    return path.open() if isinstance(path, RemoteFile) else open(path, "rb")


def _remote_files(url: str) -> list[RemoteFile]:
    """The files an fsspec URL names: a file, a directory (searched recursively for SUFFIXES) or a glob."""
    try:
        import fsspec.core

        fs, root = fsspec.core.url_to_fs(url)
        if glob.has_magic(root):
            paths = [p for p in fs.glob(root) if fs.isfile(p)]
        elif fs.isdir(root):
            paths = [p for p in fs.find(root) if p.endswith(SUFFIXES)]
        elif fs.isfile(root):
            paths = [root]
        else:
            raise UsageError(f"input {url} does not exist; give corpus files, directories or globs")
        infos = [fs.info(p) for p in paths]
    except UsageError:
        raise
    except Exception as e:  # fsspec's errors are its backends' (ImportError, ValueError, OSError, HTTP errors)
        raise UsageError(
            f"input {url}: cannot list it ({type(e).__name__}: {' '.join(str(e).split())}); "
            "remote paths need network and the file system's fsspec package (hf:// uses "
            "huggingface_hub)"
        ) from None
    return [
        RemoteFile(fs.unstrip_protocol(p), int(info.get("size") or 0), _mtime_ns(info)) for p, info in zip(paths, infos)
    ]


def _mtime_ns(info: dict) -> int:
    mtime = info.get("mtime") or info.get("last_modified") or 0
    return int(mtime * 1e9) if isinstance(mtime, (int, float)) else 0


def find_files(inputs: list[str | Path]) -> list[Path | RemoteFile]:
    """Files named by `inputs` (files, directories searched recursively, globs), sorted and deduplicated.

    A file named twice (a relative and an absolute path, a symlink) is read once, under its first name in
    sorted order: read twice, its documents could land in both train and val.
    """
    if isinstance(inputs, (str, Path)):
        inputs = [inputs]
    found: set[Path | RemoteFile] = set()
    for item in inputs:
        item = str(item)
        if URL.match(item) and not Path(item).exists():
            found.update(_remote_files(item))
        elif Path(item).is_dir():
            found.update(_corpus_files(Path(item)))
        elif Path(item).exists():  # before globbing: a file may be named like a glob (part[1].jsonl)
            found.add(Path(item))
        elif glob.has_magic(item):
            matches = [Path(p) for p in glob.glob(item, recursive=True)]
            found.update(p for p in matches if p.is_file())
            found.update(f for p in matches if p.is_dir() for f in _corpus_files(p))
        else:
            raise UsageError(f"input {item} does not exist; give corpus files, directories or globs")
    if not found:
        raise UsageError(
            f"no corpus files matched {' '.join(map(str, inputs))}; directories are searched for {', '.join(SUFFIXES)}"
        )
    unique: dict[Path | RemoteFile, Path | RemoteFile] = {}
    for path in sorted(found, key=str):
        unique.setdefault(path.resolve(), path)
    return list(unique.values())


def _corpus_files(directory: Path) -> list[Path]:
    hf = hf_dataset_files(directory)
    if hf is not None:
        return hf
    return [p for p in directory.rglob("*") if p.is_file() and p.name.endswith(SUFFIXES)]


def hf_dataset_files(directory: Path) -> list[Path] | None:
    """The .arrow files of a Hugging Face `datasets.Dataset.save_to_disk` directory, from its state.json (only
    those: a cache file beside them is not the dataset); None for any other directory. A DatasetDict (one
    directory per split) is refused: which split to read is the user's choice."""
    if (directory / "dataset_dict.json").is_file():
        try:
            splits = json.loads((directory / "dataset_dict.json").read_text(encoding="utf-8"))["splits"]
        except (ValueError, KeyError, TypeError, OSError):
            splits = ["train"]
        raise UsageError(
            f"input {directory} is a Hugging Face DatasetDict (splits {', '.join(map(str, splits))}); "
            f"give one split's directory, e.g. --input {directory / str(splits[0])}"
        )
    state = directory / "state.json"
    if not state.is_file():
        return None
    try:
        names = [entry["filename"] for entry in json.loads(state.read_text(encoding="utf-8"))["_data_files"]]
    except (ValueError, KeyError, TypeError, OSError) as e:
        raise UsageError(
            f"{state}: not a Hugging Face datasets state.json ({type(e).__name__}: {e}); give the "
            "directory `save_to_disk` wrote, or its .arrow files"
        ) from None
    return [directory / name for name in names]
