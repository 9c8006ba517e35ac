"""Reading a prepared directory: checked token files, read for the windows that training and evaluation take
(windows.py).

A sharded dataset (`prepare --tasks N`: a top-level meta.json listing "shards") is read in place: each shard
checked as a directory of its own, a split's tokens the shards' token files end to end (`Concatenated`), so
windows are numbered over the whole dataset exactly as over the one file `--tasks 1` writes.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import cast

import numpy as np

from ..errors import ConfigError, UsageError, json_kind
from ..files import json_file, sha256_file
from ..plan.corpus import check_vocabulary
from ..plan.length import TOKEN_DTYPES
from .token_files import Concatenated, TokenFile

SPLITS = ("train", "val")
REQUIRED_KEYS = ("dtype", "vocab_size", "eos_id", "num_tokens", "num_docs", "sha256", "tokenizer_sha256")
VERIFY = ("auto", "full", "size")  # the values of data.verify
# data.verify=auto re-hashes the token files when together at most this size: ~1 s at sha256's ~1 GB/s on one core,
# next to minutes of training. Larger ones get the size and header checks only (data.verify=full on request).
VERIFY_AUTO_BYTES = 1 << 30


def open_training_data(path: str | Path, verify: str, model_vocab_size: int) -> PreparedData:
    """The trainer's one call at start (data.dir, data.verify, model.vocab_size): the directory checked as
    `PreparedData` checks it, and its vocabulary against the model's. A token id the model has no embedding
    for is then caught at the first read of each batch (`RandomWindows`, `SequentialWindows`): one line, not
    an IndexError deep in the model."""
    data = PreparedData(path, verify)
    check_vocabulary(data.vocab_size, model_vocab_size, path)  # the plan's rule too (plan/corpus.py)
    return data


class PreparedData:
    """A directory written by `pretrain prepare`, checked on open: meta.json present, complete and sane (a
    positive vocabulary that the dtype holds, eos_id inside it), every file the size meta.json says, and,
    per `verify`, the sha256 it says: "full" always, "size" never, "auto" when the token files together are
    at most VERIFY_AUTO_BYTES. UsageError on any mismatch, in one line.

    Every batch read from it is checked for token ids >= vocab_size (a corrupted file that passed the size
    checks): cheap next to the model's step, and the only check a large dataset gets without "full"."""

    def __init__(self, path: str | Path, verify: str = "auto", advice: str | None = None):
        if verify not in VERIFY:
            raise ConfigError(f"data.verify: {verify!r} is unknown; use one of {' | '.join(VERIFY)}")
        self.path = Path(path)
        self.advice = advice or f"run `pretrain prepare --out {self.path}` again"  # the end of each error
        self.meta = self._read_meta()
        self.dtype = np.dtype(self.meta["dtype"]).newbyteorder("<")
        self.vocab_size: int = self.meta["vocab_size"]
        self.eos_id: int = self.meta["eos_id"]
        self.tokenizer_dir = self.path / "tokenizer"
        token_bytes = sum(self._num_tokens(s) for s in SPLITS) * self.dtype.itemsize
        full = verify == "full" or (verify == "auto" and token_bytes <= VERIFY_AUTO_BYTES)
        self.shards: list[PreparedData] | None = None
        self.files: dict[str, TokenFile] = {}  # split -> its token file as checked here (not when sharded)
        if "shards" in self.meta:
            self.shards = self._open_shards("full" if full else "size", advice)  # auto: on the whole dataset
            if full:
                self._verify_tokenizer()
            return
        for split in SPLITS:
            self._check_sizes(split)
        if full:
            self.verify_checksums()

    def tokens(self, split: str) -> np.ndarray | Concatenated:
        """The split's token ids as a read-only memory map (pages are read when touched); of a sharded dataset,
        the shards' maps end to end (a view, no copy). For looking at the data: training reads `read`."""
        n = self._num_tokens(split)
        if self.shards is not None:
            return Concatenated([cast(np.ndarray, shard.tokens(split)) for shard in self.shards])  # shards are flat
        if n == 0:  # an empty file cannot be memory-mapped
            return np.empty(0, dtype=self.dtype)
        return np.memmap(self.path / f"{split}.bin", dtype=self.dtype, mode="r", shape=(n,))

    def read(self, split: str, starts: np.ndarray, length: int) -> np.ndarray:
        """Tokens [start, start + length) of tokens(split) for each start, as rows: read with pread from the
        files checked at open, DataChanged if one changed since (token_files.py: never a SIGBUS)."""
        out = np.empty((len(starts), length), dtype=self.dtype)
        if self.shards is None:
            self.files[split].read([(row, int(start)) for row, start in zip(out, starts)])
            return out
        bounds = np.cumsum([0] + [shard._num_tokens(split) for shard in self.shards])
        pieces: dict[int, list] = {}  # shard -> its (row part, first token) pieces: one open per shard
        for row, start in zip(out, starts):
            done = 0
            while done < length:  # a window may cross from one shard into the next
                at = int(start) + done
                k = int(np.searchsorted(bounds, at, side="right")) - 1
                n = min(length - done, int(bounds[k + 1]) - at)
                pieces.setdefault(k, []).append((row[done : done + n], at - int(bounds[k])))
                done += n
        for k, parts in pieces.items():
            self.shards[k].files[split].read(parts)
        return out

    def check(self, split: str) -> None:
        """DataChanged unless the split's files are those checked at open (a stat each)."""
        for shard in self.shards or [self]:
            shard.files[split].check()

    def doc_starts(self, split: str) -> np.ndarray | Concatenated:
        """Offset of each document's first token in tokens(split) (int64, memory-mapped)."""
        if self.shards is not None:
            first_tokens = np.cumsum([0] + [shard._num_tokens(split) for shard in self.shards[:-1]])
            return Concatenated([cast(np.ndarray, shard.doc_starts(split)) for shard in self.shards], add=first_tokens)
        if self._num_tokens(split) == 0:  # an empty array cannot be memory-mapped
            return np.empty(0, dtype=np.int64)
        return np.load(self.path / f"{split}.idx.npy", mmap_mode="r")

    def verify_checksums(self) -> None:
        """Re-hash every .bin (and tokenizer.json) and compare with meta.json: reads everything once."""
        if self.shards is not None:
            for shard in self.shards:
                shard.verify_checksums()
            self._verify_tokenizer()
            return
        for split in SPLITS:
            name = f"{split}.bin"
            if sha256_file(self.path / name) != self.meta["sha256"][name]:
                raise self._error(self.path / name, "sha256 differs from meta.json (file corrupted or replaced)")
        self._verify_tokenizer()

    def locate(self, split: str, token: int) -> tuple[Path, int]:
        """The file holding token `token` of tokens(split), and its index there (a shard's, when sharded)."""
        if self.shards is None:
            return self.path / f"{split}.bin", token
        for shard in self.shards:
            n = shard._num_tokens(split)
            if token < n:
                return shard.locate(split, token)
            token -= n
        raise IndexError(f"token {token:,} is past the end of the {split} split")

    def _open_shards(self, verify: str, advice: str | None) -> list[PreparedData]:
        """Each shard checked as a dataset of its own, and against the manifest: one tokenizer and dtype for
        all (token ids mean one thing across the dataset), the counts and checksums the manifest lists."""
        meta_path = self.path / "meta.json"
        names = self.meta["shards"]
        if (
            not isinstance(names, list)
            or not names
            or not all(
                isinstance(n, str) and n and not Path(n).is_absolute() and ".." not in Path(n).parts for n in names
            )
        ):
            raise self._error(meta_path, "shards is not a list of shard directories inside the dataset")
        if advice is None:  # a shard is rebuilt only with its whole dataset, by the same prepare --tasks
            self.advice = f"run `pretrain prepare --out {self.path} --tasks {len(names)}` again"
        shards = [PreparedData(self.path / name, verify, self.advice) for name in names]
        for name, shard in zip(names, shards):
            for key, what in (("tokenizer_sha256", "tokenizer"), ("dtype", "dtype")):
                if shard.meta[key] != self.meta[key]:
                    raise UsageError(
                        f"{self.path / name}: made with another {what} ({key} {_shown(shard.meta[key])}) "
                        f"than the dataset's other shards ({_shown(self.meta[key])}); a sharded dataset "
                        "needs one tokenizer and dtype: prepare its shards together"
                    )
            listed = {f"{split}.bin": self.meta["sha256"].get(f"{name}/{split}.bin") for split in SPLITS}
            if listed != {k: shard.meta["sha256"][k] for k in listed}:
                raise self._error(
                    self.path / name,
                    "its sha256 differ from the dataset's meta.json (a shard replaced or from another build)",
                )
        for key in ("num_tokens", "num_docs"):
            for split in SPLITS:
                total = sum(shard.meta[key][split] for shard in shards)
                if total != self.meta[key][split]:
                    raise self._error(
                        meta_path, f"{key}.{split} is {self.meta[key][split]:,}, its shards hold {total:,}"
                    )
        return shards

    def _verify_tokenizer(self) -> None:
        tokenizer = self.tokenizer_dir / "tokenizer.json"
        if tokenizer.is_file() and sha256_file(tokenizer) != self.meta["tokenizer_sha256"]:
            raise self._error(tokenizer, "sha256 differs from meta.json tokenizer_sha256")

    def _error(self, path: Path, reason: str) -> UsageError:
        return UsageError(f"{path}: {reason}; {self.advice}")

    def _read_meta(self) -> dict:
        path = self.path / "meta.json"
        if not path.is_file():
            raise self._error(self.path, "no meta.json: not the output of `pretrain prepare`, or an interrupted one")
        try:
            meta = json_file(path)
        except ValueError as e:  # not UTF-8, not JSON, nested too deeply
            raise self._error(path, f"not valid JSON ({e})") from None
        except OSError as e:  # over the size of a meta.json, unreadable
            raise self._error(path, f"cannot read it ({e.strerror})") from None
        if not isinstance(meta, dict):
            raise self._error(path, f"{json_kind(meta)}, not an object")
        missing = [k for k in REQUIRED_KEYS if k not in meta]
        if missing:
            raise self._error(path, f"missing keys {', '.join(missing)}")
        if meta["dtype"] not in TOKEN_DTYPES:
            raise self._error(path, f"dtype {_shown(meta['dtype'])} is not uint16 or uint32")
        vocab, eos = meta["vocab_size"], meta["eos_id"]
        if not _is_int(vocab) or not 0 < vocab <= TOKEN_DTYPES[meta["dtype"]]:
            raise self._error(
                path,
                f"vocab_size {_shown(vocab)} is not a whole number in [1, "
                f"{TOKEN_DTYPES[meta['dtype']]:,}] (what {meta['dtype']} holds)",
            )
        if not _is_int(eos) or not 0 <= eos < vocab:
            raise self._error(path, f"eos_id {_shown(eos)} is outside the vocabulary [0, {vocab:,})")
        per_split: dict[str, Sequence[str]] = {"num_tokens": SPLITS, "num_docs": SPLITS}
        if "shards" not in meta:  # a sharded dataset lists each shard's files, checked in _open_shards
            per_split["sha256"] = [f"{s}.bin" for s in SPLITS]
        for key, names in per_split.items():
            absent = [name for name in names if not isinstance(meta[key], dict) or name not in meta[key]]
            if absent:
                raise self._error(path, f"{key} has no {' or '.join(absent)}")
        for key in ("num_tokens", "num_docs"):
            for split in SPLITS:
                if not _is_int(meta[key][split]) or meta[key][split] < 0:
                    raise self._error(path, f"{key}.{split} {_shown(meta[key][split])} is not a count")
        return meta

    def _num_tokens(self, split: str) -> int:
        if split not in SPLITS:
            raise UsageError(f"unknown split {split!r}; use one of {' | '.join(SPLITS)}")
        return int(self.meta["num_tokens"][split])

    def _check_sizes(self, split: str) -> None:
        bin_path, idx_path = self.path / f"{split}.bin", self.path / f"{split}.idx.npy"
        expected = self._num_tokens(split) * self.dtype.itemsize
        if not bin_path.is_file():
            raise self._error(bin_path, "missing")
        self.files[split] = TokenFile(bin_path)  # what reads compare the file with, from this check on
        if self.files[split].size != expected:
            raise self._error(
                bin_path,
                f"{self.files[split].size:,} bytes, meta.json says {expected:,} "
                f"({self.meta['num_tokens'][split]:,} {self.dtype.name} tokens)",
            )
        if not idx_path.is_file():
            raise self._error(idx_path, "missing")
        try:
            shape, descr, data_start = _npy_header(idx_path)
        except ValueError as e:
            raise self._error(idx_path, f"not a .npy file ({e})") from None
        if shape != (self.meta["num_docs"][split],):
            raise self._error(
                idx_path, f"offsets of shape {shape}, meta.json says {self.meta['num_docs'][split]:,} documents"
            )
        if descr != np.dtype("<i8"):
            raise self._error(idx_path, f"offsets of dtype {descr}, not little-endian int64")
        expected = data_start + 8 * shape[0]
        if idx_path.stat().st_size != expected:  # the header is intact but the data is cut short (or too long)
            raise self._error(
                idx_path,
                f"{idx_path.stat().st_size:,} bytes, its header says {expected:,} "
                f"({shape[0]:,} offsets): truncated or damaged",
            )


def _is_int(value) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _shown(value) -> str:
    """A value from a file, shown in an error: at most 40 characters of it."""
    text = repr(value)
    return text if len(text) <= 40 else text[:37] + "..."


def _npy_header(path: Path) -> tuple[tuple, np.dtype, int]:
    """The shape and dtype in a .npy header and where its data starts, without reading the data."""
    with open(path, "rb") as f:
        version = np.lib.format.read_magic(f)
        read = np.lib.format.read_array_header_1_0 if version == (1, 0) else np.lib.format.read_array_header_2_0
        shape, _, dtype = read(f)
        return shape, dtype, f.tell()
